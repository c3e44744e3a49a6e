"""A connection after its handshake: every frame carries a sequence number and a MAC, checked before use.

The handshake (:mod:`trainer.transport.handshake`) leaves both ends with one
key per direction, derived from the shared secret and both sides' nonces. From
then on every frame (see :mod:`trainer.transport.wire`) is followed by a
trailer::

    seq   u64, big-endian: the number of frames sent before it in this direction (0, 1, 2, ...)
    tag   32 bytes: MAC(key of this direction, seq || header || meta || body)

The receiver checks the header against its limits, reads the rest of the
frame (hashing it as it arrives, while the sender hashes what comes next),
and compares ``seq`` with the number it expects and ``tag`` with its own (in
constant time) *before* it parses the meta or builds an array. A difference raises
:class:`~trainer.transport.wire.IntegrityError` and the caller closes the connection: an altered,
injected, replayed, dropped or reordered frame is never used.

MAC algorithms: ``"poly1305"`` (the default), ``"hmac-sha256"`` and
``"blake2b"`` (keyed BLAKE2b-256). Poly1305 is a one-time authenticator: each
frame gets its own key, ``HMAC-SHA256(key of this direction, "poly1305" ||
seq)`` (sequence numbers never repeat within a connection, and every
connection has its own keys), as ChaCha20-Poly1305 derives one per nonce; its
16-byte tag fills the first half of the trailer's tag, the rest is zeros.
It runs at about 12 GB/s on the development machine against 1.7 GB/s for
HMAC-SHA256 with the SHA extensions (``benchmarks/bench_security.py --mac-only``;
docs/security.md has the figures), which is what keeps a MAC on every frame
cheap next to the round trip. Poly1305 comes from the system's libcrypto
through ctypes where it loads and passes RFC 8439's test vector
(:mod:`trainer.transport.libcrypto`: it hashes without the GIL), else from
the ``cryptography`` package (a dependency); the other two from the
standard library. ``mac=None`` sends no trailer (the peers agreed to rely on
TLS or on the network).

Where the MAC releases the GIL and the process has cores to spare, a frame
of at least `OVERLAP_MIN` bytes is hashed on a helper thread while the
channel's thread sends or receives it (:mod:`trainer.transport.overlap`):
the copy through the socket and the hash run side by side instead of one
after the other. Otherwise it goes out in
pieces of `MAC_PIECE` bytes, each hashed right before it is sent, and is
hashed as it arrives.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any, Iterator, Sequence

try:
    from cryptography.hazmat.primitives.poly1305 import Poly1305
except ImportError:  # installed without its dependencies: the standard library's MACs still work
    Poly1305 = None

from trainer.transport import libcrypto, overlap
from trainer.transport.overlap import HashBehind
from trainer.transport.wire import (
    HEADER_SIZE,
    MAX_META,
    ConnectionClosed,
    Frame,
    IntegrityError,
    Msg,
    RecvBuffer,
    decode_header,
    decode_payload,
    encode,
    recv_exact,
    send_buffers,
)

#: MAC algorithms a session may use, fastest on the development machine first.
MAC_ALGORITHMS = ("poly1305", "hmac-sha256", "blake2b")
DEFAULT_MAC = "poly1305"
TAG_SIZE = 32
TRAILER = struct.Struct(f"!Q{TAG_SIZE}s")
_SEQ = struct.Struct("!Q")


def check_mac_algorithm(name: Any) -> str | None:
    """`name` if it is a known MAC algorithm or None (no MAC); ValueError otherwise."""
    if name == "poly1305" and Poly1305 is None:
        raise ValueError("the frame MAC poly1305 (the default) needs the cryptography package, a dependency of "
                         "spark-keras-trainer: pip install cryptography, or pass frame_mac='hmac-sha256'")
    if name is None or name in MAC_ALGORITHMS:
        return name
    raise ValueError(f"unknown frame MAC algorithm {name!r:.40}; expected one of {list(MAC_ALGORITHMS)} or None")


class OneTimePoly1305:
    """Poly1305 under a key of its own for the frame numbered `seq` (see the module docstring); libcrypto's
    (no GIL held while hashing) where it loads, else `cryptography`'s."""

    def __init__(self, key: bytes, seq: int, size: int | None = None) -> None:
        one_time = hmac.digest(key, b"poly1305" + _SEQ.pack(seq), "sha256")
        # libcrypto's context costs four foreign calls: worth it where the GIL is released long enough.
        big = size is None or size >= LIBCRYPTO_MIN
        self._mac = libcrypto.Poly1305(one_time) if big and libcrypto.available() else Poly1305(one_time)

    def update(self, data) -> None:
        self._mac.update(data)

    def digest(self) -> bytes:
        return self._mac.finalize().ljust(TAG_SIZE, b"\0")


