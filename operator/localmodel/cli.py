"""The `localmodel` command: render | doctor | crd | gateway | probe | run."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

USAGE = """usage: localmodel COMMAND [ARGS]

commands:
  render    print every object the operator would create (offline)
  crd       print the LocalModel CustomResourceDefinition
  rules     print the tuning rules table (markdown)
  gateway   run the slot gate in front of an engine
  doctor    walk the field debugging order against a cluster or this machine
  probe     print this machine's node facts (and the labels the probe would set)
  run       run the operator against the current kubeconfig
"""


def _lazy(module: str, func: str) -> Callable[[Sequence[str]], int]:
    def call(argv: Sequence[str]) -> int:
        import importlib

        target: Callable[[Sequence[str]], int] = getattr(importlib.import_module(module), func)
        return target(argv)

    return call


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "render": _lazy("localmodel.commands", "render_main"),
    "crd": _lazy("localmodel.commands", "crd_main"),
    "rules": _lazy("localmodel.commands", "rules_main"),
    "probe": _lazy("localmodel.commands", "probe_main"),
    "gateway": _lazy("localmodel.gateway.cli", "run_cli"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"localmodel: unknown command {args[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return command(args[1:])
    except BrokenPipeError:  # `localmodel render ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
