"""Hooks of a model-selection run, Keras-callback style."""

from __future__ import annotations

from typing import Any


class SelectionCallback:
    """Hooks called by the driver during a search (Keras-callback style, all no-ops here).

    They run on the driver's server threads while the run's lock is held: keep
    them fast. ``self.selector`` is the running :class:`ModelSelector`; set
    ``self.selector.stop_search = True`` to end the search gracefully: units
    in flight finish, nothing new starts, completed epochs stay checkpointed
    and ``fit`` returns a result with ``interrupted=True``.
    """

    selector: Any = None

    def on_unit_end(self, unit: dict[str, Any]) -> None:
        """A sub-epoch (MOP) or epoch (baselines) finished; ``unit`` is its record."""

    def on_epoch_end(self, config_id: str, epoch: int, logs: dict[str, float]) -> None:
        """``config_id`` completed ``epoch`` (0-based); ``logs`` holds its train and ``val_`` metrics."""

    def on_search_end(self, result: Any) -> None:
        """The search is over (finished or stopped)."""



class MlflowSelectionCallback(SelectionCallback):
    """Logs every configuration's epochs into its own MLflow child run (``mlflow=True``).

    `runs` is a ``trainer.tracking.SearchLogger``; a child run starts at the
    configuration's first reported epoch, with its parameters.
    """

    def __init__(self, runs: Any, params: dict[str, dict[str, Any]]) -> None:
        self.runs = runs
        self.params = params

    def on_epoch_end(self, config_id: str, epoch: int, logs: dict[str, float]) -> None:
        if config_id not in self.runs.children:
            params = self.params.get(config_id)
            if params is None and self.selector is not None:  # added by a model-based search during the run
                config = self.selector.search.config(config_id)
                params = {**config.params, "batch_size": config.batch_size}
            self.runs.child(config_id, params or {})
        self.runs.epoch(config_id, epoch, logs)
