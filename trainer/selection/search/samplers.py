"""What to try next: the samplers (grid, random, TPE) and the searches that train what they propose.

A sampler proposes configurations; it never stops one (that is a pruner's question,
:mod:`trainer.selection.search.pruners`). :class:`GridSearch` and :class:`RandomSearch` are the grid and random
samplers with no pruner: every configuration is known at the start and trains ``epochs``. Give either to
:class:`~trainer.selection.search.pruners.SuccessiveHalving` to halve them. The model-based search
(:mod:`trainer.selection.search.model_based`) asks a :class:`Sampler` for each configuration as a place frees:
:data:`RANDOM` (the draws of :class:`RandomSearch` of the same seed) or :data:`TPE` (Optuna's ``TPESampler``
after a random start-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from trainer.selection.search.protocol import Metric, Search, SearchError, make_configs, positive_int, sample_points
from trainer.selection.search.space import grid

__all__ = ["GridSearch", "RandomSearch", "Sampler", "RANDOM", "TPE", "SAMPLERS", "sampler_of", "optuna_module"]


class GridSearch(Search):
    """Every point of a grid space (choices and constants), each trained ``epochs``.

    ``batch_size`` and ``epochs`` given in the space override the defaults here. The axes of the grid are the
    :func:`~trainer.selection.search.space.choice` parameters; any other value is a constant passed to
    ``model_fn`` as it is. A plain list or tuple (``{"lr": [1e-3, 1e-2]}``, which scikit-learn's ``ParameterGrid``
    reads as values to try) is refused here, before any cluster work, with the fix: ``choice([1e-3, 1e-2])`` to
    try each value, ``choice([[1e-3, 1e-2]])`` to pass the list itself.
    """

    def __init__(self, space: Mapping[str, Any], epochs: int = 1, batch_size: int = 32,
                 metric: Metric | str = "val_loss") -> None:  # fmt: skip
        epochs = positive_int("GridSearch", "epochs", epochs)
        points = grid(space)
        super().__init__(make_configs(points, epochs, batch_size, "GridSearch"), metric)


class RandomSearch(Search):
    """``n`` configurations sampled from ``space`` with ``seed``, each trained ``epochs``.

    Configuration ``i`` is the ``i``-th :func:`~trainer.selection.search.space.sample`
    from ``numpy.random.default_rng(seed)``, so the same seed gives the same
    configurations, and every parameter draws from its own stream.
    """

    def __init__(self, space: Mapping[str, Any], n: int, seed: int, epochs: int = 1,
                 batch_size: int = 32, metric: Metric | str = "val_loss") -> None:  # fmt: skip
        n = positive_int("RandomSearch", "n", n)
        epochs = positive_int("RandomSearch", "epochs", epochs)
        points = sample_points(space, n, seed, "RandomSearch")
        super().__init__(make_configs(points, epochs, batch_size, "RandomSearch"), metric)


def optuna_module():
    """Optuna, quiet, or a :class:`SearchError` that says how to install it (the ``[search]`` extra)."""
    try:
        import optuna  # deferred: an optional extra, needed only by the model-based searches
    except ImportError as exc:
        raise SearchError(
            "TPESearch and ASHA need Optuna, which is not installed. "
            "Fix: pip install '.[search]' in the checkout (or the wheel with [search], or pip install 'optuna>=4,<6')."
        ) from exc
    # Optuna logs every told trial at INFO on its own handler; the trainer is quiet by default.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass(frozen=True)
class Sampler:
    """What a model-based search tries next: the Optuna sampler that suggests configuration ``number``.

    ``random_trials`` is the search's random start-up (configurations before it are drawn at random whatever
    the sampler); a new sampler is one such object in :data:`SAMPLERS`.
    """

    name: str
    model_based: bool  # False: every configuration is a random draw

    def draws_at_random(self, number: int, random_trials: int) -> bool:
        """True when configuration ``number`` (0-based) is a random draw (the :class:`RandomSearch` one)."""
        return not self.model_based or number < random_trials

    def make(self, seed: int, number: int, random_trials: int):
        """The Optuna sampler of configuration ``number``, seeded for it alone."""
        optuna = optuna_module()
        if not self.draws_at_random(number, random_trials):
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=1)
        return optuna.samplers.RandomSampler(seed=seed)


RANDOM = Sampler("random", model_based=False)
TPE = Sampler("tpe", model_based=True)
SAMPLERS: dict[str, Sampler] = {s.name: s for s in (TPE, RANDOM)}


def sampler_of(name: str, owner: str) -> Sampler:
    """The sampler called ``name``, or a :class:`SearchError` that lists them."""
    if name not in SAMPLERS:
        raise SearchError(f"{owner}: unknown sampler {name!r}. Expected one of {tuple(SAMPLERS)}.")
    return SAMPLERS[name]
