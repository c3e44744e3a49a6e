"""MLflow tracking against a real MLflow store (a local sqlite tracking URI): runs, parameters,
per-epoch metrics and the logged model read back with MlflowClient; model selection's child runs."""

from __future__ import annotations

import os

import numpy as np
import pytest

from conftest import digits_model
from trainer import ADAG, Trainer

mlflow = pytest.importorskip("mlflow")


def selection_model(params):
    """Defined here, not in conftest: executors get this module by value, conftest they cannot import."""
    import keras

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


EXPERIMENTS = ("trainer-fit", "trainer-selection", "jobs")


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """A sqlite MLflow store in a temporary folder; every experiment keeps its artifacts beside it."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    previous = mlflow.get_tracking_uri()
    # mlflow.set_experiment exports MLFLOW_EXPERIMENT_ID for child processes: a later test's subprocess (a doc
    # example, in the same xdist worker) then asked its own fresh store for experiment 2 and failed
    environment = {k: v for k, v in os.environ.items() if k.startswith("MLFLOW_")}
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    for name in EXPERIMENTS:  # a sqlite store's default artifact root is ./mlruns in the working directory
        client.create_experiment(name, artifact_location=(root / "artifacts" / name).as_uri())
    yield client
    mlflow.set_tracking_uri(previous)
    for name in [k for k in os.environ if k.startswith("MLFLOW_")]:
        del os.environ[name]
    os.environ.update(environment)


def test_a_fit_names_the_run_it_starts_after_its_algorithm_and_leaves_an_active_run_s_name(tracking):
    from trainer.tracking import RunLogger

    mlflow.set_experiment("trainer-fit")
    with RunLogger(run_name="trainer x2") as started:
        started.rename("trainer localsgd x2")  # what drive_fit does once the algorithm is chosen
    assert tracking.get_run(started.run_id).info.run_name == "trainer localsgd x2"
    with mlflow.start_run(run_name="mine") as active, RunLogger(run_name="trainer x2") as joined:
        joined.rename("trainer localsgd x2")
    assert joined.run_id == active.info.run_id and tracking.get_run(active.info.run_id).info.run_name == "mine"


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_a_fit_logs_params_epoch_metrics_and_the_model(digits, tracking):
    train, test = digits
    mlflow.set_experiment("trainer-fit")
    with mlflow.start_run() as active:  # the fit logs into the active run
        fitted = Trainer(digits_model(), algorithm=ADAG(window=6), num_workers=2, batch_size=32, epochs=2,
                         verbose=False, mlflow=True).fit(train, validation=test)
    run = tracking.get_run(active.info.run_id)
    params = run.data.params
    assert (params["algorithm"], params["num_workers"], params["batch_size"], params["window"]) == ("adag", "2",
                                                                                                    "32", "6")
    assert float(params["learning_rate"]) == pytest.approx(0.01)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "epoch_time_s", "updates", "bytes", "staleness"):
        history = tracking.get_metric_history(run.info.run_id, key)
        assert [m.step for m in history] == [0, 1], key
    val_loss = [m.value for m in tracking.get_metric_history(run.info.run_id, "val_loss")]
    assert val_loss == pytest.approx([e["val_loss"] for e in fitted.history.epochs])
    models = tracking.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert len(models) == 1 and models[0].source_run_id == run.info.run_id
    loaded = mlflow.pyfunc.load_model(models[0].model_uri)
    assert list(loaded.metadata.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 64]
    x = np.array([r.features for r in test.limit(8).collect()], np.float32)
    np.testing.assert_allclose(loaded.predict(x), fitted.keras_model.predict(x, verbose=0), atol=1e-5)


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_model_selection_logs_a_parent_run_and_one_child_run_per_configuration(digits, tracking):
    from trainer.selection import GridSearch, ModelSelector, choice

    train, test = digits
    experiment = mlflow.set_experiment("trainer-selection")
    search = GridSearch({"lr": choice([0.003, 0.03])}, epochs=2, batch_size=64, metric="val_accuracy")
    result = ModelSelector(selection_model, search, num_workers=2, verbose=False, mlflow=True).fit(train, validation=test)
    runs = tracking.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and parents[0].data.params["best_config"] == result.best_config.id
    assert sorted(c.data.params["config_id"] for c in children) == sorted(c.id for c in result.configs)
    for child in children:
        cid = child.data.params["config_id"]
        values = [m.value for m in tracking.get_metric_history(child.info.run_id, "val_accuracy")]
        assert values == pytest.approx(result.curves("val_accuracy")[cid])
        assert child.info.status == "FINISHED"
    assert tracking.search_logged_models(experiment_ids=[experiment.experiment_id])


@pytest.mark.timeout(120)
def test_a_job_logs_its_speedup_rows(tracking):
    import argparse

    from trainer_jobs.support.mlflow_results import log_results

    rows = [{"model": "cnn", "workers": 1, "epoch_time_s": 10.0, "speedup": 1.0},
            {"model": "cnn", "workers": 2, "epoch_time_s": 5.2, "speedup": 1.92, "note": "text"}]
    mlflow.set_experiment("jobs")
    run_id = log_results("mnist", argparse.Namespace(workers="1,2", epochs=2), rows)
    run = tracking.get_run(run_id)
    assert run.data.params["workers"] == "1,2"
    assert run.data.metrics["cnn.2w.speedup"] == pytest.approx(1.92)
    assert run.data.metrics["cnn.1w.epoch_time_s"] == pytest.approx(10.0)
