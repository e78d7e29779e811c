#!/usr/bin/env bash
# Builds the container images a real test node runs, without a registry, as
# OCI archives cached by content outside the repo:
#
#   operator      the project's own Dockerfile, built by `buildah bud
#                 --pull=never` with BASE_IMAGE set to a Debian 12 base (python3
#                 3.11 + pip) made from Debian's packages with mmdebstrap. Tagged
#                 as the chart's default image (values.yaml image.repository :
#                 Chart.yaml appVersion), which is also the renderer's
#                 DEFAULT_OPERATOR_IMAGE (gateway sidecar).
#   ollama        a stand-in for the renderer's pinned Ollama image (its
#                 repository, tagged with the version hack/build-engines.sh
#                 built): Debian 12 minbase + ca-certificates, /bin/ollama,
#                 /usr/lib/ollama/, ENTRYPOINT /bin/ollama, CMD serve.
#   llama-server  a stand-in for the renderer's pinned llama-server image:
#                 Debian 12 minbase + ca-certificates + curl, /app/llama-server
#                 (the build hack/build-engines.sh made), ENTRYPOINT
#                 /app/llama-server, LLAMA_ARG_HOST=0.0.0.0.
#   pause         a static pause (C below, gcc -static) under the sandbox image
#                 name the real node's containerd config uses.
#   helper        a stand-in for busybox: Debian's busybox-static (extracted by
#                 mmdebstrap, no other package) with its applets linked in /bin;
#                 the local-path provisioner's helper pods (mkdir, rm) run it.
# Stand-ins carry the upstream names so examples and default pinned images work
# unchanged on the test node only; docs/test-cluster.md lists what each is
# built from and how it differs from upstream. Each stand-in also carries the
# label dev.localmodel.stand-in saying so.
#
#   bash hack/build-images.sh [NAME...]         build what is missing (NAME: operator,
#                                               ollama, llama-server, pause; default all)
#   bash hack/build-images.sh --print [NAME...] print, build nothing
#   bash hack/build-images.sh --check [NAME...] exit 1 (listing them) if an archive is missing
#   bash hack/build-images.sh --no-engines      build what needs no engine: the operator,
#                                               pause and helper images, the engine images'
#                                               root filesystems (hack/test.sh runs it while
#                                               the engines build)
#   bash hack/build-images.sh --push HOST[:PORT][/PREFIX] [--ca FILE] [--authfile FILE] [NAME...]
#                                               build what is missing, then copy each image
#                                               into that registry with skopeo, under the
#                                               mirror layout: the reference without its
#                                               registry host (docker.io/ollama/ollama:T ->
#                                               HOST/ollama/ollama:T; Docker Hub's one-word
#                                               names under library/). --ca: a CA file the
#                                               registry's certificate chains to (default:
#                                               the system's); --authfile: a
#                                               containers-auth.json (`skopeo login
#                                               --authfile F HOST` writes one; default:
#                                               skopeo's own, ${XDG_RUNTIME_DIR}/containers/
#                                               auth.json). Prints `UPSTREAM PUSHED` per image.
#
# --print format (stable): one line per image, in the order above,
#   REFERENCE ARCHIVE
# separated by one space; REFERENCE (e.g. registry.k8s.io/pause:3.10) has no
# spaces, ARCHIVE is the rest of the line: the absolute path of an OCI archive
# holding that one image under that reference (`ctr -n k8s.io images import
# ARCHIVE` imports it). The paths are known before anything is built.
#
# Cache: ${LOCALMODEL_CACHE:-~/.cache/localmodel-operator}/images/
#   <name>-<key>.oci.tar     the archives; <key> hashes every input of the image:
#                            the function text that builds it (so the recipe is
#                            part of the key), the files it copies in (for the
#                            operator: Dockerfile, .dockerignore, pyproject.toml,
#                            README.md, operator/), the engine build's directory
#                            (named by version and build flags) and the rootfs key
#   rootfs/<name>-<key>.tar  the mmdebstrap root filesystems
#   debs/                    Debian packages downloaded by mmdebstrap (reused)
# A rerun with unchanged inputs builds nothing and takes seconds. Not in the key:
# new Debian point releases and new PyPI releases of the operator's
# dependencies (delete an archive to rebuild it with them).
#
# Needs (as root): buildah and mmdebstrap (Debian packages; installed with
# apt-get when missing), gcc with a static libc, and for the engine images the
# engines from hack/build-engines.sh (run it first). buildah runs with its own
# storage in a temporary directory (removed at exit), --isolation chroot and
# --network host (no network namespace, no netavark network or iptables chain);
# the state it still creates outside that directory (/var/lib/containers,
# /run/containers, /etc/containers/networks) is removed at exit when it did not
# exist before. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${LOCALMODEL_CACHE:-$HOME/.cache/localmodel-operator}"
IMAGES="$CACHE/images"
PY="${PYTHON:-python3}"
# The images, in --print order: the operator, each engine that has one (its
# package's image.sh, below), the pause and helper images.
NAMES=(operator)

