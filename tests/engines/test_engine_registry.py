"""The engine registry: engines are found, not listed (operator/localmodel/engines/).

The shipped engines are the subpackages of `localmodel.engines`, in their
facts' `ORDER`; an out-of-tree engine is a package named by
`LOCALMODEL_ENGINE_PACKAGES`. The facts registry (which the gateway imports)
and the adapter registry name the same engines in the same order; the API
accepts an out-of-tree engine, while the CRD and docs/rules.md list only the
shipped ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localmodel import engines
from localmodel.api import EngineName
from localmodel.engines import ENV, FACTS, NAMES, SHIPPED, EngineRegistryError, registered
from localmodel.engines.registry import ENGINES, OWN_RULES, SHIPPED_NAMES
from localmodel.rules.table import RULES

ROOT = Path(__file__).resolve().parents[2]
ENGINES_DIR = ROOT / "operator" / "localmodel" / "engines"

pytestmark = pytest.mark.unit

# A planted out-of-tree engine: its facts, an adapter borrowing a shipped
# engine's parts (the registry checks the shape, not the parts), one rule of
# its own at the last stage.
PLANTED = {
    "__init__.py": '''
NAME = "planted"
TITLE = "Planted"
SUMMARY = "a test-only engine"
IMAGE = "example.org/planted:1.0.0"
PORT = 18080
MANAGED_ENV = ("PLANTED_THREADS",)
NEEDS_GGUF = True
KEEP_ALIVE = False
AMX_LIBRARIES = ()
SERVING_PATH = "/ready"
LOAD_PATH = None
CALIBRATION_PATH = "/v1/chat/completions"
CALIBRATION_BODY = {}
''',
    "adapter.py": '''
from localmodel.engines.adapter import Engine
from localmodel.engines.llama_server.doctor import LlamaServerDoctor
from localmodel.engines.llama_server.pod import LlamaServerPod
from localmodel.engines.llama_server.tuning import LlamaServerTuning

ADAPTER = Engine("planted", LlamaServerPod(), LlamaServerTuning(), LlamaServerDoctor())
''',
    "rules.py": '''
from localmodel.rules.model import Rule, Stage

def _mark(ctx, s):
    s.env["PLANTED_THREADS"] = str(s.threads)
    return "PLANTED_THREADS=threads"

RULES = {Stage.SWITCHES: (Rule(id="planted-threads", title="t", effect="e", reason="r",
                                source="docs/engine-facts.md", apply=_mark),)}
''',
}


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A directory holding the package `planted_engine` (put it on the path)."""
    package = tmp_path / "planted_engine"
    package.mkdir()
    for name, text in PLANTED.items():
        (package / name).write_text(text.lstrip())
    return tmp_path


def test_the_shipped_engines_are_every_subpackage_in_their_order() -> None:
    found = sorted(p.name for p in ENGINES_DIR.iterdir() if (p / "__init__.py").is_file())
    assert sorted(engines.package(f).rsplit(".", 1)[1] for f in SHIPPED) == found
    orders = [f.ORDER for f in SHIPPED]  # type: ignore[attr-defined]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert engines.DEFAULT is SHIPPED[0]


def test_the_facts_and_the_adapters_name_the_same_engines_in_the_same_order() -> None:
    assert tuple(ENGINES) == NAMES == tuple(f.NAME for f in FACTS)
    assert tuple(OWN_RULES) == NAMES
    assert all(ENGINES[name].name == name for name in NAMES)
    assert [e.value for e in EngineName] == list(NAMES)
    assert tuple(f.NAME for f in SHIPPED) == SHIPPED_NAMES


def test_each_rule_of_an_engine_s_package_is_that_engine_s_alone() -> None:
    own = {r.id: name for name, stages in OWN_RULES.items() for rs in stages.values() for r in rs}
    for rule in RULES:
        want = {own[rule.id]} if rule.id in own else set(NAMES)
        assert rule.engines == want, rule.id


def test_no_variable_registers_the_shipped_engines_only() -> None:
    assert registered({}) == SHIPPED
    assert registered({ENV: " , "}) == SHIPPED


def test_a_named_package_comes_after_the_shipped_engines(
    planted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(planted))
    found = registered({ENV: "planted_engine"})
    assert [f.NAME for f in found] == [*(f.NAME for f in SHIPPED), "planted"]


