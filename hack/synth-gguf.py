#!/usr/bin/env python3
"""Synthetic real-shape GGUF models (issue 45): a published model's architecture
(GGUF metadata keys, tensor names, shapes and quantization types exactly as
llama.cpp's converter and its Q4_K_M quantizer lay them out), the real Gemma 3
tokenizer copied from the 270M test model, and seeded random weights with
finite scales. An engine's cost (memory, load time, decode speed) depends on
the shape, not on what the weights say, so such a file loads, allocates and
decodes like the real model, with nonsense text.

    python hack/synth-gguf.py gemma3-1b [gemma3-4b qwen3-8b ...]   write what is missing
    python hack/synth-gguf.py --plan [SHAPE...]   sizes and tensor types, write nothing
    python hack/synth-gguf.py --print [SHAPE...]  NAME=PATH lines, write nothing
    python hack/synth-gguf.py --list              the shapes and where their numbers come from

Why hack/ and not benchmarks/: this is a build step like hack/build-engines.sh
(an artifact made once, cached by version, checked by its sha256), and the
issue reserves benchmarks/sizes.py for the benchmark that uses these files.

Quantization: Ollama's default tags are Q4_K_M. The `gguf` package can quantize
only Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 (plus BF16, TQ*, MXFP4) and K-quants not at all,
but it writes any type's raw blocks; since the weights are random, the blocks
are written directly: random quant bits with finite f16 scales, in llama.cpp's
Q4_K_M mix (Q4_K; Q6_K for the output and half the attn_v/ffn_down layers;
Q5_0/Q8_0 where a row is not a multiple of 256), so every tensor has the byte
size of the real Q4_K_M file's (tests/sizes/test_synth_files.py checks the plan
against the real 270M file, tensor by tensor).

Streaming: the writer gets the header, metadata and tensor table; the tensor
data is then written chunk by chunk (CHUNK_BYTES), so an 8B file never sits in
memory. Deterministic: each tensor's bytes come from a PCG64 stream seeded by
(VERSION, shape, tensor name) and drawn in fixed chunks, so the sha256 of a file
depends only on the shape, VERSION and the tokenizer file.

Cache: ${LOCALMODEL_CACHE:-~/.cache/localmodel-operator}/models/synth/
<shape>-q4_k_m-v<VERSION>-<key>.gguf with <file>.sha256-ok beside it (as
hack/build-engines.sh marks its model); key = the shape's numbers, VERSION and
the tokenizer's sha256. --out-dir writes elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

VERSION = "1"  # bump when the bytes of any file change (part of the cache key)
CHUNK_BYTES = 32 * 1024 * 1024  # fixed: the draws (and so the sha256) depend on it
QK_K = 256
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
# The tokenizer source as hack/build-engines.sh pins it.
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MiB = 1024**2
GiB = 1024**3
DISK_RESERVE = 1 * GiB  # never fill the disk to the last byte
WORK_MEMORY = 1 * GiB  # this process: tokenizer arrays, one chunk, numpy


@dataclass(frozen=True)
class Shape:
    """A published model's text-model hyperparameters (its config.json, as GGUF keeps them)."""

    name: str
    arch: str  # general.architecture: gemma3 | qwen3
    tag: str  # the Ollama tag this shape stands for
    layers: int  # num_hidden_layers -> <arch>.block_count
    embd: int  # hidden_size -> embedding_length
    ff: int  # intermediate_size -> feed_forward_length
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim -> attention.key_length / value_length
    vocab: int  # rows of token_embd as the GGUF has them (the tokenizer's size)
    context: int  # max_position_embeddings -> context_length
    rope_base: float  # rope_theta
    rms_eps: float = 1e-6
    sliding_window: int | None = None  # gemma3: local layers' window
    rope_base_swa: float | None = None  # gemma3: rope_local_base_freq
    rope_linear: float | None = None  # rope_scaling {rope_type: linear, factor}
    tied: bool = True  # tie_word_embeddings: no output.weight
    source: str = ""


