"""benchmarks/sizes.py's pure parts: the memory that gets a pod OOM-killed read
from cgroup v1 and v2 files, llama.cpp's own load accounting read from its log,
the decode ceiling, the points and the operator's decision at each."""

from __future__ import annotations

import pytest

from benchmarks import sizes_measure as m
from benchmarks.sizes_points import QUICK, Point, decode_tensors, grid, local_model
from localmodel.api import parse_local_model
from localmodel.desired import desired_state
from tests.builders import MakeNode

pytestmark = pytest.mark.unit

MiB = 2**20

V2_STAT = """anon 734003200
file 1073741824
kernel 9999
kernel_stack 16384
pagetables 4194304
sec_pagetables 0
percpu 0
sock 0
shmem 2097152
file_mapped 838860800
slab_unreclaimable 1048576
inactive_file 536870912
"""
V1_STAT = """cache 1075838976
rss 734003200
rss_huge 0
shmem 2097152
mapped_file 838860800
total_rss 734003200
"""


def test_the_oom_relevant_part_is_anon_shmem_and_kernel_never_the_file_pages() -> None:
    v2 = m.reading(m.parse_stat(V2_STAT), 2)
    assert v2.anon == 734003200 and v2.file_mapped == 838860800
    assert v2.kernel == 16384 + 4194304 + 1048576  # the unreclaimable lines, not `kernel`
    assert v2.oom_relevant == 734003200 + 2097152 + v2.kernel
    v1 = m.reading(m.parse_stat(V1_STAT), 1)
    assert (v1.anon, v1.file, v1.file_mapped, v1.kernel) == (734003200, 1075838976,
                                                             838860800, 0)
    assert v1.oom_relevant == 734003200 + 2097152  # mapped weights are reclaimable


def test_a_hostile_stat_line_is_skipped_and_the_reading_bounded() -> None:
    text = "anon 5\nanon x\nfile\n" + "junk 1 2\n" * 10 + "".join(
        f"k{i} {i}\n" for i in range(1000))
    stat = m.parse_stat(text)
    assert stat["anon"] == 5 and "file" not in stat and "junk" not in stat
    assert len(stat) < 300


def test_the_peak_is_the_reading_with_most_oom_relevant_memory_and_each_field_its_own() -> None:
    peak = m.Peak()
    peak.add(m.MemoryReading(anon=100 * MiB, shmem=0, file=900 * MiB, file_mapped=0, kernel=0))
    peak.add(m.MemoryReading(anon=300 * MiB, shmem=0, file=100 * MiB, file_mapped=0, kernel=0))
    peak.add(m.MemoryReading(anon=200 * MiB, shmem=0, file=500 * MiB, file_mapped=0, kernel=0))
    row = peak.row()
    assert row["peak_oom_mib"] == 300 and row["peak_file_mib"] == 900
    assert row["samples"] == 3


def test_oom_kills_are_read_from_either_versions_file() -> None:
    assert m.oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", 1) == 2
    assert m.oom_kills("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n", 2) == 1
    assert m.oom_kills("", 2) == 0


def test_proc_status_memory_lines_are_bytes() -> None:
    text = "Name:\tllama-server\nVmHWM:\t 990240 kB\nRssAnon:\t  166912 kB\nRssFile:\t 791552 kB\n"
    assert m.proc_status(text) == {"VmHWM": 990240 * 1024, "RssAnon": 166912 * 1024,
                                   "RssFile": 791552 * 1024}


LOAD_LOG = """load_tensors:   CPU_Mapped model buffer size =   762.49 MiB
load_tensors:   CPU_REPACK model buffer size =    71.98 MiB
llama_context: n_ctx = 512, n_ctx_seq = 512, n_batch = 512, n_ubatch = 512
llama_context:        CPU  output buffer size =     1.00 MiB
llama_kv_cache: size =    2.00 MiB (   512 cells,   4 layers,  1/1 seqs), K (f16):    1.00 MiB
llama_kv_cache: size =   11.00 MiB (   512 cells,  22 layers,  1/1 seqs), K (f16):    5.50 MiB
sched_reserve:        CPU compute buffer size =   516.50 MiB
"""


def test_llamas_accounting_of_the_last_load_is_read_from_its_log() -> None:
    assert m.accounting(LOAD_LOG) == {"mapped": 762.49, "repack": 71.98, "output": 1.0,
                                      "kv": 13.0, "compute": 516.5}
    # Ollama's runner reads the weights (no mmap) and may load twice: the last load counts.
    again = LOAD_LOG.replace("CPU_Mapped", "CPU").replace("516.50", "99.00")
    got = m.accounting("noise\n" + LOAD_LOG + again)
    assert got["read"] == 762.49 and got["compute"] == 99.0 and got["kv"] == 13.0
    assert m.accounting("no accounting at this verbosity") == {}


