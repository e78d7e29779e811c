"""The flags the operator renders for llama-server, and the variables that shadow
them, as the built llama-server lists them (`--help`, llama.cpp common/arg.cpp).

`engines/llama_server.FLAG_ENV` is the one home of both: the renderer writes
its flags, the API refuses its variables in spec.env. A renamed flag or
variable in a new build fails here, not in a pod.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from localmodel.engines import llama_server
from tests.harness.engines import require

pytestmark = [pytest.mark.engine, pytest.mark.llama]  # llama-server only

# Where llama.cpp's help puts the description (common_arg::to_string).
HELP_COLUMN = 40
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
ENV = re.compile(r"\(env: (\w+)\)")


def help_entries(text: str) -> dict[str, str | None]:
    """Each flag the help lists -> the variable it reads (None: none).

    An option starts at column 0 with its flags and value hints, padded to
    HELP_COLUMN where its description starts (on the next line when the flags
    are longer); the description's lines, `(env: NAME)` among them, are
    indented by HELP_COLUMN.
    """
    found: dict[str, str | None] = {}
    flags: list[str] = []
    described = ""

    def close() -> None:
        env = ENV.search(described)
        for flag in flags:
            found[flag] = env.group(1) if env else None

    for line in text.splitlines():
        if line.startswith("-") and not line.startswith("---"):
            close()
            same_line = len(line) > HELP_COLUMN and line[HELP_COLUMN - 3 : HELP_COLUMN] == "   "
            head = line[:HELP_COLUMN] if same_line else line
            flags, described = FLAG.findall(head), line[len(head) :]
        elif line.startswith(" ") and flags:
            described += " " + line.strip()
        else:
            close()
            flags, described = [], ""
    close()
    return found


def test_help_parser_reads_flags_and_variables() -> None:
    text = (
        "----- common params -----\n"
        "\n"
        "-t,    --threads N                     number of CPU threads to use during generation\n"
        "                                        (default: -1)\n"
        "                                        (env: LLAMA_ARG_THREADS)\n"
        "-tb,   --threads-batch N               number of threads to use during batch and\n"
        "                                        prompt processing (default: same as --threads)\n"
        "--ui, --webui, --no-ui, --no-webui     whether to enable the Web UI (default: enabled)\n"
        "                                        (env: LLAMA_ARG_UI)\n"
    )
    assert help_entries(text) == {
        "-t": "LLAMA_ARG_THREADS",
        "--threads": "LLAMA_ARG_THREADS",
        "-tb": None,
        "--threads-batch": None,
        "--ui": "LLAMA_ARG_UI",
        "--webui": "LLAMA_ARG_UI",
        "--no-ui": "LLAMA_ARG_UI",
        "--no-webui": "LLAMA_ARG_UI",
    }


def test_every_rendered_flag_and_its_variable_are_the_built_servers() -> None:
    server = require("llama-server")
    out = subprocess.run(
        [str(server), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    listed = help_entries(out.stdout + out.stderr)
    assert len(listed) > 50, f"llama-server --help listed {len(listed)} flags:\n{out.stdout[:2000]}"
    wrong = {
        flag: (env, listed.get(flag, "<not listed>"))
        for flag, env in llama_server.FLAG_ENV.items()
        if listed.get(flag, "<not listed>") != env
    }
    assert not wrong, f"flag: (engines/llama_server.FLAG_ENV, --help): {wrong}"
