"""Checks for every test in the suite, and the test-only engines registered
for the session (tests/engines/: before any test module imports the engine
registry, and inherited by every program a test starts)."""

from tests.engines import register
from tests.leaks import no_leaked_processes, no_processes_left_at_the_end

register()

__all__ = ["no_leaked_processes", "no_processes_left_at_the_end"]
