"""`localmodel probe [--node NAME]`: arguments, reading, printing, exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from localmodel.facts.cpu import kernel_amx
from localmodel.facts.files import MachineFactsError
from localmodel.facts.machine import MachineFacts, read_machine
from localmodel.facts.model import MemoryBandwidth
from localmodel.kube import KubeconfigError, api_client
from localmodel.probe.memory import BandwidthProbe
from localmodel.probe.node import desired_metadata, run


def probe_main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    if args.interval <= 0:
        parser.error("--interval must be positive")
    root = Path(args.root)

    def read() -> Any:
        # The kernel is the node's in a container too: ask it about AMX directly.
        return read_machine(root, amx=kernel_amx)

    try:
        facts = read()
    except (MachineFactsError, OSError) as e:
        print(f"localmodel probe: {e}", file=sys.stderr)
        return 2
    # The memory bandwidth: measured by default when labelling a node, on request when printing.
    measure = args.bandwidth if args.bandwidth is not None else args.node is not None
    bandwidth = BandwidthProbe(root) if measure else None
    if args.node is None:
        _print_facts(facts, bandwidth() if bandwidth is not None else None)
        return 0

    try:
        client = api_client(args.kubeconfig)
    except KubeconfigError as e:
        print(f"localmodel probe: {e}", file=sys.stderr)
        return 2
    from kubernetes.client import CoreV1Api

    return run(CoreV1Api(client), args.node, read, interval=args.interval, once=args.once,
               bandwidth=bandwidth)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localmodel probe",
        description="Print this machine's node facts and the labels the node probe would set; "
        "with --node, label and annotate that Node (on change only), then re-check "
        "every --interval seconds.",
    )
    parser.add_argument("--node", metavar="NAME", help="the Node to label (this machine's node)")
    parser.add_argument(
        "--kubeconfig", metavar="PATH", help="default: KUBECONFIG, else in-cluster"
    )
    parser.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="where the node's /proc and /sys files are mounted (the DaemonSet: /host)",
    )
    parser.add_argument(
        "--interval", type=float, default=300.0, metavar="SECONDS", help="re-check period"
    )
    parser.add_argument("--once", action="store_true", help="probe once and exit")
    parser.add_argument(
        "--bandwidth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="measure the memory bandwidth (at start, then daily, when the node is quiet); "
        "default: with --node",
    )
    return parser


def _print_facts(facts: MachineFacts, bandwidth: MemoryBandwidth | None) -> None:
    """This machine's facts and the labels and annotations its Node would get (YAML)."""
    node = facts.node
    labels, annotations = desired_metadata(facts, bandwidth)
    out = {
        "node": node.name,
        "allocatableCPU": f"{node.allocatable_cpu_milli}m",
        "allocatableMemory": node.allocatable_memory_bytes,
        "cpuset": node.cpuset_cpus,
        "cgroupCPUQuota": node.cgroup_cpu_quota,
        "cpuFlags": " ".join(sorted(node.cpu_flags)) if node.cpu_flags is not None else None,
        "labels": labels,
        "annotations": annotations,
    }
    yaml.safe_dump(out, sys.stdout, sort_keys=False, width=100)
