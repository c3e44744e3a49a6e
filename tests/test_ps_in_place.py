"""The parameter server's in-place path under concurrent clients (trainer.ps.center, trainer.ps.commits).

Real algorithms (DOWNPOUR, DynSGD), real sockets, client threads and client
processes committing at once. Deltas are multiples of powers of two small
enough that every sum is exact in any order, so the final center must equal
the initial one plus every delta, bit for bit. Every commit adds the same
value to every element, so a reply, a PULL or a snapshot that mixed two
states (a torn read) would show two values: each must hold `version` times
that value everywhere.
"""

from __future__ import annotations

import multiprocessing
import threading

import numpy as np
import pytest

from trainer.algorithms import DOWNPOUR, DynSGD
from trainer.ps import ParameterServer, PSClient, RemoteError
from trainer.transport.wire import new_secret

SECRET = new_secret()
SHAPES = [(300, 200), (200,), (), (64, 3, 3)]  # a 0-d weight too
NAMES = ["dense/kernel", "dense/bias", "scale", "conv/kernel"]
STEP = 0.5  # every commit adds STEP to every element: exact in float32 for thousands of commits


def zeros() -> list[np.ndarray]:
    return [np.zeros(s, np.float32) for s in SHAPES]


def constant(value: float) -> list[np.ndarray]:
    return [np.full(s, value, np.float32) for s in SHAPES]


def uniform(arrays) -> float | None:
    """The one value every element of `arrays` holds, or None when they differ (a torn state)."""
    values = {float(v) for a in arrays for v in np.unique(a)}
    return values.pop() if len(values) == 1 else None


def commit_loop(address, credentials, worker: int, commits: int, check: bool = True) -> list[str]:
    """Commit STEP everywhere `commits` times; returns what was wrong with the replies (empty: nothing)."""
    problems = []
    with PSClient(*address, credentials, worker, timeout=60).connect() as client:
        center, meta = client.hello()
        if uniform(center) != STEP * meta["version"]:
            problems.append(f"HELLO at version {meta['version']} is not uniform")
        for step in range(commits):
            reply, meta = client.commit(constant(STEP), {"epoch": 0, "step": step})
            if check and uniform(reply) != STEP * meta["version"]:
                problems.append(f"the reply at version {meta['version']} holds {uniform(reply)}")
            if step % 7 == 0:
                pulled, version = client.pull()
                if uniform(pulled) != STEP * version:
                    problems.append(f"a PULL at version {version} holds {uniform(pulled)}")
    return problems


def _process_client(address, credentials, worker, commits, results) -> None:
    results.put(commit_loop(address, credentials, worker, commits))


@pytest.mark.timeout(120)
def test_concurrent_clients_sum_every_delta_exactly_and_reads_are_never_torn():
    threads, processes, commits = 3, 2, 40
    workers = threads + processes
    with ParameterServer(DOWNPOUR(window=1), zeros(), workers, SECRET, weight_names=NAMES) as ps:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_process_client, args=(ps.address, ps.credentials, threads + k, commits, results),
                             daemon=True) for k in range(processes)]
        for p in procs:
            p.start()
        found: list[str] = []
        snapshots: list[tuple[float | None, int]] = []
        done = threading.Event()

        def run(worker: int) -> None:
            found.extend(commit_loop(ps.address, ps.credentials, worker, commits))

        def watch() -> None:  # checkpoints read the center while commits go on
            while not done.is_set():
                center, version, _ = ps.snapshot()
                snapshots.append((uniform(center), version))

        pool = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
        watcher = threading.Thread(target=watch)
        for t in [*pool, watcher]:
            t.start()
        for t in pool:
            t.join(90)
        for _ in procs:
            found.extend(results.get(timeout=90))
        for p in procs:
            p.join(30)
        done.set()
        watcher.join(30)
        assert not found, found[:5]
        assert ps.version == workers * commits
        center = ps.center()
        for a, shape in zip(center, SHAPES):
            np.testing.assert_array_equal(a, np.full(shape, STEP * workers * commits, np.float32))
        assert all(np.isfinite(a).all() for a in center)
        assert snapshots and all(value == STEP * version for value, version in snapshots), snapshots[:5]
        totals = ps.update_history()[1]
        assert totals["updates"] == workers * commits
        # The pool makes an array only when every spare one is on its way: one commit and one read per worker.
        assert max(len(spare) for spare in ps._center._spare) <= 2 * workers + 1
        assert totals["per_worker"] == {w: commits for w in range(workers)}


@pytest.mark.timeout(60)
def test_an_overflowing_commit_in_place_leaves_every_tensor_exactly_as_it_was():
    start = [np.full(s, 1.5, np.float32) for s in SHAPES]
    start[3][...] = 3e38  # the last tensor overflows, after the others were computed
    with ParameterServer(DOWNPOUR(), start, 1, SECRET, weight_names=NAMES) as ps:
        with PSClient(*ps.address, ps.credentials, 0, timeout=10).connect() as client:
            client.hello()
            before = [a.tobytes() for a in ps.center()]
            with pytest.raises(RemoteError, match=r"would put 0 NaN and 576 inf values into center array #3 "
                                                  r"'conv/kernel'.*The center is unchanged"):
                client.commit([np.full(s, 3e38 if i == 3 else 0.25, np.float32) for i, s in enumerate(SHAPES)],
                              {"step": 1})
            assert [a.tobytes() for a in ps.center()] == before and ps.version == 0
            nan = constant(0.25)
            nan[1][7] = np.nan
            with pytest.raises(RemoteError, match=r"array #1 'dense/bias' holds 1 NaN and 0 inf values"):
                client.commit(nan, {"step": 2})  # the payload is named, as before the in-place path
            assert [a.tobytes() for a in ps.center()] == before and ps.version == 0
            reply, meta = client.commit(constant(0.25), {"step": 3})  # the connection and the server go on
            assert meta["version"] == 1 and float(reply[0][0, 0]) == 1.75
        assert ps.failure is not None and "would put" in ps.failure


