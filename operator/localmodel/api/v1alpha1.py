"""The LocalModel API, `localmodel.dev/v1alpha1`, as pydantic models.

Pure data: defaults, field descriptions (they become `kubectl explain` text) and
validation. Cross-field rules are declared once in `CROSS_FIELD_RULES` style
lists beside the model they belong to: each carries the CEL expression the API
server enforces *and* the Python check the CLI and operator enforce, with one
message for both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from localmodel.api.checks import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    LABEL_VALUE,
    QUALIFIED_NAME,
    Boolean,
    Integer,
    NameFormat,
    Number,
    QuantityRange,
)
from localmodel.engines import llama_server, ollama
from localmodel.errors import FieldError

# Sizes: one declaration each, enforced by Python and (as CEL) by the API server. Zero is
# never valid: a zero memory limit is no limit (and no Guaranteed QoS), a zero volume none.
MEMORY = QuantityRange("64Mi", "64Ti", keyword="auto", example="8Gi")
STORAGE_SIZE = QuantityRange("64Mi", "1Pi", example="20Gi")
WEIGHTS_SIZE = QuantityRange("1Mi", "64Ti", example="4.7Gi")
# metadata.name becomes a Service name (DNS-1035: a letter first), a label value and the
# stem of `<name>-weights-<replica>` and `<name>-modelfile`: 52 leaves room for the suffixes.
OBJECT_NAME = NameFormat(DNS1035_LABEL.title, DNS1035_LABEL.regex, 52)
# A toleration key is a label key, or empty (with Exists: every taint).
TOLERATION_KEY = NameFormat(
    QUALIFIED_NAME.title,
    QUALIFIED_NAME.regex,
    QUALIFIED_NAME.max_length,
    prefix_max=QUALIFIED_NAME.prefix_max,
    allow_empty=True,
)
# An Ollama keep_alive: a Go duration ("5m", "-1m", "24h") or a number of seconds ("-1").
KEEP_ALIVE_PATTERN = r"^-?([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$|^-?[0-9]+$"
# Ollama model reference: [registry/][namespace/]name[:tag]
MODEL_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._\-/]*(:[a-zA-Z0-9._\-]+)?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENGINE_VERSION_PATTERN = r"^v?[0-9]+(\.[0-9]+){0,2}([-+].*)?$"
FAMILY_PATTERN = r"^[a-z0-9][a-z0-9.\-]*$"
NO_SPACE_PATTERN = r"^\S+$"

# Environment variables the operator sets from the spec and its rules, as each
# engine lists them (localmodel.engines). A user setting one of them would
# silently undo a rule, so the API rejects it.
MANAGED_ENV: tuple[str, ...] = ollama.MANAGED_ENV + llama_server.MANAGED_ENV

# Variables that choose the code the engine runs: the dynamic loader's (LD_PRELOAD,
# LD_LIBRARY_PATH, LD_AUDIT, ...) and PATH. The AMX guard deletes a CPU library and pins
# `/bin/ollama`; a user LD_PRELOAD or LD_LIBRARY_PATH could load that code back, and PATH
# picks the binaries the start scripts run. Rejected like MANAGED_ENV (docs/validation.md).
LOADER_ENV: tuple[str, ...] = ("PATH",)
LOADER_ENV_PREFIX = "LD_"

MAX_CPU = 1024
CPU_MESSAGE = f"must be a positive integer or 'node' (at most {MAX_CPU} CPUs)"


class _Base(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=False,
        frozen=True,
    )


class _StatusBase(_Base):
    """Status is written by the operator but may carry fields others wrote (kopf
    writes `status.kopf` by default; an older operator may have written fields
    this one does not know). Reading status must tolerate them, so status models
    ignore unknown fields; the spec stays strict."""

    model_config = ConfigDict(extra="ignore")


@dataclass(frozen=True)
class CrossFieldRule:
    """One validation rule, enforced by the API server (CEL) and by Python alike."""

    cel: str
    message: str
    check: Callable[[Any], bool]  # True when the object is valid
    field_path: str  # where to point the user, relative to the object the rule sits on


_T = TypeVar("_T")


def enforce(rules: tuple[CrossFieldRule, ...], obj: _T) -> _T:
    """Python's half of the cross-field rules: the first broken one raises.

    The FieldError's path is relative to the object the rules sit on; the
    caller (`localmodel.api.parse_local_model`) roots it.
    """
    for rule in rules:
        if not rule.check(obj):
            raise FieldError(rule.field_path, rule.message)
    return obj


class EngineName(StrEnum):
    OLLAMA = ollama.NAME
    LLAMA_SERVER = llama_server.NAME


class KVCacheType(StrEnum):
    F16 = "f16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"

    @property
    def quantized(self) -> bool:
        return self is not KVCacheType.F16


class FlashAttention(StrEnum):
    AUTO = "auto"
    ENABLED = "enabled"
    DISABLED = "disabled"


DEFAULT_IMAGES: dict[EngineName, str] = {
    EngineName.OLLAMA: ollama.IMAGE,
    EngineName.LLAMA_SERVER: llama_server.IMAGE,
}


class EngineSpec(_Base):
    """Which inference engine serves the model."""

    name: EngineName = Field(
        EngineName.OLLAMA,
        description="Inference engine: `ollama` (pulls `model` from Ollama's registry, or "
        "imports the GGUF file named by `gguf`) or `llama-server` (llama.cpp's server; "
        "serves the GGUF file named by `gguf`).",
    )
    image: str | None = Field(
        None,
        description="Engine container image. Defaults to a pinned image per engine "
        f"(ollama: {ollama.IMAGE}; llama-server: {llama_server.IMAGE}).",
        min_length=1,
    )
    version: str | None = Field(
        None,
        description="Engine version used by version-ranged rules (e.g. `0.32.2`). "
        "Defaults to the image tag; an unparsable tag means an unknown version, "
        "and rules then take the safe side.",
        pattern=ENGINE_VERSION_PATTERN,
    )

    def resolved_image(self) -> str:
        return self.image or DEFAULT_IMAGES[self.name]


class ModelInfo(_Base):
    """Size and shape of a model the built-in catalog does not know."""

    weights_size: Annotated[str, WEIGHTS_SIZE] = Field(
        description="Size of the model weights as stored by the engine (a quantity, "
        "e.g. `4.7Gi`). CPU-only Ollama disables mmap, so all of it counts "
        "against the memory limit.",
    )
    layers: Integer = Field(
        description="Transformer blocks (GGUF `<arch>.block_count`).", ge=1, le=4096
    )
    kv_heads: Integer = Field(
        description="Key/value attention heads (GGUF `<arch>.attention.head_count_kv`).",
        ge=1,
        le=4096,
    )
    key_length: Integer = Field(
        128, description="Key head size (GGUF `<arch>.attention.key_length`).", ge=1, le=65536
    )
    value_length: Integer = Field(
        128,
        description="Value head size (GGUF `<arch>.attention.value_length`).",
        ge=1,
        le=65536,
    )
    family: str | None = Field(
        None,
        description="Model family (e.g. `qwen3`, `llama`, `gemma3`) for family-scoped rules.",
        pattern=FAMILY_PATTERN,
    )


# The last path segment of a URL, when it names a GGUF file (query and fragment aside).
GGUF_URL_FILE_PATTERN = r"/([A-Za-z0-9][A-Za-z0-9._-]*[.]gguf)([?#].*)?$"
GGUF_FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*[.]gguf$"
GGUF_URL_PATTERN = r"^https?://\S+$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class GGUF(_Base):
    """The model's GGUF file, downloaded once onto the weights volume: llama-server
    serves it; Ollama imports it as `model` instead of pulling from its registry."""

    url: str = Field(
        description="Where the init step downloads the file when the weights volume does "
        "not hold it yet (http or https). Downloaded once: later starts find it there.",
        pattern=GGUF_URL_PATTERN,
        max_length=2048,
    )
    sha256: str = Field(
        description="SHA-256 of the file, 64 lower-case hex digits. A download or a file "
        "already on the volume that does not match fails the pod's start.",
        pattern=SHA256_PATTERN,
    )
    file: str | None = Field(
        None,
        description="File name on the volume. Defaults to the URL's last path segment, "
        "which must then end in `.gguf`.",
        pattern=GGUF_FILE_PATTERN,
        max_length=255,
    )

    def file_name(self) -> str:
        if self.file:
            return self.file
        m = re.search(GGUF_URL_FILE_PATTERN, self.url)
        if m is None:  # the cross-field rule below refuses such an object
            raise ValueError("gguf.url does not end in a .gguf file name")
        return m.group(1)

    @model_validator(mode="after")
    def _rules(self) -> GGUF:
        return enforce(GGUF_RULES, self)


GGUF_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel=f"has(self.file) || self.url.matches('{GGUF_URL_FILE_PATTERN}')",
        message="the URL does not end in a .gguf file name: set gguf.file",
        check=lambda g: bool(g.file) or re.search(GGUF_URL_FILE_PATTERN, g.url) is not None,
        field_path="file",
    ),
)


class TolerationOperator(StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(_Base):
    """A Kubernetes toleration, copied to the model's pods."""

    key: Annotated[str, TOLERATION_KEY] | None = Field(
        None, description="Taint key (a label key); empty with Exists matches all."
    )
    operator: TolerationOperator = Field(
        TolerationOperator.EQUAL, description="`Equal` or `Exists`."
    )
    value: Annotated[str, LABEL_VALUE] | None = Field(
        None, description="Taint value for `Equal` (a label value)."
    )
    effect: TaintEffect | None = Field(None, description="Effect to match; empty matches all.")
    toleration_seconds: Integer | None = Field(
        None,
        description="For NoExecute only: how long the pod stays bound after the taint.",
        ge=0,
        le=10**9,
    )

    @model_validator(mode="after")
    def _rules(self) -> Toleration:
        return enforce(TOLERATION_RULES, self)


