"""The LocalModel API (pure data). Import from here.

The spec (`spec.py`; `spec.idle` in `idle.py`), the status (`status.py`) and
the cross-field rules (`rules.py`) of `localmodel.dev/v1alpha1`, the object that joins them
(`localmodel.py`), spec.engine as the engines' facts describe it
(`engine.py`), and the version-independent machinery: field checks, the model
base and cross-field rules (`checks.py`); `parse.py` turns any input into a
LocalModel or every field error.
"""

from localmodel.api.engine import DEFAULT_IMAGES, EngineName
from localmodel.api.idle import AwakeWindow, IdleSpec
from localmodel.api.localmodel import LocalModel, ObjectMeta
from localmodel.api.model_info import ModelInfo
from localmodel.api.parse import parse_local_model
from localmodel.api.rules import MANAGED_ENV
from localmodel.api.spec import (
    GGUF,
    EngineSpec,
    EnvVar,
    FlashAttention,
    Gateway,
    KVCacheType,
    LocalModelSpec,
    Overflow,
    Placement,
    SecretKeyRef,
    Storage,
)
from localmodel.api.status import (
    Condition,
    ConditionStatus,
    DecisionStatus,
    IdleHome,
    IdleLastWake,
    IdleStatus,
    IdleWake,
    LocalModelStatus,
    PlacementStatus,
    SpeedStatus,
)
from localmodel.api.toleration import Toleration, TolerationOperator

__all__ = [
    "DEFAULT_IMAGES",
    "GGUF",
    "MANAGED_ENV",
    "AwakeWindow",
    "Condition",
    "ConditionStatus",
    "DecisionStatus",
    "EngineName",
    "EngineSpec",
    "EnvVar",
    "FlashAttention",
    "Gateway",
    "IdleHome",
    "IdleLastWake",
    "IdleSpec",
    "IdleStatus",
    "IdleWake",
    "KVCacheType",
    "LocalModel",
    "LocalModelSpec",
    "LocalModelStatus",
    "ModelInfo",
    "ObjectMeta",
    "Overflow",
    "Placement",
    "PlacementStatus",
    "SecretKeyRef",
    "SpeedStatus",
    "Storage",
    "Toleration",
    "TolerationOperator",
    "parse_local_model",
]
