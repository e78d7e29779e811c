"""A real-shape model on the real node (issue 45): a synthetic GGUF of a
published shape (hack/synth-gguf.py) applied as a LocalModel, its file from the
test cluster's file server, goes Ready under the memory the operator decided,
serves through its Service (`kubectl port-forward svc/NAME`, the `openai`
client) the longest prompt the time allows, without an OOM kill, and its status
shows the decode rate predicted from the node's memory bandwidth beside the one
measured.

CI runs the smallest shape (Gemma 3 1B, built by `bash hack/build-engines.sh
synth`) with a prompt of about LOCALMODEL_SIZES_PROMPT_SECONDS (default 45) of
prefill; issue 45's acceptance run is the largest shape the machine holds with
the gateway's whole deadline:

    LOCALMODEL_SIZES_SHAPE=qwen3-8b LOCALMODEL_SIZES_PROMPT_SECONDS=600 \\
      bash hack/test.sh tests/realnode/test_sizes_on_node.py

The prompt's length is sized from the prefill rate of a 400-word prompt (the
gateway's log line) at PREFILL_SHARE of the time (prefill slows as the context
fills), capped by the context; the gateway's log line says how long it took. The memory the engine's
container keeps that reclaim cannot free (anonymous + shmem: what gets a pod
OOM-killed, benchmarks/sizes_measure.py) is sampled from its cgroup through
the prompt (benchmarks/sizes_engines.py's Sampler) and must stay under the
decided limit; the kernel's OOM-kill count and the container's restarts must
stay 0. How close the peak comes to the
decision is printed, not asserted (benchmarks/sizes.py measures that).
"""

from __future__ import annotations

import os
import random
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from benchmarks import sizes_measure as m
from benchmarks.sizes_engines import Sampler
from benchmarks.sizes_points import model_info
from localmodel.engines import llama_server
from localmodel.facts.quantity import parse_bytes
from tests.builders import MakeLocalModel
from tests.harness.cgroup import Cgroup
from tests.harness.engines import synthetic_model
from tests.harness.models import ModelFileServer
from tests.harness.processes import wait_for
from tests.realnode.journey import MODEL_NAMESPACE, Journey, container_cgroup

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

SHAPE = os.environ.get("LOCALMODEL_SIZES_SHAPE", "gemma3-1b")
PROMPT_SECONDS = float(os.environ.get("LOCALMODEL_SIZES_PROMPT_SECONDS", "45"))
CONTEXT = int(os.environ.get("LOCALMODEL_SIZES_CONTEXT", "8192"))
NAME = "sizes"
ENGINE = "llama-server"
PREFILL_SHARE = 0.8  # of the rate measured: a long prompt's attention costs more per token
MiB = 2**20
WORDS = ("river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "thunder",
         "orchard", "signal", "candle", "glacier", "saddle", "pepper", "willow", "engine")


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def memory_cgroup(pod: dict[str, Any]) -> Cgroup:
    path = container_cgroup("memory", pod, llama_server.NAME)
    return Cgroup(path, 2 if (path / "memory.current").exists() else 1)


@pytest.fixture(scope="module")
def synth_files(journey: Journey) -> Iterator[tuple[ModelFileServer, Path, str]]:
    """The test cluster's file server over the synthetic shapes' directory."""
    gguf = synthetic_model(SHAPE)
    sha256 = gguf.with_name(gguf.name + ".sha256-ok").read_text().strip()
    server = ModelFileServer(gguf.parent, bind=journey.cluster.node_address).start()
    try:
        yield server, gguf, sha256
    finally:
        server.stop()


def sized_model(url: str, sha256: str, file_bytes: int, node: str) -> dict[str, Any]:
    return (
        MakeLocalModel(NAME, MODEL_NAMESPACE).model(f"synth-{SHAPE}").engine(ENGINE)
        .gguf(url, sha256).cpu(1).context(CONTEXT)
        .spec(placement={"nodeSelector": {"kubernetes.io/hostname": node}},
              storage={"storageClassName": "local-disk"},
              modelInfo=model_info(SHAPE, file_bytes))
        .manifest()
    )


