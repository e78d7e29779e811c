#!/usr/bin/env bash
# Builds the real parts of the e2e/chart test tiers from Go modules, pinned:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
#   kwok, helm (v3) and kubeconform; kubelet and kube-proxy for the test
#   cluster's real node (docs/test-cluster.md); for the chart's monitoring
#   (docs/metrics.md): promtool, the Prometheus Operator's CRDs (YAML from its
#   module) and dashboard-check (hack/dashboard-check, Grafana's dashboard
#   schema types from grafana-foundation-sdk); lmhealth (hack/lmhealth: the
#   kstatus and Argo CD Lua health verdicts, docs/gitops.md); the local-path
#   provisioner (the dynamic volume provisioner kind and k3s ship) as the test
#   cluster's default StorageClass (docs/test-cluster.md).
# Binaries land in a versioned directory per tool under
#   ${LOCALMODEL_CACHE:-$HOME/.cache/localmodel-operator}/bin/<tool>-<version>/
# and a tool whose directory is complete is skipped, so a rerun takes seconds.
# GOMODCACHE/GOCACHE stay at Go's defaults, so they persist across runs too.
#
#   bash hack/build-tools.sh            build what is missing
#   bash hack/build-tools.sh --print    print NAME=PATH for every binary, build nothing
#   bash hack/build-tools.sh --check    exit 1 (listing them) if any binary is missing
#
# Exits non-zero on any failure. Needs only `go` (1.26) and the Go module proxy.
set -euo pipefail

# ---- pins (the one place the versions live; the test harness reads --print) ----
K8S_VERSION=v1.35.4          # kube-apiserver, -controller-manager, -scheduler, kubectl, kubelet, kube-proxy
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
PROMETHEUS_VERSION=v0.316.0          # github.com/prometheus/prometheus (Prometheus 3.16.0): promtool
PROMETHEUS_OPERATOR_VERSION=v0.85.0  # its monitoring.coreos.com CRDs
GRAFANA_SDK_VERSION=v0.0.22          # github.com/grafana/grafana-foundation-sdk/go
CLI_UTILS_VERSION=v0.37.2    # sigs.k8s.io/cli-utils: kstatus, as Flux uses it (lmhealth)
GOPHER_LUA_VERSION=v1.1.1    # github.com/yuin/gopher-lua: Argo CD's Lua (lmhealth)
LOCAL_PATH_VERSION=v0.0.30   # github.com/rancher/local-path-provisioner (kind's and k3s's default class)

CACHE="${LOCALMODEL_CACHE:-$HOME/.cache/localmodel-operator}"
BIN="$CACHE/bin"
SRC="$CACHE/src"   # wrapper go.mod modules (ours, generated here)

K8S_DIR="$BIN/kubernetes-$K8S_VERSION"
ETCD_DIR="$BIN/etcd-$ETCD_VERSION"
KWOK_DIR="$BIN/kwok-$KWOK_VERSION"
HELM_DIR="$BIN/helm-$HELM_VERSION"
KUBECONFORM_DIR="$BIN/kubeconform-$KUBECONFORM_VERSION"
PROMTOOL_DIR="$BIN/promtool-$PROMETHEUS_VERSION"
MONITORING_CRDS_DIR="$BIN/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION"
LOCAL_PATH_DIR="$BIN/local-path-provisioner-$LOCAL_PATH_VERSION"
# Keyed by the SDK's version and our source's digest: an edit rebuilds it.
DASHBOARD_CHECK_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/dashboard-check/main.go"
DASHBOARD_CHECK_DIR="$BIN/dashboard-check-$GRAFANA_SDK_VERSION-$(sha256sum "$DASHBOARD_CHECK_SRC" | cut -c1-12)"
# lmhealth is our own source: its directory is keyed by the module versions and
# by the source's hash, so an edit rebuilds it.
LMHEALTH_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lmhealth/main.go"
LMHEALTH_DIR="$BIN/lmhealth-$CLI_UTILS_VERSION-$GOPHER_LUA_VERSION-$K8S_VERSION-$(sha256sum <"$LMHEALTH_SRC" | cut -c1-12)"
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)

