"""engine.name: llama-server rendered: one table per flag and decision.

What the flags mean comes from llama.cpp (common/arg.cpp, tools/server/README.md);
that the rendered command line starts a real llama-server that serves the
model is checked in tests/gateway/test_engine.py, which starts the engine
from these very arguments.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.api import KVCacheType, LocalModel
from localmodel.catalog import lookup
from localmodel.desired import desired_state
from localmodel.engines import llama_server
from localmodel.facts import NodeFacts
from localmodel.rules.memory import memory_decision, model_kv_bytes
from tests.builders import MakeLocalModel, MakeNode, by_kind_name

pytestmark = pytest.mark.unit

SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
URL = "https://models.example/gemma-3-270m-q4_k_m.gguf"
NOW = "2026-12-01T00:00:00Z"


LLAMA = (MakeLocalModel("g").spec(model="gemma3:270m").engine("llama-server").gguf(URL, SHA)
         .cpu(2))
NODE = MakeNode("n1").cpu_flags({"AVX2"})


def render(model: LocalModel, n: NodeFacts | None = None) -> dict[str, Any]:
    result = desired_state([model], [n or NODE.facts()], now=NOW).models[0]
    assert result.replicas, result.status.conditions
    objects = by_kind_name(result.objects)
    pod = objects["Pod/g-0"]
    cs = {c["name"]: c for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]}
    return {
        "objects": objects,
        "pod": pod,
        "containers": cs,
        "engine": cs["llama-server"],
        "status": result.with_status.model_dump(by_alias=True, mode="json")["status"],
        "tuning": result.replicas[0].tuning,
    }


def flags(args: list[str]) -> dict[str, str]:
    """Flag -> value ("" for a switch); a value never starts with '-'."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("-"), args
        assert flag not in out, f"{flag} given twice: {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("-"):
            out[flag], i = args[i + 1], i + 2
        else:
            out[flag], i = "", i + 1
    return out


def engine_flags(model: LocalModel, n: NodeFacts | None = None) -> dict[str, str]:
    return flags(render(model, n)["engine"]["args"])


def decisions(model: LocalModel, n: NodeFacts | None = None) -> dict[str, str]:
    placement = render(model, n)["status"]["placements"][0]
    return {d["rule"]: d["effect"] for d in placement["decisions"]}


@pytest.mark.parametrize(
    ("cpu", "n", "threads", "why"),
    [
        (1, NODE.facts(), 1, "threads=1"),
        (2, NODE.facts(), 2, "threads=2"),
        (8, NODE.facts(), 8, "threads=8"),
        (4, NODE.with_facts(cpuset_cpus=2).facts(), 2, "capped by the cpuset"),
        (4, NODE.with_facts(cgroup_cpu_quota=3.5).facts(), 3, "capped by the cgroup CPU quota"),
    ],
)
def test_threads_and_batch_threads_are_the_cpu_limit(
    cpu: int, n: NodeFacts, threads: int, why: str
) -> None:
    r = render(LLAMA.spec(cpu=cpu).obj(), n)
    f = flags(r["engine"]["args"])
    assert (f["-t"], f["-tb"]) == (str(threads), str(threads))
    assert r["pod"]["metadata"]["annotations"]["localmodel.dev/threads"] == str(threads)
    effects = " ".join(decisions(LLAMA.spec(cpu=cpu).obj(), n).values())
    assert why in effects and f"-t {threads} -tb {threads}" in effects


@pytest.mark.parametrize(
    ("context", "slots", "total"),
    [(8192, 1, 8192), (4096, 2, 8192), (2048, 4, 8192), (512, 64, 32768)],
)
def test_context_is_per_slot_with_explicit_slot_count(context: int, slots: int, total: int) -> None:
    f = engine_flags(LLAMA.spec(context=context, slots=slots, cpu=1).obj())
    # -np always explicit: without it llama-server defaults to 4 slots sharing one cache.
    assert (f["-c"], f["-np"]) == (str(total), str(slots))
    model = LLAMA.spec(context=context, slots=slots, cpu=1).obj()
    effect = decisions(model)["llama-server-context-per-slot"]
    assert f"-c {total} -np {slots}" in effect


