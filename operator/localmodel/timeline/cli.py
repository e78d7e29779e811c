"""`localmodel timeline NAME`: read the ledgers of a model's gateways and print
where the time went (`localmodel.timeline.report`).

The ledgers come through the API server's pod proxy
(``pods/<pod>:8090/proxy/ledger``, the gateway's admin port) from every pod
of the LocalModel, or from one gateway anywhere with ``--gateway-url`` (a
port-forward, a test). The
models sharing the node are read from the cluster as `doctor` reads them.

What cannot be read is said, naming what and why, with exit status 2: a
LocalModel that does not exist, one without scheduled pods, pods without the
gateway (no ledger), a gateway the pod proxy cannot reach.
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

import urllib3
import yaml

from localmodel.gateway_contract import (
    ADMIN_PORT,
    LEDGER_PATH,
    MAX_LEDGER_BYTES,
    merge,
    parse_entries,
)
from localmodel.printable import printable
from localmodel.timeline.report import (
    Sharing,
    gatewayless,
    model_pods,
    render_table,
    timeline,
    to_json,
)

TIMEOUT = 10.0
OUTPUTS = ("table", "json", "yaml")


class _Unavailable(Exception):
    """A ledger that cannot be read (from a gateway or the API server): the timeline says why
    and exits 2."""


def timeline_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="localmodel timeline",
        description="Where a model's time went, from its gateways' ledgers, in the field's "
        "debugging order: models sharing the node, waking (held at the router while an idle "
        "model woke), queueing (by the callers waited behind), "
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
        help=f"read one gateway's ledger at URL (e.g. http://127.0.0.1:{ADMIN_PORT}) instead "
        "of the cluster's pods",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help="default: KUBECONFIG, else in-cluster")
    parser.add_argument("--context", metavar="NAME", help="the kubeconfig context to use")
    parser.add_argument("-o", "--output", choices=OUTPUTS, default="table")
    args = parser.parse_args(list(argv))
    # Only unreserved characters and %XX escapes besides "=": see _ledger.
    query = urllib.parse.urlencode({"since": args.since}, quote_via=urllib.parse.quote)
    try:
        if args.gateway_url:
            entries = parse_entries(_get(f"{args.gateway_url.rstrip('/')}{LEDGER_PATH}?{query}"))
            sharing, expired = Sharing(None), None
            title = f"{args.name} at {args.gateway_url}"
        else:
            entries, sharing, expired = _from_cluster(
                args.kubeconfig, args.namespace, args.name, query, args.context)
            title = f"{args.namespace}/{args.name}"
    except (_Unavailable, ValueError) as exc:
        # What a gateway or the API server said is in it: bounded and cleaned.
        print(f"localmodel timeline: {printable(str(exc), 2000)}", file=sys.stderr)
        return 2
    doc = timeline(entries, sharing, expired=expired)
    model = f"{args.namespace}/{args.name}" if not args.gateway_url else args.name
    title += f", since {args.since}"
    if args.output == "json":
        sys.stdout.write(to_json(doc) + "\n")
    elif args.output == "yaml":
        yaml.safe_dump(doc, sys.stdout, sort_keys=False, width=100)
    else:
        sys.stdout.write(render_table(doc, title, printable(model, 300)))
    return 0


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return ledger_json(response.read(MAX_LEDGER_BYTES + 1))
    except urllib.error.HTTPError as exc:
        detail = exc.read(200).decode("utf-8", "replace")
        raise _Unavailable(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise _Unavailable(f"{url}: {exc}") from None
    except ValueError as exc:
        raise _Unavailable(f"{url}: not a ledger: {exc}") from None


def ledger_json(raw: bytes) -> Any:
    """A gateway's /ledger answer, bounded (the gateway's image may be the
    tenant's); ValueError naming what is wrong."""
    if len(raw) > MAX_LEDGER_BYTES:
        raise ValueError(f"larger than {MAX_LEDGER_BYTES} bytes")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("nested deeper than the reader parses") from None


