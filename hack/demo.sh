#!/usr/bin/env bash
# A walk through the product on a real (local) control plane: the CRD refuses a
# bad model with its reason, `localmodel render` plans against the cluster's own
# nodes, and kube-scheduler binds the rendered pods to the planned nodes.
# Needs the binaries from hack/build-tools.sh (cached after the first build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash hack/build-tools.sh >/dev/null
KUBECTL="$(bash hack/build-tools.sh --print | sed -n 's/^kubectl=//p')"
python -m tests.harness up --detach
trap 'python -m tests.harness down' EXIT
export KUBECONFIG="$(python -m tests.harness kubeconfig)"
work="$(mktemp -d)"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "nodes, with their NFD CPU labels"
"$KUBECTL" get nodes -L feature.node.kubernetes.io/cpu-cpuid.AMXTILE,node.kubernetes.io/instance-type
step "install the LocalModel CRD (generated from the API models)"
"$KUBECTL" apply --server-side -f crds/localmodel.dev_localmodels.yaml
"$KUBECTL" wait --for condition=Established crd/localmodels.localmodel.dev --timeout=30s
"$KUBECTL" create namespace ai
# Bare metal: local disks are the default class, so claims without a class land there.
"$KUBECTL" annotate storageclass local-disk storageclass.kubernetes.io/is-default-class=true
step "an invalid model is refused by the API server, with the reason"
"$KUBECTL" apply --server-side -f examples/invalid.yaml 2>&1 || true
step "plan and render against this cluster's nodes"
"$KUBECTL" get nodes -o yaml > "$work/nodes.yaml"
sed -e 's/pool: amx/node.kubernetes.io\/instance-type: sapphire-rapids-32/' \
    -e 's/pool: avx2/node.kubernetes.io\/instance-type: avx2-8/' \
    -e 's/storageClassName: local-weights/storageClassName: local-disk/' examples/models.yaml > "$work/models.yaml"
localmodel render -f "$work/models.yaml" --nodes "$work/nodes.yaml" --explain
localmodel render -f "$work/models.yaml" --nodes "$work/nodes.yaml" > "$work/objects.yaml"
step "apply the rendered objects; kube-scheduler binds each pod to its planned node"
python - "$work/objects.yaml" "$work" <<'PY'
import json, pathlib, sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
out = pathlib.Path(sys.argv[2])
for d in docs:
    status = d.pop("status", None)  # status belongs to the status subresource
    if status is not None:
        (out / f"status-{d['metadata']['name']}.json").write_text(json.dumps({"status": status}))
(out / "apply.yaml").write_text(yaml.safe_dump_all(docs))
PY
"$KUBECTL" apply --server-side -f "$work/apply.yaml"
step "the status render computed, written through the status subresource"
for f in "$work"/status-*.json; do
  name="$(basename "$f" .json)"; name="${name#status-}"
  "$KUBECTL" patch lm "$name" -n ai --subresource=status --type=merge --patch-file "$f" >/dev/null
done
sleep 8
"$KUBECTL" get pods -n ai -o wide
"$KUBECTL" get pvc -n ai
step "kubectl get lm / describe: why is flash attention off on amx-1?"
"$KUBECTL" get lm -n ai -o wide
"$KUBECTL" describe lm qwen3-8b -n ai | sed -n '/Conditions/,/Rule: *amx-guard/p' || true
