"""One real node in the test cluster: containerd, a real kubelet and kube-proxy.

kwok's fake nodes run no containers; this node does. It joins the same control
plane (TestCluster(real_node=True) gives the API server what a real node needs:
a client CA, the Node authorizer, NodeRestriction, a kubelet client
certificate...). What it took on this machine kind is in docs/test-cluster.md:

- containerd (Debian) with its own config: CRI `restrict_oom_score_adj` (the VM
  withholds CAP_SYS_RESOURCE, so a negative oom_score_adj fails every sandbox),
  overlayfs, cgroupfs, CNI plugins from /usr/lib/cni; it starts with NO image
  and pulls every one from the test registry (tests/harness/registry.py, where
  `hack/build-images.sh --push` put them), the pause image too (the
  `sandbox_image` names it there), trusting the registry's CA through
  containerd's registry `config_path` (a hosts.toml per registry host; with
  `mirror_upstream`, also for docker.io, ghcr.io and registry.k8s.io, so
  references under the upstream names are pulled from the registry as from a
  mirror);
- the kubelet (built by hack/build-tools.sh) with a client certificate for
  `system:node:<name>`, x509 + webhook authentication/authorization, random
  ports, cgroup v1 allowed (`failCgroupV1: false`), image GC out of the way;
- kube-proxy in iptables mode, so pods reach Services (the API server's
  10.96.0.1 included);
- a bridge + host-local network (one /24) for pod IPs reachable from the host.

The node leaves state outside its own directory (the kubelet's root and its bind
mount, pod logs, CNI state, containerd's /run/containerd, iptables chains,
network interfaces, sysctls the kubelet and the bridge plugin set, cgroups).
`cleanup(record)` removes all of it; it needs only the record `describe()`
returns, so `python -m tests.harness down` can run it after a hard kill too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tests.harness.images import Image, list_images
from tests.harness.pki import CertificateAuthority, CertPair
from tests.harness.prereqs import given_images
from tests.harness.processes import (
    ManagedProcess,
    StartupError,
    free_ports,
    pid_runs,
    terminate_pid,
    wait_until,
)
from tests.harness.registry import Registry

if TYPE_CHECKING:
    from tests.harness.cluster import TestCluster

NODE_NAME = "localmodel-real-node"
POD_CIDR = "10.85.0.0/24"
BRIDGE = "cni0"
NETWORK_NAME = "localmodel-test"

# Where the node's parts keep state; `cleanup` removes every one of these.
NODE_DIR = Path("/var/lib/localmodel-test-node")  # containerd's root, the CNI config
# containerd's root is a tmpfs: images unpack faster, and `down` unmounts it
# instead of deleting ~20 000 files (18-35 s on this loaded machine).
CONTAINERD_ROOT = NODE_DIR / "containerd"
CONTAINERD_ROOT_SIZE = "8g"
# containerd's registry config_path: one <host>/hosts.toml per registry it trusts.
CERTS_DIR = NODE_DIR / "certs.d"
# Upstream registries whose references the node pulls from the test registry
# when told to (`mirror_upstream`): the mirror layout drops the host.
UPSTREAM_REGISTRIES = ("docker.io", "ghcr.io", "registry.k8s.io")
# Who runs the node and what `cleanup` needs (pids, sysctls before); survives a hard kill.
RECORD = NODE_DIR / "record.json"
KUBELET_ROOT = Path("/var/lib/kubelet")
CONTAINERD_STATE = Path("/run/containerd")  # the runc shim's paths are fixed under it
CONTAINERD_SOCKET = CONTAINERD_STATE / "containerd.sock"
RUNC_ROOT = CONTAINERD_STATE / "runc" / "k8s.io"
LEFTOVER_DIRS = (
    KUBELET_ROOT,
    Path("/var/log/pods"),
    Path("/var/log/containers"),
    Path("/var/lib/cni"),
    CONTAINERD_STATE,
    NODE_DIR,
)
LEFTOVER_FILES = (Path("/etc/cni/net.d/cni.lock"),)
NETNS_DIR = Path("/run/netns")  # containerd pins pod network namespaces as cni-<uuid>
CHAIN_PREFIXES = ("KUBE-", "CNI-", "NETAVARK_")
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw", "security")
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBELET_CGROUP = "kubepods"

# Host settings the node changes: the bridge plugin turns on forwarding, the
# kubelet sets its "kernel tunables". `cleanup` puts back what `start` saw.
SYSCTLS = (
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/conf/all/route_localnet",
)

NODE_TOOLS = ("kubelet", "kube-proxy", "local-path-provisioner")
# Debian package for each host binary the node runs.
HOST_BINARIES = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "ip6tables": "iptables",
    "iptables-save": "iptables",
    "conntrack": "conntrack",
    "ip": "iproute2",
    "mount": "mount",
    "umount": "mount",
}
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CNI_BIN_DIR = Path("/usr/lib/cni")


class RealNodeError(StartupError):
    """The real node cannot start here; the message says what is missing."""


@dataclass(frozen=True)
class NodeImages:
    """What the node pulls (every image hack/build-images.sh builds, pushed to the
    test registry), and those it needs by role: the pod sandbox's, the operator's
    (the chart's) and the local-path provisioner's helper. Upstream references
    from `built()`; `in_registry` names them where the registry has them.
    `names`: the hack/build-images.sh names to push (empty: every image); a run
    that does not wait for the Ollama build gives the node every image but
    Ollama's (tests/harness/prereqs.py)."""

    all: tuple[Image, ...]
    sandbox: str
    operator: str
    helper: str = ""
    names: tuple[str, ...] = ()

    def in_registry(self, pushed: dict[str, str]) -> NodeImages:
        """The same images by their references in the registry (`pushed`:
        upstream -> pushed, as Registry.push returns it)."""
        missing = [r for r in (self.sandbox, self.operator, self.helper) if r and r not in pushed]
        if missing:
            raise RealNodeError(f"not pushed to the test registry: {', '.join(missing)}")
        return NodeImages(self.all, pushed[self.sandbox], pushed[self.operator],
                          pushed.get(self.helper, ""), self.names)

    @classmethod
    def built(cls) -> NodeImages:
        """The images `hack/build-images.sh --print` lists (those this run may
        use); RealNodeError if one is not built yet."""
        images = tuple(list_images())
        missing = [f"{i.reference} ({i.archive})" for i in images if not i.archive.is_file()]
        if missing:
            raise RealNodeError("the real node's images are not built: " + ", ".join(missing)
                                + "; run `bash hack/build-images.sh`")
        [pause] = list_images("pause")
        [operator] = list_images("operator")
        [helper] = list_images("helper")
        return cls(images, pause.reference, operator.reference, helper.reference,
                   given_images())


def node_ip() -> str:
    """The host's address on its default route: the node's InternalIP (the API
    server reaches the kubelet there, and pods reach the API server there)."""
    override = os.environ.get("LOCALMODEL_NODE_IP")
    if override:
        return override
    out = subprocess.run(["ip", "-o", "-4", "route", "get", "1.0.0.0"], capture_output=True,
                         text=True, check=False).stdout
    match = re.search(r"\bsrc (\d+\.\d+\.\d+\.\d+)", out)
    if not match:
        raise RealNodeError("cannot tell the host's IPv4 address from `ip route get 1.0.0.0` "
                            f"({out.strip() or 'no route'}); set LOCALMODEL_NODE_IP")
    return match.group(1)


def preflight() -> None:
    """Raise RealNodeError naming everything this machine lacks for a real node."""
    problems = []
    if os.geteuid() != 0:
        problems.append("runs as root only (containerd, kubelet, iptables)")
    missing = sorted({pkg for exe, pkg in HOST_BINARIES.items() if shutil.which(exe) is None})
    missing += ["containernetworking-plugins"] * any(
        not (CNI_BIN_DIR / p).is_file() for p in CNI_PLUGINS)
    if missing:
        problems.append("missing Debian packages: " + " ".join(sorted(set(missing)))
                        + " (`.ci/run` installs them)")
    if not (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists() and not (
            CGROUP_ROOT / "cgroup.controllers").exists():
        problems.append(f"no cgroup cpu controller under {CGROUP_ROOT}")
    owner = running_owner()
    if owner:
        problems.append(f"a real node is already up on this machine (harness pid {owner}); "
                        "one at a time (`python -m tests.harness down` stops the CLI's)")
    elif _socket_answers(CONTAINERD_SOCKET):
        problems.append(f"another containerd serves {CONTAINERD_SOCKET}; stop it first "
                        "(or `python -m tests.harness down` if it is a leftover real node)")
    if problems:
        raise RealNodeError("the real node cannot start: " + "; ".join(problems))


NODE_LOCK = Path("/run/localmodel-test-node.lock")  # outside NODE_DIR: cleanup removes that
WAIT_ENV = "LOCALMODEL_REAL_NODE_WAIT"


class NodeLock:
    """The machine's one real node, as an flock: a second harness queues instead of failing.

    Waits up to `$LOCALMODEL_REAL_NODE_WAIT` seconds (default 0: CI is alone on its
    machine, and a second node there is a mistake `preflight` names). The kernel
    drops the lock with the process, so a harness killed hard never blocks the next.
    """

    def __init__(self, path: Path = NODE_LOCK) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, wait: float | None = None) -> bool:
        """True once held; False if another harness still holds it after `wait` seconds."""
        import fcntl

        if wait is None:
            try:
                wait = float(os.environ.get(WAIT_ENV) or 0)
            except ValueError as exc:
                raise RealNodeError(f"{WAIT_ENV}={os.environ[WAIT_ENV]!r}: not a number "
                                    "of seconds") from exc
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                if not said:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    print(f"realnode: waiting up to {wait:.0f} s for this machine's real node "
                          f"(held by pid {holder})", flush=True)
                    said = True
                time.sleep(1.0)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def read_record() -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return None
    return record


def running_owner() -> int | None:
    """The pid of the harness that runs this machine's real node, if it still runs."""
    record = read_record()
    if not record:
        return None
    owner = int(record.get("owner_pid", 0))
    return owner if owner and pid_runs(owner, record.get("owner_executable", "")) else None


def cleanup_abandoned() -> bool:
    """Clean up after a real node whose harness is gone (killed hard); True if there was one."""
    record = read_record()
    if record is None or running_owner():
        return False
    cleanup(record)
    return True


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


@dataclass
class RealNode:
    """containerd + kubelet + kube-proxy for `cluster`, one node named NODE_NAME."""

    cluster: TestCluster
    ca: CertificateAuthority
    address: str
    images: NodeImages  # as the node pulls them: from `registry`
    registry: Registry
    mirror_upstream: bool = True
    name: str = NODE_NAME
    processes: list[ManagedProcess] = field(default_factory=list)
    sysctls_before: dict[str, str] = field(default_factory=dict)
    nft_tables_before: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    ready_seconds: float | None = None  # kubelet start -> node Ready
    images_at_start: list[str] = field(default_factory=list)  # containerd's, once Ready

    @property
    def workdir(self) -> Path:
        return self.cluster.workdir / "node"

    # ---- start -------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        preflight()
        # Left over from an earlier run that was killed hard: clear it first
        # (its record has the sysctls as they were before it).
        if not cleanup_abandoned():
            cleanup({}, quiet=True)
        self.sysctls_before = read_sysctls()
        self.nft_tables_before = nft_tables()
        self.workdir.mkdir(parents=True, exist_ok=True)
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        self._write_record()
        names = ("kubelet", "kubelet-healthz", "proxy-healthz", "proxy-metrics")
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))
        self._write_network()
        self.trust(self.registry, UPSTREAM_REGISTRIES if self.mirror_upstream else ())
        self._start_containerd(timeout)
        self._start_kubelet(timeout)
        self._start_kube_proxy(timeout)
        self.images_at_start = self.image_names()

    def trust(self, registry: Registry, mirror_of: tuple[str, ...] = ()) -> None:
        """containerd pulls from `registry` over TLS its CA verifies, and takes the
        references of the `mirror_of` registries from it (mirror layout). containerd
        reads these files at every pull: a registry started later is trusted at once."""
        ca = f'  ca = "{registry.ca.cert}"\n'
        endpoint = f'[host."https://{registry.host}"]\n  capabilities = ["pull", "resolve"]\n'
        for host, text in ((registry.host, f'server = "https://{registry.host}"\n\n'),
                           *((m, "") for m in mirror_of)):
            directory = CERTS_DIR / host
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts.toml").write_text(text + endpoint + ca)

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name=name, argv=argv,
                              log_path=self.cluster.workdir / "logs" / f"{name}.log")
        proc.start()
        self.processes.append(proc)
        self._write_record()
        return proc

    def _write_record(self) -> None:
        tmp = RECORD.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2))
        tmp.replace(RECORD)

    def _write_network(self) -> None:
        conf_dir = NODE_DIR / "cni"
        conf_dir.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": NETWORK_NAME,
            "plugins": [{
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }],
        }
        (conf_dir / "10-localmodel.conflist").write_text(json.dumps(conflist, indent=2))

    def _start_containerd(self, timeout: float) -> None:
        CONTAINERD_ROOT.mkdir(parents=True, exist_ok=True)
        mount = _run("mount", "-t", "tmpfs", "-o", f"size={CONTAINERD_ROOT_SIZE},mode=0711",
                     "localmodel-containerd", str(CONTAINERD_ROOT))
        if mount.returncode != 0:
            raise RealNodeError(f"cannot mount a tmpfs on {CONTAINERD_ROOT}: "
                                f"{mount.stderr.strip()}")
        config = self.workdir / "containerd.toml"
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config.write_text(f"""version = 2
root = "{CONTAINERD_ROOT}"
state = "{CONTAINERD_STATE}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{NODE_DIR / 'opt'}"

[{cri}]
  sandbox_image = "{self.images.sandbox}"
  # This VM withholds CAP_SYS_RESOURCE: a negative oom_score_adj fails every sandbox
  # ("can't get final child's PID from pipe").
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.registry]
    config_path = "{CERTS_DIR}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{NODE_DIR / 'cni'}"
    max_conf_num = 1
""")
        proc = self._spawn("containerd", [shutil.which("containerd") or "containerd",
                                          "--config", str(config), "--log-level", "warn"])
        wait_until("containerd's socket", lambda: _socket_answers(CONTAINERD_SOCKET),
                   timeout, proc.check_alive)

    def ctr(self, *args: str, check: bool = True, timeout: float = 600
            ) -> subprocess.CompletedProcess[str]:
        argv = ["ctr", "--address", str(CONTAINERD_SOCKET), "--namespace", "k8s.io", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                check=False)
        if check and result.returncode != 0:
            raise RealNodeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
        return result

    def import_image(self, archive: Path) -> None:
        """`ctr images import` an OCI archive into the CRI's namespace (unpacked)."""
        self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))

    def image_names(self) -> list[str]:
        return self.ctr("images", "ls", "-q").stdout.split()

    def _kubeconfig(self, name: str, pair: CertPair) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "localmodel-test", "cluster": {
                "server": self.cluster.server, "certificate-authority": str(self.ca.cert)}}],
            "users": [{"name": name, "user": {
                "client-certificate": str(pair.cert), "client-key": str(pair.key)}}],
            "contexts": [{"name": name, "context": {"cluster": "localmodel-test", "user": name}}],
            "current-context": name,
        }
        path = self.workdir / f"kubeconfig-{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def _start_kubelet(self, timeout: float) -> None:
        client = self.ca.issue("kubelet-client", common_name=f"system:node:{self.name}",
                               organizations=("system:nodes",))
        serving = self.ca.issue("kubelet-serving", common_name=self.name,
                                hosts=(self.address, self.name), server=True)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # Kubernetes 1.35 refuses cgroup v1 unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "address": self.address,
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["kubelet-healthz"],
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
            # Other work fills this machine's disk: no image GC in the middle of a test.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Other work on this machine fills its disk; do not evict test pods for it.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "volumePluginDir": str(NODE_DIR / "volume-plugins"),
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
        }
        path = self.workdir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        assert self.cluster.tools is not None
        began = time.monotonic()
        proc = self._spawn("kubelet", [
            str(self.cluster.tools["kubelet"]),
            f"--config={path}",
            f"--kubeconfig={self._kubeconfig('kubelet', client)}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.address}",
            "--v=1",
        ])
        api = self.cluster.api()

        def ready() -> bool:
            status, node = api.request("GET", f"/api/v1/nodes/{self.name}")
            if status != 200:
                return False
            conditions = (node.get("status") or {}).get("conditions") or []
            taints = (node.get("spec") or {}).get("taints") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and (
                not any(t.get("key", "").startswith("node.kubernetes.io/") for t in taints))

        wait_until(f"node {self.name} Ready (no not-ready taints)", ready, timeout,
                   proc.check_alive, interval=0.2)
        self.ready_seconds = time.monotonic() - began

    def _start_kube_proxy(self, timeout: float) -> None:
        client = self.ca.issue("kube-proxy", common_name="system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self._kubeconfig("kube-proxy", client))},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": f"127.0.0.1:{self.ports['proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{self.ports['proxy-metrics']}",
            # Leave the host's conntrack table size and timeouts alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
            # NodePorts on 127.0.0.1 would need route_localnet on every interface.
            "iptables": {"localhostNodePorts": False, "syncPeriod": "30s",
                         "minSyncPeriod": "0s"},
        }
        path = self.workdir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        assert self.cluster.tools is not None
        proc = self._spawn("kube-proxy", [str(self.cluster.tools["kube-proxy"]),
                                          f"--config={path}", "--v=1"])

        url = f"http://127.0.0.1:{self.ports['proxy-healthz']}/healthz"

        def synced() -> bool:  # 200 once it has programmed the rules
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(json.load(response).get("lastUpdated"))

        wait_until("kube-proxy /healthz", synced, timeout, proc.check_alive, interval=0.2)

    # ---- stop --------------------------------------------------------------

    def stop(self) -> None:
        """Stop kube-proxy and the kubelet, kill every pod, stop containerd, then clean."""
        record = self.describe()
        for proc in reversed(self.processes):
            if proc.name == "containerd":
                _kill_containers(containerd_up=proc.running())
            with contextlib.suppress(Exception):
                proc.stop(timeout=10)
        cleanup(record)

    def describe(self) -> dict[str, Any]:
        """What `cleanup` needs, kept in `python -m tests.harness`'s state file."""
        return {
            "name": self.name,
            "address": self.address,
            "sysctls_before": self.sysctls_before,
            "nft_tables_before": self.nft_tables_before,
            "pids": {p.name: p.pid for p in self.processes},
            "executables": {p.name: p.argv[0] for p in self.processes},
            "ready_seconds": self.ready_seconds,
            "registry": self.registry.describe(),
            "images_at_start": self.images_at_start,
            "sandbox_image": self.images.sandbox,
            "operator_image": self.images.operator,
            "owner_pid": os.getpid(),
            "owner_executable": _executable(os.getpid()),
        }


