"""A real Kubernetes control plane on 127.0.0.1 for the e2e tests and the demo.

etcd, kube-apiserver (RBAC, static token authentication), kube-controller-manager
(garbage collector, PV binder, service accounts...), kube-scheduler and kwok,
each on a free port, all state in one temporary directory. Fake nodes and their
local PersistentVolumes come from a fixture file (see nodes.py).

    with TestCluster() as cluster:
        cluster.kubectl("get", "nodes")

`stop()` stops every process this object started, by pid, in reverse order; it
runs from the context manager, from atexit and on SIGTERM.

With `real_node=True` one real node joins as well (tests/harness/realnode.py:
containerd, kubelet, kube-proxy), pulling every image from a real registry the
harness starts first (tests/harness/registry.py; the images pushed there by
`hack/build-images.sh --push`), with the local-path provisioner as the default
StorageClass (tests/harness/localpath.py), and the control plane gets what a real node
needs: a CA for x509 client certificates, a serving certificate for the
`kubernetes` Service's IP, `--authorization-mode=Node,RBAC`, NodeRestriction,
a client certificate to reach kubelets, the API server on the node's address
(the Service's endpoint), and controllers with their own service accounts.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import http.client
import json
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import types
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.harness import localpath
from tests.harness.kubeapi import ApiError, KubeApi
from tests.harness.nodes import (
    DEFAULT_FIXTURE,
    NodeFixture,
    load_fixture,
    local_volume_manifests,
    node_manifest,
    storage_class_manifest,
)
from tests.harness.pki import CertificateAuthority, CertPair
from tests.harness.processes import (
    ManagedProcess,
    StartupError,
    free_ports,
    port_is_listening,
    wait_until,
)
from tests.harness.realnode import (
    NODE_DIR,
    NODE_TOOLS,
    NodeImages,
    NodeLock,
    RealNode,
    node_ip,
    preflight,
)
from tests.harness.registry import Registry
from tests.harness.tools import TOOL_NAMES, Tools, locate_tools

ADMIN = "admin"
OPERATOR = "operator"
OPERATOR_NAMESPACE = "localmodel-system"
OPERATOR_SERVICE_ACCOUNT = "localmodel-operator"
# A static token whose user name is a service account's: RBAC bindings whose
# subject is that ServiceAccount (as the chart's ClusterRoleBinding) apply to it.
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR
# The API server's client certificate towards kubelets (logs, exec, port-forward).
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
FIELD_MANAGER = "localmodel-e2e"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Identity:
    name: str
    user: str
    groups: tuple[str, ...]
    token: str


@dataclass(frozen=True)
class ClientRates:
    """API client QPS and burst of the controller manager and the scheduler."""

    controller_manager_qps: int
    controller_manager_burst: int
    scheduler_qps: int
    scheduler_burst: int

    @property
    def controller_manager(self) -> tuple[str, ...]:
        return (f"--kube-api-qps={self.controller_manager_qps}",
                f"--kube-api-burst={self.controller_manager_burst}")

    @property
    def scheduler(self) -> tuple[str, ...]:
        return (f"--kube-api-qps={self.scheduler_qps}",
                f"--kube-api-burst={self.scheduler_burst}")


# What Kubernetes' own 5,000-node scalability runs set (kubernetes/community,
# sig-scalability reports: SCHEDULER_TEST_ARGS=--kube-api-qps=100,
# CONTROLLER_MANAGER_TEST_ARGS=--kube-api-qps=100 --kube-api-burst=100; the
# scheduler's burst stays at its default, 100).
LARGE_CLUSTER_RATES = ClientRates(100, 100, 100, 100)


# kwok's own defaults (sigs.k8s.io/kwok v0.8.0, SetObjectDefaults_KwokConfiguration):
# a KwokConfiguration read from a file gets none of them, so it states them all.
KWOK_DEFAULT_OPTIONS: dict[str, Any] = {
    "enableDebuggingHandlers": True,
    "enableContentionProfiling": False,
    "enableProfilingHandler": True,
    "podPlayStageParallelism": 4,
    "nodePlayStageParallelism": 4,
    "nodeLeaseParallelism": 4,
    "podsOnNodeSyncParallelism": 1,
    "enablePodsOnNodeSyncListPager": True,
    "enablePodsOnNodeSyncStreamWatch": False,
}


def kwok_configuration(nodes: int) -> dict[str, Any]:
    """kwok's KwokConfiguration for a cluster of `nodes` fake nodes: its defaults,
    but one lease renewer per node, as every real kubelet renews its own Lease.

    kwok renews each node's Lease every 10 s (a quarter of
    --node-lease-duration-seconds=40, as the kubelet does) with
    `nodeLeaseParallelism` workers, 4 by default, one PUT at a time each: at
    N nodes it keeps up only while a PUT takes under 4 x 10 s / N (40 ms at
    1 000). A loaded API server answers slower than that, the renewals fall
    behind, and after 50 s without one (kube-controller-manager's
    --node-monitor-grace-period) the node lifecycle controller marks the node
    NotReady and taints it unreachable, though nothing is wrong with it. Real
    kubelets do not wait on each other (docs/benchmarks.md, converge)."""
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": KWOK_DEFAULT_OPTIONS | {
            "nodeLeaseParallelism": max(KWOK_DEFAULT_OPTIONS["nodeLeaseParallelism"], nodes)},
    }


class TestCluster:
    """One control plane; start() brings it up, stop() tears everything down."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        fixture: Path = DEFAULT_FIXTURE,
        workdir: Path | None = None,
        tools: Tools | None = None,
        keep_workdir: bool = False,
        audit: bool = False,
        real_node: bool = False,
        node_images: NodeImages | None = None,
        client_rates: ClientRates | None = None,
        mirror_upstream: bool = True,
    ) -> None:
        self.fixture_path = fixture
        # The controller manager's and scheduler's API client rates; None: their
        # defaults (20/30 and 50/100 QPS/burst), which a large cluster raises.
        self.client_rates = client_rates
        # With `audit`, the API server logs (blocking, JSON lines) every request
        # the operator's identity makes: "which verbs did it use", "how many
        # writes while idle" are then read from `audit_events()`.
        self.audit = audit
        self.tools = tools
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="localmodel-cluster-"))
        self.keep_workdir = keep_workdir
        self.processes: list[ManagedProcess] = []
        self.identities = {
            ADMIN: Identity(ADMIN, "localmodel-admin", ("system:masters",), secrets.token_hex(16)),
            OPERATOR: Identity(
                OPERATOR,
                OPERATOR_USER,
                ("system:serviceaccounts", f"system:serviceaccounts:{OPERATOR_NAMESPACE}"),
                secrets.token_hex(16),
            ),
        }
        self.ports: dict[str, int] = {}
        self.nodes: NodeFixture | None = None
        self.startup_seconds: float | None = None
        self._stopped = False
        self.real_node_wanted = real_node
        # What the real node pulls; default: every image hack/build-images.sh lists,
        # pushed to the test registry. With `mirror_upstream` the node also takes their
        # upstream names (docker.io/..., ghcr.io/...) from the registry, as from a mirror.
        self.node_images = node_images
        self.mirror_upstream = mirror_upstream
        self.registry: Registry | None = None
        self.real_node: RealNode | None = None
        self._node_lock = NodeLock()
        self.node_address = ""
        self.pki: CertificateAuthority | None = None
        self.kubelet_client: CertPair | None = None

    # ---- paths -------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def ca_file(self) -> Path:
        if self.real_node_wanted:
            return self.workdir / "pki" / "ca" / "ca.crt"
        return self.workdir / "pki" / "apiserver.crt"

    def kubeconfig(self, identity: str = ADMIN) -> Path:
        return self.workdir / f"kubeconfig-{identity}.yaml"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig(ADMIN)

    @property
    def operator_kubeconfig(self) -> Path:
        return self.kubeconfig(OPERATOR)

    def api(self, identity: str = ADMIN) -> KubeApi:
        return KubeApi(self.server, self.identities[identity].token, self.ca_file)

    @contextlib.contextmanager
    def fresh_namespace(self, prefix: str) -> Iterator[str]:
        """A new namespace, `prefix` and a random suffix, deleted afterwards."""
        name = f"{prefix}-{secrets.token_hex(3)}"
        api = self.api()
        api.create("/api/v1/namespaces", {"metadata": {"name": name}})
        try:
            yield name
        finally:
            api.request("DELETE", f"/api/v1/namespaces/{name}")

    # ---- lifecycle ---------------------------------------------------------

    def __enter__(self) -> TestCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> None:
        """Bring the control plane up; on any failure stop what started, then raise."""
        began = time.monotonic()
        atexit.register(self.stop)
        _stop_on_sigterm()
        try:
            if self.real_node_wanted:
                self._node_lock.acquire()  # queues behind another harness's node, if told to
                preflight()  # before anything starts: say all that is missing at once
                self.node_address = node_ip()
                node_images = self.node_images or NodeImages.built()
            self.tools = self.tools or locate_tools(
                TOOL_NAMES + NODE_TOOLS if self.real_node_wanted else TOOL_NAMES)
            self.nodes = load_fixture(self.fixture_path)
            for sub in ("etcd", "pki", "logs", "kcm", "scheduler"):
                (self.workdir / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
            names = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok")
            self.ports = dict(zip(names, free_ports(len(names)), strict=True))
            self._write_credentials()
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            self._write_kubeconfigs()
            self._start_controller_manager()
            self._start_scheduler()
            self._start_kwok()
            self._create_nodes_and_storage()
            self._wait_ready(timeout)
            if self.real_node_wanted:
                self._start_real_node(node_images, timeout)
        except Exception as exc:
            logs = self._log_tails()
            self.stop()
            raise StartupError(f"{exc}\n{logs}") from exc
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop every started process by pid (newest first); remove the temp dir."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.real_node is not None:
                # first: its pods must stop while the API server still answers the kubelet
                try:
                    self.real_node.stop()
                finally:
                    self._stop_processes()
            else:
                self._stop_processes()
        finally:
            self._node_lock.release()

    def _stop_processes(self) -> None:
        for proc in reversed(self.processes):
            with contextlib.suppress(Exception):
                proc.stop()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def node_processes(self) -> list[ManagedProcess]:
        """The real node's containerd, kubelet and kube-proxy (empty without one)."""
        return self.real_node.processes if self.real_node else []

    def _log_tails(self, lines: int = 15) -> str:
        return "\n".join(
            f"--- {p.name} (pid {p.pid}, {p.log_path}):\n{p.log_tail(lines)}"
            for p in [*self.processes, *self.node_processes]
        )

    def listening_ports(self) -> list[int]:
        """Ports of this cluster that still accept connections (empty after stop)."""
        return [p for p in self.ports.values() if port_is_listening(p)]

    # ---- helpers for tests -------------------------------------------------

    def kubectl(
        self, *args: str, identity: str = ADMIN, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        assert self.tools is not None
        argv = [str(self.tools["kubectl"]), "--kubeconfig", str(self.kubeconfig(identity)), *args]
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def apply(
        self, manifests: str | Path | Iterable[Manifest], identity: str = ADMIN
    ) -> str:
        """Server-side apply YAML text, a YAML file or manifest dicts; returns kubectl's output."""
        if isinstance(manifests, Path):
            text = manifests.read_text()
        elif isinstance(manifests, str):
            text = manifests
        else:
            text = yaml.safe_dump_all(list(manifests))
        return self.kubectl(
            "apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}",
            "-f", "-", identity=identity, stdin=text,
        ).stdout

    # ---- components --------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name=name, argv=argv, log_path=self.workdir / "logs" / f"{name}.log")
        proc.start()
        self.processes.append(proc)
        return proc

    def _tool(self, name: str) -> str:
        assert self.tools is not None
        return str(self.tools[name])

    def _write_credentials(self) -> None:
        key = self.workdir / "pki" / "service-account.key"
        try:
            subprocess.run(
                ["openssl", "genrsa", "-out", str(key), "2048"],
                check=True, capture_output=True, timeout=60,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            raise StartupError(f"cannot make the service-account key with openssl: {exc}") from exc
        lines = []
        for ident in self.identities.values():
            groups = ",".join(ident.groups)
            lines.append(f'{ident.token},{ident.user},{ident.user},"{groups}"')
        tokens = self.workdir / "pki" / "tokens.csv"
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)
        if self.real_node_wanted:
            self.pki = CertificateAuthority.create(self.workdir / "pki" / "ca")
            self.pki.issue("apiserver", common_name="kube-apiserver", server=True, hosts=(
                "127.0.0.1", "localhost", self.node_address, KUBERNETES_SERVICE_IP,
                "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local"))
            self.kubelet_client = self.pki.issue("apiserver-kubelet-client",
                                                 common_name=KUBELET_CLIENT_USER)

    def _start_etcd(self, timeout: float) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        proc = self._spawn("etcd", [
            self._tool("etcd"),
            "--name=localmodel",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=localmodel={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=1) as resp:
                return bool(json.load(resp).get("health") == "true")

        wait_until("etcd /health", healthy, timeout, proc.check_alive)

    def _start_apiserver(self, timeout: float) -> None:
        pki = self.workdir / "pki"
        key = pki / "service-account.key"
        proc = self._spawn("kube-apiserver", [
            self._tool("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={pki}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--anonymous-auth=false",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            "--allow-privileged=true",
            *self._real_node_flags(),
            "--v=1",
            *self._audit_flags(),
        ])
        admin = KubeApi(
            f"https://127.0.0.1:{self.ports['apiserver']}", self.identities[ADMIN].token, None
        )
        wait_until(
            "kube-apiserver /readyz",
            lambda: admin.request("GET", "/readyz", timeout=2)[0] == 200,
            timeout,
            proc.check_alive,
            interval=0.25,
        )

    def _real_node_flags(self) -> list[str]:
        if not self.real_node_wanted:
            return [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--authorization-mode=RBAC",
                # endpoints may not point at loopback; without a real node the
                # test cluster needs no `kubernetes` Service endpoint.
                "--endpoint-reconciler-type=none",
            ]
        assert self.pki is not None and self.kubelet_client is not None
        serving = self.pki.directory
        return [
            # Pods reach the API server through the `kubernetes` Service, whose
            # endpoint is this address (the node's), so it listens there as well.
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.node_address}",
            f"--tls-cert-file={serving / 'apiserver.crt'}",
            f"--tls-private-key-file={serving / 'apiserver.key'}",
            f"--client-ca-file={self.pki.cert}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            f"--kubelet-certificate-authority={self.pki.cert}",
            # else `logs`/`exec` try to resolve the node's name
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ]

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.jsonl"

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.workdir / "pki" / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "users": [OPERATOR_USER]},
                {"level": "None"},
            ],
        }))
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-mode=blocking",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
        ]

    def audit_events(self, user: str = OPERATOR_USER) -> list[dict[str, Any]]:
        """Completed requests by `user` (ResponseComplete stage), oldest first."""
        if not self.audit:
            raise RuntimeError("this TestCluster was started without audit=True")
        out = []
        try:
            lines = self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if (event.get("user") or {}).get("username") == user and event.get(
                    "stage"
                ) in ("ResponseComplete", "Panic"):
                    out.append(event)
        return out

    def _write_kubeconfigs(self) -> None:
        for ident in self.identities.values():
            self._write_kubeconfig(ident)

    def _write_kubeconfig(self, ident: Identity) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": "localmodel-test",
                "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
            }],
            "users": [{"name": ident.name, "user": {"token": ident.token}}],
            "contexts": [{
                "name": ident.name,
                "context": {"cluster": "localmodel-test", "user": ident.name},
            }],
            "current-context": ident.name,
        }
        path = self.kubeconfig(ident.name)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def bound_token_identity(
        self, name: str, namespace: str, service_account: str, pod: str
    ) -> Identity:
        """A ServiceAccount's own token, bound to one of its pods, as a pod gets it.

        TokenRequest with a Pod boundObjectRef: the API server signs a token whose
        user is ``system:serviceaccount:NS:SA`` and whose extra carries the pod's
        name and its node's (``authentication.kubernetes.io/node-name``), exactly
        what a DaemonSet pod's projected token says. Registers the identity for
        `api(name)` and `kubeconfig(name)`.
        """
        api = self.api(ADMIN)
        uid = api.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["metadata"]["uid"]
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid},
            },
        }
        answer = api.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token", request
        )
        ident = Identity(
            name,
            f"system:serviceaccount:{namespace}:{service_account}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
            answer["status"]["token"],
        )
        self.identities[name] = ident
        self._write_kubeconfig(ident)
        return ident

    def _delegated_serving_flags(self, name: str, port: int) -> list[str]:
        kubeconfig = str(self.admin_kubeconfig)
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            # no front proxy or client certs here: skip looking for their CA configmap
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / name}",
            "--leader-elect=false",
            "--v=1",
        ]

    def _start_controller_manager(self) -> None:
        self._spawn("kube-controller-manager", [
            self._tool("kube-controller-manager"),
            *self._delegated_serving_flags("kcm", self.ports["controller-manager"]),
            # the default set: garbage collector, PV binder, service accounts,
            # namespaces, deployments/replicasets, node lifecycle...
            "--controllers=*",
            # A real node stays tainted not-ready unless the node lifecycle
            # controller runs as its own service account.
            f"--use-service-account-credentials={str(self.real_node_wanted).lower()}",
            f"--service-account-private-key-file={self.workdir / 'pki' / 'service-account.key'}",
            f"--root-ca-file={self.ca_file}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--cluster-name=localmodel-test",
            *(self.client_rates.controller_manager if self.client_rates else ()),
        ])

    def _start_scheduler(self) -> None:
        self._spawn("kube-scheduler", [
            self._tool("kube-scheduler"),
            *self._delegated_serving_flags("scheduler", self.ports["scheduler"]),
            *(self.client_rates.scheduler if self.client_rates else ()),
        ])

    def _start_kwok(self) -> None:
        assert self.nodes is not None
        config = self.workdir / "kwok.yaml"
        config.write_text(yaml.safe_dump(kwok_configuration(len(self.nodes.nodes))))
        self._spawn("kwok", [
            self._tool("kwok"),
            f"--config={self._tool('kwok-stages')}",
            f"--config={config}",
            f"--kubeconfig={self.admin_kubeconfig}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1",
            "--node-lease-duration-seconds=40",
        ])

    def _create_nodes_and_storage(self) -> None:
        assert self.nodes is not None
        api = self.api(ADMIN)
        api.create(
            "/apis/storage.k8s.io/v1/storageclasses",
            storage_class_manifest(self.nodes.storage_class),
        )
        for shape in self.nodes.nodes:
            _create_patiently(api, "/api/v1/nodes", node_manifest(shape))
            for pv in local_volume_manifests(shape, self.nodes.storage_class):
                _create_patiently(api, "/api/v1/persistentvolumes", pv)

    def _wait_ready(self, timeout: float) -> None:
        assert self.nodes is not None
        api = self.api(ADMIN)
        by_name = {p.name: p for p in self.processes}

        def alive() -> None:
            for proc in self.processes:
                proc.check_alive()

        for name, port in (
            ("kube-controller-manager", self.ports["controller-manager"]),
            ("kube-scheduler", self.ports["scheduler"]),
        ):
            wait_until(
                f"{name} /healthz",
                functools.partial(_healthz_ok, port),
                timeout,
                by_name[name].check_alive,
            )
        # Ready, and still with the fixture's allocatable (not kwok's defaults).
        wanted = {(shape.name, shape.cpu, shape.memory) for shape in self.nodes.nodes}

        def nodes_ready() -> bool:
            ready = set()
            for node in api.get("/api/v1/nodes")["items"]:
                status = node.get("status") or {}
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in status.get("conditions") or []):
                    allocatable = status.get("allocatable") or {}
                    ready.add((node["metadata"]["name"], allocatable.get("cpu"),
                               allocatable.get("memory")))
            return wanted <= ready

        wait_until("kwok to report every fake node Ready", nodes_ready, timeout, alive)

        # Pods need the namespace's default ServiceAccount (made by the controller manager).
        def default_service_account() -> bool:
            try:
                api.get("/api/v1/namespaces/default/serviceaccounts/default")
            except ApiError:
                return False
            return True

        wait_until("the default ServiceAccount", default_service_account, timeout, alive)

    def _start_real_node(self, images: NodeImages, timeout: float) -> None:
        assert self.pki is not None
        # The registry first: the node's containerd starts empty and pulls from it.
        self.registry = Registry(self.workdir / "registry", self.pki)
        self.registry.start(timeout)
        assert self.registry.process is not None
        self.processes.append(self.registry.process)  # stops after the node
        pushed = self.registry.push(images.names)
        # The API server's kubelet client may use the kubelet API (logs, exec...).
        self.apply([{
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "localmodel-test:apiserver-kubelet-client"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": KUBELET_CLIENT_USER}],
        }])
        self.real_node = RealNode(cluster=self, ca=self.pki, address=self.node_address,
                                  images=images.in_registry(pushed), registry=self.registry,
                                  mirror_upstream=self.mirror_upstream)
        self.real_node.start(timeout)
        localpath.start(self, self.real_node.images.helper, NODE_DIR / "local-path")

    def describe(self) -> dict[str, Any]:
        """What a person (or the CLI's state file) needs to use this cluster."""
        assert self.tools is not None
        return {
            "real_node": self.real_node.describe() if self.real_node else None,
            "server": self.server,
            "workdir": str(self.workdir),
            "kubeconfigs": {name: str(self.kubeconfig(name)) for name in self.identities},
            "pids": {p.name: p.pid for p in self.processes},
            "executables": {p.name: p.argv[0] for p in self.processes},
            "ports": self.ports,
            "versions": self.tools.versions,
            "startup_seconds": self.startup_seconds,
        }


