"""Faults around a fit: Ctrl-C, and many fits in one driver without leaks."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from conftest import digits_model
from trainer import ADAG, Trainer

pytestmark = pytest.mark.spark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(300)
def test_ctrl_c_cancels_the_job_and_frees_the_port(spark, digits):
    train, _ = digits
    port = _free_port()
    interrupted = {}

    def press_ctrl_c() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not spark.sparkContext.statusTracker().getActiveStageIds():
            time.sleep(0.2)
        time.sleep(3)  # let the workers connect and train
        assert _listening(port), "the parameter server should be serving during training"
        interrupted["at"] = time.monotonic()
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    helper = threading.Thread(target=press_ctrl_c, daemon=True)
    helper.start()
    with pytest.raises(KeyboardInterrupt):
        Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=500, ps_port=port,
                verbose=False).fit(train)
    returned = time.monotonic()
    helper.join()
    assert returned - interrupted["at"] < 30
    # The port is free at once: a new server can bind it.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    assert not [t for t in threading.enumerate() if t.name.startswith(("ps-", "trainer-"))]
    deadline = time.monotonic() + 30
    while spark.sparkContext.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not spark.sparkContext.statusTracker().getActiveJobsIds(), "the Spark job should be cancelled"


def _resources() -> tuple[int, int, int]:
    """(Python threads, open file descriptors, open sockets) of this driver process."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed while listing
            pass
    return threading.active_count(), len(targets), sum(t.startswith("socket:") for t in targets)


@pytest.mark.timeout(1200)
def test_twenty_fits_do_not_leak_threads_sockets_or_files(spark, digits):
    train, _ = digits
    small = train.limit(256).cache()
    small.count()

    def fit() -> None:
        Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=1, verbose=False).fit(small)

    fit()  # warm-up: Spark and Keras create their long-lived pools on first use
    fit()
    before = _resources()
    for _ in range(20):
        fit()
    after = _resources()
    assert after[0] <= before[0], f"threads grew from {before[0]} to {after[0]}"
    assert after[1] <= before[1] + 2, f"file descriptors grew from {before[1]} to {after[1]}"
    assert after[2] <= before[2] + 2, f"sockets grew from {before[2]} to {after[2]}"
