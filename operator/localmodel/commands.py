"""Offline commands: render, crd, rules. Input errors exit 2 with the field path."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from localmodel.api import LocalModel, parse_local_model
from localmodel.api.parse import object_name
from localmodel.controller.config import read_policy
from localmodel.crd import crd_yaml
from localmodel.desired import DesiredState, desired_state
from localmodel.errors import FieldError, InvalidObject, format_errors
from localmodel.facts import NodeFacts
from localmodel.facts.machine import from_this_machine
from localmodel.facts.node import NodeFactsError, from_node, from_node_list
from localmodel.facts.quantity import format_bytes
from localmodel.images import pull_secrets_error, registry_error
from localmodel.manifest import ManifestError, documents
from localmodel.render import RenderOptions
from localmodel.rules.docs import rules_markdown
from localmodel.rules.evaluate import problems
from localmodel.tenancy import TenantPolicy, refusals

# Offline renders carry a fixed time so the output is reproducible (diffable in review).
RENDER_TIME = "1970-01-01T00:00:00Z"


class InputError(Exception):
    """Bad input: the message names the file, object and field, and the reason."""


def _documents(path: str) -> Iterator[tuple[str, Any]]:
    try:
        yield from documents(path)
    except ManifestError as e:
        raise InputError(str(e)) from None


def parse_models(paths: Sequence[str], *, semantic: bool = True) -> list[LocalModel]:
    """Every LocalModel in `paths`, or InputError listing every problem found.

    With `semantic`, problems the schema cannot see but the operator would report
    as `Valid=False` (an unknown model with `memory: auto`) are errors too, so a
    pipeline running `render` as a check fails on a model that will never deploy.
    """
    found: dict[str, tuple[str, LocalModel]] = {}  # key -> (where, model)
    errors: list[str] = []
    for path in paths:
        for where, doc in _documents(path):
            try:
                lm = parse_local_model(doc)
            except InvalidObject as e:
                errors.append(format_errors(e.errors, where=where, obj=f"{e.kind} {e.name}"))
                continue
            obj = f"LocalModel {object_name(doc)}"  # as written: no namespace, no default/
            if lm.key in found:
                first = found[lm.key][0]
                again = FieldError("metadata.name", f"given more than once (also in {first})")
                errors.append(format_errors([again], where=where, obj=obj))
                continue
            found[lm.key] = (where, lm)
            if semantic:
                errors.extend(format_errors([p], where=where, obj=obj) for p in problems(lm.spec))
    if errors:
        raise InputError("\n".join(errors))
    if not found:
        raise InputError("no LocalModel objects found in " + ", ".join(paths))
    return [lm for _, lm in found.values()]


def parse_nodes(paths: Sequence[str]) -> list[NodeFacts]:
    nodes: dict[str, tuple[str, NodeFacts]] = {}  # name -> (where, facts)
    for path in paths:
        for where, doc in _documents(path):
            try:
                if isinstance(doc, dict) and doc.get("kind") == "Node":
                    got = [from_node(doc)]
                else:
                    got = from_node_list(doc)
            except NodeFactsError as e:
                raise InputError(f"{where}: {e}") from None
            for facts in got:
                if facts.name in nodes:
                    raise InputError(
                        f"{where}: Node {facts.name}: metadata.name: given more than once "
                        f"(also in {nodes[facts.name][0]})"
                    )
                nodes[facts.name] = (where, facts)
    if not nodes:
        raise InputError("no Node objects found in " + ", ".join(paths))
    return [n for _, n in nodes.values()]


def read_policy_or_input_error(path: str) -> TenantPolicy:
    try:
        return read_policy(path)
    except ValueError as e:
        raise InputError(str(e)) from None


def secret_labels(paths: Sequence[str]) -> dict[tuple[str, str], dict[str, str]]:
    """(namespace, name) -> labels of every Secret in `paths` (nothing else is read)."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for path in paths:
        for where, doc in _documents(path):
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            if not isinstance(doc, dict) or doc.get("kind") != "Secret" or not isinstance(
                    meta, dict) or not isinstance(meta.get("name"), str):
                raise InputError(f"{where}: not a Secret with metadata.name")
            labels = meta.get("labels") or {}
            if not isinstance(labels, dict):
                raise InputError(f"{where}: metadata.labels: must be a mapping")
            key = (str(meta.get("namespace") or "default"), meta["name"])
            out[key] = {str(k): str(v) for k, v in labels.items()}
    return out


def admit(models: Sequence[LocalModel], policy: TenantPolicy,
          secrets: dict[tuple[str, str], dict[str, str]]) -> None:
    """InputError naming every policy rule each model breaks (tenancy.refusals)."""
    errors = [format_errors([r.error() for r in found], obj=f"LocalModel {lm.key}")
              for lm in models if (found := refusals(lm, policy, secrets))]
    if errors:
        raise InputError("\n".join(errors))


def _dump(obj: Any) -> Any:
    if isinstance(obj, LocalModel):
        out = obj.model_dump(by_alias=True, exclude_none=True, mode="json")
        for empty in ("labels", "annotations"):
            if not out["metadata"].get(empty):
                out["metadata"].pop(empty, None)
        return out
    return obj


