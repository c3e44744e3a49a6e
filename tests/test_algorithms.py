"""Exact values of every algorithm on tiny arrays, computed by hand."""

import numpy as np
import pytest

from trainer.algorithms import (
    ADAG, AEASGD, DOWNPOUR, EASGD, AlgorithmConfigError, DynSGD, SingleWorker, SyncAveraging,
    get_algorithm,
)


def arr(*values):
    return [np.asarray(values, dtype=np.float32)]


def assert_arrays(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        np.testing.assert_allclose(a, e, rtol=0, atol=1e-6)


W, W0, C = arr(3.0, 5.0), arr(1.0, 1.0), arr(2.0, 0.0)


def test_downpour_commits_delta_and_adopts_center():
    algorithm = DOWNPOUR(window=5)
    payload = algorithm.worker_payload(W, W0)
    assert_arrays(payload, arr(2.0, 4.0))
    center, reply = algorithm.server_commit(C, payload, staleness=3)
    assert_arrays(center, arr(4.0, 4.0))
    assert_arrays(reply, center)
    weights, anchor = algorithm.worker_apply(W, W0, reply)
    assert_arrays(weights, arr(4.0, 4.0))
    assert_arrays(anchor, arr(4.0, 4.0))


def test_adag_normalises_delta_by_window():
    algorithm = ADAG(window=4)
    payload = algorithm.worker_payload(W, W0)
    assert_arrays(payload, arr(0.5, 1.0))
    center, reply = algorithm.server_commit(C, payload, staleness=0)
    assert_arrays(center, arr(2.5, 1.0))
    assert_arrays(algorithm.worker_apply(W, W0, reply)[0], arr(2.5, 1.0))


@pytest.mark.parametrize(("staleness", "expected"), [(0, (4.0, 4.0)), (1, (3.0, 2.0)), (3, (2.5, 1.0))])
def test_dynsgd_divides_by_staleness_plus_one(staleness, expected):
    algorithm = DynSGD(window=5)
    center, reply = algorithm.server_commit(C, algorithm.worker_payload(W, W0), staleness=staleness)
    assert_arrays(center, arr(*expected))
    assert_arrays(reply, arr(*expected))


def test_aeasgd_elastic_exchange():
    algorithm = AEASGD(window=32, rho=5.0, lr=0.1)  # alpha = 0.5
    payload = algorithm.worker_payload(W, W0)
    assert_arrays(payload, W)
    center, reply = algorithm.server_commit(C, payload, staleness=7)
    # E = 0.5 * ([3, 5] - [2, 0]) = [0.5, 2.5]
    assert_arrays(center, arr(2.5, 2.5))
    assert_arrays(reply, arr(2.5, 2.5))
    assert_arrays(algorithm.worker_apply(W, W0, reply)[0], arr(2.5, 2.5))


def test_aeasgd_small_alpha():
    algorithm = AEASGD(rho=1.0, lr=0.1)  # alpha = 0.1
    center, reply = algorithm.server_commit(arr(0.0), arr(10.0), staleness=0)
    assert_arrays(center, arr(1.0))
    assert_arrays(reply, arr(9.0))


def test_easgd_synchronous_round():
    algorithm = EASGD(window=8, beta=0.9)  # 3 workers: alpha = 0.3
    payloads = [arr(1.0), arr(2.0), arr(6.0)]
    center, replies = algorithm.server_round(arr(0.0), payloads)
    # E_i = 0.3 * W_i = 0.3, 0.6, 1.8; C = 0 + 2.7
    assert_arrays(center, arr(2.7))
    assert_arrays(replies[0], arr(0.7))
    assert_arrays(replies[1], arr(1.4))
    assert_arrays(replies[2], arr(4.2))


def test_sync_averaging_mean_keeps_dtype():
    algorithm = SyncAveraging(every=3)
    assert algorithm.window == 3 and algorithm.synchronous and not algorithm.exchanges_optimizer_state
    payloads = [
        [np.array([1.0, 2.0], np.float32), np.array(4, np.int64)],
        [np.array([3.0, 6.0], np.float32), np.array(4, np.int64)],
    ]
    center, replies = algorithm.server_round([np.zeros(2, np.float32)], payloads)
    assert_arrays(center, [np.array([2.0, 4.0], np.float32), np.array(4, np.int64)])
    assert len(replies) == 2
    assert_arrays(replies[1], center)
    replies[0][0][0] = 99.0  # replies are independent copies
    assert center[0][0] == 2.0


def test_sync_averaging_per_epoch_and_optimizer_state():
    algorithm = SyncAveraging(average_optimizer_state=True)
    assert algorithm.window is None and algorithm.exchanges_optimizer_state


def test_single_worker_keeps_the_weights():
    algorithm = SingleWorker()
    center, reply = algorithm.server_commit(C, algorithm.worker_payload(W, W0), staleness=0)
    assert_arrays(center, W)
    assert_arrays(reply, W)
    with pytest.raises(AlgorithmConfigError, match="exactly one worker"):
        algorithm.check_workers(2)


def test_algorithms_do_not_modify_inputs():
    w, w0, c = arr(3.0, 5.0), arr(1.0, 1.0), arr(2.0, 0.0)
    for algorithm in (DOWNPOUR(), ADAG(), DynSGD(), AEASGD()):
        algorithm.server_commit(c, algorithm.worker_payload(w, w0), staleness=1)
        algorithm.worker_apply(w, w0, c)
    assert_arrays(w + w0 + c, arr(3.0, 5.0) + arr(1.0, 1.0) + arr(2.0, 0.0))


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: DOWNPOUR(window=0), "window"),
        (lambda: ADAG(window=None), "window"),
        (lambda: SyncAveraging(every=-1), "window"),
        (lambda: AEASGD(rho=20.0, lr=0.1), "rho \\* lr"),
        (lambda: EASGD(beta=1.5), "beta"),
        (lambda: get_algorithm("hogwild"), "Expected one of: single, sync, downpour, adag"),
    ],
)
def test_bad_hyper_parameters_are_named(factory, message):
    with pytest.raises(AlgorithmConfigError, match=message):
        factory()