def test_a_token_reads_every_weight_but_an_untied_embedding_and_the_kv_so_far() -> None:
    tensors = [("token_embd.weight", 500), ("blk.0.attn_q.weight", 100), ("output.weight", 400)]
    assert m.bytes_per_token(tensors, tied=False, kv_bytes_read=7) == 507
    assert m.bytes_per_token(tensors[:2], tied=True) == 600


def test_the_synthetic_shapes_bytes_per_token_leave_out_qwens_embedding_only() -> None:
    qwen, tied = decode_tensors("qwen3-8b")
    assert not tied
    embd = dict(qwen)["token_embd.weight"]
    assert m.bytes_per_token(qwen, tied) == sum(b for _, b in qwen) - embd
    gemma, tied = decode_tensors("gemma3-1b")
    assert tied and m.bytes_per_token(gemma, tied) == sum(b for _, b in gemma)


def test_the_grid_never_asks_for_q8_0_without_flash_attention_and_keys_are_unique() -> None:
    points = grid(["gemma3-1b", "gemma3-4b", "qwen3-8b"], ["llama-server", "ollama"], False)
    assert not [p for p in points if p.kv == "q8_0" and p.fa == "off"]
    assert len({p.key for p in points}) == len(points)
    filled = {(p.shape, p.context) for p in points if p.fill}
    assert ("qwen3-8b", 4096) not in filled and ("gemma3-1b", 4096) in filled
    assert grid(["qwen3-8b"], ["llama-server", "ollama"], True) == list(QUICK)
    assert grid([], ["ollama"], True) == [p for p in QUICK if p.engine == "ollama"]


@pytest.mark.parametrize("engine", ["llama-server", "ollama"])
def test_the_decision_at_a_point_renders_that_points_settings(engine: str) -> None:
    p = Point("gemma3-1b", engine, 8192, 4, "q8_0", "on", False)
    lm = parse_local_model(local_model(p, 806056608, "a" * 64))
    node = MakeNode("n1").cpus(2).memory_gib(24).cpu_flags({"AVX2", "AVX", "FMA3"}).facts()
    result = desired_state([lm], [node], now="1970-01-01T00:00:00Z").models[0]
    t = result.replicas[0].tuning
    flags = " ".join(t.args) + " " + " ".join(f"{k}={v}" for k, v in t.env.items())
    if engine == "llama-server":
        assert "-c 32768 -np 4" in flags and "-ctk q8_0" in flags and "-fa on" in flags
    else:
        assert "OLLAMA_KV_CACHE_TYPE=q8_0" in flags and "OLLAMA_FLASH_ATTENTION=1" in flags
    assert t.memory_bytes > 806056608  # the weights and more


def test_the_memory_table_shows_decided_over_what_must_stay_resident() -> None:
    row = {"shape": "gemma3-1b", "engine": "llama-server", "context": 4096, "slots": 1,
           "kv": "f16", "fa": "off", "filled_tokens": 4084, "decided_mib": 3000,
           "accounting": {"kv": 38.0, "compute": 63.26, "repack": 72.0, "mapped": 572.0},
           "load": {"anon_mib": 163.0}, "peak": {"peak_oom_mib": 1000.0, "peak_file_mib": 770.0},
           "oom_kills": 0}
    table = m.memory_table([row])
    # Resident: the 1000 MiB peak and the 500 MiB of mapped weights not repacked.
    assert "| 500 | 2.00 |" in table and "| 173 |" in table and "| 4084 |" in table
    # Ollama's child holds its weights in anonymous memory: nothing mapped is added.
    ollama = m.memory_table([{**row, "engine": "ollama"}])
    assert "| 0 | 3.00 |" in ollama
    assert m.ratio(None, 3.0) is None and m.ratio(3.0, 0) is None


def test_model_info_carries_only_the_fields_the_api_knows() -> None:
    from benchmarks.sizes_points import model_info
    from localmodel.api.spec import ModelInfo

    info = model_info("gemma3-4b", 2489756224)
    assert info["layers"] == 34 and info["kvHeads"] == 4 and info["keyLength"] == 256
    assert info["weightsSize"] == "2489756224" and info["family"] == "gemma3"
    assert ModelInfo.model_validate(info)  # nothing the API would refuse