def test_a_real_shape_goes_ready_under_its_decision_and_serves_its_longest_prompt(
    journey: Journey, synth_files: tuple[ModelFileServer, Path, str]
) -> None:
    server, gguf, sha256 = synth_files
    file_bytes = gguf.stat().st_size
    print(f"[sizes] {SHAPE}: {gguf.name}, {file_bytes / 1e9:.2f} GB, context {CONTEXT}")
    deployed = journey.deploy(sized_model(server.url_of(gguf.name), sha256, file_bytes,
                                          journey.node), timeout=900)
    try:
        assert server.counts().get(gguf.name) == 1, server.counts()
        lm = journey.model(NAME)
        placement = lm["status"]["placements"][0]
        decided = parse_bytes(placement["memory"])
        pod = journey.pod_of(NAME)
        engine = next(c for c in pod["spec"]["containers"] if c["name"] == llama_server.NAME)
        assert parse_bytes(engine["resources"]["limits"]["memory"]) == decided, engine
        journey.timings.add(f"sizes: {SHAPE} created -> Ready", deployed.ready_seconds)

        seen: list[Any] = [None]

        def calibrated_with_ceiling() -> dict[str, Any] | None:
            status = journey.model(NAME)["status"]
            seen[0] = {"speed": status["placements"][0].get("speed"),
                       "node labels": {k: v for k, v in journey.get(
                           f"/api/v1/nodes/{journey.node}")["metadata"]["labels"].items()
                           if "bandwidth" in k}}
            s: dict[str, Any] = status["placements"][0].get("speed") or {}
            return s if s.get("calibrationPrefill") and "ceiling" in s.get(
                "expectedSource", "") else None

        try:
            speed = wait_for("the calibration and the ceiling in status",
                             calibrated_with_ceiling, 300, interval=1.0)
        except AssertionError as e:
            raise AssertionError(f"{e}; last status: {seen[0]}") from None
        ceiling = re.search(r"ceiling ([0-9.]+) tok/s \((predicted: [^)]*)\)",
                            speed["expectedSource"])
        assert ceiling, speed
        predicted, measured = float(ceiling[1]), float(speed["calibrationDecode"])
        print(f"[sizes] decode: measured {measured:.2f} tok/s (calibration), predicted ceiling "
              f"{predicted:.2f} tok/s ({ceiling[2]}): {measured / predicted:.2f} of it")
        assert 0 < measured <= predicted, speed

        group = memory_cgroup(pod)
        kills_before = group.read("memory.oom_control" if group.version == 1
                                  else "memory.events")
        with journey.port_forward(f"svc/{NAME}") as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=900,
                                   max_retries=0)
            sample_id = f"sizes-sample-{uuid.uuid4().hex[:8]}"
            sample = client.completions.create(model=f"synth-{SHAPE}", prompt=words(400, 3),
                                               max_tokens=1,
                                               extra_headers={"X-Request-Id": sample_id})
            assert sample.usage is not None
            per_word = max(0.5, sample.usage.prompt_tokens / 400)
            # The prefill rate of a 400-word prompt, from the gateway's log line (the
            # calibration's short prompt reads slower: its fixed costs dominate).
            rate = float(journey.gateway_record(pod["metadata"]["name"], sample_id)
                         ["prefill_tok_s"] or speed["calibrationPrefill"])
            tokens = min(CONTEXT - 64, int(rate * PROMPT_SECONDS * PREFILL_SHARE))
            request_id = f"sizes-{uuid.uuid4().hex[:8]}"
            with Sampler(group) as sampled:
                began = time.monotonic()
                done = client.completions.create(
                    model=f"synth-{SHAPE}", prompt=words(int(tokens / per_word), 1),
                    max_tokens=8, extra_headers={"X-Request-Id": request_id})
                seconds = time.monotonic() - began
        record = journey.gateway_record(pod["metadata"]["name"], request_id)
        assert done.usage is not None and record["status"] == 200, record
        prompt_tokens = done.usage.prompt_tokens
        deadline = (lm["spec"].get("gateway") or {}).get("deadlineSeconds", 600)
        peak = sampled.peak.row()
        print(f"[sizes] prompt: {prompt_tokens} tokens through the Service, answered in "
              f"{record['duration_ms'] / 1000:.1f} s by the gateway's log "
              f"(prefill {record['prefill_tok_s']} tok/s; {seconds:.1f} s at the client), "
              f"the gateway's deadline {deadline} s")
        # llama-server maps the weights: their pages are the download step's (it wrote
        # them), charged to the pod and reclaimable; the repacked ones are copied into the
        # anonymous memory (the peak), the rest read from the mapping every token
        # (benchmarks/sizes.py's table adds those, from llama.cpp's accounting).
        print(f"[sizes] memory: decided {decided / MiB:.0f} MiB; OOM-relevant peak of the "
              f"engine's container {peak['peak_oom_mib']:.0f} MiB "
              f"({peak['peak_oom_mib'] * MiB / decided:.2f} of the decision), the weights' "
              f"file {file_bytes / MiB:.0f} MiB mapped beside it; page cache charged to the "
              f"container {peak['peak_file_mib']:.0f} MiB; {peak['samples']} samples, "
              f"0 OOM kills, 0 restarts")
        assert prompt_tokens >= 0.8 * tokens, (prompt_tokens, tokens)
        assert 0 < peak["peak_oom_mib"] * MiB < decided, peak
        assert sampled.kills() == m.oom_kills(kills_before, group.version), "an OOM kill"
        after = journey.pod_of(NAME)
        statuses = {s["name"]: s for s in after["status"]["containerStatuses"]}
        assert statuses[llama_server.NAME]["restartCount"] == 0, statuses[llama_server.NAME]
        assert after["metadata"]["uid"] == pod["metadata"]["uid"]
        journey.timings.add(f"sizes: {SHAPE} prompt of {prompt_tokens} tokens", seconds)
    finally:
        journey.delete_model(NAME)  # its volume keeps the weights (Retain)
