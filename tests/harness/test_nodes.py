"""The node fixture expands into the Node and PersistentVolume objects the cluster gets."""

from __future__ import annotations

from pathlib import Path

from tests.harness.nodes import (
    KWOK_ANNOTATION,
    load_fixture,
    local_volume_manifests,
    node_manifest,
    storage_class_manifest,
)

AMX_LABELS = ("AMXTILE", "AMXINT8", "AMXBF16", "AVX512F", "AVX2")


def test_default_fixture_has_the_documented_pools() -> None:
    fixture = load_fixture()
    by_name = {n.name: n for n in fixture.nodes}
    assert set(by_name) == {"amx-0", "amx-1", "avx2-0", "avx2-1", "small-0", "tainted-0"}
    for name in ("amx-0", "amx-1"):
        shape = by_name[name]
        assert (shape.cpu, shape.memory, shape.taints) == ("32", "128Gi", ())
        for feature in AMX_LABELS:
            assert shape.labels[f"feature.node.kubernetes.io/cpu-cpuid.{feature}"] == "true"
    avx2 = by_name["avx2-0"]
    assert (avx2.cpu, avx2.memory) == ("8", "32Gi")
    assert "feature.node.kubernetes.io/cpu-cpuid.AMXTILE" not in avx2.labels
    assert (by_name["small-0"].cpu, by_name["small-0"].memory) == ("2", "4Gi")
    assert [t.effect for t in by_name["tainted-0"].taints] == ["NoSchedule"]


def test_node_is_kwok_managed_with_status_labels_and_taints() -> None:
    tainted = next(n for n in load_fixture().nodes if n.taints)
    node = node_manifest(tainted)
    assert node["metadata"]["annotations"] == {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == tainted.name
    assert node["spec"]["taints"] == [
        {"key": "localmodel.dev/reserved", "value": "batch", "effect": "NoSchedule"}
    ]
    assert node["status"]["allocatable"] == {"cpu": "32", "memory": "128Gi", "pods": "110"}
    assert node["status"]["capacity"] == node["status"]["allocatable"]


def test_local_volumes_are_pinned_to_their_node_in_the_no_provisioner_class() -> None:
    amx = load_fixture().nodes[0]
    volumes = local_volume_manifests(amx, "local-disk")
    assert [v["spec"]["capacity"]["storage"] for v in volumes] == ["200Gi", "50Gi"]
    assert len({v["metadata"]["name"] for v in volumes}) == 2
    for volume in volumes:
        assert volume["spec"]["storageClassName"] == "local-disk"
        [term] = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert term["matchExpressions"] == [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [amx.name]}
        ]
    storage_class = storage_class_manifest("local-disk")
    assert storage_class["provisioner"] == "kubernetes.io/no-provisioner"
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"


def test_pools_expand_by_count_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("pools:\n  - {name: big, count: 3, cpu: 64, memory: 256Gi}\n")
    fixture = load_fixture(path)
    assert [n.name for n in fixture.nodes] == ["big-0", "big-1", "big-2"]
    assert fixture.storage_class == "local-disk"
    assert all(n.cpu == "64" and n.volumes == () and n.taints == () for n in fixture.nodes)