TOLERATION_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel="self.operator == 'Exists' || (has(self.key) && self.key != '')",
        message="a toleration without a key must use operator Exists",
        check=lambda t: t.operator is TolerationOperator.EXISTS or bool(t.key),
        field_path="key",
    ),
    CrossFieldRule(
        cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
        message="a toleration with operator Exists must not set a value",
        check=lambda t: t.operator is not TolerationOperator.EXISTS or not t.value,
        field_path="value",
    ),
    CrossFieldRule(
        # As Kubernetes validates a pod's tolerations (ValidateTolerations).
        cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        message="tolerationSeconds is only valid with effect NoExecute",
        check=lambda t: t.toleration_seconds is None or t.effect is TaintEffect.NO_EXECUTE,
        field_path="effect",
    ),
)


class Placement(_Base):
    """Where replicas may run."""

    exclusive: Boolean = Field(
        True,
        description="One model per node: no other LocalModel is placed on a node that runs "
        "this one. Two models on one CPU node split memory and cores and are often "
        "slower than one.",
    )
    node_selector: Annotated[
        dict[str, Annotated[str, LABEL_VALUE]], QUALIFIED_NAME.keys
    ] = Field(
        default_factory=dict,
        description="Node labels every chosen node must carry (label keys and values).",
        max_length=64,
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the model's pods tolerate.", max_length=32
    )
    safe_cpu_path: Boolean = Field(
        False,
        description="Force the AMX-safe CPU path on AMX nodes (flash attention off, AVX2 "
        "CPU backend, AMX library removed) even for engine versions that carry the fix.",
    )


