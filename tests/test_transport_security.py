"""Security of the shared endpoint over real loopback sockets (trainer.transport: handshake, session, tls, endpoint).

A relay in the middle (tests/relay.py) alters, injects or replays frames; a fake
server that does not hold the secret tries to collect weights; TLS pins the
run's certificate; a flood of idle sockets must not lock a worker out.
"""

from __future__ import annotations

import builtins
import logging
import socket
import threading
import time

import numpy as np
import pytest

from relay import Relay
from trainer.ps import ParameterServer, PSClient, RemoteError
from trainer.selection.engine.hopper import HopperClient, HopperServer
from trainer.transport import tls as tls_module
from trainer.transport.handshake import Credentials, proof, session_keys, transcript
from trainer.transport.frame_auth import DEFAULT_MAC, MAC_ALGORITHMS, TRAILER, Channel
from trainer.transport.tls import TlsIdentity, TlsUnavailable
from trainer.transport.wire import (
    HEADER, MAGIC, PROTOCOL_VERSION, AuthenticationError, ConnectionClosed, IntegrityError, Msg, TransportError,
    new_nonce, new_secret, read_frame, write_frame,
)

SECRET = new_secret()
SHAPES = [(3,), (2, 2)]


class AddRule:
    name = "add"
    synchronous = False
    exchanges_optimizer_state = False

    def server_commit(self, center, payload, staleness):
        new = [c + p for c, p in zip(center, payload)]
        return new, new


def initial_center() -> list[np.ndarray]:
    return [np.zeros(SHAPES[0], "f4"), np.zeros(SHAPES[1], "f8")]


def ones() -> list[np.ndarray]:
    return [np.ones(SHAPES[0], "f4"), np.ones(SHAPES[1], "f8")]


def server(**kw) -> ParameterServer:
    kw.setdefault("num_workers", 1)
    return ParameterServer(AddRule(), initial_center(), secret=SECRET, **kw)


def center_is_initial(ps: ParameterServer) -> bool:
    return ps.version == 0 and all(not a.any() for a in ps.center())


# -- a relay in the middle ------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("attack", ["flip", "inject"])
def test_a_relay_that_alters_or_injects_a_commit_is_refused(attack, caplog):
    with server() as ps, Relay(ps.address, attack) as relay:
        client = PSClient(*relay.address, ps.credentials, 0, timeout=10).connect()
        client.hello()
        with caplog.at_level(logging.ERROR, logger="trainer.ps"):
            with pytest.raises(RemoteError, match="integrity check failed: .*failed its integrity check .bad MAC."):
                client.commit(ones(), {"epoch": 0, "step": 1})
        assert relay.attacks_done == 1
        assert center_is_initial(ps), "the altered or forged update must not reach the center"
        with pytest.raises((ConnectionClosed, TransportError)):
            client.pull()  # the server closed the connection
        client.close()
        assert any(e["kind"] == "integrity_error" for e in ps.events)
        assert "failed its integrity check" in caplog.text
        with PSClient(*ps.address, ps.credentials, 0, timeout=10) as direct:  # others are still served
            assert direct.pull()[1] == 0


@pytest.mark.timeout(30)
def test_a_relay_that_replays_a_commit_gets_it_applied_once_and_the_connection_closed():
    with server() as ps, Relay(ps.address, "replay") as relay:
        client = PSClient(*relay.address, ps.credentials, 0, timeout=10).connect()
        client.hello()
        assert client.commit(ones(), {"epoch": 0, "step": 1})[1]["version"] == 1  # the genuine one
        with pytest.raises(RemoteError, match="out of sequence from .*: expected frame #2, received #1"):
            client.pull()
        assert ps.version == 1 and np.array_equal(ps.center()[0], np.ones(3)), "applied once, not twice"
        client.close()


@pytest.mark.timeout(30)
def test_a_relay_that_alters_a_reply_makes_the_client_fail():
    with server() as ps, Relay(ps.address, tamper_replies=True) as relay:
        client = PSClient(*relay.address, ps.credentials, 0, timeout=10).connect()
        with pytest.raises(IntegrityError, match="reply of the parameter server .* HELLO failed its integrity"):
            client.hello()
        assert relay.attacks_done == 1 and not client.connected


