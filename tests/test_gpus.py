"""GPUs per fit: the stage's ResourceProfile, the checks before a fit, and the scheduling path on fake GPUs.

No GPU is needed: ``LocalCluster(worker_resources={"gpu": 1})`` gives each
worker a discovery script that announces one address ("0", "1"), so Spark
schedules GPUs as on a real cluster while TensorFlow (CPU build) ignores
``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import digits_model
from trainer import ClusterCapacityError, Trainer
from trainer.selection import GridSearch, ModelSelector, choice
from trainer.spark.resources import check_worker_resources, worker_resource_opts


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_gpus_per_worker_must_be_an_int_at_least_0(bad):
    with pytest.raises(ValueError, match=r"gpus_per_worker.*Received: gpus_per_worker="):
        Trainer(digits_model, gpus_per_worker=bad)
    with pytest.raises(ValueError, match=r"gpus_per_worker"):
        ModelSelector(lambda p: None, GridSearch({"a": choice([1])}, epochs=1, metric="loss"), gpus_per_worker=bad)


def test_fake_gpu_discovery_scripts_give_each_worker_its_own_addresses(tmp_path):
    announced = []
    for worker in range(2):
        opts = worker_resource_opts({"gpu": 2}, worker, tmp_path)
        assert "-Dspark.worker.resource.gpu.amount=2" in opts
        script = opts.split("-Dspark.worker.resource.gpu.discoveryScript=")[1].split()[0]
        reply = json.loads(subprocess.run([script], capture_output=True, text=True, check=True).stdout)
        assert reply["name"] == "gpu"
        announced.append(reply["addresses"])
    assert announced == [["0", "1"], ["2", "3"]]
    with pytest.raises(ValueError, match="worker_resources"):
        check_worker_resources({"gpu": 0})


@pytest.mark.spark
@pytest.mark.timeout(120)
def test_fit_with_gpus_fails_before_any_job_when_the_cluster_offers_no_gpu(spark, digits):
    train, _ = digits
    started = time.monotonic()
    with pytest.raises(ClusterCapacityError, match=r"spark\.executor\.resource\.gpu\.amount=unset.*Fix"):
        Trainer(digits_model, num_workers=2, gpus_per_worker=1, verbose=False).fit(train)
    with pytest.raises(ClusterCapacityError, match=r"spark\.executor\.resource\.gpu\.amount"):
        ModelSelector(lambda p: digits_model(), GridSearch({"a": choice([1])}, epochs=1, metric="loss"),
                      gpus_per_worker=1, verbose=False).fit(train)
    assert time.monotonic() - started < 60


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fit_and_selection_gpu_tasks_get_distinct_devices_and_set_them_visible(drivers_script):
    """tests/gpu_client.py's fit and selection with ``gpus_per_worker=1`` on the drivers cluster's fake-GPU
    workers, run in the custom-object script's driver (conftest's ``drivers_script``)."""
    seen = drivers_script["gpus"]
    for run in ("fit", "select"):
        tasks = seen[run]
        assert len(tasks) == 2, tasks
        # Each worker announced one address ("0", "1" or "2"); a task asking one GPU gets one, no two the same.
        gpus = [g for t in tasks for g in t["gpus"]]
        assert len(gpus) == 2 == len(set(gpus)) and set(gpus) <= {"0", "1", "2"}, tasks
        for task in tasks:
            assert len(task["gpus"]) == 1
            assert task["visible_devices"] == ",".join(task["gpus"]), task
    # The fit (local SGD, the default for workers on GPUs) found that its tasks share no GPU ("host:0", "host:1"):
    # its group may take NCCL on real GPUs.
    assert [t["shared_gpu"] for t in seen["fit"]] == [False, False]
