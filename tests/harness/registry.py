"""A real image registry for the test cluster: the CNCF distribution registry
(Debian's `docker-registry` package), over TLS from the harness's CA, with or
without a login (htpasswd, bcrypt, as `htpasswd -B` writes it).

The real node pulls every image from it (tests/harness/realnode.py points
containerd's `config_path` at a hosts.toml that trusts the CA); the images get
there with `hack/build-images.sh --push HOST:PORT`, the command a user runs
against their own registry. Paths in the registry follow the mirror layout:
the upstream reference without its registry host (`docker.io/ollama/ollama:T`
is `HOST:PORT/ollama/ollama:T`).

    registry = Registry(workdir / "registry", ca, login=("puller", "secret"))
    registry.start()
    pushed = registry.push()          # {upstream reference: reference in the registry}
    registry.stop()
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.harness.images import BUILD_SCRIPT
from tests.harness.pki import CertificateAuthority
from tests.harness.processes import ManagedProcess, StartupError, free_ports, wait_until

REGISTRY_BINARY = "docker-registry"  # Debian: docker-registry (distribution 2.8)
HTPASSWD_BINARY = "htpasswd"  # Debian: apache2-utils
PUSH_TIMEOUT = 900.0


class RegistryError(StartupError):
    """The registry cannot start or a push failed; the message says why."""


@dataclass
class Registry:
    """One `docker-registry serve` on `bind`, its storage and config under `directory`."""

    directory: Path
    ca: CertificateAuthority
    bind: str = "127.0.0.1"
    login: tuple[str, str] | None = None  # (user, password): htpasswd auth on
    port: int = 0
    process: ManagedProcess | None = None
    start_seconds: float | None = None
    push_seconds: float | None = None
    pushed: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        """HOST:PORT, as image references and hosts.toml name it."""
        return f"{self.bind}:{self.port}"

    @property
    def auth_file(self) -> Path:
        """containers-auth.json (as `skopeo login` writes it) for the login, if any."""
        return self.directory / "auth.json"

    def start(self, timeout: float = 60.0) -> None:
        missing = [b for b in (REGISTRY_BINARY, *([HTPASSWD_BINARY] if self.login else ()))
                   if shutil.which(b) is None]
        if missing:
            raise RegistryError(
                f"missing {', '.join(missing)} (Debian packages docker-registry, "
                "apache2-utils; `.ci/run` installs them)")
        began = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_ports(1)[0]
        serving = self.ca.issue(f"registry-{self.port}", common_name=self.bind, server=True,
                                hosts=(self.bind, "localhost"))
        config: dict[str, object] = {
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.directory / "data")},
                        "delete": {"enabled": True}},
            "http": {"addr": self.host,
                     "tls": {"certificate": str(serving.cert), "key": str(serving.key)}},
        }
        if self.login:
            config["auth"] = {"htpasswd": {"realm": "localmodel-test",
                                           "path": str(self._write_htpasswd(*self.login))}}
        path = self.directory / "config.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.process = ManagedProcess(
            name=f"registry-{self.port}",
            argv=[shutil.which(REGISTRY_BINARY) or REGISTRY_BINARY, "serve", str(path)],
            log_path=self.directory / "registry.log")
        self.process.start()
        wait_until(f"the registry on {self.host} (/v2/)", self._answers, timeout,
                   self.process.check_alive, interval=0.1)
        self.start_seconds = time.monotonic() - began

    def _write_htpasswd(self, user: str, password: str) -> Path:
        line = subprocess.run([HTPASSWD_BINARY, "-Bbn", user, password], capture_output=True,
                              text=True, check=True, timeout=60).stdout.strip()
        path = self.directory / "htpasswd"
        path.write_text(line + "\n")
        path.chmod(0o600)
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.auth_file.write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
        self.auth_file.chmod(0o600)
        return path

    def _answers(self) -> bool:
        """/v2/ answers over TLS the CA verifies: 200, or 401 when a login is needed."""
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        try:
            with urllib.request.urlopen(f"https://{self.host}/v2/", timeout=2,
                                        context=context) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError as exc:
            return exc.code == 401 and self.login is not None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=10)

    def push(self, names: tuple[str, ...] = ()) -> dict[str, str]:
        """`hack/build-images.sh --push` the built images (all, or `names`);
        returns {upstream reference: reference in this registry}."""
        argv = ["bash", str(BUILD_SCRIPT), "--push", self.host, "--ca", str(self.ca.cert)]
        if self.login:
            argv += ["--authfile", str(self.auth_file)]
        began = time.monotonic()
        result = subprocess.run([*argv, *names], capture_output=True, text=True,
                                timeout=PUSH_TIMEOUT, check=False)
        if result.returncode != 0:
            raise RegistryError(f"{' '.join(argv)} failed ({result.returncode}): "
                                f"{result.stderr.strip()[-2000:]}")
        pushed = parse_push_output(result.stdout)
        self.push_seconds = (self.push_seconds or 0.0) + time.monotonic() - began
        self.pushed.update(pushed)
        return pushed

    def push_archive(self, archive: Path, reference: str) -> str:
        """Push one OCI archive (an image a test built) under `reference`'s mirror
        path; returns its reference in this registry."""
        target = f"{self.host}/{mirror_path(reference)}"
        argv = ["skopeo", "copy", "--quiet", "--dest-cert-dir", str(self._cert_dir()),
                *(["--dest-authfile", str(self.auth_file)] if self.login else []),
                f"oci-archive:{archive}", f"docker://{target}"]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=PUSH_TIMEOUT,
                                check=False)
        if result.returncode != 0:
            raise RegistryError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
        self.pushed[reference] = target
        return target

    def _cert_dir(self) -> Path:
        """A directory with the CA as its one *.crt (skopeo's --dest-cert-dir)."""
        path = self.directory / "certs"
        path.mkdir(exist_ok=True)
        shutil.copyfile(self.ca.cert, path / "ca.crt")
        return path

    def describe(self) -> dict[str, object]:
        return {"host": self.host, "login": self.login is not None,
                "pid": self.process.pid if self.process else None,
                "start_seconds": self.start_seconds, "push_seconds": self.push_seconds,
                "pushed": self.pushed}


def parse_push_output(text: str) -> dict[str, str]:
    """`hack/build-images.sh --push` stdout: `UPSTREAM PUSHED` lines."""
    pushed = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if len(words) != 2 or "/" not in words[1]:
            raise ValueError(f"hack/build-images.sh --push, line {number}: {line!r} is not "
                             "'UPSTREAM_REFERENCE PUSHED_REFERENCE'")
        pushed[words[0]] = words[1]
    return pushed


def mirror_path(reference: str) -> str:
    """The reference without its registry host (Docker Hub's one-word names under
    library/), as a mirror stores it: `docker.io/ollama/ollama:T` -> `ollama/ollama:T`.
    hack/build-images.sh --push applies the same rule (tests/harness/test_registry.py
    checks both agree)."""
    first, sep, rest = reference.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = "docker.io", reference
    if host == "docker.io" and "/" not in path:
        path = f"library/{path}"
    return path
