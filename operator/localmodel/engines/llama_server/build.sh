# shellcheck shell=bash
# How hack/build-engines.sh builds llama-server and llama-bench (its part
# `llama`), sourced by it (which defines CACHE, JOBS, PY, simd_flags, log,
# sdist and engine_fact). The llama.cpp tree vendored in PyPI's
# llama-cpp-python TESTED_VERSION (this package's facts; override with
# LLAMA_CPP_PYTHON_VERSION).
LCP_VERSION="${LLAMA_CPP_PYTHON_VERSION:-$(engine_fact llama_server TESTED_VERSION)}"
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
PARTS+=(llama)

print_llama() {
  echo "llama-server=$LLAMA_ROOT/llama-server"
  echo "llama-bench=$LLAMA_ROOT/llama-bench"
}
versions_llama() { echo "llama-cpp-python:$LCP_VERSION"; }
have_llama() { [[ -x "$LLAMA_ROOT/llama-server" && -x "$LLAMA_ROOT/llama-bench" ]]; }
missing_llama() { echo "llama-server/llama-bench ($LLAMA_ROOT)"; }

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
