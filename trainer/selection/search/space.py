"""Search-space primitives: what a hyper-parameter may take, and how to draw it.

A *space* is a plain ``dict`` from parameter name to either a :class:`Param`
(a distribution) or any other value (a constant, passed through unchanged)::

    space = {
        "lr": loguniform(1e-4, 1e-1),
        "units": choice([32, 64, 128]),
        "dropout": quniform(0.0, 0.5, 0.1),
        "optimizer": "adam",                 # a constant
        "layers": randint(1, 4),             # an int, both bounds included
        "filters": when("arch", "cnn", choice([16, 32])),   # only when arch == "cnn"
    }
    sample(space, rng=7)   # one configuration
    grid({"units": choice([32, 64]), "lr": choice([1e-3, 1e-2])})   # 4 configurations

Randomness: every parameter draws from its OWN generator. :func:`sample`
derives, for each parameter, a ``numpy`` generator from the pair (base seed,
CRC-32 of the parameter's name). Two parameters with the same distribution
therefore draw different, independent streams (Cerebro seeded every sampler
with the same constant, so they all drew identical values), adding or removing
one parameter does not change what the others draw, and the same seed always
reproduces the same configuration.

Values come back as plain Python objects: ``float`` for the continuous
distributions, ``int`` for :func:`randint` and for :func:`quniform` when its
bounds and step are all integers, and the option object itself for
:func:`choice`. A :func:`when` parameter is left out of a configuration whose
parent parameter has another value.

Model-based searches (``trainer.selection.search.model_based``) draw through Optuna
instead: :func:`suggest` maps each parameter onto an Optuna distribution on a
trial (define-by-run, so a :func:`when` parameter is only suggested when its
parent allows it) and returns the point Optuna stores, plain values only;
:func:`decode` turns such a point back into the configuration, on the driver and
in the tasks alike.
"""

from __future__ import annotations

import itertools
import math
import numbers
import zlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = [
    "SearchSpaceError",
    "Param",
    "Choice",
    "Uniform",
    "LogUniform",
    "QUniform",
    "IntUniform",
    "Conditional",
    "choice",
    "uniform",
    "loguniform",
    "quniform",
    "randint",
    "when",
    "param_rng",
    "sample",
    "grid",
    "grid_size",
    "suggest",
    "decode",
    "encode",
]


