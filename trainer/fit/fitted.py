"""What ``Trainer.fit`` returns: the trained model, its history, and inference on DataFrames.

`FittedModel.transform` and `evaluate` run on the executors: the model travels
once as ``.keras`` bytes with the custom objects it needs (shipped by value,
``trainer.runtime.shipping.pack_model``) and is loaded once per Python worker
(``trainer.runtime.shipping.cached_model``); an error there is raised at once
(``trainer.runtime.inference``). `FittedModel.save` writes one ``.keras``
file that ``keras.saving.load_model`` reads (the trainer's own entries ride
along inside it) or a directory; `FittedModel.load` reads both.

`TrainingHistory` records what happened during ``fit`` (server updates,
workers, epochs, events, timings): exact totals over every update, and the
most recent updates in compact numpy columns, so that a long fit keeps a
small memory.
"""

from __future__ import annotations

import json
import os
import pickle
import uuid
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pyspark import cloudpickle

from trainer.data.checks import DataSpec, feature_column, model_io, prepare_frame, resolve_input_shape
from trainer.data.validation import weighted_metrics
from trainer.errors import TaskFailedError
from trainer.runtime.inference import OUTCOME_DDL, evaluate_task, predict_function, probe_model, weighted_outcomes
from trainer.runtime.shipping import ModelPackage, pack_model

CUSTOM_OBJECTS_FILE = "custom_objects.cloudpickle"
SAVED_ENTRIES = ("fitted.json", "history.json", CUSTOM_OBJECTS_FILE)  # what `save` writes besides the model
KERAS_SUFFIX = ".keras"
#: The folder of a saved ``.keras`` file that holds `SAVED_ENTRIES`. Keras's loader (3.0 to 3.15) reads
#: config.json, metadata.json, model.weights.h5 and assets/ by name and ignores other entries.
ENTRY_PREFIX = "spark_keras_trainer/"


