"""Tests of the parameter server and its client over loopback (trainer.ps.server, trainer.ps.ps_client):
lifecycle, asynchronous requests and synchronous rounds. Hostile peers: test_ps_server_peers.py.

The algorithms are the fakes of tests/ps_fakes.py, so these tests do not depend on the real algorithms.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import numpy as np
import pytest
from ps_fakes import (
    SECRET, AddRule, BadReplyRule, BrokenRoundRule, BrokenRule, MeanRule, StatefulRule, client, initial_center, ones,
    raw_auth, raw_connect, run_in_thread, server, still_serves, wait_for,
)

from trainer.ps import ParameterServer, PSClient, PSNotStartedError, RemoteError
from trainer.ps.epochs import completed_epochs, uniform_progress
from trainer.transport import wire
from trainer.transport.wire import ConnectionClosed, Msg, TransportError


# -- lifecycle -----------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_address_before_start_and_idempotent_stop():
    ps = server()
    with pytest.raises(PSNotStartedError, match="start"):
        ps.address
    ps.stop()  # stop before start is harmless
    with server() as ps:
        host, port = ps.address
        assert host == "127.0.0.1" and port > 0
        with pytest.raises(PSNotStartedError):
            ps.start()
    ps.stop()
    ps.stop()


@pytest.mark.timeout(10)
def test_constructor_validation():
    with pytest.raises(ValueError, match="num_workers"):
        ParameterServer(AddRule(), initial_center(), 0, SECRET)
    with pytest.raises(ValueError, match="secret"):
        ParameterServer(AddRule(), initial_center(), 1, b"")
    with pytest.raises(ValueError, match="round_timeout"):
        ParameterServer(AddRule(), initial_center(), 1, SECRET, round_timeout=0)


# -- asynchronous requests --------------------------------------------------------------


@pytest.mark.timeout(20)
def test_pull_commit_round_trip_version_and_staleness():
    algorithm = AddRule()
    seen = []
    with server(algorithm, num_workers=2, on_update=seen.append) as ps:
        with client(ps, 0) as c0, client(ps, 1) as c1:
            center, meta = c0.hello()
            assert meta == {"version": 0, "start_epoch": 0, "num_workers": 2}
            np.testing.assert_array_equal(center[1], np.zeros((2, 2)))
            c1.hello()

            reply, meta = c0.commit(ones(), {"epoch": 0, "step": 5, "loss": np.float32(0.5)})
            assert meta == {"version": 1, "staleness": 0}
            np.testing.assert_array_equal(reply[0], np.ones(3, "f4"))
            reply, meta = c1.commit(ones(2.0), {"epoch": 0, "step": 3, "loss": 1.5})
            assert meta == {"version": 2, "staleness": 1}  # c0 updated the center since c1's HELLO
            np.testing.assert_array_equal(reply[1], np.full((2, 2), 3.0))
            _, meta = c1.commit(ones(), {"epoch": 0, "step": 4})
            assert meta["staleness"] == 0
            arrays, version = c0.pull()
            assert version == 3 == ps.version
            _, meta = c0.commit(ones(), {"epoch": 1, "step": 0})
            assert meta["staleness"] == 0  # the pull refreshed c0
            assert c0.bytes_sent > 0 and c0.bytes_received > 0

        assert algorithm.staleness == [0, 1, 0, 0]
        np.testing.assert_array_equal(ps.center()[0], np.full(3, 5.0, "f4"))
        assert ps.center()[0].flags.writeable
        records = ps.updates
        assert [(r.worker, r.version, r.staleness, r.kind) for r in records] == [
            (0, 1, 0, "commit"),
            (1, 2, 1, "commit"),
            (1, 3, 0, "commit"),
            (0, 4, 0, "commit"),
        ]
        assert records[0].epoch == 0 and records[0].step == 5 and records[0].loss == 0.5
        assert records[2].loss is None
        assert all(r.bytes_in > 0 and r.bytes_out > 0 for r in records)
        assert seen == records


@pytest.mark.timeout(20)
def test_counted_commits_return_the_batches_of_the_epoch_per_attempt():
    with server(num_workers=2) as ps:
        with client(ps, 0) as c0, client(ps, 1) as c1:
            c0.hello(), c1.hello()
            assert c0.commit(ones(), {"epoch": 0, "batches": 5})[1]["epoch_batches"] == 5
            assert c1.commit(ones(), {"epoch": 0, "batches": 3})[1]["epoch_batches"] == 8
            assert c1.commit(ones(), {"epoch": 1, "batches": 4})[1]["epoch_batches"] == 4  # another epoch
            assert "epoch_batches" not in c0.commit(ones(), {"epoch": 0})[1]  # not counted, not told
            with pytest.raises(RemoteError, match="'epoch' and 'batches' as ints >= 0"):
                c0.commit(ones(), {"epoch": 0, "batches": -1})
            with pytest.raises(RemoteError, match="'epoch' and 'batches' as ints >= 0"):
                c0.commit(ones(), {"batches": 2})
            assert c0.commit(ones(), {"epoch": 0, "batches": 2})[1]["epoch_batches"] == 10
        assert ps.version == 5  # the rejected commits changed nothing
        with client(ps, 0, attempt=1) as retried:  # a retried attempt counts its epochs from zero
            retried.hello()
            assert retried.commit(ones(), {"epoch": 0, "batches": 5})[1]["epoch_batches"] == 5


@pytest.mark.timeout(20)
def test_bad_payload_and_failing_algorithm_reply_error_and_keep_connection(caplog):
    with server() as ps, client(ps) as c:
        with pytest.raises(RemoteError, match="expected 2"):
            c.commit(ones()[:1], {})
        with pytest.raises(RemoteError, match=r"shape \(4,\), expected \(3,\)"):
            c.commit([np.zeros(4, "f4"), np.zeros((2, 2))], {})
        with pytest.raises(RemoteError, match="expected 2"):
            c.commit(ones() + [np.zeros(1)], {})
        assert c.pull()[1] == 0  # connection still usable
        assert ps.version == 0
    with server(BrokenRule()) as ps, client(ps) as c:
        with caplog.at_level(logging.ERROR, logger="trainer.ps"):
            with pytest.raises(RemoteError, match="server_commit failed: RuntimeError: boom"):
                c.commit(ones(), {})
        assert c.pull()[1] == 0
    with server(BadReplyRule()) as ps, client(ps) as c:
        with pytest.raises(RemoteError, match="server_commit failed: ProtocolError"):
            c.commit(ones(), {})
        arrays, version = c.pull()  # the center was not changed
        assert version == 0 and not arrays[0].any()


@pytest.mark.timeout(20)
def test_optimizer_state_payloads_may_carry_extra_arrays():
    with server(StatefulRule()) as ps, client(ps) as c:
        reply, meta = c.commit(ones() + [np.arange(4, dtype="f4")], {})
        assert len(reply) == 3 and meta["version"] == 1
        assert len(ps.center()) == 3
        arrays, _ = c.pull()
        np.testing.assert_array_equal(arrays[2], np.arange(4, dtype="f4"))
        with pytest.raises(RemoteError, match="at least 2"):
            c.commit(ones()[:1], {})


@pytest.mark.timeout(20)
def test_on_update_exceptions_are_logged_not_raised(caplog):
    def explode(record):
        raise ValueError("callback bug")

    with server(on_update=explode) as ps, client(ps) as c:
        with caplog.at_level(logging.ERROR, logger="trainer.ps"):
            _, meta = c.commit(ones(), {})
        assert meta["version"] == 1
        assert "on_update" in caplog.text


@pytest.mark.timeout(20)
def test_hello_start_epoch_after_epoch_done_and_new_attempt():
    with server(num_workers=2) as ps:
        with client(ps, 0) as c:
            assert c.hello()[1]["start_epoch"] == 0
            c.epoch_done(0, {"loss": np.float64(0.75)})
            c.epoch_done(1, {"loss": 0.5})
        assert ps.epochs_done[0]["epoch"] == 1
        assert ps.epochs_done[0]["logs"] == {"loss": 0.5}
        with client(ps, 1) as other:
            assert other.hello()[1]["start_epoch"] == 0  # worker 1 has finished nothing yet
            other.epoch_done(0, {"loss": 0.6})
        # A retried stage resumes every worker at the first epoch not all of them finished
        # when the attempt began, even if one worker reports progress before the other's HELLO.
        with client(ps, 0, attempt=1) as first:
            assert first.hello()[1]["start_epoch"] == 1
            first.epoch_done(1, {"loss": 0.4})
            with client(ps, 1, attempt=1) as late:
                assert late.hello()[1]["start_epoch"] == 1
        assert any(e["kind"] == "new_attempt" and e["attempt"] == 1 for e in ps.events)


def test_completed_epochs_and_uniform_progress():
    assert completed_epochs({}, 2) == 0
    assert completed_epochs({0: {"epoch": 3}}, 2) == 0  # worker 1 finished none
    assert completed_epochs({0: {"epoch": 3}, 1: {"epoch": 1}}, 2) == 2
    assert completed_epochs({0: {"epoch": 3}, 1: {"epoch": 1}, 2: {"epoch": 0}}, 2) == 2  # worker 2 is gone
    assert uniform_progress(0, 3) == {}
    progress = uniform_progress(2, 3)
    assert sorted(progress) == [0, 1, 2] and {p["epoch"] for p in progress.values()} == {1}
    assert completed_epochs(progress, 3) == 2


@pytest.mark.timeout(20)
def test_resize_serves_fewer_workers_from_the_epochs_all_finished():
    with server(MeanRule(), num_workers=3, round_timeout=60) as ps:
        for worker, epoch in ((0, 2), (1, 1), (2, 3)):
            with client(ps, worker) as c:
                c.hello()
                c.epoch_done(epoch, {})
        c0, c1 = client(ps, 0, attempt=0), client(ps, 1, attempt=0)
        t0, out0 = run_in_thread(c0.commit, ones(), {})  # waits for the others: aborted by the resize
        assert wait_for(lambda: ps.pending_workers == [0])
        ps.resize(2)
        t0.join(10)
        assert "round aborted" in str(out0.get("error")), out0
        assert ps.num_workers == 2
        assert any(e["kind"] == "resized" and e["from"] == 3 and e["to"] == 2 and e["completed_epochs"] == 2
                   for e in ps.events)
        with pytest.raises(wire.AuthenticationError):
            client(ps, 2, attempt=1)  # worker 2 no longer exists
        n0, n1 = client(ps, 0, attempt=1), client(ps, 1, attempt=1)
        with n0, n1:
            assert n0.hello()[1] == {"version": 0, "start_epoch": 2, "num_workers": 2}
            assert n1.hello()[1]["start_epoch"] == 2
            t0, out0 = run_in_thread(n0.commit, ones(1.0), {})
            t1, out1 = run_in_thread(n1.commit, ones(3.0), {})  # a round of two now completes
            t0.join(10), t1.join(10)
            assert out0["result"][1]["version"] == out1["result"][1]["version"] == 1
        c0.close(), c1.close()
    with pytest.raises(ValueError, match="positive int"):
        ps.resize(0)


@pytest.mark.timeout(20)
def test_worker_mismatch_and_bad_epoch_done_are_errors():
    with server(num_workers=2) as ps:
        sock, channel = raw_auth(ps, worker=0)
        with sock:
            channel.send_frame(Msg.PULL, {"worker": 1})
            reply = channel.recv(1 << 20)
            assert reply.msg is Msg.ERROR and "authenticated as worker 0" in reply.meta["error"]
            channel.send_frame(Msg.EPOCH_DONE, {"epoch": "x"})
            assert channel.recv(1 << 20).msg is Msg.ERROR
            channel.send_frame(Msg.CHALLENGE, {})
            assert channel.recv(1 << 20).msg is Msg.ERROR
            channel.send_frame(Msg.PULL, {})
            assert channel.recv(1 << 20).msg is Msg.OK


# -- synchronous rounds ---------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_synchronous_round_with_two_workers():
    with server(MeanRule(), num_workers=2) as ps:
        c0, c1 = client(ps, 0), client(ps, 1)
        with c0, c1:
            c0.hello(), c1.hello()
            t0, out0 = run_in_thread(c0.commit, ones(1.0), {"epoch": 0, "step": 1, "loss": 1.0})
            t1, out1 = run_in_thread(c1.commit, ones(3.0), {"epoch": 0, "step": 1, "loss": 2.0})
            t0.join(10), t1.join(10)
            assert "error" not in out0 and "error" not in out1, (out0, out1)
            (r0, m0), (r1, m1) = out0["result"], out1["result"]
            np.testing.assert_array_equal(r0[0], np.full(3, 2.0, "f4"))
            assert int(r0[2]) == 0 and int(r1[2]) == 1  # each worker gets its own reply
            assert m0["version"] == m1["version"] == 1 == ps.version
            # A second round.
            t0, out0 = run_in_thread(c0.commit, ones(0.0), {})
            t1, out1 = run_in_thread(c1.commit, ones(0.0), {})
            t0.join(10), t1.join(10)
            assert out0["result"][1]["version"] == 2
        records = ps.updates
        assert len(records) == 4 and {r.kind for r in records} == {"round"}
        assert sorted((r.version, r.worker) for r in records) == [(1, 0), (1, 1), (2, 0), (2, 1)]


@pytest.mark.timeout(20)
def test_disconnect_mid_round_aborts_promptly():
    with server(MeanRule(), num_workers=2, round_timeout=60) as ps:
        c0, c1 = client(ps, 0), client(ps, 1)
        with c0:
            t0, out0 = run_in_thread(c0.commit, ones(), {})
            assert wait_for(lambda: ps.pending_workers == [0])  # worker 0 is waiting in the barrier
            start = time.monotonic()
            c1.close()  # worker 1 dies before committing
            t0.join(10)
            assert time.monotonic() - start < 5
            assert isinstance(out0.get("error"), RemoteError)
            assert "round aborted" in str(out0["error"]) and "worker 1" in str(out0["error"])
            assert c0.pull()[1] == 0  # the connection of worker 0 is still fine
        assert any(e["kind"] == "round_aborted" for e in ps.events)


@pytest.mark.timeout(20)
def test_failing_round_algorithm_aborts_the_round_for_everyone():
    with server(BrokenRoundRule(), num_workers=2) as ps:
        c0, c1 = client(ps, 0), client(ps, 1)
        with c0, c1:
            t0, out0 = run_in_thread(c0.commit, ones(), {})
            t1, out1 = run_in_thread(c1.commit, ones(), {})
            t0.join(10), t1.join(10)
            for out in (out0, out1):
                assert isinstance(out.get("error"), RemoteError)
                assert "round aborted: server_round failed: RuntimeError: round boom" in str(out["error"])
            assert c0.pull()[1] == 0 == ps.version


@pytest.mark.timeout(20)
def test_round_timeout_aborts_round():
    with server(MeanRule(), num_workers=2, round_timeout=0.5) as ps, client(ps, 0) as c0:
        start = time.monotonic()
        with pytest.raises(RemoteError, match=r"round aborted: .*timed out.*\[1\]"):
            c0.commit(ones(), {})
        assert time.monotonic() - start < 5


@pytest.mark.timeout(20)
def test_duplicate_commit_in_a_round_is_refused():
    with server(MeanRule(), num_workers=2, round_timeout=60) as ps:
        c0, dup = client(ps, 0), client(ps, 0)
        with c0, dup:
            t0, out0 = run_in_thread(c0.commit, ones(), {})
            assert wait_for(lambda: ps.pending_workers == [0])
            with pytest.raises(RemoteError, match="already committed"):
                dup.commit(ones(), {})
            ps.stop()
            t0.join(10)
            assert isinstance(out0.get("error"), TransportError)


@pytest.mark.timeout(30)
def test_stop_with_connected_and_waiting_clients_is_prompt_and_frees_port():
    ps = server(MeanRule(), num_workers=3, round_timeout=60)
    host, port = ps.start()
    idle = client(ps, 2)
    c0, c1 = client(ps, 0), client(ps, 1)
    t0, out0 = run_in_thread(c0.commit, ones(), {})
    t1, out1 = run_in_thread(c1.commit, ones(), {})
    assert wait_for(lambda: ps.pending_workers == [0, 1])
    silent = raw_connect(ps)  # unauthenticated connection, too
    start = time.monotonic()
    ps.stop()
    assert time.monotonic() - start < 3
    t0.join(5), t1.join(5)
    assert isinstance(out0.get("error"), TransportError) and isinstance(out1.get("error"), TransportError)
    with pytest.raises(TransportError):
        idle.pull()
    for c in (idle, c0, c1):
        c.close()
    silent.close()
    again = ParameterServer(AddRule(), initial_center(), 1, SECRET, port=port)
    with again:
        assert again.address == (host, port)
        still_serves(again)


@pytest.mark.timeout(30)
def test_no_thread_leak_over_start_stop_cycles():
    before = threading.active_count()
    for _ in range(20):
        with server(num_workers=2) as ps:
            with client(ps, 0) as c:
                c.hello()
            lingering = client(ps, 1)  # still connected when the server stops
        lingering.close()
    assert wait_for(lambda: threading.active_count() <= before, timeout=3), threading.enumerate()


@pytest.mark.timeout(20)
def test_client_errors():
    with pytest.raises(ConnectionClosed, match="cannot connect"):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        PSClient("127.0.0.1", port, SECRET, 0, timeout=2).connect()
    with server() as ps:
        c = PSClient(*ps.address, SECRET, 0)
        with pytest.raises(TransportError, match="not connected"):
            c.pull()
        c.connect()
        with pytest.raises(wire.ProtocolError, match="allowed"):
            c.commit([np.array(["x"])], {})
        assert c.pull()[1] == 0  # a bad argument does not break the connection
        c.close()
        c.close()