class SearchSpaceError(ValueError):
    """A search space or one of its parameters is malformed."""


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------
class Param:
    """Base class of every distribution. Subclasses implement :meth:`draw`."""

    def draw(self, rng: np.random.Generator) -> Any:
        """Draw one value using ``rng`` (a ``numpy.random.Generator``)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Choice(Param):
    """One of a fixed, ordered list of options, each equally likely."""

    options: tuple

    def draw(self, rng: np.random.Generator) -> Any:
        return self.options[int(rng.integers(len(self.options)))]


@dataclass(frozen=True)
class Uniform(Param):
    """A float drawn uniformly from ``[low, high)``."""

    low: float
    high: float

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))


@dataclass(frozen=True)
class LogUniform(Param):
    """A float whose logarithm is uniform on ``[log(low), log(high))``."""

    low: float
    high: float

    def draw(self, rng: np.random.Generator) -> float:
        value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        # exp(log(x)) may land a rounding error outside the bounds.
        return float(min(max(value, self.low), self.high))


@dataclass(frozen=True)
class QUniform(Param):
    """A multiple of ``q`` inside ``[low, high]``: ``round(uniform(low, high) / q) * q``.

    The rounded value is clamped to the multiples of ``q`` that lie inside the
    bounds, so it never leaves ``[low, high]``. ``int`` when ``low``, ``high``
    and ``q`` are all integers, ``float`` otherwise.
    """

    low: float
    high: float
    q: float

    @property
    def _k_range(self) -> tuple[int, int]:
        eps = 1e-9
        return math.ceil(self.low / self.q - eps), math.floor(self.high / self.q + eps)

    @property
    def _integral(self) -> bool:
        return all(isinstance(v, numbers.Integral) for v in (self.low, self.high, self.q))

    def _value(self, k: int) -> float | int:
        if self._integral:
            return int(k * self.q)
        # 3 * 0.1 == 0.30000000000000004: print with 15 significant digits
        # and parse back to land on the nearest "decimal" float.
        return float(f"{k * self.q:.15g}")

    def draw(self, rng: np.random.Generator) -> float | int:
        k_lo, k_hi = self._k_range
        k = round(float(rng.uniform(self.low, self.high)) / self.q)
        return self._value(min(max(k, k_lo), k_hi))

    def values(self) -> list[float | int]:
        """Every value this parameter can take, in increasing order."""
        k_lo, k_hi = self._k_range
        return [self._value(k) for k in range(k_lo, k_hi + 1)]


@dataclass(frozen=True)
class IntUniform(Param):
    """An int in ``[low, high]`` (both included), uniform or, with ``log``, log-uniform."""

    low: int
    high: int
    log: bool = False

    def draw(self, rng: np.random.Generator) -> int:
        if not self.log:
            return int(rng.integers(self.low, self.high + 1))
        # log-uniform over [low - 0.5, high + 0.5) rounded: every int keeps the share of its own interval
        value = math.exp(rng.uniform(math.log(self.low - 0.5), math.log(self.high + 0.5)))
        return int(min(max(round(value), self.low), self.high))


@dataclass(frozen=True)
class Conditional(Param):
    """``param``, present only in configurations whose ``parent`` took one of ``values``."""

    parent: str
    values: tuple
    param: Param

    def active(self, point: Mapping[str, Any]) -> bool:
        """True when the configuration so far (``point``) has the parent at one of :attr:`values`."""
        return self.parent in point and point[self.parent] in self.values

    def draw(self, rng: np.random.Generator) -> Any:
        return self.param.draw(rng)


# ---------------------------------------------------------------------------
# Constructors with validation
# ---------------------------------------------------------------------------
def _check_number(fn: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SearchSpaceError(
            f"{fn}: `{name}` must be a real number. Received {name}={value!r} "
            f"({type(value).__name__}). Fix: pass an int or a float."
        )
    if not math.isfinite(float(value)):
        raise SearchSpaceError(
            f"{fn}: `{name}` must be finite. Received {name}={value!r}. "
            "Fix: pass finite bounds."
        )
    return value


def _check_bounds(fn: str, low: Any, high: Any) -> None:
    _check_number(fn, "low", low)
    _check_number(fn, "high", high)
    if not low < high:
        raise SearchSpaceError(
            f"{fn}: expected low < high. Received low={low!r}, high={high!r}. "
            "Fix: swap the bounds, or use a constant (or choice([value])) for a fixed value."
        )


def choice(options: Sequence[Any]) -> Choice:
    """One of ``options`` (a non-empty list or tuple), each equally likely.

    Options may be any objects (numbers, strings, tuples of layer sizes...).
    Their order is kept: it is the enumeration order of :func:`grid`.
    """
    if isinstance(options, (str, bytes, Mapping, set, frozenset)) or not isinstance(
        options, Sequence
    ):
        hint = (
            "sets have no order, so draws would not be reproducible; pass sorted(options)"
            if isinstance(options, (set, frozenset))
            else "pass a list, e.g. choice(['adam', 'sgd'])"
        )
        raise SearchSpaceError(
            f"choice: expected a list or tuple of options. "
            f"Received {type(options).__name__}: {options!r}. Fix: {hint}."
        )
    if len(options) == 0:
        raise SearchSpaceError(
            "choice: expected at least one option. Received an empty list. "
            "Fix: pass the values to try, e.g. choice([32, 64])."
        )
    return Choice(tuple(options))


def uniform(low: float, high: float) -> Uniform:
    """A float uniform on ``[low, high)``; requires finite ``low < high``."""
    _check_bounds("uniform", low, high)
    return Uniform(low, high)


def loguniform(low: float, high: float) -> LogUniform:
    """A float log-uniform on ``[low, high]``; requires ``0 < low < high``.

    The usual distribution for learning rates and weight decays.
    """
    _check_bounds("loguniform", low, high)
    if low <= 0:
        raise SearchSpaceError(
            f"loguniform: expected 0 < low < high (a logarithm is taken). "
            f"Received low={low!r}, high={high!r}. "
            "Fix: use a positive lower bound such as 1e-6, or uniform() for ranges that include 0."
        )
    return LogUniform(low, high)


def quniform(low: float, high: float, q: float) -> QUniform:
    """A multiple of ``q`` inside ``[low, high]`` (see :class:`QUniform`)."""
    _check_bounds("quniform", low, high)
    _check_number("quniform", "q", q)
    if q <= 0:
        raise SearchSpaceError(
            f"quniform: expected a step q > 0. Received q={q!r}. "
            "Fix: pass the spacing of the values, e.g. quniform(16, 256, 16)."
        )
    param = QUniform(low, high, q)
    k_lo, k_hi = param._k_range
    if k_lo > k_hi:
        raise SearchSpaceError(
            f"quniform: no multiple of q={q!r} lies inside [low={low!r}, high={high!r}]. "
            "Fix: widen the bounds or use a smaller q."
        )
    return param


def randint(low: int, high: int, log: bool = False) -> IntUniform:
    """An int in ``[low, high]``, both bounds included; ``log=True`` draws it log-uniformly (needs ``low >= 1``).

    Example:

    ```python
    space = {"layers": randint(1, 4), "units": randint(16, 256, log=True)}
    ```
    """
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise SearchSpaceError(
                f"randint: `{name}` must be an int. Received {name}={value!r} ({type(value).__name__}). "
                "Fix: pass int bounds, or quniform()/uniform() for floats."
            )
    if not low <= high:
        raise SearchSpaceError(f"randint: expected low <= high. Received low={low!r}, high={high!r}. Fix: swap them.")
    if log and low < 1:
        raise SearchSpaceError(
            f"randint: log=True needs low >= 1 (a logarithm is taken). Received low={low!r}. "
            "Fix: raise low to 1, or drop log=True."
        )
    return IntUniform(int(low), int(high), bool(log))


def when(parent: str, values: Any, param: Param) -> Conditional:
    """``param`` only in the configurations where parameter ``parent`` is one of ``values``.

    ``parent`` must come earlier in the space (a dict keeps its order); in the
    other configurations the key is left out, so ``model_fn`` reads it with
    ``params.get(...)`` or only where it applies.

    Example:

    ```python
    space = {"arch": choice(["cnn", "mlp"]),
             "filters": when("arch", "cnn", choice([16, 32])),
             "units": when("arch", "mlp", randint(64, 256, log=True))}
    ```

    Args:
        parent: String. The name of an earlier parameter of the space.
        values: one value, or a list or tuple of values, of ``parent``.
        param: the distribution (any of this module's) drawn when active.
    """
    if not isinstance(parent, str) or not parent:
        raise SearchSpaceError(f"when: `parent` must be a parameter's name. Received {parent!r}.")
    if not isinstance(param, Param) or isinstance(param, Conditional):
        raise SearchSpaceError(
            f"when: `param` must be a distribution such as choice([...]) or uniform(a, b). Received {param!r}. "
            "Fix: nest conditions with one when() per parameter, each naming its own parent."
        )
    options = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not options:
        raise SearchSpaceError(f"when({parent!r}, ...): expected at least one value of the parent. Received none.")
    return Conditional(parent, options, param)


# ---------------------------------------------------------------------------
# Spaces
# ---------------------------------------------------------------------------
def _check_space(space: Any) -> Mapping[str, Any]:
    if not isinstance(space, Mapping):
        raise SearchSpaceError(
            f"A search space must be a dict of parameter name -> Param or constant. "
            f"Received {type(space).__name__}: {space!r}. "
            "Fix: e.g. {'lr': loguniform(1e-4, 1e-1), 'units': choice([32, 64])}."
        )
    seen: list[str] = []
    for name, value in space.items():
        if not isinstance(name, str):
            raise SearchSpaceError(
                f"Search-space keys must be parameter names (str). Received key {name!r} "
                f"({type(name).__name__}). Fix: use string keys."
            )
        if isinstance(value, Conditional) and value.parent not in seen:
            raise SearchSpaceError(
                f"Parameter {name!r} depends on {value.parent!r}, which does not come before it in the space. "
                f"Fix: put {value.parent!r} earlier in the dict (parameters are drawn in the dict's order)."
            )
        seen.append(name)
    return space


def _base_seed(rng: int | np.random.Generator | None) -> int:
    if rng is None:
        raise SearchSpaceError(
            "sample: expected `rng`, an int seed or a numpy.random.Generator. Received None. "
            "Fix: pass a seed so that the draw can be reproduced, e.g. sample(space, rng=0)."
        )
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(0, 2**63))
    if isinstance(rng, bool) or not isinstance(rng, numbers.Integral) or rng < 0:
        raise SearchSpaceError(
            f"sample: expected `rng`, a non-negative int seed or a numpy.random.Generator. "
            f"Received {rng!r} ({type(rng).__name__}). Fix: pass e.g. rng=0."
        )
    return int(rng)


def param_rng(seed: int, name: str) -> np.random.Generator:
    """The generator parameter ``name`` draws from under base seed ``seed``.

    Keyed by the name (not by the position in the space), so each parameter
    has its own stream and the streams do not depend on each other.
    """
    return np.random.default_rng([int(seed), zlib.crc32(name.encode("utf-8"))])


def sample(space: Mapping[str, Any], rng: int | np.random.Generator) -> dict[str, Any]:
    """Draw one configuration from ``space``.

    ``rng`` is either an int seed (the same seed gives the same configuration)
    or a ``numpy.random.Generator``, from which one base seed is taken per call
    (so successive calls give successive, reproducible configurations). Each
    parameter then draws from its own generator, see :func:`param_rng`.
    Constants are copied through unchanged; the key order of ``space`` is kept.
    """
    space = _check_space(space)
    base = _base_seed(rng)
    out: dict[str, Any] = {}
    for name, value in space.items():
        if isinstance(value, Conditional) and not value.active(out):
            continue
        out[name] = value.draw(param_rng(base, name)) if isinstance(value, Param) else value
    return out


def _grid_axis(name: str, value: Any) -> tuple:
    if isinstance(value, Conditional):
        raise SearchSpaceError(
            f"grid: parameter {name!r} is conditional (when({value.parent!r}, ...)); a grid takes only choice([...]) "
            "parameters and constants. Fix: RandomSearch, Hyperband or TPESearch sample conditional spaces."
        )
    if isinstance(value, Choice):
        return value.options
    if isinstance(value, Param):
        raise SearchSpaceError(
            f"grid: parameter {name!r} is {value!r}, a continuous distribution that cannot be "
            "enumerated. A grid takes only choice([...]) parameters and constants. "
            f"Fix: use choice([...]) with the values to try for {name!r}, "
            "or RandomSearch to sample the space instead."
        )
    if isinstance(value, (list, tuple)):
        # scikit-learn's ParameterGrid reads a list as the values to try; here a constant is passed to model_fn
        # as it is, so a list would reach Keras as one value: say which was meant
        raise SearchSpaceError(
            f"grid: parameter {name!r} is a plain {type(value).__name__} {value!r}. Fix: choice({list(value)!r}) "
            f"to try each value, or choice([{value!r}]) to pass the {type(value).__name__} itself as one constant."
        )
    return (value,)


def grid(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every configuration of ``space``: the cartesian product of its choices.

    Only :func:`choice` parameters and constants are allowed. The first key
    varies slowest and the last fastest (``itertools.product`` order). An empty
    space has exactly one configuration, ``{}``.
    """
    space = _check_space(space)
    names = list(space)
    axes = [_grid_axis(name, space[name]) for name in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*axes)]


