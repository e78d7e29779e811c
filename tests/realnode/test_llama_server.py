"""The journey on the real node with llama-server: a LocalModel for the cached
Gemma 3 270M GGUF (`spec.gguf` from the harness's model file server) with
`cpu: 1` becomes Ready only with its containers, answers the official `openai`
client through `kubectl port-forward`, runs one thread under the CFS quota the
kubelet set, survives its pod's deletion and its engine's death, and stops
working when its caller gives up: the same journey as Ollama's
(tests/realnode/test_ollama.py), through the same steps in journey.py."""

from __future__ import annotations

import re

import pytest

from localmodel.engines import llama_server
from tests.realnode.journey import (
    LLAMA_SERVER_CALLS,
    Deployed,
    Journey,
    clean_reply,
    module_model,
)

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

NAME = "gemma-llama"
ENGINE = llama_server.NAME


gemma = module_model(NAME, ENGINE)


def test_llama_server_model_is_ready_only_when_its_containers_are_ready(
    journey: Journey, gemma: Deployed
) -> None:
    journey.first_start(gemma)


def test_openai_client_answers_through_kubectl_port_forward(
    journey: Journey, gemma: Deployed
) -> None:
    with journey.port_forward(f"svc/{NAME}") as url:
        reply = journey.openai_chat(url, "llama-server: openai client chat through port-forward")
    answer = clean_reply(reply)
    print(f"llama-server answered: {answer!r}")


def test_llama_server_threads_and_cfs_quota_equal_the_cpu_limit(
    journey: Journey, gemma: Deployed
) -> None:
    pod = journey.pod_of(NAME)
    name = pod["metadata"]["name"]
    quota, period = journey.cfs_quota(pod, ENGINE)
    cmdline = journey.exec(name, ENGINE, "tr '\\0' ' ' < /proc/1/cmdline")
    assert re.search(r"(?:^| )-t 1 ", cmdline) and re.search(r" -tb 1 ", cmdline), cmdline
    journey.one_thread_in_the_log(name, ENGINE)
    print(f"CFS quota {quota}/{period}; llama-server: {cmdline[:200]}")


def test_deleting_the_pod_recreates_it_without_a_download(
    journey: Journey, gemma: Deployed
) -> None:
    journey.delete_pod_until_ready_again(gemma)


def test_killing_the_engine_restarts_it_and_a_request_meanwhile_fails_fast(
    journey: Journey, gemma: Deployed
) -> None:
    journey.kill_engine_until_ready_again(NAME, LLAMA_SERVER_CALLS)


def test_a_client_that_times_out_at_the_pod_leaves_the_engine_idle_within_a_second(
    journey: Journey, gemma: Deployed
) -> None:
    """The caller's connection ends at the pod's gateway, which closes its
    stream from llama-server; llama-server stops at its next token."""
    left = journey.client_at_the_pod_gives_up(NAME, LLAMA_SERVER_CALLS)
    assert left.idle_at <= 1.0, f"the engine worked {left.idle_at:.1f} s after its caller left"


def test_a_client_that_times_out_through_the_port_forward_stops_the_engine(
    journey: Journey, gemma: Deployed
) -> None:
    """As for Ollama (test_ollama.py): containerd 1.6 hands the leaving to the
    gateway 1 s late; from the gateway on, idle within a second; <= 2 s in all."""
    left = journey.client_through_port_forward_gives_up(NAME, LLAMA_SERVER_CALLS)
    assert left.after_gateway <= 1.0, (
        f"the engine worked {left.after_gateway:.1f} s after the gateway saw its caller go")
    assert left.idle_at <= 2.0, f"the engine worked {left.idle_at:.1f} s after its caller left"
