"""Tests of the parameter-server wire format (trainer.transport.wire): codec, limits, fuzzing."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from trainer.transport import wire
from trainer.transport.wire import (
    HEADER,
    MAGIC,
    MAX_META,
    ConnectionClosed,
    Msg,
    ProtocolError,
    TransportTimeout,
    decode_frame,
    decode_header,
    decode_payload,
    encode,
    read_frame,
    recv_exact,
    write_frame,
)

ALLOWED = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def join(buffers) -> bytes:
    return b"".join(bytes(b) for b in buffers)


def raw_frame(meta_obj, body: bytes = b"", msg: int = int(Msg.COMMIT), magic: bytes = MAGIC) -> bytes:
    meta = meta_obj if isinstance(meta_obj, bytes) else json.dumps(meta_obj).encode()
    return HEADER.pack(magic, msg, len(meta), len(body)) + meta + body


def sample(dtype: str, shape) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    return (rng.random(shape) * 100).astype(dtype)


# -- round trips -------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("dtype", ALLOWED)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_round_trip_each_dtype_and_shape(dtype, shape):
    a = sample(dtype, shape)
    frame = decode_frame(join(encode(Msg.COMMIT, {"epoch": 1}, [a])), max_body=1 << 20)
    assert frame.msg is Msg.COMMIT
    assert frame.meta == {"epoch": 1}
    (b,) = frame.arrays
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(a, b)


@pytest.mark.timeout(10)
def test_round_trip_many_arrays_noncontiguous_and_big_endian():
    arrays = [
        np.arange(12, dtype="f4").reshape(3, 4).T,  # not C-contiguous
        np.arange(5, dtype=">i4"),  # big-endian input is sent little-endian
        np.zeros((0,), "f8"),
        np.float64(3.5),  # numpy scalar
        np.ones((1,) * 8, "u1"),  # ndim 8 is the maximum
    ]
    buffers = encode(Msg.OK, {"loss": np.float32(0.25), "nan": float("nan")}, arrays)
    frame = decode_frame(join(buffers))
    assert frame.nbytes == wire.frame_size(buffers)
    assert frame.meta["loss"] == 0.25 and np.isnan(frame.meta["nan"])
    assert len(frame.arrays) == len(arrays)
    for a, b in zip(arrays, frame.arrays):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert frame.arrays[1].dtype == np.dtype("<i4")


@pytest.mark.timeout(10)
def test_decoded_arrays_are_zero_copy_views():
    data = bytearray(join(encode(Msg.OK, {}, [np.arange(4, dtype="f4")])))
    frame = decode_frame(data)
    assert frame.arrays[0].base is not None
    assert frame.arrays[0].flags.writeable  # bytearray-backed
    assert not decode_frame(bytes(data)).arrays[0].flags.writeable  # bytes-backed


@pytest.mark.timeout(10)
def test_socket_round_trip_counts_bytes():
    a, b = socket.socketpair()
    with a, b:
        arrays = [np.arange(100_000, dtype="f8"), np.ones((3, 3), bool)]
        sent = []
        writer = threading.Thread(target=lambda: sent.append(write_frame(a, Msg.PULL, {"x": [1, 2]}, arrays)))
        writer.start()
        frame = read_frame(b, max_body=1 << 22)
        writer.join()
        assert [frame.nbytes] == sent
        assert frame.msg is Msg.PULL and frame.meta == {"x": [1, 2]}
        np.testing.assert_array_equal(frame.arrays[0], arrays[0])


@pytest.mark.timeout(10)
def test_socket_round_trip_many_arrays_partial_sends():
    # More arrays than one sendmsg() call takes, and more bytes than a socket buffer holds.
    rng = np.random.default_rng(1)
    arrays = [rng.random(int(n)).astype("f4") for n in rng.integers(0, 2000, size=1500)]
    a, b = socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sent = []
        writer = threading.Thread(target=lambda: sent.append(write_frame(a, Msg.OK, {}, arrays)))
        writer.start()
        frame = read_frame(b, max_body=1 << 24)
        writer.join()
        assert [frame.nbytes] == sent
        assert len(frame.arrays) == len(arrays)
        for x, y in zip(arrays, frame.arrays):
            np.testing.assert_array_equal(x, y)


# -- encoder refuses what the decoder would refuse ----------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "bad",
    [np.array([1, "a"], dtype=object), np.array(["abc"]), np.zeros(2, dtype=[("a", "f4")]), np.zeros(2, "c8"),
     np.zeros((1,) * 9, "f4")],
)
def test_encode_rejects_disallowed_arrays(bad):
    with pytest.raises(ProtocolError, match="allowed"):
        encode(Msg.COMMIT, {}, [bad])


@pytest.mark.timeout(10)
def test_encode_rejects_bad_meta():
    with pytest.raises(ProtocolError, match="reserved"):
        encode(Msg.OK, {"arrays": 1})
    with pytest.raises(ProtocolError, match="JSON"):
        encode(Msg.OK, {"x": object()})
    with pytest.raises(ProtocolError, match="meta"):
        encode(Msg.OK, {"x": "a" * (MAX_META + 1)})
    with pytest.raises(ProtocolError, match="message type"):
        encode(200, {})


# -- decoder rejections -------------------------------------------------------------


@pytest.mark.timeout(10)
def test_rejects_bad_magic():
    with pytest.raises(ProtocolError, match="magic"):
        decode_frame(raw_frame({}, magic=b"HTTP"))


@pytest.mark.timeout(10)
def test_rejects_unknown_message_type():
    with pytest.raises(ProtocolError, match="unknown message type"):
        decode_frame(raw_frame({}, msg=0))
    with pytest.raises(ProtocolError, match="unknown message type"):
        decode_header(HEADER.pack(MAGIC, 255, 0, 0))


@pytest.mark.timeout(10)
def test_rejects_oversize_meta_and_body_from_header_alone():
    with pytest.raises(ProtocolError, match="meta"):
        decode_header(HEADER.pack(MAGIC, int(Msg.OK), MAX_META + 1, 0))
    with pytest.raises(ProtocolError, match="meta"):
        decode_header(HEADER.pack(MAGIC, int(Msg.OK), 5000, 0), max_meta=4096)
    with pytest.raises(ProtocolError, match="body"):
        decode_header(HEADER.pack(MAGIC, int(Msg.OK), 2, 2**63), max_body=1 << 20)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "header",
    [HEADER.pack(MAGIC, int(Msg.COMMIT), 2, 2**62), HEADER.pack(MAGIC, int(Msg.COMMIT), 2**32 - 1, 0)],
)
def test_read_frame_checks_limits_before_reading_or_allocating(header):
    # Only the header is sent: had read_frame tried to read (or allocate) the announced sizes, it would end
    # in a TransportTimeout after 5 s (or run out of memory), not in this ProtocolError naming the limit.
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(5)
        a.sendall(header)
        with pytest.raises(ProtocolError, match="limit|exceed|too large|at most"):
            read_frame(b, max_body=1 << 20)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("dtype", ["object", "<U3", "O", "complex64", "V8", "float128", ">f4", "str", 3, None])
def test_rejects_disallowed_dtype(dtype):
    with pytest.raises(ProtocolError, match="dtype"):
        decode_frame(raw_frame({"arrays": [[dtype, [1]]]}, b"\0" * 8))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "arrays, body",
    [
        ([["float32", [2]]], b"\0" * 7),  # too few bytes
        ([["float32", [2]]], b"\0" * 9),  # too many bytes
        ([], b"\0"),  # body without descriptors
        ([["int8", [2, 2]], ["int8", [1]]], b"\0" * 4),
        ([["float64", [2**40, 2**40]]], b"\0" * 8),  # huge shape
        ([["float64", [0, 2**62, 2**62]]], b""),  # empty but unbuildable
    ],
)
def test_rejects_shape_byte_mismatch(arrays, body):
    with pytest.raises(ProtocolError):
        decode_frame(raw_frame({"arrays": arrays}, body))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "arrays",
    [
        "float32",
        [["float32"]],
        [["float32", [1], 3]],
        [["float32", 4]],
        [["float32", [-1]]],
        [["float32", [1.0]]],
        [["float32", [True]]],
        [["float32", ["1"]]],
        [["float32", [1] * 9]],
        [["float32", [2**63]]],
        [7],
    ],
)
def test_rejects_malformed_descriptors(arrays):
    with pytest.raises(ProtocolError):
        decode_frame(raw_frame({"arrays": arrays}, b"\0" * 4))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("meta", [b"[]", b"3", b'"x"', b"null", b"{", b"\xff\xfe{}", b"", b"[" * 100_000])
def test_rejects_invalid_or_non_object_json(meta):
    with pytest.raises(ProtocolError, match="meta"):
        decode_frame(raw_frame(meta))


@pytest.mark.timeout(10)
def test_rejects_length_mismatch_and_short_frames():
    frame = join(encode(Msg.OK, {}, [np.zeros(3, "f4")]))
    with pytest.raises(ProtocolError):
        decode_frame(frame[:-1])
    with pytest.raises(ProtocolError):
        decode_frame(frame + b"\0")
    with pytest.raises(ProtocolError):
        decode_frame(frame[:5])
    with pytest.raises(ProtocolError):
        decode_payload(b"{}", b"\0" * 10, max_body=4)


# -- sockets -------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_recv_exact_eof_and_timeout():
    a, b = socket.socketpair()
    with b:
        a.sendall(b"abc")
        a.close()
        with pytest.raises(ConnectionClosed) as info:
            recv_exact(b, 5)
        assert info.value.mid_frame
        with pytest.raises(ConnectionClosed) as info:
            recv_exact(b, 5)
        assert not info.value.mid_frame
    a, b = socket.socketpair()
    with a, b:
        b.settimeout(0.2)
        with pytest.raises(TransportTimeout):
            recv_exact(b, 1)
        with pytest.raises(TransportTimeout):
            recv_exact(b, 1, deadline=time.monotonic() + 0.1)
        a.sendall(b"xy")
        assert recv_exact(b, 2) == bytearray(b"xy")


@pytest.mark.timeout(10)
def test_read_frame_truncated_body_raises_connection_closed():
    frame = join(encode(Msg.OK, {"a": 1}, [np.zeros(10, "f4")]))
    a, b = socket.socketpair()
    with b:
        a.sendall(frame[:-3])
        a.close()
        with pytest.raises(ConnectionClosed):
            read_frame(b, max_body=1 << 10)


@pytest.mark.timeout(10)
def test_new_secret_and_nonce_sizes_and_short_secrets_refused():
    secret, nonce = wire.new_secret(), wire.new_nonce()
    assert len(secret) == 32 and len(nonce) == wire.NONCE_SIZE
    with pytest.raises(ValueError, match="secret"):
        wire.check_secret(b"short")


# -- fuzzing ---------------------------------------------------------------------------

VALID_FRAMES = [
    join(encode(Msg.COMMIT, {"worker": 1, "epoch": 2, "loss": 0.5}, [np.arange(6, dtype="f4").reshape(2, 3)])),
    join(encode(Msg.OK, {}, [np.ones(3, bool), np.zeros((), "i8"), np.zeros((0, 2), "f2")])),
    join(encode(Msg.HELLO, {"worker": 0, "attempt": 0})),
    join(encode(Msg.AUTH, {"worker": 0, "attempt": 0, "nonce": "00" * 32, "proof": "00" * 32})),
    raw_frame({"arrays": [["uint8", [4]]]}, b"abcd"),
]


class _BytesSocket:
    """Just enough of a socket for read_frame."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def settimeout(self, _t) -> None:
        pass

    def recv_into(self, view, n) -> int:
        k = min(n, len(self._data))
        view[:k] = self._data[:k]
        self._data = self._data[k:]
        return k


