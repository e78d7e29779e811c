"""hack/synth-gguf.py end to end: its plan reproduces the real Gemma 3 270M
Q4_K_M file tensor by tensor; a tiny shape written twice has one sha256, reads
back with the `gguf` package's reader as planned (metadata, the real tokenizer,
finite weights of a trained model's scale), and llama.cpp loads and decodes a
qwen3-architecture file that carries the Gemma tokenizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf  # the dev extra, as the script needs it
import numpy as np
import pytest

from tests.harness.engines import require
from tests.sizes.test_synth_plan import SCRIPT, synth

pytestmark = [pytest.mark.engine, pytest.mark.llama]  # the model of build-engines.sh


def write(shape: str, out_dir: Path, tokenizer: Path) -> Path:
    """Run the script as a person would; the file it names."""
    proc = subprocess.run([sys.executable, str(SCRIPT), shape, "--out-dir", str(out_dir),
                           "--tokenizer", str(tokenizer)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    name, _, path = proc.stdout.strip().partition("=")
    assert name == shape
    return Path(path)


def test_plan_reproduces_the_real_270m_file() -> None:
    real = gguf.GGUFReader(require("model"))
    found = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name, int(t.n_bytes))
             for t in real.tensors}
    planned = {t.name: (t.ne, t.qtype, synth.nbytes(t))
               for t in synth.plan(synth.SHAPES["gemma3-270m"])}
    assert planned == found


def test_tiny_shape_is_stable_and_reads_back_as_planned(tmp_path: Path) -> None:
    model = require("model")
    first = write("tiny-gemma3", tmp_path / "a", model)
    second = write("tiny-gemma3", tmp_path / "b", model)
    assert first.name == second.name
    digest = synth.file_sha256(first)
    assert synth.file_sha256(second) == digest
    assert Path(f"{first}.sha256-ok").read_text().strip() == digest

    shape = synth.SHAPES["tiny-gemma3"]
    reader = gguf.GGUFReader(first)
    fields = reader.fields
    assert fields["general.architecture"].contents() == "gemma3"
    assert fields["gemma3.block_count"].contents() == shape.layers
    assert fields["gemma3.attention.head_count_kv"].contents() == shape.kv_heads
    assert fields["gemma3.attention.sliding_window"].contents() == shape.sliding_window
    source = gguf.GGUFReader(model).fields
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id"):
        assert fields[key].contents() == source[key].contents()
    assert (fields["tokenizer.ggml.tokens"].contents(slice(0, 300))
            == source["tokenizer.ggml.tokens"].contents(slice(0, 300)))

    planned = {t.name: (t.ne, t.qtype) for t in synth.plan(shape)}
    assert {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name)
            for t in reader.tensors} == planned
    for tensor in reader.tensors:
        rows = gguf.quants.dequantize(np.asarray(tensor.data[:2]), tensor.tensor_type)
        assert np.isfinite(rows).all(), tensor.name
        if tensor.tensor_type.name not in ("F32", "F16"):
            rms = float(np.sqrt(np.mean(np.square(rows - rows.mean()))))
            assert 0.005 < rms < 0.08, (tensor.name, rms)


def test_llama_cpp_loads_a_qwen3_shape_with_the_gemma_tokenizer(tmp_path: Path) -> None:
    path = write("tiny-qwen3", tmp_path, require("model"))
    proc = subprocess.run([str(require("llama-bench")), "-m", str(path), "-t", "1", "-p", "0",
                           "-n", "4", "-r", "1", "--no-warmup", "-v", "-o", "json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "arch                  = qwen3" in proc.stderr
    assert "n_vocab               = 151936" in proc.stderr
    assert "CPU compute buffer size" in proc.stderr