@pytest.mark.parametrize("kv", ["f16", "q8_0", "q4_0"])
def test_cache_types_follow_kv_cache(kv: str) -> None:
    f = engine_flags(LLAMA.spec(kvCache=kv).obj())
    assert f["-ctk"] == f["-ctv"] == kv


@pytest.mark.parametrize(
    ("fa", "kv", "flag", "rule_fired"),
    [
        ("auto", "f16", "auto", False),
        ("enabled", "f16", "on", False),
        ("disabled", "f16", "off", False),
        ("auto", "q8_0", "on", True),
        ("auto", "q4_0", "on", True),
        ("enabled", "q4_0", "on", False),
    ],
)
def test_flash_attention_flag_always_has_a_value(
    fa: str, kv: str, flag: str, rule_fired: bool
) -> None:
    model = LLAMA.spec(flashAttention=fa, kvCache=kv).obj()
    args = render(model)["engine"]["args"]
    # -fa takes a value: a bare -fa would swallow the next argument.
    assert args[args.index("-fa") + 1] == flag
    fired = decisions(model).get("kv-cache-quantized-enables-flash-attention")
    assert (fired is not None) is rule_fired
    if fired:
        assert "-fa on" in fired


@pytest.mark.parametrize(
    ("gateway", "host", "no_slots"),
    [(True, "127.0.0.1", False), (False, "0.0.0.0", True)],
)
def test_bind_address_and_slots_endpoint_follow_the_gateway(
    gateway: bool, host: str, no_slots: bool
) -> None:
    model = LLAMA.spec(gateway={"enabled": gateway}).obj()
    f = engine_flags(model)
    assert f["--host"] == host and f["--port"] == str(llama_server.PORT)
    assert ("--no-slots" in f) is no_slots
    assert ("llama-server-private-slots" in decisions(model)) is no_slots


def test_metrics_on_and_web_ui_off() -> None:
    f = engine_flags(LLAMA.obj())
    assert f["--metrics"] == "" and f["--no-webui"] == ""
    d = decisions(LLAMA.obj())
    assert "--metrics" in d["llama-server-metrics"] and d["llama-server-no-webui"] == "--no-webui"


@pytest.mark.parametrize(
    ("gguf", "path"),
    [
        ({"url": URL, "sha256": SHA}, "/models/gemma-3-270m-q4_k_m.gguf"),
        ({"url": "https://h/x?raw=1", "sha256": SHA, "file": "g.gguf"}, "/models/g.gguf"),
    ],
)
def test_model_file_is_on_the_weights_volume(gguf: dict[str, str], path: str) -> None:
    r = render(LLAMA.spec(gguf=gguf).obj())
    f = flags(r["engine"]["args"])
    assert f["-m"] == path and f["--alias"] == "gemma3:270m"
    volumes = {v["name"]: v for v in r["pod"]["spec"]["volumes"]}
    assert set(volumes) == {"weights"}  # no Modelfile ConfigMap for llama-server
    assert volumes["weights"]["persistentVolumeClaim"]["claimName"] == "g-weights-0"
    # The server only reads the volume; the download step writes it.
    assert r["containers"]["llama-server"]["volumeMounts"] == [
        {"name": "weights", "mountPath": "/models", "readOnly": True}]
    assert r["containers"]["download"]["volumeMounts"] == [
        {"name": "weights", "mountPath": "/models"}]
    assert "ConfigMap/g-modelfile" not in r["objects"]
    assert "PersistentVolumeClaim/g-weights-0" in r["objects"]


def test_init_step_downloads_the_url_and_checks_the_checksum() -> None:
    r = render(LLAMA.obj())
    init = r["containers"]["download"]
    assert init["image"] == r["engine"]["image"] == llama_server.IMAGE
    script = init["command"][2]
    assert init["command"][:2] == ["/bin/sh", "-c"]
    assert f"want={SHA}" in script and shlex.quote(URL) in script
    assert "file=/models/gemma-3-270m-q4_k_m.gguf" in script
    assert init["resources"] == r["engine"]["resources"]