def derived_frames(seed: bytes) -> list[bytes]:
    """Four frames derived deterministically from one hypothesis draw.

    One cheap ``st.binary`` draw per example keeps 10,000 examples fast; the
    frames are: the raw bytes, a random header (valid magic half the time)
    plus the bytes, a valid frame with mutated/cut/extended bytes, and a
    frame with valid JSON but random array descriptors.
    """
    b = seed + bytes(40)  # so fixed offsets below always exist
    frames = [seed]

    magic = MAGIC if b[0] & 1 else b[1:5]
    meta_len = int.from_bytes(b[5:9], "big") >> (b[9] % 32)
    body_len = int.from_bytes(b[10:18], "big") >> (b[18] % 64)
    frames.append(HEADER.pack(magic, b[19] % 12, meta_len, body_len) + seed[20:])

    data = bytearray(VALID_FRAMES[b[0] % len(VALID_FRAMES)])
    for k in range(1, 1 + b[1] % 6):
        pos, val = b[2 * k], b[2 * k + 1]
        data[pos % len(data)] = val
    if b[20] & 1:
        data = data[: b[21] % (len(data) + 1)]
    if b[20] & 2:
        data += seed[22:30]
    frames.append(bytes(data))

    names = ALLOWED + ["object", "<U3", "V8", ""]
    descriptors = []
    for k in range(b[22] % 4):
        raw = b[23 + 4 * k : 27 + 4 * k]
        dims = [int(x) - 2 if x < 200 else float(x) for x in raw[1 : 1 + raw[0] % 4]]
        descriptors.append([names[raw[0] % len(names)], dims])
    body = seed[b[23] % (len(seed) + 1) :]
    frames.append(raw_frame({"arrays": descriptors}, body, msg=1 + b[24] % 9))
    return frames