# ---- pins and names (the facts live elsewhere; this reads them) ----
SUITE=bookworm                         # Debian 12: python3 is 3.11, like python:3.11-slim
MIRROR=http://deb.debian.org/debian
PAUSE_IMAGE=registry.k8s.io/pause:3.10 # the real node's containerd sandbox_image
BASE_REPO=localhost/localmodel/debian12-python3  # the operator's local base: a local name
# The local-path provisioner's helper image: Debian 12's busybox is 1.35.0.
HELPER_IMAGE=docker.io/library/busybox:1.35

log() { echo "build-images: $*" >&2; }
die() { log "$*"; exit 1; }

# The chart's default image: values.yaml's image.repository and Chart.yaml's appVersion.
chart_image() {
  local repo version
  repo="$(awk '/^image:/ {f = 1; next} f && /^[^ #]/ {f = 0} f && $1 == "repository:" {print $2; exit}' \
    charts/localmodel-operator/values.yaml | tr -d '"')"
  version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/localmodel-operator/Chart.yaml)"
  [[ -n "$repo" && -n "$version" ]] \
    || die "cannot read image.repository (charts/localmodel-operator/values.yaml) or appVersion (Chart.yaml)"
  echo "$repo:$version"
}

# The engine images the renderer pins (operator/localmodel/engines/<engine>/__init__.py IMAGE).
renderer_image() { engine_fact "$1" IMAGE; }
# An engine's fact (IMAGE, PORT, ...) from its home, operator/localmodel/engines/<engine>/__init__.py.
engine_fact() {
  PYTHONPATH=operator "$PY" -c "from localmodel.engines import $1; print($1.$2)" \
    || die "cannot read $2 from operator/localmodel/engines/$1/__init__.py"
}

# hack/build-engines.sh --print: NAME=PATH lines.
declare -A ENGINE=()
engine_print="$(bash hack/build-engines.sh --print)" || die "hack/build-engines.sh --print failed"
while IFS='=' read -r k v; do ENGINE[$k]="$v"; done <<<"$engine_print"
[[ -n "${ENGINE[versions]:-}" ]] || die "hack/build-engines.sh --print lists no versions"

operator_image="$(chart_image)"
declare -A REF=(
  [operator]="$operator_image"
  [pause]="$PAUSE_IMAGE"
  [helper]="$HELPER_IMAGE"
)

# ---- the engines' images: each engine's package says how its image is made ----
# For every shipped engine, in the registry's order (localmodel.engines.SHIPPED:
# an out-of-tree engine the tests register through LOCALMODEL_ENGINE_PACKAGES
# ships no image), its package's image.sh, when it has one, is sourced: it sets REF[<NAME>] and
# what its recipe reads (from hack/build-engines.sh --print, ENGINE[...], and the
# engine's facts), adds its root filesystem to ENGINE_ROOTFS, and defines
# build_<NAME> (the recipe; its text is part of the key, as here) and
# image_inputs_<NAME> (the rest of the key's inputs). An engine without one
# has no image. The root filesystems' package sets stay in
# rootfs_args below: its text is part of every rootfs key.
ENGINE_ROOTFS=()
engine_dirs="$(PYTHONPATH=operator LOCALMODEL_ENGINE_PACKAGES= "$PY" -c '
import os, sys
from localmodel import engines
for e in engines.SHIPPED:
    print(e.NAME, os.path.dirname(sys.modules[engines.package(e)].__file__))')" \
  || die "cannot list the engines (localmodel.engines.SHIPPED)"
