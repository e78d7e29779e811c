"""`kubectl localmodel`: the kubectl plugin for the daily questions.

Installed as the `kubectl-localmodel` console script (pyproject.toml), so
`kubectl plugin list` finds it on PATH and `kubectl localmodel ...` runs it.
kubectl hands a plugin every argument after its name and none of its own
flags, so the plugin reads --kubeconfig, --context, -n, -A and -o itself, with
kubectl's meanings (the namespace defaults to the context's), in one place
(`_parser`'s common options, `_namespace`, `_cluster_flags`) for every command.

  status         every model: its replicas, nodes, threads, speed and queue
  why NAME       why a model runs as it does: conditions, then per replica the
                 placement and every decision (rule, effect, reason, source)
  doctor         `localmodel doctor` against the same cluster (the whole
                 cluster unless -n names a namespace)
  timeline NAME  `localmodel timeline`: where the model's time went, from its
                 gateways' ledgers
  render         `localmodel render` with the cluster's Nodes (not this machine)

`why` and `timeline` read one model by name: like `kubectl get NAME -A`, they
refuse -A.

What is printed from the objects read (`status_rows`, `status_table`,
`why_text`, `why_data`) is decided in kubectl_views.py; here `main` reads and
prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import yaml

from localmodel import GROUP, PLURAL, VERSION
from localmodel.kubectl_views import Obj, status_rows, status_table, why_data, why_text
from localmodel.timeline.cli import OUTPUTS as TIMELINE_OUTPUTS

PROG = "kubectl localmodel"
METRICS_TIMEOUT = 3.0  # seconds per gateway; gateways are read in parallel
# The commands about one LocalModel by name: -A means nothing to them.
NAMED = ("why", "timeline")


# ---- I/O: arguments, reading, printing ---------------------------------------------


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", metavar="PATH", help="default: KUBECONFIG")
    common.add_argument("--context", metavar="NAME", help="the kubeconfig context to use")
    common.add_argument("-n", "--namespace", metavar="NS",
                        help="default: the context's namespace, else default")
    common.add_argument("-A", "--all-namespaces", action="store_true",
                        help="every namespace")
    parser = argparse.ArgumentParser(
        prog=PROG, description="The daily questions about LocalModels, as a kubectl plugin.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = sub.add_parser("status", parents=[common],
                            help="every model: replicas, nodes, threads, speed, queue")
    status.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    why = sub.add_parser("why", parents=[common],
                         help="a model's conditions, placements and decisions")
    why.add_argument("name", metavar="NAME")
    why.add_argument("-o", "--output", choices=["text", "json", "yaml"], default="text")
    doctor = sub.add_parser("doctor", parents=[common], add_help=False,
                            help="localmodel doctor against this cluster (the whole cluster, "
                                 "or the models of -n NS)")
    doctor.add_argument("-h", "--help", action="store_true")
    doctor.add_argument("-o", "--output", choices=["table", "json"], default="table")
    timeline = sub.add_parser("timeline", parents=[common], add_help=False,
                              help="where a model's time went, from its gateways' ledgers "
                                   "(localmodel timeline NAME [--since 2h] [--gateway-url URL])")
    timeline.add_argument("-h", "--help", action="store_true")
    timeline.add_argument("-o", "--output", choices=TIMELINE_OUTPUTS, default="table")
    render = sub.add_parser("render", parents=[common], add_help=False,
                            help="localmodel render with the cluster's Nodes")
    render.add_argument("-h", "--help", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    if rest and args.command in ("status", "why"):
        print(f"{PROG} {args.command}: unknown arguments: {' '.join(rest)}", file=sys.stderr)
        return 2
    if args.all_namespaces and args.command in NAMED:
        print(f"{PROG} {args.command}: -A/--all-namespaces: {args.command} reads one "
              "LocalModel by name, which needs its namespace: give -n NAMESPACE (or none for "
              "the context's)", file=sys.stderr)
        return 2
    from localmodel.kube import KubeconfigError

    try:
        if args.command == "render":
            return _render(args, rest)
        if args.command == "doctor":
            return _doctor(args, rest)
        if args.command == "timeline":
            return _timeline(args, rest)
        client = _client(args)
        namespace = _namespace(args)
        if args.command == "status":
            return _status(client, namespace, args)
        assert namespace is not None  # NAMED commands refused -A above
        return _why(client, namespace, args)
    except KubeconfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except _ApiFailure as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


class _ApiFailure(Exception):
    """The API server refused or could not be reached; the plugin says why and exits 1."""


def _client(args: argparse.Namespace) -> Any:
    from localmodel.kube import api_client

    return api_client(args.kubeconfig, args.context)


def _namespace(args: argparse.Namespace) -> str | None:
    """The namespace a command reads, None for every namespace: -A, else -n,
    else the context's namespace as kubectl picks it; except that doctor reads
    the whole cluster unless -n is given (what it checks, models contending for
    a node, crosses namespaces)."""
    from localmodel.kube import kubeconfig_namespace

    if args.all_namespaces:
        return None
    if args.namespace:
        return str(args.namespace)
    if args.command == "doctor":
        return None
    return kubeconfig_namespace(args.kubeconfig, args.context)


def _cluster_flags(args: argparse.Namespace) -> list[str]:
    """--kubeconfig and --context as given, for the `localmodel` commands the
    plugin runs (doctor, timeline), which read them as the plugin does."""
    flags = []
    if args.kubeconfig:
        flags += ["--kubeconfig", args.kubeconfig]
    if args.context:
        flags += ["--context", args.context]
    return flags


def _call(what: str, fn: Callable[[], Any]) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return fn()
    except ApiException as e:
        raise _ApiFailure(f"{what}: {e.status} {e.reason}") from None
    except OSError as e:
        raise _ApiFailure(f"{what}: {e}") from None


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _models(client: Any, namespace: str | None) -> list[dict[str, Any]]:
    from kubernetes.client import CustomObjectsApi

    api = CustomObjectsApi(client)
    if namespace is None:
        got = _call("listing LocalModels", lambda: api.list_cluster_custom_object(
            GROUP, VERSION, PLURAL))
    else:
        got = _call(f"listing LocalModels in {namespace}",
                    lambda: api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL))
    return list(got.get("items") or [])


def _metrics(client: Any, models: Sequence[Obj]) -> dict[str, str | Exception]:
    """Every placed replica's gateway metrics, read in parallel through the pod proxy."""
    from kubernetes.client import CoreV1Api

    from localmodel.doctor.read import gateway_metrics
    from localmodel.engine_pods import engine_pods

    core = CoreV1Api(client)
    namespaces = sorted({str(m["metadata"]["namespace"]) for m in models
                         if (m.get("status") or {}).get("placements")})
    pods: list[Any] = []
    for ns in namespaces:
        listed = _call(f"listing pods in {ns}", _bind(core.list_namespaced_pod, ns))
        pods += client.sanitize_for_serialization(listed).get("items") or []
    wanted = {f"{m['metadata']['namespace']}/{p.get('pod')}"
              for m in models for p in (m.get("status") or {}).get("placements") or []}
    gateways = [p for p in engine_pods(pods) if p.gateway and p.key in wanted]
    if not gateways:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(gateways))) as pool:
        texts = pool.map(lambda p: gateway_metrics(core, p.namespace, p.name, METRICS_TIMEOUT),
                         gateways)
        return {p.key: text for p, text in zip(gateways, texts, strict=True)}