def _create_patiently(api: KubeApi, path: str, body: Manifest, tries: int = 5) -> None:
    """POST with a minute's patience, again after a timeout: one of 1 000 nodes'
    creates took over KubeApi's 10 s on a machine at load 25 (converge.py,
    2026-12-04 01:20) and failed the start; 409 after a timed-out try: the
    first one landed."""
    for attempt in range(tries):
        try:
            status, answer = api.request("POST", path, body, timeout=60)
        except (OSError, http.client.HTTPException):
            if attempt == tries - 1:
                raise
            continue
        if status == 409 and attempt > 0:
            return
        if status >= 400:
            raise ApiError("POST", path, status, answer)
        return


def _healthz_ok(port: int) -> bool:
    """The components' /healthz is always allowed, and anonymous requests reach it."""
    return KubeApi(f"https://127.0.0.1:{port}", "", None).status_of("GET", "/healthz") == 200


_sigterm_hooked = False


def _stop_on_sigterm() -> None:
    """Treat SIGTERM like Ctrl-C, so finally blocks, fixture teardown and atexit
    stop the cluster (pytest ends the session on KeyboardInterrupt, but would
    only fail one test on SystemExit). Leaves a handler someone else set alone."""
    global _sigterm_hooked
    if _sigterm_hooked:
        return
    _sigterm_hooked = True
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave signals alone
        pass


def _interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
