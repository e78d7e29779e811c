"""Hostile bodies at the queue's full depth against a real model pod on the
real node (llama-server serving the cached Gemma 3 270M, the pod as the
operator renders it): for HOSTILE_SECONDS, as many clients as the pod's
gateway has places but one (its rendered slots + maxQueue, read from the pod)
send the worst bodies within the gateway's limits back to back to the pod's
gateway port (benchmarks/gateway_hostile.py's kinds: a list of empty
messages, one huge string, deep nesting, 8 MiB announced), while a normal
chat goes through the Service (kubectl port-forward svc/NAME) with the
official `openai` client. Every hostile request gets its 4xx naming its
limit, the chat is answered, and the gateway container is never OOM-killed or
restarted; its cgroup's peak memory is printed against its limit."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gateway_hostile import RIGHT, hostile_bodies, hostile_client, tally
from localmodel.contract import CONTAINER_GATEWAY
from localmodel.engines import llama_server
from localmodel.facts.quantity import parse_bytes
from localmodel.gateway_contract import GATEWAY_PORT, GatewayConfig, env_name
from localmodel.render.names import gateway_memory_bytes
from tests.realnode.journey import Deployed, Journey, clean_reply, container_cgroup, module_model

# `llama`: no Ollama (hack/test.sh runs it while Ollama builds: tests/harness/prereqs.py)
pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.llama]

NAME = "gemma-chart"  # test_metrics_scrape.py's model too: the same retained weights
HOSTILE_SECONDS = 45.0
DEFAULTS = GatewayConfig()


gemma = module_model(NAME, llama_server.NAME)


def _setting(env: dict[str, str], name: str) -> int:
    return int(env.get(env_name(name.replace("_", "-")), getattr(DEFAULTS, name)))


def _memory_peak(group: Path) -> int:
    """The cgroup's peak memory (v1 max_usage_in_bytes, v2 memory.peak)."""
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        if (group / name).exists():
            return int((group / name).read_text())
    raise AssertionError(f"no peak memory file in {group}")


def _gateway_status(pod: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = next(s for s in pod["status"]["containerStatuses"]
                                  if s["name"] == CONTAINER_GATEWAY)
    return status


def test_hostile_bodies_at_the_queues_full_depth_leave_the_gateway_up_and_a_chat_answered(
    journey: Journey, gemma: Deployed
) -> None:
    pod = journey.pod_of(NAME)
    container = next(c for c in pod["spec"]["containers"] if c["name"] == CONTAINER_GATEWAY)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    slots, queue = _setting(env, "slots"), _setting(env, "max_queue")
    limit = parse_bytes(container["resources"]["limits"]["memory"])
    assert limit == gateway_memory_bytes(slots, queue)
    clients = slots + queue - 1  # every place but the normal chat's
    group = container_cgroup("memory", pod, CONTAINER_GATEWAY)
    before = _gateway_status(pod)
    assert before["restartCount"] == 0, before
    kinds = {k: v for k, v in hostile_bodies(_setting(env, "max_body_bytes"),
                                             _setting(env, "max_string_bytes")).items()
             if k != "queued"}  # a valid 1 MiB prompt exceeds this model's context

    answers: Counter[str] = Counter()
    chats: list[str] = []
    errors: list[BaseException] = []

    def chat_through_the_service() -> None:
        try:
            with journey.port_forward(f"svc/{NAME}") as url:
                time.sleep(5)  # the hostile clients are at it
                while len(chats) < 2:
                    chats.append(clean_reply(journey.openai_chat(
                        url, f"{NAME}: chat through the Service behind hostile bodies")))
        except BaseException as exc:
            errors.append(exc)

    chatter = threading.Thread(target=chat_through_the_service, daemon=True)
    began = time.monotonic()
    chatter.start()

    async def hostile() -> None:
        until = time.monotonic() + HOSTILE_SECONDS
        await asyncio.gather(*(hostile_client(pod["status"]["podIP"], GATEWAY_PORT, kinds, i,
                                              until, answers) for i in range(clients)))

    asyncio.run(hostile())
    chatter.join(300)
    seconds = time.monotonic() - began
    report = tally(answers)
    peak = _memory_peak(group)
    after = journey.pod_of(NAME)
    status = _gateway_status(after)
    print(f"{clients} hostile clients ({slots} slot(s), maxQueue {queue}) for "
          f"{HOSTILE_SECONDS:g} s: {report['hostile']}; chats answered {len(chats)} in "
          f"{seconds:.0f} s; gateway cgroup peak {peak / 1024**2:.1f} MiB of "
          f"{limit / 1024**2:.0f} MiB; restarts {status['restartCount']}")
    assert not errors, errors
    assert len(chats) == 2 and not chatter.is_alive()
    assert report["hostile_sent"] >= clients, report
    # Each one its 4xx naming its limit (any other answer is counted apart).
    assert all(key.endswith(RIGHT) for key in answers), report["hostile"]
    assert {k.split(":")[0] for k in answers} == set(kinds), report["hostile"]
    # Never OOM-killed nor restarted: the same pod, no restart, no last state.
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    assert status["restartCount"] == 0 and not status.get("lastState"), status
    assert status["ready"], status
    assert peak < limit, (peak, limit)
