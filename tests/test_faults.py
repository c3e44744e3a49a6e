"""Faults around a fit: Ctrl-C, leaks over many fits, lost executors and workers, a killed driver.

The 3-worker tests run their drivers in separate processes (tests/fault_driver.py)
against the session's drivers cluster (conftest.py), and compare the final
accuracy of a disturbed run with an undisturbed one, trained once by the first
driver that needs it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import digits_model
from spark_processes import executor_pids
from trainer import ADAG, Trainer
from trainer.fit.checkpoints import load_checkpoint

pytestmark = pytest.mark.spark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _our_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive() and t.name.startswith(("ps-", "trainer-"))]


def _interrupt_when(condition, timeout: float = 300) -> threading.Thread:
    """Send Ctrl-C (SIGINT) to the main thread once `condition()` is true."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if condition():
                    break
            except Exception:  # e.g. the checkpoint file does not exist yet
                pass
            time.sleep(0.05)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # also on timeout: never hang

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(900)
def test_ctrl_c_frees_everything_at_once_and_the_run_resumes_from_its_checkpoint(spark, digits, tmp_path):
    """Ctrl-C mid-run: fit raises KeyboardInterrupt at once, the server's port is free, its threads and the
    Spark job end, and the final save keeps the epochs done; a second fit resumes from there."""
    train, test = digits
    port = _free_port()
    serving: dict = {}

    def trainer(epochs: int, **options) -> Trainer:
        return Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=epochs,
                       checkpoint_dir=tmp_path, checkpoint_every=10, verbose=False, **options)

    def two_epochs_saved() -> bool:
        if load_checkpoint(tmp_path).completed_epochs >= 2:
            serving["listening"] = _listening(port)
            serving["at"] = time.monotonic()
            return True
        return False

    # Far more epochs than needed, so that Ctrl-C always lands mid-run, however fast the machine.
    watcher = _interrupt_when(two_epochs_saved)
    with pytest.raises(KeyboardInterrupt):
        trainer(500, ps_port=port).fit(train)
    returned = time.monotonic()
    watcher.join()
    assert serving.get("listening"), "the parameter server should be serving during training"
    assert returned - serving["at"] < 30  # at once: the 498 epochs left would take many minutes
    # The port is free at once: a new server can bind it.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _our_threads():
        time.sleep(0.2)
    assert not _our_threads(), "parameter-server and Spark-job threads must end with fit"
    deadline = time.monotonic() + 30
    while spark.sparkContext.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not spark.sparkContext.statusTracker().getActiveJobsIds(), "the Spark job should be cancelled"

    saved = load_checkpoint(tmp_path)
    assert 2 <= saved.completed_epochs < 500, "the interrupt came after two epochs and the final save keeps them"
    total = saved.completed_epochs + 4
    fitted = trainer(total).fit(train, resume_from=tmp_path)
    assert {w["start_epoch"] for w in fitted.history.workers} == {saved.completed_epochs}
    assert len(fitted.history.epochs) == 4
    assert any(e.get("event") == "resumed" for e in fitted.history.events)
    assert load_checkpoint(tmp_path).completed_epochs == total
    assert fitted.evaluate(test)["accuracy"] >= 0.88


def _resources() -> tuple[int, int, int]:
    """(Python threads, open file descriptors, open sockets) of this driver process."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed while listing
            pass
    return threading.active_count(), len(targets), sum(t.startswith("socket:") for t in targets)


@pytest.mark.timeout(900)
def test_repeated_fits_do_not_leak_threads_sockets_or_files(spark, digits):
    """Once Spark's and Keras's long-lived pools exist (two fits), more fits leave the counts where they were:
    a leak of one thread, socket or file per fit would show as 6 over the 6 fits (the bound allows 2)."""
    train, _ = digits
    small = train.limit(256).cache()
    small.count()

    def fit() -> None:
        Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=1, verbose=False).fit(small)

    fit()  # warm-up: Spark and Keras create their long-lived pools on first use
    fit()
    before = _resources()
    for _ in range(6):
        fit()
    after = _resources()
    assert after[0] <= before[0], f"threads grew from {before[0]} to {after[0]}"
    assert after[1] <= before[1] + 2, f"file descriptors grew from {before[1]} to {after[1]}"
    assert after[2] <= before[2] + 2, f"sockets grew from {before[2]} to {after[2]}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("feed", [pytest.param("memory", marks=pytest.mark.core), "stream"])
def test_training_survives_a_killed_executor(local_cluster_2, spark, digits, feed):
    """Kill one executor JVM mid-training: the stage is re-run on the restarted executor and
    the workers resume from the server's weights, not from scratch; with the shard in memory
    or streamed from a spill file (the out-of-core path). The matrix's cells (``core``) take the shard in memory:
    what differs by Spark, Keras and NumPy version is the retry, not where the shard lives."""
    train, test = digits
    executors = executor_pids(local_cluster_2, spark.sparkContext.applicationId)
    assert len(executors) == 2
    updates = []

    def both_past_epoch_one() -> bool:
        # Both workers must have finished epochs 0 and 1: counting commits alone lets a worker that
        # started late still be in epoch 0 when the executor dies, and then resuming starts at 0.
        reached = {}
        for record in list(updates):
            reached[record.worker] = max(reached.get(record.worker, 0), record.epoch or 0)
        return len(reached) == 2 and min(reached.values()) >= 2

    killed = threading.Event()

    def kill_one() -> None:
        deadline = time.monotonic() + 300
        while not both_past_epoch_one() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(executors[0], signal.SIGKILL)
        killed.set()

    def slow_server(record) -> None:
        # Twelve epochs of digits train in half a second, less than two tasks' start-up can differ by
        # (a cold executor importing TensorFlow): until the kill, every commit waits on the server, so
        # that both tasks are still training when it comes.
        updates.append(record)
        if not killed.is_set():
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    fitted = Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=12, verbose=False,
                     max_retries=2, on_update=slow_server, feed=feed).fit(train)
    killer.join()
    failures = [e for e in fitted.history.events if e.get("event") == "attempt_failed"]
    assert failures and failures[0]["retry"], fitted.history.events
    retried = [w for w in fitted.history.workers if w["attempt"] == 1]
    assert len(retried) == 2 and all(w["start_epoch"] >= 1 for w in retried), "resumed, not restarted"
    assert {w["feed"] for w in fitted.history.workers} == {feed}
    assert fitted.evaluate(test)["accuracy"] >= 0.88


# --- drivers in their own processes, on the session's 3-worker drivers cluster ------------------------------

DRIVER = Path(__file__).with_name("fault_driver.py")
ACCURACY_BAND = 0.005  # half a point of test accuracy


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> Path:
    """Where the undisturbed run's result is written: by the first of this module's drivers that needs it
    (`_baseline_args`), so that it is trained once per session."""
    return tmp_path_factory.mktemp("undisturbed") / "undisturbed.json"


def _baseline_args(path: Path) -> list[str]:
    """The driver's flags to train the undisturbed run first, unless an earlier driver did."""
    return [] if path.is_file() else ["--baseline-out", str(path)]