@pytest.mark.timeout(90)  # ~10 s of CPU; generous for a loaded 2-core machine
@settings(
    max_examples=10_000,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)
@given(st.binary(max_size=160))
def test_fuzz_decoder_only_raises_protocol_error(seed):
    for data in derived_frames(seed):
        try:
            decode_frame(data, max_body=1 << 16)
        except ProtocolError:
            pass
        try:
            read_frame(_BytesSocket(data), max_body=1 << 16)
        except (ProtocolError, ConnectionClosed):
            pass


def test_header_layout_is_stable():
    assert HEADER.format == "!4sBIQ" and HEADER.size == 17
    assert struct.unpack("!4sBIQ", join(encode(Msg.BYE, {}))[:17])[:2] == (MAGIC, int(Msg.BYE))


def test_recv_buffer_is_reused_and_recv_pool_only_once_nothing_of_a_frame_is_alive():
    from trainer.transport.wire import RecvBuffer, RecvPool

    frame = join(encode(Msg.OK, {"v": 1}, [np.arange(1000, dtype="f4")]))
    buf = RecvBuffer()
    first = read_frame(_BytesSocket(bytearray(frame)), max_body=1 << 20, into=buf)
    again = read_frame(_BytesSocket(bytearray(frame)), max_body=1 << 20, into=buf)
    assert np.shares_memory(first.arrays[0], again.arrays[0])  # one buffer: the old frame is overwritten
    pool = RecvPool(slots=2)
    kept = read_frame(_BytesSocket(bytearray(frame)), max_body=1 << 20, into=pool).arrays[0]
    other = read_frame(_BytesSocket(bytearray(frame)), max_body=1 << 20, into=pool).arrays[0]
    assert not np.shares_memory(kept, other)  # `kept` is alive: its buffer is not taken
    np.testing.assert_array_equal(kept, np.arange(1000, dtype="f4"))
    address = other.__array_interface__["data"][0]
    del other
    reused = read_frame(_BytesSocket(bytearray(frame)), max_body=1 << 20, into=pool).arrays[0]
    assert reused.__array_interface__["data"][0] == address  # dropped: its buffer comes back
    np.testing.assert_array_equal(kept, np.arange(1000, dtype="f4"))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("into", [None, "buffer", "pool"])