print_paths() {
  local c
  for c in "${K8S_CMDS[@]}"; do
    echo "$c=$K8S_DIR/$c"
  done
  echo "etcd=$ETCD_DIR/etcd"
  echo "kwok=$KWOK_DIR/kwok"
  echo "kwok-stages=$KWOK_DIR/stages.yaml"
  echo "helm=$HELM_DIR/helm"
  echo "kubeconform=$KUBECONFORM_DIR/kubeconform"
  echo "promtool=$PROMTOOL_DIR/promtool"
  echo "monitoring-crds=$MONITORING_CRDS_DIR/monitoring.coreos.com.yaml"
  echo "dashboard-check=$DASHBOARD_CHECK_DIR/dashboard-check"
  echo "versions=kubernetes:$K8S_VERSION etcd:$ETCD_VERSION kwok:$KWOK_VERSION helm:$HELM_VERSION kubeconform:$KUBECONFORM_VERSION prometheus:$PROMETHEUS_VERSION prometheus-operator:$PROMETHEUS_OPERATOR_VERSION grafana-foundation-sdk:$GRAFANA_SDK_VERSION cli-utils:$CLI_UTILS_VERSION gopher-lua:$GOPHER_LUA_VERSION local-path-provisioner:$LOCAL_PATH_VERSION"
  echo "lmhealth=$LMHEALTH_DIR/lmhealth"
  echo "local-path-provisioner=$LOCAL_PATH_DIR/local-path-provisioner"
}

missing() {
  print_paths | grep -v '^versions=' | while IFS='=' read -r name path; do
    [[ -x "$path" || ( "$path" == *.yaml && -s "$path" ) ]] || echo "$name ($path)"
  done
}

case "${1:-}" in
  --print) print_paths; exit 0 ;;
  --check)
    m="$(missing)"
    if [[ -n "$m" ]]; then echo "missing: $m" >&2; exit 1; fi
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print|--check]" >&2; exit 2 ;;
esac

if [[ -z "$(missing)" ]]; then
  echo "build-tools: all tools cached in $BIN" >&2
  exit 0
fi
command -v go >/dev/null || { echo "build-tools: 'go' not found on PATH" >&2; exit 1; }
mkdir -p "$BIN" "$SRC"

# Two test runs in the same tree must not build the same thing at once.
exec 9>"$CACHE/build.lock"
if ! flock -n 9; then
  echo "build-tools: another build holds $CACHE/build.lock; waiting" >&2
  flock 9
fi

export CGO_ENABLED=0
# shellcheck source=hack/go-flags.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-flags.sh"
log() { echo "build-tools: $*" >&2; }

# have_all DIR NAME...: true when every NAME exists and is executable in DIR.
have_all() {
  local dir="$1"; shift
  local n
  for n in "$@"; do [[ -x "$dir/$n" ]] || return 1; done
}

# install_dir TMP DEST: publish a finished build atomically.
install_dir() {
  rm -rf "$2"
  mv "$1" "$2"
}

# new_wrapper NAME: a fresh, empty directory for a wrapper module.
new_wrapper() {
  local dir="$SRC/$1"
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "$dir"
}

# Two wrapper modules, built side by side. Each holds several tools, so the
# packages they share (the Kubernetes libraries above all, but also gRPC,
# protobuf, OpenTelemetry) compile once per module instead of once per tool,
# and the two builds fill each other's gaps on 2 cores (module downloads,
# single-threaded links):
#   cluster  kube-apiserver, -controller-manager, -scheduler, kubectl, kubelet,
#            kube-proxy and etcd, at the cluster's own library versions
#   clients  kwok, helm, kubeconform and promtool, at the newest Kubernetes
#            client libraries any of them asks for (helm's and promtool's
#            v0.37); kwok's go.mod asks for v0.36, and minimal version
#            selection moves it up within the same major
# One module for all does not compile: helm needs k8s.io/apimachinery newer
# than the cluster's v0.35, and no kwok release builds against v0.35.
# lmhealth and dashboard-check keep their own small modules (our main.go each),
# lmhealth at the cluster's k8s.io/api and apimachinery.

