"""What the journey tests do on the real node: create LocalModels, watch them
become Ready, reach them as a user does (kubectl port-forward, a client pod on
the Service's cluster IP), look inside their containers (kubectl exec) and at
their cgroups from the host the node runs on."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import ollama as ollama_client
import openai
import pytest

from localmodel.contract import CONTAINER_GATEWAY, LABEL_NAME, LABEL_ROLE, ROLE_DOORMAN
from localmodel.controller.config import OperatorConfig
from localmodel.engines import llama_server, ollama
from localmodel.gateway.keys import digest_of
from localmodel.gateway_contract import GATEWAY_PORT
from localmodel.render.names import SERVICE_PORT
from tests.builders import MakeLocalModel
from tests.harness import TestCluster
from tests.harness.chart import CHART_DIR
from tests.harness.chart import NAMESPACE as CHART_NAMESPACE
from tests.harness.chart import RELEASE as CHART_RELEASE
from tests.harness.engines import CHAT_TEMPLATE_ENV, MODEL_TAG, template_markers
from tests.harness.models import ModelFileServer
from tests.harness.nodes import local_volume_name
from tests.harness.prereqs import given_images
from tests.harness.processes import ManagedProcess, free_port, port_is_listening, wait_for

MODEL_NAMESPACE = "journey"
# The model namespace enforces this Pod Security level (see docs/operator.md,
# "Pod Security"): Ollama's pods need root for its store and init steps, so
# `restricted` does not admit them; llama-server's pass it
# (tests/realnode/test_pod_security.py enforces it on them).
POD_SECURITY_LEVEL = "baseline"
LM_PATH = f"/apis/localmodel.dev/v1alpha1/namespaces/{MODEL_NAMESPACE}/localmodels"
PODS_PATH = f"/api/v1/namespaces/{MODEL_NAMESPACE}/pods"
# The operator's Lease (the chart passes no --leader-name) and its replicas
# (the chart's default, `replicas: 2`: tests/realnode/test_chart_install.py).
OPERATOR_LEASE = (f"/apis/coordination.k8s.io/v1/namespaces/{CHART_NAMESPACE}/leases/"
                  f"{OperatorConfig.leader_name}")
OPERATOR_REPLICAS = 2


def replica_pods(name: str) -> str:
    """The label selector of a model's replica pods: its doorman (`render/doorman.py`) left out."""
    return f"{LABEL_NAME}={name},{LABEL_ROLE}!={ROLE_DOORMAN}"


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
                # A local volume's capacity is declared, not enforced: 20Gi binds the
                # claim of test_sizes_on_node.py's largest shape (Qwen3 8B: 11Gi).
                "capacity": {"storage": "20Gi"},
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


def pull_events(cluster: TestCluster) -> list[str]:
    """The kubelet's `Pulled` Events (image and time taken), oldest first."""
    events = cluster.api().get("/api/v1/events?fieldSelector=reason%3DPulled")["items"]
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [f"{e['involvedObject'].get('namespace')}/{e['involvedObject']['name']}: "
            f"{e.get('message', '')}" for e in events]


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


