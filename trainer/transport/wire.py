"""Wire format of the authenticated endpoints: framing, array codec, limits and auth.

Used by the parameter server (:mod:`trainer.ps`) and the model hopper
(:mod:`trainer.selection.engine.hopper`); it knows nothing about what the frames mean.

Every message is one *frame*::

    header   struct "!4sBIQ": magic b"KPS1", message type (u8),
             meta_len (u32), body_len (u64)
    meta     meta_len bytes of UTF-8 JSON holding one object
    body     body_len bytes: the raw bytes of the arrays, concatenated, C order

The arrays are described in the meta under the reserved key ``"arrays"``: a
list of ``[dtype_name, shape]`` pairs, e.g. ``[["float32", [3, 4]], ...]``.
Only plain little-endian numeric dtypes are allowed (see ``ALLOWED_DTYPES``);
nothing is ever pickled and nothing is ever handed to ``np.load``.

Decoding is defensive: the header is checked against the limits (meta at most
``MAX_META`` bytes, body at most the caller's ``max_body``) *before* anything
else is read or allocated, and every violation raises ``ProtocolError``.

Decoded arrays are zero-copy ``np.frombuffer`` views into the received body;
they are writable when the body is a ``bytearray`` (as with ``read_frame``) and
read-only when it is ``bytes``. They share one buffer, so copy an array if it
must outlive or be isolated from the others. A reader may receive into a
:class:`RecvBuffer` reused from frame to frame (``into=``) instead of a fresh
zero-filled buffer per frame; the arrays of a frame received that way are
valid only until the next frame is received into the same buffer. A received
body starts at an address that is a multiple of ``BODY_ALIGN`` whatever the
length of the meta before it, so its arrays are aligned (numpy adds a
misaligned float32 array through a copying loop, about 1.6x slower, and BLAS
copies it first).

Authentication and integrity live one level up: :mod:`trainer.transport.handshake`
(mutual challenge/response, session keys) and :mod:`trainer.transport.frame_auth`
(a sequence number and a MAC after every frame once the handshake is done).
Until a peer has authenticated, frames are limited to ``PREAUTH_MAX_BODY`` /
``PREAUTH_MAX_META`` bytes.
"""

from __future__ import annotations

import enum
import json
import math
import secrets
import socket
import ssl
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

MAGIC = b"KPS1"
HEADER = struct.Struct("!4sBIQ")
HEADER_SIZE = HEADER.size
#: Largest accepted meta section (bytes).
MAX_META = 1 << 20
#: Largest body and meta accepted from a peer that has not authenticated yet (bytes).
PREAUTH_MAX_BODY = 4096
PREAUTH_MAX_META = 4096
MAX_NDIM = 8
NONCE_SIZE = 32
#: Protocol revision, sent in the CHALLENGE so mismatched peers fail clearly
#: (2: mutual authentication and a MAC on every frame).
PROTOCOL_VERSION = 2

ALLOWED_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
}
# The wire dtype of an array's dtype, either byte order (numpy's dtype.name is Python code: slow per array).
_WIRE_DTYPES: dict[np.dtype, tuple[str, np.dtype]] = {
    d: (name, wire) for name, wire in ALLOWED_DTYPES.items() for d in (wire, wire.newbyteorder(">"))
}

_MAX_DIM = 1 << 62

# sendmsg() accepts at most IOV_MAX (usually 1024) buffers per call.
_MAX_IOV = 512
#: Largest receive while a frame is hashed as it arrives: the hash starts on this much, not the whole frame.
RECV_PIECE = 512 << 10
# Kernel send/receive timeouts on a blocking socket (see set_io_timeout): Linux; elsewhere the socket's own.
_KERNEL_TIMEOUTS = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVTIMEO")
_WAITALL = getattr(socket, "MSG_WAITALL", 0)
#: A received frame's body starts at an address that is a multiple of this many bytes (a cache line).
BODY_ALIGN = 64


class TransportError(Exception):
    """Base class of every error of the transport (and of the services built on it)."""


class ProtocolError(TransportError):
    """A peer sent (or we were asked to send) something that is not a valid frame."""


class ConnectionClosed(TransportError):
    """The peer closed the connection (``mid_frame`` tells whether a frame was cut short)."""

    def __init__(self, message: str, *, mid_frame: bool = True) -> None:
        super().__init__(message)
        self.mid_frame = mid_frame


class TransportTimeout(TransportError):
    """A socket operation did not complete within its timeout."""


class AuthenticationError(TransportError):
    """The handshake failed: a wrong secret on either side, a worker index or attempt the server
    refuses, or a TLS certificate that is not the pinned one."""