class _Exploding(DOWNPOUR):
    def server_apply(self, center, payload, staleness, out):
        if center[0].ndim == 0:  # the third tensor: the first two were computed already
            raise RuntimeError("apply boom")
        super().server_apply(center, payload, staleness, out)


@pytest.mark.timeout(60)
def test_a_failing_server_apply_publishes_nothing_and_releases_every_lock():
    with ParameterServer(_Exploding(), zeros(), 1, SECRET) as ps:
        with PSClient(*ps.address, ps.credentials, 0, timeout=10).connect() as client:
            with pytest.raises(RemoteError, match="server_apply failed: RuntimeError: apply boom"):
                client.commit(constant(1.0), {})
            center, version = client.pull()  # would hang if a tensor lock had been left held
            assert version == 0 and uniform(center) == 0.0
        assert uniform(ps.center()) == 0.0


@pytest.mark.timeout(60)
def test_dynsgd_in_place_scales_by_the_staleness_of_each_connection():
    with ParameterServer(DynSGD(), zeros(), 2, SECRET) as ps:
        with PSClient(*ps.address, SECRET, 0, timeout=10).connect() as c0, \
                PSClient(*ps.address, SECRET, 1, timeout=10).connect() as c1:
            c0.hello(), c1.hello()
            assert c0.commit(constant(1.0), {})[1] == {"version": 1, "staleness": 0}
            reply, meta = c1.commit(constant(1.0), {})  # one update since its HELLO: half of it
            assert meta == {"version": 2, "staleness": 1} and uniform(reply) == 1.5
            assert uniform(c0.commit(constant(3.0), {})[0]) == 3.0  # c0 is stale by one too
        assert uniform(ps.center()) == 3.0


@pytest.mark.timeout(60)
def test_dynsgd_counts_the_commits_an_overlapped_payload_reports_unseen():
    """A worker that overlaps its commits built its payload on an older reply: the commits it says it has
    not seen (meta "unseen") add to the staleness the server measures since its last reply."""
    with ParameterServer(DynSGD(), zeros(), 2, SECRET) as ps:
        with PSClient(*ps.address, SECRET, 0, timeout=10).connect() as c0, \
                PSClient(*ps.address, SECRET, 1, timeout=10).connect() as c1:
            c0.hello(), c1.hello()
            c0.commit(constant(1.0), {})  # version 1, c0's last reply
            reply, meta = c0.commit(constant(3.0), {"unseen": 1})
            assert meta == {"version": 2, "staleness": 1} and uniform(reply) == 2.5  # 1 + 3 / (1 + 1)
            assert c1.commit(constant(1.0), {})[1]["staleness"] == 2
            # capped at the version of c0's last reply (2): a sharded worker counts on shard 0's versions
            assert c0.commit(constant(1.0), {"unseen": 99})[1]["staleness"] == 1 + 2
            with pytest.raises(RemoteError, match="'unseen' must be an int >= 0, received -1"):
                c0.commit(constant(1.0), {"unseen": -1})
            assert ps.version == 4  # the malformed commit changed nothing
        assert [r.staleness for r in ps.updates] == [0, 1, 2, 3]


@pytest.mark.timeout(60)
def test_a_reply_still_on_its_way_is_never_written_by_the_commits_after_it():
    """A commit publishes by swapping its arrays in as the center and sends its reply from them once the locks
    are released: while that reply is still on its way (here: its worker does not read), later commits must
    take other arrays of the pool, not write into it (the old center goes back to the pool at each commit)."""
    import socket
    import time

    from trainer.transport.wire import Msg, encode

    shape = (4_000_000,)  # 16 MB: more than the socket buffers hold for a reader that does not read
    with ParameterServer(DOWNPOUR(), [np.zeros(shape, np.float32)], 2, SECRET) as ps:
        with PSClient(*ps.address, ps.credentials, 0, timeout=30).connect() as slow, \
                PSClient(*ps.address, ps.credentials, 1, timeout=30).connect() as fast:
            slow._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
            slow._channel.send(encode(Msg.COMMIT, {"worker": 0, "step": 0}, [np.full(shape, STEP, np.float32)]))
            deadline = time.monotonic() + 20
            while ps.version < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            for step in range(3):  # the second one would take the slow reply's arrays: they are in flight
                reply, meta = fast.commit([np.full(shape, STEP, np.float32)], {"step": step})
                assert uniform([reply[0]]) == STEP * meta["version"]
            frame = slow._channel.recv(None)
            assert frame.meta["version"] == 1 and uniform([frame.arrays[0]]) == STEP
        assert uniform(ps.center()) == 4 * STEP
