"""Shared pytest fixtures.

Spark fixtures start real standalone clusters (``trainer.spark.local_cluster.LocalCluster``)
once per test session; tests that use them are marked ``@pytest.mark.spark``.
Spark allows one SparkContext per process, so every test that needs Spark in
this process should use the ``spark`` fixture rather than build its own session.

Driver programs that the tests start in processes of their own (the jobs, the
fault drivers, Spark Connect servers, the GPU and custom-object scripts) run
against ``drivers_cluster``, a second cluster shared by the whole session,
instead of a cluster each (its daemons, and the wait for them, once). It cannot
be the ``spark`` fixture's cluster: that
session holds all of its cores, and an application on a standalone master gets
no executor until another one frees its cores. Its drivers run one after the
other; a test that kills one of its workers is marked ``kills_a_worker`` and runs
after every other test of the session that uses it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trainer.process_env import prepare_process
from trainer.spark.local_cluster import LocalCluster

# The test process is a driver: quiet TensorFlow and GPU memory on demand, as a session sets them
# (`import trainer` no longer does; tests/test_verbosity.py checks that in a fresh process).
prepare_process()

# --------------------------------------------------------------------------- Spark


@pytest.fixture(scope="session")
def local_cluster_2():
    """A started LocalCluster with 2 workers x 1 core x 2g, stopped at the end of the session."""
    cluster = LocalCluster(workers=2, cores_per_worker=1, worker_memory="2g")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def drivers_cluster():
    """A started LocalCluster with 3 workers x 1 core x 2g, each announcing one fake GPU (address "0", "1" or
    "2"), for the driver processes the tests start (module docstring); stopped at the end of the session."""
    cluster = LocalCluster(workers=3, cores_per_worker=1, worker_memory="2g", worker_resources={"gpu": 1})
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def drivers_script(drivers_cluster, tmp_path_factory) -> dict:
    """What tests/custom_objects_script.py saw: one driver on ``drivers_cluster`` (executors of one GPU each)
    for the custom-object checks of tests/test_custom_objects.py and, under ``"gpus"``, the GPU checks of
    tests/test_gpus.py (tests/gpu_client.py), run once for both."""
    script = Path(__file__).with_name("custom_objects_script.py")
    out = tmp_path_factory.mktemp("drivers-script")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, str(script), str(out), drivers_cluster.master_url],
                          capture_output=True, text=True, timeout=560, cwd=out, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="session")
def spark(local_cluster_2):
    """SparkSession on ``local_cluster_2`` with both executors registered."""
    session = local_cluster_2.session("tests")
    try:
        yield session
    finally:
        session.stop()


# --------------------------------------------------------------------------- data and models


def digits_model(lr: float = 0.01):
    """A small compiled MLP for the 8x8 digits (64 inputs, 10 classes)."""
    import keras

    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(lr), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@pytest.fixture(scope="session")
def digits(spark):
    """sklearn digits as (train, test) DataFrames: 1,500 and 297 rows, features array<float>, label int."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    rows = [(x[i].tolist(), int(data.target[i]), bool(k < 1500)) for k, i in enumerate(order)]
    df = spark.createDataFrame(rows, "features array<float>, label int, train boolean").cache()
    train, test = df.filter("train").drop("train").cache(), df.filter("not train").drop("train").cache()
    assert train.count() == 1500 and test.count() == 297
    return train, test


# --------------------------------------------------------------------------- a full disk


