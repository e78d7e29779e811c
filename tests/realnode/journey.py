"""What the journey tests do on the real node: create LocalModels, watch them
become Ready, reach them as a user does (kubectl port-forward, a client pod on
the Service's cluster IP), look inside their containers (kubectl exec) and at
their cgroups from the host the node runs on."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localmodel.contract import LABEL_NAME
from localmodel.engines import llama_server, ollama
from localmodel.render import SERVICE_PORT
from tests.harness import TestCluster
from tests.harness.models import ModelFileServer
from tests.harness.nodes import local_volume_name
from tests.harness.processes import ManagedProcess, free_port, port_is_listening, wait_for

MODEL_NAMESPACE = "journey"
# The model namespace enforces this Pod Security level (see docs/operator.md,
# "Pod Security"): the engine pods need root for Ollama's store and the init
# step, so `restricted` does not admit them.
POD_SECURITY_LEVEL = "baseline"
LM_PATH = f"/apis/localmodel.dev/v1alpha1/namespaces/{MODEL_NAMESPACE}/localmodels"
PODS_PATH = f"/api/v1/namespaces/{MODEL_NAMESPACE}/pods"
CGROUP = Path("/sys/fs/cgroup")

Manifest = dict[str, Any]


def local_volumes(node: str, count: int, root: Path, first: int = 0) -> list[Manifest]:
    """`count` local PersistentVolumes on the real node, under `root` (as the
    fixture's fake nodes have them), numbered from `first`."""
    volumes = []
    for n in range(first, first + count):
        path = root / f"disk-{n}"
        path.mkdir(parents=True, exist_ok=True)
        volumes.append({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": local_volume_name(node, n)},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "local-disk",
                "local": {"path": str(path)},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            },
        })
    return volumes


@dataclass
class Timings:
    """Named durations, printed as they are measured and once more at the end."""

    entries: list[tuple[str, float]] = field(default_factory=list)

    def add(self, what: str, seconds: float) -> float:
        self.entries.append((what, seconds))
        print(f"[timing] {what}: {seconds:.1f} s")
        return seconds

    def report(self) -> str:
        lines = [f"  {seconds:7.1f} s  {what}" for what, seconds in self.entries]
        return "real-node journey timings:\n" + "\n".join(lines)


@dataclass
class Sample:
    """One look at a model: its Ready condition and its pod's containers."""

    at: float
    model_ready: bool
    pod: str | None
    uid: str | None
    containers_ready: bool
    phase: str


@dataclass
class Deployed:
    """A LocalModel that reached Ready, with what was seen on the way."""

    name: str
    engine: str
    samples: list[Sample]
    ready_seconds: float
    downloads: int  # requests for the GGUF file during the start


def all_containers_ready(pod: Manifest | None) -> bool:
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)


