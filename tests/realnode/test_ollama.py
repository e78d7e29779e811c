"""The journey on the real node with Ollama: a LocalModel for the cached Gemma 3
270M GGUF (`spec.gguf` from the harness's model file server, no registry) with
`cpu: 1` becomes Ready, answers the official clients, runs one thread under
the CPU limit the kubelet enforces, survives its pod's deletion and its
engine's death, and stops working when its caller gives up.

One model for the module (the machine has 2 cores); the tests read it in file
order but each stands alone on the `gemma` fixture.
"""

from __future__ import annotations

import json
import re
import time

import ollama
import pytest

from localmodel.engines import ollama as ollama_engine
from localmodel.gateway_contract import GATEWAY_PORT
from tests.realnode.journey import (
    MODEL_NAMESPACE,
    OLLAMA_CALLS,
    POD_SECURITY_LEVEL,
    PODS_PATH,
    PROMPT,
    Deployed,
    Journey,
    clean_reply,
    condition,
    module_model,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

NAME = "gemma-ollama"
MODEL = "gemma3:270m"
ENGINE = ollama_engine.NAME


gemma = module_model(NAME, ENGINE)


def test_ollama_model_is_ready_only_when_its_containers_are_ready(
    journey: Journey, gemma: Deployed
) -> None:
    pod = journey.first_start(gemma)
    samples = gemma.samples
    last = samples[-1]
    assert last.model_ready and last.containers_ready, last
    first_ready = next(s.at for s in samples if s.containers_ready)
    print(f"containers ready {first_ready:.1f} s, LocalModel Ready {last.at:.1f} s "
          f"after creation ({len(samples)} samples)")
    assert pod["spec"]["nodeName"] == journey.node
    pull = journey.logs(pod["metadata"]["name"], "pull")
    assert "no registry pull" in pull, pull
    lm = journey.model(NAME)
    assert condition(lm, "Ready") == "True"
    assert lm["status"]["ready"] == "1/1"


def test_official_clients_answer_through_kubectl_port_forward(
    journey: Journey, gemma: Deployed
) -> None:
    with journey.port_forward(f"svc/{NAME}") as url:
        began = time.monotonic()
        client = ollama.Client(host=url, timeout=120)
        reply = client.chat(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                            options={"num_predict": 16, "temperature": 0})
        journey.timings.add("ollama client chat through port-forward", time.monotonic() - began)
        clean_reply(reply.message.content)
        openai_reply = journey.openai_chat(url, "openai client chat through port-forward")
        clean_reply(openai_reply)
        print(f"ollama: {reply.message.content!r}\n"
              f"openai: {openai_reply!r}")


CLIENT_SCRIPT = """
import json, sys, urllib.request
base = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)
gen = post("/api/generate", {"model": %(model)r, "prompt": %(prompt)r, "stream": False,
                             "options": {"num_predict": 16, "temperature": 0}})
chat = post("/v1/chat/completions", {"model": %(model)r, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": %(prompt)r}]})
print(json.dumps({"ollama": gen["response"], "openai": chat["choices"][0]["message"]["content"]}))
"""


def test_a_client_pod_gets_answers_through_the_services_cluster_ip(
    journey: Journey, gemma: Deployed
) -> None:
    service = journey.get(f"/api/v1/namespaces/{MODEL_NAMESPACE}/services/{NAME}")
    ip = service["spec"]["clusterIP"]
    port = service["spec"]["ports"][0]["port"]
    script = CLIENT_SCRIPT % {"model": MODEL, "prompt": PROMPT}
    # python3 -c SCRIPT URL: the URL is sys.argv[1]
    out, seconds = journey.run_client_pod(script.replace("sys.argv[1]", repr(f"http://{ip}:{port}")))
    journey.timings.add("client pod: both APIs through the cluster IP", seconds)
    answers = json.loads(out.strip().splitlines()[-1])
    clean_reply(answers["ollama"])
    clean_reply(answers["openai"])
    print(f"from a pod via {ip}:{port}: {answers}")


def test_engine_threads_cfs_quota_and_gomaxprocs_equal_the_cpu_limit(
    journey: Journey, gemma: Deployed
) -> None:
    pod = journey.pod_of(NAME)
    name = pod["metadata"]["name"]
    [engine] = [c for c in pod["spec"]["containers"] if c["name"] == ENGINE]
    assert engine["resources"]["limits"]["cpu"] == "1"
    # The quota the kubelet set, as the container sees it and as the host has it.
    quota, period = journey.cfs_quota(pod, ENGINE)
    # GOMAXPROCS of the running server (pid 1), from its environment.
    environ = journey.exec(name, ENGINE, "tr '\\0' '\\n' < /proc/1/environ")
    assert "GOMAXPROCS=1" in environ.splitlines(), environ
    # /api/show: the model's parameters carry num_thread 1.
    with journey.port_forward(f"pod/{name}", remote=GATEWAY_PORT) as url:
        shown = ollama.Client(host=url, timeout=60).show(MODEL)
    parameters = dict(line.split(None, 1) for line in (shown.parameters or "").splitlines())
    assert parameters.get("num_thread") == "1", shown.parameters
    # The runner Ollama started: `-t 1` on its command line, one thread in its own log.
    cmdlines = journey.exec(name, ENGINE, "for p in /proc/[0-9]*; do "
                            "tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")
    runner = [c for c in cmdlines.splitlines() if "llama-server" in c or " runner" in c]
    assert runner, cmdlines
    assert re.search(r"(?:-t|--threads) 1\b", runner[0]), runner
    journey.one_thread_in_the_log(name, ENGINE)
    print(f"CFS quota {quota}/{period}, GOMAXPROCS=1, num_thread 1, runner: {runner[0][:160]}")


def test_deleting_the_pod_recreates_it_without_a_download(
    journey: Journey, gemma: Deployed
) -> None:
    journey.delete_pod_until_ready_again(gemma)


def test_killing_the_engine_restarts_it_and_a_request_meanwhile_fails_fast(
    journey: Journey, gemma: Deployed
) -> None:
    journey.kill_engine_until_ready_again(NAME, OLLAMA_CALLS)


def test_a_client_that_times_out_at_the_pod_leaves_the_engine_idle_within_a_second(
    journey: Journey, gemma: Deployed
) -> None:
    """The product's own path: the caller's connection ends at the pod's gateway,
    which cancels the engine's work."""
    left = journey.client_at_the_pod_gives_up(NAME, OLLAMA_CALLS)
    assert left.idle_at <= 1.0, f"the engine worked {left.idle_at:.1f} s after its caller left"


def test_a_client_that_times_out_through_the_port_forward_stops_the_engine(
    journey: Journey, gemma: Deployed
) -> None:
    """Through `kubectl port-forward` the caller's leaving reaches the gateway
    a second late, by containerd 1.6's design: its port forwarding holds the
    pod-side connection open for 1 s after the client's stream closed
    (docs/test-cluster.md, "A client leaving through kubectl port-forward").
    From the gateway on it is the pod's path, idle within a second; in all
    <= 2 s, where a lost cancellation would run the 4000-token generation for
    minutes."""
    left = journey.client_through_port_forward_gives_up(NAME, OLLAMA_CALLS)
    assert left.after_gateway <= 1.0, (
        f"the engine worked {left.after_gateway:.1f} s after the gateway saw its caller go")
    assert left.idle_at <= 2.0, f"the engine worked {left.idle_at:.1f} s after its caller left"


def test_the_model_namespace_enforces_pod_security_baseline(
    journey: Journey, gemma: Deployed
) -> None:
    ns = journey.get(f"/api/v1/namespaces/{MODEL_NAMESPACE}")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == POD_SECURITY_LEVEL
    # Enforced: a privileged pod is refused here...
    status, body = journey.cluster.api().request("POST", PODS_PATH, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "c", "image": journey.operator_image,
                                 "securityContext": {"privileged": True}}]}})
    assert status == 403 and "violates PodSecurity" in body.get("message", ""), body
    # ...while the model's pod runs. What `restricted` would refuse in it, as
    # the API server says (a server-side dry run of the stricter label):
    out = journey.cluster.kubectl(
        "label", "--dry-run=server", "--overwrite", "namespace", MODEL_NAMESPACE,
        "pod-security.kubernetes.io/enforce=restricted")
    warnings = out.stderr
    print(warnings)
    pod = journey.pod_of(NAME)["metadata"]["name"]
    [line] = [w for w in warnings.splitlines() if pod in w]
    for needed in RESTRICTED_VIOLATIONS:
        assert needed in line, (needed, line)
    for met in RESTRICTED_MET:
        assert met not in line, (met, line)
    # The engine only reads the weights volume (Ollama's home), and has no capability.
    out = journey.exec(pod, ENGINE, f"touch {ollama_engine.HOME}/probe 2>&1 || true; "
                       "grep CapEff /proc/self/status")
    assert "Read-only file system" in out and "CapEff:\t0000000000000000" in out, out


# What `restricted` refuses in an Ollama model pod, and why each is needed
# (docs/operator.md "Pod Security"): its image runs as root...
RESTRICTED_VIOLATIONS = ("runAsNonRoot != true", "runAsUser=0")
# ...and what the renderer sets so that nothing else is refused.
RESTRICTED_MET = ("allowPrivilegeEscalation != false", "unrestricted capabilities",
                  "seccompProfile")