SHAPES: dict[str, Shape] = {s.name: s for s in (
    # The test model itself: the plan must reproduce the real file (unit test).
    Shape("gemma3-270m", "gemma3", "gemma3:270m", layers=18, embd=640, ff=2048, heads=4,
          kv_heads=1, head_dim=256, vocab=262144, context=32768, rope_base=1e6,
          sliding_window=512, rope_base_swa=10000.0,
          source="google/gemma-3-270m config.json; equal to the GGUF of hack/build-engines.sh"),
    # google/gemma-3-1b-pt and -it config.json: hidden_size 1152, intermediate_size 6912,
    # num_hidden_layers 26, num_attention_heads 4, num_key_value_heads 1, head_dim 256,
    # max_position_embeddings 32768, rope_theta 1e6, rope_local_base_freq 1e4,
    # sliding_window 512, sliding_window_pattern 6, rope_scaling null, vocab_size 262144.
    Shape("gemma3-1b", "gemma3", "gemma3:1b", layers=26, embd=1152, ff=6912, heads=4,
          kv_heads=1, head_dim=256, vocab=262144, context=32768, rope_base=1e6,
          sliding_window=512, rope_base_swa=10000.0,
          source="google/gemma-3-1b-it config.json"),
    # google/gemma-3-4b-it config.json text_config: hidden_size 2560, intermediate_size
    # 10240, num_hidden_layers 34, sliding_window 1024, rope_scaling {linear, factor 8};
    # Gemma3TextConfig defaults for the rest: 8 heads, 4 KV heads, head_dim 256,
    # max_position_embeddings 131072, rope_theta 1e6, rope_local_base_freq 1e4.
    # vocab_size 262208 there, but the converter drops the rows past the tokenizer's
    # 262144 tokens (conversion/gemma.py, Gemma3Model.modify_tensors).
    Shape("gemma3-4b", "gemma3", "gemma3:4b", layers=34, embd=2560, ff=10240, heads=8,
          kv_heads=4, head_dim=256, vocab=262144, context=131072, rope_base=1e6,
          sliding_window=1024, rope_base_swa=10000.0, rope_linear=8.0,
          source="google/gemma-3-4b-it config.json (text_config)"),
    # Qwen/Qwen3-8B config.json: hidden_size 4096, intermediate_size 12288,
    # num_hidden_layers 36, num_attention_heads 32, num_key_value_heads 8, head_dim 128,
    # max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6, rope_scaling null,
    # tie_word_embeddings false, vocab_size 151936 (the GGUF pads the tokenizer to it).
    Shape("qwen3-8b", "qwen3", "qwen3:8b", layers=36, embd=4096, ff=12288, heads=32,
          kv_heads=8, head_dim=128, vocab=151936, context=40960, rope_base=1e6, tied=False,
          source="Qwen/Qwen3-8B config.json"),
    # Tiny shapes for the tests: the same code paths, a few MB.
    Shape("tiny-gemma3", "gemma3", "", layers=2, embd=256, ff=512, heads=2, kv_heads=1,
          head_dim=64, vocab=262144, context=4096, rope_base=1e6, sliding_window=128,
          rope_base_swa=10000.0, source="test shape"),
    Shape("tiny-qwen3", "qwen3", "", layers=2, embd=256, ff=512, heads=4, kv_heads=2,
          head_dim=64, vocab=151936, context=4096, rope_base=1e6, tied=False,
          source="test shape"),
)}


# --- the tensor plan: names, shapes, types (llama.cpp's layout and Q4_K_M mix) -----------

@dataclass(frozen=True)
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    qtype: str  # GGMLQuantizationType name


# Bytes per block and elements per block (ggml-common.h; gguf.constants.GGML_QUANT_SIZES).
BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "Q8_0": (32, 34), "Q5_0": (32, 22),
    "Q4_K": (256, 144), "Q6_K": (256, 210),
}


def nbytes(spec: TensorSpec) -> int:
    per, size = BLOCKS[spec.qtype]
    n = 1
    for d in spec.ne:
        n *= d
    return n // per * size


def _fallback(qtype: str, ncols: int) -> str:
    """A 256-block type on a row that is not a multiple of 256 falls back
    (llama.cpp src/llama-quant.cpp, tensor_type_fallback)."""
    if ncols % BLOCKS[qtype][0] == 0:
        return qtype
    down = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[qtype]
    return down if ncols % BLOCKS[down][0] == 0 else "F16"


