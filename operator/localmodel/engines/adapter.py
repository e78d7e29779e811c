"""The one interface every engine implements (its adapter), in three parts:

- `EnginePod` (engines/pod.py): its containers, init steps, readiness and
  health, as the renderer asks for them;
- `EngineTuning` (engines/tuning.py): how the rules' decisions (threads,
  context per slot, slots, KV cache type, flash attention, ...) are spelled
  for this engine (arguments, environment, Modelfile);
- `EngineDoctor` (engines/doctor.py): what doctor reads from a running engine
  and how it recognises one.

Rules decide *what*; the adapter says *how* for its engine. Each engine is a
package `engines/<name>/`: its facts in `__init__.py` (data, no imports: the
API reads them), and one module per part (`pod.py`, `tuning.py`,
`doctor.py`) composed in `adapter.py`. Adding an engine means one new package
and one line in `engines/registry.py`.
"""

from __future__ import annotations

from typing import Protocol

from localmodel.engines.doctor import EngineDoctor
from localmodel.engines.pod import EnginePod
from localmodel.engines.tuning import EngineTuning


class Engine(EnginePod, EngineTuning, EngineDoctor, Protocol):
    """An engine's adapter."""

    name: str