class Storage(_Base):
    """The persistent volume at /root/.ollama that keeps weights across restarts."""

    size: Annotated[str, STORAGE_SIZE] | None = Field(
        None,
        description="Volume size. Defaults to the weights size plus headroom, rounded up "
        "to whole GiB.",
    )
    storage_class_name: Annotated[str, DNS1123_SUBDOMAIN] | None = Field(
        None, description="StorageClass of the volume; unset uses the cluster default."
    )
    retain: Boolean = Field(
        True,
        description="Keep the weights volume when the LocalModel is deleted (no owner "
        "reference on the claim), so re-creating the model needs no download.",
    )


# A Kubernetes object name (DNS-1123 subdomain) and a Secret data key.
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# An http(s) base URL without query or fragment, e.g. https://api.example.com/v1.
HTTP_URL_PATTERN = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"

# What each pattern asks for, in words: a value that fails one is refused with
# these words (errors.py looks the pattern up here) rather than the regex.
PATTERN_WORDS: dict[str, str] = {
    MODEL_PATTERN: "a model reference such as qwen3:1.7b or library/qwen3:1.7b (letters, "
    "digits, '.', '_', '-' and '/', then an optional ':tag'; no spaces)",
    KEEP_ALIVE_PATTERN: "a Go duration such as 5m, 1h30m or -1m, or whole seconds such as 300",
    ENV_NAME_PATTERN: "an environment variable name (a letter or '_', then letters, digits "
    "or '_')",
    ENGINE_VERSION_PATTERN: f"a version such as {ollama.VERSION} or v{ollama.VERSION}",
    FAMILY_PATTERN: "a model family such as qwen3 (lower-case letters, digits, '.' and '-')",
    NO_SPACE_PATTERN: "a name without spaces",
    GGUF_URL_PATTERN: "an http:// or https:// URL without spaces",
    SHA256_PATTERN: "a SHA-256 digest: 64 lower-case hex digits",
    GGUF_FILE_PATTERN: "a file name ending in .gguf (letters, digits, '.', '_' and '-')",
    DNS_SUBDOMAIN_PATTERN: "a Kubernetes object name (lower-case letters, digits, '-' and '.')",
    SECRET_KEY_PATTERN: "a Secret key (letters, digits, '-', '_' and '.')",
    HTTP_URL_PATTERN: "an http:// or https:// base URL without spaces, query or fragment, "
    "such as https://api.example.com/v1",
}