@pytest.mark.parametrize(
    ("context", "slots", "kv"),
    [(8192, 1, "f16"), (4096, 2, "f16"), (2048, 4, "q8_0"), (32768, 1, "q4_0")],
)
def test_memory_is_sized_for_context_per_slot(context: int, slots: int, kv: str) -> None:
    r = render(LLAMA.spec(context=context, slots=slots, kvCache=kv).obj())
    shape = lookup("gemma3:270m")
    assert shape is not None

    kv_bytes = model_kv_bytes(shape, context, slots, KVCacheType(kv))
    # promptCache auto: a quarter of the KV cache, in whole MiB, told as --cache-ram
    cache_mib = -(-(kv_bytes // 4) // 2**20)
    # flash attention: auto (f16) counts as on, and a quantized cache turns it on
    want = memory_decision(shape, context=context, slots=slots,
                           kv_cache=KVCacheType(kv), flash_attention=True,
                           prompt_cache_bytes=cache_mib * 2**20).total
    t = r["tuning"]
    assert t.memory_bytes == want and t.memory_parts["kvCache"] == kv_bytes
    assert t.args[t.args.index("--cache-ram") + 1] == str(cache_mib)
    limits = r["engine"]["resources"]["limits"]
    assert r["engine"]["resources"]["requests"] == limits  # Guaranteed QoS
    assert limits["cpu"] == "2"
    model = LLAMA.spec(context=context, slots=slots, kvCache=kv).obj()
    effect = decisions(model)["memory-from-weights-and-kv"]
    assert f"({context}x{slots} tokens, {kv}" in effect


@pytest.mark.parametrize(
    ("gateway", "readiness", "service_target"),
    [(True, False, "http"), (False, True, "engine")],
)
def test_health_probes(gateway: bool, readiness: bool, service_target: str) -> None:
    r = render(LLAMA.spec(gateway={"enabled": gateway}).obj())
    e = r["engine"]
    args = e["args"]
    host = args[args.index("--host") + 1]
    for probe in ("startupProbe", "livenessProbe"):
        if gateway:
            # Bound to loopback: the kubelet dials the pod IP, so the probe runs inside.
            assert host == "127.0.0.1"
            assert e[probe]["exec"]["command"][-1] == (
                f"http://127.0.0.1:{llama_server.PORT}{llama_server.HEALTH_PATH}")
            assert e[probe]["exec"]["command"][:2] == ["curl", "-fsS"]
        else:
            assert host == "0.0.0.0"
            assert e[probe]["httpGet"] == {"path": llama_server.HEALTH_PATH, "port": "engine"}
    # /health is 503 while loading: the startup probe allows a long load.
    assert e["startupProbe"]["failureThreshold"] * e["startupProbe"]["periodSeconds"] >= 1800
    assert ("readinessProbe" in e) is readiness
    if readiness:
        assert e["readinessProbe"]["httpGet"]["path"] == llama_server.HEALTH_PATH
    ports = r["objects"]["Service/g"]["spec"]["ports"]
    assert ports[0]["targetPort"] == service_target
    assert ("gateway" in r["containers"]) is gateway


def test_gateway_fronts_llama_server() -> None:
    r = render(LLAMA.spec(slots=2, context=4096, cpu=1).obj())
    env = {e["name"]: e["value"] for e in r["containers"]["gateway"]["env"]}
    assert env["LOCALMODEL_GATEWAY_UPSTREAM"] == f"http://127.0.0.1:{llama_server.PORT}"
    assert env["LOCALMODEL_GATEWAY_ENGINE"] == "llama-server"
    assert (env["LOCALMODEL_GATEWAY_SLOTS"], env["LOCALMODEL_GATEWAY_THREADS"]) == ("2", "1")
    assert env["LOCALMODEL_GATEWAY_CONTEXT"] == "4096"


def test_no_ollama_settings_reach_llama_server() -> None:
    r = render(LLAMA.spec(env=[{"name": "LLAMA_LOG_VERBOSITY", "value": "1"}]).obj())
    env = {e["name"]: e["value"] for e in r["engine"]["env"]}
    assert env == {"LLAMA_LOG_VERBOSITY": "1"}
    assert r["tuning"].modelfile == {} and r["tuning"].remove_libraries == ()


def test_status_carries_the_same_kind_of_decisions_as_ollama() -> None:
    llama = render(LLAMA.spec(cpu=2).obj())["status"]["placements"][0]
    ollama_lm = MakeLocalModel("o").spec(model="gemma3:270m", cpu=2).obj()
    ollama = desired_state([ollama_lm], [NODE.facts()], now=NOW).models[0]
    ollama_rules = {d.rule for d in ollama.replicas[0].tuning.decisions}
    llama_rules = {d["rule"] for d in llama["decisions"]}
    shared = {"threads-from-cpu-limit", "memory-from-weights-and-kv", "guaranteed-qos"}
    assert shared | {"weights-volume"} <= llama_rules & ollama_rules
    assert all(d["reason"] and d["source"] and d["effect"] for d in llama["decisions"])
    assert (llama["threads"], llama["cpu"]) == (2, 2)
    assert shlex.split(llama["settings"]["args"])[:4] == ["-t", "2", "-tb", "2"]
    assert not any(k.startswith("OLLAMA_") for k in llama["settings"])


def test_ollama_rules_never_fire_for_llama_server_even_on_amx_nodes() -> None:
    amx = NODE.cpu_flags({"AMXTILE", "AMXINT8", "AVX2"}).facts()
    assert amx.has("AMXTILE")
    fired = set(decisions(LLAMA.engine("llama-server", version="0.31.0").obj(), amx))
    assert not fired & {"amx-guard", "amx-remove-cpu-variant", "one-model-per-pod"}


@settings(max_examples=60, deadline=None)
@given(
    cpu=st.integers(1, 16),
    context=st.sampled_from([512, 2048, 8192, 131072]),
    slots=st.integers(1, 8),
    kv=st.sampled_from(["f16", "q8_0", "q4_0"]),
    fa=st.sampled_from(["auto", "enabled", "disabled"]),
    gateway=st.booleans(),
)
def test_every_rendered_command_line_is_well_formed(
    cpu: int, context: int, slots: int, kv: str, fa: str, gateway: bool
) -> None:
    if kv != "f16" and fa == "disabled":
        return  # refused by the API
    model = LLAMA.spec(
        cpu=cpu,
        context=context,
        slots=slots,
        kvCache=kv,
        flashAttention=fa,
        gateway={"enabled": gateway},
    ).obj()
    args = render(model, NODE.cpus(32).facts())["engine"]["args"]
    f = flags(args)  # every flag once, every value after its flag
    assert f["-fa"] in ("on", "off", "auto")
    assert int(f["-c"]) == context * slots and int(f["-np"]) == slots
    assert f["-t"] == f["-tb"] == str(cpu)
    if kv != "f16":
        assert f["-fa"] == "on"  # a quantized V cache needs flash attention


def test_an_idle_model_is_probed_every_second_and_as_patiently() -> None:
    """A caller waits on an idle model's wake: its engine's startup probe and
    the gateway's readiness probe (idle needs the gateway) ask every second
    (podspec.probe_periods), each failing as long as before before the kubelet
    acts (startup 30 min, readiness 15 s); liveness as before."""
    plain = render(LLAMA.obj())
    idle = render(LLAMA.spec(idle={"after": "5m"}).obj())

    def patience(probe: dict[str, Any]) -> int:
        return int(probe.get("failureThreshold", 3) * probe["periodSeconds"])

    for container, probe in (("llama-server", "startupProbe"), ("gateway", "readinessProbe")):
        fast, slow = (r["containers"][container][probe] for r in (idle, plain))
        assert (fast["periodSeconds"], slow["periodSeconds"]) == (1, 5), (container, probe)
        assert patience(fast) == patience(slow) >= 15, (container, probe)
    assert idle["engine"]["livenessProbe"] == plain["engine"]["livenessProbe"]
    assert idle["pod"]["metadata"]["annotations"] != plain["pod"]["metadata"]["annotations"]
