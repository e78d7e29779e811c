"""Fixtures for the router tests: the router relays to real gateways in-process
in front of the Ollama stand-in, made by the gateway tests' own `make_rig`
(tests/gateway/conftest.py)."""

from tests.gateway.conftest import make_rig

__all__ = ["make_rig"]
