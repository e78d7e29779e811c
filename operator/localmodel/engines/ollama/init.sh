set -eu
{remove}ollama serve >/tmp/ollama.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
trap 'exit 143' HUP INT TERM
tries=0
until ollama list >/dev/null 2>&1; do
  tries=$((tries+1))
  if [ "$tries" -gt 120 ]; then cat /tmp/ollama.log; exit 1; fi
  sleep 1
done
{weights}ollama create {model} -f {modelfile}
