"""The journey on the real node with llama-server: a LocalModel for the cached
Gemma 3 270M GGUF (`spec.gguf` from the harness's model file server) with
`cpu: 1` becomes Ready only with its containers, answers the official `openai`
client through `kubectl port-forward`, and runs one thread under the CFS quota
the kubelet set."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import openai
import pytest

from localmodel.engines import llama_server
from tests.realnode.journey import Deployed, Journey, condition, container_cgroup

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

NAME = "gemma-llama"
MODEL = "gemma3:270m"
ENGINE = llama_server.NAME


@pytest.fixture(scope="module")
def gemma(journey: Journey) -> Iterator[Deployed]:
    deployed = journey.deploy(journey.local_model(NAME, ENGINE))
    yield deployed
    journey.delete_model(NAME)


def test_llama_server_model_is_ready_only_when_its_containers_are_ready(
    journey: Journey, gemma: Deployed
) -> None:
    early = [s for s in gemma.samples if not s.containers_ready]
    assert early and all(not s.model_ready for s in early), gemma.samples
    assert gemma.samples[-1].containers_ready
    assert gemma.downloads == 1, gemma.downloads
    pod = journey.pod_of(NAME)
    assert pod["status"]["qosClass"] == "Guaranteed"
    assert "localmodel: downloaded" in journey.logs(pod["metadata"]["name"], "download")
    assert condition(journey.model(NAME), "Ready") == "True"


def test_openai_client_answers_through_kubectl_port_forward(
    journey: Journey, gemma: Deployed
) -> None:
    with journey.port_forward(f"svc/{NAME}") as url:
        began = time.monotonic()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=120,
                               max_retries=0)
        completion = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello in three words."}],
            max_tokens=16)
        journey.timings.add("llama-server: openai client chat through port-forward",
                            time.monotonic() - began)
    answer = completion.choices[0].message.content
    assert answer, completion
    print(f"llama-server answered: {answer!r}")


def test_llama_server_threads_and_cfs_quota_equal_the_cpu_limit(
    journey: Journey, gemma: Deployed
) -> None:
    pod = journey.pod_of(NAME)
    name = pod["metadata"]["name"]
    inside = journey.exec(name, ENGINE, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us "
                          "/sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null "
                          "|| cat /sys/fs/cgroup/cpu.max").split()
    quota, period = int(inside[0]), int(inside[1])
    assert quota / period == 1.0, inside
    group = container_cgroup("cpu", pod, ENGINE)
    if (group / "cpu.cfs_quota_us").exists():
        assert int((group / "cpu.cfs_quota_us").read_text()) == quota
    cmdline = journey.exec(name, ENGINE, "tr '\\0' ' ' < /proc/1/cmdline")
    assert re.search(r"(?:^| )-t 1 ", cmdline) and re.search(r" -tb 1 ", cmdline), cmdline
    log = journey.logs(name, ENGINE)
    threads = [int(n) for n in re.findall(r"n_threads = (\d+)", log)]
    assert threads and set(threads) == {1}, log[-3000:]
    print(f"CFS quota {quota}/{period}; llama-server: {cmdline[:200]}")
