"""tinyserve's adapter: its parts composed into one `Engine` (localmodel.engines.adapter)."""

from __future__ import annotations

from localmodel.engines.adapter import Engine
from tests.engines.tinyserve import NAME
from tests.engines.tinyserve.doctor import TinyServeDoctor
from tests.engines.tinyserve.pod import TinyServePod
from tests.engines.tinyserve.tuning import TinyServeTuning

ADAPTER = Engine(name=NAME, pod=TinyServePod(), tuning=TinyServeTuning(), doctor=TinyServeDoctor())
