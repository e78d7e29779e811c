"""Tuning, for every engine: each rule of the table the engine takes part in
fires in one of the suite's scenarios, and what it decided reaches the pod as
the engine spells it (its arguments, variables, Modelfile or config entries in
the rendered objects, and the objects differ without the rule), or, for a rule
that only records (it changes nothing it decides), its decision is in status
and the objects are the same without it."""

from __future__ import annotations

import copy
import dataclasses
import importlib
from typing import Any

import pytest

from localmodel.catalog import lookup
from localmodel.planner import cpu_limit, replica_cpus
from localmodel.rules.evaluate import engine_version
from localmodel.rules.model import Context, Rule, TuningDraft
from localmodel.rules.table import RULES
from tests.conformance.subjects import NAMES, Rendered, Scenario, render, scenarios

pytestmark = pytest.mark.unit

CASES = [(name, rule.id) for name in NAMES for rule in RULES if name in rule.engines]
BY_ID = {rule.id: rule for rule in RULES}
# The module (`localmodel.rules.evaluate` is also the function's name there).
EVALUATION = importlib.import_module("localmodel.rules.evaluate")


def _draft_steps(scenario: Scenario, name: str) -> dict[str, dict[str, Any]]:
    """Rule id -> what it changed of the draft (field -> new value), stepping
    the table as `rules.evaluate` does, for the scenario's one replica."""
    spec, node = scenario.model(name).obj().spec, scenario.node.facts()
    assert isinstance(spec.cpu, int)
    ctx = Context(spec=spec, node=node, cpu=replica_cpus(cpu_limit(node), spec.cpu),
                  shape=lookup(spec.model, spec.model_info), version=engine_version(spec))
    draft, changes = TuningDraft(), {}
    for rule in RULES:
        if not rule.matches(ctx):
            continue
        before = copy.deepcopy(draft)
        if rule.apply(ctx, draft) is None:
            continue
        changes[rule.id] = {
            f.name: _changed(getattr(before, f.name), getattr(draft, f.name))
            for f in dataclasses.fields(draft)
            if getattr(draft, f.name) != getattr(before, f.name) and f.name != "warnings"
        }
    return changes


def _changed(before: Any, after: Any) -> Any:
    """What a step changed of one draft field: of a mapping, the entries it
    wrote; else the new value."""
    if isinstance(after, dict):
        return {k: v for k, v in after.items() if before.get(k) != v}
    return after


def _spelled(changed: dict[str, Any]) -> list[tuple[str, str]]:
    """The (key, value) entries a rule's step wrote into args, env or the Modelfile."""
    return [(key, value) for part in ("args", "env", "modelfile")
            for key, value in changed.get(part, {}).items()]


def _without(monkeypatch: pytest.MonkeyPatch, rule: Rule, scenario: Scenario,
             name: str) -> Rendered | None:
    """The scenario rendered with the table minus `rule` (None: it cannot be)."""
    with monkeypatch.context() as patched:
        patched.setattr(EVALUATION, "RULES", tuple(r for r in RULES if r is not rule))
        try:
            return render(scenario.model(name), scenario.node)
        except (AssertionError, ValueError, KeyError, TypeError):
            return None


def _firing(name: str, rule_id: str) -> list[tuple[Scenario, Rendered]]:
    out = []
    for scenario in scenarios(name):
        rendered = render(scenario.model(name), scenario.node)
        if rule_id in rendered.decisions():
            out.append((scenario, rendered))
    return out


@pytest.mark.parametrize(("name", "rule_id"), CASES)
def test_every_rule_an_engine_takes_part_in_reaches_its_pod(
        name: str, rule_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rule = BY_ID[rule_id]
    firing = _firing(name, rule_id)
    if not firing:
        # A rule no scenario fires for this engine must be one whose condition
        # only another engine's rules make true (a guard's follow-up): the
        # scenarios do fire it, for an engine it is also for.
        others = [n for n in NAMES if n != name and n in rule.engines and _firing(n, rule_id)]
        assert others, f"no scenario fires rule {rule_id} for {name}: add one to SCENARIOS"
        return
    # A later rule may overwrite what this one wrote (a cap over the threads):
    # it must reach the pod in one of the scenarios it fires in.
    misses = [_miss(monkeypatch, rule, scenario, rendered, name)
              for scenario, rendered in firing]
    assert "" in misses, misses


def _miss(monkeypatch: pytest.MonkeyPatch, rule: Rule, scenario: Scenario, rendered: Rendered,
          name: str) -> str:
    """Why the rule's decision does not show in this scenario's objects ("": it does)."""
    changed = _draft_steps(scenario, name).get(rule.id, {})
    without = _without(monkeypatch, rule, scenario, name)
    where = f"{name}, scenario {scenario.name}, rule {rule.id}"
    if not changed:  # it records only
        same = without is not None and without.text() == rendered.text()
        return "" if same else f"{where}: records only, yet the objects differ without it"
    text = rendered.text()
    for key, value in _spelled(changed):
        if key not in text or (value and value not in text):
            return f"{where}: {key}={value!r} is not in the objects"
    if without is not None and without.text() == rendered.text():
        return f"{where}: the objects are the same without the rule"
    return ""


def test_every_rule_fires_in_some_scenario_for_some_engine() -> None:
    fired = {rule_id for name in NAMES for s in scenarios(name)
             for rule_id in render(s.model(name), s.node).decisions()}
    shipped_rules = {rule.id for rule in RULES if set(rule.engines) & set(NAMES)}
    assert shipped_rules - fired == set()
