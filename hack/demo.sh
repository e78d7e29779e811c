#!/usr/bin/env bash
# A walk through the product on a real (local) control plane with the operator
# running as the chart's identity: the CRD refuses a bad model with its reason;
# `kubectl apply` is the only step for a good one; the operator places, tunes
# and reports; a node going away leaves its model waiting with the reason, and a
# node joining takes it.
# Needs the binaries from hack/build-tools.sh (cached after the first build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/build-tools.sh >/dev/null
KUBECTL="$(bash hack/build-tools.sh --print | sed -n 's/^kubectl=//p')"
# LOCALMODEL_DEMO_STATE: the harness's state file (a test runs the demo beside its own cluster).
harness() { python -m tests.harness ${LOCALMODEL_DEMO_STATE:+--state "$LOCALMODEL_DEMO_STATE"} "$@"; }
harness up --detach --operator
trap 'harness down' EXIT
export KUBECONFIG="$(harness kubeconfig)"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "nodes, with their NFD CPU labels"
"$KUBECTL" get nodes -L feature.node.kubernetes.io/cpu-cpuid.AMXTILE,node.kubernetes.io/instance-type
"$KUBECTL" create namespace ai
# Bare metal: local disks are the default class, so claims without a class land there.
"$KUBECTL" annotate storageclass local-disk storageclass.kubernetes.io/is-default-class=true

step "an invalid model is refused by the API server, with the reason"
"$KUBECTL" apply -f examples/invalid.yaml 2>&1 || true

step "kubectl apply: that is the whole deployment"
sed -e 's/pool: amx/node.kubernetes.io\/instance-type: sapphire-rapids-32/' \
    -e 's/pool: avx2/node.kubernetes.io\/instance-type: avx2-8/' \
    -e 's/storageClassName: local-weights/storageClassName: local-disk/' examples/models.yaml \
  | "$KUBECTL" apply -f -
"$KUBECTL" apply -f examples/qwen3.yaml
"$KUBECTL" wait --for=condition=Ready lm --all -n ai --timeout=120s
"$KUBECTL" get lm -n ai -o wide
"$KUBECTL" get pods,pvc -n ai -o wide

step "kubectl describe lm: why is flash attention off on that node?"
"$KUBECTL" describe lm qwen3-8b -n ai | sed -n '/Conditions/,$p'

step "a node goes away: with no free node left, the model waits and its status says why"
node="$("$KUBECTL" get lm qwen3 -n ai -o jsonpath='{.status.nodes}')"
"$KUBECTL" delete node "$node"
"$KUBECTL" wait --for=condition=Placed=false lm/qwen3 -n ai --timeout=120s
"$KUBECTL" get lm qwen3 -n ai -o jsonpath='{.status.conditions[?(@.type=="Placed")].message}{"\n"}'

step "a node joins: the model is placed on it, with a new claim (the old one cannot follow)"
harness node small small-new | "$KUBECTL" create -f -
"$KUBECTL" wait --for=condition=Ready lm/qwen3 -n ai --timeout=120s
"$KUBECTL" get lm qwen3 -n ai -o wide
"$KUBECTL" get pvc -n ai -l localmodel.dev/name=qwen3 -o wide
"$KUBECTL" get events -n ai --field-selector involvedObject.name=qwen3
