"""`ModelSelector`: train every configuration of a search on Spark and pick the best.

Example::

    from trainer.selection import GridSearch, ModelSelector, choice

    def model_fn(params):                       # -> a compiled keras.Model
        ...

    search = GridSearch({"units": choice([32, 64]), "lr": choice([1e-3, 1e-2]),
                         "batch_size": choice([32, 64])}, epochs=4, metric="val_accuracy")
    result = ModelSelector(model_fn, search, num_workers=2, checkpoint_dir="ckpt").fit(train, validation=val)
    result.leaderboard                           # pandas DataFrame, best first
    result.best_model.evaluate(test)             # a trainer.FittedModel
    result.save("results/selection")             # leaderboard.csv, schedule.json, gantt.png, curves

`fit` plans (checks, model builds, the stage's data), then launches ONE barrier
stage of `num_workers` long-lived tasks (``trainer.runtime.search_worker.search_task``)
on the cluster read once from the session (``trainer.spark.cluster_facts.FitCluster``:
addresses, resource profile) through the controller every fit uses and its
stage sequence (``trainer.controller``: TLS, secret, `serve`: slots, retries,
closing); the driver's
``trainer.selection.engine.search_run.SearchRun`` serves them through a
``HopperServer``, and ``trainer.selection.report.result.build_result`` makes the
result. An elastic search (``num_workers=(min, max)``) runs rounds of ordinary
chunk tasks instead (``trainer.selection.engine.elastic_search``). How model
hopper parallelism, its validation, checkpoints, replay, elastic searches and
the baselines work: ``docs/model-selection.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from typing import Any, Callable, Sequence

import numpy as np

from trainer.controller import StageController, StageResult
from trainer.data.checks import model_io, prepare_frame, resolve_input_shape
from trainer.data.validation import dealt_evenly, split_validation, tag_validation, validation_frame
from trainer.errors import SelectionError
from trainer.options import OptionAttributes, SelectionOptions
from trainer.runtime.feeding.arrow import arrow_to_numpy
from trainer.runtime.search_worker.elastic_search_task import serve_chunk
from trainer.runtime.search_worker.search_task import ConfigBuild, TaskSpec, canonical_order, selection_task
from trainer.runtime.shipping import ship_by_value
from trainer.runtime.state import model_state, state_layout
from trainer.selection.report.callbacks import MlflowSelectionCallback, SelectionCallback
from trainer.selection.engine.search_checkpoints import CheckpointStore
from trainer.selection.engine.search_run import derive_seed, make_search_run
from trainer.selection.engine.hopper import HopperClient, HopperServer
from trainer.selection.report.result import SelectionResult, build_result
from trainer.selection.engine.strategies import STRATEGIES, strategy_of
from trainer.selection.search import Config, Search, search_names
from trainer.selection.search.space import decode
from trainer.spark.cluster_facts import FitCluster
from trainer.spark.connect import share_with_tasks
from trainer.spark.elastic_launch import ElasticPolicy
from trainer.spark.launch import RetryPolicy
from trainer.tracking import RunLogger, SearchLogger

log = logging.getLogger("trainer.selection")

__all__ = ["STRATEGIES", "ModelSelector"]

#: Jobs an elastic search may run at most: a new one starts only when a chunk that a model needs has no task (the
#: bound is never reached; ``trainer.spark.elastic_launch`` takes a range).
MAX_ROUNDS = 1_000_000
#: Rounds that may start while an earlier one still runs: a round's task launched on a joining executor holds its
#: round open while that process starts (seconds), and the chunks meanwhile go on in later rounds.
ROUNDS_AHEAD = 8


class ModelSelector(OptionAttributes):
    """Train every configuration of a search on Spark and pick the best; see the module docstring.

    The keyword arguments after `strategy` are options declared, defaulted and
    checked once in ``trainer.options.SelectionOptions`` (shared with
    ``Trainer``): a wrong value raises `OptionError`, an unknown name a TypeError.

    Args:
        model_fn: ``model_fn(params) -> keras.Model``, compiled, with an
            ``Input`` shape. Called once per configuration on the driver (for
            the initial weights and checks) and at most once per configuration
            and task on the executors; shipped by value when it lives outside
            site-packages.
        search: a :class:`~trainer.selection.search.Search` (GridSearch,
            RandomSearch, SuccessiveHalving, Hyperband, or the model-based
            TPESearch and ASHA, which add configurations as trials end). Its
            metric selects.
        strategy: ``"mop"`` (default), ``"task_parallel"`` or ``"sequential"``
            (``trainer.selection.engine.strategies``: what differs between them).
        num_workers: Integer. Barrier tasks, one per data shard (``sequential``: 1). Or ``(min, max)``: an
            elastic search (model hopper only): `max` chunks served by ordinary tasks that come and go with
            Spark's executors (dynamic allocation on), at least `min` task slots
            (``trainer.selection.engine.elastic_search``).
        features_col: String or list of strings. Array/Vector column or numeric columns.
        label_col: String. The label column.
        checkpoint_dir: String or None. Where to checkpoint every model after each epoch.
        seed: Integer. Fixes the scheduler's tie-breaking, the initial weights of
            each configuration (``keras.utils.set_random_seed`` is called on the
            driver before each build) and the shuffling of every sub-epoch.
        custom_objects: Dict. Custom layers/losses for the fitted models' ``.keras`` files.
        eval_batch_size: Integer. Batch size of the validation passes (at least the config's).
        ps_host, ps_port, ps_bind_host: where executors reach the driver's server
            (defaults as for ``trainer.Trainer``: ``TRAINER_PS_HOST``/``_PORT``/``_BIND``
            or ``spark.driver.host``).
        io_timeout: Float. Longest silence tolerated from a task: must exceed one unit of work.
        slot_timeout: Float. Seconds to wait for ``num_workers`` free task slots.
        max_retries: Integer. Re-runs of the stage after lost executors; a re-run
            continues from the driver's newest states (only units in flight are redone).
        check_data: Bool. Scan the data for nulls/NaN/inf and label ranges first.
        gpus_per_worker: Integer. GPUs each task gets, as for ``trainer.Trainer``
            (a stage-level ResourceProfile; 0 keeps the session's defaults).
        verbose: Bool. Log every completed epoch at INFO level.
        mlflow: Bool. Log the search to MLflow: a parent run (the search, the
            best configuration and its model) with one child run per
            configuration (its parameters and per-epoch metrics); see
            ``trainer.tracking``.
        tls: Bool. Encrypt the driver's connections with TLS (a throw-away
            certificate per search, pinned by the tasks); see docs/security.md.
        frame_mac: Bool or String. A MAC on every frame between the tasks and
            the driver (True: Poly1305; see ``Trainer``).
    """

    def __init__(self, model_fn: Callable[[dict[str, Any]], Any], search: Search, *, strategy: str = "mop",
                 **options: Any) -> None:
        if not callable(model_fn):
            raise SelectionError(
                f"model_fn must be a function params -> compiled keras.Model. Received {type(model_fn).__name__}. "
                "Fix: def model_fn(params): ...; return model."
            )
        if not isinstance(search, Search):
            raise SelectionError(
                f"search must be a trainer.selection Search ({', '.join(search_names())}). "
                f"Received {type(search).__name__}. Fix: e.g. GridSearch({{'units': choice([32, 64])}})."
            )
        #: How the models are placed on the workers (``trainer.selection.engine.strategies``).
        self.execution = strategy_of(strategy)
        #: The checked options (``trainer.options.SelectionOptions``), also readable as attributes.
        self.options = SelectionOptions.of("ModelSelector", options)
        self.execution.check_workers(self.options.num_workers)
        if self.options.elastic is not None and not self.execution.elastic:
            raise SelectionError(
                f"An elastic search (num_workers={self.options.elastic}) needs strategy='mop': its models hop "
                f"between chunks that the workers serve as they come and go. Received strategy={strategy!r}. "
                "Fix: strategy='mop', or give num_workers as one integer."
            )
        concurrent = search.max_concurrent
        if concurrent is not None and self.execution.parallel and concurrent < self.options.num_workers:
            log.warning("model selection: %s trains at most %d trials at once but num_workers=%d: some workers "
                        "will idle (pass max_concurrent >= num_workers)", type(search).__name__, concurrent,
                        self.options.num_workers)
        self.model_fn = model_fn
        self.search = search
        self.strategy = strategy
        #: Set to True (e.g. from a SelectionCallback) to stop the running search gracefully.
        self.stop_search = False
        self._used = False

    # -- helpers -------------------------------------------------------------------
    def _build(self, config: Config):
        import keras  # deferred: TensorFlow starts only when a model is needed

        keras.utils.set_random_seed(derive_seed(self.seed, "build", config.id))
        model = self.model_fn(dict(config.params))
        if not isinstance(model, keras.Model):
            raise SelectionError(
                f"model_fn({config.params!r}) returned {type(model).__name__}, expected a compiled keras.Model. "
                "Fix: return the model from model_fn."
            )
        return model

    def _admit(self, config: Config, *, spec, input_shapes: dict) -> tuple[list, list[np.ndarray], dict[str, Any]]:
        """(state layout, initial state, task payload) of a configuration a model-based search added.

        Runs on a server thread while the run's lock is held: the model is built
        once here (its initial weights, seeded as at the start), and the tasks
        get its point and build settings with their first unit of it.
        """
        model = self._build(config)
        shape = resolve_input_shape(model_io(model)[0], spec.feature_size)
        input_shapes[config.id] = shape
        payload = {"point": self.search.point(config.id), "batch_size": config.batch_size,
                   "input_shape": list(shape), "build_seed": derive_seed(self.seed, "build", config.id)}
        return state_layout(model), model_state(model), payload

    def _run_description(self, configs: list[Config]) -> dict[str, Any]:
        return {"strategy": self.strategy, "num_workers": self.num_workers, "seed": self.seed,
                "search": type(self.search).__name__,
                "metric": {"name": self.search.metric.name, "mode": self.search.metric.mode},
                "configs": [dataclasses.asdict(c) for c in configs]}

    # -- fit -------------------------------------------------------------------------
    def fit(self, df, validation: Any = None, *, resume: bool = False, replay: Any = None,
            callbacks: Sequence[SelectionCallback] = ()) -> SelectionResult:  # fmt: skip
        """Run the search on ``df`` and return a :class:`SelectionResult`.

        Args:
            df: Spark DataFrame with the feature and label columns.
            validation: a DataFrame with the same columns, a fraction in (0, 1)
                of ``df`` to hold out (``randomSplit`` with the selector's seed),
                or None (then the metric must be a training metric such as ``"loss"``).
            resume: continue the search checkpointed in ``checkpoint_dir``
                (a missing or empty directory starts a new search).
            replay: a recorded schedule to issue exactly (a SelectionResult, its
                ``schedule``, or the path of a ``selection.json``); model hopper only.
            callbacks: :class:`SelectionCallback` objects.
        """
        if not self.mlflow:
            return self._fit(df, validation, resume, replay, callbacks)
        with RunLogger(run_name=f"model selection ({self.strategy})") as run:
            configs = self.search.configs()
            run.log_params({"strategy": self.strategy, "num_workers": self.num_workers, "seed": self.seed,
                            "search": type(self.search).__name__, "metric": self.search.metric.name,
                            "configs": len(configs)})
            runs = SearchLogger(run)
            logger = MlflowSelectionCallback(runs, {c.id: {**c.params, "batch_size": c.batch_size} for c in configs})
            try:
                result = self._fit(df, validation, resume, replay, [*callbacks, logger])
            finally:
                runs.close()
            if result.best_config is not None:
                best = result.best_model
                run.log_params({"best_config": result.best_config.id})
                run.log_metrics({f"best_{self.search.metric.name}": result.best_value,
                                 "wall_s": result.timings["wall_s"]})
                run.log_model(best.keras_model, best.spec.input_shape, best._shipped().custom_objects)
            return result

    def _fit(self, df, validation, resume, replay, callbacks) -> SelectionResult:
        import keras  # deferred: TensorFlow starts only when a search does

        self._check_fit_args(resume, replay)
        self.stop_search = False
        fit_start = time.time()
        configs = self.search.configs()
        for cb in callbacks:
            cb.selector = self
        spark = df.sparkSession
        n = self.num_workers
        df, validation = self._split_validation(df, validation)
        cluster = FitCluster(spark, self.gpus_per_worker)
        controller = StageController.of(cluster, self.options)  # a missing TLS tool fails here, before cluster work
        profile = cluster.profile  # fails here when the cluster offers no GPUs

        # -- plan: models, data and checks, before any Spark job -------------------------
        built = {c.id: self._build(c) for c in configs}
        first = built[configs[0].id]
        ship_by_value(self.model_fn, *(self.custom_objects or {}).values())
        frame, spec = prepare_frame(df, self.features_col, self.label_col, first,
                                    min_rows=self.execution.min_rows(n), check_values=self.check_data)
        input_shapes = {cid: resolve_input_shape(model_io(m)[0], spec.feature_size) for cid, m in built.items()}
        vframe, vrows = validation_frame(validation, self.features_col, self.label_col, first, spec,
                                         check_values=self.check_data)
        self._check_metric_name(first, input_shapes[configs[0].id], spec, validation is not None)
        layouts = {cid: state_layout(m) for cid, m in built.items()}
        states = {cid: model_state(m) for cid, m in built.items()}
        del built, first
        store = CheckpointStore(self.checkpoint_dir) if self.checkpoint_dir is not None else None
        self._used = True  # from here on the search object receives reports
        admit = functools.partial(self._admit, spec=spec, input_shapes=input_shapes)
        run = make_search_run(self, self.search, layouts, states, store=store, resume=resume, replay=replay,
                              callbacks=callbacks, description=self._run_description(configs), admit=admit,
                              elastic=self.options.elastic is not None)
        search_id = uuid.uuid4().hex
        stage_frame, broadcast = self._stage_data(spark, frame, spec, vframe, vrows)
        builds = {c.id: ConfigBuild(dict(c.params), c.batch_size, tuple(input_shapes[c.id]),
                                    derive_seed(self.seed, "build", c.id)) for c in configs}

        # -- launch: one barrier stage served by the driver's hopper server, through the fits' controller ------
        server = HopperServer(run, n, **controller.server_endpoint(), io_timeout=self.io_timeout,
                              max_body=max(1 << 30, 4 * sum(a.nbytes for s in states.values() for a in s)),
                              frame_mac=self.frame_mac,
                              # an elastic search: the tasks of every round running at once may connect
                              max_connections=(ROUNDS_AHEAD + 2) * n + 4 if self.options.elastic else None)

        def task_spec(attempt: int, round_: int = 0) -> TaskSpec:
            return TaskSpec(
                model_fn=self.model_fn, configs=builds,
                connect=functools.partial(HopperClient, controller.host, server.address[1], server.credentials),
                attempt=attempt, feature_size=spec.feature_size,
                label_size=spec.label_size, full_copy=broadcast, task_seed=derive_seed(self.seed, "task"),
                eval_batch_size=self.eval_batch_size, io_timeout=self.io_timeout,
                keras_backend=keras.backend.backend(), decode=functools.partial(decode, self.search.space),
                search_id=search_id, round=round_,
            )

        def make_task(attempt: int, workers: int):
            run.begin_attempt(attempt)
            return functools.partial(selection_task, task_spec(attempt))

        def started() -> None:
            run.t0 = time.time()

        # a failed save is logged by finish_checkpoints: it must not hide the search's own error
        closers = (run.finish_checkpoints, *((broadcast.destroy,) if broadcast is not None else ()))
        no_stage = StageResult([], time.time(), time.time())  # a resumed search that had ended runs no stage

        def search_stage() -> StageResult:
            run.start()
            description = f"trainer: model selection ({self.strategy}, {len(configs)} configs)"
            if run.finished:  # a resumed search that had ended runs nothing
                stage = no_stage
            elif self.options.elastic is not None:  # rounds of chunk tasks (trainer.selection.engine.elastic_search)
                stage = controller.run_elastic(
                    stage_frame, n, range(MAX_ROUNDS), lambda r: functools.partial(serve_chunk, task_spec(0, r)),
                    server=server, policy=ElasticPolicy(self.options.elastic[0], max(self.slot_timeout, 60.0),
                                                        self.max_retries),
                    description=f"{description} elastic {self.options.elastic[0]}-{n}", profile=profile,
                    on_started=started, stopped=lambda: run.over, fatal=lambda: run.error,
                    begun=run.may_start_round, lookahead=ROUNDS_AHEAD, retire=run.retire)
            else:
                stage = controller.run(
                    stage_frame, n, make_task, server=server,
                    policy=RetryPolicy(self.max_retries, max(self.slot_timeout, 60.0)), description=description,
                    slot_timeout=self.slot_timeout, fatal=lambda: run.error, profile=profile, on_started=started)
            if run.error is not None:
                raise run.error
            return stage

        stage = controller.serve(server, search_stage, before_stop=(run.close,), closers=closers)

        result = build_result(self, run, self.search.configs(), spec, input_shapes, stage.records,
                              server.bytes_sent + server.bytes_received, fit_start, stage.start, stage.end)
        for cb in callbacks:
            cb.on_search_end(result)
        return result

    # -- pieces of fit -----------------------------------------------------------------
    def _check_fit_args(self, resume: bool, replay: Any) -> None:
        if self._used:
            raise SelectionError(
                "This ModelSelector already ran: a search object records its reports and cannot run twice. "
                "Fix: create a new search and ModelSelector (pass resume=True with the same checkpoint_dir "
                "to continue a search)."
            )
        if replay is not None and self.options.elastic is not None:
            raise SelectionError("replay= needs a fixed num_workers: in an elastic search which chunk is served when "
                                 "is Spark's. Fix: pass num_workers as one integer to replay a schedule.")
        if replay is not None and not self.execution.replays:
            raise SelectionError(f"replay= needs strategy='mop'. Received strategy={self.strategy!r}.")
        if resume and self.checkpoint_dir is None:
            raise SelectionError("resume=True needs checkpoint_dir. Fix: pass the directory of the interrupted search.")

    def _split_validation(self, df, validation: Any):
        """(training rows, validation DataFrame or None): the trainer's path (``trainer.data.validation``)."""
        df, validation = split_validation(df, validation, self.seed)
        metric = self.search.metric
        if metric.name.startswith("val_") and validation is None:
            raise SelectionError(
                f"The search's metric {metric.name!r} is a validation metric but no validation data was given. "
                "Fix: fit(df, validation=val_df or a fraction such as 0.2), or select on a training metric."
            )
        return df, validation

    def _stage_data(self, spark, frame, spec, vframe, vrows: int):
        """(the stage's input frame, a broadcast full copy or None).

        Model hopper: training and validation rows tagged by a flag column and
        dealt into the shards. Baselines: every task reads a full copy of the
        data from a Spark broadcast (in the task closure on Spark Connect,
        ``trainer.spark.connect.share_with_tasks``); the stage's frame only has one row per task.
        """
        if not self.execution.hops:
            arrays = _collect_numpy(frame, spec) + (_collect_numpy(vframe, spec) if vframe is not None
                                                    else arrow_to_numpy(iter(()), (spec.feature_size,),
                                                                        spec.label_size))
            return spark.range(self.num_workers), share_with_tasks(spark, arrays, f"strategy={self.strategy!r}")
        return dealt_evenly(tag_validation(frame, vframe), spec.num_rows + vrows, self.num_workers), None

    def _check_metric_name(self, model, input_shape, spec, has_validation: bool) -> None:
        """Fail before any Spark job when the selection metric can never appear in the logs."""
        shape = (1,) if spec.label_size is None else (1, spec.label_size)
        try:
            names = list(model.evaluate(np.zeros((1, *input_shape), np.float32), np.zeros(shape, np.float32),
                                        verbose=0, return_dict=True))
        except Exception:  # an unusual model: the check after the first epoch still applies
            return
        available = names + ([f"val_{k}" for k in names] if has_validation else [])
        if self.search.metric.name not in available:
            raise SelectionError(
                f"The search's metric {self.search.metric.name!r} will not be logged; the model logs "
                f"{available}. Fix: choose one of those names for the search's metric"
                f"{'' if has_validation else ' or pass validation data for val_ metrics'}."
            )
def _collect_numpy(frame, spec) -> tuple[np.ndarray, np.ndarray]:
    """The whole (prepared) frame on the driver as flat numpy arrays (through Arrow), in canonical row order."""
    table = frame.toArrow()
    return canonical_order(*arrow_to_numpy(iter(table.to_batches()), (spec.feature_size,), spec.label_size))


# help(ModelSelector) shows the keyword arguments with their defaults (declared in SelectionOptions).
ModelSelector.__init__.__signature__ = SelectionOptions.signature(  # type: ignore[attr-defined]
    ("self", "model_fn", "search"), strategy="mop")