while read -r engine dir; do
  [[ -f "$dir/image.sh" ]] || continue
  # shellcheck source=/dev/null  # operator/localmodel/engines/<engine>/image.sh
  source "$dir/image.sh"
  [[ -n "${REF[$engine]:-}" ]] && declare -F "build_$engine" "image_inputs_$engine" >/dev/null \
    || die "$dir/image.sh sets no REF[$engine], build_$engine or image_inputs_$engine"
  NAMES+=("$engine")
done <<<"$engine_dirs"
NAMES+=(pause helper)

# prune GLOB: keep the KEEP newest files matching $IMAGES/GLOB (other
# checkouts, e.g. several worktrees, may be using older inputs; an operator
# archive is ~75 MB), delete the rest.
KEEP=8
prune() {
  local f
  # shellcheck disable=SC2086  # GLOB is a glob
  ls -t $IMAGES/$1 2>/dev/null | tail -n +$((KEEP + 1)) | while IFS= read -r f; do rm -f "$f"; done
}

# ---- the root filesystems --------------------------------------------------------
# rootfs_args NAME: mmdebstrap's package set for each root filesystem.
rootfs_args() {
  case "$1" in
    # python3-pip in place of python:3.11-slim's pip; Debian marks its Python
    # externally managed, which would stop the Dockerfile's `pip install`.
    python) printf '%s\n' --include=python3,python3-pip,ca-certificates \
      '--customize-hook=rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED' ;;
    # As upstream's images: Ollama's has ca-certificates only (no curl);
    # llama.cpp's server image has curl (its init step downloads with it).
    ollama) printf '%s\n' --include=ca-certificates ;;
    llama) printf '%s\n' --include=ca-certificates,curl ;;
    *) die "no rootfs $1" ;;
  esac
}

rootfs_key() {
  { declare -f rootfs_args make_rootfs; echo "$SUITE $MIRROR $1"; } | sha256sum | cut -c1-16
}
rootfs_path() { echo "$IMAGES/rootfs/$1-$(rootfs_key "$1").tar"; }

# make_rootfs NAME: Debian $SUITE minbase + the package set, as a tarball.
make_rootfs() {
  local name="$1" out args=() t0=$SECONDS
  out="$(rootfs_path "$name")"
  [[ -s "$out" ]] && return 0
  mapfile -t args < <(rootfs_args "$name")
  mkdir -p "$IMAGES/rootfs" "$IMAGES/debs"
  log "mmdebstrap $SUITE minbase ${args[*]} (a minute or more, cold)"
  # Merged /usr as debootstrap makes it (directory symlinks; no usrmerge
  # package, so no perl). Packages are kept in debs/ and offered to the next
  # run (mmdebstrap's documented sync-in/sync-out cache); documentation is
  # left out.
  # Debian's own tools, not whichever python3 comes first on PATH (mmtarfilter).
  env PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    mmdebstrap --variant=minbase --format=tar --skip=essential/unlink \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
    --setup-hook="sync-in $IMAGES/debs /var/cache/apt/archives/" \
    --customize-hook="sync-out /var/cache/apt/archives $IMAGES/debs" \
    "${args[@]}" "$SUITE" "$out.tmp" "$MIRROR" >"$IMAGES/rootfs/$name.log" 2>&1 \
    || { tail -30 "$IMAGES/rootfs/$name.log" >&2; rm -f "$out.tmp"; die "mmdebstrap failed for $name"; }
  mv "$out.tmp" "$out"
  log "rootfs $name in $((SECONDS - t0)) s"
  prune "rootfs/$name-*.tar"
}

# ---- buildah, in a storage of its own -----------------------------------------------
WORK=""
B=()
state_created=()

cleanup() {
  local p m
  if [[ -n "$WORK" && -d "$WORK" ]]; then
    "${B[@]}" rm --all >/dev/null 2>&1 || true
    while read -r m; do
      umount -l "$m" 2>/dev/null || true
    done < <(findmnt -rn -o TARGET | grep -F "$WORK" | sort -r)
    rm -rf "$WORK"
  fi
  for p in "${state_created[@]}"; do rm -rf "$p"; done
}

