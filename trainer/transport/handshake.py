"""Mutual authentication of one connection: both sides prove the shared secret over both nonces.

::

    server -> CHALLENGE  {"protocol", "nonce": ns, "mac": algorithm or null, "num_workers"}
    client -> AUTH       {"worker", "attempt", "nonce": nc, "proof": HMAC(secret, "client" | T)}
    server -> OK         {"proof": HMAC(secret, "server" | T), ...}   sealed: seq 0 of the server's direction
           or ERROR      {"error": why, "busy": bool}                 not sealed; the server closes

    T  = "trainer-ps" | protocol | ns | nc | worker | attempt | mac | TLS fingerprint or "-"
    session key      = HMAC(secret, "session" | T)
    key of direction = HMAC(session key, "client->server") and HMAC(session key, "server->client")

Both nonces are 32 random bytes, so neither side can replay an old proof, and
the keys are fresh for every connection. The transcript binds what each side
saw: a peer in the middle that rewrites the CHALLENGE (e.g. to turn the MAC
off) or the AUTH (another worker or attempt) makes the proofs disagree. The
client checks the server's proof, and the MAC of the OK frame, before it sends
anything else: a server that does not hold the secret never receives a
request, so never receives weights. From then on every frame carries a MAC
(:mod:`trainer.transport.frame_auth`).

With TLS (:mod:`trainer.transport.tls`) this runs inside the TLS connection
and the transcript also names the certificate the client pinned.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Any

from trainer.transport.frame_auth import DEFAULT_MAC, Channel, check_mac_algorithm
from trainer.transport.wire import (
    HEADER_SIZE,
    NONCE_SIZE,
    PREAUTH_MAX_BODY,
    PREAUTH_MAX_META,
    PROTOCOL_VERSION,
    AuthenticationError,
    Frame,
    IntegrityError,
    Msg,
    ProtocolError,
    ServerBusy,
    TransportError,
    check_secret,
    decode_header,
    decode_payload,
    new_nonce,
    read_frame,
    recv_exact,
    write_frame,
)

_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Credentials:
    """What a task needs to trust a server of this driver, shipped inside the Spark task closure.

    Args:
        secret: Bytes. The per-run shared secret (``new_secret()``); never in reprs or logs.
        mac: String or None. The frame MAC algorithm the server uses
            (``trainer.transport.frame_auth.MAC_ALGORITHMS``); None: frames carry no MAC.
        tls_fingerprint: String or None. SHA-256 (hex) of the server's TLS certificate,
            which the client pins; None: no TLS.
    """

    secret: bytes = field(repr=False)
    mac: str | None = DEFAULT_MAC
    tls_fingerprint: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "secret", check_secret(self.secret))
        check_mac_algorithm(self.mac)
        fp = self.tls_fingerprint
        if fp is not None and not (isinstance(fp, str) and _FINGERPRINT.match(fp)):
            raise ValueError(f"tls_fingerprint must be 64 lower-case hex digits (a SHA-256), received {fp!r:.80}")

    @classmethod
    def of(cls, value: "bytes | Credentials") -> "Credentials":
        """`value` itself, or bytes taken as a secret with the default MAC and no TLS."""
        return value if isinstance(value, Credentials) else cls(value)


def transcript(protocol: int, server_nonce: bytes, client_nonce: bytes, worker: int, attempt: int,
               mac: str | None, tls_fingerprint: str | None) -> bytes:  # fmt: skip
    fields = ["trainer-ps", str(protocol), server_nonce.hex(), client_nonce.hex(), str(worker), str(attempt),
              mac or "none", tls_fingerprint or "-"]
    return "|".join(fields).encode("ascii")


def proof(secret: bytes, role: str, transcript_: bytes) -> bytes:
    """HMAC-SHA256 proving that `role` ("client" or "server") holds `secret`, bound to this transcript."""
    return hmac.new(secret, role.encode("ascii") + b"|" + transcript_, hashlib.sha256).digest()


def session_keys(secret: bytes, transcript_: bytes) -> tuple[bytes, bytes]:
    """(client->server key, server->client key) of one connection."""
    session = hmac.new(secret, b"session|" + transcript_, hashlib.sha256).digest()
    return (hmac.new(session, b"client->server", hashlib.sha256).digest(),
            hmac.new(session, b"server->client", hashlib.sha256).digest())


def _hex_field(meta: dict[str, Any], key: str, size: int, what: str) -> bytes:
    value = meta.get(key)
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise ProtocolError(f"the {what} carries no valid '{key}' ({size} bytes as hex)")
    return raw


class ServerHandshake:
    """The server's side of one handshake; the endpoint decides between `accept` and `refuse`."""

    def __init__(self, sock: Any, secret: bytes, *, mac: str | None, tls_fingerprint: str | None,
                 num_workers: int, peer: str, deadline: float) -> None:  # fmt: skip
        self.sock = sock
        self._secret = secret
        self.mac, self.tls_fingerprint = mac, tls_fingerprint
        self.num_workers = num_workers
        self.peer = peer
        self.deadline = deadline
        self.nonce = new_nonce()
        self.bytes_in = 0
        self.bytes_out = 0
        self._transcript: bytes | None = None

    def challenge(self) -> None:
        self.bytes_out += write_frame(self.sock, Msg.CHALLENGE, {
            "protocol": PROTOCOL_VERSION, "nonce": self.nonce.hex(), "mac": self.mac,
            "num_workers": self.num_workers})

    def read_auth(self) -> tuple[int, int]:
        """Read the AUTH frame and check the client's proof; returns (worker, attempt).

        Raises ProtocolError for a malformed answer, AuthenticationError for a wrong proof.
        """
        frame = read_frame(self.sock, PREAUTH_MAX_BODY, max_meta=PREAUTH_MAX_META, deadline=self.deadline)
        self.bytes_in += frame.nbytes
        if frame.msg != Msg.AUTH:
            raise ProtocolError(f"expected an AUTH frame to answer the challenge, received {frame.msg.name}")
        worker, attempt = frame.meta.get("worker"), frame.meta.get("attempt")
        if type(worker) is not int or type(attempt) is not int or worker < 0 or attempt < 0:
            raise ProtocolError("AUTH meta must hold 'worker' and 'attempt' as ints >= 0, 'nonce' and 'proof' as "
                                f"hex; received worker={worker!r:.20}, attempt={attempt!r:.20}")
        client_nonce = _hex_field(frame.meta, "nonce", NONCE_SIZE, "AUTH frame")
        given = _hex_field(frame.meta, "proof", 32, "AUTH frame")
        t = transcript(PROTOCOL_VERSION, self.nonce, client_nonce, worker, attempt, self.mac, self.tls_fingerprint)
        if not hmac.compare_digest(given, proof(self._secret, "client", t)):
            raise AuthenticationError("wrong proof: the peer does not hold this server's secret")
        self._transcript = t
        return worker, attempt

    def accept(self, welcome: dict[str, Any]) -> Channel:
        """Answer OK with the server's proof (sealed) and return the connection's channel."""
        assert self._transcript is not None, "read_auth() first"
        c2s, s2c = session_keys(self._secret, self._transcript)
        channel = Channel(self.sock, mac=self.mac, send_key=s2c, recv_key=c2s, peer=self.peer)
        self.bytes_out += channel.send_frame(Msg.OK, {**welcome, "proof": proof(self._secret, "server",
                                                                                 self._transcript).hex()})
        return channel

    def refuse(self, text: str, *, busy: bool = False) -> None:
        """Best effort: tell the peer why it is dropped (not sealed)."""
        try:
            self.sock.settimeout(1.0)
            self.bytes_out += write_frame(self.sock, Msg.ERROR, {"error": text[:4000], "busy": busy})
        except (OSError, TransportError):  # the peer may already be gone
            pass