def grid_size(space: Mapping[str, Any]) -> int:
    """How many configurations :func:`grid` would return, without building them."""
    space = _check_space(space)
    return math.prod(len(_grid_axis(name, value)) for name, value in space.items())


# ---------------------------------------------------------------------------
# Optuna (model-based searches)
# ---------------------------------------------------------------------------
_OPTUNA_PLAIN = (type(None), bool, int, float, str)


def _plain_options(options: tuple) -> bool:
    return all(type(o) in _OPTUNA_PLAIN for o in options)


def suggest(space: Mapping[str, Any], trial: Any) -> dict[str, Any]:
    """Suggest every active parameter of ``space`` on an Optuna ``trial``; returns the point (``trial.params``).

    The mapping: :func:`uniform` and :func:`loguniform` -> a float (``log=True``);
    :func:`randint` -> an int (``log`` kept); :func:`quniform` -> an int ``k``
    (the value is ``k * q``, so the grid of multiples is exact); :func:`choice`
    -> a categorical of the options when they are all None, bool, int, float or
    str, else of their indices; :func:`when` -> suggested only when its parent
    allows it. Constants are not suggested. Only ``trial.suggest_*`` is called,
    so this module does not import Optuna.
    """
    space = _check_space(space)
    values: dict[str, Any] = {}
    point: dict[str, Any] = {}
    for name, param in space.items():
        if not isinstance(param, Param):
            values[name] = param
            continue
        if isinstance(param, Conditional):
            if not param.active(values):
                continue
            param = param.param
        if isinstance(param, Choice):
            plain = _plain_options(param.options)
            raw = trial.suggest_categorical(name, list(param.options) if plain else list(range(len(param.options))))
        elif isinstance(param, LogUniform):
            raw = trial.suggest_float(name, float(param.low), float(param.high), log=True)
        elif isinstance(param, Uniform):
            raw = trial.suggest_float(name, float(param.low), float(param.high))
        elif isinstance(param, IntUniform):
            raw = trial.suggest_int(name, param.low, param.high, log=param.log)
        elif isinstance(param, QUniform):
            raw = trial.suggest_int(name, *param._k_range)
        else:
            raise SearchSpaceError(
                f"Parameter {name!r} is a {type(param).__name__}, which has no Optuna distribution. "
                "Fix: use choice, uniform, loguniform, quniform, randint or when."
            )
        point[name] = raw
        values[name] = _decode_one(param, raw)
    return point


