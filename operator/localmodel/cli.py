"""The `localmodel` command: one subcommand per entry of `COMMANDS`.

The usage text is derived from `COMMANDS`, so it lists exactly the commands
that exist: add an entry and it shows up in `localmodel --help`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A subcommand, imported only when it runs (`localmodel --help` stays fast)."""

    summary: str  # one line for the usage text
    module: str
    func: str  # module.func(argv) -> exit status

    def __call__(self, argv: Sequence[str]) -> int:
        import importlib

        result: int = getattr(importlib.import_module(self.module), self.func)(argv)
        return result


COMMANDS: dict[str, Command] = {
    "render": Command(
        "print every object the operator would create (offline)",
        "localmodel.commands",
        "render_main",
    ),
    "crd": Command(
        "print the LocalModel CustomResourceDefinition", "localmodel.commands", "crd_main"
    ),
    "rules": Command(
        "print the tuning rules table (markdown)", "localmodel.commands", "rules_main"
    ),
    "gateway": Command(
        "run the slot gate in front of an engine", "localmodel.gateway.cli", "run_cli"
    ),
    "router": Command(
        "one endpoint for every model: route by the model field, keep sessions on their cache",
        "localmodel.router.cli",
        "run_cli",
    ),
    "probe": Command(
        "print this machine's node facts and probe labels; --node NAME labels that Node",
        "localmodel.probe.cli",
        "probe_main",
    ),
    "doctor": Command(
        "walk the field's debugging order against a cluster, or --local this machine",
        "localmodel.doctor.cli",
        "doctor_main",
    ),
    "timeline": Command(
        "where a model's time went, from its gateways' ledgers, in the field's order",
        "localmodel.timeline.cli",
        "timeline_main",
    ),
    "run": Command(
        "run the operator against a cluster (kubeconfig or in-cluster)",
        "localmodel.controller.main",
        "run_main",
    ),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {c.summary}" for name, c in COMMANDS.items()]
    return "usage: localmodel COMMAND [ARGS]\n\ncommands:\n" + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"localmodel: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        return command(args[1:])
    except BrokenPipeError:  # `localmodel render ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
