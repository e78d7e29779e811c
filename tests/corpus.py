"""The project's corpus of bad input: each case, the field its error must name, and why.

One table, read by three tests: `tests/api/test_hostile.py` runs every case
through `localmodel render` (exit 2, file + object + field + reason on stderr,
nothing on stdout, no traceback, bounded time); `tests/e2e/test_hostile_api.py`
sends every case the API server can see (`api` is not None) to a real
kube-apiserver and checks that it refuses it naming the same field, or, for the
few it must accept (`api == ACCEPTED`), that the operator's pure path marks the
object `Valid=False`.

Cases are grouped by the classes of issue 9: tracebacks, quantities the schema
accepted, hangs, coercion, accepted-but-broken objects, errors naming no field,
and unknown models.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

ACCEPTED = "accepted"  # the API server stores it: the operator must mark it Valid=False

_HEAD = "apiVersion: localmodel.dev/v1alpha1\nkind: LocalModel\n"
_JSON_HEAD = (
    b'{"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel", "metadata": '
    b'{"name": "m"}, "spec": {"model": "qwen3:1.7b", '
)


@dataclass(frozen=True)
class Bad:
    """One bad input.

    `field` is the field path the offline error must name (for reader errors, where
    no field exists yet, the reason words `words` carry the check and `field` is "").
    `api` is what the API server's refusal must contain (usually the same field
    path), ACCEPTED when it stores the object, or None when the input cannot reach
    it (not a JSON object, or several objects).
    """

    id: str
    text: bytes
    field: str
    words: str = ""
    target: str = "model"  # "model" (-f) or "nodes" (--nodes)
    api: str | None = None
    obj: str = "LocalModel m"  # the object the message must name ("" if none)

    def body(self) -> dict[str, Any]:
        """The JSON object sent to the API server."""
        loaded = yaml.safe_load(self.text)
        assert isinstance(loaded, dict), self.id
        return loaded


def model(spec: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "localmodel.dev/v1alpha1",
        "kind": "LocalModel",
        "metadata": {"name": "m"},
        "spec": {"model": "qwen3:1.7b", "cpu": 1, **(spec or {})},
    }
    for key, value in top.items():
        if value is _DROP:
            obj.pop(key)
        else:
            obj[key] = value
    return obj


_DROP = object()


def _yaml(obj: Any) -> bytes:
    return yaml.safe_dump(obj, sort_keys=False).encode()


def spec_case(
    id: str, spec: dict[str, Any], path: str, words: str = "", api: str | None = "same"
) -> Bad:
    """A spec the schema must refuse at `path`; the API server names the same path."""
    return Bad(id, _yaml(model(spec)), path, words, api=path if api == "same" else api)


def meta_case(id: str, meta: dict[str, Any], path: str, words: str = "", **kw: Any) -> Bad:
    obj = model()
    obj["metadata"] = meta
    name = meta.get("name") if isinstance(meta.get("name"), str) and meta.get("name") else "?"
    ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) else ""
    shown = f"{ns}/{name}" if ns and name != "?" else name
    kw.setdefault("obj", f"LocalModel {shown}")
    return Bad(id, _yaml(obj), path, words, **kw)


def _alias_bomb(levels: int) -> bytes:
    lines = ["  x:", "    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        name, prev = chr(97 + i), chr(96 + i)
        lines.append(f"    {name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return (
        _HEAD + "metadata:\n  name: m\n" + "\n".join(lines) + "\nspec: {model: 'qwen3:1.7b'}\n"
    ).encode()


def _nodes(items: Any) -> bytes:
    return _yaml({"apiVersion": "v1", "kind": "List", "items": items})


_NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "n1"},
    "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}},
}


def _node(**status: Any) -> dict[str, Any]:
    node = copy.deepcopy(_NODE)
    node["status"]["allocatable"].update(status)
    return node


_TOL = "spec.placement.tolerations[0]"

CORPUS: tuple[Bad, ...] = (
    # ---- tracebacks before: now a clear error -------------------------------------------
    Bad(
        "metadata-string",
        _yaml(model(metadata="x")),
        "metadata",
        "valid dictionary",
        obj="LocalModel ?",
        api="ObjectMeta",
    ),
    Bad(
        "metadata-list",
        _yaml(model(metadata=["a"])),
        "metadata",
        "valid dictionary",
        obj="LocalModel ?",
        api="ObjectMeta",
    ),
    Bad(
        "list-items-not-a-list",
        _yaml({"apiVersion": "v1", "kind": "List", "items": 1}),
        "",
        "items: must be a list",
        obj="",
    ),
    Bad("nodes-items-not-a-list", _nodes(1), "", "items: must be a list", target="nodes", obj=""),
    Bad(
        "not-utf8",
        (_HEAD + "metadata: {name: m}\n# caf\xe9\nspec: {model: x}\n").encode("latin-1"),
        "",
        "not UTF-8",
        obj="",
    ),
    Bad(
        "nested-500",
        (
            _HEAD
            + "metadata:\n  name: m\n  x: "
            + "[" * 500
            + "]" * 500
            + "\nspec: {model: 'qwen3:1.7b'}\n"
        ).encode(),
        "",
        "nested deeper",
        obj="",
    ),
    Bad(
        "binary-in-metadata",
        (
            _HEAD + "metadata:\n  name: m\n  x: !!binary aGk=\nspec: {model: 'qwen3:1.7b'}\n"
        ).encode(),
        "",
        "!!binary",
        obj="",
    ),
    Bad(
        "huge-int-in-model-info",
        (
            _HEAD + "metadata: {name: m}\nspec: {model: 'x:1', memory: 8Gi, modelInfo: "
            "{weightsSize: 1Gi, layers: " + "9" * 320 + ", kvHeads: 1}}\n"
        ).encode(),
        "",
        "integer out of range",
        obj="",
    ),
    spec_case(
        "int64-layers",
        {"memory": "8Gi", "modelInfo": {"weightsSize": "1Gi", "layers": 2**62, "kvHeads": 1}},
        "spec.modelInfo.layers",
        "less than or equal",
    ),
    Bad("not-a-mapping", b"- 1\n- 2\n", "", "expected a LocalModel object", obj="LocalModel ?"),
    Bad("scalar-document", b"hello\n", "", "expected a LocalModel object", obj="LocalModel ?"),
    Bad(
        "infinite-float",
        (_HEAD + "metadata: {name: m}\nspec: {model: 'qwen3:1.7b', replicas: .inf}\n").encode(),
        "",
        "not a finite number",
        obj="",
    ),
    Bad(
        "non-string-key",
        (_HEAD + "metadata: {name: m}\nspec: {model: 'qwen3:1.7b', 1: x}\n").encode(),
        "",
        "keys must be strings",
        obj="",
    ),
    Bad(
        "yaml-syntax",
        (_HEAD + "metadata: {name: m}\nspec: [1, 2\n").encode(),
        "",
        "not valid YAML",
        obj="",
    ),
    Bad(
        "spec-null",
        _yaml(model(spec=None) | {"spec": None}),
        "spec",
        "Field required",  # a null is absent, as the API server reads it
        api="spec: Required value",
    ),
    # ---- quantities the schema accepted but the parser refused ---------------------------
    spec_case("memory-8Ei", {"memory": "8Ei"}, "spec.memory", "from 64Mi to 64Ti"),
    spec_case("memory-1e31", {"memory": "1e31"}, "spec.memory", "from 64Mi to 64Ti"),
    spec_case("memory-0E40", {"memory": "0E40"}, "spec.memory", "from 64Mi to 64Ti"),
    spec_case("memory-zero", {"memory": "0"}, "spec.memory", "from 64Mi"),
    spec_case("memory-one-byte", {"memory": "1"}, "spec.memory", "from 64Mi"),
    spec_case("memory-negative", {"memory": "-8Gi"}, "spec.memory", "quantity"),
    spec_case("memory-number", {"memory": 8589934592}, "spec.memory", "valid string"),
    spec_case("prompt-cache-2Ti", {"promptCache": "2Ti"}, "spec.promptCache", "from 0 to 1Ti"),
    spec_case("prompt-cache-negative", {"promptCache": "-1"}, "spec.promptCache", "quantity"),
    spec_case("prompt-cache-words", {"promptCache": "lots"}, "spec.promptCache",
              "`auto` or a quantity"),
    spec_case("storage-1e31", {"storage": {"size": "1e31"}}, "spec.storage.size", "to 1Pi"),
    spec_case("storage-zero", {"storage": {"size": "0"}}, "spec.storage.size", "from 64Mi"),
    spec_case(
        "weights-lowercase-ki",
        {"memory": "8Gi", "modelInfo": {"weightsSize": "1ki", "layers": 1, "kvHeads": 1}},
        "spec.modelInfo.weightsSize",
        "quantity",
    ),
    spec_case(
        "weights-zero",
        {"memory": "8Gi", "modelInfo": {"weightsSize": "0", "layers": 1, "kvHeads": 1}},
        "spec.modelInfo.weightsSize",
        "from 1Mi",
    ),
    spec_case("memory-too-long", {"memory": "1" * 40}, "spec.memory", "quantity"),
    # ---- hangs before: bounded now -------------------------------------------------------
    Bad("alias-bomb-5", _alias_bomb(5), "", "aliases expand to more than", obj=""),
    Bad("alias-bomb-9", _alias_bomb(9), "", "aliases expand to more than", obj=""),
    Bad(
        "alias-recursive",
        (_HEAD + "metadata: &a {name: m, x: *a}\nspec: {model: x}\n").encode(),
        "",
        "an alias refers to the node that contains it",
        obj="",
    ),
    # ---- coerced before: refused, as the API server refuses them -------------------------
    spec_case("replicas-string", {"replicas": "2"}, "spec.replicas", "integer"),
    spec_case("replicas-fraction", {"replicas": 1.5}, "spec.replicas", "integer"),
    spec_case("replicas-bool", {"replicas": True}, "spec.replicas", "integer"),
    spec_case("context-string", {"context": "8192"}, "spec.context", "integer"),
    spec_case("slots-bool", {"slots": True}, "spec.slots", "integer"),
    spec_case("cpu-string", {"cpu": "4"}, "spec.cpu", "positive integer or 'node'", api="spec.cpu"),
    spec_case(
        "cpu-float", {"cpu": 2.0}, "spec.cpu", "positive integer or 'node'", api="XIntOrString"
    ),
    spec_case("cpu-huge", {"cpu": 100000}, "spec.cpu", "at most 1024", api="spec.cpu"),
    spec_case(
        "exclusive-yes", {"placement": {"exclusive": "yes"}}, "spec.placement.exclusive", "boolean"
    ),
    spec_case(
        "exclusive-one", {"placement": {"exclusive": 1}}, "spec.placement.exclusive", "boolean"
    ),
    spec_case(
        "retain-false-string", {"storage": {"retain": "false"}}, "spec.storage.retain", "boolean"
    ),
    spec_case(
        "gateway-enabled-no", {"gateway": {"enabled": "no"}}, "spec.gateway.enabled", "boolean"
    ),
    spec_case(
        "max-queue-string", {"gateway": {"maxQueue": "16"}}, "spec.gateway.maxQueue", "integer"
    ),
    spec_case(
        "toleration-seconds-string",
        {
            "placement": {
                "tolerations": [
                    {
                        "key": "a",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": "30",
                    }
                ]
            }
        },
        f"{_TOL}.tolerationSeconds",
        "integer",
    ),
    spec_case(
        "node-selector-value-int",
        {"placement": {"nodeSelector": {"pool": 1}}},
        "spec.placement.nodeSelector.pool",
        "valid string",
    ),
    # ---- accepted before, although the objects would be refused or break a guarantee -----
    meta_case(
        "name-digit-first",
        {"name": "9lives"},
        "metadata.name",
        "DNS-1035",
        api="metadata.name must be a DNS-1035 label",
    ),
    meta_case(
        "name-53-chars",
        {"name": "a" * 53},
        "metadata.name",
        "at most 52",
        api="metadata.name must be a DNS-1035 label",
    ),
    meta_case("name-uppercase", {"name": "Qwen"}, "metadata.name", "DNS-1035", api="metadata.name"),
    meta_case(
        "name-empty", {"name": ""}, "metadata.name", "DNS-1035", api=None, obj="LocalModel ?"
    ),
    meta_case(
        "name-missing",
        {"namespace": "ai"},
        "metadata.name",
        "required",
        api=None,
        obj="LocalModel ?",
    ),
    meta_case(
        "namespace-empty",
        {"name": "m", "namespace": ""},
        "metadata.namespace",
        "DNS-1123",
        obj="LocalModel m",
    ),
    meta_case(
        "namespace-invalid",
        {"name": "m", "namespace": "AI_ns"},
        "metadata.namespace",
        "DNS-1123",
        obj="LocalModel AI_ns/m",
    ),
    meta_case(
        "label-key-invalid",
        {"name": "m", "labels": {"bad key!": "x"}},
        "metadata.labels",
        "qualified name",
        api="metadata.labels",
    ),
    meta_case(
        "label-value-invalid",
        {"name": "m", "labels": {"a": "b c"}},
        "metadata.labels.a",
        "label value",
        api="metadata.labels",
    ),
    meta_case(
        "annotation-key-invalid",
        {"name": "m", "annotations": {"/x": "1"}},
        "metadata.annotations",
        "qualified name",
        api="metadata.annotations",
    ),
    spec_case(
        "toleration-seconds-no-schedule",
        {
            "placement": {
                "tolerations": [
                    {
                        "key": "a",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                        "tolerationSeconds": 30,
                    }
                ]
            }
        },
        f"{_TOL}.effect",
        "only valid with effect NoExecute",
    ),
    spec_case(
        "toleration-seconds-no-effect",
        {
            "placement": {
                "tolerations": [{"key": "a", "operator": "Exists", "tolerationSeconds": 30}]
            }
        },
        f"{_TOL}.effect",
        "only valid with effect NoExecute",
    ),
    spec_case(
        "toleration-key-invalid",
        {"placement": {"tolerations": [{"key": "bad key", "operator": "Exists"}]}},
        f"{_TOL}.key",
        "qualified name",
    ),
    spec_case(
        "toleration-value-invalid",
        {"placement": {"tolerations": [{"key": "a", "value": "b c"}]}},
        f"{_TOL}.value",
        "label value",
    ),
    spec_case(
        "toleration-keyless-equal",
        {"placement": {"tolerations": [{"operator": "Equal", "value": "x"}]}},
        f"{_TOL}.key",
        "operator Exists",
    ),
    spec_case(
        "toleration-exists-with-value",
        {"placement": {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}},
        f"{_TOL}.value",
        "must not set",
    ),
    spec_case(
        "toleration-effect-unknown",
        {"placement": {"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoWay"}]}},
        f"{_TOL}.effect",
        "NoSchedule",
    ),
    spec_case(
        "node-selector-key-invalid",
        {"placement": {"nodeSelector": {"bad key!": "a"}}},
        "spec.placement.nodeSelector",
        "qualified name",
    ),
    spec_case(
        "node-selector-key-long-prefix",
        {"placement": {"nodeSelector": {"a" * 254 + "/b": "a"}}},
        "spec.placement.nodeSelector",
        "prefix at most 253",
    ),
    spec_case(
        "node-selector-value-invalid",
        {"placement": {"nodeSelector": {"pool": "a b"}}},
        "spec.placement.nodeSelector.pool",
        "label value",
    ),
    spec_case(
        "storage-class-invalid",
        {"storage": {"storageClassName": "Fast_SSD"}},
        "spec.storage.storageClassName",
        "DNS-1123 subdomain",
    ),
    spec_case(
        "env-ld-preload",
        {"env": [{"name": "LD_PRELOAD", "value": "/x.so"}]},
        "spec.env",
        "decides which code the engine runs",
    ),
    spec_case(
        "env-ld-library-path",
        {"env": [{"name": "LD_LIBRARY_PATH", "value": "/x"}]},
        "spec.env",
        "decides which code the engine runs",
    ),
    spec_case(
        "env-path",
        {"env": [{"name": "PATH", "value": "/tmp"}]},
        "spec.env",
        "decides which code the engine runs",
    ),
    spec_case(
        "env-managed",
        {"env": [{"name": "OLLAMA_NUM_PARALLEL", "value": "8"}]},
        "spec.env",
        "operator manages",
    ),
    spec_case(
        "kv-cache-needs-flash-attention",
        {"kvCache": "q4_0", "flashAttention": "disabled"},
        "spec.kvCache",
        "needs flash attention",
    ),
    # Ollama takes gguf (issue 17): its checks are the same as for llama-server.
    spec_case(
        "ollama-gguf-sha256-upper-case",
        {"gguf": {"url": "https://h/m.gguf", "sha256": "A" * 64}},
        "spec.gguf.sha256",
        "got 'AAAA",
    ),
    spec_case(
        "ollama-gguf-url-names-no-file",
        {"gguf": {"url": "https://h/blob?id=1", "sha256": "a" * 64}},
        "spec.gguf.file",
        "set gguf.file",
    ),
    spec_case(
        "ollama-gguf-file-path",
        {"gguf": {"url": "https://h/m.gguf", "sha256": "a" * 64, "file": "../m.gguf"}},
        "spec.gguf.file",
        "a file name ending in .gguf",
    ),
    spec_case(
        "model-with-space", {"model": "qwen3 1.7b"}, "spec.model", "must be a model reference"
    ),
    spec_case("model-shell", {"model": "x;rm -rf /"}, "spec.model", "got 'x;rm -rf /'"),
    # kubectl's default fieldValidation=Strict refuses it; without Strict the API server
    # prunes it and the operator reads the pruned, valid object.
    spec_case(
        "unknown-field",
        {"colour": "blue"},
        "spec.colour",
        "Extra inputs",
        api='unknown field "spec.colour"',
    ),
    Bad(
        "api-version-missing",
        _yaml(model(apiVersion=_DROP)),
        "apiVersion",
        "required",
        api="API version in the data ()",
    ),
    Bad("kind-missing", _yaml(model(kind=_DROP)), "kind", "required", api="'Kind' is missing"),
    Bad(
        "api-version-wrong",
        _yaml(model(apiVersion="localmodel.dev/v1")),
        "apiVersion",
        "localmodel.dev/v1alpha1",
        api='LocalModel in version "v1" cannot be handled',
    ),
    Bad("kind-wrong", _yaml(model(kind="Pod")), "kind", "'LocalModel'", api=None),
    Bad(
        "duplicate-yaml-key",
        (_HEAD + "metadata: {name: m}\nspec: {model: 'qwen3:1.7b', cpu: 1, cpu: 2}\n").encode(),
        "",
        "duplicate key 'cpu'",
        obj="",
    ),
    # ---- JSON input (read by the json module, same limits) --------------------------------
    Bad(
        "json-duplicate-key",
        b'{"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel", "metadata": '
        b'{"name": "m"}, "spec": {"model": "qwen3:1.7b", "cpu": 1, "cpu": 2}}',
        "",
        "duplicate key 'cpu'",
        obj="",
    ),
    # Not JSON: read as YAML, where NaN is a string (as kubectl reads it), not a number.
    Bad("json-nan", _JSON_HEAD + b'"replicas": NaN}}', "spec.replicas", "not a string"),
    Bad(
        "json-huge-int",
        _JSON_HEAD + b'"replicas": 1' + b"0" * 30 + b"}}",
        "",
        "integer out of range",
        obj="",
    ),
    Bad(
        "json-infinite",
        _JSON_HEAD + b'"replicas": 1e400}}',
        "",
        "not a finite number",
        obj="",
    ),
    Bad("json-deep", b"[" * 5000 + b"]" * 5000, "", "nested deeper than", obj=""),
    Bad(
        "json-too-many-values",
        b"[" + b",".join([b"0"] * 1_000_100) + b"]",
        "",
        "more than 1000000 values",
        obj="",
    ),
    Bad(
        "yaml-over-the-yaml-limit",
        _yaml(model()) + b"#" * (1024 * 1024),
        "",
        "larger than 1 MiB of YAML",
        obj="",
    ),
    # ---- errors that named no field ------------------------------------------------------
    Bad(
        "model-twice",
        _yaml(model()) + b"---\n" + _yaml(model()),
        "metadata.name",
        "given more than once",
    ),
    Bad(
        "node-twice",
        _nodes([_NODE, _NODE]),
        "metadata.name",
        "given more than once",
        target="nodes",
        obj="",
    ),
    Bad(
        "node-cpu-not-a-quantity",
        _nodes([_node(cpu="lots")]),
        "status.allocatable.cpu",
        "quantity",
        target="nodes",
        obj="",
    ),
    Bad(
        "node-metadata-string",
        _nodes([_NODE | {"metadata": "x"}]),
        "metadata",
        "",
        target="nodes",
        obj="",
    ),
    # ---- spec.idle (issue 44): each check in both halves, CEL and Python ------------------
    spec_case("idle-after-30s", {"idle": {"after": "30s"}}, "spec.idle.after", "from 1m to 168h"),
    spec_case("idle-after-169h", {"idle": {"after": "169h"}}, "spec.idle.after",
              "from 1m to 168h"),
    # Go reads a fraction rounded down to the nanosecond: just past a week is past it.
    spec_case("idle-after-just-past-a-week", {"idle": {"after": "604800.000000001s"}},
              "spec.idle.after", "from 1m to 168h"),
    spec_case("idle-after-just-short-of-a-minute", {"idle": {"after": "59.9999999999s"}},
              "spec.idle.after", "from 1m to 168h"),
    spec_case("idle-after-days", {"idle": {"after": "7d"}}, "spec.idle.after", "a Go duration"),
    spec_case("idle-after-number", {"idle": {"after": 1800}}, "spec.idle.after", "valid string"),
    spec_case("idle-after-missing", {"idle": {"priority": 1}}, "spec.idle.after", "required",
              api="spec.idle.after: Required value"),
    spec_case("idle-without-gateway", {"idle": {"after": "30m"}, "gateway": {"enabled": False}},
              "spec.idle", "idle needs the gateway"),
    spec_case("idle-priority-101", {"idle": {"after": "30m", "priority": 101}},
              "spec.idle.priority", "less than or equal to 100"),
    spec_case("idle-hold-zero", {"idle": {"after": "30m", "holdSeconds": 0}},
              "spec.idle.holdSeconds", "greater than or equal to 1"),
    spec_case("idle-release-unknown", {"idle": {"after": "30m", "release": "Never"}},
              "spec.idle.release", "'OnDemand' or 'WhenAsleep'"),
    spec_case("idle-window-from-is-to",
              {"idle": {"after": "30m", "awake": [{"from": "08:00", "to": "08:00"}]}},
              "spec.idle.awake[0].to", "from and to must differ"),
    spec_case("idle-window-24h",
              {"idle": {"after": "30m", "awake": [{"from": "24:00", "to": "08:00"}]}},
              "spec.idle.awake[0].from", "a time of day HH:MM"),
    spec_case("idle-window-day-twice",
              {"idle": {"after": "30m", "awake": [{"days": ["Mon", "Mon"], "from": "08:00",
                                                   "to": "18:00"}]}},
              "spec.idle.awake[0].days", "each day may appear once"),
    spec_case("idle-window-day-unknown",
              {"idle": {"after": "30m", "awake": [{"days": ["Monday"], "from": "08:00",
                                                   "to": "18:00"}]}},
              "spec.idle.awake[0].days[0]", "'Mon'"),
    spec_case("idle-window-17",
              {"idle": {"after": "30m", "awake": [{"from": "08:00", "to": "09:00"}] * 17}},
              "spec.idle.awake", "at most 16", api="spec.idle.awake: Too many"),
    spec_case("idle-window-zone-path",
              {"idle": {"after": "30m", "awake": [{"from": "08:00", "to": "18:00",
                                                   "timeZone": "../../etc/passwd"}]}},
              "spec.idle.awake[0].timeZone", "an IANA time zone name"),
    # The API server has no time zone database: it stores the object, the operator
    # says Valid=False (as for a model the catalog does not know).
    spec_case("idle-window-zone-unknown",
              {"idle": {"after": "30m", "awake": [{"from": "08:00", "to": "18:00",
                                                   "timeZone": "Mars/Base"}]}},
              "spec.idle.awake[0].timeZone", "'Mars/Base' is not a time zone this operator knows",
              api=ACCEPTED),
    # ---- an unknown model with memory: auto ----------------------------------------------
    spec_case(
        "unknown-model-auto-memory",
        {"model": "acme/private:7b"},
        "spec.memory",
        "set spec.modelInfo",
        api=ACCEPTED,
    ),
)

# Inputs that are not files in the corpus: endless or huge streams.
ENDLESS = "/dev/zero"

BY_ID = {c.id: c for c in CORPUS}
assert len(BY_ID) == len(CORPUS), "corpus ids must be unique"
