"""Codecs for committed deltas (trainer.algorithms.compression) and the Compressed algorithm, over a loopback server."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainer.algorithms import (
    ADAG, DOWNPOUR, EASGD, AlgorithmConfigError, BFloat16, Compressed, DynSGD, Float16, SyncAveraging, TopK,
    parse_compression, with_compression,
)
from trainer.algorithms.compression import compress_with_feedback, from_bfloat16_bits, to_bfloat16_bits
from trainer.ps import ParameterServer, PSClient, RemoteError
from trainer.transport.wire import ALLOWED_DTYPES, Msg, decode_frame, encode, new_secret

SECRET = new_secret()


def delta(seed: int = 0, shapes=((64, 32), (32,), (3, 3, 2, 4))) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 1e-2).astype(np.float32) for s in shapes]


def through_the_wire(arrays):
    """Encode and decode a frame as the transport does: the codec's output must be carried as is."""
    body = b"".join(bytes(b) for b in encode(Msg.COMMIT, {}, arrays))
    return decode_frame(body).arrays


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Float16(), BFloat16(), TopK(0.1)])
def test_wire_arrays_have_dtypes_the_transport_carries(codec):
    wire = codec.encode(delta())
    assert {a.dtype.name for a in wire} <= set(ALLOWED_DTYPES)
    received = through_the_wire(wire)
    assert codec.check(received, [a.shape for a in delta()]) is None
    for got, sent in zip(codec.decode(received, delta()), codec.decode(wire, delta())):
        np.testing.assert_array_equal(got, sent)


def test_fp16_round_trip_within_half_precision_and_clipped():
    d = delta()
    out = Float16().decode(Float16().encode(d), d)
    for a, b in zip(d, out):
        assert b.dtype == np.float32 and b.shape == a.shape
        np.testing.assert_allclose(b, a, rtol=2**-11, atol=6e-8)
    big = [np.array([1e6, -1e6, 3.0], np.float32)]
    np.testing.assert_array_equal(Float16().decode(Float16().encode(big), big)[0], [65504.0, -65504.0, 3.0])


def test_bf16_bits_match_ml_dtypes_round_to_nearest_even():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(10_000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10_000),
                        np.array([0.0, -0.0, np.inf, -np.inf, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.4e38], np.float32)])
    x = x.astype(np.float32)
    expected = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(to_bfloat16_bits(x), expected)
    np.testing.assert_array_equal(from_bfloat16_bits(expected), expected.view(ml_dtypes.bfloat16).astype(np.float32))


def test_bf16_bits_of_arrays_larger_than_a_rounding_chunk_match_ml_dtypes():
    from trainer.algorithms import compression

    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    size = 2 * compression._BF16_CHUNK + 1_234  # two whole chunks and a part
    x = (rng.standard_normal(size) * 10.0 ** rng.integers(-20, 20, size)).astype(np.float32)
    nans = [0, compression._BF16_CHUNK + 7, size - 1]
    x[nans] = np.frombuffer(np.uint32(0x7FFFFFFF).tobytes(), np.float32)[0]  # rounds past the exponent
    expected = x.astype(ml_dtypes.bfloat16).view(np.uint16).reshape(-1, 2)[:, ::-1]
    got = to_bfloat16_bits(x.reshape(-1, 2)[:, ::-1])  # 2-D and not contiguous
    assert got.shape == expected.shape and got.dtype == np.uint16
    np.testing.assert_array_equal(np.isnan(from_bfloat16_bits(got)), np.isnan(x.reshape(-1, 2)[:, ::-1]))
    finite = ~np.isnan(x.reshape(-1, 2)[:, ::-1])
    np.testing.assert_array_equal(got[finite], expected[finite])


def test_bf16_keeps_nan_inf_and_relative_error_under_2_to_minus_8():
    x = np.array([np.nan, np.inf, -np.inf, 1e-30, 123.456], np.float32)
    x[0] = np.frombuffer(np.uint32(0x7F800001).tobytes(), np.float32)[0]  # a signalling NaN must not become inf
    out = BFloat16().decode(BFloat16().encode([x]), [x])[0]
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf
    np.testing.assert_allclose(out[3:], x[3:], rtol=2**-8)
    assert BFloat16().encode([x])[0].dtype == np.int16  # carried as int16: the allow-list has no uint16


def test_topk_keeps_exactly_the_largest_entries_of_each_tensor():
    d = delta(2)
    codec = TopK(0.05)
    wire = codec.encode(d)
    assert len(wire) == 2 * len(d)
    out = codec.decode(wire, d)
    for a, b in zip(d, out):
        k = max(1, math.ceil(0.05 * a.size))
        kept = np.flatnonzero(b.ravel())
        assert len(kept) == k
        threshold = np.sort(np.abs(a.ravel()))[-k]
        assert np.all(np.abs(a.ravel()[kept]) >= threshold)
        np.testing.assert_array_equal(b.ravel()[kept], a.ravel()[kept])
    tiny = [np.array([0.5], np.float32)]
    np.testing.assert_array_equal(codec.decode(codec.encode(tiny), tiny)[0], tiny[0])


