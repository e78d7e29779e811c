"""The GGUF download step the engines' init containers share: a file fetched
once into the weights volume, checked against its sha256 before it replaces
anything (`spec.gguf`), over https only unless the admin allows http, never
downgraded by a redirect, bounded in size and time (`Download`).

The script is a readable file beside this module, `gguf-download.sh`, loaded
as a template: `$`-names are the shell's, `{braces}` are filled in (quoted)
by `gguf_script` (a brace the shell needs would be written `{{`). `{fetch}`
downloads `$url` to `"$part"` and fails on an HTTP error: `curl_fetch`
(`curl-fetch.sh`) in an image with curl, `python_fetch` (`fetch.py.txt`,
Python's standard library) in the operator image.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from importlib.resources import files

from localmodel.api import GGUF


def script_text(package: str, name: str) -> str:
    """A script file of an engines package (package data), as text."""
    return files(package).joinpath(name).read_text(encoding="utf-8")


GGUF_DOWNLOAD = script_text("localmodel.engines", "gguf-download.sh")
CURL_DOWNLOAD = script_text("localmodel.engines", "curl-fetch.sh")

# The operator image (Dockerfile: python:3.11-slim, Debian) has a POSIX shell,
# coreutils' sha256sum and python3: what Ollama's download step runs on.
OPERATOR_SHELL = "/bin/sh"

# The operator image's downloader (Ollama's image has neither curl nor wget:
# an Ubuntu base with ca-certificates), with Python's standard library.
# Transient failures (no connection, a stall, 5xx, 408, 429) are retried from
# the start of the file, within the overall time, which a watchdog thread
# holds (connecting and headers included, as `timeout` does for curl); any
# other HTTP error fails at once.
PYTHON_DOWNLOAD = script_text("localmodel.engines", "fetch.py.txt")
if "'" in PYTHON_DOWNLOAD:  # it goes into the shell script in single quotes
    raise ValueError("fetch.py.txt must hold no single quote")

# A download that sends no byte for this long (Python's step), or less than
# 1 KiB/s for this long (curl's --speed-limit), has stalled.
STALL_SECONDS = 60
# The whole download, retries included, may take this long plus the size
# bound's bytes at MIN_RATE: a slower server fails the step (and the kubelet
# starts it again) rather than hold the pod's start forever.
BASE_SECONDS = 600
MIN_RATE = 1 << 20  # bytes per second, 8 Mbit/s


@dataclass(frozen=True)
class Download:
    """What a download may do: its schemes, its size and its time."""

    max_bytes: int  # bytes beyond it abort the download
    allow_http: bool = False  # the operator's --allow-http-downloads
    stall_seconds: int = STALL_SECONDS
    overall_seconds: int = 0  # 0: BASE_SECONDS + max_bytes at MIN_RATE

    @property
    def seconds(self) -> int:
        return self.overall_seconds or BASE_SECONDS + -(-self.max_bytes // MIN_RATE)

    def schemes(self, url: str) -> tuple[str, str]:
        """The schemes the URL may have and those a redirect from it may go
        to (curl's --proto and --proto-redir): https, and http only when
        allowed and only from http (never https -> http)."""
        if not self.allow_http:
            return "https", "https"
        return "http,https", "http,https" if url.startswith("http:") else "https"


def download_bound(memory_bytes: int, storage_bytes: int) -> int:
    """The size bound of a GGUF download: the file must fit the engine's
    memory limit (the memory decision counts the weights in full, from the
    catalog's or spec.modelInfo's size, or spec.memory) and its volume."""
    return min(memory_bytes, storage_bytes)


def curl_fetch(url: str, download: Download) -> str:
    """Downloads `$url` to `"$part"` with curl, through `head -c` so that no
    more than the bound plus one byte lands on the volume (curl's
    --max-filesize trusts the announced length only, before curl 8.4). No
    --retry: curl retries a stalled body by writing it again after what it
    wrote (seen with curl 7.88), so a failed download fails the step and the
    kubelet starts it again, with its back-off."""
    proto, redirect = download.schemes(url)
    return CURL_DOWNLOAD.format(
        overall=download.seconds, proto=f"={proto}", proto_redir=f"={redirect}",
        stall=download.stall_seconds, limit=download.max_bytes + 1,
    ).rstrip("\n")


def python_fetch(url: str, download: Download) -> str:
    """Downloads `$url` to `"$part"` with the operator image's python3."""
    schemes = download.schemes(url)[0]
    return (
        f"python3 -I -c '{PYTHON_DOWNLOAD}' \"$url\" \"$part\" {download.max_bytes} "
        f"{download.seconds} {download.stall_seconds} {schemes}"
    )


def _scheme_check(gguf: GGUF, download: Download) -> str:
    """A line that fails the step when the URL's scheme is not allowed, naming why."""
    if download.allow_http or gguf.url.startswith("https:"):
        return ""
    why = "gguf.url is not https and the operator allows https downloads only " \
        "(--allow-http-downloads, the chart's downloads.allowHttp)"
    return f"echo {shlex.quote('localmodel: ' + why)} >&2; exit 1\n"


def gguf_script(gguf: GGUF, file: str, part: str, mark: str, fetch: str,
                download: Download) -> str:
    """The download step: `gguf` into ``file``, through ``part``, its verified
    checksum recorded in ``mark``, downloaded by ``fetch``, within ``download``.

    Nothing to do when the volume holds it with a matching record; a
    download is checked before it replaces anything. ``mark`` records a
    verified checksum with the file's size, inode and times as they were
    when it was checked, so a restart does not hash gigabytes again while a
    file changed since is hashed again (and downloaded again when it no
    longer matches); a file put on the volume by other means is hashed once.
    The record is a file on the volume: it trusts whoever can write the
    volume (docs/security.md).
    The download lands in ``part`` and is renamed only once its size and
    checksum are right, so a failed or wrong download never removes a good
    file.
    """
    q = shlex.quote
    return GGUF_DOWNLOAD.format(
        file=q(file), part=q(part), mark=q(mark), url=q(gguf.url), sha256=gguf.sha256,
        max_bytes=download.max_bytes, scheme=_scheme_check(gguf, download), fetch=fetch,
    )
