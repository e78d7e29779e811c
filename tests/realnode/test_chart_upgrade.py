"""`helm upgrade` from the previous chart version keeps models running, on the
real node: the journey's release is taken back to chart 0.1.0 (the packaged
chart in tests/fixtures/charts), a model is Ready, then the CRD is applied as
docs/install.md says (Helm never upgrades crds/) and the release upgraded to
this chart. The model pod keeps its uid and its containers their restart
counts, the model stays Ready throughout, the new operator leads and its
passes succeed, and 0.1.0's probe DaemonSet is replaced by this chart's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from localmodel import __version__
from localmodel.controller.config import OperatorConfig
from localmodel.engines import llama_server
from tests.harness.chart import NAMESPACE, RELEASE
from tests.harness.processes import wait_for
from tests.harness.tools import REPO_ROOT
from tests.realnode.journey import Deployed, Journey, Sample, condition

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

NAME = "gemma-chart"  # test_metrics_scrape.py's model too: the same retained weights
PREVIOUS = REPO_ROOT / "tests" / "fixtures" / "charts" / "localmodel-operator-0.1.0.tgz"
INSTALL_DOC = REPO_ROOT / "docs" / "install.md"
DAEMONSETS = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets"
NEWER_IMAGE_RBAC = "upgrade-test-newer-image"


def doc_crd_command() -> str:
    """The CRD step of docs/install.md's Upgrading section, as written."""
    section = INSTALL_DOC.read_text().split("## Upgrading", 1)[1]
    [command] = [line for line in section.splitlines() if line.startswith("helm show crds ")]
    return command


@pytest.fixture(scope="module")
def previous(journey: Journey) -> Iterator[None]:
    """The release at chart 0.1.0 (restored to this chart afterwards, whatever happened).

    0.1.0 runs this checkout's operator image (there is one image here), which
    refuses plain-http downloads unless told (chart `downloads.allowHttp`,
    which 0.1.0 does not know): the harness serves the model over http, so the
    flag goes in through 0.1.0's `extraArgs` and is taken back afterwards."""
    values = json.loads(journey.helm("get", "values", RELEASE, "-o", "json"))
    own = list(values.get("extraArgs") or [])
    # Nor does 0.1.0's ClusterRole grant what this image watches since (each
    # model's NetworkPolicy, the StorageClasses): granted beside it while 0.1.0 runs.
    api = journey.cluster.api()
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": NEWER_IMAGE_RBAC},
        "rules": [{"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                   "verbs": ["list", "watch", "create", "patch", "delete"]},
                  {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
                   "verbs": ["list", "watch"]}]})
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": NEWER_IMAGE_RBAC},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": NEWER_IMAGE_RBAC},
        "subjects": [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]})
    # (this checkout's image is tagged with this chart's appVersion, not 0.1.0's)
    journey.upgrade_chart(
        "--set", f"image.tag={__version__}", "--set-json",
        f"extraArgs={json.dumps([*own, '--allow-http-downloads=true'])}", chart=PREVIOUS)
    try:
        yield
    finally:
        journey.upgrade_chart("--set", "image.tag=", "--set-json", f"extraArgs={json.dumps(own)}")
        for kind in ("clusterrolebindings", "clusterroles"):
            api.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{NEWER_IMAGE_RBAC}")


@pytest.fixture(scope="module")
def model(journey: Journey, previous: None) -> Iterator[Deployed]:
    with journey.deployed(NAME, llama_server.NAME) as deployed:
        yield deployed


def restarts(pod: dict[str, object]) -> dict[str, int]:
    status = pod["status"]
    assert isinstance(status, dict)
    return {c["name"]: c["restartCount"] for c in status.get("containerStatuses", [])}


def test_upgrade_from_the_previous_chart_keeps_the_model_running(
    journey: Journey, model: Deployed
) -> None:
    assert journey.cluster.tools is not None
    history = journey.helm("history", RELEASE, "--max", "1", "-o", "json")
    assert '"chart":"localmodel-operator-0.1.0"' in history.replace(" ", ""), history
    old_daemonsets = {d["metadata"]["name"] for d in journey.get(DAEMONSETS)["items"]}
    assert old_daemonsets == {f"{RELEASE}-probe"}
    before = journey.pod_of(NAME)
    old_operators = {p["metadata"]["name"] for p in journey.operator_pods()}

    # Sample the model all through the CRD step and the upgrade.
    samples: list[Sample] = []
    stop = threading.Event()

    def watch() -> None:
        began = time.monotonic()
        while not stop.is_set():
            samples.append(journey.sample(NAME, began))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        tools = journey.cluster.tools
        env = {**os.environ, "KUBECONFIG": str(journey.cluster.admin_kubeconfig),
               "PATH": f"{tools['helm'].parent}:{tools['kubectl'].parent}:{os.environ['PATH']}"}
        crd = subprocess.run(["bash", "-o", "pipefail", "-c", doc_crd_command()], cwd=REPO_ROOT,
                             env=env, capture_output=True, text=True, timeout=120, check=False)
        assert crd.returncode == 0, crd.stderr
        assert re.search(r"customresourcedefinition\.apiextensions\.k8s\.io/localmodels\."
                         r"localmodel\.dev serverside-applied", crd.stdout), crd.stdout
        # A real upgrade brings a new operator image; there is one image here, so
        # a pod annotation stands in for it and makes the Deployment roll.
        seconds = journey.upgrade_chart("--set-string", "podAnnotations.upgraded-from=0.1.0")
        journey.timings.add("helm upgrade 0.1.0 -> this chart --wait", seconds)
        time.sleep(2)
    finally:
        stop.set()
        watcher.join(10)

    # The model never went down: same pod, no container restarted, Ready throughout.
    after = journey.pod_of(NAME)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert restarts(after) == restarts(before)
    assert samples and all(s.model_ready and s.uid == before["metadata"]["uid"]
                           for s in samples), [s for s in samples if not s.model_ready][:3]
    assert condition(journey.model(NAME), "Ready") == "True"

    # The operator rolled, a new replica leads and reconciles.
    new_operators = {p["metadata"]["name"] for p in journey.operator_pods()}
    assert len(new_operators) == 2 and not new_operators & old_operators

    def leader_passes() -> str | None:
        for name in new_operators:
            text = journey.scrape(NAMESPACE, name, OperatorConfig.metrics_listen[1])
            if "localmodel_operator_leader 1" in text and re.search(
                    r'^localmodel_operator_passes_total\{result="ok"\} [1-9]', text, re.M):
                return name
        return None

    leader = wait_for("a new operator replica to lead and pass", leader_passes, 120)
    # 0.1.0's DaemonSet is gone, this chart's runs its probe.
    names = {d["metadata"]["name"] for d in journey.get(DAEMONSETS)["items"]}
    assert names == {f"{RELEASE}-node-probe"}, names
    print(f"upgraded in {seconds:.1f} s; {len(samples)} samples, all Ready, pod "
          f"{after['metadata']['name']} unchanged; {leader} leads")
