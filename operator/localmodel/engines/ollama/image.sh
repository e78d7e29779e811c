# shellcheck shell=bash
# Ollama's image for the real test node, sourced by hack/build-images.sh (which
# defines ENGINE, REF, ENGINE_ROOTFS, die, renderer_image, engine_fact and the
# build steps; see its "the engines' images"). Keep build_ollama's text as it
# is unless the image must change: it is part of the image's cache key.
[[ -n "${ENGINE[ollama]:-}" ]] || die "hack/build-engines.sh --print lists no ollama"
OLLAMA_ROOT="$(dirname "$(dirname "${ENGINE[ollama]}")")"
ollama_version="$(sed -n 's/.* ollama:v\{0,1\}\([^ ]*\).*/\1/p' <<<"${ENGINE[versions]}")"
[[ -n "$ollama_version" ]] || die "no ollama version in hack/build-engines.sh --print"
OLLAMA_PORT="$(engine_fact ollama PORT)"
ollama_image="$(renderer_image ollama)"
# The renderer's repository, tagged with the Ollama version actually built: if
# the renderer pins another version, the test node has no image under its
# name, rather than a wrong one (tests/harness/test_images.py checks both agree).
REF[ollama]="${ollama_image%:*}:$ollama_version"
ENGINE_ROOTFS+=(ollama)

image_inputs_ollama() { echo "rootfs $(rootfs_key ollama) engine $OLLAMA_ROOT"; }

build_ollama() {
  make_rootfs ollama
  [[ -x "$OLLAMA_ROOT/bin/ollama" && -d "$OLLAMA_ROOT/lib/ollama" ]] \
    || die "no Ollama build at $OLLAMA_ROOT: run hack/build-engines.sh first"
  import_rootfs ollama localhost/localmodel/rootfs-ollama
  local c
  c="$("${B[@]}" from --pull=never localhost/localmodel/rootfs-ollama)"
  # /bin is /usr/bin in Debian 12 (merged /usr): /bin/ollama, and Ollama finds
  # its runner and CPU libraries at <executable>/../lib/ollama = /usr/lib/ollama.
  "${B[@]}" copy --chmod 0755 "$c" "$OLLAMA_ROOT/bin/ollama" /usr/bin/ollama >/dev/null
  "${B[@]}" copy "$c" "$OLLAMA_ROOT/lib/ollama" /usr/lib/ollama >/dev/null
  "${B[@]}" config --cmd '["serve"]' "$c"
  "${B[@]}" config --entrypoint '["/bin/ollama"]' --port "$OLLAMA_PORT" \
    --env "OLLAMA_HOST=0.0.0.0:$OLLAMA_PORT" "$c"
  stand_in_config "$c" "Ollama $ollama_version built by hack/build-engines.sh from the Go module proxy, on Debian $SUITE minbase; not the upstream image"
  "${B[@]}" commit -q --rm "$c" "${REF[ollama]}" >/dev/null
  # Its runner starts in the image (its libraries resolve there).
  smoke "${REF[ollama]}" /bin/sh -c 'set -e; command -v ollama; ollama --version; /usr/lib/ollama/llama-server --version'
}