start_buildah() {
  [[ -n "$WORK" ]] && return 0
  local p
  for p in /var/lib/containers /run/containers /etc/containers/networks; do
    [[ -e "$p" ]] || state_created+=("$p")
  done
  trap cleanup EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  WORK="$(mktemp -d "$IMAGES/.work.XXXXXX")"
  # Network definitions (netavark) go to the work dir, not /etc/containers/networks.
  printf '[network]\nnetwork_config_dir = "%s/networks"\n' "$WORK" >"$WORK/containers.conf"
  export CONTAINERS_CONF="$WORK/containers.conf"
  B=(buildah --root "$WORK/root" --runroot "$WORK/run" --storage-driver overlay)
}

# import_rootfs NAME REF: the rootfs tarball as a one-layer image.
import_rootfs() {
  local c
  c="$("${B[@]}" from scratch)"
  "${B[@]}" add "$c" "$(rootfs_path "$1")" / >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd '["/bin/sh"]' "$c"
  "${B[@]}" commit -q --rm "$c" "$2" >/dev/null
}

# smoke REF CMD...: runs CMD in a container of REF (chroot, no network namespace).
smoke() {
  local ref="$1" c
  shift
  local out
  c="$("${B[@]}" from --pull=never "$ref")"
  out="$("${B[@]}" run --isolation chroot --network host "$c" -- "$@" 2>&1)" \
    || die "$ref: '$*' failed in the image: $out"
  "${B[@]}" rm "$c" >/dev/null
}

# save REF ARCHIVE: the image as an OCI archive under its reference.
save() {
  rm -f "$2.tmp"
  "${B[@]}" push -q "$1" "oci-archive:$2.tmp:$1" >/dev/null
  mv "$2.tmp" "$2"
}

stand_in_config() {  # stand_in_config CONTAINER WHAT
  "${B[@]}" config --label "dev.localmodel.stand-in=$2" \
    --label org.opencontainers.image.source=hack/build-images.sh "$1"
}

# ---- the images ------------------------------------------------------------------
build_operator() {
  make_rootfs python
  local base
  base="$BASE_REPO:$(rootfs_key python)"
  import_rootfs python "$base"
  # The host's CA bundle is mounted (read-only, not copied) for the RUN steps:
  # pip reaches PyPI through this machine's TLS-inspecting egress, whose CA
  # the Debian bundle lacks. The image keeps Debian's bundle.
  "${B[@]}" bud --pull=never --isolation chroot --network host --layers=false \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    --build-arg "BASE_IMAGE=$base" -t "${REF[operator]}" -f Dockerfile . \
    >"$IMAGES/operator.log" 2>&1 || { tail -30 "$IMAGES/operator.log" >&2; die "buildah bud failed"; }
  smoke "${REF[operator]}" localmodel --help
}

build_pause() {
  local dir="$WORK/pause" c
  mkdir -p "$dir"
  # The sandbox's init: sleeps until SIGINT/SIGTERM, reaping orphaned children.
  cat >"$dir/pause.c" <<'EOF'
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = stop;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
}
EOF
  gcc -static -Os -s -o "$dir/pause" "$dir/pause.c" || die "gcc -static failed (libc6-dev has the static libc)"
  c="$("${B[@]}" from scratch)"
  "${B[@]}" copy --chmod 0755 "$c" "$dir/pause" /pause >/dev/null
  "${B[@]}" config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  stand_in_config "$c" "a static pause built by hack/build-images.sh with gcc -static; not the upstream image"
  "${B[@]}" commit -q --rm "$c" "${REF[pause]}" >/dev/null
}

# The helper's root filesystem: busybox-static alone, extracted (no dpkg, no shell
# but busybox's), as a tarball.
helper_rootfs_key() {
  { declare -f helper_rootfs; echo "$SUITE $MIRROR busybox-static"; } | sha256sum | cut -c1-16
}
helper_rootfs() {
  local out t0=$SECONDS
  out="$IMAGES/rootfs/helper-$(helper_rootfs_key).tar"
  if [[ ! -s "$out" ]]; then
    mkdir -p "$IMAGES/rootfs" "$IMAGES/debs"
    env PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      mmdebstrap --variant=extract --include=busybox-static --format=tar \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
      --setup-hook="sync-in $IMAGES/debs /var/cache/apt/archives/" \
      --customize-hook="sync-out /var/cache/apt/archives $IMAGES/debs" \
      "$SUITE" "$out.tmp" "$MIRROR" >"$IMAGES/rootfs/helper.log" 2>&1 \
      || { tail -30 "$IMAGES/rootfs/helper.log" >&2; rm -f "$out.tmp"; die "mmdebstrap failed for helper"; }
    mv "$out.tmp" "$out"
    log "rootfs helper in $((SECONDS - t0)) s"
  fi
  echo "$out"
}