@pytest.mark.parametrize(("value", "says"), [
    ("no_such_engine_package", "engine package 'no_such_engine_package' cannot be imported"),
    ("json", "engine package 'json' declares no NAME"),
    ("localmodel.engines.ollama", "engine name(s) ollama registered twice"),
])
def test_a_bad_package_name_is_an_error_naming_the_variable_and_the_package(
    value: str, says: str
) -> None:
    with pytest.raises(EngineRegistryError) as caught:
        registered({ENV: value})
    assert str(caught.value).startswith(f"{ENV}: {says}")


# What a process with the planted engine registered sees: the API takes it,
# the evaluator runs its rule, the CRD and the rules' docs are the shipped ones.
_PROBE = '''
import json, sys
from localmodel.api import EngineName, parse_local_model
from localmodel.crd import crd_yaml
from localmodel.engines.registry import ENGINES
from localmodel.rules.docs import rules_markdown
from localmodel.rules.evaluate import tune
from localmodel.facts import NodeFacts
lm = parse_local_model({"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
    "metadata": {"name": "m", "namespace": "ai"},
    "spec": {"model": "qwen3:1.7b", "cpu": 2, "engine": {"name": "planted"},
             "gguf": {"url": "https://x.example/m.gguf", "sha256": "0" * 64}}})
from localmodel.errors import InvalidObject
try:
    parse_local_model({"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
        "metadata": {"name": "m", "namespace": "ai"},
        "spec": {"model": "qwen3:1.7b", "engine": {"name": "planted"},
                 "gguf": {"url": "https://x.example/m.gguf", "sha256": "0" * 64},
                 "env": [{"name": "PLANTED_THREADS", "value": "9"}]}})
    refused = "no"
except InvalidObject as e:
    refused = str(e)
tuning = tune(lm.spec, NodeFacts(name="n", allocatable_cpu_milli=4000,
                                 allocatable_memory_bytes=64 * 2**30), 2)
print(json.dumps({"names": [e.value for e in EngineName], "adapters": list(ENGINES),
                  "refused": refused,
                  "decisions": [d.rule for d in tuning.decisions], "env": tuning.env,
                  "crd": crd_yaml(), "rules": rules_markdown()}))
'''


def test_a_registered_out_of_tree_engine_validates_and_tunes_but_stays_out_of_the_crd(
    planted: Path,
) -> None:
    env = {**os.environ, ENV: "planted_engine",
           "PYTHONPATH": os.pathsep.join([str(planted), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, check=True)
    seen = json.loads(done.stdout)
    # The variable names this engine alone (not the session's test-only ones).
    assert seen["names"] == seen["adapters"] == [*SHIPPED_NAMES, "planted"]
    assert "PLANTED_THREADS" in seen["refused"]  # its managed variable, refused in spec.env
    assert seen["decisions"][-1] == "planted-threads" and seen["env"]["PLANTED_THREADS"] == "2"
    crd = (ROOT / "crds" / "localmodel.dev_localmodels.yaml").read_text()
    assert seen["crd"] == crd and "planted" not in crd
    assert seen["rules"] == (ROOT / "docs" / "rules.md").read_text()


def test_the_gateway_loads_the_facts_of_a_registered_engine_and_no_adapter(
    planted: Path,
) -> None:
    """The gateway runs in the pod and reads facts only, an out-of-tree engine's too."""
    env = {**os.environ, ENV: "planted_engine",
           "PYTHONPATH": os.pathsep.join([str(planted), os.environ.get("PYTHONPATH", "")])}
    probe = ("import json, sys, localmodel.gateway.server\n"
             "print(json.dumps(sorted(m for m in sys.modules if 'engine' in m)))")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, check=True)
    loaded = json.loads(done.stdout)
    packages = {engines.package(f) for f in SHIPPED} | {"planted_engine"}
    # The facts, and the lookup of each engine's timing reader (engines/timings.py;
    # a timing module imports only gateway_contract/timing.py): no adapter.
    facts = {"localmodel.engines", *packages}
    readers = {"localmodel.engines.timings", *(f"{p}.timing" for p in packages)}
    assert facts <= set(loaded) <= facts | readers