class IntegrityError(TransportError):
    """A frame after the handshake failed its MAC or sequence check (altered, injected, replayed or
    dropped in transit); the connection is closed."""


class ServerBusy(TransportError):
    """The server has no free connection slot right now (the client retries for a while)."""


class Msg(enum.IntEnum):
    CHALLENGE = 1  # server -> client: protocol, nonce, MAC algorithm
    AUTH = 2  # client -> server: worker, attempt, nonce, proof of the secret
    OK = 3  # reply to a successful request (meta and arrays depend on the request)
    ERROR = 4  # reply to a failed request: meta {"error": "..."}
    HELLO = 5  # client -> server: first request, returns center and start epoch
    PULL = 6  # client -> server: returns the current center
    COMMIT = 7  # client -> server: payload of the algorithm, returns its reply
    EPOCH_DONE = 8  # client -> server: epoch finished, with its logs
    BYE = 9  # client -> server: closing


_MSG_VALUES = frozenset(int(m) for m in Msg)


@dataclass
class Frame:
    """One decoded frame. ``nbytes`` is its size on the wire (header included)."""

    msg: Msg
    meta: dict[str, Any]
    arrays: list[np.ndarray] = field(default_factory=list)
    nbytes: int = 0


# -- encoding ----------------------------------------------------------------


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray) and obj.size <= 64:
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serializable")


def _prepare_array(a: Any, index: int) -> np.ndarray:
    arr = a if type(a) is np.ndarray else np.asarray(a)
    known = _WIRE_DTYPES.get(arr.dtype)
    if known is not None and arr.flags.c_contiguous and arr.ndim <= MAX_NDIM:
        return arr if arr.dtype is known[1] or arr.dtype == known[1] else np.ascontiguousarray(arr, known[1])
    name = arr.dtype.name
    if name not in ALLOWED_DTYPES or arr.dtype.fields is not None:
        raise ProtocolError(
            f"cannot send array #{index}: dtype {arr.dtype.str!r} is not allowed. "
            f"Expected one of {sorted(ALLOWED_DTYPES)}; cast the array (e.g. .astype('float32'))."
        )
    if arr.ndim > MAX_NDIM:
        raise ProtocolError(
            f"cannot send array #{index}: it has {arr.ndim} dimensions, at most {MAX_NDIM} are "
            f"allowed. Reshape it before sending."
        )
    wire_dtype = ALLOWED_DTYPES[name]
    # No copy when the array already is C-contiguous little-endian (0-d arrays stay 0-d).
    return np.asarray(arr, dtype=wire_dtype, order="C")


def encode(msg: Msg | int, meta: dict[str, Any] | None = None, arrays: Sequence[Any] = ()) -> list:
    """Encode one frame as a list of buffers (no copy of the array data).

    The first buffer holds header and meta; the others are byte views of the
    arrays. ``sum(len(b) for b in buffers)`` is the frame size on the wire.
    """
    if int(msg) not in _MSG_VALUES:
        raise ProtocolError(f"cannot send message type {int(msg)}: expected one of {[m.name for m in Msg]}")
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise ProtocolError(f"frame meta must be a dict, received {type(meta).__name__}")
    if "arrays" in meta:
        raise ProtocolError("frame meta key 'arrays' is reserved for the array descriptors; rename it")
    prepared = [_prepare_array(a, i) for i, a in enumerate(arrays)]
    full_meta = dict(meta)
    full_meta["arrays"] = [[_WIRE_DTYPES[a.dtype][0], list(a.shape)] for a in prepared]
    try:
        meta_bytes = json.dumps(full_meta, default=_json_default, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"frame meta is not JSON serializable: {exc}. Send plain numbers/strings.") from exc
    if len(meta_bytes) > MAX_META:
        raise ProtocolError(
            f"frame meta is {len(meta_bytes)} bytes, at most {MAX_META} are allowed; "
            f"send large data as arrays instead of metadata."
        )
    body_len = sum(a.nbytes for a in prepared)
    buffers: list = [HEADER.pack(MAGIC, int(msg), len(meta_bytes), body_len) + meta_bytes]
    for a in prepared:
        if a.nbytes:
            buffers.append(memoryview(a.reshape(-1).view(np.uint8)))
    return buffers


# -- decoding ----------------------------------------------------------------