def _from_cluster(
    kubeconfig: str | None, namespace: str, name: str, query: str, context: str | None = None
) -> tuple[list[dict[str, Any]], Sharing, int | None]:
    from kubernetes.client import CoreV1Api, CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    from localmodel import GROUP, PLURAL, VERSION
    from localmodel.contract import LABEL_NAME
    from localmodel.kube import KubeconfigError, api_client

    try:
        client = api_client(kubeconfig, context)
    except KubeconfigError as exc:
        raise _Unavailable(str(exc)) from exc
    core = CoreV1Api(client)
    try:
        lm = CustomObjectsApi(client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name)
        every = client.sanitize_for_serialization(core.list_pod_for_all_namespaces())
    except ApiException as exc:
        if exc.status == 404:
            raise _Unavailable(f"LocalModel {namespace}/{name} not found") from None
        raise _Unavailable(f"reading the cluster: {exc.status} {exc.reason}") from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        raise _Unavailable(f"reading the cluster at {client.configuration.host}: "
                           f"{getattr(exc, 'reason', None) or exc}") from None
    pods = every.get("items") or []
    ours, sharing = model_pods(pods, namespace, name)
    if not ours:
        raise _Unavailable(
            f"LocalModel {namespace}/{name} has no scheduled pods (label {LABEL_NAME}={name}): "
            f"no gateway to read a ledger from (kubectl localmodel why {name} -n {namespace} "
            "says why)"
        )
    without = gatewayless(pods, namespace, name)
    if without:
        raise _Unavailable(
            f"pod {namespace}/{without[0]} of LocalModel {namespace}/{name} runs without the "
            "gateway, which keeps the ledger: set spec.gateway.enabled: true"
        )
    entries = merge([_ledger(core, namespace, pod, query) for pod in ours])
    return entries, sharing, expired_at_router(lm)


def expired_at_router(lm: Any) -> int | None:
    """status.idle.lastWake.expired of a LocalModel as read (any shape: the
    status may be old, hand-edited or absent): a count, else None."""
    value: Any = lm
    for key in ("status", "idle", "lastWake", "expired"):
        value = value.get(key) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        return None
    return value


def _ledger(core: Any, namespace: str, pod: str, query: str) -> list[dict[str, Any]]:
    """One pod's ledger through the API server's pod proxy, which hands the
    request's query string to the pod. The client has no query parameters for
    a proxied path and escapes a "?" in it (the gateway would be asked for
    "/ledger%3Fsince=2h", a 404), so "?", "=" and "%" (the query's own escapes)
    are left as they are in the path; pod and namespace names never hold them."""
    from kubernetes.client.exceptions import ApiException

    where = (f"reading pod {namespace}/{pod}'s ledger through the API server's pod proxy "
             f"(port {ADMIN_PORT})")
    hint = (f"is the pod Ready? Or read its gateway with --gateway-url after "
            f"`kubectl port-forward -n {namespace} pod/{pod} {ADMIN_PORT}`")
    core.api_client.configuration.safe_chars_for_path_param = "?=%"
    try:
        # Unparsed: the client would turn a JSON body into a Python repr.
        raw: Any = core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod}:{ADMIN_PORT}", namespace, f"{LEDGER_PATH.lstrip('/')}?{query}",
            _preload_content=False, _request_timeout=TIMEOUT,
        )
        return parse_entries(ledger_json(raw.read(MAX_LEDGER_BYTES + 1)))
    except ApiException as exc:
        body = (exc.body or b"") if isinstance(exc.body, bytes) else str(exc.body or "").encode()
        detail = _detail(body)
        raise _Unavailable(f"{where}: {exc.status} {exc.reason}{detail}; {hint}") from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        raise _Unavailable(f"{where}: {getattr(exc, 'reason', None) or exc}; {hint}") from None
    except ValueError as exc:
        raise _Unavailable(f"{where}: not a ledger: {exc}") from None


def _detail(body: bytes) -> str:
    """The message of an API server's Status body (e.g. the proxy's dial error)."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = body[:200].decode("utf-8", "replace").strip()
    return f" ({message})" if message else ""
