"""Who may reach a model: the NetworkPolicy the renderer adds per model
(`spec.gateway.networkPolicy`, opt-in; the operator's default from its chart).
Pure data. See docs/security.md, Who is asking."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from localmodel.api.checks import DNS1123_LABEL, LABEL_VALUE, QUALIFIED_NAME, ApiModel, Boolean


class NetworkPolicySpec(ApiModel):
    """A NetworkPolicy for the model's pods: the port the Service targets
    admits only the namespaces (and pods) named here; the gateway's admin port
    (metrics, speed, ledger) only the operator's namespace and those the
    operator was told (its --admin-namespaces); nothing else reaches the pods."""

    enabled: Boolean | None = Field(
        None,
        description="Add the NetworkPolicy; absent: the operator's default (the chart's "
        "networkPolicy.enabled).",
    )
    namespaces: list[Annotated[str, DNS1123_LABEL]] = Field(
        default_factory=list,
        description="Namespaces whose pods may call the model; empty: the model's own "
        "namespace only.",
        max_length=64,
    )
    pod_labels: Annotated[dict[str, Annotated[str, LABEL_VALUE]], QUALIFIED_NAME.keys] = Field(
        default_factory=dict,
        description="Labels a calling pod must carry (in those namespaces); empty: any pod.",
        max_length=16,
    )