# wrapper_get DIR PKG@VERSION...: the tools as `tool` directives of the
# wrapper's go.mod, so `go build` finds them without a `go mod tidy` (which
# would also fetch every tool's test-only dependencies).
wrapper_get() {
  local dir="$1"; shift
  (cd "$dir" && go get -tool "$@")
}

# build_one DIR OUT LDFLAGS PKG...: binaries from a wrapper module (build tags
# from TAGS in the environment, when set).
build_one() {
  local dir="$1" out="$2" ld="$3"; shift 3
  (cd "$dir" && go build -trimpath ${TAGS:+-tags "$TAGS"} -ldflags "-s -w $ld" -o "$out" "$@")
}

build_cluster_module() {
  local need_k8s=1 need_etcd=1
  have_all "$K8S_DIR" "${K8S_CMDS[@]}" && { log "kubernetes $K8S_VERSION: cached"; need_k8s=0; }
  have_all "$ETCD_DIR" etcd && { log "etcd $ETCD_VERSION: cached"; need_etcd=0; }
  (( need_k8s + need_etcd )) || return 0
  log "cluster module: building kubernetes $K8S_VERSION (${K8S_CMDS[*]}) and etcd $ETCD_VERSION"
  local t0=$SECONDS
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local staging_version="v0.${K8S_VERSION#v1.}"
  local modfile dir
  modfile="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "$modfile" ]] || { log "cannot download k8s.io/kubernetes@$K8S_VERSION"; return 1; }
  dir="$(new_wrapper "cluster-$K8S_VERSION-etcd-$ETCD_VERSION")"
  {
    echo "module localmodel.dev/tools/cluster"
    echo
    grep -E '^go [0-9]' "$modfile"
    grep -E '^godebug ' "$modfile" || true
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # k8s.io/kubernetes points its staging modules at ./staging/src; point them
    # at the published v0.<minor>.<patch> modules instead.
    sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$modfile" \
      | sort -u | while read -r m; do echo "	$m => $m $staging_version"; done
    echo ")"
  } >"$dir/go.mod"
  local pkgs=() c
  for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  # Name the versions: a bare package path would mean @upgrade (the newest
  # release). etcd's server/v3 go.mod has relative replaces; as a dependency
  # of a wrapper module they are ignored and the published modules are used.
  wrapper_get "$dir" "${pkgs[@]/%/@$K8S_VERSION}" "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  local out
  if (( need_etcd )); then
    out="$ETCD_DIR.tmp"; rm -rf "$out"; mkdir -p "$out"
    build_one "$dir" "$out/etcd" "" go.etcd.io/etcd/server/v3
    install_dir "$out" "$ETCD_DIR"
    log "etcd $ETCD_VERSION: built, $((SECONDS - t0)) s into the cluster module"
  fi
  if (( need_k8s )); then
    local ld="" p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
      ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    done
    out="$K8S_DIR.tmp"; rm -rf "$out"; mkdir -p "$out"
    # One `go build` for the six commands links them in parallel.
    build_one "$dir" "$out/" "$ld" "${pkgs[@]}"
    install_dir "$out" "$K8S_DIR"
    log "kubernetes $K8S_VERSION: built ($("$K8S_DIR/kube-apiserver" --version))"
  fi
  log "cluster module: done in $((SECONDS - t0)) s"
}

