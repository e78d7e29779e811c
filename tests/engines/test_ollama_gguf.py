"""Ollama with `gguf`, the pod's init steps run for real: weights from a URL,
no registry.

The cached Gemma 3 270M GGUF is served over loopback HTTP by the harness's
model file server (tests/harness/models.py), which counts downloads. The
download step (its script as rendered, with the machine's python3 standing in
for the operator image's) fetches it onto an empty volume; the create step
(the real `ollama` CLI and server) then runs in a network namespace with only
loopback, so any call to Ollama's registry would fail it. The engine
container's `ollama serve` then answers with the operator's threads and
context.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localmodel.desired import desired_state
from localmodel.engines import ollama as ollama_facts
from localmodel.engines.ollama.pod import MODELFILE_DIR
from localmodel.render import RenderOptions
from tests.builders import MakeLocalModel, MakeNode
from tests.engines.conftest import OllamaFactory
from tests.engines.real_ollama import MODEL
from tests.harness.engines import ollama_env, ollama_serve, ollama_version, require
from tests.harness.models import ModelFileServer
from tests.harness.processes import free_port

pytestmark = pytest.mark.engine

CONTEXT = 2048
THREADS = 1
HOME = ollama_facts.HOME  # the weights volume's mount point in the pod


@functools.cache
def gguf_sha256() -> str:
    h = hashlib.sha256()
    with require("model").open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture
def mirror() -> Iterator[ModelFileServer]:
    """The cache's GGUF files over loopback HTTP, as the harness serves them."""
    server = ModelFileServer(require("model").parent).start()
    try:
        yield server
    finally:
        server.stop()


def rendered(url: str, sha256: str) -> tuple[dict[str, Any], str]:
    lm = (MakeLocalModel("gemma").model(MODEL).cpu(THREADS).context(CONTEXT)
          .spec(engine={"version": ollama_version()}).gguf(url, sha256).obj())
    node = MakeNode("n").cpus(2).memory_gib(8).cpu_flags({"AVX2", "FMA"}).facts()
    # The mirror speaks plain http: allowed, as the operator's --allow-http-downloads does.
    options = RenderOptions(allow_http_downloads=True)
    objects = desired_state([lm], [node], now="t", options=options).models[0].objects
    pod = next(o for o in objects if o["kind"] == "Pod")
    configmap = next(o for o in objects if o["kind"] == "ConfigMap")
    return pod, configmap["data"]["replica-0.Modelfile"]


def init_container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in pod["spec"]["initContainers"] if c["name"] == name)
    assert found["command"][:2] == ["/bin/sh", "-c"]
    return found


