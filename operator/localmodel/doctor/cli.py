"""`localmodel doctor [--local]`: arguments, reading, printing, exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from localmodel import engines
from localmodel.doctor.report import Report, exit_status, render_table, to_json

USAGE_EPILOG = """exit status: 0 all ok; 1 warnings (only with --strict); 2 any failure
(bad arguments, or a cluster or machine that cannot be read, also exit 2)."""


def doctor_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="localmodel doctor",
        description="Walk the field's debugging order: models holding weights per node, "
        "callers that can queue, cancellation, and only then speed. Against the cluster of "
        "the kubeconfig, or with --local this machine or container.",
        epilog=USAGE_EPILOG,
    )
    parser.add_argument("--local", action="store_true", help="this machine; no cluster needed")
    parser.add_argument(
        "--engine-url",
        metavar="URL",
        help="with --local: the engine (Ollama or llama-server) or a gateway; "
        f"default {engines.DEFAULT.HOST_ENV or 'none'}, else "
        f"http://127.0.0.1:{engines.DEFAULT.PORT}",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help="default: KUBECONFIG, else in-cluster")
    parser.add_argument("--context", metavar="NAME", help="the kubeconfig context to use")
    parser.add_argument(
        "-n", "--namespace", metavar="NS",
        help="the models of one namespace (and whatever shares their nodes); default: "
        "the whole cluster",
    )
    parser.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        metavar="NAMESPACE/POD=URL",
        help="read that gateway pod's metrics from URL instead of the API server's pod proxy "
        "(repeatable)",
    )
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings")
    args = parser.parse_args(list(argv))

    if args.local:
        report = _local(args.engine_url)
    else:
        metrics_urls = {}
        for item in args.metrics_url:
            key, sep, url = item.partition("=")
            if not sep or key.count("/") != 1 or not url:
                parser.error(f"--metrics-url {item!r}: expected NAMESPACE/POD=URL")
            metrics_urls[key] = url
        try:
            report = _cluster(args.kubeconfig, metrics_urls, args.context, args.namespace)
        except _Unavailable as e:
            print(f"localmodel doctor: {e}", file=sys.stderr)
            return 2
    sys.stdout.write(to_json(report) + "\n" if args.output == "json" else render_table(report))
    return exit_status(report.findings, strict=args.strict)


class _Unavailable(Exception):
    """The cluster cannot be read: the doctor says why and exits 2."""


def _local(engine_url: str | None) -> Report:
    from localmodel.doctor.checks import default_engine_url, local_findings
    from localmodel.doctor.read import gather_engine
    from localmodel.facts.machine import read_machine

    machine = read_machine()
    engine = gather_engine(engine_url or default_engine_url(), machine)
    facts = machine.as_json()
    if engine.kind is not None:
        facts["engine"] = {
            "url": engine.url,
            "kind": engine.kind,
            "version": engine.version,
            "models": [m.name for m in engine.models],
            "slots": engine.slots,
            "context_per_slot": engine.context_per_slot,
            "threads": engine.threads,
            "pid": engine.pid,
            "cpu_budget": engine.process_budget,
            "loading": engine.loading,
        }
    return Report(facts=facts, findings=local_findings(machine, engine))


def _cluster(kubeconfig: str | None, metrics_urls: dict[str, str],
             context: str | None = None, namespace: str | None = None) -> Report:
    from localmodel.doctor.cluster import cluster_findings
    from localmodel.doctor.read import gather_cluster
    from localmodel.kube import KubeconfigError, api_client

    try:
        client = api_client(kubeconfig, context)
    except KubeconfigError as e:
        raise _Unavailable(str(e)) from e
    from kubernetes.client.exceptions import ApiException

    try:
        view = gather_cluster(client, metrics_urls, namespace=namespace)
    except ApiException as e:
        raise _Unavailable(f"reading the cluster: {e.status} {e.reason}") from e
    except OSError as e:
        raise _Unavailable(f"reading the cluster: {e}") from e
    facts, findings = cluster_findings(view)
    return Report(facts=facts, findings=findings)
