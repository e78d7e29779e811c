"""Flags and LOCALMODEL_GATEWAY_* environment variables."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from localmodel.engines import ollama
from localmodel.gateway.cli import loop_factory, run_cli
from localmodel.gateway.config import ConfigError, parse_config
from localmodel.gateway_contract import GatewayConfig, env_name
from tests.harness.processes import free_port, http_ok, localmodel_process


def test_defaults_match_the_renderer_contract() -> None:
    config = parse_config([], {})
    assert config == GatewayConfig()
    assert (config.upstream, config.engine) == (f"http://127.0.0.1:{ollama.PORT}", "ollama")
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 8080)
    assert (config.slots, config.max_queue, config.deadline) == (1, 16, 600.0)
    assert (config.max_tokens, config.keep_alive) == (2048, "-1")


def test_environment_sets_every_flag_and_flags_win() -> None:
    env = {
        "LOCALMODEL_GATEWAY_UPSTREAM": "http://127.0.0.1:9000/",
        "LOCALMODEL_GATEWAY_ENGINE": "llama-server",
        "LOCALMODEL_GATEWAY_LISTEN": "127.0.0.1:9999",
        "LOCALMODEL_GATEWAY_MODEL": "qwen3:1.7b",
        "LOCALMODEL_GATEWAY_SLOTS": "3",
        "LOCALMODEL_GATEWAY_THREADS": "4",
        "LOCALMODEL_GATEWAY_CONTEXT": "8192",
        "LOCALMODEL_GATEWAY_MAX_QUEUE": "0",
        "LOCALMODEL_GATEWAY_DEADLINE": "30.5",
        "LOCALMODEL_GATEWAY_MAX_TOKENS": "512",
        "LOCALMODEL_GATEWAY_KEEP_ALIVE": "5m",
    }
    config = parse_config(["--slots", "2", "--threads=8"], env)
    assert config.upstream == "http://127.0.0.1:9000"
    assert config.engine == "llama-server"
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9999)
    assert config.model == "qwen3:1.7b"
    assert config.slots == 2  # flag beats env
    assert config.threads == 8
    assert config.context == 8192
    assert config.max_queue == 0
    assert config.deadline == 30.5
    assert config.max_tokens == 512
    assert config.keep_alive == "5m"


def test_env_name_upper_cases_and_replaces_dashes() -> None:
    assert env_name("max-queue") == "LOCALMODEL_GATEWAY_MAX_QUEUE"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--slots", "0"], "slots"),
        (["--slots", "two"], "slots"),
        (["--threads", "-1"], "threads"),
        (["--context", "1.5"], "context"),
        (["--max-queue", "-3"], "max-queue"),
        (["--deadline", "0"], "deadline"),
        (["--deadline", "soon"], "deadline"),
        (["--max-tokens", "0"], "max-tokens"),
        (["--engine", "vllm"], "engine"),
        (["--upstream", f"127.0.0.1:{ollama.PORT}"], "upstream"),
        (["--listen", "8080"], "listen"),
        (["--listen", "host:http"], "listen"),
        (["--keep-alive", " "], "keep-alive"),
        (["--event-loop", "trio"], "event-loop"),
        (["--bogus", "1"], "bogus"),
        (["--slots"], "slots"),
    ],
)
def test_bad_values_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(argv, {})
    assert info.value.flag == flag
    assert f"--{flag}" in str(info.value)


def test_bad_environment_value_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--max-queue"):
        parse_config([], {"LOCALMODEL_GATEWAY_MAX_QUEUE": "lots"})


def test_event_loop_flag_and_choice() -> None:
    assert parse_config([], {}).event_loop == "asyncio"
    assert parse_config([], {"LOCALMODEL_GATEWAY_EVENT_LOOP": "auto"}).event_loop == "auto"
    assert loop_factory("asyncio") == (None, "asyncio")
    factory, name = loop_factory("auto")
    try:
        import uvloop  # noqa: F401
    except ImportError:
        assert (factory, name) == (None, "asyncio")  # auto falls back
        with pytest.raises(ImportError):
            loop_factory("uvloop")
    else:
        assert name == "uvloop" and factory is not None
        loop = factory()
        try:
            assert type(loop).__module__.startswith("uvloop")
        finally:
            loop.close()


def test_cli_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--slots", "none"]) == 2
    assert "--slots" in capsys.readouterr().err


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def test_cli_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--help"]) == 0
    assert "--max-queue" in capsys.readouterr().out


def test_localmodel_gateway_serves_from_env_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The renderer's contract end to end: `localmodel gateway` configured only
    by LOCALMODEL_GATEWAY_* variables answers /healthz and /slots, and exits 0
    on SIGTERM."""
    port, admin = free_port(), free_port()
    env = dict(os.environ)
    env.update(
        LOCALMODEL_GATEWAY_LISTEN=f"127.0.0.1:{port}",
        LOCALMODEL_GATEWAY_ADMIN_LISTEN=f"127.0.0.1:{admin}",
        LOCALMODEL_GATEWAY_UPSTREAM="http://127.0.0.1:9",
        LOCALMODEL_GATEWAY_MODEL="qwen3:1.7b",
        LOCALMODEL_GATEWAY_SLOTS="2",
        LOCALMODEL_GATEWAY_THREADS="4",
        LOCALMODEL_GATEWAY_CONTEXT="8192",
    )
    proc = localmodel_process("localmodel gateway", ["gateway"], tmp_path / "gateway.log", env)
    with proc.serving("the gateway /healthz", lambda: http_ok(f"{url(port)}/healthz"), 20):
        with urllib.request.urlopen(f"{url(port)}/slots", timeout=2) as resp:
            doc = json.load(resp)
        assert (doc["model"], doc["total"], doc["threads"], doc["context"]) == (
            "qwen3:1.7b",
            2,
            4,
            8192,
        )
        assert proc.stop() == 0, proc.log_text()


def test_gateway_process_names_the_overflow_host_and_never_its_key(tmp_path: Path) -> None:
    """The real process, configured as the renderer configures it: its output
    names where overflow goes, never the key (nor credentials in the URL)."""
    port, admin = free_port(), free_port()
    key = "sk-process-secret-91c2"
    env = dict(os.environ)
    env.update(
        LOCALMODEL_GATEWAY_LISTEN=f"127.0.0.1:{port}",
        LOCALMODEL_GATEWAY_ADMIN_LISTEN=f"127.0.0.1:{admin}",
        LOCALMODEL_GATEWAY_UPSTREAM="http://127.0.0.1:9",
        LOCALMODEL_GATEWAY_OVERFLOW_URL="https://user:pw-in-url@far.example/v1",
        LOCALMODEL_GATEWAY_OVERFLOW_MODEL="big",
        LOCALMODEL_GATEWAY_OVERFLOW_AFTER="2",
        LOCALMODEL_GATEWAY_OVERFLOW_API_KEY=key,
    )
    proc = localmodel_process(
        "localmodel gateway", ["gateway"], tmp_path / "stdout.log", env,
        err_path=tmp_path / "stderr.log",
    )
    with proc.serving("the gateway /metrics", lambda: http_ok(f"{url(admin)}/metrics"), 20):
        with urllib.request.urlopen(f"{url(admin)}/metrics", timeout=1) as r:
            metrics = r.read().decode()
        proc.stop()
    out, err = (tmp_path / "stdout.log").read_bytes(), (tmp_path / "stderr.log").read_bytes()
    text = out.decode() + err.decode() + metrics
    assert "foreground overflow to far.example after 2s" in err.decode()
    assert key not in text and "pw-in-url" not in text
