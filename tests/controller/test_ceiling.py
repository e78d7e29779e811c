"""A replica's decode ceiling (localmodel/ceiling.py): the node's bandwidth at the replica's
threads over the bytes one token reads; and the pass giving each replica its node's."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from localmodel.api import KVCacheType
from localmodel.catalog import CATALOG, ModelShape
from localmodel.ceiling import (
    bandwidth_at,
    kv_read_bytes,
    predicted_decode,
    replica_ceiling,
    weights_read_per_token,
)
from localmodel.controller.snapshot import Snapshot, observe
from localmodel.facts.model import MemoryBandwidth
from localmodel.facts.node import (
    PROBE_BANDWIDTH_ALL,
    PROBE_BANDWIDTH_ONE,
    PROBE_BANDWIDTH_THREADS,
    from_node,
)
from tests.builders import MakeNode
from tests.controller.test_changes import NODE, converged
from tests.controller.test_speed_pass import CPU_LABELS, plan_of, with_ips

pytestmark = pytest.mark.unit

GB = 1000**3


def test_the_ceiling_is_bandwidth_over_the_bytes_one_token_reads() -> None:
    p = predicted_decode(4.6 * GB, 4_500_000_000)
    assert p.tokens_per_second == pytest.approx(4.6 / 4.5)
    assert p.describe == "predicted: 4.6 GB/s / 4.5 GB per token"
    with_kv = predicted_decode(4.6 * GB, 4_000_000_000, 600_000_000, context=8192)
    assert with_kv.tokens_per_second == pytest.approx(1.0)
    assert with_kv.describe.endswith("at 8192 tokens of context")
    assert p.ceiling.decode == p.tokens_per_second and p.ceiling.how == p.describe


@pytest.mark.parametrize(("bandwidth", "weights", "kv"), [
    (0.0, 1, 0), (-1.0, 1, 0), (1.0, 0, 0), (1.0, 1, -1), (float("nan"), 1, 0)])
def test_no_ceiling_from_no_bandwidth_or_no_bytes(bandwidth: float, weights: int,
                                                  kv: int) -> None:
    with pytest.raises(ValueError, match="positive bandwidth"):
        predicted_decode(bandwidth, weights, kv)


@pytest.mark.parametrize(("threads", "expected"), [
    (1, 9 * GB), (2, 16 * GB), (8, 16 * GB), (0, 9 * GB)])
def test_threads_read_at_most_one_threads_rate_each_and_all_threads_together(
        threads: int, expected: float) -> None:
    assert bandwidth_at(MemoryBandwidth(9 * GB, 16 * GB, 2), threads) == expected


def test_with_one_threads_rate_only_more_threads_get_that_rate_a_lower_bound() -> None:
    assert bandwidth_at(MemoryBandwidth(9 * GB), 4) == 9 * GB
    # an all-threads rate below one thread's (noise) never lowers it
    assert bandwidth_at(MemoryBandwidth(9 * GB, 8 * GB, 2), 2) == 9 * GB


def test_one_row_of_untied_embeddings_is_read_and_tied_ones_whole() -> None:
    untied = {"token_embd.weight": 1000, "blk.0.ffn_up.weight": 5000, "output.weight": 2000}
    assert weights_read_per_token(untied, vocabulary=100) == 5000 + 2000 + 10
    tied = {"token_embd.weight": 1000, "blk.0.ffn_up.weight": 5000}
    assert weights_read_per_token(tied, vocabulary=100) == 6000


def test_the_kv_read_is_every_layers_keys_and_values_of_the_context() -> None:
    qwen3_8b = CATALOG["qwen3:8b"]  # 36 layers, 8 KV heads of 128
    assert kv_read_bytes(qwen3_8b, 1, KVCacheType.F16) == 36 * 8 * 256 * 2
    assert kv_read_bytes(qwen3_8b, 32768, KVCacheType.Q8_0) == 36 * 8 * 256 * 32768 * 34 // 32
    assert kv_read_bytes(qwen3_8b, 0, KVCacheType.F16) == 0


def test_a_replica_ceiling_counts_the_whole_file_and_a_slots_full_context() -> None:
    node = from_node(MakeNode("n1").labels({
        PROBE_BANDWIDTH_ONE: "9000", PROBE_BANDWIDTH_ALL: "16000",
        PROBE_BANDWIDTH_THREADS: "2"}).manifest())
    shape = CATALOG["qwen3:8b"]
    p = replica_ceiling(shape, node, 2, 8192, KVCacheType.F16)
    assert p is not None
    kv = 36 * 8 * 256 * 2 * 8192
    assert p.bytes_per_token == shape.weights_bytes + kv
    assert p.tokens_per_second == pytest.approx(16 * GB / (shape.weights_bytes + kv))
    one = replica_ceiling(shape, node, 1, 8192, KVCacheType.F16)
    assert one is not None and one.tokens_per_second < p.tokens_per_second


def test_no_ceiling_without_the_nodes_bandwidth_or_the_models_shape() -> None:
    measured = from_node(MakeNode("n1").labels({PROBE_BANDWIDTH_ONE: "9000"}).manifest())
    unmeasured = from_node(MakeNode("n1").manifest())
    shape = CATALOG["qwen3:8b"]
    assert replica_ceiling(shape, unmeasured, 1, 4096, KVCacheType.F16) is None
    assert replica_ceiling(None, measured, 1, 4096, KVCacheType.F16) is None
    assert replica_ceiling(shape, None, 1, 4096, KVCacheType.F16) is None
    empty = ModelShape("x", 0, 1, 1, 1, 1)
    assert replica_ceiling(empty, measured, 1, 4096, KVCacheType.F16) is None


def test_a_pass_gives_each_replica_its_nodes_ceiling_at_its_threads() -> None:
    snap, _ = converged(replicas=1)
    snap = with_ips(snap)
    labels = {**CPU_LABELS, PROBE_BANDWIDTH_ONE: "9000"}
    nodes = [NODE.named(n["metadata"]["name"]).labels(labels).manifest() for n in snap.nodes]
    planned = plan_of(Snapshot(**{**snap.__dict__, "nodes": copy.deepcopy(nodes)}))
    [target] = planned.speed_targets
    assert target.ceiling is not None
    assert target.ceiling.how.startswith("predicted: ")
    node = observe(Snapshot(**{**snap.__dict__, "nodes": nodes})).nodes[target.node]
    assert node.memory_bandwidth == MemoryBandwidth(9 * GB)
    # ...and none where the node was never measured.
    [plain] = plan_of(snap).speed_targets
    assert plain.ceiling is None


def test_a_sliding_window_layer_reads_at_most_its_window() -> None:
    gemma3_4b = CATALOG["gemma3:4b"]
    assert gemma3_4b.sliding_window and gemma3_4b.global_layers is not None
    per_token_layer = kv_read_bytes(
        replace(gemma3_4b, layers=1, global_layers=1), 1, KVCacheType.F16)
    window = gemma3_4b.sliding_window
    swa_layers = gemma3_4b.layers - gemma3_4b.global_layers
    at = 4 * window
    assert kv_read_bytes(gemma3_4b, at, KVCacheType.F16) == per_token_layer * (
        gemma3_4b.global_layers * at + swa_layers * window)
