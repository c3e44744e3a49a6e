"""Compressed replies: the server sends each worker the change of the center since what it holds.

The pure step (``Codec.encode_change`` / ``apply_change``), then a real loopback
parameter server and client (one endpoint and two shards), then a real Spark fit.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import digits_model
from trainer.algorithms import DOWNPOUR, AlgorithmConfigError, BFloat16, DynSGD, TopK, with_compression
from trainer.ps import ParameterServer, PSClient, RemoteError, ShardedParameterServer, connect_ps
from trainer.transport.wire import ProtocolError, new_secret

SECRET = new_secret()
SHAPES = [(64, 32), (32,), (3, 3, 2, 4)]


def arrays(seed: int, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES]


# -- the pure step -----------------------------------------------------------------------


@pytest.mark.parametrize("codec", [BFloat16(), TopK(0.1)], ids=lambda c: c.describe())
def test_both_ends_hold_the_same_bits_and_what_a_reply_drops_comes_in_the_next(codec):
    start = arrays(0)
    server_held, worker_held = [a.copy() for a in start], [a.copy() for a in start]
    # a second worker decodes into scratch arrays kept from reply to reply, as PSClient does
    scratch_held, scratch = [a.copy() for a in start], [np.full_like(a, np.nan) for a in start]
    center = [a.copy() for a in start]
    for step in range(1, 40):
        center = [c + d for c, d in zip(center, arrays(step, 1e-2))]  # the center moves by commits
        wire = codec.encode_change(center, server_held)
        codec.apply_change(wire, worker_held)
        codec.apply_change(wire, scratch_held, scratch)
        for s, w, k in zip(server_held, worker_held, scratch_held):
            assert s.tobytes() == w.tobytes() == k.tobytes()
    gap = max(float(np.max(np.abs(c - h))) for c, h in zip(center, worker_held))
    moved = max(float(np.max(np.abs(c - s))) for c, s in zip(center, start))
    if isinstance(codec, BFloat16):  # one reply's rounding: 2^-8 of the last change, not 39 of them
        assert gap < 2 ** -8 * 0.1
    else:  # top-k: the gap is bounded and far below what the center travelled
        assert gap < 0.2 * moved
    quiet = codec.encode_change(center, server_held)  # the center still: replies catch up with it
    for _ in range(30):
        codec.apply_change(quiet, worker_held)
        quiet = codec.encode_change(center, server_held)
    assert max(float(np.max(np.abs(c - h))) for c, h in zip(center, server_held)) < gap


def test_replies_need_a_compression_and_the_algorithm_says_so():
    from trainer import Trainer

    def model():  # never called: the options are checked first
        raise AssertionError

    algorithm = Trainer(model, algorithm="downpour", compression="bf16", compress_replies=True).algorithm
    assert algorithm.reply_codec == BFloat16() and "replies too" in algorithm.describe()
    assert Trainer(model, algorithm="downpour", compression="bf16").algorithm.reply_codec is None
    with pytest.raises(AlgorithmConfigError, match="compress_replies=True needs a compression"):
        Trainer(model, algorithm="downpour", compress_replies=True)


# -- a real server -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_worker_gets_the_center_within_one_replys_rounding_at_half_the_bytes():
    algorithm = with_compression(DOWNPOUR(window=1), "bf16", replies=True)
    dense_rule = with_compression(DOWNPOUR(window=1), "bf16")
    start = arrays(0)
    received = {}
    for name, r in (("change", algorithm), ("dense", dense_rule)):
        codec = r.reply_codec
        with ParameterServer(r, start, 2, SECRET) as ps, \
                PSClient(*ps.address, SECRET, worker=0, reply_codec=codec) as c, \
                PSClient(*ps.address, SECRET, worker=1, reply_codec=codec) as other:
            c.connect(), other.connect()
            held, meta = c.hello()
            assert meta.get("reply_codec") == ("bf16" if name == "change" else None)
            other.hello()
            held = [np.array(a) for a in held]
            before = c.bytes_received
            for step in range(1, 6):
                other.commit(r.worker_commit(arrays(100 + step, 1e-2), [np.zeros(s, np.float32) for s in SHAPES],
                                             None)[0], {"step": step})  # the center moves under worker 0
                payload, _ = r.worker_commit([h + d for h, d in zip(held, arrays(step, 1e-2))], held, None)
                reply, meta = c.commit(payload, {"step": step})
                assert meta.get("reply") == ("change" if name == "change" else None)
                held = [np.array(a) for a in reply]
                exact = ps.center()
                tolerance = 0.0 if name == "dense" else 2 ** -8 * 0.1
                for got, want in zip(held, exact):
                    assert float(np.max(np.abs(got - want))) <= tolerance
                    assert got.dtype == np.float32 and got.shape == want.shape
            received[name] = c.bytes_received - before
            recorded = sum(u.bytes_out for u in ps.updates if u.worker == 0)  # the frames; the wire adds a MAC
            assert recorded <= received[name] <= recorded + 5 * 64
    assert 0.45 < received["change"] / received["dense"] < 0.55


@pytest.mark.timeout(60)
def test_a_commit_before_hello_is_refused_with_compressed_replies_and_the_connection_stays():
    algorithm = with_compression(DOWNPOUR(window=1), "bf16", replies=True)
    with ParameterServer(algorithm, arrays(0), 1, SECRET) as ps, \
            PSClient(*ps.address, SECRET, worker=0, reply_codec=algorithm.reply_codec) as c:
        c.connect()
        payload, _ = algorithm.worker_commit(arrays(1), arrays(0), None)
        with pytest.raises(RemoteError, match="sends HELLO before its first COMMIT"):
            c.commit(payload, {})
        assert ps.version == 0
        c.hello()
        assert c.commit(payload, {})[1]["version"] == 1


@pytest.mark.timeout(60)
def test_a_client_without_the_servers_reply_codec_is_told_what_to_give_it():
    algorithm = with_compression(DOWNPOUR(window=1), "bf16", replies=True)
    with ParameterServer(algorithm, arrays(0), 1, SECRET) as ps:
        for given, said in ((None, "no reply codec"), (TopK(0.1), "'topk:0.1'")):
            with PSClient(*ps.address, SECRET, worker=0, reply_codec=given) as c:
                c.connect()
                with pytest.raises(ProtocolError, match=f"compresses its replies with 'bf16' but this client was "
                                                        f"given {said}"):
                    c.hello()


@pytest.mark.timeout(60)
def test_sharded_servers_compress_each_shards_reply_and_the_worker_gets_the_whole_center():
    algorithm = with_compression(DOWNPOUR(window=1), "topk:0.3", replies=True)
    start = arrays(0)
    with ShardedParameterServer(algorithm, start, 1, SECRET, shards=2) as ps, \
            connect_ps(ps.addresses, ps.credentials, 0, split=algorithm.split_payload,
                       reply_codec=algorithm.reply_codec) as c:
        held = [np.array(a) for a in c.hello()[0]]
        for step in range(1, 30):
            payload, _ = algorithm.worker_commit([h + d for h, d in zip(held, arrays(step, 1e-2))], held, None)
            reply, meta = c.commit(payload, {"step": step})
            held = [np.array(a) for a in reply]
        assert meta["version"] == 29
        for _ in range(30):  # no more commits of weight: replies to empty ones bring the rest of the center
            reply, _ = c.commit(algorithm.worker_commit(held, held, None)[0], {})
            held = [np.array(a) for a in reply]
        for got, want in zip(held, ps.center()):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=1e-6)


# -- a real fit --------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("options", [{}, {"overlap": True, "ps_shards": 2}], ids=["plain", "overlap-2-shards"])
def test_compressed_commits_and_replies_train_digits(digits, options):
    from trainer import Trainer

    train, test = digits
    fitted = Trainer(digits_model(0.005), algorithm=DynSGD(window=4), compression="bf16", compress_replies=True,
                     num_workers=2, batch_size=32, epochs=6, verbose=False, **options).fit(train)
    history = fitted.history
    assert fitted.evaluate(test)["accuracy"] >= 0.88
    totals = history.update_totals
    assert 0.45 < totals["bytes_out"] / totals["bytes_in"] < 1.05  # replies weigh what bf16 commits do