def _start_driver(cluster, out: Path, *args: str) -> subprocess.Popen:
    log = open(out.with_suffix(".log"), "w")
    return subprocess.Popen(
        [sys.executable, str(DRIVER), "--master", cluster.master_url, "--out", str(out), *args],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=DRIVER.parent.parent,
    )


def _finish(proc: subprocess.Popen, out: Path, timeout: float = 600) -> dict:
    try:
        rc = proc.wait(timeout)
    finally:
        _kill_group(proc)
    log = out.with_suffix(".log").read_text()
    assert rc == 0, f"driver exited with {rc}:\n{log[-6000:]}"
    return json.loads(out.read_text())


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and everything in its process group (its Py4J JVM)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _undisturbed(path: Path) -> dict:
    result = json.loads(path.read_text())
    assert result["accuracy"] > 0.85 and not result["events"], result
    return result


@pytest.mark.timeout(900)
def test_killed_driver_resumes_from_its_checkpoint(drivers_cluster, undisturbed, tmp_path):
    """SIGKILL the whole driver (Python + its JVM) mid-run, start a new one with --resume."""
    checkpoints = tmp_path / "checkpoints"
    first = _start_driver(drivers_cluster, tmp_path / "killed.json", "--checkpoint-dir", str(checkpoints),
                          *_baseline_args(undisturbed))
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and first.poll() is None:
            try:
                if load_checkpoint(checkpoints).completed_epochs >= 2:
                    break
            except Exception:  # not written yet
                pass
            time.sleep(0.1)
        assert first.poll() is None, "the driver ended before it could be killed:\n" + \
            (tmp_path / "killed.log").read_text()[-4000:]
    finally:
        _kill_group(first)
    saved = load_checkpoint(checkpoints)
    baseline = _undisturbed(undisturbed)
    assert 2 <= saved.completed_epochs < 12
    # The cluster notices the lost driver and frees its executors for the next one.
    resumed = _finish(_start_driver(drivers_cluster, tmp_path / "resumed.json", "--checkpoint-dir",
                                    str(checkpoints), "--resume"), tmp_path / "resumed.json")
    assert any(e.get("event") == "resumed" for e in resumed["events"]), resumed["events"]
    assert {w["start_epoch"] for w in resumed["workers"]} == {saved.completed_epochs}
    assert resumed["epochs"] == list(range(saved.completed_epochs, 12))
    assert load_checkpoint(checkpoints).completed_epochs == 12
    assert abs(resumed["accuracy"] - baseline["accuracy"]) <= ACCURACY_BAND, (resumed, baseline)


@pytest.mark.kills_a_worker
@pytest.mark.timeout(900)
def test_killed_worker_training_continues_on_the_survivors(drivers_cluster, undisturbed, tmp_path):
    """SIGKILL a worker daemon with its executor and Python workers (a lost machine) mid-run.

    Marked ``kills_a_worker``: it runs after every other test that uses the drivers cluster, which keeps
    two workers afterwards.
    """
    victim = drivers_cluster.process_groups()[0]  # workers come first
    out = tmp_path / "result.json"
    result = _finish(_start_driver(drivers_cluster, out, "--kill-pgid", str(victim), "--kill-at-epoch", "3",
                                   *_baseline_args(undisturbed)), out)
    baseline = _undisturbed(undisturbed)
    assert result["killed"]
    events = result["events"]
    failed = [e for e in events if e.get("event") == "attempt_failed"]
    assert failed and failed[0]["retry"], events
    assert any(e.get("event") == "workers_changed" and e["from"] == 3 and e["to"] == 2 for e in events), events
    retried = [w for w in result["workers"] if w["attempt"] == 1]
    assert len(retried) == 2, result["workers"]
    assert all(w["start_epoch"] >= 3 for w in retried), "resumed from the server's weights, not from scratch"
    assert sum(w["rows"] for w in retried) == 12_000, "the survivors share all rows"
    assert abs(result["accuracy"] - baseline["accuracy"]) <= ACCURACY_BAND, (result, baseline)