def _executable(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


# ---- cleanup -----------------------------------------------------------------


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          check=False)


def _kill_containers(containerd_up: bool) -> None:
    """SIGKILL every container of the node (through containerd while it runs, so its
    shims exit; then through runc for whatever is left)."""
    if containerd_up and _socket_answers(CONTAINERD_SOCKET):
        base = ["ctr", "--address", str(CONTAINERD_SOCKET), "--namespace", "k8s.io"]
        tasks = _run(*base, "tasks", "ls", "-q").stdout.split()
        for task in tasks:
            _run(*base, "tasks", "kill", "--all", "--signal", "SIGKILL", task)
        for task in tasks:
            _run(*base, "tasks", "delete", "--force", task)
        for container in _run(*base, "containers", "ls", "-q").stdout.split():
            _run(*base, "containers", "delete", container)
    if RUNC_ROOT.is_dir():
        for cid in _run("runc", "--root", str(RUNC_ROOT), "list", "-q").stdout.split():
            _run("runc", "--root", str(RUNC_ROOT), "kill", cid, "KILL")
            _run("runc", "--root", str(RUNC_ROOT), "delete", "--force", cid)


def shim_pids() -> list[int]:
    """containerd-shim processes serving this node's containerd (they outlive it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace").rsplit("/", 1)[-1].startswith(
                "containerd-shim") and str(CONTAINERD_SOCKET).encode() in argv:
            pids.append(int(entry.name))
    return pids


def node_processes(record: dict[str, Any]) -> list[int]:
    """Pids still running of the node's recorded processes, plus containerd's shims."""
    alive = [int(pid) for name, pid in (record.get("pids") or {}).items()
             if pid and pid_runs(int(pid), (record.get("executables") or {}).get(name, ""))]
    return alive + shim_pids()


def node_mounts() -> list[str]:
    """Mount points the node made (kubelet root, pod volumes, rootfs, netns, shm)."""
    roots = [*LEFTOVER_DIRS, NETNS_DIR]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        path = Path(point)
        if path == NETNS_DIR:
            continue  # the directory itself may be a (shared) mount made by iproute2
        if any(path == root or root in path.parents for root in roots):
            if NETNS_DIR in path.parents and not path.name.startswith("cni-"):
                continue  # someone else's named network namespace
            points.append(point)
    return points


def node_links() -> list[str]:
    """The pod bridge and the veths plugged into it."""
    out = _run("ip", "-o", "link", "show").stdout
    links = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) < 3:
            continue
        name = parts[1].strip().split("@")[0]
        if name == BRIDGE or f" master {BRIDGE} " in line:
            links.append(name)
    return links


def node_chains() -> dict[str, list[str]]:
    """iptables chains of the node (KUBE-*, CNI-*, NETAVARK_*), per `cmd -t table`."""
    found: dict[str, list[str]] = {}
    for save in ("iptables-save", "ip6tables-save"):
        if shutil.which(save) is None:
            continue
        table = ""
        for line in _run(save).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line[1:].startswith(CHAIN_PREFIXES):
                found.setdefault(f"{save.removesuffix('-save')} -t {table}", []).append(
                    line[1:].split()[0])
    return found


def nft_tables() -> list[str]:
    """`family name` of every nftables table (iptables-nft makes ip/ip6 filter, nat...)."""
    if shutil.which("nft") is None:
        return []
    out = _run("nft", "list", "tables").stdout
    return sorted(line.removeprefix("table ").strip() for line in out.splitlines()
                  if line.startswith("table "))


def new_nft_tables(record: dict[str, Any]) -> list[str]:
    """Tables iptables-nft made for the node's chains (none before it started)."""
    if "nft_tables_before" not in record:
        return []
    before = set(record["nft_tables_before"])
    return [t for t in nft_tables() if t not in before
            and t.split()[0] in ("ip", "ip6") and t.split()[1] in IPTABLES_TABLES]