def test_topk_of_mostly_zeros_sends_the_non_zeros_and_still_k_entries():
    codec = TopK(0.01)
    few = np.zeros(10_000, np.float32)
    few[[3, 500, 9_999]] = [0.5, -2.0, 1e-30]  # fewer non-zeros than k = 100
    many = np.zeros(10_000, np.float32)
    many[::50] = np.arange(1, 201, dtype=np.float32)  # 200 non-zeros: the largest 100 are 101..200
    for a, expected in ((few, {3, 500, 9_999}), (many, set(range(100 * 50, 10_000, 50)))):
        idx, values = codec.encode([a])
        assert len(idx) == 100 and len(set(idx.tolist())) == 100
        assert set(np.flatnonzero(values).tolist()) == {i for i, v in enumerate(idx) if v in expected}
        np.testing.assert_array_equal(codec.decode([idx, values], [a])[0], np.where(np.isin(
            np.arange(a.size), sorted(expected)), a, 0))


def test_topk_check_names_what_is_wrong():
    shapes = [(4,), (2, 2)]
    codec = TopK(0.5)
    good = codec.encode([np.arange(4, dtype=np.float32), np.ones((2, 2), np.float32)])
    assert codec.check(good, shapes) is None
    assert "expected 4" in codec.check(good[:3], shapes)
    bad = list(good)
    bad[0] = np.array([0, 9], np.int32)
    assert "expected [0, 3]" in codec.check(bad, shapes)
    bad[0] = np.array([0, 1], np.int64)
    assert "int32 and float32" in codec.check(bad, shapes)
    assert "expected one of ['float16']" in Float16().check(good[:2], shapes)


@pytest.mark.parametrize(("text", "expected"), [
    (None, None), ("none", None), ("FP16", Float16()), ("bf16", BFloat16()), ("topk:0.01", TopK(0.01)),
])
def test_parse_compression(text, expected):
    assert parse_compression(text) == expected


@pytest.mark.parametrize("text", ["gzip", "topk:", "topk:0", "topk:1.5", "topk:x"])
def test_parse_compression_errors_say_what_is_expected(text):
    with pytest.raises(AlgorithmConfigError, match="none, fp16, bf16 or topk:F|fraction in \\(0, 1\\]"):
        parse_compression(text)


# -- error feedback ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Float16(), BFloat16(), TopK(0.02)])
def test_error_feedback_loses_nothing_only_delays_it(codec):
    """Sum of what was sent + the last residual == sum of the deltas (telescoping), for any codec."""
    residual, sent_total, true_total = None, None, None
    for step in range(30):
        d = delta(step)
        wire, residual = compress_with_feedback(codec, d, residual)
        sent = codec.decode(wire, d)
        sent_total = sent if sent_total is None else [s + t for s, t in zip(sent, sent_total)]
        true_total = d if true_total is None else [s + t for s, t in zip(d, true_total)]
    for s, r, t in zip(sent_total, residual, true_total):
        np.testing.assert_allclose(s + r, t, atol=1e-6)


def test_topk_with_feedback_moves_every_coordinate_without_it_small_ones_never_move():
    g = [np.linspace(1.0, 0.1, 100, dtype=np.float32)]  # a constant gradient with small coordinates
    codec = TopK(0.05)
    residual, with_ef, without = None, np.zeros(100, np.float32), np.zeros(100, np.float32)
    for _ in range(400):
        wire, residual = compress_with_feedback(codec, g, residual)
        with_ef += codec.decode(wire, g)[0]
        without += codec.decode(codec.encode(g), g)[0]
    assert np.all(with_ef > 0)  # every coordinate got through
    np.testing.assert_allclose(with_ef + residual[0], 400 * g[0], rtol=1e-4)
    assert np.count_nonzero(without) == 5  # the same five, every time


# -- the Compressed algorithm ------------------------------------------------------------------------


def test_compressed_algorithm_decodes_on_the_server_and_keeps_the_inner_algorithm():
    w0 = [np.zeros(4, np.float32)]
    w = [np.array([1.0, 2.0, 3.0, 4.0], np.float32)]
    center = [np.full(4, 10.0, np.float32)]
    for inner, expected in ((DOWNPOUR(), [11, 12, 13, 14]), (ADAG(window=2), [10.5, 11, 11.5, 12]),
                            (DynSGD(), [10.5, 11, 11.5, 12])):
        algorithm = with_compression(inner, "bf16")
        assert algorithm.window == inner.window and algorithm.name == inner.name and not algorithm.synchronous
        payload, residual = algorithm.worker_commit(w, w0, None)
        assert payload[0].dtype == np.int16 and all(np.all(r == 0) for r in residual)
        new_center, reply = algorithm.server_commit(center, payload, staleness=1)
        np.testing.assert_array_equal(new_center[0], np.array(expected, np.float32))
        assert reply[0].dtype == np.float32
    assert "bf16" in with_compression(DOWNPOUR(), "bf16").describe()
    assert with_compression(DOWNPOUR(), "none") == DOWNPOUR()