def check_frame_mac(frame_mac: Any) -> bool | str:
    """The ``frame_mac`` option of a fit or a search: True (the default MAC), False (none) or an algorithm name."""
    if isinstance(frame_mac, (bool, int)) and not isinstance(frame_mac, str):
        return bool(frame_mac)
    if isinstance(frame_mac, str) and frame_mac in MAC_ALGORITHMS:
        return frame_mac
    raise ValueError(f"`frame_mac` must be True, False or one of {', '.join(map(repr, MAC_ALGORITHMS))}. "
                     f"Received: frame_mac={frame_mac!r:.60}")


def releases_gil(algorithm: str | None) -> bool:
    """Whether hashing with `algorithm` lets other threads run Python (hashlib's do for buffers over 2 KiB;
    Poly1305 where libcrypto's loads)."""
    if algorithm == "poly1305":
        return libcrypto.available()
    return algorithm in ("hmac-sha256", "blake2b")


def new_mac(algorithm: str, key: bytes, seq: int, size: int | None = None):
    """A hasher (``update``/``digest``) for the frame numbered `seq`, keyed with `key` (`size`: the frame's
    bytes, where known)."""
    if algorithm == "poly1305":
        return OneTimePoly1305(key, seq, size)
    if algorithm == "hmac-sha256":
        return hmac.new(key, _SEQ.pack(seq), hashlib.sha256)
    if algorithm == "blake2b":
        return hashlib.blake2b(_SEQ.pack(seq), key=key, digest_size=TAG_SIZE)
    raise ValueError(f"unknown frame MAC algorithm {algorithm!r}")


def frame_tag(algorithm: str, key: bytes, seq: int, buffers: Sequence) -> bytes:
    """The tag of one encoded frame (a list of buffers, as :func:`~trainer.transport.wire.encode` returns)."""
    h = new_mac(algorithm, key, seq, sum(memoryview(b).nbytes for b in buffers))
    for b in buffers:
        h.update(b)
    return h.digest()


#: Bytes of a frame hashed, then sent, at a time (see `Channel.send`) where the MAC holds the GIL.
MAC_PIECE = 1 << 20
#: Smallest frame hashed by libcrypto's Poly1305 (smaller ones: `cryptography`'s, fewer foreign calls).
LIBCRYPTO_MIN = 64 << 10
#: Smallest frame hashed on the helper thread while it moves (smaller ones: handing over costs more).
OVERLAP_MIN = 256 << 10


def _pieces(buffers: Sequence, size: int) -> Iterator[list[memoryview]]:
    """The bytes of `buffers` in order, as lists of views of about `size` bytes (small buffers grouped, large
    ones cut)."""
    piece: list[memoryview] = []
    room = size
    for b in buffers:
        view = memoryview(b).cast("B")
        while len(view):
            take = view[:room]
            piece.append(take)
            view = view[len(take):]
            room -= len(take)
            if room == 0:
                yield piece
                piece, room = [], size
    if piece:
        yield piece


