"""Shared pytest fixtures.

Spark fixtures start a real standalone cluster (``trainer.cluster.LocalCluster``)
once per test session; tests that use them are marked ``@pytest.mark.spark``.
Spark allows one SparkContext per process, so every test that needs Spark in
this process should use the ``spark`` fixture rather than build its own session.
"""

from __future__ import annotations

import pytest

from trainer.cluster import LocalCluster


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
def spark(local_cluster_2):
    """SparkSession on ``local_cluster_2`` with both executors registered."""
    session = local_cluster_2.session("tests")
    try:
        yield session
    finally:
        session.stop()
