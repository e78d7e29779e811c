"""llama_server's adapter: its parts composed into one `Engine` (engines/adapter.py)."""

from __future__ import annotations

from localmodel.engines.adapter import Engine
from localmodel.engines.llama_server import NAME
from localmodel.engines.llama_server.doctor import LlamaServerDoctor
from localmodel.engines.llama_server.pod import LlamaServerPod
from localmodel.engines.llama_server.tuning import LlamaServerTuning

ADAPTER = Engine(
    name=NAME, pod=LlamaServerPod(), tuning=LlamaServerTuning(), doctor=LlamaServerDoctor()
)