class SecretKeyRef(_Base):
    """One key of a Secret in the LocalModel's namespace."""

    name: str = Field(
        description="Secret name.", pattern=DNS_SUBDOMAIN_PATTERN, min_length=1, max_length=253
    )
    key: str = Field(
        description="Key in the Secret's data.",
        pattern=SECRET_KEY_PATTERN,
        min_length=1,
        max_length=253,
    )


class Overflow(_Base):
    """Where foreground requests go when no local slot frees in time.

    People must not queue behind background work on a CPU-only model: a
    foreground request that cannot start locally within `after` seconds is
    sent to this OpenAI-compatible endpoint with its model name replaced.
    Background requests never overflow. See docs/gateway.md, Overflow."""

    url: str = Field(
        description="OpenAI-compatible base URL, as OpenAI clients take it, e.g. "
        "`https://api.example.com/v1`.",
        pattern=HTTP_URL_PATTERN,
        max_length=2048,
    )
    model: str = Field(
        description="Model name overflowed requests carry.",
        pattern=NO_SPACE_PATTERN,
        min_length=1,
        max_length=256,
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        None,
        description="Secret key holding the endpoint's API key (sent as a bearer token; "
        "never logged).",
    )
    after: Number = Field(
        0,
        description="Seconds a foreground request waits for a local slot before it "
        "overflows; 0 overflows as soon as none is free.",
        ge=0,
        le=3600,
    )


class Gateway(_Base):
    """The slot gate in front of the engine."""

    enabled: Boolean = Field(
        True,
        description="Run the gateway sidecar: real cancellation, background skip, metrics.",
    )
    image: str | None = Field(
        None, description="Gateway image. Defaults to the operator's own image.", min_length=1
    )
    max_queue: Integer = Field(
        16, description="Foreground requests allowed to wait; past it, 503.", ge=0, le=10000
    )
    deadline_seconds: Integer = Field(
        600,
        description="Default request deadline; past it the upstream generation is cancelled.",
        ge=1,
        le=86400,
    )
    max_tokens: Integer = Field(
        2048, description="Cap on tokens generated per request (num_predict).", ge=1, le=1048576
    )
    overflow: Overflow | None = Field(
        None, description="An endpoint for foreground requests the local slots cannot take."
    )

    @model_validator(mode="after")
    def _cross_field(self) -> Gateway:
        return enforce(GATEWAY_RULES, self)


GATEWAY_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel="!has(self.overflow) || !has(self.enabled) || self.enabled",
        message="overflow needs the gateway: set enabled to true or remove overflow",
        check=lambda g: g.overflow is None or g.enabled,
        field_path="overflow",
    ),
)


