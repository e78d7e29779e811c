"""Each engine's adapter (operator/localmodel/engines/<name>/): its tuning part
spells the rules' decisions, its doctor part reads a running engine (here
through a stand-in for its HTTP API; tests/doctor runs the real engines)."""

from __future__ import annotations

import io
import urllib.error
from typing import Any

import pytest

from localmodel import engines
from localmodel.engines import llama_server, ollama
from localmodel.engines.doctor import EngineProcess, EngineReading, LoadedModel
from localmodel.engines.llama_server.tuning import LlamaServerTuning
from localmodel.engines.ollama.tuning import OllamaTuning
from localmodel.engines.registry import ENGINES, engine
from localmodel.rules.model import Serving

pytestmark = pytest.mark.unit

OLLAMA, LLAMA = engine(ollama.NAME), engine(llama_server.NAME)


def test_the_registry_holds_each_engine_by_its_name() -> None:
    assert list(ENGINES) == list(engines.NAMES)  # the shipped ones and any out-of-tree ones
    assert all(engine(name).name == name for name in ENGINES)


# ---- tuning ----------------------------------------------------------------


def test_threads_as_each_engine_reads_them() -> None:
    o, ls = OLLAMA.tuning.threads(4), LLAMA.tuning.threads(4)
    assert (dict(o.env), dict(o.modelfile), dict(o.args)) == (
        {"GOMAXPROCS": "4"}, {"num_thread": "4"}, {})
    assert (dict(ls.args), dict(ls.env), dict(ls.modelfile)) == ({"-t": "4", "-tb": "4"}, {}, {})


SERVING = Serving("m", "m.gguf", context=2048, slots=2, keep_alive="-1", behind_gateway=True)


def test_serving_binds_loopback_behind_the_gateway() -> None:
    assert OLLAMA.tuning.serving(SERVING).env["OLLAMA_HOST"] == f"127.0.0.1:{ollama.PORT}"
    args = LLAMA.tuning.serving(SERVING).args
    assert (args["--host"], args["-c"], args["-np"]) == ("127.0.0.1", "4096", "2")
    assert args["-m"] == f"{llama_server.MODELS_DIR}/m.gguf"


