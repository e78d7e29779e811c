# shellcheck shell=bash
# llama-server's image for the real test node, sourced by hack/build-images.sh
# (which defines ENGINE, REF, ENGINE_ROOTFS, die, renderer_image and the build
# steps; see its "the engines' images"). Keep build_llama-server's text as it
# is unless the image must change: it is part of the image's cache key.
[[ -n "${ENGINE[llama-server]:-}" ]] || die "hack/build-engines.sh --print lists no llama-server"
LLAMA_SERVER="${ENGINE[llama-server]}"
lcp_version="$(sed -n 's/.*llama-cpp-python:\([^ ]*\).*/\1/p' <<<"${ENGINE[versions]}")"
[[ -n "$lcp_version" ]] || die "no llama-cpp-python version in hack/build-engines.sh --print"
REF[llama-server]="$(renderer_image llama_server)"
ENGINE_ROOTFS+=(llama)

image_inputs_llama-server() { echo "rootfs $(rootfs_key llama) engine $LLAMA_SERVER"; }

build_llama-server() {
  make_rootfs llama
  [[ -x "$LLAMA_SERVER" ]] || die "no llama-server at $LLAMA_SERVER: run hack/build-engines.sh first"
  import_rootfs llama localhost/localmodel/rootfs-llama
  local c
  c="$("${B[@]}" from --pull=never localhost/localmodel/rootfs-llama)"
  "${B[@]}" copy --chmod 0755 "$c" "$LLAMA_SERVER" /app/llama-server >/dev/null
  # No CMD (the rootfs's /bin/sh would become llama-server's argument).
  "${B[@]}" config --cmd '[]' "$c"
  "${B[@]}" config --workingdir /app --entrypoint '["/app/llama-server"]' \
    --env LLAMA_ARG_HOST=0.0.0.0 "$c"
  stand_in_config "$c" "llama-server from the llama.cpp tree in PyPI's llama-cpp-python $lcp_version (hack/build-engines.sh), on Debian $SUITE minbase; not the upstream image"
  "${B[@]}" commit -q --rm "$c" "${REF[llama-server]}" >/dev/null
  smoke "${REF[llama-server]}" /bin/sh -c 'set -e; /app/llama-server --version; command -v curl sha256sum'
}