build_clients_module() {
  local todo=()
  have_all "$KWOK_DIR" kwok && log "kwok $KWOK_VERSION: cached" || todo+=(kwok)
  have_all "$HELM_DIR" helm && log "helm $HELM_VERSION: cached" || todo+=(helm)
  have_all "$KUBECONFORM_DIR" kubeconform && log "kubeconform $KUBECONFORM_VERSION: cached" \
    || todo+=(kubeconform)
  have_all "$PROMTOOL_DIR" promtool && log "promtool $PROMETHEUS_VERSION: cached" || todo+=(promtool)
  (( ${#todo[@]} )) || return 0
  log "clients module: building ${todo[*]}"
  local t0=$SECONDS dir
  dir="$(new_wrapper "clients-kwok-$KWOK_VERSION-helm-$HELM_VERSION-kubeconform-$KUBECONFORM_VERSION-prometheus-$PROMETHEUS_VERSION")"
  printf 'module localmodel.dev/tools/clients\n\ngo 1.26\n' >"$dir/go.mod"
  wrapper_get "$dir" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
  local tool out ld pkg p minor v
  for tool in "${todo[@]}"; do
    local tags=""
    case "$tool" in
      kwok)
        out="$KWOK_DIR"; pkg=sigs.k8s.io/kwok/cmd/kwok
        ld="-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" ;;
      helm)
        # helm's default "cluster" version (for `helm template` and lint) is
        # the k8s.io/client-go minor in helm's own go.mod, as its Makefile sets it.
        minor="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" \
          | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' \
          | xargs sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p')"
        [[ -n "$minor" ]] || { log "cannot read helm's k8s.io/client-go version"; return 1; }
        out="$HELM_DIR"; pkg=helm.sh/helm/v3/cmd/helm
        ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
        for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
          ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
        done ;;
      kubeconform)
        out="$KUBECONFORM_DIR"; pkg=github.com/yannh/kubeconform/cmd/kubeconform
        ld="-X main.version=$KUBECONFORM_VERSION" ;;
      promtool)
        # -tags remove_all_sd leaves out the service-discovery plugins (cloud
        # SDKs) that checking and unit-testing rules does not need; the -X is
        # what `promtool --version` prints.
        v="${PROMETHEUS_VERSION#v0.}"; v="${v:0:1}.${v:1}"  # v0.316.0 is Prometheus 3.16.0
        out="$PROMTOOL_DIR"; pkg=github.com/prometheus/prometheus/cmd/promtool
        tags=remove_all_sd
        ld="-X github.com/prometheus/common/version.Version=$v" ;;
    esac
    rm -rf "$out.tmp"; mkdir -p "$out.tmp"
    TAGS="$tags" build_one "$dir" "$out.tmp/$tool" "$ld" "$pkg"
    # kwok's stages.yaml lives next to the binary: keep it across a rebuild.
    [[ -s "$out/stages.yaml" ]] && cp "$out/stages.yaml" "$out.tmp/"
    install_dir "$out.tmp" "$out"
    log "$tool: built, $((SECONDS - t0)) s into the clients module"
  done
  log "clients module: done in $((SECONDS - t0)) s"
}

# The kwok binary has no built-in behaviour: kwokctl hands it the default Stage
# objects (node initialize + heartbeat with lease, pod ready/complete/delete).
# Take the same files from the pinned kwok module.
kwok_stages() {
  [[ -s "$KWOK_DIR/stages.yaml" ]] && return
  local dir f out="$KWOK_DIR/stages.yaml.tmp"
  dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  : >"$out"
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    [[ -f "$dir/kustomize/stage/$f.yaml" ]] || { log "kwok stage $f not in $dir"; return 1; }
    { echo "---"; cat "$dir/kustomize/stage/$f.yaml"; } >>"$out"
  done
  mv "$out" "$KWOK_DIR/stages.yaml"
}

# The CRDs the chart's ServiceMonitor, PodMonitor and PrometheusRule are
# validated against, as the Prometheus Operator's module ships them.
monitoring_crds() {
  local file="$MONITORING_CRDS_DIR/monitoring.coreos.com.yaml"
  [[ -s "$file" ]] && { log "prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION: cached"; return; }
  local dir kind f out="$MONITORING_CRDS_DIR.tmp"
  dir="$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  rm -rf "$out"; mkdir -p "$out"
  for kind in servicemonitors podmonitors prometheusrules; do
    f="$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml"
    [[ -f "$f" ]] || { log "$f is not in the module"; return 1; }
    { echo "---"; cat "$f"; } >>"$out/monitoring.coreos.com.yaml"
  done
  install_dir "$out" "$MONITORING_CRDS_DIR"
  log "prometheus-operator CRDs $PROMETHEUS_OPERATOR_VERSION: from $dir"
}