def _more_bits(i: int, n: int) -> bool:
    """Q4_K_M's layers that get Q6_K attn_v and ffn_down (llama-quant.cpp, use_more_bits)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def plan(shape: Shape) -> list[TensorSpec]:
    """Every tensor llama.cpp creates for this architecture (src/models/<arch>.cpp,
    load_arch_tensors), with the type llama-quantize Q4_K_M gives it."""
    s, out = shape, []
    q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
    # The output matrix (or the token embedding that doubles as it) is Q6_K, Q8_0 when
    # its rows are not a multiple of 256; an untied token embedding is plain Q4_K.
    out_type = "Q6_K" if s.embd % QK_K == 0 else "Q8_0"
    out.append(TensorSpec("token_embd.weight", (s.embd, s.vocab),
                          out_type if s.tied else _fallback("Q4_K", s.embd)))
    for i in range(s.layers):
        b = f"blk.{i}."
        more = _more_bits(i, s.layers)
        layer = [
            TensorSpec(b + "attn_norm.weight", (s.embd,), "F32"),
            TensorSpec(b + "attn_q.weight", (s.embd, q_dim), _fallback("Q4_K", s.embd)),
            TensorSpec(b + "attn_k.weight", (s.embd, kv_dim), _fallback("Q4_K", s.embd)),
            TensorSpec(b + "attn_v.weight", (s.embd, kv_dim),
                       _fallback("Q6_K" if more else "Q4_K", s.embd)),
            TensorSpec(b + "attn_output.weight", (q_dim, s.embd), _fallback("Q4_K", q_dim)),
            TensorSpec(b + "attn_q_norm.weight", (s.head_dim,), "F32"),
            TensorSpec(b + "attn_k_norm.weight", (s.head_dim,), "F32"),
            TensorSpec(b + "ffn_norm.weight", (s.embd,), "F32"),
            TensorSpec(b + "ffn_gate.weight", (s.embd, s.ff), _fallback("Q4_K", s.embd)),
            TensorSpec(b + "ffn_up.weight", (s.embd, s.ff), _fallback("Q4_K", s.embd)),
            TensorSpec(b + "ffn_down.weight", (s.ff, s.embd),
                       _fallback("Q6_K" if more else "Q4_K", s.ff)),
        ]
        if s.arch == "gemma3":  # Gemma 3's sandwich norms (src/models/gemma3.cpp)
            layer += [TensorSpec(b + "post_attention_norm.weight", (s.embd,), "F32"),
                      TensorSpec(b + "post_ffw_norm.weight", (s.embd,), "F32")]
        out += layer
    out.append(TensorSpec("output_norm.weight", (s.embd,), "F32"))
    if not s.tied:
        out.append(TensorSpec("output.weight", (s.embd, s.vocab), out_type))
    return out


def model_bytes(shape: Shape) -> int:
    return sum(nbytes(t) for t in plan(shape))


# --- random blocks with finite scales --------------------------------------------------

# Where each block keeps its f16 scale(s) and the scale that gives weights of RMS ~0.02
# (a trained model's order): d x typical |integer part| ~ 0.02 (ggml-common.h layouts).
SCALES: dict[str, list[tuple[int, float]]] = {
    "Q8_0": [(0, 2.7e-4)],  # d, qs int8
    "Q5_0": [(0, 2.2e-3)],  # d, qh, qs: (q - 16) in [-16, 15]
    "Q4_K": [(0, 6.0e-5), (2, 4.5e-4)],  # d, dmin, 6-bit scales/mins, 4-bit qs
    "Q6_K": [(208, 1.5e-5)],  # ql, qh, int8 scales, d last
}


def _seed(shape: Shape, tensor: str) -> int:
    digest = hashlib.sha256(f"{VERSION}/{shape.name}/{tensor}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def tensor_chunks(shape: Shape, spec: TensorSpec) -> Iterator[bytes]:
    """The tensor's bytes in chunks of at most CHUNK_BYTES, the same on every run."""
    import numpy as np

    total = nbytes(spec)
    bitgen = np.random.PCG64(_seed(shape, spec.name))
    gen = np.random.Generator(bitgen)
    if spec.qtype in ("F32", "F16"):  # norms: 1 +- a little (Gemma's are stored shifted by 1)
        dtype = np.float32 if spec.qtype == "F32" else np.float16
        n = total // np.dtype(dtype).itemsize
        yield (1.0 + 0.02 * gen.standard_normal(n)).astype(dtype).tobytes()
        return
    _, block = BLOCKS[spec.qtype]
    per_chunk = max(1, CHUNK_BYTES // block)
    left = total // block
    while left:
        n = min(per_chunk, left)
        raw = bitgen.random_raw(-(-n * block // 8)).view(np.uint8)[: n * block]
        blocks = raw.reshape(n, block)
        for offset, base in SCALES[spec.qtype]:
            d = (base * gen.uniform(0.5, 1.5, n)).astype(np.float16)
            blocks[:, offset:offset + 2] = d.view(np.uint8).reshape(n, 2)
        yield blocks.tobytes()
        left -= n


# --- the file ----------------------------------------------------------------------------

def cache_root() -> Path:
    return Path(os.environ.get("LOCALMODEL_CACHE", Path.home() / ".cache/localmodel-operator"))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_sha256(path: Path) -> str:
    """The tokenizer file's sha256: build-engines.sh's marker when it vouches for it."""
    marker = path.with_name(path.name + ".sha256-ok")
    if marker.is_file() and marker.read_text().strip() == GEMMA_SHA256:
        return GEMMA_SHA256
    return file_sha256(path)


def cache_key(shape: Shape, tokenizer_sha: str) -> str:
    fields = "\n".join(f"{k}={v}" for k, v in sorted(asdict(shape).items()) if k != "source")
    text = f"{VERSION}\n{CHUNK_BYTES}\n{tokenizer_sha}\n{fields}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def file_name(shape: Shape, tokenizer_sha: str) -> str:
    return f"{shape.name}-q4_k_m-v{VERSION}-{cache_key(shape, tokenizer_sha)}.gguf"


class Refused(Exception):
    """The machine cannot hold the file (disk) or the model it is (memory)."""


def available_memory() -> int:
    """What a new process may still use here: MemAvailable, or the cgroup's room if tighter."""
    import psutil

    room = psutil.virtual_memory().available
    try:
        from localmodel.facts.cgroup import read_cgroup_limits

        limit = read_cgroup_limits().memory_bytes
        if limit is not None:
            room = min(room, limit)
    except ImportError:  # run without the package on the path: the host's figure alone
        pass
    return room


def check_room(shape: Shape, out_dir: Path, check_memory: bool = True) -> None:
    need = model_bytes(shape)
    free = shutil.disk_usage(out_dir).free
    if free < need + DISK_RESERVE:
        raise Refused(f"{shape.name}: the file needs {need / GiB:.2f} GiB and "
                      f"{DISK_RESERVE / GiB:.0f} GiB to spare on {out_dir}, which has "
                      f"{free / GiB:.2f} GiB free")
    if check_memory:
        room = available_memory()
        if room < need + WORK_MEMORY:
            raise Refused(f"{shape.name}: its {need / GiB:.2f} GiB of weights (plus "
                          f"{WORK_MEMORY / GiB:.0f} GiB to write it) exceed the "
                          f"{room / GiB:.2f} GiB of memory available here: no engine "
                          f"could hold it (--no-memory-check writes it anyway)")


def read_tokenizer(path: Path, vocab: int) -> list[tuple[str, object, object, object]]:
    """Every tokenizer.* key of the source GGUF as (key, value, type, subtype), its
    token arrays cut to `vocab` entries (a shape with a smaller vocabulary: the ids
    it keeps, special tokens and byte tokens included, are the first ones)."""
    import gguf

    reader = gguf.GGUFReader(path)
    out: list[tuple[str, object, object, object]] = []
    n_tokens = len(reader.fields["tokenizer.ggml.tokens"].data)
    if vocab > n_tokens:
        raise ValueError(f"the tokenizer has {n_tokens} tokens, the shape wants {vocab}")
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        sub = None
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if len(value) == n_tokens:
                value = value[:vocab]
        out.append((field.name, value, vtype, sub))
    return out


def write(shape: Shape, path: Path, tokenizer: Path, tokenizer_sha: str) -> str:
    """Write the shape's GGUF to path (through path.tmp); its sha256."""
    import gguf
    import numpy as np

    specs = plan(shape)
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(tmp, shape.arch)
    a = shape.arch
    w.add_type("model")
    w.add_name(f"synthetic {shape.name} (random weights)")
    w.add_uint32(f"{a}.context_length", shape.context)
    w.add_uint32(f"{a}.embedding_length", shape.embd)
    w.add_uint32(f"{a}.block_count", shape.layers)
    w.add_uint32(f"{a}.feed_forward_length", shape.ff)
    w.add_uint32(f"{a}.attention.head_count", shape.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", shape.kv_heads)
    w.add_uint32(f"{a}.attention.key_length", shape.head_dim)
    w.add_uint32(f"{a}.attention.value_length", shape.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_base)
    if shape.sliding_window is not None:
        w.add_uint32(f"{a}.attention.sliding_window", shape.sliding_window)
    if shape.rope_base_swa is not None:
        w.add_float32(f"{a}.rope.freq_base_swa", shape.rope_base_swa)
    if shape.rope_linear is not None:
        w.add_string(f"{a}.rope.scaling.type", "linear")
        w.add_float32(f"{a}.rope.scaling.factor", shape.rope_linear)
    for key, value, vtype, sub in read_tokenizer(tokenizer, shape.vocab):
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32("general.file_type", 15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_string("localmodel.synthetic.shape", shape.name)
    w.add_string("localmodel.synthetic.version", VERSION)
    w.add_string("localmodel.synthetic.source", shape.source)
    w.add_string("localmodel.synthetic.tokenizer_sha256", tokenizer_sha)
    for t in specs:
        qtype = gguf.GGMLQuantizationType[t.qtype]
        w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), nbytes(t),
                          raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # Tensor data, streamed: the same layout as GGUFWriter.write_tensors_to_file (data
    # aligned, each tensor padded to the alignment) without holding a tensor in memory.
    assert w.fout is not None
    out = w.fout[0]
    w.write_padding(out, out.tell())
    for t in specs:
        for chunk in tensor_chunks(shape, t):
            out.write(chunk)
        w.write_padding(out, nbytes(t))
    out.flush()
    os.fsync(out.fileno())
    w.close()
    digest = file_sha256(tmp)
    tmp.replace(path)
    return digest


def ensure(shape: Shape, out_dir: Path, tokenizer: Path, check_memory: bool = True) -> Path:
    """The shape's file in out_dir, written unless a checked copy is there."""
    tok_sha = tokenizer_sha256(tokenizer)
    path = out_dir / file_name(shape, tok_sha)
    marker = path.with_name(path.name + ".sha256-ok")
    if path.is_file() and marker.is_file():
        log(f"{shape.name} cached: {path}")
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    check_room(shape, out_dir, check_memory)
    log(f"writing {shape.name} ({model_bytes(shape) / GiB:.2f} GiB) to {path}")
    digest = write(shape, path, tokenizer, tok_sha)
    marker.write_text(digest + "\n")
    log(f"{shape.name}: sha256 {digest}")
    return path


def log(msg: str) -> None:
    print(f"synth-gguf: {msg}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shapes", nargs="*", help=f"shapes to write: {', '.join(SHAPES)}")
    p.add_argument("--out-dir", type=Path, help="where to write (default: the cache)")
    p.add_argument("--tokenizer", type=Path,
                   help=f"the GGUF whose tokenizer to copy (default: the cache's {GEMMA_FILE})")
    p.add_argument("--plan", action="store_true", help="print sizes and tensor types only")
    p.add_argument("--print", action="store_true", help="print NAME=PATH lines only")
    p.add_argument("--list", action="store_true", help="print the shapes and their sources")
    p.add_argument("--no-memory-check", action="store_true",
                   help="write a shape larger than this machine's available memory")
    args = p.parse_args(argv)
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    shapes = [SHAPES[s] for s in args.shapes]
    if args.list:
        for s in SHAPES.values():
            print(f"{s.name}\t{s.tag or '-'}\t{s.source}")
        return 0
    if args.plan:
        for s in shapes or list(SHAPES.values()):
            counts: dict[str, int] = {}
            for t in plan(s):
                counts[t.qtype] = counts.get(t.qtype, 0) + nbytes(t)
            mix = ", ".join(f"{k} {v / MiB:.1f} MiB" for k, v in sorted(counts.items()))
            print(f"{s.name}: {model_bytes(s)} bytes ({model_bytes(s) / GiB:.3f} GiB) "
                  f"in {len(plan(s))} tensors: {mix}")
        return 0
    if not shapes:
        p.error("name at least one shape (or --plan / --list)")
    root = cache_root()
    tokenizer = args.tokenizer or root / "models" / GEMMA_FILE
    out_dir = args.out_dir or root / "models" / "synth"
    if not tokenizer.is_file():
        log(f"no tokenizer source at {tokenizer} (bash hack/build-engines.sh model makes it)")
        return 1
    if args.print:
        sha = tokenizer_sha256(tokenizer)
        for s in shapes:
            print(f"{s.name}={out_dir / file_name(s, sha)}")
        return 0
    try:
        for s in shapes:
            path = ensure(s, out_dir, tokenizer, not args.no_memory_check)
            print(f"{s.name}={path}")
    except Refused as e:
        log(f"refused: {e}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
