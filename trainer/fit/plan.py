"""A fit's plan: everything checked and built before any cluster work, for every kind of fit.

`plan_fit` takes the trainer's options and the user's arguments and returns a
`FitPlan`: the driver's model and the source the tasks rebuild it from, the
two-column frame (training rows, with the validation rows tagged into it),
its `DataSpec`, the weights to start from (a checkpoint's when resuming) and
the stage's resource profile. Every check that can fail does so here, before
a parameter server or a Spark job starts: the model (compiled, with a loss,
its optimizer built), the checkpoint (the same model), the columns and
values, the shards of the server, the free task slots.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

from trainer.algorithms import ADAG, Algorithm
from trainer.data.checks import DataSpec, model_io, prepare_frame
from trainer.data.validation import split_validation, tag_validation, validation_frame
from trainer.errors import CheckpointError
from trainer.fit.checkpoints import Checkpoint, load_checkpoint
from trainer.ps.layout import shard_layout
from trainer.runtime.shipping import ModelSource, pack_model, ship_by_value
from trainer.runtime.state import optimizer_of
from trainer.spark.launch import wait_for_slots
from trainer.spark.resources import stage_profile

log = logging.getLogger("trainer")

# Below this many rows per worker, the frame is dealt from one partition (see `plan_fit`).
SMALL_FRAME_ROWS_PER_WORKER = 1000


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
    rule = getattr(algorithm, "inner", algorithm)  # a compressed rule wraps the delta rule
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(rule, ADAG) or optimizer is None:
        return
    try:
        rate = float(optimizer.learning_rate)
        default = float(type(optimizer)().learning_rate)
    except (TypeError, ValueError):  # a schedule, or an optimizer without defaults: no advice
        return
    if rate <= default:
        warnings.warn(
            f"ADAG divides every commit by its window ({rule.window}): at {type(optimizer).__name__}'s default "
            f"learning rate ({rate:g}), tuned for one Keras process, the center moves about 1/{rule.window} as far "
            "per batch and learns far slower than plain Keras. Fix: raise the learning rate about "
            f"{rule.window}x, or leave `algorithm` out (the default learns like plain Keras, docs/algorithms.md).",
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


def resume_center(checkpoint: Checkpoint, model, algorithm: Algorithm) -> list:
    """The checkpoint's center for `model` (with the optimizer's slots where the rule exchanges them)."""
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
    return checkpoint.center if algorithm.exchanges_optimizer_state else saved


def _identity(batches):
    yield from batches


def plan_fit(options, df, resume_from, validation=None) -> FitPlan:
    """Every check before cluster work (the module docstring); `options` is the `Trainer`."""
    started = time.time()
    df, validation = split_validation(df, validation, options.seed)
    model, source = driver_model(options.model, options.custom_objects)
    warn_slow_choice(options.algorithm, model)
    resumed = load_checkpoint(resume_from) if resume_from is not None else None
    center, version = model.get_weights(), 0
    if resumed is not None:
        center, version = resume_center(resumed, model, options.algorithm), resumed.version
    if options.ps_shards > 1:
        shard_layout(center, options.ps_shards)  # a model too small for the shards fails here
    frame, spec = prepare_frame(df, options.features_col, options.label_col, model, min_rows=options.num_workers,
                                check_values=options.check_data)
    vframe, vrows = validation_frame(validation, options.features_col, options.label_col, model, spec,
                                     check_values=options.check_data)
    if vframe is not None:
        frame = tag_validation(frame, vframe)
    profile = stage_profile(df.sparkSession, options.gpus_per_worker)
    wait_for_slots(df.sparkSession, options.num_workers, options.slot_timeout, profile)
    log.info("Training %s on %d rows with %d workers, %s, batch %d, %d epochs (checks took %.1f s)",
             model.name, spec.num_rows, options.num_workers, options.algorithm.describe(), options.batch_size,
             options.epochs, time.time() - started)
    if spec.num_rows + vrows < SMALL_FRAME_ROWS_PER_WORKER * options.num_workers:
        # Round-robin from a single partition deals rows evenly; from many tiny
        # partitions it can leave a worker without any row. The identity map
        # keeps the optimizer from collapsing coalesce(1) into the repartition.
        frame = frame.coalesce(1).mapInArrow(_identity, frame.schema)
    return FitPlan(model, source, frame, spec, center, version, resumed, profile, vrows)