def test_lookup_by_name():
    assert get_algorithm("ADAG", window=10) == ADAG(window=10)
    algorithm = EASGD()
    assert get_algorithm(algorithm) is algorithm


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_add_and_sub_keep_0d_weights_as_arrays(scale):
    """A custom layer's scalar weight is a 0-d array: numpy returns scalars for it, which take no out=."""
    from trainer.algorithms.base import add, sub

    a, b = [np.array(1.5, np.float32)], [np.array(0.5, np.float32)]
    summed, diff = add(a, b, scale), sub(a, b, scale)
    assert summed[0].dtype == np.float32 and float(summed[0]) == 1.5 + scale * 0.5
    assert diff[0].dtype == np.float32 and float(diff[0]) == scale * 1.0


# -- the in-place form (server_apply): the same bits as server_commit ------------------------------------


def _center_and_delta(dtype, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(7, 5), (5,), (), (3, 2, 2)]
    center = [np.asarray(rng.standard_normal(s) * 3, dtype) for s in shapes]
    delta = [np.asarray(rng.standard_normal(s) * 1e-3, dtype) for s in shapes]
    return center, delta


def _same_bits(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert a.tobytes() == e.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
@pytest.mark.parametrize("algorithm", [DOWNPOUR(), ADAG(window=3), DynSGD()], ids=lambda r: r.name)
@pytest.mark.parametrize("staleness", [0, 1, 6])
def test_server_apply_gives_the_bits_of_server_commit(algorithm, dtype, staleness):
    center, delta = _center_and_delta(dtype)
    if dtype == "int32":
        delta = [np.asarray(np.arange(d.size).reshape(d.shape) - 3, dtype) for d in delta]
    before = [c.copy() for c in center]
    expected, reply = algorithm.server_commit(center, delta, staleness)
    out = [np.full_like(c, 7) for c in center]
    assert algorithm.server_apply(center, delta, staleness, out) is None
    _same_bits(out, expected)
    _same_bits(reply, expected)
    _same_bits(center, before)  # the center is read, never written
    # One tensor at a time, as the server calls it under each tensor's lock.
    one_by_one = [np.empty_like(c) for c in center]
    for i in range(len(center)):
        algorithm.server_apply(center[i:i + 1], delta[i:i + 1], staleness, one_by_one[i:i + 1])
    _same_bits(one_by_one, expected)
    # The payload may be the output buffer itself (a compressed algorithm decodes the delta into it).
    aliased = [d.copy() for d in delta]
    algorithm.server_apply(center, aliased, staleness, aliased)
    _same_bits(aliased, expected)


def test_add_into_follows_add_for_a_numpy_scale_and_mixed_dtypes():
    from trainer.algorithms.base import add, add_into

    center, delta = _center_and_delta("float32")
    for scale in (np.float64(1 / 3), 0.25, np.float32(0.5)):
        out = [np.empty_like(c) for c in center]
        add_into(out, center, delta, scale)
        _same_bits(out, add(center, delta, scale))
    wide = [d.astype("f8") for d in delta]
    out = [np.empty_like(c) for c in center]
    add_into(out, center, wide, 0.5)
    _same_bits(out, add(center, wide, 0.5))


def test_only_the_delta_algorithms_have_an_in_place_form():
    for algorithm in (DOWNPOUR(), ADAG(), DynSGD()):
        assert callable(getattr(algorithm, "server_apply", None)) and algorithm.payload_arrays == 1
    for algorithm in (AEASGD(), EASGD(), SingleWorker(), SyncAveraging()):
        assert getattr(algorithm, "server_apply", None) is None
    with pytest.raises(ValueError, match="staleness"):
        DynSGD().server_apply(arr(1.0), arr(1.0), -1, arr(0.0))


def test_a_late_reply_is_folded_with_the_progress_it_has_not_seen():
    from trainer.algorithms import with_compression
    from trainer.algorithms.delta import fold_late, overlappable

    algorithm = DOWNPOUR(window=2)
    center = [np.array([1.0, 2.0], np.float32)]
    anchor = [np.array([0.5, 0.5], np.float32)]  # where this window started
    weights = [np.array([0.75, 1.0], np.float32)]  # after it: progress (0.25, 0.5), committed without waiting
    folded = fold_late(center, weights, anchor)
    np.testing.assert_allclose(folded[0], [1.25, 2.5])
    assert folded[0].dtype == np.float32
    # What the worker commits next measures from the folded weights: nothing is sent twice.
    np.testing.assert_allclose(algorithm.worker_payload(folded, folded)[0], [0.0, 0.0])
    # Into the worker's own copy of its weights (no temporaries), or new arrays where it is read-only.
    own = [w.copy() for w in weights]
    assert fold_late(center, own, anchor, out=own)[0] is own[0]
    np.testing.assert_array_equal(own[0], folded[0])
    frozen = [w.copy() for w in weights]
    frozen[0].flags.writeable = False
    np.testing.assert_array_equal(fold_late(center, frozen, anchor, out=frozen)[0], folded[0])
    np.testing.assert_array_equal(frozen[0], weights[0])
    assert overlappable(DOWNPOUR(window=5)) and overlappable(DynSGD(window=5)) and overlappable(ADAG(window=5))
    assert overlappable(with_compression(DynSGD(window=5), "bf16"))
    assert not overlappable(SyncAveraging(every=5)) and not overlappable(EASGD(window=5))
    assert not overlappable(DynSGD(window=None))  # one exchange per epoch: nothing to overlap with
