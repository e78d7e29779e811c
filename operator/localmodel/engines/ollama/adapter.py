"""ollama's adapter: its parts composed (engines/adapter.py)."""

from __future__ import annotations

from localmodel.engines.ollama import NAME
from localmodel.engines.ollama.doctor import OllamaDoctor
from localmodel.engines.ollama.pod import OllamaPod
from localmodel.engines.ollama.tuning import OllamaTuning


class Ollama(OllamaPod, OllamaTuning, OllamaDoctor):
    name = NAME


ADAPTER = Ollama()
