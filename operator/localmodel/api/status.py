"""The LocalModel status (`localmodel.dev/v1alpha1`), as pydantic models.

Written by the operator (`localmodel.status` builds it), read back by the
operator, the kubectl plugin and kstatus-aware tools.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from localmodel.api.checks import ApiModel, Boolean, Integer, Number


class _StatusBase(ApiModel):
    """Status is written by the operator but may carry fields others wrote (kopf
    writes `status.kopf` by default; an older operator may have written fields
    this one does not know). Reading status must tolerate them, so status models
    ignore unknown fields; the spec stays strict."""

    model_config = ConfigDict(extra="ignore")


# A condition's status, as Kubernetes spells it. (No docstring: the CRD would carry it.)
class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_StatusBase):
    """A metav1.Condition."""

    type: str = Field(
        description="Condition type: Valid, Placed, Ready, Progressing, SlowReplica or "
        "Awake (spec.idle); "
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
        "of its peers (same model, engine image, threads and node CPU model), else its own; "
        "at least 0.5 of its decode ceiling where its node's memory bandwidth is known."
    )
    expected_source: str = Field(
        "", description="Where expectedDecode comes from: peers (how many), own calibration or "
        "0.5 of the ceiling; and the ceiling with how it was predicted (bandwidth / bytes per "
        "token), when known."
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


# Status strings the operator writes from what it saw (a node's, a claim's name; a
# sentence): bounded, so a status stays small whatever the cluster holds (a writer
# cuts to them: a stored status over them reads as none, controller/objects.py).
STATUS_NAME_MAX = 253
STATUS_TEXT_MAX = 1024
STATUS_TIME_MAX = 64
IdleState = Literal["Awake", "Asleep", "Waking"]


class IdleHome(_StatusBase):
    """Where a sleeping replica's weights are: its claim, on the node a local volume pins."""

    replica: Integer = Field(description="Replica index.", ge=0)
    node: str = Field(description="Node the claim's volume is on.",
                      max_length=STATUS_NAME_MAX)
    claim: str = Field(description="The replica's PersistentVolumeClaim.",
                       max_length=STATUS_NAME_MAX)


class IdleWake(_StatusBase):
    """A wake under way or wanted: what it waits for and what it will cost."""

    wanted_at: str = Field("", description="When a wake was first wanted (RFC 3339).",
                           max_length=STATUS_TIME_MAX)
    held: Integer = Field(0, description="Requests the routers hold for it.", ge=0)
    node: str = Field("", description="Node it wakes on.", max_length=STATUS_NAME_MAX)
    reserved: Boolean = Field(
        False, description="Whether that node is kept for it while another model leaves it.")
    message: str = Field("", description="What the wake waits for, or what the next wake "
                         "will do (a spec changed while asleep).", max_length=STATUS_TEXT_MAX)
    cost: str = Field("", description="`none`, or what waking elsewhere than home costs "
                      "(a new claim, a download).", max_length=STATUS_TEXT_MAX)


class IdleLastWake(_StatusBase):
    """The last wake: how long it took, where, and how many held requests it lost."""

    seconds: Number | None = Field(None, description="From wanted to the first Ready "
                                   "replica, in seconds.")
    node: str = Field("", description="Node it woke on.", max_length=STATUS_NAME_MAX)
    warm_cache: Boolean | None = Field(
        None, description="Whether it woke where its weights were (home).")
    expired: Integer = Field(0, description="Held requests whose deadline passed before it "
                             "woke (503 at the router).", ge=0)


class IdleStatus(_StatusBase):
    """A model with `spec.idle`: awake, asleep or waking, since when, and its wakes."""

    state: IdleState = Field(description="Awake, Asleep or Waking.")
    since: str = Field("", description="When it entered that state (RFC 3339).",
                       max_length=STATUS_TIME_MAX)
    resident: Boolean = Field(
        True, description="Whether its pods still run (asleep on demand, until another "
        "model needs the node); false: released, its node given back.")
    last_request_at: str = Field("", description="When its gateways last saw a request "
                                 "(RFC 3339).", max_length=STATUS_TIME_MAX)
    homes: list[IdleHome] = Field(
        default_factory=list, description="Node-pinned claims of its replicas: where a wake "
        "goes first.", max_length=1000)
    wake: IdleWake | None = Field(None, description="A wake under way or wanted.")
    last_wake: IdleLastWake | None = Field(None, description="The last wake.")
    wakes: Integer = Field(0, description="Wakes so far.", ge=0)
    yields: Integer = Field(0, description="Times it gave its node to another model.", ge=0)


class LocalModelStatus(_StatusBase):
    """Observed state of a LocalModel."""

    observed_generation: Integer | None = Field(
        None, description="The spec generation last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Valid, Placed, Ready, Progressing, SlowReplica and Awake (spec.idle); "
        "Reconciling or Stalled while True.",
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
    idle: IdleStatus | None = Field(
        None, description="Sleep and wake, for a model with spec.idle (absent otherwise).")