def _decode_one(param: Param, raw: Any) -> Any:
    if isinstance(param, Choice):
        return raw if _plain_options(param.options) else param.options[int(raw)]
    if isinstance(param, QUniform):
        return param._value(int(raw))
    if isinstance(param, IntUniform):
        return int(raw)
    return float(raw)


def decode(space: Mapping[str, Any], point: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration of ``point`` (what :func:`suggest` returned): constants, then values in the space's order."""
    space = _check_space(space)
    out: dict[str, Any] = {}
    for name, param in space.items():
        if not isinstance(param, Param):
            out[name] = param
            continue
        if isinstance(param, Conditional):
            if not param.active(out):
                continue
            param = param.param
        if name not in point:
            raise SearchSpaceError(
                f"decode: the point has no value for parameter {name!r}; it has {sorted(point)}. "
                "Fix: decode a point with the space that suggested it."
            )
        out[name] = _decode_one(param, point[name])
    return out


def _encode_one(param: Param, value: Any) -> Any:
    if isinstance(param, Choice):
        return value if _plain_options(param.options) else param.options.index(value)
    if isinstance(param, QUniform):
        return round(value / param.q)
    if isinstance(param, IntUniform):
        return int(value)
    return float(value)


def encode(space: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The point (what :func:`suggest` returns) of a configuration, e.g. one :func:`sample` drew: the inverse of
    :func:`decode`, so an Optuna study can be told to try it (``study.enqueue_trial``)."""
    space = _check_space(space)
    point: dict[str, Any] = {}
    for name, param in space.items():
        if not isinstance(param, Param) or name not in params:
            continue
        point[name] = _encode_one(param.param if isinstance(param, Conditional) else param, params[name])
    return point
