"""A parameter server sharded over S endpoints (trainer.ps.layout, .shards, .shard_client), over real sockets.

The cut weighs the same bytes on every shard and covers every element once;
commits of several clients at once add up exactly on every shard; shard 0
counts the epochs and carries the directives; compressed (top-k) payloads,
synchronous rounds and TLS work across shards.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from trainer.algorithms import DOWNPOUR, EASGD, SyncAveraging, with_compression
from trainer.ps import ParameterServer, RemoteError, ShardedParameterServer, ShardedPSClient, connect_ps
from trainer.ps.layout import cut, join_parts, shard_layout
from trainer.transport.wire import ProtocolError, new_secret

SECRET = new_secret()
SHAPES = [(3, 3, 1, 8), (8,), (40, 50), (50,), (), (0, 4)]  # conv, bias, a large kernel, 0-d, empty
NAMES = ["conv/kernel", "conv/bias", "dense/kernel", "dense/bias", "scale", "empty"]


def zeros() -> list[np.ndarray]:
    return [np.zeros(s, np.float32) for s in SHAPES]


def constant(value: float) -> list[np.ndarray]:
    return [np.full(s, value, np.float32) for s in SHAPES]


def client(ps, worker: int = 0, algorithm=None, attempt: int = 0) -> ShardedPSClient:
    return ShardedPSClient(ps.addresses, ps.credentials, worker, attempt, timeout=20,
                           split=algorithm.split_payload if algorithm is not None else None).connect()


@pytest.mark.parametrize("shards", [1, 2, 3, 5])
def test_the_cut_balances_bytes_and_covers_every_element_once(shards):
    arrays = zeros()
    layout = shard_layout(arrays, shards)
    assert len(layout) == shards
    weights = [sum((stop - start) * 4 for _, start, stop in pieces) for pieces in layout]
    assert max(weights) - min(weights) <= 4 * 2  # equal to an element or two
    covered = {t: [] for t in range(len(arrays))}
    for pieces in layout:
        for t, start, stop in pieces:
            covered[t].append((start, stop))
    for t, ranges in covered.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == arrays[t].size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    values = [np.arange(a.size, dtype=np.float32).reshape(a.shape) for a in arrays]
    joined = join_parts(cut(values, layout), layout, SHAPES)
    for j, v in zip(joined, values):
        assert j.shape == v.shape and j.tobytes() == v.tobytes()


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="ps_shards` must be a positive integer"):
        shard_layout(zeros(), 0)
    with pytest.raises(ValueError, match="cannot be cut into 40 parameter-server shards"):
        shard_layout([np.zeros(30, np.float32)], 40)
    with pytest.raises(ValueError, match="keeps optimizer state on the parameter server, which cannot be sharded"):
        ShardedParameterServer(SyncAveraging(average_optimizer_state=True), zeros(), 2, SECRET, shards=2)


@pytest.mark.timeout(60)
def test_concurrent_commits_add_up_on_every_shard_and_shard_0_keeps_the_books():
    seen = []
    with ShardedParameterServer(DOWNPOUR(window=1), zeros(), 3, SECRET, shards=3, weight_names=NAMES,
                                on_update=seen.append) as ps:
        assert len({port for _, port in ps.addresses}) == 3
        commits, problems = 25, []

        def run(worker: int) -> None:
            with client(ps, worker) as c:
                center, meta = c.hello()
                assert meta["start_epoch"] == 0 and meta["num_workers"] == 3 and "shard" not in meta
                assert [a.shape for a in center] == SHAPES
                for step in range(commits):
                    reply, meta = c.commit(constant(0.5), {"epoch": 0, "step": step, "batches": 1})
                    if [a.shape for a in reply] != SHAPES:
                        problems.append(f"reply shapes {[a.shape for a in reply]}")
                c.epoch_done(0, {"loss": 1.0})

        threads = [threading.Thread(target=run, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(50)
        assert not problems, problems[:3]
        for a, shape in zip(ps.center(), SHAPES):
            np.testing.assert_array_equal(a, np.full(shape, 0.5 * 3 * commits, np.float32))
        center, version, done = ps.snapshot()
        assert version == ps.version == 3 * commits and sorted(done) == [0, 1, 2]
        columns, totals = ps.update_history()
        assert totals["shard_updates"] == [3 * commits] * 3 and len(seen) == 3 * commits == totals["updates"]
        assert totals["bytes_in"] > sum(r.bytes_in for r in seen)  # every shard's bytes count
        assert ps.epochs_done[1]["epoch"] == 0
        with client(ps, 0) as c:
            c.hello()
            ps.direct(learning_rate=0.5)
            assert c.commit(constant(0.0), {})[1]["learning_rate"] == 0.5  # shard 0's directives


@pytest.mark.timeout(60)
def test_a_sharded_top_k_commit_lands_where_the_unsharded_one_does():
    algorithm = with_compression(DOWNPOUR(window=1), "topk:0.3")
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    payload, _ = algorithm.worker_commit(weights, zeros(), None)
    with ParameterServer(algorithm, zeros(), 1, SECRET) as single, connect_ps(single.addresses, SECRET, 0) as c:
        c.hello()
        expected, _ = c.commit(payload, {})
        expected = [np.array(a) for a in expected]
    with ShardedParameterServer(algorithm, zeros(), 1, SECRET, shards=2) as ps, client(ps, 0, algorithm) as c:
        c.hello()
        reply, meta = c.commit(payload, {})
        assert meta["version"] == 1
        for got, want in zip(reply, expected):
            assert got.tobytes() == want.tobytes()
        for got, want in zip(ps.center(), expected):
            assert got.tobytes() == want.tobytes()


@pytest.mark.timeout(60)
def test_synchronous_rounds_run_on_every_shard_and_a_stop_releases_them_all():
    with ShardedParameterServer(EASGD(window=1, beta=0.5), zeros(), 2, SECRET, shards=2, round_timeout=30) as ps:
        c0, c1 = client(ps, 0), client(ps, 1)
        with c0, c1:
            c0.hello(), c1.hello()
            out: dict = {}
            t = threading.Thread(target=lambda: out.setdefault("r", c1.commit(constant(4.0), {})))
            t.start()
            reply, meta = c0.commit(constant(0.0), {})
            t.join(20)
            assert meta["version"] == 1 and float(ps.center()[2][0, 0]) == 1.0  # 0.25 * (0 + 4)
            assert float(reply[2][0, 0]) == 0.0 and float(out["r"][0][2][0, 0]) == 3.0
            t = threading.Thread(target=lambda: out.setdefault("stopped", c1.commit(constant(1.0), {})))
            t.start()
            ps.direct(stop=True)
            t.join(20)
            reply, meta = out["stopped"]
            assert reply == [] and meta["stop"] is True


@pytest.mark.timeout(60)
def test_tls_shards_share_one_certificate_and_refusals_reach_the_worker():
    with ShardedParameterServer(DOWNPOUR(), zeros(), 1, SECRET, shards=2, tls=True, weight_names=NAMES) as ps:
        assert ps.credentials.tls_fingerprint is not None
        with client(ps, 0) as c:
            c.hello()
            bad = constant(0.5)
            bad[2][39, 49] = np.nan  # the last element of the large kernel: shard 1's piece
            with pytest.raises(RemoteError, match=r"'dense/kernel\[\d+:2000\]' holds 1 NaN"):
                c.commit(bad, {})
            # Shard 1 refused its part, shard 0 applied its own: finite, and the fit stops on the refusal.
            assert ps.failure is not None and ps.shards[1].version == 0 and ps.version == 1
            assert all(np.isfinite(a).all() for a in ps.center())
            assert any(e["kind"] == "commit_refused" and e["shard"] == 1 for e in ps.events)
        with ShardedPSClient(list(reversed(ps.addresses)), ps.credentials, 0, timeout=10) as wrong:
            with pytest.raises(ProtocolError, match="is not shard 0 of 2"):
                wrong.hello()