def _dump(data: Any, output: str) -> None:
    if output == "json":
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump(data, sys.stdout, sort_keys=False, width=100)


def _status(client: Any, namespace: str | None, args: argparse.Namespace) -> int:
    models = _models(client, namespace)
    if not models:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        print(f"No LocalModels in {where}.", file=sys.stderr)
        if args.output != "table":
            _dump([], args.output)
        return 0
    rows = status_rows(models, _metrics(client, models))
    if args.output == "table":
        sys.stdout.write(status_table(rows, all_namespaces=namespace is None))
    else:
        _dump([asdict(r) for r in rows], args.output)
    return 0


def _why(client: Any, namespace: str, args: argparse.Namespace) -> int:
    from kubernetes.client import CoreV1Api, CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    api = CustomObjectsApi(client)
    try:
        got: Any = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                    args.name)
    except ApiException as e:
        if e.status == 404:
            print(f"{PROG} why: LocalModel {namespace}/{args.name} not found", file=sys.stderr)
            return 1
        raise _ApiFailure(f"reading LocalModel {namespace}/{args.name}: "
                          f"{e.status} {e.reason}") from None
    obj: dict[str, Any] = got
    if args.output != "text":
        _dump(why_data(obj), args.output)
        return 0
    core = CoreV1Api(client)
    listed = _call("listing events", lambda: core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={args.name},"
                                  f"involvedObject.kind=LocalModel"))
    events = client.sanitize_for_serialization(listed).get("items") or []
    events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    sys.stdout.write(why_text(obj, events[-8:]))
    return 0


def _doctor(args: argparse.Namespace, rest: Sequence[str]) -> int:
    from localmodel.doctor.cli import doctor_main

    if args.help:
        return doctor_main(["--help"])
    namespace = _namespace(args)
    scope = [] if namespace is None else ["--namespace", namespace]
    return doctor_main([*rest, *scope, "-o", args.output, *_cluster_flags(args)])


def _timeline(args: argparse.Namespace, rest: Sequence[str]) -> int:
    """`localmodel timeline NAME ...` in the namespace -n or the context gives."""
    from localmodel.timeline.cli import timeline_main

    if args.help:
        return timeline_main(["--help"])
    namespace = _namespace(args)
    assert namespace is not None  # NAMED commands refused -A
    return timeline_main([*rest, "--namespace", namespace, "-o", args.output,
                          *_cluster_flags(args)])


def _render(args: argparse.Namespace, rest: Sequence[str]) -> int:
    """`localmodel render` with the cluster's Nodes, unless --nodes is given."""
    from localmodel.commands import render_main

    passed = list(rest)
    if args.help:
        return render_main(["--help"])
    if any(a == "--nodes" or a.startswith("--nodes=") for a in passed):
        return render_main(passed)
    from kubernetes.client import CoreV1Api

    client = _client(args)
    nodes = client.sanitize_for_serialization(
        _call("listing nodes", lambda: CoreV1Api(client).list_node()))
    nodes.setdefault("kind", "NodeList")
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="nodes-") as f:
        json.dump(nodes, f)
        f.flush()
        return render_main([*passed, "--nodes", f.name])


if __name__ == "__main__":
    sys.exit(main())
