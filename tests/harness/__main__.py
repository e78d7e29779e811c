"""Bring the test cluster up and down by hand (the demo, debugging an e2e test).

    python -m tests.harness up            # foreground; Ctrl-C stops it
    python -m tests.harness up --detach   # returns once ready; `down` stops it
    python -m tests.harness up --detach --operator
                                          # plus the CRD, the chart's RBAC and
                                          # `localmodel run` as the operator identity
    python -m tests.harness up --detach --real-node
                                          # plus one real node (containerd, kubelet,
                                          # kube-proxy; root only, see docs/test-cluster.md)
                                          # pulling every image from a TLS registry started
                                          # here, the chart installed from it, and the
                                          # local-path provisioner as the default class
    python -m tests.harness status
    python -m tests.harness models-url    # base URL of the cached GGUF files
    python -m tests.harness node avx2 avx2-new | kubectl apply -f -
                                          # a new fake node of a pool joins
    python -m tests.harness down

`up` writes a state file (kubeconfig paths, server, pids) that `down` and
`status` read; `export KUBECONFIG=$(python -m tests.harness kubeconfig)` points
kubectl at the admin identity. `up` also serves the cached GGUF files over HTTP
(tests/harness/models.py; `--models-bind`/`--models-host` choose the address
pods use), so a LocalModel's `gguf.url` can be `$(... models-url)/<file>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.harness.chart import NAMESPACE, RELEASE, install_chart
from tests.harness.cluster import TestCluster
from tests.harness.models import ModelFileServer
from tests.harness.nodes import (
    DEFAULT_FIXTURE,
    load_fixture,
    local_volume_manifests,
    node_manifest,
)
from tests.harness.operator import OperatorProcess, install_operator
from tests.harness.processes import ManagedProcess, StartupError, pid_runs, terminate_pid
from tests.harness.realnode import cleanup_abandoned, node_ip
from tests.harness.tools import REPO_ROOT, cache_dir

DEFAULT_STATE = cache_dir() / "cluster" / "state.json"
MODELS_DIR = cache_dir() / "models"


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state


def _supervisor_alive(state: dict[str, Any]) -> bool:
    pid = int(state.get("supervisor_pid", 0))
    return pid > 0 and pid_runs(pid, state.get("supervisor_executable", sys.executable))


def _print_summary(state: dict[str, Any]) -> None:
    print(f"server:      {state['server']}")
    for name, path in state["kubeconfigs"].items():
        print(f"kubeconfig:  {name:9} {path}")
    versions = " ".join(f"{k}={v}" for k, v in state["versions"].items())
    print(f"versions:    {versions}")
    print(f"ready in:    {state['startup_seconds']:.1f} s")
    if state.get("models"):
        print(f"models:      {state['models']['url']} ({state['models']['directory']})")
    if state.get("operator"):
        op = state["operator"]
        print(f"operator:    localmodel run, log {op['log']}")
        print(f"             metrics {op['metrics']}")
    if state.get("real_node"):
        node = state["real_node"]
        print(f"real node:   {node['name']} at {node['address']} "
              f"(Ready {node['ready_seconds']:.1f} s after the kubelet started)")
        registry = node.get("registry") or {}
        if registry:
            print(f"registry:    https://{registry['host']} (CA {state['ca_file']}; "
                  f"started in {registry['start_seconds']:.1f} s, images pushed in "
                  f"{registry['push_seconds']:.1f} s); the node pulls every image from it")
            print("storage:     default StorageClass local-path (the local-path provisioner)")
    if state.get("chart"):
        chart = state["chart"]
        print(f"chart:       helm release {chart['release']} in {chart['namespace']}, "
              f"{chart['image']}, ready in {chart['seconds']:.1f} s")
    print(f"export KUBECONFIG={state['kubeconfigs']['admin']}")


def cmd_up(args: argparse.Namespace) -> int:
    state_path: Path = args.state
    existing = _read_state(state_path)
    if existing and _supervisor_alive(existing):
        print(f"a test cluster is already up (pid {existing['supervisor_pid']}); "
              "`python -m tests.harness down` first", file=sys.stderr)
        return 1
    if args.real_node and args.operator:
        print("--real-node installs the operator with its chart; --operator runs it "
              "outside the cluster: choose one", file=sys.stderr)
        return 2
    if args.detach:
        return _up_detached(args)
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.unlink(missing_ok=True)
    cluster = TestCluster(fixture=args.fixture, audit=args.operator, real_node=args.real_node)
    stop_requested = False
    operator: OperatorProcess | None = None
    models = ModelFileServer(
        MODELS_DIR, bind=args.models_bind or (node_ip() if args.real_node else "127.0.0.1"),
        port=args.models_port, advertise=args.models_host
    )

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    try:
        models.start()
        cluster.start()
        if args.operator:
            install_operator(cluster)
            operator = OperatorProcess(cluster, identity="operator")
            operator.start()
            cluster.processes.append(operator.proc)  # type: ignore[arg-type]
        chart = None
        if args.real_node:  # the operator as a user installs it, on the real node
            assert cluster.real_node is not None and cluster.tools is not None
            began = time.monotonic()
            install_chart(cluster.tools, cluster.admin_kubeconfig,
                          cluster.real_node.images.operator, cluster.real_node.name)
            chart = {"release": RELEASE, "namespace": NAMESPACE,
                     "image": cluster.real_node.images.operator,
                     "seconds": time.monotonic() - began}
        state = {
            **cluster.describe(),
            "ca_file": str(cluster.ca_file),
            "operator": None if operator is None else {
                "log": str(operator.log_path),
                "metrics": f"http://127.0.0.1:{operator.metrics_port}/metrics",
                "health": f"http://127.0.0.1:{operator.health_port}/readyz",
            },
            "supervisor_pid": os.getpid(),
            "supervisor_executable": sys.executable,
            "models": models.describe(),
            "chart": chart,
        }
        tmp = state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_path)
        _print_summary(state)
        print("up; Ctrl-C (or `python -m tests.harness down`) stops it", flush=True)
        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        while not stop_requested:
            for proc in [*cluster.processes, *cluster.node_processes]:
                proc.check_alive()
            time.sleep(0.5)
    finally:
        cluster.stop()
        models.stop()
        state_path.unlink(missing_ok=True)
        print("test cluster stopped", flush=True)
    return 0


def _up_detached(args: argparse.Namespace) -> int:
    state_path: Path = args.state
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.unlink(missing_ok=True)
    log = state_path.with_name("up.log")
    log.unlink(missing_ok=True)
    child = ManagedProcess(
        "python -m tests.harness up",
        [sys.executable, "-m", "tests.harness", "up",
         "--state", str(state_path), "--fixture", str(args.fixture),
         *(["--operator"] if args.operator else []),
         *(["--models-bind", args.models_bind] if args.models_bind else []),
         "--models-port", str(args.models_port),
         *(["--models-host", args.models_host] if args.models_host else []),
         *(["--real-node"] if args.real_node else [])],
        log, cwd=REPO_ROOT, detached=True,  # outlives this command; `down` stops it
    )
    child.start()

    def up() -> bool:
        state = _read_state(state_path)
        return bool(state and state.get("supervisor_pid") == child.pid)

    try:
        timeout = args.timeout or (600.0 if args.real_node else 180.0)
        child.wait_ready("the test cluster", up, timeout)
    except StartupError:
        child.stop(timeout=30)
        print(f"the test cluster did not come up; see {log}:\n{log.read_text()[-3000:]}",
              file=sys.stderr)
        return 1
    state = _read_state(state_path)
    assert state is not None
    _print_summary(state)
    print(f"up in the background (pid {child.pid}, log {log}); "
          "`python -m tests.harness down` stops it")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    state = _read_state(args.state)
    if state is None:
        if cleanup_abandoned():
            print("removed what a real node left behind")
        print("no test cluster is up (no state file)")
        return 0
    if _supervisor_alive(state):
        terminate_pid(int(state["supervisor_pid"]), timeout=90 if state.get("real_node") else 30)
    # If the supervisor was killed hard, its children got SIGKILL from the
    # kernel; anything still running under a recorded pid is stopped here.
    for name, pid in state.get("pids", {}).items():
        exe = state.get("executables", {}).get(name, "")
        if pid and pid_runs(int(pid), exe):
            terminate_pid(int(pid))
    # Nor clean up after its real node (containers, mounts, interfaces, chains...).
    if cleanup_abandoned():
        print("removed what the real node left behind")
    # A supervisor killed hard could not remove its temp dir either.
    workdir = Path(state.get("workdir", ""))
    if workdir.name.startswith("localmodel-cluster-"):
        shutil.rmtree(workdir, ignore_errors=True)
    args.state.unlink(missing_ok=True)
    print("test cluster stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = _read_state(args.state)
    if state is None or not _supervisor_alive(state):
        print("no test cluster is up")
        return 1
    _print_summary(state)
    return 0


def cmd_kubeconfig(args: argparse.Namespace) -> int:
    state = _read_state(args.state)
    if state is None or not _supervisor_alive(state):
        print("no test cluster is up", file=sys.stderr)
        return 1
    print(state["kubeconfigs"][args.identity])
    return 0


def cmd_models_url(args: argparse.Namespace) -> int:
    state = _read_state(args.state)
    if state is None or not _supervisor_alive(state) or not state.get("models"):
        print("no test cluster is up (or it serves no models)", file=sys.stderr)
        return 1
    print(state["models"]["url"])
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    """Print a new fake node of one of the fixture's pools, with its local disks
    (`kubectl apply -f -` joins it): the demo's "a node joins"."""
    fixture = load_fixture(args.fixture)
    pools = {shape.name.rsplit("-", 1)[0]: shape for shape in fixture.nodes}
    if args.pool not in pools:
        print(f"{args.fixture}: no pool {args.pool!r} (pools: {', '.join(sorted(pools))})",
              file=sys.stderr)
        return 2
    shape = dataclasses.replace(pools[args.pool], name=args.name)
    objects = [node_manifest(shape), *local_volume_manifests(shape, fixture.storage_class)]
    print(yaml.safe_dump_all(objects, sort_keys=False), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="state file")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a test cluster")
    up.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE, help="node shapes")
    up.add_argument("--detach", action="store_true", help="return once ready")
    up.add_argument("--operator", action="store_true",
                    help="install the CRD and the chart's RBAC and run `localmodel run`")
    up.add_argument("--real-node", action="store_true",
                    help="join one real node: containerd, kubelet, kube-proxy (root only)")
    up.add_argument("--timeout", type=float, default=None,
                    help="seconds to wait (--detach; default 180, 600 with --real-node)")
    up.add_argument("--models-bind", default=None,
                    help="address the GGUF file server listens on (default 127.0.0.1; "
                    "with --real-node the node's address, which its pods reach)")
    up.add_argument("--models-host", default=None,
                    help="address pods reach the GGUF file server by (default: --models-bind)")
    up.add_argument("--models-port", type=int, default=0, help="its port (default: a free one)")
    up.add_argument("--state", type=Path, default=argparse.SUPPRESS, help="state file")
    up.set_defaults(func=cmd_up)
    node = sub.add_parser("node", help="print a new fake node of a pool, with its local disks")
    node.add_argument("pool", help="a pool of the fixture, e.g. avx2")
    node.add_argument("name", help="the new node's name")
    node.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE, help="node shapes")
    node.set_defaults(func=cmd_node)
    sub.add_parser("down", help="stop the test cluster").set_defaults(func=cmd_down)
    sub.add_parser("status", help="show the running test cluster").set_defaults(func=cmd_status)
    kc = sub.add_parser("kubeconfig", help="print a kubeconfig path")
    kc.add_argument("identity", nargs="?", default="admin", choices=["admin", "operator"])
    kc.set_defaults(func=cmd_kubeconfig)
    sub.add_parser("models-url", help="print the base URL of the cached GGUF files").set_defaults(
        func=cmd_models_url
    )
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
