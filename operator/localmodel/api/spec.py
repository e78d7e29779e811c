"""The LocalModel spec (`localmodel.dev/v1alpha1`), as pydantic models.

Pure data: defaults, field descriptions (they become `kubectl explain` text) and
validation. Each model with cross-field rules enforces its set from
`localmodel.api.rules` in a validator; the API server enforces the same rules
as CEL (`localmodel.crd`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from localmodel.api.access import NetworkPolicySpec
from localmodel.api.checks import (
    DNS1123_SUBDOMAIN,
    GO_DURATION_PATTERN,
    LABEL_VALUE,
    QUALIFIED_NAME,
    ApiModel,
    Boolean,
    Integer,
    Number,
    QuantityRange,
    enforce,
    one_default,
)
from localmodel.api.engine import (
    DEFAULT_ENGINE,
    DEFAULT_IMAGES,
    EXAMPLE_VERSION,
    IMAGE_DESCRIPTION,
    NAME_DESCRIPTION,
    EngineName,
)
from localmodel.api.idle import CLOCK_PATTERN, TIME_ZONE_PATTERN, IdleSpec
from localmodel.api.model_info import FAMILY_PATTERN, ModelInfo
from localmodel.api.rules import (
    CPU_MESSAGE,
    GATEWAY_RULES,
    GGUF_RULES,
    GGUF_URL_FILE_PATTERN,
    MAX_CPU,
    SPEC_RULES,
)
from localmodel.api.toleration import Toleration
from localmodel.images import with_registry

# Sizes: one declaration each, enforced by Python and (as CEL) by the API server. Zero is
# never valid: a zero memory limit is no limit (and no Guaranteed QoS), a zero volume none.
MEMORY = QuantityRange("64Mi", "64Ti", keyword="auto", example="8Gi")
STORAGE_SIZE = QuantityRange("64Mi", "1Pi", example="20Gi")
# The engine's host-memory prompt cache: zero turns it off.
PROMPT_CACHE = QuantityRange("0", "1Ti", keyword="auto", example="256Mi")
# A toleration key is a label key, or empty (with Exists: every taint).
# An Ollama keep_alive: a Go duration ("5m", "-1m", "24h") or a number of seconds ("-1").
KEEP_ALIVE_PATTERN = r"^-?([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$|^-?[0-9]+$"
# Ollama model reference: [registry/][namespace/]name[:tag]
MODEL_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9._\-/]*(:[a-zA-Z0-9._\-]+)?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENGINE_VERSION_PATTERN = r"^v?[0-9]+(\.[0-9]+){0,2}([-+].*)?$"
NO_SPACE_PATTERN = r"^\S+$"


# The KV cache's element type; `quantized`: smaller than f16.
# (No docstring: the CRD would carry it.)
class KVCacheType(StrEnum):
    F16 = "f16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"

    @property
    def quantized(self) -> bool:
        return self is not KVCacheType.F16


# Whether the engine's flash attention is on, off, or left to it.
# (No docstring: the CRD would carry it.)
class FlashAttention(StrEnum):
    AUTO = "auto"
    ENABLED = "enabled"
    DISABLED = "disabled"


class EngineSpec(ApiModel):
    """Which inference engine serves the model."""

    name: EngineName = Field(DEFAULT_ENGINE, description=NAME_DESCRIPTION)
    image: str | None = Field(None, description=IMAGE_DESCRIPTION, min_length=1)
    version: str | None = Field(
        None,
        description="Engine version used by version-ranged rules (e.g. `0.32.2`). "
        "Defaults to the image tag; an unparsable tag means an unknown version, "
        "and rules then take the safe side.",
        pattern=ENGINE_VERSION_PATTERN,
    )

    def resolved_image(self, registry: str = "") -> str:
        """The image the engine runs: the spec's own as written, else the
        engine's pinned image under `registry` (localmodel/images.py)."""
        return self.image or with_registry(DEFAULT_IMAGES[self.name], registry)


