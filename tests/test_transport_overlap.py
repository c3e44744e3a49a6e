"""The faster round trip of trainer.transport: libcrypto's Poly1305, the hash on a helper thread, kernel timeouts.

Frames of `OVERLAP_MIN` bytes or more are hashed on a helper thread while
they move (trainer.transport.overlap) when the MAC releases the GIL
(libcrypto's Poly1305 through ctypes, hashlib's HMAC and BLAKE2b): the tag
must be the one of the whole frame, as a peer that hashes in line computes
it, and a flipped byte anywhere must still be refused. Sockets after the
handshake are blocking with kernel timeouts (`set_io_timeout`): a stalled
peer must still time out, both ways.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time

import numpy as np
import pytest

from trainer.transport import libcrypto, overlap
from trainer.transport.frame_auth import (
    HEADER_SIZE, MAC_ALGORITHMS, OVERLAP_MIN, TRAILER, Channel, frame_tag, releases_gil,
)
from trainer.transport.wire import (
    ConnectionClosed, IntegrityError, Msg, RecvBuffer, TransportTimeout, encode, recv_exact, send_buffers,
    set_io_timeout,
)

KEY_A, KEY_B = bytes(range(32)), bytes(range(32, 64))
GIL_FREE = [m for m in MAC_ALGORITHMS if releases_gil(m)]


@pytest.fixture(autouse=True)
def helper_threads_on_any_machine(monkeypatch):
    """Frames are hashed behind only where the process has 4 cores or more: here, on every machine."""
    monkeypatch.setattr(overlap, "MIN_CORES", 1)


def test_frames_are_hashed_behind_only_with_cores_to_spare(monkeypatch):
    a, b = socket.socketpair()
    with a, b:
        assert Channel(a, mac="hmac-sha256", send_key=KEY_A, recv_key=KEY_B, peer="b")._overlap
        monkeypatch.setattr(overlap, "MIN_CORES", 10_000)
        assert not overlap.enabled()
        assert not Channel(a, mac="hmac-sha256", send_key=KEY_A, recv_key=KEY_B, peer="b")._overlap


def big_frame(step: int = 1) -> tuple[list, list[np.ndarray]]:
    arrays = [np.arange(OVERLAP_MIN, dtype="f4") * step, np.ones(7, "f8"), np.arange(300_001, dtype="i2")]
    return encode(Msg.COMMIT, {"step": step}, arrays), arrays


def wire_of(channel: Channel, peer: socket.socket, buffers: list) -> bytearray:
    """What `channel` puts on the wire for one frame (sent from a thread, read on `peer`)."""
    size = sum(len(memoryview(b).cast("B")) for b in buffers) + TRAILER.size
    sender = threading.Thread(target=channel.send, args=(buffers,))
    sender.start()
    wire = bytearray()
    while len(wire) < size:
        wire += peer.recv(size - len(wire))
    sender.join(10)
    return wire


def receive(wire: bytes, mac: str, chunk: int | None = None):
    """Feed `wire` to a fresh receiving channel over a blocking socket with kernel timeouts (in `chunk`-byte
    trickles when given); returns (the frame, the channel)."""
    c, d = socket.socketpair()
    with c, d:
        set_io_timeout(d, 10.0)

        def feed() -> None:
            for i in range(0, len(wire), chunk or len(wire)):
                c.sendall(wire[i:i + (chunk or len(wire))])
                if chunk:
                    time.sleep(0.0005)

        feeder = threading.Thread(target=feed)
        feeder.start()
        receiver = Channel(d, mac=mac, send_key=KEY_B, recv_key=KEY_A, peer="the sender")
        try:
            return receiver.recv(1 << 26, into=RecvBuffer()), receiver
        finally:
            feeder.join(10)


@pytest.mark.skipif(not libcrypto.available(), reason="no libcrypto 3 with EVP_MAC on this machine")
def test_libcrypto_poly1305_gives_the_rfc_tag_and_the_tags_of_cryptography():
    from cryptography.hazmat.primitives.poly1305 import Poly1305

    h = libcrypto.Poly1305(libcrypto._RFC_KEY)
    h.update(libcrypto._RFC_MESSAGE)
    assert h.finalize() == libcrypto._RFC_TAG
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 3_000_017, dtype=np.uint8)
    data.setflags(write=False)  # read-only buffers are hashed in place too
    for cuts in ([], [1], [15, 16, 17], [65_536, 1_000_000, 2_999_999]):
        key = rng.bytes(32)
        ours, theirs = libcrypto.Poly1305(key), Poly1305(key)
        for piece in np.split(data, cuts):
            ours.update(memoryview(piece))
            theirs.update(piece.tobytes())
        assert ours.finalize() == theirs.finalize()
    with pytest.raises(ValueError, match="a Poly1305 key is 32 bytes, received 16"):
        libcrypto.Poly1305(bytes(16))


def test_without_libcrypto_its_poly1305_refuses_and_the_channel_uses_cryptographys(monkeypatch):
    monkeypatch.setattr(libcrypto, "_state", {"ok": False})
    with pytest.raises(OSError, match="not available here .* use cryptography's Poly1305 instead"):
        libcrypto.Poly1305(bytes(32))
    assert not releases_gil("poly1305") and releases_gil("hmac-sha256")
    assert frame_tag("poly1305", KEY_A, 3, [b"abc"]) == frame_tag("poly1305", KEY_A, 3, [b"a", b"bc"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mac", GIL_FREE)
def test_a_frame_hashed_behind_has_the_tag_of_the_whole_frame_and_a_flipped_byte_anywhere_is_caught(mac):
    buffers, arrays = big_frame()
    a, b = socket.socketpair()
    with a, b:
        set_io_timeout(a, 10.0)
        sender = Channel(a, mac=mac, send_key=KEY_A, recv_key=KEY_B, peer="the receiver")
        wire = wire_of(sender, b, buffers)
    assert sender._behind is not None, "a frame this large is hashed on the helper thread"
    assert TRAILER.unpack(wire[-TRAILER.size:]) == (0, frame_tag(mac, KEY_A, 0, buffers))
    frame, receiver = receive(bytes(wire), mac, chunk=100_003)  # many small arrivals, each hashed behind
    assert receiver._behind is not None
    np.testing.assert_array_equal(frame.arrays[0], arrays[0])
    np.testing.assert_array_equal(frame.arrays[2], arrays[2])
    body = len(wire) - TRAILER.size
    for flip in (HEADER_SIZE + 3, body - len(bytes(arrays[2].data)), body // 2, body - 1, len(wire) - 1):
        tampered = bytearray(wire)
        tampered[flip] ^= 1
        with pytest.raises(IntegrityError, match="bad MAC"):
            receive(bytes(tampered), mac)
    tampered = bytearray(wire)
    tampered[body + 7] ^= 1  # the sequence number
    with pytest.raises(IntegrityError, match="expected frame #0, received #1"):
        receive(bytes(tampered), mac)


@pytest.mark.timeout(60)
def test_with_a_mac_that_holds_the_gil_frames_are_hashed_in_line_with_the_same_tag(monkeypatch):
    buffers, arrays = big_frame(3)
    loaded = libcrypto.available()
    monkeypatch.setitem(libcrypto._state, "ok", False)  # cryptography's Poly1305: no helper thread
    a, b = socket.socketpair()
    with a, b:
        sender = Channel(a, mac="poly1305", send_key=KEY_A, recv_key=KEY_B, peer="the receiver")
        wire = wire_of(sender, b, buffers)
    assert sender._behind is None and not releases_gil("poly1305")
    monkeypatch.setitem(libcrypto._state, "ok", loaded)
    frame, receiver = receive(bytes(wire), "poly1305")  # a peer hashing behind (where libcrypto loads) agrees
    assert (receiver._behind is not None) == loaded
    np.testing.assert_array_equal(frame.arrays[0], arrays[0])
    wire[HEADER_SIZE + 100] ^= 1
    with pytest.raises(IntegrityError, match="bad MAC"):
        receive(bytes(wire), "poly1305")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mac", GIL_FREE[:1])
def test_a_frame_cut_short_while_hashed_behind_fails_cleanly_and_the_channel_thread_goes_on(mac):
    buffers, _ = big_frame()
    a, b = socket.socketpair()
    with a, b:
        wire = wire_of(Channel(a, mac=mac, send_key=KEY_A, recv_key=KEY_B, peer="b"), b, buffers)
    c, d = socket.socketpair()
    with d:
        set_io_timeout(d, 10.0)

        def half_then_close() -> None:
            with c:
                c.sendall(wire[: len(wire) // 2])

        feeder = threading.Thread(target=half_then_close)
        feeder.start()
        receiver = Channel(d, mac=mac, send_key=KEY_B, recv_key=KEY_A, peer="a")
        with pytest.raises(ConnectionClosed, match="peer closed the connection after"):
            receiver.recv(1 << 26)
        feeder.join(10)
        assert receiver._behind is not None and not receiver._behind._queue and not receiver._behind._busy
    frame, _ = receive(bytes(wire), mac)  # a whole frame on a fresh connection is fine
    assert frame.meta == {"step": 1}


@pytest.mark.timeout(60)
def test_the_hash_helper_thread_ends_when_idle_and_starts_again(monkeypatch):
    monkeypatch.setattr(overlap, "IDLE_SECONDS", 0.2)
    behind = overlap.HashBehind("mac-test")
    for round_ in range(2):
        h = hashlib.sha256()
        behind.update(h, b"abc", memoryview(b"def"))
        assert behind.digest(h) == hashlib.sha256(b"abcdef").digest()
        assert any(t.name == "mac-test" for t in threading.enumerate())
        deadline = time.monotonic() + 5
        while any(t.name == "mac-test" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(t.name == "mac-test" for t in threading.enumerate()), f"round {round_}: still running"


class _Broken:
    def update(self, data) -> None:
        raise MemoryError("no room")


def test_what_the_helper_raises_is_raised_by_digest_and_the_next_frame_is_fine():
    behind = overlap.HashBehind("mac-broken")
    behind.update(_Broken(), b"x")
    with pytest.raises(MemoryError, match="no room"):
        behind.digest(_Broken())
    h = hashlib.sha256()
    behind.update(h, b"y")
    assert behind.digest(h) == hashlib.sha256(b"y").digest()


@pytest.mark.timeout(30)
def test_kernel_timeouts_still_bound_a_stalled_receive_and_a_stalled_send():
    a, b = socket.socketpair()
    with a, b:
        set_io_timeout(b, 0.3)
        assert b.gettimeout() is None  # blocking, the kernel keeps the time (Linux)
        a.sendall(b"12345")  # half of what is expected, then nothing
        started = time.monotonic()
        with pytest.raises(TransportTimeout, match="timed out after receiving 5 of 10 bytes"):
            recv_exact(b, 10)
        assert 0.25 < time.monotonic() - started < 5
        started = time.monotonic()
        with pytest.raises(TransportTimeout, match="timed out while sending a frame"):
            send_buffers(b, [bytes(64 << 20)])  # nobody reads: the buffers fill up
        assert time.monotonic() - started < 5