def condition(obj: Manifest, kind: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return "Unknown"


def container_id(pod: Manifest, container: str) -> str:
    for s in pod["status"].get("containerStatuses") or []:
        if s["name"] == container and s.get("containerID"):
            return str(s["containerID"]).split("://", 1)[1]
    raise AssertionError(f"pod {pod['metadata']['name']} has no running {container} container")


def container_cgroup(subsystem: str, pod: Manifest, container: str) -> Path:
    """The container's cgroup directory on this host (cgroupfs driver; v1 or v2)."""
    pattern = f"**/pod{pod['metadata']['uid']}/{container_id(pod, container)}"
    roots = [CGROUP / subsystem / "kubepods", CGROUP / "cpu,cpuacct" / "kubepods",
             CGROUP / "kubepods"]
    for root in roots:
        for group in root.glob(pattern):
            return group
    raise AssertionError(f"no {subsystem} cgroup for {container} of {pod['metadata']['name']}")


def cpu_usage_seconds(pod: Manifest, container: str) -> Callable[[], float]:
    """A reader of the container's CPU time so far (cpuacct.usage, or cpu.stat)."""
    group = container_cgroup("cpuacct", pod, container)
    usage = group / "cpuacct.usage"
    if usage.exists():
        return lambda: int(usage.read_text()) / 1e9
    stat = group / "cpu.stat"

    def from_stat() -> float:
        fields = dict(line.split() for line in stat.read_text().splitlines())
        return int(fields["usage_usec"]) / 1e6

    return from_stat


def http_json(url: str, body: Manifest | None = None, timeout: float = 120.0
              ) -> tuple[int, Any]:
    """POST (or GET without a body) JSON; (status, decoded body or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


@dataclass
class Journey:
    cluster: TestCluster
    models: ModelFileServer
    node: str
    gguf: Path
    sha256: str
    operator_image: str
    timings: Timings

    # ---- the cluster ----------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        return self.cluster.kubectl(*args, check=check, stdin=stdin).stdout

    def get(self, path: str) -> Manifest:
        return self.cluster.api().get(path)

    def create_model_namespace(self) -> None:
        """The namespace models run in, enforcing Pod Security POD_SECURITY_LEVEL."""
        api = self.cluster.api()
        api.create("/api/v1/namespaces", {"metadata": {"name": MODEL_NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": POD_SECURITY_LEVEL,
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}})
        wait_for("the model namespace's default ServiceAccount", lambda: api.status_of(
            "GET", f"/api/v1/namespaces/{MODEL_NAMESPACE}/serviceaccounts/default") == 200, 30)

    def model_file_url(self) -> str:
        return self.models.url_of(self.gguf.name)

    def downloads(self) -> int:
        return self.models.counts().get(self.gguf.name, 0)

    # ---- LocalModels ----------------------------------------------------------

    def local_model(self, name: str, engine: str, context: int = 1024) -> Manifest:
        """A LocalModel for the cached GGUF on `engine`, one CPU, on the real node."""
        spec: Manifest = {
            "model": "gemma3:270m",
            "engine": {"name": engine},
            "gguf": {"url": self.model_file_url(), "sha256": self.sha256},
            "cpu": 1,
            "context": context,
            "placement": {"nodeSelector": {"kubernetes.io/hostname": self.node}},
            "storage": {"storageClassName": "local-disk"},
        }
        return {"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
                "metadata": {"name": name, "namespace": MODEL_NAMESPACE}, "spec": spec}

    def model(self, name: str) -> Manifest:
        return self.get(f"{LM_PATH}/{name}")

    def pods_of(self, name: str) -> list[Manifest]:
        items: list[Manifest] = self.get(f"{PODS_PATH}?labelSelector={LABEL_NAME}={name}")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def pod_of(self, name: str) -> Manifest:
        pods = self.pods_of(name)
        names = [p["metadata"]["name"] for p in pods]
        assert len(pods) == 1, f"want one pod of {name}, found {names}"
        return pods[0]

    def sample(self, name: str, since: float) -> Sample:
        lm = self.model(name)  # first the claim, then the pods it claims about
        pods = self.pods_of(name)
        pod = pods[0] if len(pods) == 1 else None
        return Sample(at=time.monotonic() - since, model_ready=condition(lm, "Ready") == "True",
                      pod=pod["metadata"]["name"] if pod else None,
                      uid=pod["metadata"]["uid"] if pod else None,
                      containers_ready=all_containers_ready(pod),
                      phase=((pod or {}).get("status") or {}).get("phase", "-"))

    def watch_until_ready(self, name: str, since: float, timeout: float = 600,
                          done: Callable[[Sample], bool] = lambda s: True) -> list[Sample]:
        """Sample the model every 0.25 s until its Ready condition is True (and `done`)."""
        samples: list[Sample] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.sample(name, since)
            samples.append(s)
            if s.model_ready and done(s):
                return samples
            time.sleep(0.25)
        raise AssertionError(
            f"LocalModel {name} not Ready after {timeout:.0f} s; "
            f"last: {samples[-1] if samples else None}"
            f"\n{self.describe_model(name)}")

    def deploy(self, manifest: Manifest, timeout: float = 600) -> Deployed:
        name = manifest["metadata"]["name"]
        downloads_before = self.downloads()
        began = time.monotonic()
        self.cluster.api().create(LM_PATH, manifest)
        samples = self.watch_until_ready(name, began, timeout)
        seconds = time.monotonic() - began
        self.timings.add(f"{name}: created -> Ready", seconds)
        return Deployed(name=name, engine=manifest["spec"]["engine"]["name"], samples=samples,
                        ready_seconds=seconds, downloads=self.downloads() - downloads_before)

    def delete_model(self, name: str, timeout: float = 120) -> None:
        self.cluster.api().request("DELETE", f"{LM_PATH}/{name}")
        wait_for(f"{name}'s pods to be gone", lambda: not self.get(
            f"{PODS_PATH}?labelSelector={LABEL_NAME}={name}")["items"], timeout, interval=0.5)

    def describe_model(self, name: str) -> str:
        """The model, its pods and their recent logs, for a failure message."""
        parts = [self.kubectl("get", "localmodel,pod,pvc,svc", "-n", MODEL_NAMESPACE, "-o", "wide",
                              check=False)]
        parts.append(self.kubectl("describe", "pod", "-n", MODEL_NAMESPACE, "-l",
                                  f"{LABEL_NAME}={name}", check=False)[-4000:])
        parts.append(self.kubectl("logs", "-n", MODEL_NAMESPACE, "-l", f"{LABEL_NAME}={name}",
                                  "--all-containers", "--tail=30", check=False))
        parts.append(self.kubectl("logs", "-n", "localmodel-system", "-l",
                                  "!app.kubernetes.io/component", "--tail=30",
                                  check=False))
        return "\n".join(parts)

    # ---- inside a pod ---------------------------------------------------------

    def exec(self, pod: str, container: str, script: str) -> str:
        return self.kubectl("exec", "-n", MODEL_NAMESPACE, pod, "-c", container, "--",
                            "/bin/sh", "-c", script)

    def logs(self, pod: str, container: str, previous: bool = False) -> str:
        return self.kubectl("logs", "-n", MODEL_NAMESPACE, pod, "-c", container,
                            *(["--previous"] if previous else []))

    @contextlib.contextmanager
    def port_forward(self, target: str, remote: int = SERVICE_PORT) -> Iterator[str]:
        """`kubectl port-forward TARGET LOCAL:REMOTE` in the model namespace; the base URL."""
        assert self.cluster.tools is not None
        port = free_port()
        log = self.cluster.workdir / "logs" / f"port-forward-{secrets.token_hex(3)}.log"
        proc = ManagedProcess("kubectl port-forward", [
            str(self.cluster.tools["kubectl"]), "--kubeconfig", str(self.cluster.admin_kubeconfig),
            "port-forward", "-n", MODEL_NAMESPACE, "--address", "127.0.0.1", target,
            f"{port}:{remote}"], log)
        with proc.serving(f"kubectl port-forward {target}", lambda: port_is_listening(port), 30):
            yield f"http://127.0.0.1:{port}"

    def run_client_pod(self, script: str, timeout: float = 180) -> tuple[str, float]:
        """Run `python3 -c SCRIPT` in a pod of the operator image; (its output, seconds)."""
        name = f"client-{secrets.token_hex(3)}"
        pod: Manifest = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": MODEL_NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "nodeName": self.node,
                "automountServiceAccountToken": False,
                "containers": [{
                    "name": "client", "image": self.operator_image, "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                  "limits": {"memory": "128Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]},
                                        "runAsNonRoot": True, "runAsUser": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                }],
            },
        }
        api = self.cluster.api()
        began = time.monotonic()
        api.create(PODS_PATH, pod)
        try:
            done = wait_for(f"client pod {name} to finish", lambda: (
                p if (p := self.get(f"{PODS_PATH}/{name}"))["status"].get("phase")
                in ("Succeeded", "Failed") else None), timeout, interval=0.5)
            seconds = time.monotonic() - began
            out = self.kubectl("logs", "-n", MODEL_NAMESPACE, name, check=False)
            assert done["status"]["phase"] == "Succeeded", f"client pod failed:\n{out}"
            return out, seconds
        finally:
            api.request("DELETE", f"{PODS_PATH}/{name}?gracePeriodSeconds=0")


def engine_container(engine: str) -> str:
    return {"ollama": ollama.NAME, "llama-server": llama_server.NAME}[engine]
