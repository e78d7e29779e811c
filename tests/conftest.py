"""Checks for every test in the suite."""

from tests.leaks import no_leaked_processes

__all__ = ["no_leaked_processes"]
