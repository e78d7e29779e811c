"""The test cluster's default StorageClass: the local-path provisioner kind and
k3s ship (github.com/rancher/local-path-provisioner, built by
hack/build-tools.sh), so a claim on the real node binds to a volume made for it.

The provisioner runs out of cluster, as the control plane's other parts do
(`--kubeconfig`, the admin identity); its helper pods (which make and remove the
volume's directory on the node) run on the real node from the busybox stand-in
`hack/build-images.sh` builds, pulled from the test registry. Its objects are
the upstream deployment's (deploy/local-path-storage.yaml): the
`local-path-storage` namespace, the helper pods' ServiceAccount, the
`local-path-config` ConfigMap (config.json, the setup and teardown scripts,
helperPod.yaml) and the `local-path` StorageClass (WaitForFirstConsumer,
Delete), marked the default class. Volumes live under the node's directory,
so the node's cleanup removes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.harness.processes import ManagedProcess

if TYPE_CHECKING:
    from tests.harness.cluster import TestCluster

NAMESPACE = "local-path-storage"
SERVICE_ACCOUNT = "local-path-provisioner-service-account"
CONFIG_MAP = "local-path-config"
STORAGE_CLASS = "local-path"
PROVISIONER = "rancher.io/local-path"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"

SETUP = """#!/bin/sh
set -eu
mkdir -m 0777 -p "$VOL_DIR"
"""
TEARDOWN = """#!/bin/sh
set -eu
rm -rf "$VOL_DIR"
"""


def helper_pod(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "tolerations": [{"key": "node.kubernetes.io/disk-pressure", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "helper-pod", "image": image,
                            "imagePullPolicy": "IfNotPresent"}],
        },
    }


def manifests(helper_image: str, volumes_dir: Path) -> list[dict[str, Any]]:
    """The provisioner's objects in the cluster (it reads its config from the ConfigMap)."""
    config = {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
                               "paths": [str(volumes_dir)]}]}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
         "data": {"config.json": json.dumps(config, indent=1), "setup": SETUP,
                  "teardown": TEARDOWN,
                  "helperPod.yaml": yaml.safe_dump(helper_pod(helper_image), sort_keys=False)}},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
         "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS: "true"}},
         "provisioner": PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer",
         "reclaimPolicy": "Delete"},
    ]


def start(cluster: TestCluster, helper_image: str, volumes_dir: Path) -> ManagedProcess:
    """Apply the objects and start the provisioner (a process of `cluster`)."""
    assert cluster.tools is not None
    volumes_dir.mkdir(parents=True, exist_ok=True)
    cluster.apply(manifests(helper_image, volumes_dir))
    proc = ManagedProcess(
        name="local-path-provisioner",
        argv=[str(cluster.tools["local-path-provisioner"]), "--debug", "start",
              f"--kubeconfig={cluster.admin_kubeconfig}", f"--namespace={NAMESPACE}",
              f"--configmap-name={CONFIG_MAP}", f"--service-account-name={SERVICE_ACCOUNT}",
              f"--provisioner-name={PROVISIONER}", f"--helper-image={helper_image}"],
        log_path=cluster.workdir / "logs" / "local-path-provisioner.log")
    proc.start()
    cluster.processes.append(proc)
    return proc