GGUF_FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*[.]gguf$"
GGUF_URL_PATTERN = r"^https?://\S+$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class GGUF(ApiModel):
    """The model's GGUF file, downloaded once onto the weights volume: llama-server
    serves it; Ollama imports it as `model` instead of pulling from its registry."""

    url: str = Field(
        description="Where the init step downloads the file when the weights volume does "
        "not hold it yet: https, or plain http where the operator allows it "
        "(--allow-http-downloads). Downloaded once: later starts find it there.",
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



class Placement(ApiModel):
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


class Storage(ApiModel):
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
# these words (api/parse.py looks the pattern up here) rather than the regex.
PATTERN_WORDS: dict[str, str] = {
    MODEL_PATTERN: "a model reference such as qwen3:1.7b or library/qwen3:1.7b (letters, "
    "digits, '.', '_', '-' and '/', then an optional ':tag'; no spaces)",
    KEEP_ALIVE_PATTERN: "a Go duration such as 5m, 1h30m or -1m, or whole seconds such as 300",
    ENV_NAME_PATTERN: "an environment variable name (a letter or '_', then letters, digits "
    "or '_')",
    ENGINE_VERSION_PATTERN: f"a version such as {EXAMPLE_VERSION} or v{EXAMPLE_VERSION}",
    FAMILY_PATTERN: "a model family such as qwen3 (lower-case letters, digits, '.' and '-')",
    NO_SPACE_PATTERN: "a name without spaces",
    GGUF_URL_PATTERN: "an http:// or https:// URL without spaces",
    SHA256_PATTERN: "a SHA-256 digest: 64 lower-case hex digits",
    GGUF_FILE_PATTERN: "a file name ending in .gguf (letters, digits, '.', '_' and '-')",
    DNS_SUBDOMAIN_PATTERN: "a Kubernetes object name (lower-case letters, digits, '-' and '.')",
    SECRET_KEY_PATTERN: "a Secret key (letters, digits, '-', '_' and '.')",
    HTTP_URL_PATTERN: "an http:// or https:// base URL without spaces, query or fragment, "
    "such as https://api.example.com/v1",
    GO_DURATION_PATTERN: "a Go duration such as 30m, 1h30m or 90s",
    CLOCK_PATTERN: "a time of day HH:MM, from 00:00 to 23:59",
    TIME_ZONE_PATTERN: "an IANA time zone name such as Europe/Berlin or UTC",
}


class SecretKeyRef(ApiModel):
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


class OverflowBudget(ApiModel):
    """Overflowed requests allowed per sliding window."""

    requests: Integer = Field(description="Requests per window.", ge=0, le=10**9)
    window_seconds: Integer = Field(3600, description="The window.", ge=1, le=2678400)


class GatewayAuth(ApiModel):
    """API keys: with them, every inference route needs `Authorization: Bearer
    <key>`; see docs/gateway.md, API keys."""

    keys_secret_ref: SecretKeyRef = Field(
        description="Secret key holding the keys file (JSON: each key's SHA-256, caller "
        "and rights); mounted in the gateway, reloaded when the Secret changes.",
    )


class Overflow(ApiModel):
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
    budget: OverflowBudget | None = Field(
        None, description="Overflowed requests allowed per window, per API key without its "
        "own budget, and for all callers without a key together; absent: unbounded.",
    )


class Gateway(ApiModel):
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
    auth: GatewayAuth | None = Field(None, description="API keys; absent: none asked.")
    network_policy: NetworkPolicySpec = Field(
        default_factory=one_default(NetworkPolicySpec),
        description="Who may reach the model's pods.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> Gateway:
        return enforce(GATEWAY_RULES, self)



class EnvVar(ApiModel):
    """An extra environment variable for the engine container."""

    name: str = Field(
        description="Variable name.", pattern=ENV_NAME_PATTERN, min_length=1, max_length=256
    )
    value: str = Field("", description="Variable value.")


class LocalModelSpec(ApiModel):
    """Desired state of a LocalModel."""

    model: str = Field(
        description="Ollama model reference, e.g. `qwen3:1.7b`. With `gguf`, the name Ollama "
        "creates the model under (no registry pull); for llama-server, the name the model "
        "is served as (`--alias`). Either way the built-in catalog looks it up by this name.",
        pattern=MODEL_PATTERN,
        min_length=1,
        max_length=200,
    )
    engine: EngineSpec = Field(
        default_factory=one_default(EngineSpec), description="Inference engine."
    )
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
        "prompt cache + context checkpoints + compute buffer + runtime, as the engine "
        "allocates them.",
    )
    # No schema default (absent means `auto`): a defaulted new field would be
    # written into every stored object, which an older operator refuses.
    prompt_cache: Annotated[str, PROMPT_CACHE] | None = Field(
        None,
        description="Host memory the engine may keep earlier prompts' states in, to "
        "answer a returning prompt without reading it again (llama-server `--cache-ram`; "
        "for Ollama `LLAMA_ARG_CACHE_RAM`, which its llama-server child inherits), rounded "
        "up to whole MiB and counted in `memory: auto`. `0` keeps none. `auto` sizes it as "
        "a quarter of the KV cache (context x slots), or 0 when the model's shape is "
        "unknown; absent means `auto`. Unbounded, llama-server keeps up to 8 GiB by "
        "default and the pod is slowly OOM-killed.",
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
    placement: Placement = Field(
        default_factory=one_default(Placement), description="Placement policy."
    )
    storage: Storage = Field(default_factory=one_default(Storage), description="Weights volume.")
    gateway: Gateway = Field(
        default_factory=one_default(Gateway), description="Slot gate sidecar."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra engine environment. Variables the operator manages are rejected.",
        max_length=64,
    )
    # No schema default (absent: the model never sleeps), as for promptCache.
    idle: IdleSpec | None = Field(
        None,
        description="Sleep when idle: after `after` with no request the model sleeps, and "
        "gives its node to another model that needs it; a request through the router wakes "
        "it. Absent: the model never sleeps, and never takes a sleeping model's node.",
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

