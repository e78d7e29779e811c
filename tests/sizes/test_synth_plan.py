"""hack/synth-gguf.py's plan and its refusals, without writing a model (the
files themselves: tests/sizes/test_synth_files.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "synth-gguf.py"


def load_synth() -> ModuleType:
    """The script as a module (its file name has a dash, as hack/'s scripts do)."""
    if "synth_gguf" in sys.modules:
        return sys.modules["synth_gguf"]
    spec = importlib.util.spec_from_file_location("synth_gguf", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["synth_gguf"] = module
    spec.loader.exec_module(module)
    return module


synth = load_synth()


def test_q4_k_m_mix_gives_more_bits_to_the_first_last_and_every_third_layers() -> None:
    # llama-quant.cpp use_more_bits for 26 layers: i < 3, i >= 22, (i - 3) % 3 == 2.
    more = [i for i in range(26) if synth._more_bits(i, 26)]
    assert more == [0, 1, 2, 5, 8, 11, 14, 17, 20, 22, 23, 24, 25]


def test_rows_not_a_multiple_of_256_fall_back_to_32_blocks() -> None:
    assert synth._fallback("Q4_K", 1152) == "Q5_0"
    assert synth._fallback("Q6_K", 1152) == "Q8_0"
    assert synth._fallback("Q4_K", 6912) == "Q4_K"  # 27 x 256
    assert synth._fallback("Q4_K", 1000) == "F16"  # not even a multiple of 32


def test_the_published_shapes_have_their_q4_k_m_sizes() -> None:
    # The real Q4_K_M files of the same shapes are within a few MB of these (their
    # metadata differ); Ollama's tags are larger where they carry a vision tower.
    sizes = {name: synth.model_bytes(synth.SHAPES[name]) for name in
             ("gemma3-270m", "gemma3-1b", "gemma3-4b", "qwen3-8b")}
    assert sizes == {"gemma3-270m": 246_587_904, "gemma3-1b": 799_525_120,
                     "gemma3-4b": 2_483_218_432, "qwen3-8b": 5_021_827_072}


def test_untied_output_is_its_own_q6_k_matrix() -> None:
    tensors = {t.name: t for t in synth.plan(synth.SHAPES["qwen3-8b"])}
    assert tensors["output.weight"].qtype == "Q6_K"
    assert tensors["token_embd.weight"].qtype == "Q4_K"
    assert tensors["token_embd.weight"].ne == (4096, 151936)
    assert "blk.0.post_ffw_norm.weight" not in tensors  # Gemma's sandwich norms only
    assert len([n for n in tensors if n.startswith("blk.35.")]) == 11


def test_cache_key_follows_the_shape_and_the_tokenizer() -> None:
    shape = synth.SHAPES["gemma3-1b"]
    name = synth.file_name(shape, "a" * 64)
    assert name.startswith(f"gemma3-1b-q4_k_m-v{synth.VERSION}-")
    assert synth.file_name(shape, "a" * 64) == name
    assert synth.file_name(shape, "b" * 64) != name
    wider = synth.Shape(**{**shape.__dict__, "embd": 2048})
    assert synth.file_name(wider, "a" * 64) != name


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def test_refuses_when_the_disk_cannot_hold_the_file(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(synth.shutil, "disk_usage", lambda _: Usage(10**12, 10**12, 3 * 2**30))
    needs = r"qwen3-8b: the file needs 4\.68 GiB .* 3\.00 GiB free"
    with pytest.raises(synth.Refused, match=needs):
        synth.check_room(synth.SHAPES["qwen3-8b"], tmp_path, check_memory=False)
    synth.check_room(synth.SHAPES["gemma3-1b"], tmp_path, check_memory=False)


def test_refuses_when_memory_cannot_hold_the_model(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(synth.shutil, "disk_usage", lambda _: Usage(10**13, 0, 10**13))
    monkeypatch.setattr(synth, "available_memory", lambda: 4 * 2**30)
    with pytest.raises(synth.Refused, match=r"qwen3-8b: its 4\.68 GiB of weights .* 4\.00 GiB"):
        synth.check_room(synth.SHAPES["qwen3-8b"], tmp_path)
    synth.check_room(synth.SHAPES["qwen3-8b"], tmp_path, check_memory=False)  # forced
    synth.check_room(synth.SHAPES["gemma3-1b"], tmp_path)


def test_cli_refuses_unknown_shapes(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_:
        synth.main(["gemma3-7b"])
    assert exit_.value.code == 2
    assert "unknown shape(s) gemma3-7b" in capsys.readouterr().err