def test_received_bodies_start_aligned_whatever_the_meta_length(into):
    from trainer.transport.frame_auth import Channel
    from trainer.transport.wire import BODY_ALIGN, RecvBuffer, RecvPool

    arrays = [np.arange(1000, dtype="f4"), np.arange(7, dtype="f8")]
    reader = {None: lambda: None, "buffer": RecvBuffer, "pool": RecvPool}[into]()
    key = b"k" * 32
    a, b = socket.socketpair()
    with a, b:
        sender = Channel(a, mac="poly1305", send_key=key, recv_key=key, peer="a")
        receiver = Channel(b, mac="poly1305", send_key=key, recv_key=key, peer="b")
        for pad in range(9):  # meta lengths of every residue modulo 8
            buffers = encode(Msg.OK, {"pad": "x" * pad}, arrays)
            plain = read_frame(_BytesSocket(bytearray(join(buffers))), max_body=1 << 20, into=reader)
            sender.send(buffers)
            sealed = receiver.recv(1 << 20, into=reader)
            for frame in (plain, sealed):
                assert frame.meta == {"pad": "x" * pad}
                assert frame.arrays[0].ctypes.data % BODY_ALIGN == 0, (pad, frame.arrays[0].ctypes.data)
                assert all(x.flags.aligned for x in frame.arrays)
                for got, sent in zip(frame.arrays, arrays):
                    np.testing.assert_array_equal(got, sent)