def node_cgroups() -> list[Path]:
    return [p for p in CGROUP_ROOT.glob(f"*/{KUBELET_CGROUP}") if p.is_dir()]


def leftovers(record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything of a real node still on this machine (empty values: nothing)."""
    return {
        "processes": node_processes(record or {}),
        "mounts": node_mounts(),
        "links": node_links(),
        "chains": node_chains(),
        "paths": [str(p) for p in (*LEFTOVER_DIRS, *LEFTOVER_FILES) if p.exists()]
        + [str(p) for p in NETNS_DIR.glob("cni-*")],
        "cgroups": [str(p) for p in node_cgroups()],
        "nft_tables": new_nft_tables(record or {}),
    }


def cleanup(record: dict[str, Any], quiet: bool = False) -> None:
    """Remove everything a real node left on this machine; idempotent.

    Raises RealNodeError listing what could not be removed (unless `quiet`).
    """
    _kill_containers(containerd_up=_socket_answers(CONTAINERD_SOCKET))
    for pid in node_processes(record):
        terminate_pid(pid, timeout=10)
    _unmount_all()
    for link in sorted(node_links(), key=lambda n: n == BRIDGE):  # veths, then the bridge
        _run("ip", "link", "delete", link)
    _remove_chains()
    _remove_empty_tables(record)
    _remove_cgroups()
    for path in (*LEFTOVER_DIRS, *NETNS_DIR.glob("cni-*")):
        _remove_tree(path)
    for path in LEFTOVER_FILES:
        path.unlink(missing_ok=True)
    _restore_sysctls(record.get("sysctls_before") or {})
    left = {k: v for k, v in leftovers(record).items() if v}
    if left and not quiet:
        raise RealNodeError(f"the real node left this behind after cleanup: {left}")


def _unmount_all() -> None:
    for _ in range(5):
        points = node_mounts()
        if not points:
            return
        # deepest first; a lazy unmount as the last resort (a busy mount)
        for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
            if _run("umount", point).returncode != 0:
                _run("umount", "--lazy", point)


def _remove_tree(path: Path) -> None:
    """rm -rf that never crosses into a mount (a hostPath inside a pod's volume)."""
    if not path.exists() and not path.is_symlink():
        return
    if node_mounts() and any(Path(p) == path or path in Path(p).parents
                             for p in node_mounts()):
        raise RealNodeError(f"refusing to delete {path}: something is still mounted under it")
    if path.is_dir() and not path.is_symlink():
        # GNU rm: several times faster than shutil.rmtree on containerd's snapshots,
        # and --one-file-system never descends into a mount that appeared meanwhile.
        result = _run("rm", "-rf", "--one-file-system", str(path), timeout=300)
        if result.returncode != 0:
            raise RealNodeError(f"rm -rf {path} failed: {result.stderr.strip()}")
    else:
        path.unlink(missing_ok=True)


def _remove_chains() -> None:
    """Delete the node's chains and every rule that jumps to them, table by table,
    with one iptables-restore per table (the others' rules stay as they are)."""
    for save, restore in (("iptables-save", "iptables-restore"),
                          ("ip6tables-save", "ip6tables-restore")):
        if shutil.which(save) is None:
            continue
        for table, lines in _tables(_run(save).stdout).items():
            ours = {ln[1:].split()[0] for ln in lines
                    if ln.startswith(":") and ln[1:].startswith(CHAIN_PREFIXES)}
            if not ours:
                continue
            kept = [ln for ln in lines if not _touches(ln, ours)]
            text = "\n".join([f"*{table}", *kept, "COMMIT", ""])
            result = subprocess.run([restore, "--table", table], input=text,
                                    capture_output=True, text=True, check=False, timeout=60)
            if result.returncode != 0:
                raise RealNodeError(f"{restore} --table {table} failed: "
                                    f"{result.stderr.strip()}")


def _remove_empty_tables(record: dict[str, Any]) -> None:
    """Delete the ip/ip6 tables iptables-nft created for the node, once they hold no rule
    (a table someone else's rules are in stays)."""
    for table in new_nft_tables(record):
        family, name = table.split()
        save = "iptables-save" if family == "ip" else "ip6tables-save"
        rules = _tables(_run(save, "-t", name).stdout).get(name, [])
        if not any(line.startswith("-A ") for line in rules):
            _run("nft", "delete", "table", family, name)


def _tables(saved: str) -> dict[str, list[str]]:
    tables: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in saved.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:], [])
        elif line == "COMMIT" or line.startswith("#"):
            current = None if line == "COMMIT" else current
        elif current is not None:
            current.append(line)
    return tables


def _touches(line: str, chains: Iterable[str]) -> bool:
    """A chain declaration or a rule of one of `chains`, or a rule jumping to one."""
    words = line.split()
    if not words:
        return False
    if line.startswith(":"):
        return words[0][1:] in chains
    if words[0] == "-A" and len(words) > 1 and words[1] in chains:
        return True
    return any(w in ("-j", "-g", "--jump", "--goto") and i + 1 < len(words)
               and words[i + 1] in chains for i, w in enumerate(words))


def _remove_cgroups() -> None:
    for top in node_cgroups():
        for _ in range(50):  # a killed container's cgroup empties asynchronously
            dirs = sorted((p for p in top.rglob("*") if p.is_dir()),
                          key=lambda p: len(p.parts), reverse=True)
            for d in [*dirs, top]:
                with contextlib.suppress(OSError):
                    d.rmdir()
            if not top.exists():
                break
            time.sleep(0.1)


def _restore_sysctls(before: dict[str, str]) -> None:
    for name, value in before.items():
        path = Path("/proc/sys") / name
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")