@dataclass
class TrainingHistory:
    """What happened during `fit`.

    Attributes:
        update_log: the most recent parameter-server updates (at most the
            Trainer's `history_size`), one column per field: time, worker,
            version, staleness, bytes_in, bytes_out, epoch, step, loss, kind
            (epoch and step -1, loss NaN where the worker sent none).
            `updates` gives them as one dict each, `to_frame()` as a DataFrame.
        update_totals: exact figures over every update of the fit: updates,
            bytes_in, bytes_out, staleness_mean, staleness_max, per_worker,
            per_kind, kept, dropped.
        workers: one dict per worker task (rows, commits, comm_s, bytes_sent,
            bytes_received, timings, per-epoch logs); retried tasks appear once
            per attempt. A parameter-server task's timings: ``task_start``,
            ``data_ready``, ``model_built`` and ``first_step_end`` (its first
            step done; in a new process, that step's compile with it).
        epochs: per epoch: wall time over all workers, batches trained by
            all workers, the mean of the workers' Keras logs (loss, metrics)
            and, with validation data, the validation metrics of the center
            model (``val_loss``, ...; weighted by each worker's validation
            rows, ``val_rows`` in all).
        events: notable events (retries, server-side rejections).
        timings: wall_s, data_delivery_s, model_build_s, train_s, epoch_s.
        backend: the Keras backend the workers trained with (the driver's,
            ``KERAS_BACKEND``); each worker's record has it too, with its cores.
        choice: with no algorithm named (``algorithm="auto"``): the algorithm chosen, the
            reason, the facts it went by and what the tasks measured (local SGD's
            period, one average's and one step's time); empty for a named algorithm.
        membership: an elastic fit's (``num_workers=(min, max)``) joins and
            leaves, oldest first: ``{"time", "event": "joined" | "left", "worker"``
            (``host:pid``) ``, "epoch", "step"`` (the server's version) ``,
            "workers_before", "workers_after", "why"}``, a join with the process's
            ``ready_s`` (start to model built). Its `workers` are then the
            chunk tasks' records (``chunk``, ``epoch``, ``member``,
            ``skipped_batches``, ``trained_rows``); empty for a fixed fit.
    """

    algorithm: str
    num_workers: int
    backend: str = ""
    update_log: dict[str, Any] = field(default_factory=dict)
    update_totals: dict[str, Any] = field(default_factory=dict)
    workers: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    # an automatic algorithm: what was chosen, why, what was measured
    choice: dict[str, Any] = field(default_factory=dict)
    # an elastic fit: every join and leave of a worker
    membership: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.update_log = {k: np.asarray(v) for k, v in self.update_log.items()}
        per_worker = self.update_totals.get("per_worker")
        if per_worker:  # JSON turns the worker indices into strings
            self.update_totals["per_worker"] = {int(k): v for k, v in per_worker.items()}

    @property
    def updates(self) -> list[dict]:
        """The kept updates, oldest first, one dict each (built on every access: prefer `to_frame`)."""
        columns = self.update_log
        n = len(next(iter(columns.values()))) if columns else 0
        rows = [{k: v[i].item() for k, v in columns.items()} for i in range(n)]
        for row in rows:
            for key in ("epoch", "step"):
                if row.get(key) == -1:
                    row[key] = None
            if row.get("loss") is not None and row["loss"] != row["loss"]:
                row["loss"] = None
        return rows

    @property
    def num_updates(self) -> int:
        """Every update of the fit (also those no longer kept in `update_log`)."""
        return int(self.update_totals.get("updates", 0))

    @property
    def bytes_moved(self) -> int:
        """Bytes of every COMMIT and its reply."""
        return int(self.update_totals.get("bytes_in", 0)) + int(self.update_totals.get("bytes_out", 0))

    @property
    def loss(self) -> list[float]:
        """Mean training loss of the workers at the end of each epoch."""
        return [e.get("loss", float("nan")) for e in self.epochs]

    def to_frame(self):
        """Parameter-server updates as a pandas DataFrame."""
        import pandas as pd  # deferred: only this function needs it

        return pd.DataFrame(self.update_log)

    def to_dict(self) -> dict:
        """Plain JSON-able data (the update columns as lists)."""
        data = asdict(self)
        data["update_log"] = {k: np.asarray(v).tolist() for k, v in self.update_log.items()}
        return data

    @classmethod
    def build(cls, algorithm: str, num_workers: int, ps, workers: list[dict], job_start: float,
              job_end: float, events: list[dict]) -> "TrainingHistory":
        """The history of one fit: `algorithm` described, the server `ps` (its update history and events), the
        workers' records of every attempt, the stage's start and end times and the driver's events."""
        final = [w for w in workers if w["attempt"] == max(x["attempt"] for x in workers)]
        epochs = []
        for epoch in sorted({e["epoch"] for w in final for e in w["epochs"] if "end" in e}):
            parts = [e for w in final for e in w["epochs"] if e["epoch"] == epoch and "end" in e]
            entry = {"epoch": epoch, "time_s": max(p["end"] for p in parts) - min(p["start"] for p in parts),
                     "batches": sum(p.get("batches", 0) for p in parts)}
            entry.update(weighted_metrics([p["logs"] for p in parts]))
            epochs.append(entry)
        first = [w for w in workers if w["attempt"] == 0] or workers
        timings = {
            "wall_s": job_end - job_start,
            "data_delivery_s": max(w["data_ready"] for w in first) - job_start,
            "model_build_s": max(w["model_built"] - w["data_ready"] for w in first),
            "train_s": max(w["train_s"] for w in final),
            "epoch_s": float(np.mean([e["time_s"] for e in epochs])) if epochs else float("nan"),
        }
        if workers and "chunk" in workers[0]:  # an elastic fit's chunk tasks: a task's delivery, a process's build
            timings.update(data_delivery_s=float(np.mean([w["data_ready"] - w["task_start"] for w in workers])),
                           model_build_s=max(w["ready_s"] for w in workers),
                           train_s=float(sum(e["time_s"] for e in epochs)))
        update_log, update_totals = ps.update_history()
        return cls(
            algorithm=algorithm, num_workers=num_workers, backend=final[0].get("backend", "") if final else "",
            update_log=update_log, update_totals=update_totals,
            workers=sorted(workers, key=lambda w: (w["attempt"], w.get("epoch", 0), w["worker"])),
            epochs=epochs, events=list(ps.events) + events, timings=timings,
        )


