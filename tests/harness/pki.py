"""A certificate authority for the test cluster's real node, made with `openssl`.

A real kubelet authenticates to the API server with an x509 client certificate
(user `system:node:<name>`, group `system:nodes`, which the Node authorizer and
NodeRestriction act on), and the API server talks to the kubelet with a client
certificate of its own. One CA signs them all and the API server's serving
certificate (whose names include the `kubernetes` Service's cluster IP, so pods
can verify it through the Service).

    ca = CertificateAuthority.create(directory)
    pair = ca.issue("kubelet", common_name="system:node:n1", organizations=("system:nodes",))
"""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "30"


class PkiError(RuntimeError):
    pass


def _openssl(*args: str, stdin: str | None = None) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, text=True,
                       input=stdin, timeout=60)
    except FileNotFoundError as exc:
        raise PkiError("`openssl` is not installed (Debian: openssl)") from exc
    except subprocess.CalledProcessError as exc:
        raise PkiError(f"openssl {args[0]} failed: {exc.stderr.strip()}") from exc


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path))
    path.chmod(0o600)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class CertificateAuthority:
    directory: Path

    @property
    def cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def key(self) -> Path:
        return self.directory / "ca.key"

    @classmethod
    def create(cls, directory: Path, name: str = "localmodel-test-ca") -> CertificateAuthority:
        ca = cls(directory)
        directory.mkdir(parents=True, exist_ok=True)
        _new_key(ca.key)
        _openssl("req", "-x509", "-new", "-key", str(ca.key), "-out", str(ca.cert),
                 "-days", DAYS, "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return ca

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
    ) -> CertPair:
        """A key and a certificate signed by this CA, `name`.crt / `name`.key.

        Without `server` it is a client certificate (the API server maps CN to
        the user and each O to a group); `hosts` (IPs or DNS names) become SANs.
        """
        pair = CertPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        csr = self.directory / f"{name}.csr"
        _new_key(pair.key)
        subject = "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"
        _openssl("req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", subject)
        usage = "serverAuth" if server else "clientAuth"
        extensions = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if hosts:
            extensions.append("subjectAltName=" + ",".join(_san(h) for h in hosts))
        ext_file = self.directory / f"{name}.ext"
        ext_file.write_text("\n".join(extensions) + "\n")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
                 "-CAcreateserial", "-out", str(pair.cert), "-days", DAYS,
                 "-extfile", str(ext_file))
        csr.unlink()
        ext_file.unlink()
        return pair


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"
