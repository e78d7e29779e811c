if ollama show {model} >/dev/null 2>&1; then
  echo 'localmodel: weights for '{model}' already on the volume: no pull'
else
  ollama pull {model}
fi