def http_json(url: str, body: Manifest | None = None, timeout: float = 120.0,
              key: str | None = None) -> tuple[int, Any]:
    """POST (or GET without a body) JSON, with `key` as a Bearer API key when
    given; (status, decoded body or text)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers=headers)
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


def clean_reply(text: str | None) -> str:
    """A reply a user can read: not empty, and no chat-template marker in it
    (a template mismatch shows as a literal `<|im_end|>` and the like:
    docs/engine-facts.md#a-gguf-without-a-chat-template)."""
    reply = (text or "").strip()
    assert reply, f"an empty reply: {text!r}"
    markers = template_markers(reply)
    assert not markers, f"the reply holds chat-template markers {markers}: {reply!r}"
    return reply


PROMPT = "Say hello in three words."
# A generation that keeps one CPU busy for minutes: far longer than a client's
# patience below.
LONG_PROMPT = "Count from 1 to 10000, one number per line."
LONG_TOKENS = 4000
CLIENT_PATIENCE = 4.0  # seconds a client waits before it gives up


@dataclass(frozen=True)
class EngineCalls:
    """How the tests call one engine's model through its gateway: a short
    request (path, body, where its answer is) and a long generation by an
    official client that gives up after `timeout` seconds (it raises then)."""

    engine: str
    short_path: str
    short_body: Manifest
    answer: Callable[[Any], str]
    long: Callable[[str, float, str], object]  # (base URL, timeout, X-Request-Id)

    def short(self, url: str, timeout: float = 120) -> tuple[int, Any]:
        return http_json(f"{url}{self.short_path}", self.short_body, timeout=timeout)


def _ollama_long(url: str, timeout: float, request_id: str) -> object:
    # Greedy: Ollama aborts a generation whose same token (whitespace trimmed)
    # repeats more than 30 times in a row ("prediction aborted, token repeat
    # limit reached", llm/server.go), and a sampled count from this 270M model
    # sometimes ran into blank lines and ended before its caller left (a
    # fresh-clone CI run, 2026-12-02: upstream_error after 4.6 s). Counting
    # greedily repeats no token.
    client = ollama_client.Client(host=url, timeout=timeout, headers={"X-Request-Id": request_id})
    return client.generate(model=MODEL_TAG, prompt=LONG_PROMPT,
                           options={"num_predict": LONG_TOKENS, "temperature": 0})


def _openai_long(url: str, timeout: float, request_id: str) -> object:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=timeout,
                           max_retries=0, default_headers={"X-Request-Id": request_id})
    return client.chat.completions.create(
        model=MODEL_TAG, max_tokens=LONG_TOKENS,
        messages=[{"role": "user", "content": LONG_PROMPT}])


OLLAMA_CALLS = EngineCalls(
    engine=ollama.NAME, short_path="/api/generate",
    short_body={"model": MODEL_TAG, "prompt": PROMPT, "stream": False,
                "options": {"num_predict": 8, "temperature": 0}},
    answer=lambda body: str(body["response"]), long=_ollama_long)
LLAMA_SERVER_CALLS = EngineCalls(
    engine=llama_server.NAME, short_path="/v1/chat/completions",
    short_body={"model": MODEL_TAG, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPT}]},
    answer=lambda body: str(body["choices"][0]["message"]["content"]), long=_openai_long)


@dataclass
class Leaving:
    """A client that gave up on a long generation, seen from three places."""

    gateway_at: float  # s after it gave up: the gateway logged its request cancelled
    idle_at: float  # s after it gave up: the engine container's CPU time stopped growing
    samples: list[tuple[float, float]]  # (s after it gave up, engine CPU seconds)

    @property
    def after_gateway(self) -> float:
        """The product's share: from the gateway seeing the caller gone to idle."""
        return self.idle_at - self.gateway_at