build_helper() {
  local rootfs c
  rootfs="$(helper_rootfs)"
  c="$("${B[@]}" from scratch)"
  "${B[@]}" add "$c" "$rootfs" / >/dev/null
  # Every applet as a symlink in /bin (sh, mkdir, rm...); the scripts the
  # provisioner mounts run as `/bin/sh /script/setup`.
  "${B[@]}" run --isolation chroot --network host "$c" -- /bin/busybox --install -s /bin
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd '["sh"]' "$c"
  stand_in_config "$c" "Debian $SUITE's busybox-static, extracted by mmdebstrap; not the upstream image"
  "${B[@]}" commit -q --rm "$c" "${REF[helper]}" >/dev/null
  smoke "${REF[helper]}" /bin/sh -c 'set -e; busybox | head -1 | grep -q "v${HELPER_IMAGE##*:}"; mkdir -m 0777 -p /tmp/x/y; rm -rf /tmp/x'
}

# ---- pushing ------------------------------------------------------------------------
# mirror_path REFERENCE: the reference without its registry host, as a mirror
# stores it (tests/harness/registry.py mirror_path is the same rule).
mirror_path() {
  local ref="$1" first="${1%%/*}" host path
  if [[ "$ref" == */* && ( "$first" == *.* || "$first" == *:* || "$first" == localhost ) ]]; then
    host="$first"; path="${ref#*/}"
  else
    host=docker.io; path="$ref"
  fi
  [[ "$host" == docker.io && "$path" != */* ]] && path="library/$path"
  echo "$path"
}

# push_images: skopeo copies each selected archive to $PUSH (layers as they are,
# no recompression; blobs the registry has are skipped).
push_images() {
  command -v skopeo >/dev/null || die "skopeo is not installed (Debian: skopeo)"
  local certs name a target t0=$SECONDS
  local dest=(--retry-times 3)
  if [[ -n "$PUSH_CA" ]]; then
    [[ -s "$PUSH_CA" ]] || die "--ca $PUSH_CA: no such file"
    certs="$(mktemp -d)"
    cp "$PUSH_CA" "$certs/ca.crt"
    dest+=(--dest-cert-dir "$certs")
  fi
  if [[ -n "$PUSH_AUTH" ]]; then
    [[ -s "$PUSH_AUTH" ]] || die "--authfile $PUSH_AUTH: no such file"
    dest+=(--dest-authfile "$PUSH_AUTH")
  fi
  for name in "${selected[@]}"; do
    a="$(archive "$name")"
    [[ -s "$a" ]] || die "$name is not built ($a)"
    target="$PUSH/$(mirror_path "${REF[$name]}")"
    skopeo copy --quiet "${dest[@]}" "oci-archive:$a:${REF[$name]}" "docker://$target" >&2 \
      || die "pushing $name to $target failed"
    echo "${REF[$name]} $target"
  done
  [[ -n "${certs:-}" ]] && rm -rf "$certs"
  log "pushed ${#selected[@]} image(s) to $PUSH in $((SECONDS - t0)) s"
}

# ---- keys -------------------------------------------------------------------------
# inputs NAME: everything the image is made of, as text to hash.
inputs() {
  echo "ref ${REF[$1]}"
  declare -f "build_$1" import_rootfs smoke save stand_in_config
  case "$1" in
    operator)
      echo "rootfs $(rootfs_key python)"
      sha256sum Dockerfile .dockerignore pyproject.toml README.md
      find operator -type f ! -path '*/__pycache__/*' ! -path '*.egg-info/*' -print0 \
        | LC_ALL=C sort -z | xargs -0 sha256sum ;;
    pause) gcc --version | head -1 ;;
    helper) echo "rootfs $(helper_rootfs_key)" ;;
    *) "image_inputs_$1" ;;  # an engine's (its image.sh)
  esac
}

archive() { echo "$IMAGES/$1-$(inputs "$1" | sha256sum | cut -c1-16).oci.tar"; }

# ---- main -----------------------------------------------------------------------------
mode=build
PUSH="" PUSH_CA="" PUSH_AUTH=""
usage="usage: $0 [--print|--check|--no-engines|--push HOST[:PORT][/PREFIX] [--ca FILE] [--authfile FILE]] [NAME...]  (NAME: ${NAMES[*]})"
case "${1:-}" in
  --print) mode=print; shift ;;
  --check) mode=check; shift ;;
  --no-engines) mode=early; shift ;;
  --push)
    [[ -n "${2:-}" && "${2:-}" != -* ]] || { echo "--push needs a registry (HOST[:PORT][/PREFIX])" >&2; exit 2; }
    PUSH="${2%/}"; shift 2
    while [[ "${1:-}" == --* ]]; do
      [[ -n "${2:-}" ]] || { echo "$1 needs a value" >&2; exit 2; }
      case "$1" in
        --ca) PUSH_CA="$2" ;;
        --authfile) PUSH_AUTH="$2" ;;
        *) echo "$usage" >&2; exit 2 ;;
      esac
      shift 2
    done ;;
  -*) echo "$usage" >&2; exit 2 ;;
esac
selected=("$@")
# --no-engines: what needs no engine build (hack/test.sh runs it beside them).
[[ "$mode" == early ]] && selected=(operator pause helper)
((${#selected[@]})) || selected=("${NAMES[@]}")
for name in "${selected[@]}"; do
  [[ -n "${REF[$name]+x}" ]] || { echo "unknown image '$name' (known: ${NAMES[*]})" >&2; exit 2; }
done

if [[ "$mode" == print ]]; then
  for name in "${NAMES[@]}"; do
    [[ " ${selected[*]} " == *" $name "* ]] && echo "${REF[$name]} $(archive "$name")"
  done
  exit 0
fi
if [[ "$mode" == check ]]; then
  missing=()
  for name in "${selected[@]}"; do
    a="$(archive "$name")"
    [[ -s "$a" ]] || missing+=("$name ($a)")
  done
  if ((${#missing[@]})); then echo "missing: ${missing[*]}" >&2; exit 1; fi
  exit 0
fi

todo=()
for name in "${NAMES[@]}"; do
  [[ " ${selected[*]} " == *" $name "* && ! -s "$(archive "$name")" ]] && todo+=("$name")
done
start=$SECONDS
rootfs_missing=0
for r in "${ENGINE_ROOTFS[@]}"; do [[ -s "$(rootfs_path "$r")" ]] || rootfs_missing=1; done
if ((${#todo[@]})) || [[ "$mode" == early && $rootfs_missing == 1 ]]; then
  [[ "$(id -u)" == 0 ]] || die "building images needs root (buildah storage, mmdebstrap)"
  need=()
  command -v buildah >/dev/null || need+=(buildah)
  command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
  if ((${#need[@]})); then
    log "installing ${need[*]} from Debian"
    apt-get install -y -q -o DPkg::Lock::Timeout=600 "${need[@]}" >&2 \
      || { apt-get update -q >&2 && apt-get install -y -q -o DPkg::Lock::Timeout=600 "${need[@]}" >&2; } \
      || die "cannot install ${need[*]}"
  fi
  mkdir -p "$IMAGES"
  exec 9>"$IMAGES/build.lock"
  if ! flock -n 9; then
    log "another build holds $IMAGES/build.lock; waiting"
    flock 9
  fi
  start_buildah
  for name in "${todo[@]}"; do
    a="$(archive "$name")"
    [[ -s "$a" ]] && continue  # built by the run that held the lock
    t0=$SECONDS
    "build_$name"
    save "${REF[$name]}" "$a"
    log "built $name (${REF[$name]}) in $((SECONDS - t0)) s: $(du -h "$a" | cut -f1) archive"
    prune "$name-*.oci.tar"
  done
  if [[ "$mode" == early ]]; then  # the engine images' root filesystems
    for r in "${ENGINE_ROOTFS[@]}"; do make_rootfs "$r"; done
  fi
fi
log "ready in $((SECONDS - start)) s:"
for name in "${selected[@]}"; do echo "  ${REF[$name]} $(archive "$name")" >&2; done
if [[ -n "$PUSH" ]]; then
  push_images
fi
