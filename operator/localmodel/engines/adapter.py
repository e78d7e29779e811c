"""The one interface every engine implements (its adapter): one `Engine`
object holding its three parts, each part's interface declared in one place:

- `pod` (`EnginePod`, engines/pod.py): its containers, init steps, readiness
  and health, as the renderer asks for them;
- `tuning` (`EngineTuning`, engines/tuning.py): how the rules' decisions
  (threads, context per slot, slots, KV cache type, flash attention, ...) are
  spelled for this engine (arguments, environment, Modelfile);
- `doctor` (`EngineDoctor`, engines/doctor.py): what doctor reads from a
  running engine and how it recognises one.

Rules decide *what*; the adapter says *how* for its engine. Each engine is a
package `engines/<name>/`: its facts in `__init__.py` (data, no imports: the
API reads them), one module per part (`pod.py`, `tuning.py`, `doctor.py`)
composed in `adapter.py` as its `ADAPTER`, and its own rules in `rules.py`.
The registry (engines/registry.py) finds every engine package; none is listed
by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from localmodel.engines.doctor import EngineDoctor
from localmodel.engines.pod import EnginePod
from localmodel.engines.tuning import EngineTuning


@dataclass(frozen=True)
class Engine:
    """An engine's adapter: its name (spec.engine.name) and its three parts."""

    name: str
    pod: EnginePod
    tuning: EngineTuning
    doctor: EngineDoctor
