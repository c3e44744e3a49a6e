"""A fit's plan: everything checked and built before any cluster work, for every kind of fit.

`plan_fit` takes the `Trainer`, the kind of fit (``trainer.fit.kinds``, with
this fit's algorithm) and the user's arguments and returns a `FitPlan`: the
driver's model and the source the tasks rebuild it from, the
two-column frame (training rows, with the validation rows tagged into it),
its `DataSpec`, the weights to start from (a checkpoint's when resuming) and
the stage's resource profile. Every check that can fail does so here, before
a parameter server or a Spark job starts: the model (compiled, with a loss,
its optimizer built), the checkpoint (the same model), the columns and
values, the shards of the server. (The controller waits for the free task
slots, ``trainer.controller``.)
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

from trainer.algorithms import ADAG, Algorithm
from trainer.data.checks import DataSpec, model_io, prepare_frame
from trainer.data.validation import dealt_evenly, split_validation, tag_validation, validation_frame
from trainer.errors import CheckpointError
from trainer.fit.checkpoints import Checkpoint, load_checkpoint
from trainer.ps.layout import shard_layout
from trainer.runtime.shipping import ModelSource, pack_model, ship_by_value
from trainer.runtime.state import optimizer_of
from trainer.spark.cluster_facts import FitCluster

log = logging.getLogger("trainer")

@dataclass
class FitPlan:
    """What a fit decided before any training job: the model, the data and where to start from."""

    model: Any  # the driver's keras.Model; it receives the trained weights
    source: ModelSource
    frame: Any  # the two-column DataFrame the tasks read
    spec: DataSpec
    center: list
    version: int
    resumed: Checkpoint | None
    profile: Any = None  # the stage's ResourceProfile (GPUs per task), None for the session's defaults
    validation_rows: int = 0

    @property
    def completed_epochs(self) -> int:
        return self.resumed.completed_epochs if self.resumed is not None else 0


def warn_slow_choice(algorithm: Algorithm, model) -> None:
    """Warn where an explicit choice is known to learn far slower than plain Keras: ADAG at the learning rate
    of one Keras process (it divides every commit by its window)."""
    algorithm = getattr(algorithm, "inner", algorithm)  # a compressed algorithm wraps the delta algorithm
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(algorithm, ADAG) or optimizer is None:
        return
    try:
        rate = float(optimizer.learning_rate)
        default = float(type(optimizer)().learning_rate)
    except (TypeError, ValueError):  # a schedule, or an optimizer without defaults: no advice
        return
    if rate <= default:
        warnings.warn(
            f"ADAG divides every commit by its window ({algorithm.window}): at {type(optimizer).__name__}'s default "
            f"learning rate ({rate:g}), tuned for one Keras process, the center moves about 1/{algorithm.window} "
            "as far per batch and learns far slower than plain Keras. Fix: raise the learning rate about "
            f"{algorithm.window}x, or leave `algorithm` out (the default learns like plain Keras, docs/algorithms.md).",
            UserWarning, stacklevel=5,  # the user's call of fit (through plan_fit, drive_fit, Trainer.fit)
        )


def driver_model(model_or_builder, custom_objects) -> tuple[Any, ModelSource]:
    """The driver's keras.Model and the source every task rebuilds it from (checked: compiled, optimizer built)."""
    import keras  # deferred: the backend starts only when a fit does

    if isinstance(model_or_builder, keras.Model):
        model_io(model_or_builder)  # compiled, with a loss: a DataValidationError before any cluster work
        optimizer_of(model_or_builder)  # built: the workers' copies and the callbacks' files hold its variables
        package = pack_model(model_or_builder, custom_objects)
        return model_or_builder, ModelSource(keras_bytes=package.data, custom_objects=package.custom_objects)
    model = model_or_builder()
    if not isinstance(model, keras.Model):
        raise TypeError(f"The model function must return a keras.Model. Received: {type(model)}")
    model_io(model)
    optimizer_of(model)
    ship_by_value(model_or_builder, *(custom_objects or {}).values())
    return model, ModelSource(builder=model_or_builder, custom_objects=custom_objects)


def resume_center(checkpoint: Checkpoint, model, with_optimizer: bool) -> list:
    """The checkpoint's center for `model`, with the optimizer's variables when the kind of fit exchanges them."""
    weights = model.get_weights()
    saved = checkpoint.center[: len(weights)]
    shapes = [w.shape for w in weights]
    if len(saved) != len(weights) or [a.shape for a in saved] != shapes:
        raise CheckpointError(
            f"The checkpoint holds {len(saved)} weight arrays of shapes {[a.shape for a in saved][:4]}..., "
            f"the model has {len(weights)} of shapes {shapes[:4]}...: it belongs to another model."
        )
    log.info("Resuming from version %d, %d epoch(s) completed", checkpoint.version, checkpoint.completed_epochs)
    # Any worker count may resume: rows are dealt anew, the epochs everybody finished carry over.
    return checkpoint.center if with_optimizer else saved


def plan_fit(trainer, kind, df, cluster: FitCluster, resume_from, validation=None) -> FitPlan:
    """Every check before cluster work (the module docstring): the `Trainer`, this fit's kind (its algorithm), the
    cluster `df` is on (``trainer.spark.cluster_facts``)."""
    started = time.time()
    model, source = driver_model(trainer.model, trainer.custom_objects)
    warn_slow_choice(kind.algorithm, model)
    df, validation = split_validation(df, validation, trainer.seed)
    resumed = load_checkpoint(resume_from) if resume_from is not None else None
    center, version = model.get_weights(), 0
    if resumed is not None:
        center, version = kind.resume_center(resumed, model), resumed.version
    if kind.endpoints > 1:
        shard_layout(center, kind.endpoints)  # a model too small for the shards fails here
    frame, spec = prepare_frame(df, trainer.features_col, trainer.label_col, model, min_rows=trainer.num_workers,
                                check_values=trainer.check_data)
    vframe, vrows = validation_frame(validation, trainer.features_col, trainer.label_col, model, spec,
                                     check_values=trainer.check_data)
    if vframe is not None:
        frame = tag_validation(frame, vframe)
    profile = cluster.profile  # fails here when the cluster offers no GPUs
    log.info("Training %s on %d rows with %d workers, %s, batch %d, %d epochs (checks took %.1f s)",
             model.name, spec.num_rows, trainer.num_workers, kind.algorithm.describe(), trainer.batch_size,
             trainer.epochs, time.time() - started)
    frame = dealt_evenly(frame, spec.num_rows + vrows, trainer.num_workers)
    return FitPlan(model, source, frame, spec, center, version, resumed, profile, vrows)