def decode_header(
    data: bytes | bytearray | memoryview, max_body: int | None = None, *, max_meta: int = MAX_META
) -> tuple[Msg, int, int]:
    """Parse and check a frame header; returns ``(msg, meta_len, body_len)``.

    ``max_body=None`` means no limit beyond what the header can express;
    ``max_meta`` can only lower ``MAX_META``.
    """
    if len(data) != HEADER_SIZE:
        raise ProtocolError(f"frame header must be {HEADER_SIZE} bytes, received {len(data)}")
    magic, msg, meta_len, body_len = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(
            f"bad magic {bytes(magic)!r}, expected {MAGIC!r}: the peer does not speak this protocol "
            "(wrong port, or an incompatible version of trainer)."
        )
    if msg not in _MSG_VALUES:
        raise ProtocolError(f"unknown message type {msg}; expected one of {sorted(_MSG_VALUES)}")
    if meta_len > min(max_meta, MAX_META):
        raise ProtocolError(f"frame meta of {meta_len} bytes exceeds the limit of {min(max_meta, MAX_META)} bytes")
    if max_body is not None and body_len > max_body:
        raise ProtocolError(
            f"frame body of {body_len} bytes exceeds the limit of {max_body} bytes; "
            f"raise max_body on the receiving side if the model really is that large."
        )
    return Msg(msg), meta_len, body_len


def _check_shape(shape: Any, index: int) -> tuple[int, ...]:
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise ProtocolError(
            f"array #{index}: shape must be a list of at most {MAX_NDIM} non-negative ints, received {shape!r:.80}"
        )
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= _MAX_DIM:
            raise ProtocolError(f"array #{index}: shape must hold non-negative ints, received {shape!r:.80}")
    return tuple(shape)