@pytest.mark.timeout(30)
def test_a_relay_that_turns_the_mac_off_in_the_challenge_is_refused():
    """The CHALLENGE is not sealed, but both proofs cover it: a downgrade makes them disagree."""
    with server() as ps:
        listener = socket.create_server(("127.0.0.1", 0))

        def downgrade() -> None:
            worker, _ = listener.accept()
            upstream = socket.create_connection(ps.address)
            challenge = read_frame(upstream, 4096)
            write_frame(worker, Msg.CHALLENGE, {**challenge.meta, "mac": None})
            auth = read_frame(worker, 4096)
            write_frame(upstream, Msg.AUTH, auth.meta)
            answer = read_frame(upstream, 4096)
            write_frame(worker, answer.msg, answer.meta)
            worker.close(), upstream.close()

        thread = threading.Thread(target=downgrade, daemon=True)
        thread.start()
        unprotected = Credentials(SECRET, mac=None)
        with pytest.raises(AuthenticationError, match="authentication failed"):
            PSClient(*listener.getsockname()[:2], unprotected, 0, timeout=10, connect_timeout=1).connect()
        thread.join(5)
        listener.close()
        assert any(e["kind"] == "auth_failed" for e in ps.events)


# -- a server that does not hold the secret -------------------------------------------------


