"""Fixtures for the engine tier: the real engines built by hack/build-engines.sh.

`volume` is a model store with the Gemma 3 270M GGUF imported once per session
(offline, `FROM /path/model.gguf`); `models` is a per-test writable copy of
it; `ollama` starts real `ollama serve` processes that are stopped after the
test."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.engines.real_ollama import copy_volume, import_gguf
from tests.harness.engines import Ollama, start_ollama

OllamaFactory = Callable[..., Ollama]


@pytest.fixture(scope="session")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("volume")
    models = work / "models"
    import_gguf(work, models)
    return models


@pytest.fixture
def models(volume: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "volume" / "models"
    copy_volume(volume, dst)
    return dst


@pytest.fixture
def ollama(models: Path, tmp_path: Path) -> Iterator[OllamaFactory]:
    """ollama(env={...}, models=...) -> a running server with its own HOME and port."""
    started: list[Ollama] = []

    def start(env: Mapping[str, str] | None = None, store: Path | None = None) -> Ollama:
        workdir = tmp_path / f"ollama-{len(started)}"
        server = start_ollama(workdir, store or models, env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