@contextlib.contextmanager
def eight_workers_at_a_time():
    """Held by the tests that train 8 workers at once (the defaults batteries), in every pytest process of this
    checkout: make test's main run and its backend runs take it in turn. Two at once (the TensorFlow and torch
    all-reduce batteries, 16 training processes and their 16 Python workers) took 21 of this machine's 24 GiB."""
    import fcntl

    path = Path(__file__).resolve().parents[1] / "test-artifacts" / "eight-workers.lock"
    path.parent.mkdir(exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """``(directory, mounted)``: a directory where every file write fails with ENOSPC.

    As root it is a 16 KiB tmpfs filled up (the failure comes from the kernel);
    where mounting is not allowed, ``os.fsync`` raises OSError(ENOSPC) instead
    (``mounted`` is False then).
    """
    directory = tmp_path / "full"
    directory.mkdir()
    mounted = (os.geteuid() == 0 and shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,mode=0700", "tmpfs", str(directory)], capture_output=True,
    ).returncode == 0)
    try:
        if mounted:
            try:
                with open(directory / "filler", "wb") as fh:
                    fh.write(b"\0" * (1 << 20))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        else:
            def fsync_on_a_full_disk(fd):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(os, "fsync", fsync_on_a_full_disk)
        yield directory, mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(directory)], capture_output=True)


# --------------------------------------------------------------------------- order


#: Fixtures that start a Spark cluster: a test that uses one (directly or through another fixture) is marked
#: ``spark`` by `pytest_collection_modifyitems`, so that ``make test-quick`` (``-m "not spark and not docker"``)
#: never starts a cluster by accident.
SPARK_FIXTURES = {"local_cluster_2", "drivers_cluster", "spark"}


def xdist_group(item) -> str:
    """The pytest-xdist group of a test (``make test`` runs its main run on 2 workers, ``--dist loadgroup``):
    the tests of each session cluster together, so that each cluster starts once, in one worker; any other test
    with the rest of its file (a module's fixtures, such as the wheel or the doc examples, run once)."""
    names = set(getattr(item, "fixturenames", ()))
    if "drivers_cluster" in names:
        return "drivers-cluster"
    if names & {"local_cluster_2", "spark"}:
        return "session-cluster"
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (its hook adds them to the node ids)
def pytest_collection_modifyitems(config, items):
    """Mark ``spark`` every test that uses a Spark fixture, and give every test its xdist group
    (`xdist_group`); run the test that kills a worker of `drivers_cluster` after the others that use it, and
    the container tests last (CI builds the lab image in the background meanwhile)."""
    for item in items:
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("spark") is None:
            item.add_marker(pytest.mark.spark)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    items.sort(key=lambda item: (item.get_closest_marker("docker") is not None,
                                 item.get_closest_marker("kills_a_worker") is not None))


# --------------------------------------------------------------------------- where the time goes


ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
TIMELINE, FIXTURES = ARTIFACTS / "timeline.tsv", ARTIFACTS / "fixtures.tsv"


def _append(path: Path, *fields) -> None:
    """One short line per append: the processes of make test's streams do not interleave."""
    path.parent.mkdir(exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\t".join(map(str, fields)) + "\n")


def _stream() -> str:
    """The stream this pytest runs in (``TEST_STREAM``: main, jax, torch, matrix, containers; set by the Makefile
    and .ci/beside), read by tests/suite_time.py."""
    return os.environ.get("TEST_STREAM", "main")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Append each test's stream, pytest process (xdist worker and backend), xdist group, start and end (setup to
    teardown) to test-artifacts/timeline.tsv: where each stream spends its time, and where one waits."""
    start = time.time()
    yield
    process = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}:{os.environ.get('KERAS_BACKEND', 'tensorflow')}"
    _append(TIMELINE, _stream(), process, xdist_group(item), f"{start:.1f}", f"{time.time():.1f}", item.nodeid)


class FixtureTimes:
    """Appends each module- or session-scoped fixture's set-up (a cluster's start, a job run once for a module's
    checks) to test-artifacts/fixtures.tsv, apart from the tests that first asked for it. A plugin of its own: a
    session fixture is set up through the session's hooks, which a conftest below the rootdir is not part of."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.time()
        yield
        if fixturedef.scope in ("module", "session", "package"):
            _append(FIXTURES, _stream(), fixturedef.argname, fixturedef.scope, f"{start:.1f}", f"{time.time():.1f}")


def pytest_configure(config):
    config.pluginmanager.register(FixtureTimes(), "fixture-times")