class EnvVar(_Base):
    """An extra environment variable for the engine container."""

    name: str = Field(
        description="Variable name.", pattern=ENV_NAME_PATTERN, min_length=1, max_length=256
    )
    value: str = Field("", description="Variable value.")


class LocalModelSpec(_Base):
    """Desired state of a LocalModel."""

    model: str = Field(
        description="Ollama model reference, e.g. `qwen3:1.7b`. With `gguf`, the name Ollama "
        "creates the model under (no registry pull); for llama-server, the name the model "
        "is served as (`--alias`). Either way the built-in catalog looks it up by this name.",
        pattern=MODEL_PATTERN,
        min_length=1,
        max_length=200,
    )
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Inference engine.")
    gguf: GGUF | None = Field(
        None,
        description="The model's GGUF file, downloaded once onto the weights volume and "
        "checked against its sha256. Required for llama-server. For Ollama it is optional: "
        "with it the init step imports the file as `model` and never calls Ollama's "
        "registry (air-gapped clusters); without it Ollama pulls `model` from its registry.",
    )
    replicas: Integer = Field(1, description="Replicas, each on a different node.", ge=0, le=1000)
    cpu: int | Literal["node"] = Field(
        4,
        description="Whole CPUs for the engine (limit = request). The engine gets exactly "
        "this many threads. `node` takes all free allocatable CPUs of the chosen node.",
    )
    memory: Annotated[str, MEMORY] = Field(
        "auto",
        description="Memory limit (= request). `auto` sizes it from weights + KV cache + "
        "compute overhead.",
    )
    context: Integer = Field(
        8192, description="Context length of each slot, in tokens.", ge=512, le=1048576
    )
    slots: Integer = Field(
        1,
        description="Parallel requests (OLLAMA_NUM_PARALLEL; llama-server `-np`). Each slot "
        "holds a full context.",
        ge=1,
        le=64,
    )
    kv_cache: KVCacheType = Field(
        KVCacheType.F16,
        description="KV cache element type. Quantized types need flash attention.",
    )
    flash_attention: FlashAttention = Field(
        FlashAttention.AUTO, description="`auto`, `enabled` or `disabled`."
    )
    keep_alive: str = Field(
        "-1",
        description="How long the model stays loaded after a request; `-1` keeps it loaded. "
        "Ollama only: llama-server always keeps its model loaded.",
        pattern=KEEP_ALIVE_PATTERN,
    )
    model_info: ModelInfo | None = Field(
        None,
        description="Size and architecture, for models the built-in catalog does not know.",
    )
    placement: Placement = Field(default_factory=Placement, description="Placement policy.")
    storage: Storage = Field(default_factory=Storage, description="Weights volume.")
    gateway: Gateway = Field(default_factory=Gateway, description="Slot gate sidecar.")
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra engine environment. Variables the operator manages are rejected.",
        max_length=64,
    )

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: object) -> object:
        # Reject booleans and strings like "4" early, with a message that says what fits.
        # int-or-string: the API server refuses 2.0 here (unlike in `type: integer`).
        if isinstance(value, bool | float) or (isinstance(value, str) and value != "node"):
            raise ValueError(CPU_MESSAGE)
        if isinstance(value, int) and not 1 <= value <= MAX_CPU:
            raise ValueError(CPU_MESSAGE)
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> LocalModelSpec:
        return enforce(SPEC_RULES, self)


def _managed(env: list[EnvVar]) -> list[str]:
    return [e.name for e in env if e.name in MANAGED_ENV]


def _loader(name: str) -> bool:
    return name in LOADER_ENV or name.startswith(LOADER_ENV_PREFIX)


# CEL: the engine is llama-server (the `engine: {}` default means ollama).
_CEL_LLAMA = (
    f"(has(self.engine) && has(self.engine.name) && self.engine.name == '{llama_server.NAME}')"
)


def _is_llama(s: LocalModelSpec) -> bool:
    return s.engine.name is EngineName.LLAMA_SERVER


