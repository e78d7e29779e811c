"""The journey tier: a user's path from `helm install` to an answer, on a real kubelet.

One real-node cluster for the whole package (tests/harness: TestCluster with
`real_node=True`: the images of hack/build-images.sh pushed to the test
registry, from which the node's empty containerd pulls them), the chart
installed by `helm install` with the operator image from that registry, the
cached GGUF files served over HTTP on the node's address (tests/harness/models.py)
so pods download weights as from an internal mirror,
and a model namespace that enforces Pod Security `baseline` (test_pod_security.py
makes one that enforces `restricted` for a llama-server model).

The fixture FAILS (never skips) when anything of that cannot start: the real
node's Debian packages, root, the built tools, engines or images. A green run
means the journey really ran.

The machine has 2 cores: every model runs with `cpu: 1` and one thread, and
the tests run one model at a time (the Ollama module's model is deleted before
the llama-server module's is created).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator

import pytest

from tests.harness import (
    TestCluster,
)
from tests.harness.chart import install_chart
from tests.harness.fixtures import real_node_parts_or_fail, real_node_started_or_fail
from tests.harness.models import ModelFileServer
from tests.harness.realnode import NODE_DIR
from tests.realnode.journey import Journey, Timings, local_volumes, pull_events

# Where the real node's local PersistentVolumes live: under the node's own
# directory, so the harness's cleanup removes them with the node.
VOLUMES_DIR = NODE_DIR / "volumes"
VOLUMES = 9  # one per LocalModel the tier creates (weights are retained)
# The journey's operator reads speeds every 5 s (10 s when idle), calls a replica slow after
# 30 s of traffic below half its expected rate (clear: 15 s at 0.7), so
# test_speed_on_node.py sees a slow replica caught and cleared within a test's time.
OPERATOR_ARGS = ("--speed-interval=5", "--speed-idle-interval=10",
                 "--slow-replica-after=30", "--slow-replica-clear-after=15")

# The node probe measures the memory bandwidth only on a quiet node (probe/bandwidth.py);
# at install the operator's own start keeps the node busy, and the next try would be the
# default interval (300 s) later: every 15 s here, so the decode ceiling that
# test_speed_on_node.py and test_sizes_on_node.py read is published once the node is quiet.
PROBE_VALUES = ("probe.intervalSeconds=15",)


@pytest.fixture(scope="package")
def journey() -> Iterator[Journey]:
    """The real-node cluster with the chart installed and the model files served."""
    timings = Timings()
    tools, gguf = real_node_parts_or_fail("the real-node journey")
    keep = os.environ.get("LOCALMODEL_KEEP_CLUSTER", "") not in ("", "0")
    # Imports every image hack/build-images.sh built (fails naming any not built).
    cluster = TestCluster(tools=tools, keep_workdir=keep, real_node=True)
    began = time.monotonic()
    real_node_started_or_fail(cluster)
    timings.add("cluster with the real node up (registry started, images pushed)",
                time.monotonic() - began)
    assert cluster.real_node is not None and cluster.registry is not None
    timings.add("  of which: the registry's start", cluster.registry.start_seconds or 0.0)
    timings.add("  of which: pushing every image", cluster.registry.push_seconds or 0.0)
    models = ModelFileServer(gguf.parent, bind=cluster.node_address)
    try:
        models.start()
        node = cluster.real_node.name
        cluster.apply(local_volumes(node, VOLUMES, VOLUMES_DIR))
        operator_image = cluster.real_node.images.operator
        images_before_chart = cluster.real_node.image_names()
        began = time.monotonic()
        install_chart(tools, cluster.admin_kubeconfig, operator_image, node,
                      extra_args=OPERATOR_ARGS, set_values=PROBE_VALUES)
        timings.add("helm install --wait (operator and probe pods Ready, images pulled)",
                    time.monotonic() - began)
        for event in pull_events(cluster):
            print(f"  {event}")
        sha256 = hashlib.sha256(gguf.read_bytes()).hexdigest()
        j = Journey(cluster=cluster, models=models, node=node, gguf=gguf, sha256=sha256,
                    operator_image=operator_image, timings=timings,
                    images_before_chart=images_before_chart)
        j.create_model_namespace()
        yield j
    finally:
        models.stop()
        cluster.stop()
        print(f"\n{timings.report()}")

