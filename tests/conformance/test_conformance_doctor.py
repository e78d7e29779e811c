"""Doctor, for every engine: doctor's own reading of pods (`engine_pods`)
recognises the engine in its rendered pod (by its image, no other engine
claiming it), with the threads, context and model the rules decided; the
engine's doctor part reads what its container sets itself; on an AMX node it
recognises the guard the rules put in (and, for an engine with an AMX crash,
its absence); and an engine that does not answer is never read as one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from localmodel.engine_pods import engine_pods
from localmodel.rules.evaluate import engine_version
from tests.conformance.subjects import (
    AMX_FLAGS,
    NAMES,
    NODE,
    adapter,
    base_model,
    engine_facts,
    render,
    scenarios,
)

pytestmark = pytest.mark.unit


def _scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    """The rendered pod as the API server holds it once bound to its node."""
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = pod["metadata"]["annotations"]["localmodel.dev/node"]
    bound["status"] = {"phase": "Running"}
    return bound


def _argv_env(container: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    argv = [str(a) for a in [*container.get("command", []), *container.get("args", [])]]
    return argv, {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.parametrize("name", NAMES)
def test_doctor_finds_the_engine_its_threads_context_and_model_in_its_pod(name: str) -> None:
    made = base_model(name)
    rendered = render(made)
    [found] = engine_pods([_scheduled(rendered.pod)])
    [placement] = rendered.status["placements"]
    assert found.engine == name and found.ours and found.gateway
    assert found.threads == placement["threads"]
    assert found.context == made.obj().spec.context
    assert found.model == made.obj().spec.model


@pytest.mark.parametrize("name", NAMES)
def test_each_engine_knows_its_own_image_and_no_other_engines(name: str) -> None:
    assert adapter(name).doctor.runs_image(engine_facts(name).IMAGE)
    for other in NAMES:
        if other != name:
            assert not adapter(name).doctor.runs_image(engine_facts(other).IMAGE), other


@pytest.mark.parametrize("name", NAMES)
def test_the_engines_doctor_reads_what_its_container_sets(name: str) -> None:
    made = base_model(name).spec(gateway={"enabled": False})
    rendered = render(made)
    [found] = engine_pods([_scheduled(rendered.pod)])
    spec = made.obj().spec
    container = next(c for c in rendered.pod["spec"]["containers"] if c["name"] == found.container)
    argv, env = _argv_env(container)
    doctor = adapter(name).doctor
    threads = doctor.pod_threads(argv, env)
    assert threads in (None, rendered.status["placements"][0]["threads"])
    context = doctor.pod_context(argv, env)
    assert context is None or int(context) in (spec.context, spec.context * spec.slots)
    model = doctor.pod_model(argv)
    assert model is None or spec.model in model or (
        spec.gguf is not None and spec.gguf.file_name() in model)
    assert found.context in (spec.context, None) or found.context == spec.context * spec.slots


@pytest.mark.parametrize("name", NAMES)
def test_doctor_sees_the_amx_guard_the_rules_put_in(name: str) -> None:
    doctor = adapter(name).doctor
    amx = [s for s in scenarios(name) if s.node.facts().cpu_flags == frozenset(AMX_FLAGS)]
    assert amx
    for scenario in amx:
        made = scenario.model(name)
        [found] = engine_pods([_scheduled(render(made, scenario.node).pod)])
        version = engine_version(made.obj().spec)
        assert doctor.amx_guarded(version, found.env, found.commands), scenario.name
    if doctor.amx_fixed_in is None:
        return  # no build of it crashes: nothing to miss
    # The same old versions on a node without AMX: no guard, and doctor says so.
    for scenario in amx:
        made = scenario.model(name)
        version = engine_version(made.obj().spec)
        if version is None or version >= doctor.amx_fixed_in or scenario.safe_cpu_path:
            continue
        [found] = engine_pods([_scheduled(render(made, NODE).pod)])
        assert not doctor.amx_guarded(version, found.env, found.commands), scenario.name


def _nothing_answers(path: str, body: Any) -> Any:
    raise ConnectionRefusedError(f"nothing listens for {path}")


@pytest.mark.parametrize("name", NAMES)
def test_an_engine_that_does_not_answer_is_not_read_as_one(name: str) -> None:
    with pytest.raises((OSError, ValueError)):
        adapter(name).doctor.read(_nothing_answers, None)