def run_download(pod: dict[str, Any], volume: Path) -> subprocess.CompletedProcess[str]:
    """The download container: its script with the volume's mount point
    pointed at `volume`, python3 from this machine."""
    script = init_container(pod, "download")["command"][2].replace(HOME, str(volume))
    python = Path(sys.executable).parent
    return subprocess.run(
        ["/bin/sh", "-c", script],
        env={"PATH": f"{python}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def run_create(
    pod: dict[str, Any], modelfile: str, volume: Path, work: Path
) -> subprocess.CompletedProcess[str]:
    """The create container: its script and environment, with the pod's paths
    pointed at this test's directories, in a network namespace that has only
    loopback."""
    init = init_container(pod, "pull")
    (work / "etc").mkdir(parents=True, exist_ok=True)
    (work / "etc" / "Modelfile").write_text(modelfile.replace(HOME, str(volume)))
    script = (
        init["command"][2]
        .replace(f"{MODELFILE_DIR}/Modelfile", str(work / "etc" / "Modelfile"))
        .replace("/tmp/ollama.log", str(work / "init-serve.log"))
    )
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["OLLAMA_MODELS"] == ollama_facts.MODELS_DIR
    assert env["OLLAMA_NOPRUNE"] == "1"
    env |= ollama_env(work / "home", volume / "models", free_port())
    (work / "home").mkdir(parents=True, exist_ok=True)
    unshare = shutil.which("unshare")
    assert unshare, "the engine tier needs util-linux unshare (network namespace)"
    return subprocess.run(
        [unshare, "--net", "--", "/bin/sh", "-c", 'ip link set lo up && exec /bin/sh -c "$0"',
         script],
        env=env | {"PATH": env["PATH"] + ":/usr/sbin:/sbin"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def start(pod: dict[str, Any], modelfile: str, volume: Path, work: Path) -> str:
    """Both init steps in order, as the kubelet runs them; their output."""
    down = run_download(pod, volume)
    assert down.returncode == 0, down.stdout + down.stderr
    made = run_create(pod, modelfile, volume, work)
    log = work / "init-serve.log"
    assert made.returncode == 0, (
        made.stdout + made.stderr + (log.read_text(errors="replace") if log.exists() else "")
    )
    return down.stdout + down.stderr + made.stdout + made.stderr


def blobs(volume: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (volume / "models" / "blobs").iterdir()}


def test_init_steps_create_the_model_from_a_gguf_over_loopback(
    mirror: ModelFileServer, tmp_path: Path, ollama: OllamaFactory
) -> None:
    name = require("model").name
    pod, modelfile = rendered(mirror.url_of(name), gguf_sha256())
    volume = tmp_path / "weights"  # (the `models` fixture owns tmp_path / "volume")
    out = start(pod, modelfile, volume, tmp_path / "init")
    assert f"downloaded {volume}/models/blobs/sha256-{gguf_sha256()}" in out
    assert "pulling" not in out
    assert mirror.counts() == {name: 1}

    # The file is the blob: Ollama's store holds the weights once, not twice.
    size = require("model").stat().st_size
    assert blobs(volume)[f"sha256-{gguf_sha256()}"] == size
    assert [b for b, s in blobs(volume).items() if s >= size // 2] == [f"sha256-{gguf_sha256()}"]
    assert sum(blobs(volume).values()) < size + 1024**2

    # The engine container: `ollama serve` with the rendered environment.
    engine = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in engine["env"]}
    for managed in ("OLLAMA_HOST", "OLLAMA_MODELS"):
        env.pop(managed)
    server = ollama(env=env, store=volume / "models")
    status, show = server.api(ollama_facts.SHOW_PATH, {"model": MODEL})
    assert status == 200, show
    params = dict(line.split(None, 1) for line in show["parameters"].splitlines())
    assert (params["num_thread"].strip(), params["num_ctx"].strip()) == (str(THREADS), str(CONTEXT))
    status, answer = server.api(
        ollama_facts.GENERATE_PATH,
        {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
    )
    assert status == 200, answer
    assert answer["response"]
    child = server.runner().cmdline()
    assert child[child.index("-t") + 1] == str(THREADS)
    assert child[child.index("-c") + 1] == str(CONTEXT)
    # The loaded weights are the blob the download step wrote.
    assert str(volume / "models" / "blobs" / f"sha256-{gguf_sha256()}") in child


def test_a_restart_downloads_nothing_and_needs_no_network(
    mirror: ModelFileServer, tmp_path: Path
) -> None:
    name = require("model").name
    pod, modelfile = rendered(mirror.url_of(name), gguf_sha256())
    volume = tmp_path / "weights"  # (the `models` fixture owns tmp_path / "volume")
    start(pod, modelfile, volume, tmp_path / "first")
    before = blobs(volume)
    again = start(pod, modelfile, volume, tmp_path / "restart")
    assert "no download" in again
    assert mirror.counts() == {name: 1}
    assert blobs(volume) == before


def test_a_file_put_on_the_volume_by_hand_is_hashed_not_downloaded(
    mirror: ModelFileServer, tmp_path: Path
) -> None:
    name = require("model").name
    pod, modelfile = rendered(mirror.url_of(name), gguf_sha256())
    volume = tmp_path / "weights"  # (the `models` fixture owns tmp_path / "volume")
    blob = volume / "models" / "blobs" / f"sha256-{gguf_sha256()}"
    blob.parent.mkdir(parents=True)
    os.link(require("model"), blob)
    out = start(pod, modelfile, volume, tmp_path / "init")
    assert "sha256 checked" in out
    assert mirror.counts() == {}


def test_a_wrong_sha256_fails_clearly_and_leaves_the_good_file(
    mirror: ModelFileServer, tmp_path: Path
) -> None:
    name = require("model").name
    pod, modelfile = rendered(mirror.url_of(name), gguf_sha256())
    volume = tmp_path / "weights"  # (the `models` fixture owns tmp_path / "volume")
    start(pod, modelfile, volume, tmp_path / "first")
    good = blobs(volume)

    wrong = "0" * 64
    bad_pod, _ = rendered(mirror.url_of(name), wrong)
    failed = run_download(bad_pod, volume)
    assert failed.returncode != 0
    assert f"has sha256 {gguf_sha256()}, not {wrong}" in failed.stderr
    assert mirror.counts() == {name: 2}
    assert blobs(volume) == good  # no blob for the wrong checksum, the good one intact
    assert not any((volume / "download").glob("*.part"))
    # And the good file still starts the model, with no download.
    again = start(pod, modelfile, volume, tmp_path / "again")
    assert "no download" in again
    assert mirror.counts() == {name: 2}


def _read_only(*paths: Path) -> Callable[[], None]:
    """A preexec that gives the child its own mount namespace in which each
    path is a read-only bind of itself (as the kubelet mounts a volume with
    `readOnly: true`); root only, as the engine tier runs."""

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        clone_newns, ms_rdonly, ms_remount, ms_bind, ms_rec, ms_private = (
            0x20000, 1, 32, 4096, 16384, 1 << 18)
        calls = [(libc.unshare, (clone_newns,)),
                 (libc.mount, (None, b"/", None, ms_rec | ms_private, None))]
        for p in paths:
            raw = str(p).encode()
            calls += [(libc.mount, (raw, raw, None, ms_bind, None)),
                      (libc.mount, (None, raw, None, ms_remount | ms_bind | ms_rdonly, None))]
        for call, args in calls:
            if call(*args) != 0:
                raise OSError(ctypes.get_errno(), f"{call.__name__}{args}")

    return preexec


def test_the_engine_serves_from_a_read_only_home_once_the_init_steps_wrote_it(
    mirror: ModelFileServer, tmp_path: Path
) -> None:
    """The engine container mounts the weights volume (Ollama's home, its
    store and key) read-only: `ollama serve` starts and answers from it, and
    cannot write there (docs/operator.md, Pod Security)."""
    name = require("model").name
    pod, modelfile = rendered(mirror.url_of(name), gguf_sha256())
    engine = pod["spec"]["containers"][0]
    [weights] = [m for m in engine["volumeMounts"] if m["name"] == "weights"]
    assert weights["readOnly"] is True
    volume = tmp_path / "weights"
    start(pod, modelfile, volume, tmp_path / "init")
    home = tmp_path / "home"
    # The pull step's own `ollama serve` wrote the key into the home (the volume in the pod).
    with ollama_serve(tmp_path / "first", volume / "models", {"HOME": str(home)}):
        pass
    assert (home / ".ollama" / "id_ed25519").exists()
    env = {"HOME": str(home)}
    with ollama_serve(tmp_path / "ro", volume / "models", env,
                      preexec=_read_only(home, volume)) as server:
        status, answer = server.api(
            ollama_facts.GENERATE_PATH,
            {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
        )
        assert status == 200, answer
        assert answer["response"]
        delete = urllib.request.Request(server.url + "/api/delete", method="DELETE",
                                        data=json.dumps({"model": MODEL}).encode())
        try:
            with urllib.request.urlopen(delete, timeout=60) as resp:
                status = resp.status
        except urllib.error.HTTPError as err:
            status = err.code
    assert status != 200, status  # its store is read-only: nothing removed
    assert (volume / "models" / "blobs" / f"sha256-{gguf_sha256()}").exists()
