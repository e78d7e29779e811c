"""Hypothesis strategies for hostile input: manifests, nodes and raw bytes.

Shared by `tests/api/test_fuzz.py` (nothing escapes but the project's own
validation errors; accepted manifests render well-formed objects) and
`tests/e2e/test_hostile_api.py` (accepted manifests and what they render are
accepted by a real API server).

Each field of a LocalModel is drawn from its valid values *or* from a pool of
hostile ones (wrong types, boundaries, huge numbers, odd strings, nesting), so a
run sees both accepted and refused manifests in every corner of the schema.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import strategies as st

# CI budget: examples per fuzz test (override with LOCALMODEL_FUZZ_EXAMPLES).
EXAMPLES = int(os.environ.get("LOCALMODEL_FUZZ_EXAMPLES", "300"))

_WEIRD_TEXT = st.sampled_from(
    [
        "",
        " ",
        "auto",
        "node",
        "0",
        "-1",
        "1e31",
        "8Ei",
        "0E40",
        "1ki",
        "NaN",
        "yes",
        "true",
        "2",
        "é",
        "a" * 300,
        "9lives",
        "x;rm -rf /",
        "$(id)",
        "`id`",
        "a\nb",
        "\x00",
        "OLLAMA_HOST",
        "LD_PRELOAD",
        "q4_0",
        "NoExecute",
        "Exists",
        "kubernetes.io/hostname",
        "a/b/c",
        "-a",
    ]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63)]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1.0, 2.0, 1.5, -0.0, 1e300]),
    st.text(max_size=20),
    _WEIRD_TEXT,
)

json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), _WEIRD_TEXT), inner, max_size=4),
    ),
    max_leaves=12,
)


def _or_hostile(valid: st.SearchStrategy[Any], weight: int = 16) -> st.SearchStrategy[Any]:
    """A valid value, or (one time in `weight`) anything at all."""
    # sampled_from draws evenly (integers() favours its bounds) and shrinks to the valid side.
    return st.tuples(st.sampled_from(range(weight)), valid, json_values).map(
        lambda t: t[2] if t[0] == weight - 1 else t[1]
    )


_QUANTITIES = st.one_of(
    st.sampled_from(["64Mi", "512Mi", "1Gi", "4.5Gi", "8Gi", "100G", "64Ti", "1e9", "2E10"]),
    st.sampled_from(["0", "1", "63Mi", "65Ti", "1e31", "0E40", "8Ei", "1ki", "1.", ".5Gi"]),
    st.builds(
        lambda n, s: f"{n}{s}",
        st.integers(0, 100000),
        st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"]),
    ),
)
_LABEL_KEYS = st.sampled_from(
    [
        *("pool", "kubernetes.io/hostname", "node.kubernetes.io/instance-type", "a.b/c", "x"),
        *("bad key", "/x", "a/", "A.b/c", "a" * 64, "a" * 254 + "/b", "-x"),  # near misses
    ]
)
_LABEL_VALUES = st.sampled_from(
    ["", "a", "small", "avx2-8", "v1.2_3", "x" * 63, "a b", "-a", "x" * 64, "a/b"]
)

tolerations = st.fixed_dictionaries(
    {},
    optional={
        "key": _or_hostile(st.sampled_from(["", "dedicated", "example.com/gpu", "a"])),
        "operator": _or_hostile(st.sampled_from(["Equal", "Exists"])),
        "value": _or_hostile(_LABEL_VALUES),
        "effect": _or_hostile(st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])),
        "tolerationSeconds": _or_hostile(st.integers(0, 10**6)),
    },
)

specs = st.fixed_dictionaries(
    {"model": _or_hostile(st.sampled_from(["qwen3:1.7b", "qwen3:8b", "gemma3:1b", "acme/x:1"]))},
    optional={
        "engine": _or_hostile(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": _or_hostile(st.just("ollama")),
                    "version": _or_hostile(st.sampled_from(["0.32.2", "0.11.4", "v1"])),
                    "image": _or_hostile(st.sampled_from(["docker.io/ollama/ollama:0.11.4"])),
                },
            )
        ),
        "replicas": _or_hostile(st.integers(0, 3)),
        "cpu": _or_hostile(st.one_of(st.integers(1, 16), st.just("node"))),
        "memory": _or_hostile(st.one_of(st.just("auto"), _QUANTITIES)),
        "context": _or_hostile(st.integers(512, 65536)),
        "slots": _or_hostile(st.integers(1, 4)),
        "kvCache": _or_hostile(st.sampled_from(["f16", "q8_0", "q4_0"])),
        "flashAttention": _or_hostile(st.sampled_from(["auto", "enabled", "disabled"])),
        "keepAlive": _or_hostile(st.sampled_from(["-1", "5m", "24h", "0"])),
        "modelInfo": _or_hostile(
            st.fixed_dictionaries(
                {
                    "weightsSize": _or_hostile(_QUANTITIES),
                    "layers": _or_hostile(st.integers(1, 128)),
                    "kvHeads": _or_hostile(st.integers(1, 64)),
                },
                optional={
                    "keyLength": _or_hostile(st.integers(1, 256)),
                    "family": _or_hostile(st.sampled_from(["qwen3", "llama"])),
                },
            )
        ),
        "placement": _or_hostile(
            st.fixed_dictionaries(
                {},
                optional={
                    "exclusive": _or_hostile(st.booleans()),
                    "nodeSelector": _or_hostile(
                        st.dictionaries(_LABEL_KEYS, _LABEL_VALUES, max_size=2)
                    ),
                    "tolerations": _or_hostile(st.lists(tolerations, max_size=2)),
                    "safeCpuPath": _or_hostile(st.booleans()),
                },
            )
        ),
        "storage": _or_hostile(
            st.fixed_dictionaries(
                {},
                optional={
                    "size": _or_hostile(_QUANTITIES),
                    "storageClassName": _or_hostile(st.sampled_from(["local-disk", "fast.ssd"])),
                    "retain": _or_hostile(st.booleans()),
                },
            )
        ),
        "gateway": _or_hostile(
            st.fixed_dictionaries(
                {},
                optional={
                    "enabled": _or_hostile(st.booleans()),
                    "maxQueue": _or_hostile(st.integers(0, 100)),
                    "deadlineSeconds": _or_hostile(st.integers(1, 3600)),
                    "maxTokens": _or_hostile(st.integers(1, 4096)),
                },
            )
        ),
        "env": _or_hostile(
            st.lists(
                st.fixed_dictionaries(
                    {"name": _or_hostile(st.sampled_from(["FOO", "OLLAMA_DEBUG", "HTTP_PROXY"]))},
                    optional={"value": _or_hostile(st.text(max_size=10))},
                ),
                max_size=3,
            )
        ),
    },
)

_NAMES = st.one_of(
    st.sampled_from(["m", "qwen3", "a-b", "a" * 52, "x1"]),
    st.sampled_from(["9lives", "a" * 53, "Qwen", "-a", "a-", "a.b", "", "a_b"]),  # near misses
    st.from_regex(r"[a-z][-a-z0-9]{0,20}[a-z0-9]", fullmatch=True),
)

manifests = st.fixed_dictionaries(
    {
        "apiVersion": _or_hostile(st.just("localmodel.dev/v1alpha1"), weight=64),
        "kind": _or_hostile(st.just("LocalModel"), weight=64),
        "metadata": _or_hostile(
            st.fixed_dictionaries(
                {"name": _or_hostile(_NAMES, weight=32)},
                optional={
                    "namespace": _or_hostile(st.sampled_from(["default", "ai"]), weight=32),
                    "labels": _or_hostile(st.dictionaries(_LABEL_KEYS, _LABEL_VALUES, max_size=2)),
                    "uid": st.uuids().map(str),
                    "generation": _or_hostile(st.integers(1, 10)),
                    "extra": json_values,
                },
            ),
            weight=64,
        ),
        "spec": _or_hostile(specs, weight=64),
    },
    optional={"status": _or_hostile(st.just({}), weight=4)},
)

_CPU_FLAG_LABELS = st.dictionaries(
    st.sampled_from(
        [
            "feature.node.kubernetes.io/cpu-cpuid.AVX2",
            "feature.node.kubernetes.io/cpu-cpuid.AVX512F",
            "feature.node.kubernetes.io/cpu-cpuid.AMXTILE",
            "feature.node.kubernetes.io/cpu-model.vendor_id",
            "localmodel.dev/cpu-flags-known",
            "localmodel.dev/cpu.avx2",
            "localmodel.dev/cpu-physical-cores",
            "pool",
        ]
    ),
    _or_hostile(st.sampled_from(["true", "Intel", "AMD", "8", "small", "false"])),
    max_size=4,
)

node_objects = st.builds(
    lambda i, labels, cpu, mem, taints: {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"node-{i}", "labels": labels},
        "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": cpu, "memory": mem}},
    },
    st.integers(0, 5),
    _CPU_FLAG_LABELS,
    _or_hostile(st.sampled_from(["2", "8", "16", "3500m", "64"])),
    _or_hostile(st.sampled_from(["4Gi", "32Gi", "128Gi", "1Ti"])),
    _or_hostile(
        st.lists(
            st.fixed_dictionaries(
                {
                    "key": st.sampled_from(["dedicated", "example.com/gpu"]),
                    "effect": _or_hostile(st.sampled_from(["NoSchedule", "NoExecute"])),
                },
                optional={"value": st.sampled_from(["a", "llm"])},
            ),
            max_size=2,
        ),
        weight=6,
    ),
)

_YAML_TOKENS = st.sampled_from(
    [
        "a", ": ", "- ", "\n", "  ", "[", "]", "{", "}", ", ", "&x ", "*x", "<<: ", "!!binary ",
        "!!set ", "!tag ", "'", '"', "#", "---\n", "...\n", "? ", "|\n", ">\n", "1", "1e400",
        "9" * 30, "yes", "~", "2026-01-01", ".inf", "\t", "\\", "%YAML 1.1\n", "\ufeff", "é",
    ]
)  # fmt: skip
yaml_texts = st.lists(_YAML_TOKENS, max_size=40).map("".join)