build_dashboard_check() {
  have_all "$DASHBOARD_CHECK_DIR" dashboard-check && { log "dashboard-check: cached"; return; }
  log "dashboard-check (grafana-foundation-sdk $GRAFANA_SDK_VERSION): building"
  local dir out="$DASHBOARD_CHECK_DIR.tmp" t0=$SECONDS
  dir="$(new_wrapper "dashboard-check")"
  cp "$DASHBOARD_CHECK_SRC" "$dir/main.go"
  printf 'module localmodel.dev/tools/dashboard-check\n\ngo 1.26\n\nrequire github.com/grafana/grafana-foundation-sdk/go %s\n' \
    "$GRAFANA_SDK_VERSION" >"$dir/go.mod"
  (cd "$dir" && go mod tidy)
  rm -rf "$out"; mkdir -p "$out"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$out/dashboard-check" .)
  install_dir "$out" "$DASHBOARD_CHECK_DIR"
  log "dashboard-check: built in $((SECONDS - t0)) s"
}

# lmhealth: kstatus (sigs.k8s.io/cli-utils) and gopher-lua behind our main.go.
build_lmhealth() {
  have_all "$LMHEALTH_DIR" lmhealth && { log "lmhealth: cached"; return; }
  log "lmhealth (cli-utils $CLI_UTILS_VERSION, gopher-lua $GOPHER_LUA_VERSION): building"
  local t0=$SECONDS dir out="$LMHEALTH_DIR.tmp"
  dir="$(new_wrapper lmhealth)"
  cp "$LMHEALTH_SRC" "$dir/main.go"
  printf 'module localmodel.dev/tools/lmhealth\n\ngo 1.26\n' >"$dir/go.mod"
  # k8s.io/api and apimachinery at the cluster's version (as Flux builds kstatus
  # with current ones): the compiled packages are shared with the cluster module.
  local staging_version="v0.${K8S_VERSION#v1.}"
  (cd "$dir" && go get "sigs.k8s.io/cli-utils@$CLI_UTILS_VERSION" \
     "github.com/yuin/gopher-lua@$GOPHER_LUA_VERSION" \
     "k8s.io/api@$staging_version" "k8s.io/apimachinery@$staging_version" && go mod tidy)
  rm -rf "$out"; mkdir -p "$out"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$out/lmhealth" .)
  install_dir "$out" "$LMHEALTH_DIR"
  log "lmhealth: built in $((SECONDS - t0)) s"
}

# The local-path provisioner: its go.mod has no replace directives, so its own
# module builds as published (`go install` at the pinned version).
build_local_path() {
  have_all "$LOCAL_PATH_DIR" local-path-provisioner \
    && { log "local-path-provisioner $LOCAL_PATH_VERSION: cached"; return; }
  log "local-path-provisioner $LOCAL_PATH_VERSION: building"
  local t0=$SECONDS out="$LOCAL_PATH_DIR.tmp"
  rm -rf "$out"; mkdir -p "$out"
  GOBIN="$out" go install -trimpath -ldflags "-s -w" \
    "github.com/rancher/local-path-provisioner@$LOCAL_PATH_VERSION"
  install_dir "$out" "$LOCAL_PATH_DIR"
  log "local-path-provisioner: built in $((SECONDS - t0)) s"
}

start=$SECONDS
# The two modules' streams run side by side; each stops at its first failure,
# and the script fails if either did.
( build_cluster_module; build_lmhealth ) &
cluster_pid=$!
( build_clients_module; kwok_stages; monitoring_crds; build_dashboard_check; build_local_path ) &
clients_pid=$!
failed=0
wait "$cluster_pid" || { log "the cluster stream failed (output above)"; failed=1; }
wait "$clients_pid" || { log "the clients stream failed (output above)"; failed=1; }
(( failed == 0 )) || exit 1

m="$(missing)"
if [[ -n "$m" ]]; then log "still missing after build: $m"; exit 1; fi
log "all tools ready in $BIN ($((SECONDS - start)) s)"
