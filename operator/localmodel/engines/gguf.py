"""The GGUF download step the engines' init containers share: a file fetched
once into the weights volume, checked against its sha256 before it replaces
anything (`spec.gguf`).

The script is a readable file beside this module, `gguf-download.sh`, loaded
as a template: `$`-names are the shell's, `{braces}` are filled in (quoted)
by `gguf_script` (a brace the shell needs would be written `{{`). `{fetch}`
downloads `$url` to `"$part"` and fails on an HTTP error: `CURL_FETCH` in an
image with curl, `PYTHON_FETCH` (`fetch.py.txt`, Python's standard library)
in the operator image.
"""

from __future__ import annotations

import shlex
from importlib.resources import files

from localmodel.api import GGUF


def script_text(package: str, name: str) -> str:
    """A script file of an engines package (package data), as text."""
    return files(package).joinpath(name).read_text(encoding="utf-8")


GGUF_DOWNLOAD = script_text("localmodel.engines", "gguf-download.sh")

# The operator image (Dockerfile: python:3.11-slim, Debian) has a POSIX shell,
# coreutils' sha256sum and python3: what Ollama's download step runs on.
OPERATOR_SHELL = "/bin/sh"

# An image with curl (llama-server's: its base stage installs it).
CURL_FETCH = 'curl -fsSL --retry 5 --retry-delay 2 -o "$part" "$url"'

# The operator image's downloader (Ollama's image has neither curl nor wget:
# an Ubuntu base with ca-certificates), with Python's standard library.
# Transient failures (no connection, 5xx, 408, 429) are retried, like curl's
# --retry; any other HTTP error fails at once.
PYTHON_DOWNLOAD = script_text("localmodel.engines", "fetch.py.txt")
if "'" in PYTHON_DOWNLOAD:  # it goes into the shell script in single quotes
    raise ValueError("fetch.py.txt must hold no single quote")
PYTHON_FETCH = f"python3 -I -c '{PYTHON_DOWNLOAD}' \"$url\" \"$part\""


def gguf_script(gguf: GGUF, file: str, part: str, mark: str, fetch: str) -> str:
    """The download step: `gguf` into ``file``, through ``part``, its verified
    checksum recorded in ``mark``, downloaded by ``fetch``.

    Nothing to do when the volume holds it with a matching checksum; a
    download is checked before it replaces anything. ``mark`` records a
    verified checksum, so a restart does not hash gigabytes again; a file put
    on the volume by other means is hashed once. The download lands in
    ``part`` and is renamed only once its checksum matches, so a failed or
    wrong download never removes a good file.
    """
    q = shlex.quote
    return GGUF_DOWNLOAD.format(
        file=q(file), part=q(part), mark=q(mark), url=q(gguf.url), sha256=gguf.sha256, fetch=fetch
    )
