"""Fake node shapes -> Node, StorageClass and local PersistentVolume manifests.

Pure functions: a fixture file in, Kubernetes objects (plain dicts) out. kwok
manages every Node carrying the `kwok.x-k8s.io/node: fake` annotation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
DEFAULT_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nodes.yaml"
DEFAULT_MAX_PODS = "110"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""


@dataclass(frozen=True)
class NodeShape:
    """One fake node: its name, allocatable resources, labels, taints and local disks."""

    name: str
    cpu: str
    memory: str
    pods: str = DEFAULT_MAX_PODS
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    volumes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeFixture:
    storage_class: str
    nodes: tuple[NodeShape, ...]


def load_fixture(path: Path = DEFAULT_FIXTURE) -> NodeFixture:
    """Expand the pools of a fixture file into individual node shapes."""
    data = yaml.safe_load(path.read_text())
    nodes: list[NodeShape] = []
    for pool in data["pools"]:
        for index in range(int(pool.get("count", 1))):
            nodes.append(
                NodeShape(
                    name=f"{pool['name']}-{index}",
                    cpu=str(pool["cpu"]),
                    memory=str(pool["memory"]),
                    pods=str(pool.get("pods", DEFAULT_MAX_PODS)),
                    labels={str(k): str(v) for k, v in (pool.get("labels") or {}).items()},
                    taints=tuple(
                        Taint(key=t["key"], value=str(t.get("value", "")), effect=t["effect"])
                        for t in pool.get("taints") or ()
                    ),
                    volumes=tuple(str(v) for v in pool.get("volumes") or ()),
                )
            )
    storage_class = str(data.get("storageClass", "local-disk"))
    return NodeFixture(storage_class=storage_class, nodes=tuple(nodes))


def node_manifest(shape: NodeShape) -> Manifest:
    """A Node object kwok will manage, created with its capacity and allocatable.

    Nodes are the one kind whose status may be set on create; setting it there,
    not in a later patch, means kwok's first status write already sees it (a
    patch could race kwok's initialization and lose to its defaults).
    """
    labels = {
        "kubernetes.io/hostname": shape.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **shape.labels,
    }
    resources = {"cpu": shape.cpu, "memory": shape.memory, "pods": shape.pods}
    spec: dict[str, Any] = {}
    if shape.taints:
        spec["taints"] = [
            {"key": t.key, "value": t.value, "effect": t.effect} if t.value
            else {"key": t.key, "effect": t.effect}
            for t in shape.taints
        ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": shape.name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
        },
        "spec": spec,
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def storage_class_manifest(name: str) -> Manifest:
    """Bare-metal style local storage: no provisioner, bind when a pod is scheduled."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
    }


def local_volume_name(node: str, index: int) -> str:
    return f"local-{node}-{index}"


def local_volume_manifests(shape: NodeShape, storage_class: str) -> list[Manifest]:
    """One local PersistentVolume per disk of the node, pinned to it by nodeAffinity."""
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": local_volume_name(shape.name, index),
                "labels": {"localmodel.dev/test-node": shape.name},
            },
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": storage_class,
                "volumeMode": "Filesystem",
                "local": {"path": f"/mnt/disks/vol{index}"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [shape.name],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
        for index, size in enumerate(shape.volumes)
    ]
