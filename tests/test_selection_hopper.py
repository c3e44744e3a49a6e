"""The model hopper's transport over real loopback sockets: handshake, errors, lost tasks, stop."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trainer.transport.wire import AuthenticationError, new_secret
from trainer.selection.engine.hopper import HopperClient, HopperError, HopperRejected, HopperServer


class RecordingHandler:
    """Answers HELLO with the worker's rows doubled, PULL with one array or a rejection, COMMIT by raising."""

    def __init__(self) -> None:
        self.lost_calls: list[tuple[int, int]] = []
        self.lost_event = threading.Event()

    def hello(self, worker, attempt, meta):
        return {"double": 2 * meta["rows"], "worker": worker, "attempt": attempt}

    def next_work(self, worker, attempt, wait_s):
        if worker == 1:
            raise HopperRejected("worker 1 has no work in this test")
        return {"op": "train", "model": "c0"}, [np.arange(3, dtype="float32")]

    def result(self, worker, attempt, meta, arrays):
        raise RuntimeError("boom")

    def lost(self, worker, attempt):
        self.lost_calls.append((worker, attempt))
        self.lost_event.set()


@pytest.fixture
def hopper():
    handler, secret = RecordingHandler(), new_secret()
    server = HopperServer(handler, 2, secret, wait_s=0.5, handshake_timeout=2)
    host, port = server.start()
    try:
        yield server, handler, (host, port, secret)
    finally:
        server.stop()


@pytest.mark.timeout(30)
def test_requests_reach_the_handler_and_errors_come_back_as_hopper_errors(hopper):
    server, handler, (host, port, secret) = hopper
    with HopperClient(host, port, secret, 0, attempt=3, timeout=10) as client:
        assert client.hello({"rows": 21}) == {"double": 42, "worker": 0, "attempt": 3}
        work, arrays = client.next_work()
        assert work == {"op": "train", "model": "c0"}
        np.testing.assert_array_equal(arrays[0], [0, 1, 2])
        with pytest.raises(HopperError, match="internal error in the driver: RuntimeError: boom"):
            client.send_result({"model": "c0"}, arrays)
        assert client.hello({"rows": 1})["double"] == 2  # the connection survives a failed request
    with HopperClient(host, port, secret, 1, timeout=10) as client:
        with pytest.raises(HopperError, match="refused PULL: worker 1 has no work in this test"):
            client.next_work()
    assert server.bytes_received > 0 and server.bytes_sent > 0
    assert handler.lost_calls == []  # both said BYE


@pytest.mark.timeout(30)
def test_wrong_secret_and_worker_out_of_range_are_rejected(hopper):
    _, _, (host, port, secret) = hopper
    with pytest.raises(AuthenticationError, match="does not hold this search's secret"):
        HopperClient(host, port, new_secret(), 0, timeout=10).connect()
    with pytest.raises(AuthenticationError, match="out of range"):
        HopperClient(host, port, secret, 2, timeout=10).connect()


@pytest.mark.timeout(30)
def test_a_task_that_vanishes_without_bye_is_reported_lost(hopper):
    server, handler, (host, port, secret) = hopper
    client = HopperClient(host, port, secret, 1, attempt=2, timeout=10).connect()
    client.hello({"rows": 1})
    client._sock.close()  # the task's process died: no BYE
    assert handler.lost_event.wait(10)
    assert handler.lost_calls == [(1, 2)]


@pytest.mark.timeout(30)
def test_stop_ends_every_thread_and_refuses_new_work():
    secret = new_secret()
    server = HopperServer(RecordingHandler(), 1, secret, wait_s=0.5)
    host, port = server.start()
    client = HopperClient(host, port, secret, 0, timeout=10).connect()
    client.hello({"rows": 1})
    server.stop()
    server.stop()  # idempotent
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(t.name.startswith("hopper-") for t in threading.enumerate()):
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("hopper-")]
    with pytest.raises(HopperError, match="Lost the connection"):
        client.next_work()
    with pytest.raises(HopperError, match="already started"):
        server.start()
