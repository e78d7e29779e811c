"""Tuning rules: data with sources, and a small ordered evaluator."""

from localmodel.rules.evaluate import (
    engine_version,
    evaluate,
    problems,
    shape_problems,
    tune,
)
from localmodel.rules.model import Decision, Rule, Tuning
from localmodel.rules.table import RULES, RULES_BY_ID

__all__ = [
    "RULES",
    "RULES_BY_ID",
    "Decision",
    "Rule",
    "Tuning",
    "engine_version",
    "evaluate",
    "problems",
    "shape_problems",
    "tune",
]
