"""The one registry setting: the images the chart and the operator choose,
taken from the user's own registry. Pure.

An image reference is read as the container runtime reads it
(github.com/distribution/reference, `ParseNormalizedNamed`): its first
component is a registry host when it has a `.` or a `:` or is `localhost`;
otherwise the registry is docker.io and a one-component name is under
`library/`. `with_registry(image, registry)` replaces that host with
`registry` and keeps the rest, the path as the registry stores it and the tag
or digest:

    docker.io/ollama/ollama:0.34.4        -> registry.corp:5000/ollama/ollama:0.34.4
    ghcr.io/ggml-org/llama.cpp:server-b1  -> registry.corp:5000/ggml-org/llama.cpp:server-b1
    ollama/ollama:0.34.4                  -> registry.corp:5000/ollama/ollama:0.34.4
    busybox                               -> registry.corp:5000/library/busybox

`registry` may carry a path (`registry.corp/mirror`): the image's path goes
under it. An image already under `registry` is kept as it is, so the prefix
applied twice is applied once. No registry (""): every image as it is.

Only the images the operator and the chart choose are prefixed (the
operator, the probe, the gateway, each engine's pinned image, the download
step); an image a LocalModel names itself is kept as written.
"""

from __future__ import annotations

import re

DOCKER_HUB = "docker.io"
MAX_REGISTRY = 253  # a DNS name's bound; a port and a path fit beside most hosts
MAX_PULL_SECRETS = 16

# host[:port][/path]: lowercase DNS labels (or an IPv4 address), an optional
# port, optional lowercase path components as the distribution grammar allows.
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_PATH = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REGISTRY = re.compile(
    rf"(?:{_LABEL}(?:\.{_LABEL})*)(?::[0-9]{{1,5}})?(?:/{_PATH})*"
)
# A Secret's name: a DNS subdomain (RFC 1123).
_SECRET = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def split_image(image: str) -> tuple[str, str, str]:
    """(registry host, path, tag or digest with its `:` or `@`) of a reference."""
    name, at, digest = image.partition("@")
    suffix = at + digest
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        name, suffix = name[:colon], name[colon:] + suffix
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, suffix
    return DOCKER_HUB, name if rest else f"library/{name}", suffix


def with_registry(image: str, registry: str) -> str:
    """`image` from `registry` (module docstring); as it is when `registry` is ""."""
    if not registry or image.startswith(registry + "/"):
        return image
    _, path, suffix = split_image(image)
    return f"{registry}/{path}{suffix}"


def registry_error(value: str) -> str:
    """Why `value` cannot be an image registry setting ("" when it can)."""
    if len(value) > MAX_REGISTRY:
        return f"at most {MAX_REGISTRY} characters, not {len(value)}"
    if "://" in value:
        return f"{value!r} names a scheme: write the host only, e.g. registry.example.com:5000"
    if value.endswith("/"):
        return f"{value!r} ends with '/': write host[:port][/path] without it"
    if not _REGISTRY.fullmatch(value):
        return (f"{value!r} is not host[:port][/path] (lowercase letters, digits, '.', '-', "
                "a port number, path components)")
    return ""


def pull_secrets_error(names: tuple[str, ...]) -> str:
    """Why `names` cannot be the pull secrets ("" when they can)."""
    if len(names) > MAX_PULL_SECRETS:
        return f"at most {MAX_PULL_SECRETS} Secrets, not {len(names)}"
    for name in names:
        if len(name) > 253 or not _SECRET.fullmatch(name):
            return f"{name[:80]!r} is not a Secret name (a lowercase DNS subdomain)"
    if len(set(names)) != len(names):
        return "a Secret is named twice"
    return ""
