"""Optional TLS for the endpoints (standard library ``ssl``): a throw-away certificate per run, pinned.

The driver makes a new key and self-signed certificate for each fit or search
(:meth:`TlsIdentity.generate`); the private key never leaves the driver's
memory (it touches disk only for ``load_cert_chain``, in a private temporary
folder removed at once). The certificate's SHA-256 fingerprint travels to the
tasks with the shared secret (:class:`~trainer.transport.handshake.Credentials`),
and a task accepts only a server presenting exactly that certificate: no
certificate authority and no host name are involved. TLS 1.3 only.

Making the certificate uses the ``cryptography`` package (a dependency, for the
frame MAC too; the ``tls`` extra still names it for installs made before) or,
where it is missing (an install with ``--no-deps``), the ``openssl`` command;
with neither, asking for TLS fails with :class:`TlsUnavailable` saying what to
install.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.transport.wire import AuthenticationError, ConnectionClosed, TransportError, TransportTimeout

COMMON_NAME = "trainer-parameter-server"
VALID_DAYS = 30  # the client pins the certificate and ignores its dates; a run may last long


class TlsUnavailable(TransportError):
    """TLS was asked for but no certificate can be made here (nothing to make one with)."""


@dataclass(frozen=True)
class TlsIdentity:
    """A server's certificate and private key (PEM); `fingerprint` is what clients pin."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @property
    def fingerprint(self) -> str:
        return certificate_fingerprint(ssl.PEM_cert_to_DER_cert(self.cert_pem.decode("ascii")))

    @classmethod
    def generate(cls, backend: str = "auto") -> "TlsIdentity":
        """A new EC P-256 key and a self-signed certificate.

        `backend`: ``"cryptography"``, ``"openssl"`` (the command) or ``"auto"``
        (the first of them that is available).
        """
        if backend not in ("auto", "cryptography", "openssl"):
            raise ValueError(f"backend must be 'auto', 'cryptography' or 'openssl', received {backend!r}")
        if backend in ("auto", "cryptography"):
            try:
                return cls(*_with_cryptography())
            except ImportError:
                if backend == "cryptography":
                    raise TlsUnavailable(_MISSING) from None
        if shutil.which("openssl") is None:
            raise TlsUnavailable(_MISSING)
        return cls(*_with_openssl())

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        with tempfile.TemporaryDirectory(prefix="trainer-tls-") as folder:  # mode 0700
            cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            cert.write_bytes(self.cert_pem)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(self.key_pem)
            context.load_cert_chain(cert, key)
        return context


_MISSING = ("tls=True needs a throw-away certificate for this run, and neither the Python package `cryptography` "
            "nor the `openssl` command is available on the driver. Fix: pip install '.[tls]' in the checkout "
            "(or the wheel with [tls], or pip install cryptography), or apt-get install openssl; "
            "or train without tls=True.")


def certificate_fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def _with_cryptography() -> tuple[bytes, bytes]:
    from cryptography import x509  # deferred: an optional dependency
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)).sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _with_openssl() -> tuple[bytes, bytes]:
    with tempfile.TemporaryDirectory(prefix="trainer-tls-") as folder:
        cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cmd = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
               "-keyout", str(key), "-out", str(cert), "-days", str(VALID_DAYS), "-subj", f"/CN={COMMON_NAME}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise TlsUnavailable(f"`{' '.join(cmd[:3])} ...` failed to make a certificate (exit {done.returncode}): "
                                 f"{done.stderr.strip()[-500:]}. Fix: pip install cryptography, or repair openssl.")
        return cert.read_bytes(), key.read_bytes()


def server_wrap(sock: Any, context: ssl.SSLContext, timeout: float) -> ssl.SSLSocket:
    """The server's side of the TLS handshake (raises OSError/ssl.SSLError when it fails)."""
    sock.settimeout(timeout)
    tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    tls.do_handshake()
    return tls


def client_wrap(sock: Any, fingerprint: str, *, where: str, service: str) -> ssl.SSLSocket:
    """Open TLS to `where` and accept only the certificate with this SHA-256 `fingerprint`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False  # the pinned fingerprint identifies the server, not a name
    context.verify_mode = ssl.CERT_NONE
    try:
        tls = context.wrap_socket(sock)
    except ssl.SSLError as exc:
        raise AuthenticationError(f"TLS handshake with {service} at {where} failed: {exc}. Is that server started "
                                  "with tls=True (the same run)?") from None
    except TimeoutError:
        raise TransportTimeout(f"no TLS handshake from {service} at {where} within the timeout") from None
    except OSError as exc:
        raise ConnectionClosed(f"{service} at {where} closed the connection during the TLS handshake: {exc}") from None
    der = tls.getpeercert(binary_form=True) or b""
    if not hmac.compare_digest(certificate_fingerprint(der), fingerprint):
        tls.close()
        raise AuthenticationError(
            f"{service} at {where} presented a TLS certificate that is not this run's (fingerprint "
            f"{certificate_fingerprint(der)[:16]}..., expected {fingerprint[:16]}...): refused before sending "
            "anything. Fix: check that the address is the driver's and that nothing intercepts the connection")
    return tls