def explain(state: DesiredState) -> str:
    """A readable table of placements and decisions."""
    lines: list[str] = []
    for r in state.models:
        lm = r.model
        lines.append(
            f"LocalModel {lm.key}  model={lm.spec.model}  cpu={lm.spec.cpu}  "
            f"context={lm.spec.context}  slots={lm.spec.slots}"
        )
        for c in r.status.conditions:
            lines.append(f"  {c.type:<7} {c.status.value:<7} {c.reason}: {c.message}")
        for rep in r.replicas:
            t = rep.tuning
            lines.append(
                f"  replica {rep.replica} -> node {rep.node}: threads={t.threads} "
                f"cpu={t.cpu} memory={format_bytes(t.memory_bytes)} "
                f"flashAttention={t.flash_attention.value} kvCache={t.kv_cache.value}"
            )
            if rep.reason:
                lines.append(f"    placement: {rep.reason}")
            width = max(len(d.rule) for d in t.decisions)
            for d in t.decisions:
                lines.append(f"    {d.rule:<{width}}  {d.effect}")
        lines.append("")
    return "\n".join(lines)


def _render_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localmodel render",
        description="Print every object the operator would create, the LocalModel with its "
        "status included. Offline: no cluster needed.",
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="MODEL.yaml",
        help="LocalModel manifest(s); '-' reads stdin. Repeatable.",
    )
    parser.add_argument(
        "--nodes",
        action="append",
        metavar="NODES.yaml",
        help="Node objects as `kubectl get nodes -o yaml` prints them, or "
        "multi-document YAML. Default: this machine is the only node.",
    )
    parser.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print a table of placements and decisions instead of objects",
    )
    parser.add_argument(
        "--operator-image",
        default=RenderOptions().operator_image,
        help="image for the gateway sidecar",
    )
    _add_registry_flags(parser)
    parser.add_argument(
        "--allow-http-downloads",
        action="store_true",
        help="render GGUF downloads that may use plain http (as the operator's flag)",
    )
    parser.add_argument(
        "--policy",
        metavar="POLICY.yaml",
        help="the admin's policy over tenants (the chart's `policy` values, as the "
        "operator's --policy reads it): a model it refuses is an error, as the operator "
        "marks it RefusedByPolicy. Default: the operator's default policy",
    )
    parser.add_argument(
        "--secrets",
        action="append",
        metavar="SECRETS.yaml",
        help="Secrets (`kubectl get secret -o yaml`; only their labels are read) for "
        "the policy's secretLabel. Repeatable.",
    )
    return parser


def _add_registry_flags(parser: argparse.ArgumentParser) -> None:
    """The one registry setting, as the operator's flags (localmodel/images.py)."""
    parser.add_argument(
        "--image-registry",
        default="",
        metavar="REGISTRY",
        help="take every image the operator chooses from this registry, as the operator's "
        "--image-registry (host[:port][/path]: its host replaces the image's, the path is kept)",
    )
    parser.add_argument(
        "--image-pull-secrets",
        default="",
        metavar="SECRET,...",
        help="Secrets every model pod pulls its images with, as the operator's flag",
    )


def _registry_flags(registry: str, secrets: str) -> tuple[str, tuple[str, ...]]:
    """--image-registry and --image-pull-secrets, checked as the operator checks them."""
    names = tuple(w for w in secrets.replace(",", " ").split() if w)
    if registry and (why := registry_error(registry)):
        raise InputError(f"--image-registry: {why}")
    if why := pull_secrets_error(names):
        raise InputError(f"--image-pull-secrets: {why}")
    return registry, names


def render_main(argv: Sequence[str]) -> int:
    args = _render_parser().parse_args(list(argv))
    try:
        models = parse_models(args.filename)
        policy = read_policy_or_input_error(args.policy) if args.policy else TenantPolicy()
        registry, pull_secrets = _registry_flags(args.image_registry, args.image_pull_secrets)
        policy = dataclasses.replace(policy, image_registry=registry)
        admit(models, policy, secret_labels(args.secrets or []))
        nodes = parse_nodes(args.nodes) if args.nodes else [from_this_machine()]
    except InputError as e:
        print(f"localmodel render: {e}", file=sys.stderr)
        return 2
    options = RenderOptions(args.operator_image, allow_http_downloads=args.allow_http_downloads,
                            image_registry=registry, image_pull_secrets=pull_secrets)
    state = desired_state(models, nodes, now=RENDER_TIME, options=options)
    if args.explain:
        sys.stdout.write(explain(state))
        return 0
    objects: list[Any] = []
    for r in state.models:
        objects.append(_dump(r.with_status))
        objects.extend(r.objects)
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump_all(objects, sys.stdout, sort_keys=False, width=100)
    return 0


def crd_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="localmodel crd", description="Print the LocalModel CRD (generated)."
    )
    parser.add_argument(
        "--write", metavar="PATH", action="append", help="write to PATH (repeatable), not stdout"
    )
    args = parser.parse_args(list(argv))
    text = crd_yaml()
    if args.write:
        for path in args.write:
            Path(path).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def rules_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="localmodel rules", description="Print the tuning rules table (markdown)."
    )
    parser.add_argument("--write", metavar="PATH", help="write to PATH instead of stdout")
    args = parser.parse_args(list(argv))
    text = rules_markdown()
    if args.write:
        Path(args.write).write_text(text)
    else:
        sys.stdout.write(text)
    return 0
