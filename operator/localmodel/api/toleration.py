"""A Kubernetes toleration in the LocalModel spec (`spec.placement.tolerations`),
as a pydantic model: its fields' checks and its cross-field rules
(`rules.TOLERATION_RULES`). Pure data; `spec.py` uses it."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, model_validator

from localmodel.api.checks import (
    LABEL_VALUE,
    QUALIFIED_NAME,
    ApiModel,
    Integer,
    NameFormat,
    enforce,
)
from localmodel.api.rules import TOLERATION_RULES

TOLERATION_KEY = NameFormat(
    QUALIFIED_NAME.title,
    QUALIFIED_NAME.regex,
    QUALIFIED_NAME.max_length,
    prefix_max=QUALIFIED_NAME.prefix_max,
    allow_empty=True,
)


# How a toleration matches a taint's value. (No docstring: the CRD would carry it.)
class TolerationOperator(StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


# What a taint does to pods that do not tolerate it.
# (No docstring: the CRD would carry it.)
class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(ApiModel):
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
