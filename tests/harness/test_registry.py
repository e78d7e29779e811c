"""tests/harness/registry.py: the mirror layout (one rule in Python and in
hack/build-images.sh, checked to agree), the push output's format, and a real
`docker-registry` over TLS from a fresh CA, with and without a login."""

from __future__ import annotations

import base64
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.harness.images import BUILD_SCRIPT
from tests.harness.pki import CertificateAuthority
from tests.harness.registry import Registry, mirror_path, parse_push_output

CASES = [
    ("docker.io/ollama/ollama:1.2.3", "ollama/ollama:1.2.3"),
    ("ollama/ollama:1.2.3", "ollama/ollama:1.2.3"),
    ("docker.io/library/busybox:1.35", "library/busybox:1.35"),
    ("busybox:1.35", "library/busybox:1.35"),
    ("ghcr.io/ggml-org/llama.cpp:server-b1", "ggml-org/llama.cpp:server-b1"),
    ("registry.k8s.io/pause:3.10", "pause:3.10"),
    ("localhost/localmodel-test/hostile-gateway:1", "localmodel-test/hostile-gateway:1"),
    ("127.0.0.1:5000/a/b:c", "a/b:c"),
    ("ghcr.io/localmodel/localmodel-operator:0.1.0", "localmodel/localmodel-operator:0.1.0"),
]


@pytest.mark.parametrize(("reference", "path"), CASES)
def test_mirror_path_drops_the_registry_host(reference: str, path: str) -> None:
    assert mirror_path(reference) == path


def test_build_images_push_uses_the_same_mirror_layout() -> None:
    script = BUILD_SCRIPT.read_text()
    start = script.index("\nmirror_path() {")
    body = script[start:script.index("\n}\n", start) + 3]
    calls = "".join(f"mirror_path '{ref}'\n" for ref, _ in CASES)
    out = subprocess.run(["bash", "-c", body + calls], capture_output=True, text=True,
                         check=True, timeout=30).stdout.split()
    assert out == [path for _, path in CASES]


def test_push_output_is_one_pair_per_line() -> None:
    assert parse_push_output("a:1 r:5000/a:1\nb:2 r:5000/b:2\n") == {
        "a:1": "r:5000/a:1", "b:2": "r:5000/b:2"}
    with pytest.raises(ValueError, match="line 2"):
        parse_push_output("a:1 r:5000/a:1\nbuild-images: pushed\n")
    with pytest.raises(ValueError, match="line 1"):
        parse_push_output("build-images: pushed 5 image(s)\n")


def _status(url: str, ca: Path, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_registry_with_a_login_refuses_without_it_and_answers_with_it(
        tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    registry = Registry(tmp_path / "registry", ca, login=("puller", "secret"))
    registry.start()
    try:
        url = f"https://{registry.host}/v2/"
        assert _status(url, ca.cert) == 401
        assert _status(url, ca.cert, "puller:wrong") == 401
        assert _status(url, ca.cert, "puller:secret") == 200
        # The auth file skopeo pushes with holds the same login.
        assert registry.host in registry.auth_file.read_text()
        # TLS: a client that does not trust the CA is refused.
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(url, timeout=10)
    finally:
        registry.stop()
    assert registry.process is not None and not registry.process.running()


def test_an_open_registry_answers_without_a_login(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    registry = Registry(tmp_path / "registry", ca)
    registry.start()
    try:
        assert _status(f"https://{registry.host}/v2/", ca.cert) == 200
        assert registry.start_seconds is not None
    finally:
        registry.stop()