def decode_payload(
    meta_bytes: bytes | bytearray | memoryview,
    body: bytes | bytearray | memoryview,
    max_body: int | None = None,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Decode meta and body; returns ``(meta, arrays)`` (``"arrays"`` removed from meta).

    The arrays are zero-copy views into ``body`` (see the module docstring).
    """
    body = memoryview(body).cast("B")
    if len(meta_bytes) > MAX_META:
        raise ProtocolError(f"frame meta of {len(meta_bytes)} bytes exceeds the limit of {MAX_META} bytes")
    if max_body is not None and len(body) > max_body:
        raise ProtocolError(f"frame body of {len(body)} bytes exceeds the limit of {max_body} bytes")
    try:
        meta = json.loads(bytes(meta_bytes).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame meta is not valid UTF-8 JSON: {exc}"[:300]) from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"frame meta must be a JSON object, received {type(meta).__name__}")
    descriptors = meta.pop("arrays", [])
    if not isinstance(descriptors, list):
        raise ProtocolError(f"meta 'arrays' must be a list of [dtype, shape], received {type(descriptors).__name__}")
    specs: list[tuple[np.dtype, tuple[int, ...], int]] = []
    total = 0
    for i, desc in enumerate(descriptors):
        if not isinstance(desc, list) or len(desc) != 2:
            raise ProtocolError(f"array #{i}: descriptor must be [dtype, shape], received {desc!r:.80}")
        name, shape = desc
        if not isinstance(name, str) or name not in ALLOWED_DTYPES:
            raise ProtocolError(
                f"array #{i}: dtype {name!r:.40} is not allowed; expected one of {sorted(ALLOWED_DTYPES)}"
            )
        dims = _check_shape(shape, i)
        dtype = ALLOWED_DTYPES[name]
        nbytes = math.prod(dims) * dtype.itemsize
        total += nbytes
        if total > len(body):
            break
        specs.append((dtype, dims, nbytes))
    if total != len(body):
        raise ProtocolError(
            f"array descriptors need {total} body bytes but the frame body has {len(body)}; "
            f"the frame is corrupt or was built by an incompatible encoder."
        )
    arrays = []
    offset = 0
    for dtype, dims, nbytes in specs:
        chunk = body[offset : offset + nbytes]
        try:
            arrays.append(np.frombuffer(chunk, dtype=dtype).reshape(dims))
        except (ValueError, OverflowError) as exc:
            raise ProtocolError(f"array #{len(arrays)}: shape {list(dims)} cannot be built: {exc}") from None
        offset += nbytes
    return meta, arrays


def decode_frame(data: bytes | bytearray | memoryview, max_body: int | None = None) -> Frame:
    """Decode one complete frame held in memory (no trailing bytes allowed)."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER_SIZE:
        raise ProtocolError(f"frame is {len(view)} bytes, shorter than its {HEADER_SIZE}-byte header")
    msg, meta_len, body_len = decode_header(view[:HEADER_SIZE], max_body)
    if len(view) != HEADER_SIZE + meta_len + body_len:
        raise ProtocolError(
            f"frame length mismatch: header announces {HEADER_SIZE + meta_len + body_len} bytes, "
            f"received {len(view)}"
        )
    meta, arrays = decode_payload(view[HEADER_SIZE : HEADER_SIZE + meta_len], view[HEADER_SIZE + meta_len :], max_body)
    return Frame(msg, meta, arrays, len(view))


# -- sockets -----------------------------------------------------------------


class RecvBuffer:
    """A receive buffer reused from frame to frame; it grows to the largest frame it received.

    Whatever was decoded from one frame is a view into it and is overwritten
    by the next frame received into it: keep nothing past that, or copy it.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def view(self, n: int) -> memoryview:
        """A writable view of `n` bytes (a larger buffer replaces a smaller one; views of the old one stay valid)."""
        if len(self._buf) < n:
            self._buf = bytearray(n)
        return memoryview(self._buf)[:n]

    @property
    def capacity(self) -> int:
        return len(self._buf)


class RecvPool(RecvBuffer):
    """Receive buffers for a reader whose callers may keep what it decoded (a client's replies).

    A buffer is reused only once nothing decoded from it is alive: every
    array of a frame is a view that holds a reference to its buffer, so a
    buffer referenced by this pool alone is free (CPython reference counts).
    Otherwise another of the `slots` buffers is taken, or a fresh one made.
    Callers never see a buffer reused under them; a worker that keeps its
    last reply (its anchor) alternates between two buffers and allocates
    nothing in the steady state.
    """

    def __init__(self, slots: int = 2) -> None:
        super().__init__()
        self._slots: list[bytearray] = []
        self._size = max(1, int(slots))

    def view(self, n: int) -> memoryview:
        for buf in self._slots:
            # The references: the list, this loop's variable and getrefcount's argument; a live view adds one.
            if len(buf) >= n and sys.getrefcount(buf) <= 3:
                return memoryview(buf)[:n]
        buf = bytearray(n)
        self._slots.append(buf)
        if len(self._slots) > self._size:  # the oldest goes; views of it keep it alive as long as needed
            self._slots.pop(0)
        return memoryview(buf)[:n]

    @property
    def capacity(self) -> int:
        return sum(len(b) for b in self._slots)


def _aligned_at(raw: memoryview, n: int, at: int) -> memoryview:
    """`n` bytes of `raw` (which has ``BODY_ALIGN - 1`` to spare) whose byte `at` sits on a ``BODY_ALIGN``
    boundary."""
    address = np.frombuffer(raw, np.uint8).ctypes.data
    skip = (-(address + at)) % BODY_ALIGN
    return raw[skip:skip + n]


def set_io_timeout(sock: socket.socket, seconds: float) -> None:
    """Bound each later send and receive on `sock` by `seconds`.

    On Linux a plain TCP socket becomes *blocking* with the kernel's
    ``SO_RCVTIMEO``/``SO_SNDTIMEO``: a frame then moves in a few system calls
    (``recv_exact`` asks for all of it, or for pieces of `RECV_PIECE` while it
    is hashed, with ``MSG_WAITALL``; a send blocks until every byte is queued),
    where a socket with Python's own timeout polls before every call and
    returns whatever arrived (about 25 calls of each kind per 4 MB on a
    loopback). The deadline is the same: a call that waits longer fails with
    ``TransportTimeout``. TLS sockets and other platforms keep Python's timeout.
    """
    if seconds >= 0.001 and _KERNEL_TIMEOUTS and type(sock) is socket.socket:
        sock.settimeout(None)
        whole = int(seconds)
        value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    else:
        sock.settimeout(seconds)


def recv_exact(sock: socket.socket, n: int, *, deadline: float | None = None, into: RecvBuffer | None = None,
               on_data: Callable[[int, memoryview], object] | None = None,
               align_at: int | None = None) -> bytearray | memoryview:  # fmt: skip
    """Receive exactly ``n`` bytes, into a fresh ``bytearray`` or into `into` (a view of it, see `RecvPool`).

    ``on_data(offset, chunk)`` sees every chunk as it arrives (a MAC is
    computed while the rest is still on its way; on a blocking socket the
    chunks are pieces of `RECV_PIECE` bytes). ``align_at``: place the
    bytes so that byte ``align_at`` (a frame's body) starts on a
    ``BODY_ALIGN`` boundary (a memoryview is returned). Raises
    ``ConnectionClosed`` on EOF (``mid_frame`` is False when EOF came before
    the first byte), ``TransportTimeout`` when the socket timeout (or the
    absolute ``time.monotonic()`` ``deadline``, or the kernel timeout of
    `set_io_timeout`) expires.
    """
    if align_at is None:
        buf: bytearray | memoryview = bytearray(n) if into is None else into.view(n)
    else:
        room = n + BODY_ALIGN - 1
        buf = _aligned_at(memoryview(bytearray(room)) if into is None else into.view(room), n, align_at)
    view = memoryview(buf)
    got = 0
    # A blocking socket (set_io_timeout) waits in the kernel for all it is asked; TLS takes no flags.
    flags = _WAITALL if deadline is None and type(sock) is socket.socket and sock.gettimeout() is None else 0
    piece = RECV_PIECE if on_data is not None else n
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransportTimeout(f"timed out after receiving {got} of {n} bytes")
            sock.settimeout(remaining)
        want = min(n - got, piece)
        try:
            k = sock.recv_into(view[got:got + want], want, flags) if flags else sock.recv_into(view[got:], want)
        except (TimeoutError, BlockingIOError):  # BlockingIOError: the kernel's SO_RCVTIMEO
            raise TransportTimeout(f"timed out after receiving {got} of {n} bytes") from None
        except OSError as exc:
            raise ConnectionClosed(f"connection lost after {got} of {n} bytes: {exc}") from None
        if k == 0:
            raise ConnectionClosed(f"peer closed the connection after {got} of {n} bytes", mid_frame=got > 0)
        if on_data is not None:
            on_data(got, view[got:got + k])
        got += k
    return buf


def read_frame(
    sock: socket.socket, max_body: int | None, *, max_meta: int = MAX_META, deadline: float | None = None,
    into: RecvBuffer | None = None,
) -> Frame:
    """Read and decode one frame; limits are checked before the body is allocated.

    ``deadline`` (``time.monotonic()`` based) bounds the whole frame, not just
    each ``recv``, so a peer trickling bytes cannot hold the reader forever.
    ``into``: receive into that reused buffer (see `RecvBuffer`).
    """
    try:
        header = recv_exact(sock, HEADER_SIZE, deadline=deadline)
    except ConnectionClosed as exc:
        if not exc.mid_frame:
            raise ConnectionClosed("peer closed the connection", mid_frame=False) from None
        raise
    msg, meta_len, body_len = decode_header(header, max_body, max_meta=max_meta)
    rest = (recv_exact(sock, meta_len + body_len, deadline=deadline, into=into, align_at=meta_len)
            if meta_len + body_len else bytearray())
    view = memoryview(rest)
    meta, arrays = decode_payload(view[:meta_len], view[meta_len:], max_body)
    return Frame(msg, meta, arrays, HEADER_SIZE + meta_len + body_len)


def send_buffers(sock: socket.socket, buffers: Sequence) -> int:
    """Send all buffers (scatter/gather, no copy); returns the number of bytes sent."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if len(v)]
    total = sum(len(v) for v in views)
    try:
        if isinstance(sock, ssl.SSLSocket) or not hasattr(sock, "sendmsg"):  # TLS has no sendmsg
            for v in _coalesce(views):
                sock.sendall(v)
            return total
        while views:
            sent = sock.sendmsg(views[:_MAX_IOV])
            while sent and views:
                if sent >= len(views[0]):
                    sent -= len(views.pop(0))
                else:
                    views[0] = views[0][sent:]
                    sent = 0
    except (TimeoutError, BlockingIOError):  # BlockingIOError: the kernel's SO_SNDTIMEO (set_io_timeout)
        raise TransportTimeout("timed out while sending a frame") from None
    except OSError as exc:
        raise ConnectionClosed(f"connection lost while sending a frame: {exc}") from None
    return total


def _coalesce(views: list[memoryview], small: int = 1 << 16) -> list:
    """Join runs of small buffers, so that a TLS socket sends one record for them, not one each."""
    out: list = []
    run: list[memoryview] = []
    for v in views:
        if len(v) < small:
            run.append(v)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(v)
    if run:
        out.append(b"".join(run))
    return out


def write_frame(
    sock: socket.socket, msg: Msg | int, meta: dict[str, Any] | None = None, arrays: Sequence[Any] = ()
) -> int:
    """Encode and send one frame; returns the number of bytes written."""
    return send_buffers(sock, encode(msg, meta, arrays))


def frame_size(buffers: Sequence) -> int:
    """Size on the wire of an encoded frame."""
    return sum(memoryview(b).nbytes for b in buffers)


# -- authentication ------------------------------------------------------------


def new_secret() -> bytes:
    """A fresh random shared secret for one training run."""
    return secrets.token_bytes(32)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_SIZE)


def check_secret(secret: Any) -> bytes:
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise ValueError(
            f"the shared secret must be bytes of length >= 16, received "
            f"{type(secret).__name__} of length {len(secret) if hasattr(secret, '__len__') else '?'}; "
            f"use trainer.transport.wire.new_secret()."
        )
    return bytes(secret)