@dataclass
class Journey:
    cluster: TestCluster
    models: ModelFileServer
    node: str
    gguf: Path
    sha256: str
    operator_image: str
    timings: Timings
    images_before_chart: list[str] = field(default_factory=list)  # containerd's

    # ---- the cluster ----------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        return self.cluster.kubectl(*args, check=check, stdin=stdin).stdout

    def get(self, path: str) -> Manifest:
        return self.cluster.api().get(path)

    def helm(self, *args: str, timeout: float = 300) -> str:
        """`helm ARGS...` on the chart's release namespace, as the admin; its output."""
        assert self.cluster.tools is not None
        result = subprocess.run(
            [str(self.cluster.tools["helm"]), *args, "--kubeconfig",
             str(self.cluster.admin_kubeconfig), "--namespace", CHART_NAMESPACE],
            capture_output=True, text=True, timeout=timeout + 60, check=False)
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
        return result.stdout

    def upgrade_chart(self, *settings: str, chart: Path = CHART_DIR) -> float:
        """`helm upgrade` of the release to `chart` (this checkout's by default)
        with its values and `settings`, waited for; the seconds it took."""
        began = time.monotonic()
        self.helm("upgrade", CHART_RELEASE, str(chart), "--reuse-values", "--wait",
                  "--timeout", "300s", *settings)
        self.operator_settled()
        return time.monotonic() - began

    def operator_settled(self, timeout: float = 180) -> None:
        """Wait until the operator's Deployment is done rolling: its pods of one
        template, none going, and one of them holding the Lease. `helm --wait`
        returns once the new pods are Ready, while an old replica may still
        lead for a moment and render what a test creates next with the old
        settings, which the new leader then rolls (CI, 2026-12-07: a model's
        pod replaced right after Ready)."""
        wait_for("the operator's pods to settle and one of them to hold the Lease",
                 self._operator_is_settled, timeout, interval=1)

    def _operator_is_settled(self) -> bool:
        items = self.get(
            f"/api/v1/namespaces/{CHART_NAMESPACE}/pods?labelSelector="
            f"app.kubernetes.io/instance={CHART_RELEASE},!app.kubernetes.io/component")["items"]
        names = {p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")}
        templates = {p["metadata"].get("labels", {}).get("pod-template-hash") for p in items}
        status, body = self.cluster.api().request("GET", OPERATOR_LEASE)
        holder = ((body.get("spec") or {}) if status == 200 else {}).get("holderIdentity")
        return (len(names) == len(items) == OPERATOR_REPLICAS and len(templates) == 1
                and holder in names)

    def router_settings(self) -> tuple[str, ...]:
        """The chart's router on, pinned to the real node with a small CPU
        request (the machine has 2 cores)."""
        return ("--set", "router.enabled=true", "--set", "router.resources.requests.cpu=20m",
                "--set-string", f"router.nodeSelector.kubernetes\\.io/hostname={self.node}")

    def create_model_namespace(self) -> None:
        """The namespace models run in, enforcing Pod Security POD_SECURITY_LEVEL."""
        api = self.cluster.api()
        api.create("/api/v1/namespaces", {"metadata": {"name": MODEL_NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": POD_SECURITY_LEVEL,
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}})
        wait_for("the model namespace's default ServiceAccount", lambda: api.status_of(
            "GET", f"/api/v1/namespaces/{MODEL_NAMESPACE}/serviceaccounts/default") == 200, 30)

    def keys_secret(self, namespace: str, name: str, key: str, caller: str) -> str:
        """A Secret holding a keys file (`keys.json`) that lets `key` in as
        `caller`, as a cluster admin writes one (docs/gateway.md, API keys);
        the path to delete it by."""
        path = f"/api/v1/namespaces/{namespace}/secrets"
        self.cluster.api().create(path, {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "stringData": {"keys.json": json.dumps(
                {"keys": [{"caller": caller, "sha256": digest_of(key)}]})}})
        return f"{path}/{name}"

    def model_file_url(self) -> str:
        return self.models.url_of(self.gguf.name)

    def downloads(self) -> int:
        return self.models.counts().get(self.gguf.name, 0)

    # ---- LocalModels ----------------------------------------------------------

    def local_model(self, name: str, engine: str, context: int = 1024) -> Manifest:
        """A LocalModel for the cached GGUF on `engine`, one CPU, on the real node
        (EnginesBuildingError at once for an engine whose image the run does not
        wait for: tests/harness/prereqs.py)."""
        given_images((engine,))  # hack/build-images.sh names each engine's image by the engine
        return (
            MakeLocalModel(name, MODEL_NAMESPACE).model("gemma3:270m").engine(engine)
            .gguf(self.model_file_url(), self.sha256).cpu(1).context(context)
            .spec(placement={"nodeSelector": {"kubernetes.io/hostname": self.node}},
                  storage={"storageClassName": "local-disk"},
                  # The GGUF carries no chat template: give it Gemma's, as a user must
                  # (docs/engine-facts.md#a-gguf-without-a-chat-template).
                  env=[{"name": k, "value": v} for k, v in CHAT_TEMPLATE_ENV.items()])
            .manifest()
        )

    def model(self, name: str) -> Manifest:
        return self.get(f"{LM_PATH}/{name}")

    def pods_of(self, name: str) -> list[Manifest]:
        """The model's replica pods (not its doorman, an idle model's stand-in), not leaving."""
        items: list[Manifest] = self.get(f"{PODS_PATH}?labelSelector={replica_pods(name)}")["items"]
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

    @contextlib.contextmanager
    def deployed(self, name: str, engine: str) -> Iterator[Deployed]:
        """A test module's model: created and Ready, deleted afterwards."""
        deployed = self.deploy(self.local_model(name, engine))
        try:
            yield deployed
        finally:
            self.delete_model(name)

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

    # ---- the operator and scrapes ------------------------------------------------

    def operator_pods(self) -> list[Manifest]:
        """The chart's operator pods (the release's, without the probe's component)."""
        items: list[Manifest] = self.get(
            f"/api/v1/namespaces/{CHART_NAMESPACE}/pods?labelSelector="
            f"app.kubernetes.io/instance={CHART_RELEASE},!app.kubernetes.io/component")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def scrape(self, namespace: str, pod: str, port: int) -> str:
        """GET the pod's /metrics through the API server's pod proxy."""
        return self.kubectl("get", "--raw",
                            f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/metrics")

    # ---- inside a pod ---------------------------------------------------------

    def exec(self, pod: str, container: str, script: str) -> str:
        return self.kubectl("exec", "-n", MODEL_NAMESPACE, pod, "-c", container, "--",
                            "/bin/sh", "-c", script)

    def logs(self, pod: str, container: str, previous: bool = False) -> str:
        return self.kubectl("logs", "-n", MODEL_NAMESPACE, pod, "-c", container,
                            *(["--previous"] if previous else []))

    @contextlib.contextmanager
    def port_forward(self, target: str, remote: int = SERVICE_PORT,
                     namespace: str = MODEL_NAMESPACE) -> Iterator[str]:
        """`kubectl port-forward TARGET LOCAL:REMOTE` (in the model namespace); the base URL."""
        assert self.cluster.tools is not None
        port = free_port()
        log = self.cluster.workdir / "logs" / f"port-forward-{secrets.token_hex(3)}.log"
        proc = ManagedProcess("kubectl port-forward", [
            str(self.cluster.tools["kubectl"]), "--kubeconfig", str(self.cluster.admin_kubeconfig),
            "port-forward", "-n", namespace, "--address", "127.0.0.1", target,
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

    # ---- the journeys both engines take ----------------------------------------

    def first_start(self, deployed: Deployed) -> Manifest:
        """What a model's first start shows on either engine: never Ready while
        its containers were not (sampled from creation on), its containers ready
        at the end, the GGUF downloaded once by the download step, a Guaranteed
        pod, and the LocalModel Ready. Its pod."""
        samples = deployed.samples
        early = [s for s in samples if not s.containers_ready]
        assert early, "the model was never seen starting (every sample had its containers ready)"
        assert all(not s.model_ready for s in early), [s for s in early if s.model_ready]
        assert samples[-1].containers_ready, samples[-1]
        # The weights came from the model file server, once.
        assert deployed.downloads == 1, deployed.downloads
        pod = self.pod_of(deployed.name)
        assert pod["status"]["qosClass"] == "Guaranteed"
        download = self.logs(pod["metadata"]["name"], "download")
        assert "localmodel: downloaded" in download, download
        assert condition(self.model(deployed.name), "Ready") == "True"
        return pod

    def openai_chat(self, url: str, what: str) -> str | None:
        """The official `openai` client's chat completion at URL (16 tokens,
        greedy), timed as `what`; the reply."""
        began = time.monotonic()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120,
                               max_retries=0)
        completion = client.chat.completions.create(
            model=MODEL_TAG, messages=[{"role": "user", "content": PROMPT}], max_tokens=16,
            temperature=0)
        self.timings.add(what, time.monotonic() - began)
        return completion.choices[0].message.content

    def one_thread_in_the_log(self, pod: str, container: str) -> None:
        """The engine's own log says it computes with one thread (`n_threads = 1`)."""
        log = self.logs(pod, container)
        threads = [int(n) for n in re.findall(r"n_threads = (\d+)", log)]
        assert threads and set(threads) == {1}, log[-3000:]

    def cfs_quota(self, pod: Manifest, container: str) -> tuple[int, int]:
        """The CFS quota and period of `container` as it sees them: one CPU, the
        same as the host's cgroup has."""
        inside = self.exec(pod["metadata"]["name"], container,
                           "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us "
                           "/sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null "
                           "|| cat /sys/fs/cgroup/cpu.max").split()
        quota, period = int(inside[0]), int(inside[1])
        assert quota / period == 1.0, inside
        group = container_cgroup("cpu", pod, container)
        if (group / "cpu.cfs_quota_us").exists():
            assert int((group / "cpu.cfs_quota_us").read_text()) == quota
        return quota, period

    def delete_pod_until_ready_again(self, first: Deployed) -> Manifest:
        """Delete the model's pod: the operator creates a new one, which becomes
        Ready without downloading the GGUF again; both start times printed.
        The new pod."""
        name = first.name
        pod = self.pod_of(name)
        old_uid = pod["metadata"]["uid"]
        downloads = self.downloads()
        began = time.monotonic()
        self.cluster.api().request("DELETE", f"{PODS_PATH}/{pod['metadata']['name']}")
        # Ready again: a new pod with every container ready, and the LocalModel says so.
        samples = self.watch_until_ready(
            name, began, done=lambda s: s.uid not in (None, old_uid) and s.containers_ready)
        seconds = time.monotonic() - began
        self.timings.add(f"{name}: pod deleted -> Ready again", seconds)
        seen = next(s.at for s in samples if s.uid not in (None, old_uid))
        ready = next(s.at for s in samples if s.uid not in (None, old_uid) and s.containers_ready)
        print(f"after the delete: new pod seen {seen:.1f} s, its containers ready {ready:.1f} s, "
              f"LocalModel Ready {samples[-1].at:.1f} s")
        print(f"{name}: first start: created -> Ready {first.ready_seconds:.1f} s; "
              f"second start: deleted -> Ready {seconds:.1f} s")
        new = self.pod_of(name)
        assert new["metadata"]["uid"] != old_uid
        replaced = [s for s in samples if s.uid not in (None, old_uid)]
        assert replaced and all(s.containers_ready for s in replaced if s.model_ready), replaced
        assert self.downloads() == downloads, "the second start downloaded the GGUF again"
        download = self.logs(new["metadata"]["name"], "download")
        assert "already on the volume" in download and "no download" in download, download
        return new

    def kill_engine_until_ready_again(self, name: str, calls: EngineCalls) -> None:
        """SIGKILL the engine: a request at once gets the gateway's 502 "engine
        unreachable" within seconds, the gateway's readiness and the pod's
        drop, the kubelet restarts the engine in the same pod (the gateway not
        restarted), Ready returns, and the model answers again."""
        engine = engine_container(calls.engine)
        pod = self.pod_of(name)
        restarts = {s["name"]: s["restartCount"] for s in pod["status"]["containerStatuses"]}
        cid = container_id(pod, engine)
        assert self.cluster.real_node is not None
        with self.port_forward(f"pod/{pod['metadata']['name']}", remote=GATEWAY_PORT) as url:
            assert http_json(f"{url}/readyz", timeout=10)[0] == 200
            began = time.monotonic()
            self.cluster.real_node.ctr("tasks", "kill", "--signal", "SIGKILL", cid)
            status, body = calls.short(url, timeout=30)
            answered = time.monotonic() - began
            self.timings.add(f"{name}: request during the engine's outage answered", answered)
            print(f"during the outage: {status} {body}")
            assert status == 502 and "engine unreachable" in str(body), (status, body)
            assert answered < 5, answered
            # The gateway's readiness drops with the engine...
            seen_unready = http_json(f"{url}/readyz", timeout=10)[0] == 503
        # ...the pod leaves Ready, the kubelet restarts the engine, and Ready returns.
        unready = seen_unready
        deadline = time.monotonic() + 300
        back = None
        while time.monotonic() < deadline:
            p = self.pod_of(name)
            statuses = {s["name"]: s for s in p["status"]["containerStatuses"]}
            ready = condition(p, "Ready") == "True"
            unready = unready or not ready
            if statuses[engine]["restartCount"] > restarts[engine] and ready and unready:
                back = time.monotonic() - began
                break
            time.sleep(0.25)
        assert back is not None, self.describe_model(name)
        self.timings.add(f"{name}: engine killed -> restarted and Ready again", back)
        p = self.pod_of(name)
        assert p["metadata"]["uid"] == pod["metadata"]["uid"], "the pod was replaced, not restarted"
        after = {s["name"]: s["restartCount"] for s in p["status"]["containerStatuses"]}
        assert after[CONTAINER_GATEWAY] == restarts[CONTAINER_GATEWAY]
        assert unready, "the pod never left Ready while its engine was down"
        wait_for("the LocalModel Ready again", lambda: condition(self.model(name), "Ready")
                 == "True", 120)
        self.timings.add(f"{name}: engine killed -> LocalModel Ready again",
                         time.monotonic() - began)
        with self.port_forward(f"svc/{name}") as url:
            status, body = calls.short(url)
        assert status == 200, body
        clean_reply(calls.answer(body))

    def client_gives_up(self, url: str, pod: Manifest, calls: EngineCalls,
                        patience: float = CLIENT_PATIENCE) -> Leaving:
        """A client of URL gives up after `patience` s on a long generation:
        when the gateway logged the request cancelled (its caller gone) and
        when the engine container's CPU time stopped growing, in seconds after
        the client gave up."""
        usage = cpu_usage_seconds(pod, engine_container(calls.engine))
        request_id = f"gives-up-{secrets.token_hex(4)}"
        errors: list[BaseException] = []
        gave_up: list[tuple[float, float]] = []  # (monotonic, wall clock)
        done = threading.Event()

        def caller() -> None:
            try:
                calls.long(url, patience, request_id)
            except BaseException as exc:  # the timeout is what we want
                errors.append(exc)
            finally:
                gave_up.append((time.monotonic(), time.time()))
                done.set()

        before = usage()
        thread = threading.Thread(target=caller, daemon=True)
        thread.start()
        assert done.wait(30), "the client never timed out"
        t0, wall0 = gave_up[0]
        busy = usage() - before
        thread.join(5)
        assert errors, "the generation finished before the client's timeout"
        # It was generating while the client waited (4 s at one CPU by default).
        assert busy > 2.0, f"the engine used only {busy:.2f} CPU s while the client waited"
        # CPU time of the engine container, sampled every 0.1 s.
        samples = [(time.monotonic() - t0, usage())]
        while samples[-1][0] < 5:
            time.sleep(0.1)
            samples.append((time.monotonic() - t0, usage()))
        # Busy right before giving up (it was generating), then idle: the first
        # moment from which the next second added less than 30 ms of CPU.
        idle_at = next((at for i, (at, used) in enumerate(samples)
                        for later_at, later in samples[i:] if later_at - at >= 1.0
                        and later - used < 0.03 and later_at - at < 1.15), None)
        record = self.gateway_record(pod["metadata"]["name"], request_id)
        gateway_at = datetime.fromisoformat(record["ts"]).timestamp() - wall0
        print(f"{url}: client gave up ({type(errors[0]).__name__}); gateway: "
              f"{record['outcome']} at {gateway_at:+.3f} s; engine CPU seconds after: "
              + ", ".join(f"{at:.1f}s:{used:.3f}" for at, used in samples[::5]))
        assert record["outcome"] == "cancelled_disconnect", record
        assert idle_at is not None, samples
        return Leaving(gateway_at=gateway_at, idle_at=idle_at, samples=samples)

    def client_at_the_pod_gives_up(self, name: str, calls: EngineCalls) -> Leaving:
        """A client of the pod's gateway port gives up (`client_gives_up`)."""
        pod = self.pod_of(name)
        left = self.client_gives_up(f"http://{pod['status']['podIP']}:{GATEWAY_PORT}", pod, calls)
        self.timings.add(f"{name}: client at the pod timed out -> gateway saw it",
                         left.gateway_at)
        self.timings.add(f"{name}: client at the pod timed out -> engine idle", left.idle_at)
        return left

    def client_through_port_forward_gives_up(self, name: str, calls: EngineCalls) -> Leaving:
        """A client of `kubectl port-forward svc/NAME` gives up (`client_gives_up`)."""
        pod = self.pod_of(name)
        with self.port_forward(f"svc/{name}") as url:
            left = self.client_gives_up(url, pod, calls)
        self.timings.add(f"{name}: client through port-forward timed out -> gateway saw it",
                         left.gateway_at)
        self.timings.add(f"{name}: client through port-forward timed out -> engine idle",
                         left.idle_at)
        return left

    def gateway_record(self, pod: str, request_id: str, timeout: float = 15) -> Manifest:
        """The gateway's log line (JSON) for one request."""
        def find() -> Manifest | None:
            for line in self.logs(pod, CONTAINER_GATEWAY).splitlines():
                if request_id in line and line.startswith("{"):
                    record: Manifest = json.loads(line)
                    if record.get("request_id") == request_id:
                        return record
            return None

        found: Manifest = wait_for(f"the gateway's log line of request {request_id}", find,
                                   timeout, interval=0.5)
        return found


def module_model(name: str, engine: str) -> Any:
    """A module-scoped fixture, named by what it is assigned to (`gemma =
    module_model(NAME, ENGINE)`): the LocalModel `name` on `engine`, created and
    Ready for the module's tests, deleted after them."""

    @pytest.fixture(scope="module")
    def model(journey: Journey) -> Iterator[Deployed]:
        with journey.deployed(name, engine) as deployed:
            yield deployed

    return model


def engine_container(engine: str) -> str:
    return {"ollama": ollama.NAME, "llama-server": llama_server.NAME}[engine]