class Channel:
    """One side of an authenticated connection: sends sealed frames and opens received ones.

    Not thread-safe: one thread sends and receives at a time (request/reply).
    ``peer`` names the other side in error messages.
    """

    def __init__(self, sock: Any, *, mac: str | None, send_key: bytes | None, recv_key: bytes | None,
                 peer: str) -> None:  # fmt: skip
        self.sock = sock
        self.mac = check_mac_algorithm(mac)
        if self.mac is not None and not (send_key and recv_key):
            raise ValueError("a channel with a MAC needs both session keys")
        self._send_key, self._recv_key = send_key, recv_key
        self.peer = peer
        self.sent = 0  # frames sent (the sequence number of the next one)
        self.received = 0  # frames received and verified
        self._overlap = self.mac is not None and releases_gil(self.mac) and overlap.enabled()
        self._behind: HashBehind | None = None

    def _hash_behind(self) -> HashBehind:
        if self._behind is None:
            self._behind = HashBehind(f"mac-{self.peer}")
        return self._behind

    def send(self, buffers: list) -> int:
        """Send one encoded frame with its trailer; returns the bytes written.

        With a MAC that releases the GIL (and cores to spare), a frame of
        `OVERLAP_MIN` bytes or more is hashed on the helper thread while this one sends it, and the
        trailer follows. Otherwise it goes out in pieces of `MAC_PIECE`
        bytes, each hashed right before it is sent: the peer receives and
        hashes one piece while this end hashes the next. The tag is the same.
        """
        seq = self.sent
        self.sent += 1
        if self.mac is None:
            return send_buffers(self.sock, buffers)
        size = sum(memoryview(b).nbytes for b in buffers)
        hasher = new_mac(self.mac, self._send_key, seq, size)  # type: ignore[arg-type]
        if self._overlap and size >= OVERLAP_MIN:
            views = [v for v in (memoryview(b).cast("B") for b in buffers) if len(v)]
            behind = self._hash_behind()
            behind.update(hasher, *views)
            try:
                written = send_buffers(self.sock, views)
            except BaseException:
                behind.cancel()
                raise
            return written + send_buffers(self.sock, [TRAILER.pack(seq, behind.digest(hasher))])
        written = 0
        *pieces, last = _pieces(buffers, MAC_PIECE)  # a frame always has its header
        for piece in pieces:
            for b in piece:
                hasher.update(b)
            written += send_buffers(self.sock, piece)
        for b in last:
            hasher.update(b)
        # The last piece and the trailer in one call: a small frame is one system call, not two.
        return written + send_buffers(self.sock, [*last, TRAILER.pack(seq, hasher.digest())])

    def send_frame(self, msg: Msg, meta: dict[str, Any] | None = None, arrays: Sequence[Any] = ()) -> int:
        return self.send(encode(msg, meta, arrays))

    def recv(self, max_body: int | None, *, max_meta: int = MAX_META, deadline: float | None = None,
             into: RecvBuffer | None = None) -> Frame:  # fmt: skip
        """Receive, verify and decode one frame (``ConnectionClosed`` with ``mid_frame=False`` on a clean EOF).

        ``into``: receive into that reused buffer; the frame's arrays are then
        views valid until the next frame received into it (see `RecvBuffer`).
        """
        try:
            header = recv_exact(self.sock, HEADER_SIZE, deadline=deadline)
        except ConnectionClosed as exc:
            if not exc.mid_frame:
                raise ConnectionClosed("peer closed the connection", mid_frame=False) from None
            raise
        return self.recv_rest(header, max_body, max_meta=max_meta, deadline=deadline, into=into)

    def recv_rest(self, header: bytes | bytearray, max_body: int | None, *, max_meta: int = MAX_META,
                  deadline: float | None = None, into: RecvBuffer | None = None) -> Frame:  # fmt: skip
        """Like `recv`, for a frame whose header was already read."""
        msg, meta_len, body_len = decode_header(header, max_body, max_meta=max_meta)
        n = meta_len + body_len
        size = HEADER_SIZE + n + (TRAILER.size if self.mac is not None else 0)
        hasher = behind = None
        on_data = None
        if self.mac is not None:  # hashed as it arrives (the expected number: a wrong one fails below)
            hasher = new_mac(self.mac, self._recv_key, self.received, size)  # type: ignore[arg-type]
            if self._overlap and size >= OVERLAP_MIN:  # on the helper thread, while the rest arrives
                behind = self._hash_behind()
                behind.update(hasher, header)
                update = behind.update
            else:
                hasher.update(header)
                update = None

            def on_data(offset: int, chunk: memoryview) -> None:
                if offset < n:  # not the trailer
                    if update is None:
                        hasher.update(chunk[:n - offset])
                    else:
                        update(hasher, chunk[:n - offset])

        try:
            rest = (recv_exact(self.sock, size - HEADER_SIZE, deadline=deadline, into=into, on_data=on_data,
                               align_at=meta_len) if size > HEADER_SIZE else bytearray())
        except BaseException:
            if behind is not None:
                behind.cancel()
            raise
        view = memoryview(rest)
        if hasher is not None:
            digest = hasher.digest() if behind is None else behind.digest(hasher)
            seq, tag = TRAILER.unpack(view[n:])
            if seq != self.received:
                raise IntegrityError(
                    f"frame out of sequence from {self.peer}: expected frame #{self.received}, received #{seq} "
                    "(a frame was dropped, replayed or injected in transit); the connection is closed"
                )
            if not hmac.compare_digest(digest, tag):
                raise IntegrityError(
                    f"frame #{seq} ({msg.name}, {size} bytes) from {self.peer} failed its integrity check "
                    "(bad MAC): it was altered in transit, or the peer does not hold this session's key; the "
                    "connection is closed. Fix: find what rewrites traffic between the executors and the driver, "
                    "or turn TLS on (tls=True)"
                )
        self.received += 1
        meta, arrays = decode_payload(view[:meta_len], view[meta_len:n], max_body)
        return Frame(msg, meta, arrays, size)