@pytest.mark.parametrize(
    ("flash_attention", "flag", "variable"),
    [("auto", "auto", None), ("enabled", "on", "1"), ("disabled", "off", "0")],
)
def test_flash_attention_and_kv_cache_written_once(
    flash_attention: str, flag: str, variable: str | None
) -> None:
    line = LLAMA.tuning.command_line({"-t": "2", "--metrics": ""}, "q8_0", flash_attention)
    assert line == ("-t", "2", "--metrics", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", flag)
    env = OLLAMA.tuning.environment({"OLLAMA_HOST": "x"}, "q8_0", flash_attention)
    assert env.get("OLLAMA_FLASH_ATTENTION") == variable
    assert env["OLLAMA_KV_CACHE_TYPE"] == "q8_0" and list(env) == sorted(env)
    assert OLLAMA.tuning.command_line({}, "f16", flash_attention) == ()
    assert LLAMA.tuning.environment({"B": "1", "A": "2"}, "f16", flash_attention) == {
        "A": "2", "B": "1"}


def test_what_only_one_engine_has_its_own_part_spells() -> None:
    ollama_tuning, llama_tuning = OllamaTuning(), LlamaServerTuning()
    assert ollama_tuning.safe_cpu_runner((0, 5, 7)) is not None
    assert ollama_tuning.safe_cpu_runner(ollama.CPU_RUNNERS_UNTIL) is None
    for spell in ("metrics_on", "web_ui_off", "slots_endpoint_off"):
        assert getattr(llama_tuning, spell)().args


# ---- doctor ----------------------------------------------------------------


def _http(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("http://engine", code, "status", {}, io.BytesIO())  # type: ignore[arg-type]


def stand_in(answers: dict[str, Any]) -> Any:
    """An engine's HTTP API: path -> JSON answer or the error it raises."""

    def get(path: str, body: Any) -> Any:
        if path not in answers:
            raise urllib.error.URLError("connection refused")
        answer = answers[path]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return get


def test_ollama_reads_its_models_threads_and_environment() -> None:
    api = stand_in({
        ollama.VERSION_PATH: {"version": "0.31.0"},
        ollama.PS_PATH: {"models": [{"name": "q:8b", "size": 5, "context_length": 8192}]},
        ollama.SHOW_PATH: {"parameters": "num_ctx 8192\nnum_thread 3\n"},
    })
    process = EngineProcess(7, ["ollama", "serve"], {"OLLAMA_NUM_PARALLEL": "2"})
    assert OLLAMA.doctor.read(api, process) == EngineReading(
        version="0.31.0",
        models=(LoadedModel("q:8b", 5, 8192),),
        slots=2,
        threads=3,
        threads_source="Modelfile PARAMETER num_thread of q:8b",
    )


def test_llama_server_reads_its_props_and_command_line() -> None:
    api = stand_in({llama_server.PROPS_PATH: {
        "total_slots": 2, "default_generation_settings": {"n_ctx": 4096},
        "model_path": "/models/m.gguf", "build_info": "b1"}})
    reading = LLAMA.doctor.read(api, EngineProcess(9, ["llama-server", "-t", "4"]))
    assert (reading.version, reading.slots, reading.context_per_slot) == ("b1", 2, 4096)
    assert (reading.threads, reading.threads_source) == (4, "command line of pid 9")
    assert reading.models == (LoadedModel("m.gguf", context=4096),)


def test_llama_server_loading_is_a_reading_other_errors_are_not() -> None:
    loading = stand_in({
        llama_server.PROPS_PATH: _http(llama_server.LOADING_STATUS),
        llama_server.HEALTH_PATH: _http(llama_server.LOADING_STATUS),
    })
    assert LLAMA.doctor.read(loading, None).loading
    for answers in ({llama_server.PROPS_PATH: _http(500)}, {llama_server.PROPS_PATH: [1]}, {}):
        with pytest.raises((OSError, ValueError)):
            LLAMA.doctor.read(stand_in(answers), None)


def test_an_engine_that_is_not_there_raises() -> None:
    with pytest.raises((OSError, ValueError)):
        OLLAMA.doctor.read(stand_in({ollama.VERSION_PATH: {"not": "ollama"}}), None)
    with pytest.raises(OSError):
        OLLAMA.doctor.read(stand_in({}), None)


@pytest.mark.parametrize(
    ("image", "name"),
    [
        (ollama.IMAGE, ollama.NAME),
        ("registry.example/OLLAMA/ollama:0.5.7", ollama.NAME),
        (llama_server.IMAGE, llama_server.NAME),
        ("example/llama.cpp:server", llama_server.NAME),
        ("example/llama-server:1", llama_server.NAME),
        ("nginx:1", None),
    ],
)
def test_each_engine_knows_its_images(image: str, name: str | None) -> None:
    """The first engine whose adapter knows the image runs it (engine_pods.py)."""
    found = next((e.name for e in ENGINES.values() if e.doctor.runs_image(image)), None)
    assert found == name


def test_a_pods_container_as_each_engine_reads_it() -> None:
    argv = ["/app/llama-server", "-m", "/models/x.gguf", "--threads=3", "-c", "8192"]
    env = {"OLLAMA_CONTEXT_LENGTH": "4096"}
    assert (LLAMA.doctor.pod_threads(argv, env), LLAMA.doctor.pod_context(argv, env)) == (3, "8192")
    assert LLAMA.doctor.pod_model(argv) == "/models/x.gguf"
    ollama_doctor = OLLAMA.doctor
    assert (ollama_doctor.pod_threads(argv, env), ollama_doctor.pod_context(argv, env)) == (
        None, "4096")
    assert OLLAMA.doctor.pod_model(argv) is None


def test_the_amx_crash_is_ollamas() -> None:
    assert OLLAMA.doctor.amx_fixed_in == ollama.AMX_FIXED_IN and LLAMA.doctor.amx_fixed_in is None
    commands = f"sh -c rm -f {ollama.AMX_LIBRARY}"
    assert OLLAMA.doctor.amx_guarded((0, 31, 0), {}, commands)
    assert not OLLAMA.doctor.amx_guarded((0, 31, 0), {}, "ollama serve")
    assert "OLLAMA_LLM_LIBRARY=cpu_avx2" in OLLAMA.doctor.amx_workaround((0, 5, 7))
