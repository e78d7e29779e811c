"""`localmodel timeline NAME`: read the ledgers of a model's gateways and print
where the time went (`localmodel.timeline.report`).

The ledgers come through the API server's pod proxy
(``pods/<pod>:8080/proxy/ledger``) from every pod of the LocalModel, or from
one gateway anywhere with ``--gateway-url`` (a port-forward, a test). The
models sharing the node are read from the cluster as `doctor` reads them.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from localmodel.gateway.ledger import parse_entries
from localmodel.timeline.report import Sharing, model_pods, render_table, timeline, to_json

TIMEOUT = 10.0


class _Unavailable(Exception):
    pass


def timeline_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="localmodel timeline",
        description="Where a model's time went, from its gateways' ledgers, in the field's "
        "debugging order: models sharing the node, queueing (by the callers waited behind), "
        "abandoned work, re-reads per session, prefill, decode; then the slowest foreground "
        "requests.",
    )
    parser.add_argument("name", metavar="NAME", help="the LocalModel")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument(
        "--since", default="2h", metavar="DURATION",
        help="how far back: 90s, 15m, 2h, 1d, or an ISO 8601 time (default 2h)",
    )
    parser.add_argument(
        "--gateway-url", metavar="URL",
        help="read one gateway's ledger at URL (e.g. http://127.0.0.1:8080) instead of the "
        "cluster's pods",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help="default: KUBECONFIG, else in-cluster")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = parser.parse_args(list(argv))
    query = urllib.parse.urlencode({"since": args.since})
    try:
        if args.gateway_url:
            entries = parse_entries(_get(args.gateway_url.rstrip("/") + "/ledger?" + query))
            sharing = Sharing(None)
            title = f"{args.name} at {args.gateway_url}"
        else:
            entries, sharing = _from_cluster(args.kubeconfig, args.namespace, args.name, query)
            title = f"{args.namespace}/{args.name}"
    except (_Unavailable, ValueError) as exc:
        print(f"localmodel timeline: {exc}", file=sys.stderr)
        return 2
    doc = timeline(entries, sharing)
    title += f", since {args.since}"
    sys.stdout.write(to_json(doc) + "\n" if args.output == "json" else render_table(doc, title))
    return 0


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode("utf-8", "replace")
        raise _Unavailable(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise _Unavailable(f"{url}: {exc}") from None
    except ValueError as exc:
        raise _Unavailable(f"{url}: not JSON: {exc}") from None


def _from_cluster(
    kubeconfig: str | None, namespace: str, name: str, query: str
) -> tuple[list[dict[str, Any]], Sharing]:
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException

    from localmodel.contract import LABEL_NAME
    from localmodel.gateway.ledger import merge
    from localmodel.kube import KubeconfigError, api_client
    from localmodel.render import GATEWAY_PORT

    try:
        client = api_client(kubeconfig)
    except KubeconfigError as exc:
        raise _Unavailable(str(exc)) from exc
    core = CoreV1Api(client)
    try:
        every = client.sanitize_for_serialization(core.list_pod_for_all_namespaces())
    except ApiException as exc:
        raise _Unavailable(f"reading the cluster: {exc.status} {exc.reason}") from exc
    ours, sharing = model_pods(every.get("items") or [], namespace, name)
    if not ours:
        raise _Unavailable(
            f"no scheduled pods of LocalModel {namespace}/{name} (label {LABEL_NAME}={name})"
        )
    ledgers = []
    for pod_name in ours:
        try:
            # Unparsed: the client would turn a JSON body into a Python repr.
            raw: Any = core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod_name}:{GATEWAY_PORT}", namespace, "ledger?" + query,
                _preload_content=False, _request_timeout=TIMEOUT,
            )
            ledgers.append(parse_entries(json.loads(raw.data)))
        except (ApiException, OSError, ValueError) as exc:
            raise _Unavailable(f"reading pod {namespace}/{pod_name}'s ledger: {exc}") from exc
    return merge(ledgers), sharing
