"""ollama's adapter: its parts composed into one `Engine` (engines/adapter.py)."""

from __future__ import annotations

from localmodel.engines.adapter import Engine
from localmodel.engines.ollama import NAME
from localmodel.engines.ollama.doctor import OllamaDoctor
from localmodel.engines.ollama.pod import OllamaPod
from localmodel.engines.ollama.tuning import OllamaTuning

ADAPTER = Engine(name=NAME, pod=OllamaPod(), tuning=OllamaTuning(), doctor=OllamaDoctor())
