"""The LocalModel object (`localmodel.dev/v1alpha1`): apiVersion and kind, the
metadata the operator reads, the spec (`localmodel.api.spec`) and the status
(`localmodel.api.status`)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from localmodel.api.checks import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    LABEL_VALUE,
    QUALIFIED_NAME,
    ApiModel,
    Integer,
    NameFormat,
)
from localmodel.api.spec import LocalModelSpec
from localmodel.api.status import LocalModelStatus

# metadata.name becomes a Service name (DNS-1035: a letter first), a label value and the
# stem of `<name>-weights-<replica>` and `<name>-modelfile`: 52 leaves room for the suffixes.
OBJECT_NAME = NameFormat(DNS1035_LABEL.title, DNS1035_LABEL.regex, 52)


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


class LocalModel(ApiModel):
    """A local LLM served on CPU nodes, tuned per node."""

    # Required, as the API server requires them: a manifest without them cannot be applied.
    api_version: Literal["localmodel.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["LocalModel"]
    metadata: ObjectMeta
    spec: LocalModelSpec
    status: LocalModelStatus | None = None

    @cached_property
    def key(self) -> str:
        """"namespace/name", worked out once per object (passes read it for every
        model, several times): `model_copy` is the only way to another metadata."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False
                   ) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("key", None)  # the copy's own metadata: its key again
        return copied
