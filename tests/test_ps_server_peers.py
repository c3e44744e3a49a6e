"""The parameter server against unauthenticated, slow, hostile and surplus peers (trainer.ps.server over
trainer.transport): they are closed, logged and counted, and never disturb the workers already served.
"""

from __future__ import annotations

import logging
import time

import pytest
from ps_fakes import (
    SECRET, client, closed_by_peer, half_close, raw_auth, raw_connect, run_in_thread, server, still_serves,
)

from trainer.ps import PSClient
from trainer.transport.frame_auth import TRAILER
from trainer.transport.wire import HEADER, MAGIC, AuthenticationError, Msg, ServerBusy, new_secret, read_frame


@pytest.mark.timeout(60)
def test_silent_unauthenticated_peer_is_closed_after_handshake_timeout():
    with server(handshake_timeout=0.5) as ps:
        sock = raw_connect(ps)
        with sock:
            # A silent peer sends nothing, so only the handshake timeout can close it; 30 s leaves room for a
            # loaded machine.
            assert closed_by_peer(sock, within=30)
        still_serves(ps)
        assert any(e["kind"] == "auth_failed" for e in ps.events)


@pytest.mark.timeout(60)
def test_trickling_peer_cannot_extend_the_handshake():
    with server(handshake_timeout=0.6) as ps:
        sock = raw_connect(ps)
        with sock:
            read_frame(sock, 4096)
            header = HEADER.pack(MAGIC, int(Msg.AUTH), 100, 0)
            sent = 0
            for byte in header:  # one byte every 0.5 s: each recv is quick, the frame is not
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    break
                sent += 1
                time.sleep(0.5)
            # The header alone takes 8 s to trickle in: a deadline per recv would keep the peer for all of it
            # (and the 0.6 s after), a deadline per frame drops it a few bytes in.
            assert sent < len(header), "the trickling peer was kept for its whole header"
        still_serves(ps)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        HEADER.pack(MAGIC, int(Msg.AUTH), 10, 1 << 20),  # oversize body before auth
        HEADER.pack(MAGIC, int(Msg.AUTH), 1 << 19, 0),  # oversize meta before auth
        HEADER.pack(MAGIC, int(Msg.PULL), 2, 0) + b"{}",  # not AUTH
        HEADER.pack(MAGIC, int(Msg.AUTH), 2, 0) + b"{}",  # AUTH without fields
    ],
)
def test_garbage_before_auth_is_rejected(garbage):
    with server(handshake_timeout=120) as ps:
        sock = raw_connect(ps)
        with sock:
            read_frame(sock, 4096)
            sock.sendall(garbage)
            # Rejected at once, not after the handshake timeout: 15 s is an eighth of it.
            assert closed_by_peer(sock, within=15)
        still_serves(ps)


@pytest.mark.timeout(20)
def test_wrong_secret_and_bad_worker_index_are_rejected(caplog):
    with server(num_workers=2) as ps:
        with caplog.at_level(logging.WARNING, logger="trainer.ps"):
            with pytest.raises(AuthenticationError, match="secret"):
                client(ps, 0, secret=new_secret())
        assert "127.0.0.1" in caplog.text  # the peer address is logged
        with pytest.raises(AuthenticationError, match="out of range"):
            client(ps, 2)
        still_serves(ps, worker=1)
        assert sum(e["kind"] == "auth_failed" for e in ps.events) == 2


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "garbage",
    [
        HEADER.pack(MAGIC, int(Msg.COMMIT), 100, 0) + b"{",  # truncated frame, then EOF
        HEADER.pack(MAGIC, int(Msg.COMMIT), 2, 1 << 40) + b"{}",  # body over max_body
        b"\x00" * 64,  # garbage
        HEADER.pack(MAGIC, int(Msg.COMMIT), 4, 0) + b"[1]x" + TRAILER.pack(0, bytes(32)),  # invalid meta, no MAC
        HEADER.pack(MAGIC, int(Msg.PULL), 2, 0) + b"{}",  # a valid frame without its trailer, then EOF
    ],
)
def test_bad_frames_after_auth_close_only_that_connection(garbage):
    with server(num_workers=2) as ps:
        with client(ps, 1) as bystander:
            bystander.hello()
            sock, _ = raw_auth(ps, worker=0)
            with sock:
                sock.sendall(garbage)
                if garbage.endswith(b"{") or garbage.endswith(b"{}"):
                    half_close(sock)
                assert closed_by_peer(sock, within=3)
            assert bystander.pull()[1] == 0  # the other connection is unaffected
        still_serves(ps)
        assert any(e["kind"] in ("protocol_error", "disconnect", "integrity_error") for e in ps.events)


@pytest.mark.timeout(20)
def test_max_connections_counts_workers_and_a_busy_server_is_retried():
    with server(max_connections=2, handshake_timeout=10) as ps:
        a, b = client(ps, 0), client(ps, 0)
        idle = raw_connect(ps)  # pending connections take no worker slot
        read_frame(idle, 4096)
        host, port = ps.address
        with pytest.raises(ServerBusy, match="max_connections=2"):
            PSClient(host, port, SECRET, 0, timeout=10, connect_timeout=0.5).connect()
        late = PSClient(host, port, SECRET, 0, timeout=10, connect_timeout=10)
        t, out = run_in_thread(late.connect)
        time.sleep(0.3)
        a.close()  # a slot frees up: the waiting client gets it
        t.join(10)
        assert out.get("result") is late and late.pull()[1] == 0
        for c in (b, late, idle):
            c.close()
        assert any(e["kind"] == "connection_refused" for e in ps.events)