@pytest.mark.parametrize("algorithm", [EASGD(), SyncAveraging()])
def test_compression_refuses_algorithms_that_send_full_weights(algorithm):
    with pytest.raises(AlgorithmConfigError, match="commit deltas"):
        with_compression(algorithm, "fp16")
    with pytest.raises(AlgorithmConfigError, match="compressed already"):
        with_compression(with_compression(DOWNPOUR(), "fp16"), "bf16")


@pytest.mark.timeout(30)
def test_topk_commits_through_a_real_parameter_server_and_bad_payloads_get_a_clear_error():
    center = [np.zeros((8, 8), np.float32), np.zeros(8, np.float32)]
    algorithm = Compressed(DOWNPOUR(window=1), TopK(0.25))
    with ParameterServer(algorithm, center, 1, SECRET) as ps:
        with PSClient(*ps.address, SECRET, worker=0) as c:
            c.connect()
            anchor, _ = c.hello()
            weights = [np.arange(64, dtype=np.float32).reshape(8, 8), np.ones(8, np.float32)]
            payload, residual = algorithm.worker_commit(weights, [np.array(a) for a in anchor], None)
            reply, meta = c.commit(payload, {"epoch": 0, "step": 1})
            assert meta["version"] == 1
            sent = algorithm.codec.decode(payload, center)
            for got, s, r, w in zip(reply, sent, residual, weights):
                np.testing.assert_array_equal(got, s)
                np.testing.assert_array_equal(s + r, w)
            assert np.count_nonzero(reply[0]) == 16  # the top quarter of the 64 entries
            with pytest.raises(RemoteError, match="expected 4"):
                c.commit(weights, {})  # dense, uncompressed: refused, and the connection stays
            assert c.pull()[1] == 1


def test_trainer_option_wraps_the_algorithm_or_names_the_problem():
    from trainer import Trainer

    def model():  # never called: the options are checked first
        raise AssertionError

    assert isinstance(Trainer(model, algorithm="downpour", compression="bf16").algorithm, Compressed)
    assert Trainer(model, algorithm="adag").algorithm == ADAG()
    with pytest.raises(AlgorithmConfigError, match="commit deltas"):
        Trainer(model, algorithm="easgd", compression="fp16")
    with pytest.raises(AlgorithmConfigError, match="Unknown compression"):
        Trainer(model, algorithm="adag", compression="zstd")


def test_compressed_algorithm_survives_pickling_as_in_a_spark_task():
    import pickle

    algorithm = with_compression(DynSGD(window=3), "topk:0.05")
    copy = pickle.loads(pickle.dumps(algorithm))
    assert copy == algorithm and copy.window == 3 and copy.describe() == algorithm.describe()


@pytest.mark.parametrize("codec", [Float16(), BFloat16(), TopK(0.1), TopK(1.0)], ids=lambda c: c.describe())
@pytest.mark.parametrize("inner", [DOWNPOUR(), ADAG(window=4), DynSGD()], ids=lambda r: r.name)
def test_compressed_server_apply_gives_the_bits_of_server_commit(codec, inner):
    algorithm = Compressed(inner, codec)
    assert algorithm.payload_arrays == codec.wire_arrays == (2 if isinstance(codec, TopK) else 1)
    center = delta(3)
    payload, _ = algorithm.worker_commit(delta(4), [np.zeros_like(c) for c in center], None)
    expected, _ = algorithm.server_commit(center, payload, staleness=2)
    out = [np.full_like(c, np.nan) for c in center]
    algorithm.server_apply(center, payload, 2, out)
    for o, e in zip(out, expected):
        assert o.dtype == e.dtype and o.tobytes() == e.tobytes()
    per = algorithm.payload_arrays  # one tensor at a time, as the server calls it
    out = [np.empty_like(c) for c in center]
    for i in range(len(center)):
        algorithm.server_apply(center[i:i + 1], payload[per * i:per * (i + 1)], 2, out[i:i + 1])
    for o, e in zip(out, expected):
        assert o.tobytes() == e.tobytes()


@pytest.mark.parametrize("codec", [Float16(), BFloat16(), TopK(0.2)], ids=lambda c: c.describe())
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_decode_into_writes_what_decode_returns(codec, dtype):
    like = [a.astype(dtype) for a in delta(5)]
    wire = codec.encode(delta(6))
    out = [np.full_like(a, 9) for a in like]
    codec.decode_into(wire, out)
    for o, d in zip(out, codec.decode(wire, like)):
        assert o.dtype == d.dtype and o.tobytes() == d.tobytes()