def client_handshake(sock: Any, credentials: Credentials, worker: int, attempt: int, *, where: str,
                     service: str, deadline: float) -> tuple[Channel, dict[str, Any], int, int]:  # fmt: skip
    """Authenticate to a server and make it prove the secret; returns (channel, welcome meta, bytes out, bytes in).

    Raises AuthenticationError (refused, or the server did not prove the secret),
    ServerBusy (no free slot: try again), ProtocolError (not our protocol).
    """
    bytes_in = bytes_out = 0
    challenge = read_frame(sock, PREAUTH_MAX_BODY, max_meta=PREAUTH_MAX_META, deadline=deadline)
    bytes_in += challenge.nbytes
    if challenge.msg == Msg.ERROR:
        _raise_refusal(challenge, f"{service} at {where} refused the connection")
    if challenge.msg != Msg.CHALLENGE:
        raise ProtocolError(f"expected a CHALLENGE from {where}, received {challenge.msg.name}")
    protocol = challenge.meta.get("protocol")
    if protocol != PROTOCOL_VERSION:
        raise ProtocolError(f"{service} at {where} speaks protocol {protocol!r:.20}, this task speaks "
                            f"{PROTOCOL_VERSION}. Fix: the driver and the executors must run the same trainer version.")
    server_nonce = _hex_field(challenge.meta, "nonce", NONCE_SIZE, "CHALLENGE")
    mac = challenge.meta.get("mac")
    if mac != credentials.mac:
        raise AuthenticationError(
            f"{service} at {where} offers frame MAC {mac!r:.40}, this task was told {credentials.mac!r}: the "
            "connection was tampered with, or the task talks to another run's server")
    client_nonce = new_nonce()
    t = transcript(PROTOCOL_VERSION, server_nonce, client_nonce, worker, attempt, mac, credentials.tls_fingerprint)
    bytes_out += write_frame(sock, Msg.AUTH, {"worker": worker, "attempt": attempt, "nonce": client_nonce.hex(),
                                              "proof": proof(credentials.secret, "client", t).hex()})
    c2s, s2c = session_keys(credentials.secret, t)
    channel = Channel(sock, mac=mac, send_key=c2s, recv_key=s2c, peer=f"{service} at {where}")
    header = recv_exact(sock, HEADER_SIZE, deadline=deadline)
    msg = decode_header(header, PREAUTH_MAX_BODY, max_meta=PREAUTH_MAX_META)[0]
    if msg == Msg.ERROR:  # a refusal is not sealed: the server may not trust us
        _, meta_len, body_len = decode_header(header, PREAUTH_MAX_BODY, max_meta=PREAUTH_MAX_META)
        rest = recv_exact(sock, meta_len + body_len, deadline=deadline)
        meta, _ = decode_payload(memoryview(rest)[:meta_len], memoryview(rest)[meta_len:], PREAUTH_MAX_BODY)
        _raise_refusal(Frame(Msg.ERROR, meta), f"{service} at {where} rejected worker {worker}")
    if msg != Msg.OK:
        raise ProtocolError(f"expected OK or ERROR after AUTH from {where}, received {msg.name}")
    not_proven = (f"{service} at {where} did not prove that it holds this run's secret: refused before sending "
                  "anything. Fix: check that the address is the driver's (TRAINER_PS_HOST, spark.driver.host) and "
                  "that nothing else listens on that port")
    try:
        welcome = channel.recv_rest(header, PREAUTH_MAX_BODY, max_meta=PREAUTH_MAX_META, deadline=deadline)
    except IntegrityError:
        raise AuthenticationError(not_proven) from None
    bytes_in += welcome.nbytes
    given = welcome.meta.pop("proof", None)
    try:
        given_bytes = bytes.fromhex(given) if isinstance(given, str) else b""
    except ValueError:
        given_bytes = b""
    if not hmac.compare_digest(given_bytes, proof(credentials.secret, "server", t)):
        raise AuthenticationError(not_proven)
    return channel, welcome.meta, bytes_out, bytes_in


def _raise_refusal(frame: Frame, prefix: str) -> None:
    text = str(frame.meta.get("error", "unknown error"))[:2000]
    if frame.meta.get("busy") is True:
        raise ServerBusy(f"{prefix}: {text}")
    raise AuthenticationError(f"{prefix}: {text}")
