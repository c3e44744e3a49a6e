"""Update hygiene and attempt fencing of the parameter server over real sockets (trainer.ps.hygiene, .server).

NaN, inf, float64 and int8 commits are refused with an error naming the
worker, the weight and the step; the center stays finite. Requests of an
older attempt than the current one are refused.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from trainer.ps import ParameterServer, PSClient, RemoteError
from trainer.ps.hygiene import check_commit, non_finite
from trainer.transport.wire import AuthenticationError, new_secret

SECRET = new_secret()
NAMES = ["dense/kernel", "dense/bias"]


class AddRule:
    name = "add"
    synchronous = False
    exchanges_optimizer_state = False

    def server_commit(self, center, payload, staleness):
        with np.errstate(over="ignore"):  # the overflow test makes inf on purpose
            new = [c + p for c, p in zip(center, payload)]
        return new, new


class MeanRule:
    name = "mean"
    synchronous = True
    exchanges_optimizer_state = False

    def server_round(self, center, payloads):
        mean = [np.mean([p[i] for p in payloads], axis=0).astype(center[i].dtype) for i in range(len(center))]
        return mean, [mean for _ in payloads]


def center() -> list[np.ndarray]:
    return [np.zeros((4, 3), "f4"), np.zeros(3, "f4")]


def good() -> list[np.ndarray]:
    return [np.full((4, 3), 0.5, "f4"), np.full(3, 0.5, "f4")]


def server(algorithm=None, **kw) -> ParameterServer:
    return ParameterServer(algorithm or AddRule(), center(), kw.pop("num_workers", 1), SECRET, weight_names=NAMES, **kw)


def client(ps: ParameterServer, worker: int = 0, attempt: int = 0) -> PSClient:
    return PSClient(*ps.address, ps.credentials, worker, attempt=attempt, timeout=10).connect()


def poisoned(kind: str) -> list[np.ndarray]:
    payload = good()
    if kind == "nan":
        payload[0][1, 2] = np.nan
    elif kind == "inf":
        payload[0][0, 0] = -np.inf
    elif kind == "float64":
        payload[0] = payload[0].astype("f8")
    elif kind == "int8":
        payload[0] = np.ones((4, 3), "i1")
    return payload


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind, says", [
    ("nan", "holds 1 NaN and 0 inf values"),
    ("inf", "holds 0 NaN and 1 inf values"),
    ("float64", "has dtype float64, expected the model's float32"),
    ("int8", "has dtype int8, expected the model's float32"),
])
def test_poisoned_commits_are_refused_and_the_center_stays_finite(kind, says, caplog):
    with server(num_workers=2) as ps, client(ps, 1) as c:
        c.hello()
        c.commit(good(), {"epoch": 0, "step": 3})
        with caplog.at_level(logging.ERROR, logger="trainer.ps"):
            with pytest.raises(RemoteError) as refused:
                c.commit(poisoned(kind), {"epoch": 0, "step": 7})
        text = str(refused.value)
        assert "refused the COMMIT of worker 1 at step 7 (epoch 0)" in text
        assert f"array #0 'dense/kernel' {says}" in text
        assert ("lower the learning rate" in text) == (kind in ("nan", "inf"))
        assert "worker 1" in caplog.text and "dense/kernel" in caplog.text, "an ERROR names worker and weight"
        assert ps.version == 1
        assert all(np.isfinite(a).all() for a in ps.center())
        np.testing.assert_array_equal(ps.center()[0], np.full((4, 3), 0.5))
        assert ps.failure is not None and "worker 1" in ps.failure
        assert any(e["kind"] == "commit_refused" for e in ps.events)
        assert c.commit(good(), {"step": 8})[1]["version"] == 2, "a refusal is an answer, not a broken connection"


@pytest.mark.timeout(30)
def test_a_commit_that_would_overflow_the_center_is_refused():
    with server() as ps, client(ps) as c:
        huge = [np.full((4, 3), 3e38, "f4"), np.zeros(3, "f4")]
        c.commit(huge, {"step": 1})  # finite, and so is the center
        with pytest.raises(RemoteError, match=r"would put 0 NaN and 12 inf values into center array #0 'dense/kernel'"):
            c.commit(huge, {"step": 2})  # 3e38 + 3e38 overflows float32
        assert ps.version == 1 and all(np.isfinite(a).all() for a in ps.center())


@pytest.mark.timeout(30)
def test_a_poisoned_commit_to_a_synchronous_round_is_refused():
    with server(MeanRule(), num_workers=2, round_timeout=2) as ps, client(ps, 0) as c0:
        with pytest.raises(RemoteError, match="worker 0 at step 4 .*NaN"):
            c0.commit(poisoned("nan"), {"step": 4})
        assert ps.pending_workers == [] and ps.version == 0


def test_non_finite_counts_only_when_the_fast_check_fails():
    assert non_finite(np.full(10, 3e38, "f4")) is None, "a sum that overflows is not a non-finite array"
    assert non_finite(np.full((3, 4), 1e20, "f4")) is None, "nor one whose squares overflow"
    for dtype in ("f4", "f8"):
        a = np.zeros((50, 40), dtype)
        a[7, 3], a[9, 1], a[20, 20] = np.nan, np.inf, -np.inf
        assert non_finite(a) == (1, 2) and non_finite(a[:, ::2]) == (0, 1)  # a strided view takes the sum
    assert non_finite(np.array([1, np.nan, np.inf, -np.inf], "f2")) == (1, 2)
    assert non_finite(np.arange(5)) is None and non_finite(np.zeros(0, "f4")) is None
    problem, diverged = check_commit(good()[:1], center(), 2, NAMES, with_optimizer=False)
    assert "1 arrays, expected 2" in problem and not diverged
    problem, _ = check_commit(good() + [np.array([np.nan])], center(), 2, NAMES, with_optimizer=True)
    assert "array #2 (optimizer state) holds 1 NaN" in problem


# -- attempt fencing ----------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_stale_attempt_s_requests_are_refused():
    with server(num_workers=2) as ps:
        ps.start_attempt(0)
        old = client(ps, 0, attempt=0)
        old.hello()
        old.commit(good(), {"step": 1})
        ps.start_attempt(1)  # a retry: attempt 0's tasks are leftovers now
        for request in (lambda: old.commit(good(), {"step": 2}), old.pull, lambda: old.epoch_done(0)):
            with pytest.raises(RemoteError, match="stale attempt: this task belongs to attempt 0 but the driver runs "
                                                  "attempt 1"):
                request()
        assert ps.version == 1 and ps.epochs_done == {}
        with pytest.raises(AuthenticationError, match="stale attempt"):
            client(ps, 1, attempt=0)  # a leftover task connecting late
        with client(ps, 0, attempt=1) as new:
            new.hello()
            assert new.commit(good(), {"step": 1})[1]["version"] == 2
        old.close()
        assert ps.attempt == 1 and any(e["kind"] == "stale_request" for e in ps.events)


@pytest.mark.timeout(30)
def test_a_worker_of_a_newer_attempt_moves_the_server_on():
    with server(num_workers=2) as ps:
        old = client(ps, 0, attempt=0)
        with client(ps, 1, attempt=2) as newer:
            newer.hello()
        assert ps.attempt == 2
        with pytest.raises(RemoteError, match="stale attempt"):
            old.pull()
        old.close()
