"""Checks for every test in the suite."""

from tests.leaks import no_leaked_processes, no_processes_left_at_the_end

__all__ = ["no_leaked_processes", "no_processes_left_at_the_end"]