class FittedModel:
    """A trained model: the Keras model, its `TrainingHistory`, and distributed inference."""

    def __init__(self, keras_model, history: TrainingHistory, features_col, label_col, spec: DataSpec,
                 custom_objects=None) -> None:
        self.keras_model = keras_model
        self.history = history
        self.features_col = features_col
        self.label_col = label_col
        self.spec = spec
        self.custom_objects = custom_objects
        self._package: ModelPackage | None = None
        self._probed = False
        self._key = uuid.uuid4().hex

    def _shipped(self) -> ModelPackage:
        """The model's ``.keras`` bytes and every custom object they need, made once."""
        if self._package is None:
            optimizer = getattr(self.keras_model, "optimizer", None)
            if optimizer is not None and not optimizer.built:  # saved unbuilt, it would warn on every load
                optimizer.build(self.keras_model.trainable_variables)
            self._package = pack_model(self.keras_model, self.custom_objects)
        return self._package

    def transform(self, df, output_col: str = "prediction", batch_size: int = 1024):
        """Return `df` with `output_col` added: the model's outputs for every row.

        Runs on the executors (``predict_batch_udf``; the model is loaded once per
        Python worker). Multi-unit outputs become array<float>, single-unit ones float.
        """
        import keras  # deferred: TensorFlow starts only when a model is needed
        from pyspark.ml.functions import predict_batch_udf
        from pyspark.sql import types as T

        input_shape, units, _ = model_io(self.keras_model)
        shape = list(resolve_input_shape(input_shape, self.spec.feature_size))
        package, backend = self._shipped(), keras.backend.backend()
        if not self._probed:  # a user error here surfaces now, not after Spark's task retries
            error = probe_model(df.sparkSession, package, self._key, backend, tuple(shape))
            if error is not None:
                raise TaskFailedError(f"The model cannot run on the executors: {error}")
            self._probed = True
        make_predict_fn = predict_function(package, self._key, backend, scalar=units == 1)
        return_type = T.FloatType() if units == 1 else T.ArrayType(T.FloatType())
        udf = predict_batch_udf(make_predict_fn, return_type=return_type, batch_size=batch_size,
                                input_tensor_shapes=[shape])
        return df.withColumn(output_col, udf(feature_column(df, self.features_col)))

    def evaluate(self, df, batch_size: int = 1024) -> dict[str, float]:
        """Loss and compiled metrics on `df`, computed on the executors.

        Each partition is evaluated with ``model.evaluate``; results are averaged
        weighted by row count, which is exact for loss, accuracy, MAE, MSE and any
        other per-sample mean, and approximate for metrics such as AUC.
        """
        import keras  # deferred: TensorFlow starts only when a model is needed

        frame, spec = prepare_frame(df, self.features_col, self.label_col, self.keras_model)
        task = evaluate_task(self._shipped(), self._key, keras.backend.backend(), spec.input_shape, spec.label_size,
                             batch_size)
        metrics, error = weighted_outcomes(frame.mapInArrow(task, OUTCOME_DDL).collect())
        if error is not None:
            raise TaskFailedError(f"evaluate failed on an executor: {error}")
        return metrics

    def save(self, path: str | os.PathLike) -> Path:
        """Save the fitted model: one ``.keras`` file when `path` ends in ``.keras``, else a directory.

        Example:
            >>> fitted.save("model.keras")
            >>> keras.saving.load_model("model.keras", custom_objects={"Scale": Scale})  # a Keras model
            >>> FittedModel.load("model.keras")  # the FittedModel, custom objects included

        A ``.keras`` path gets the file ``model.save`` writes, which Keras's
        ``load_model`` reads as usual (with ``custom_objects=`` for a model that
        has custom objects), plus entries under ``spark_keras_trainer/`` that
        Keras's loader ignores: ``history.json``, ``fitted.json`` (columns and
        data spec) and the model's custom objects by value
        (``custom_objects.cloudpickle``, for `load`). The file is written next to
        its place and then renamed, so a failed save leaves no half-written file.
        Any other path becomes a directory holding ``model.keras`` and those three
        files.

        The optimizer saved is the driver model's, built for the model's trainable
        variables: the center of a fit holds no optimizer state (each worker keeps
        its own), so it has the state the workers started from (fresh moments and
        iteration 0, which keep Adam's bias correction right, unless the model
        given to ``fit`` had trained before) and the learning rate as the fit left
        it (ReduceLROnPlateau). With ``SyncAveraging(average_optimizer_state=True)``
        the center holds the workers' averaged optimizer variables, and those are
        saved. Either way a loaded model loads without optimizer warnings and can
        go on training at once.

        Args:
            path: String or path-like. Ending in ``.keras``: the file to write
                (its folder is created); else the directory to write into.

        Returns:
            The `Path` written.

        Raises:
            IsADirectoryError: `path` ends in ``.keras`` and is an existing directory.
            NotADirectoryError: `path` does not end in ``.keras`` and is an existing file.
        """
        out = Path(path)
        keras_file = out.suffix == KERAS_SUFFIX
        if keras_file and out.is_dir():
            raise IsADirectoryError(
                f"fitted.save writes ONE file for a path ending in {KERAS_SUFFIX}, but it is an existing directory. "
                f"Received: path={str(out)!r}. Fix: remove that "
                f"directory, or save to another {KERAS_SUFFIX} path; a path without the suffix is saved as a directory."
            )
        if not keras_file and out.is_file():
            raise NotADirectoryError(
                f"fitted.save writes a directory for a path without the {KERAS_SUFFIX} suffix, but it is an existing "
                f"file. Received: path={str(out)!r}. Fix: a path ending in {KERAS_SUFFIX} for one file, or another "
                "directory."
            )
        package = self._shipped()
        entries = {"history.json": json.dumps(self.history.to_dict(), default=float).encode(),
                   "fitted.json": json.dumps({"features_col": self.features_col, "label_col": self.label_col,
                                              "spec": asdict(self.spec)}).encode()}
        if package.custom_objects:
            entries[CUSTOM_OBJECTS_FILE] = cloudpickle.dumps(package.custom_objects)
        if keras_file:
            _write_keras_file(out, package.data, entries)
            return out
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.keras").write_bytes(package.data)
        for name, data in entries.items():
            (out / name).write_bytes(data)
        return out

    @classmethod
    def load(cls, path: str | os.PathLike, custom_objects=None) -> "FittedModel":
        """Read what `save` wrote: a ``.keras`` file or a directory.

        The custom objects come back by value (so a model whose layers were
        defined in a notebook loads anywhere): unpickling runs their code, so load
        only files you trust. `custom_objects` given here take precedence.

        Raises:
            FileNotFoundError: nothing at `path`.
            ValueError: `path` was not written by `save` (a ``.keras`` file of
                ``model.save``, another file, a directory without ``fitted.json``).
        """
        import keras  # deferred: TensorFlow starts only when a model is needed

        src = Path(path)
        if src.is_dir():
            entries = {p.name: p.read_bytes() for p in src.iterdir() if p.name in SAVED_ENTRIES and p.is_file()}
            model_file = src / "model.keras"
        elif src.is_file():
            entries, model_file = _read_keras_entries(src), src
        else:
            raise FileNotFoundError(f"No saved FittedModel at {str(src)!r}. Fix: the path that fitted.save returned.")
        if "fitted.json" not in entries:
            raise ValueError(
                f"FittedModel.load reads what fitted.save wrote, with its fitted.json; this has none. Received: "
                f"path={str(src)!r}. Fix: keras.saving.load_model for a file of model.save, or the path that "
                "fitted.save returned."
            )
        meta = json.loads(entries["fitted.json"])
        spec = meta["spec"]
        spec = DataSpec(spec["num_rows"], spec["feature_size"], tuple(spec["input_shape"]), spec["label_size"])
        if CUSTOM_OBJECTS_FILE in entries:
            custom_objects = {**pickle.loads(entries[CUSTOM_OBJECTS_FILE]), **(custom_objects or {})}
        model = keras.saving.load_model(model_file, custom_objects=custom_objects)
        recorded = json.loads(entries["history.json"])
        recorded.pop("updates", None)  # written before the update history was bounded
        history = TrainingHistory(**recorded)
        return cls(model, history, meta["features_col"], meta["label_col"], spec, custom_objects)


def _write_keras_file(out: Path, model_data: bytes, entries: dict[str, bytes]) -> None:
    """The ``.keras`` bytes `model_data` with `entries` added under `ENTRY_PREFIX`, written to `out`
    through a temporary file in the same folder (renamed into place)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.partial")
    try:
        partial.write_bytes(model_data)
        with zipfile.ZipFile(partial, "a", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, data in entries.items():
                archive.writestr(ENTRY_PREFIX + name, data)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)


def _read_keras_entries(src: Path) -> dict[str, bytes]:
    """The entries `_write_keras_file` added to the ``.keras`` file `src`, by name."""
    if src.suffix != KERAS_SUFFIX or not zipfile.is_zipfile(src):
        raise ValueError(
            f"FittedModel.load reads a {KERAS_SUFFIX} file or a directory written by fitted.save; this file is "
            f"neither. Received: path={str(src)!r}. Fix: the path that fitted.save returned."
        )
    with zipfile.ZipFile(src) as archive:
        names = set(archive.namelist())
        return {name: archive.read(ENTRY_PREFIX + name) for name in SAVED_ENTRIES if ENTRY_PREFIX + name in names}
