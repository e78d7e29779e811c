"""llama_server's adapter: its parts composed (engines/adapter.py)."""

from __future__ import annotations

from localmodel.engines.llama_server import NAME
from localmodel.engines.llama_server.doctor import LlamaServerDoctor
from localmodel.engines.llama_server.pod import LlamaServerPod
from localmodel.engines.llama_server.tuning import LlamaServerTuning


class LlamaServer(LlamaServerPod, LlamaServerTuning, LlamaServerDoctor):
    name = NAME


ADAPTER = LlamaServer()
