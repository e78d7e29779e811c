"""Checks for every test in the suite, and the test-only engines registered
for the session (tests/engines/: before any test module imports the engine
registry, and inherited by every program a test starts)."""

import os

from hypothesis import settings

from tests.engines import register
from tests.leaks import no_leaked_processes, no_processes_left_at_the_end

register()

# Property tests explore new examples on every local run; CI (.ci/run sets
# LOCALMODEL_HYPOTHESIS_PROFILE=ci) draws the same examples each run, seeded by
# each test's own name, so its verdict on a commit is reproducible. A case a
# local run finds goes into the test as an @example.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("LOCALMODEL_HYPOTHESIS_PROFILE", "default"))

__all__ = ["no_leaked_processes", "no_processes_left_at_the_end"]