SPEC_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        cel="!has(self.cpu) || (type(self.cpu) == int ? self.cpu >= 1 && self.cpu <= "
        f"{MAX_CPU} : self.cpu == 'node')",
        message=CPU_MESSAGE,
        check=lambda s: s.cpu == "node" or (isinstance(s.cpu, int) and 1 <= s.cpu <= MAX_CPU),
        field_path="cpu",
    ),
    CrossFieldRule(
        cel=f"!{_CEL_LLAMA} || has(self.gguf)",
        message="engine llama-server serves a GGUF file: set gguf.url and gguf.sha256",
        check=lambda s: not _is_llama(s) or s.gguf is not None,
        field_path="gguf",
    ),
    CrossFieldRule(
        cel=f"!{_CEL_LLAMA} || !has(self.keepAlive) || self.keepAlive == '-1'",
        message="keepAlive is Ollama's; llama-server always keeps its model loaded",
        check=lambda s: not _is_llama(s) or s.keep_alive == "-1",
        field_path="keepAlive",
    ),
    CrossFieldRule(
        cel=f"!{_CEL_LLAMA} || !has(self.placement) || !has(self.placement.safeCpuPath) "
        "|| !self.placement.safeCpuPath",
        message="placement.safeCpuPath is Ollama's AMX workaround (its CPU libraries); "
        "llama-server has no such switch here",
        check=lambda s: not _is_llama(s) or not s.placement.safe_cpu_path,
        field_path="placement",
    ),
    CrossFieldRule(
        cel="!has(self.kvCache) || !has(self.flashAttention) "
        "|| !(self.kvCache in ['q8_0', 'q4_0'] && self.flashAttention == 'disabled')",
        message="a quantized kvCache needs flash attention: llama.cpp cannot create a "
        "quantized V cache without it; set flashAttention to auto or enabled, or kvCache "
        "to f16",
        check=lambda s: not (s.kv_cache.quantized and s.flash_attention is FlashAttention.DISABLED),
        field_path="kvCache",
    ),
    CrossFieldRule(
        cel="!has(self.env) || self.env.all(e, !(e.name in ["
        + ", ".join(f"'{n}'" for n in MANAGED_ENV)
        + "]))",
        message="sets a variable the operator manages ("
        + ", ".join(MANAGED_ENV)
        + "); use the matching spec field instead",
        check=lambda s: not _managed(s.env),
        field_path="env",
    ),
    CrossFieldRule(
        cel="!has(self.env) || self.env.all(e, !(e.name in ["
        + ", ".join(f"'{n}'" for n in LOADER_ENV)
        + f"] || e.name.startsWith('{LOADER_ENV_PREFIX}')))",
        message="sets a variable that decides which code the engine runs ("
        + ", ".join(LOADER_ENV)
        + f", {LOADER_ENV_PREFIX}*): it could load a library a crash guard removed or "
        "run another binary than the image's; build an image instead",
        check=lambda s: not any(_loader(e.name) for e in s.env),
        field_path="env",
    ),
    CrossFieldRule(
        cel="!has(self.env) || self.env.all(a, self.env.exists_one(b, b.name == a.name))",
        message="each variable name may appear once",
        check=lambda s: len({e.name for e in s.env}) == len(s.env),
        field_path="env",
    ),
)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_StatusBase):
    """A metav1.Condition."""

    type: str = Field(
        description="Condition type: Valid, Placed, Ready, Progressing or SlowReplica; "
        "Reconciling or Stalled while True (kstatus)."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: Integer | None = Field(
        None, description="The spec generation this condition was computed from."
    )
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    reason: str = Field(description="CamelCase reason.", pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*)?$")
    message: str = Field("", description="Human-readable explanation.")


class DecisionStatus(_StatusBase):
    """One rule that fired for a placement, what it changed and why."""

    rule: str = Field(description="Rule id (see docs/rules.md).")
    effect: str = Field(description="What the rule changed.")
    reason: str = Field(description="Why.")
    source: str = Field(description="Where the engine fact comes from.")


class SpeedStatus(_StatusBase):
    """One replica's speed where it is served, in tokens per second from the
    engine's own timings (see docs/operator.md, Speed)."""

    calibration_decode: Number | None = Field(
        None, description="Decode rate of the calibration at readiness (a fixed decode of "
        "32 tokens after the model loaded, before the pod reported Ready)."
    )
    calibration_prefill: Number | None = Field(
        None, description="Prefill rate of the calibration's prompt."
    )
    recent_decode: Number | None = Field(
        None, description="Decode rate of real traffic (background and foreground) between "
        "the operator's last two reads."
    )
    recent_prefill: Number | None = Field(
        None, description="Prefill rate of real traffic between the operator's last two reads."
    )
    expected_decode: Number | None = Field(
        None, description="The decode rate this replica should reach: the median calibration "
        "of its peers (same model, engine image, threads and node CPU model), else its own."
    )
    expected_source: str = Field(
        "", description="Where expectedDecode comes from: peers (how many) or own calibration."
    )
    ratio: Number | None = Field(
        None, description="recentDecode over expectedDecode, when both are known."
    )
    slow: Boolean = Field(
        False, description="Whether this replica counts as slow (the SlowReplica condition)."
    )
    measured_at: str = Field("", description="When these numbers were read (RFC 3339).")


class PlacementStatus(_StatusBase):
    """Where one replica runs and with which engine settings."""

    replica: Integer = Field(description="Replica index.")
    node: str = Field(description="Node the replica is placed on.")
    pod: str = Field(description="Pod name.")
    threads: Integer = Field(description="Engine threads (= whole CPUs of the limit).")
    cpu: Integer = Field(description="Whole CPUs requested and limited.")
    memory: str = Field(description="Memory requested and limited.")
    settings: dict[str, str] = Field(
        default_factory=dict, description="Effective engine settings (environment, options)."
    )
    decisions: list[DecisionStatus] = Field(
        default_factory=list, description="Rules that produced these settings."
    )
    reason: str = Field("", description="Why this node was chosen.")
    speed: SpeedStatus | None = Field(
        None, description="Calibration, recent and expected rates (once the gateway was read)."
    )


class LocalModelStatus(_StatusBase):
    """Observed state of a LocalModel."""

    observed_generation: Integer | None = Field(
        None, description="The spec generation last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Valid, Placed, Ready, Progressing and SlowReplica; Reconciling or Stalled "
        "while True.",
    )
    placements: list[PlacementStatus] = Field(
        default_factory=list, description="Per-replica placement and settings."
    )
    replicas: Integer = Field(
        0, description="Replicas placed (the scale subresource's status.replicas)."
    )
    selector: str = Field(
        "",
        description="Label selector of the replicas' pods, for the scale subresource "
        "(HorizontalPodAutoscaler, KEDA).",
    )
    ready_replicas: Integer = Field(0, description="Replicas whose pod is Ready.")
    ready: str = Field("", description="Ready replicas over desired, e.g. `1/1`.")
    nodes: str = Field("", description="Nodes the replicas run on, comma separated.")
    endpoint: str = Field("", description="In-cluster URL of the model's Service.")


class ObjectMeta(BaseModel):
    """The parts of metadata the operator reads; everything else passes through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, frozen=True)

    name: Annotated[str, OBJECT_NAME]
    # Offline manifests without one land in "default", as kubectl would put them.
    namespace: Annotated[str, DNS1123_LABEL] = "default"
    uid: str | None = None
    generation: Integer | None = None
    labels: Annotated[dict[str, Annotated[str, LABEL_VALUE]], QUALIFIED_NAME.keys] = Field(
        default_factory=dict
    )
    annotations: Annotated[dict[str, str], QUALIFIED_NAME.keys] = Field(default_factory=dict)


class LocalModel(_Base):
    """A local LLM served on CPU nodes, tuned per node."""

    # Required, as the API server requires them: a manifest without them cannot be applied.
    api_version: Literal["localmodel.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["LocalModel"]
    metadata: ObjectMeta
    spec: LocalModelSpec
    status: LocalModelStatus | None = None

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


def rules_cel(rules: tuple[CrossFieldRule, ...]) -> list[dict[str, str]]:
    """CEL validations for the CRD, from the same rules Python enforces."""
    out = []
    for r in rules:
        entry = {"rule": r.cel, "message": r.message}
        # Point the API server's error at the offending field.
        if re.fullmatch(r"[A-Za-z]+", r.field_path):
            entry["fieldPath"] = f".{r.field_path}"
        out.append(entry)
    return out