class FakeServer:
    """Speaks the protocol but holds another secret: records every byte a worker sends it."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[:2]
        self.received = bytearray()
        self.frames: list[Msg] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        with sock:
            nonce = new_nonce()
            write_frame(sock, Msg.CHALLENGE, {"protocol": PROTOCOL_VERSION, "nonce": nonce.hex(),
                                              "mac": DEFAULT_MAC, "num_workers": 1})
            auth = read_frame(sock, 4096)
            self.frames.append(auth.msg)
            guess = new_secret()
            t = transcript(PROTOCOL_VERSION, nonce, bytes.fromhex(auth.meta["nonce"]), 0, 0, DEFAULT_MAC, None)
            if self.answer == "sealed":  # a correctly built OK, with keys and a proof from the wrong secret
                c2s, s2c = session_keys(guess, t)
                Channel(sock, mac=DEFAULT_MAC, send_key=s2c, recv_key=c2s, peer="w").send_frame(
                    Msg.OK, {"version": 0, "proof": proof(guess, "server", t).hex()})
            else:  # echo the client's own proof back, with a made-up MAC
                write_frame(sock, Msg.OK, {"version": 0, "proof": auth.meta["proof"]})
                sock.sendall(TRAILER.pack(0, bytes(32)))
            sock.settimeout(2)
            try:
                while chunk := sock.recv(1 << 16):
                    self.received += chunk
            except OSError:
                pass

    def close(self) -> None:
        self.thread.join(5)
        self.listener.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("answer", ["sealed", "echo"])
def test_a_server_without_the_secret_is_refused_before_any_weights_are_sent(answer):
    fake = FakeServer(answer)
    client = PSClient(*fake.address, SECRET, 0, timeout=10)
    with pytest.raises(AuthenticationError, match="did not prove that it holds this run's secret"):
        client.connect()
    fake.close()
    assert fake.frames == [Msg.AUTH], "the worker sent its AUTH and nothing else"
    assert not fake.received, f"the worker sent {len(fake.received)} bytes to a server that did not prove the secret"
    assert not client.connected


def test_proofs_and_keys_are_bound_to_the_transcript():
    ns, nc = new_nonce(), new_nonce()
    t = transcript(PROTOCOL_VERSION, ns, nc, 1, 0, "hmac-sha256", None)
    assert proof(SECRET, "client", t) != proof(SECRET, "server", t), "a proof cannot be reflected"
    for other in (transcript(PROTOCOL_VERSION, ns, nc, 2, 0, "hmac-sha256", None),
                  transcript(PROTOCOL_VERSION, ns, nc, 1, 1, "hmac-sha256", None),
                  transcript(PROTOCOL_VERSION, ns, nc, 1, 0, None, None),
                  transcript(PROTOCOL_VERSION, ns, new_nonce(), 1, 0, "hmac-sha256", None)):
        assert proof(SECRET, "client", other) != proof(SECRET, "client", t)
    c2s, s2c = session_keys(SECRET, t)
    assert c2s != s2c and len(c2s) == 32
    assert "secret" not in repr(Credentials(SECRET)) and SECRET.hex() not in repr(Credentials(SECRET))
    with pytest.raises(ValueError, match="MAC algorithm"):
        Credentials(SECRET, mac="md5")
    with pytest.raises(ValueError, match="tls_fingerprint"):
        Credentials(SECRET, tls_fingerprint="xyz")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mac", [*MAC_ALGORITHMS, False])
def test_every_mac_setting_serves_requests(mac):
    with server(frame_mac=mac) as ps, PSClient(*ps.address, ps.credentials, 0, timeout=10) as c:
        c.hello()
        assert c.commit(ones(), {"step": 1})[1]["version"] == 1
        assert c.pull()[1] == 1
    with server(frame_mac=mac) as ps:
        other = Credentials(SECRET, mac="blake2b" if mac == "hmac-sha256" else "hmac-sha256")
        with pytest.raises(AuthenticationError, match="offers frame MAC"):
            PSClient(*ps.address, other, 0, timeout=10).connect()


# -- TLS ------------------------------------------------------------------------------------


def _backends() -> list[str]:
    found = ["openssl"] if tls_module.shutil.which("openssl") else []
    try:
        import cryptography  # noqa: F401
        found.append("cryptography")
    except ImportError:
        pass
    return found


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["cryptography", "openssl"])
def test_tls_with_a_pinned_throwaway_certificate(backend):
    if backend not in _backends():
        pytest.skip(f"{backend} is not installed here")
    identity = TlsIdentity.generate(backend)
    assert b"PRIVATE KEY" not in repr(identity).encode()
    with server(tls=identity, handshake_timeout=2) as ps:
        assert ps.credentials.tls_fingerprint == identity.fingerprint
        with PSClient(*ps.address, ps.credentials, 0, timeout=10) as c:
            assert c._sock.version() == "TLSv1.3"
            c.hello()
            assert c.commit(ones(), {"step": 1})[1]["version"] == 1
        impostor = Credentials(SECRET, tls_fingerprint=TlsIdentity.generate(backend).fingerprint)
        with pytest.raises(AuthenticationError, match="not this run's"):
            PSClient(*ps.address, impostor, 0, timeout=10).connect()
        with pytest.raises(ConnectionClosed, match="closed the connection during the handshake"):
            PSClient(*ps.address, Credentials(SECRET), 0, timeout=10, connect_timeout=1).connect()
    with server() as plain:  # a task told to use TLS does not talk to a server without it
        with pytest.raises(AuthenticationError, match="TLS handshake .* failed"):
            PSClient(*plain.address, Credentials(SECRET, tls_fingerprint=identity.fingerprint), 0, timeout=10).connect()


@pytest.mark.timeout(60)
def test_the_model_hopper_speaks_tls_too():
    if not _backends():
        pytest.skip("no TLS backend here")

    class Handler:
        def hello(self, worker, attempt, meta):
            return {"rows": meta["rows"]}

    hopper = HopperServer(Handler(), 1, SECRET, tls=True, wait_s=0.5)
    hopper.start()
    try:
        with HopperClient(*hopper.address, hopper.credentials, 0, timeout=10) as c:
            assert c.hello({"rows": 3}) == {"rows": 3}
    finally:
        hopper.stop()


def test_tls_without_cryptography_or_openssl_names_what_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_cryptography(name, *args, **kwargs):
        if name.startswith("cryptography"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cryptography)
    monkeypatch.setattr(tls_module.shutil, "which", lambda name: None)
    with pytest.raises(TlsUnavailable, match=r"pip install '\.\[tls\]' in the checkout.*apt-get install openssl"):
        server(tls=True)


# -- admission ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_fifty_idle_unauthenticated_sockets_do_not_block_a_worker():
    with server(num_workers=2, handshake_timeout=30) as ps:
        idle = [socket.create_connection(ps.address) for _ in range(50)]
        try:
            time.sleep(0.5)  # let the server accept them all
            start = time.monotonic()
            with PSClient(*ps.address, ps.credentials, 1, timeout=10, connect_timeout=10) as worker:
                worker.hello()
                assert worker.commit(ones(), {"step": 1})[1]["version"] == 1
            assert time.monotonic() - start < 5

            def conn_threads() -> int:
                return sum(t.name.startswith("ps-conn-") for t in threading.enumerate())

            deadline = time.monotonic() + 3
            while conn_threads() > 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert conn_threads() <= 8, f"idle sockets must not take a thread each: {conn_threads()}"
        finally:
            for s in idle:
                s.close()
        assert any(e["kind"] == "pending_evicted" for e in ps.events)


@pytest.mark.timeout(30)
def test_a_peer_stalling_in_the_tls_handshake_is_dropped_at_the_deadline():
    if not _backends():
        pytest.skip("no TLS backend here")
    with server(tls=True, handshake_timeout=1.0) as ps:
        sock = socket.create_connection(ps.address)
        with sock:
            sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then silence
            sock.settimeout(5)
            start = time.monotonic()
            assert sock.recv(1024) == b""
            assert time.monotonic() - start < 4
        assert any(e["kind"] == "auth_failed" for e in ps.events)


def test_a_frame_is_checked_before_its_meta_is_parsed_and_in_sequence():
    a, b = socket.socketpair()
    key = new_secret()
    sender = Channel(a, mac="hmac-sha256", send_key=key, recv_key=key, peer="a")
    receiver = Channel(b, mac="hmac-sha256", send_key=key, recv_key=key, peer="the sender")
    with a, b:
        sender.send_frame(Msg.PULL, {"x": 1})
        assert receiver.recv(1024).meta == {"x": 1}
        a.sendall(HEADER.pack(MAGIC, int(Msg.PULL), 4, 0) + b"[1]x" + TRAILER.pack(1, bytes(32)))
        with pytest.raises(IntegrityError, match="frame #1 .* from the sender failed its integrity check"):
            receiver.recv(1024)  # invalid JSON, but the MAC fails first: nothing was parsed
    a, b = socket.socketpair()
    sender = Channel(a, mac="blake2b", send_key=key, recv_key=key, peer="a")
    receiver = Channel(b, mac="blake2b", send_key=key, recv_key=key, peer="the sender")
    with a, b:
        sender.sent = 5  # a frame from the future: one was dropped in between
        sender.send_frame(Msg.PULL, {})
        with pytest.raises(IntegrityError, match="expected frame #0, received #5"):
            receiver.recv(1024)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mac", MAC_ALGORITHMS)
def test_a_frame_larger_than_a_mac_piece_keeps_its_tag_and_a_flipped_byte_in_any_piece_is_caught(mac):
    """A large frame is hashed and sent piece by piece, and hashed as it arrives: the tag must be the one of
    the whole frame (peers of either kind agree), and the check must still cover every byte."""
    from trainer.transport.frame_auth import MAC_PIECE, _pieces, frame_tag
    from trainer.transport.wire import encode

    arrays = [np.arange(3 * MAC_PIECE // 4, dtype="f4"), np.ones(7, "f8")]  # 3 MiB and a small one
    buffers = encode(Msg.COMMIT, {"step": 1}, arrays)
    pieces = list(_pieces(buffers, MAC_PIECE))
    assert [sum(len(v) for v in p) for p in pieces][:-1] == [MAC_PIECE] * (len(pieces) - 1)
    assert b"".join(bytes(v) for p in pieces for v in p) == b"".join(bytes(b) for b in buffers)
    key_a, key_b = bytes(range(32)), bytes(range(32, 64))
    for flip in (None, 100, 2 * MAC_PIECE + 5):
        a, b = socket.socketpair()
        with a, b:
            sender = Channel(a, mac=mac, send_key=key_a, recv_key=key_b, peer="b")
            receiver = Channel(b, mac=mac, send_key=key_b, recv_key=key_a, peer="a")
            size = sum(len(memoryview(x).cast("B")) for x in buffers) + TRAILER.size
            t = threading.Thread(target=sender.send, args=(buffers,))
            t.start()
            wire = bytearray()
            while len(wire) < size:
                wire += b.recv(size - len(wire))
            t.join(10)
            assert TRAILER.unpack(wire[-TRAILER.size:]) == (0, frame_tag(mac, key_a, 0, buffers))
            if flip is not None:
                wire[flip] ^= 1
            c, d = socket.socketpair()
            with c, d:
                feeder = threading.Thread(target=c.sendall, args=(bytes(wire),))
                feeder.start()
                receiver.sock = d
                if flip is None:
                    frame = receiver.recv(1 << 24)
                    np.testing.assert_array_equal(frame.arrays[0], arrays[0])
                else:
                    with pytest.raises(IntegrityError, match="bad MAC"):
                        receiver.recv(1 << 24)
                feeder.join(10)


def test_the_frame_mac_option_is_checked_before_any_cluster_work():
    from trainer import Trainer
    from trainer.transport.frame_auth import check_frame_mac

    assert [check_frame_mac(v) for v in (True, False, 0, "poly1305", "hmac-sha256")] == \
        [True, False, False, "poly1305", "hmac-sha256"]
    for bad in ("md5", "POLY1305", None, 1.5):
        with pytest.raises(ValueError, match="`frame_mac` must be True, False or one of 'poly1305'"):
            Trainer(lambda: None, num_workers=1, frame_mac=bad)


def test_without_cryptography_the_default_mac_says_what_to_install(monkeypatch):
    from trainer.transport import frame_auth as session

    monkeypatch.setattr(session, "Poly1305", None)
    with pytest.raises(ValueError, match="needs the cryptography package.*frame_mac='hmac-sha256'"):
        server()
    with server(frame_mac="hmac-sha256") as ps:  # the standard library's MACs still serve
        with PSClient(*ps.address, ps.credentials, 0, timeout=10) as c:
            assert c.pull()[1] == 0
