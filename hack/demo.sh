#!/usr/bin/env bash
# A walk through the product on a real (local) control plane with the operator
# running as the chart's identity: the CRD refuses a bad model with its reason;
# `kubectl apply` is the only step for a good one; the operator places, tunes
# and reports; a node going away re-places its model.
# Needs the binaries from hack/build-tools.sh (cached after the first build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/build-tools.sh >/dev/null
KUBECTL="$(bash hack/build-tools.sh --print | sed -n 's/^kubectl=//p')"
python -m tests.harness up --detach --operator
trap 'python -m tests.harness down' EXIT
export KUBECONFIG="$(python -m tests.harness kubeconfig)"
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

step "a node goes away: its model is re-placed, with a new claim where the old one cannot follow"
node="$("$KUBECTL" get lm qwen3 -n ai -o jsonpath='{.status.nodes}')"
"$KUBECTL" delete node "$node"
sleep 3
"$KUBECTL" wait --for=condition=Ready lm/qwen3 -n ai --timeout=120s
"$KUBECTL" get lm qwen3 -n ai -o wide
"$KUBECTL" get events -n ai --field-selector involvedObject.name=qwen3
