"""Every option of a fit or a model search, declared, defaulted and checked once.

`SharedOptions` holds the options a fit and a search share (the cluster,
the parameter server's address and security, timeouts, retries, logging);
`FitOptions` adds a fit's own (`Trainer`, and `KerasEstimator` through it),
`SelectionOptions` a search's (`ModelSelector`). Users keep Keras-style
keyword arguments: ``Trainer(model, num_workers=4)`` builds
``FitOptions(num_workers=4)``, which checks every value when it is made; a
wrong one raises `OptionError` (a ValueError) in one wording,
"`name` must be .... Received: name=value", with a fix where there is one.
The jobs' command line (``jobs/support/cli.py``) and the Spark ML Params
(``trainer.ml.params``) take their defaults from here.

One default differs on purpose: a search's `io_timeout` is an hour, a
fit's ten minutes. A fit's workers and server talk every window; a search's
task may train a whole sub-epoch of a model before it reports.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from trainer.algorithms import PARAMETER_SERVER, Algorithm, get_algorithm, parse_compression, with_compression
from trainer.algorithms.choice import AUTO, FitFacts, choose_algorithm
from trainer.algorithms.delta import overlappable
from trainer.errors import OptionError
from trainer.ps.layout import check_shards
from trainer.ps.records import DEFAULT_HISTORY_SIZE
from trainer.runtime.feeding.shard import FEEDS
from trainer.spark.resources import check_gpus_per_worker
from trainer.transport.frame_auth import check_frame_mac


def _fail(name: str, what: str, value: Any, fix: str = "") -> OptionError:
    return OptionError(f"`{name}` must be {what}. Received: {name}={value!r:.80}" + (f". Fix: {fix}" if fix else ""))


def positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(name, "a positive integer", value)
    return value


def non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(name, "an integer >= 0", value)
    return value


def integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy's integers too
        raise _fail(name, "an integer", value)
    return int(value)


def positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise _fail(name, "a number > 0", value)
    return float(value)


def optional_positive_number(name: str, value: Any) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or
                              not 0 < value < float("inf")):
        raise _fail(name, "a number > 0 or None", value)
    return value


def flag(name: str, value: Any) -> bool:
    return bool(value)


def optional_port(name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535):
        raise _fail(name, "a TCP port (0 for any free one) or None", value)
    return value


def optional_text(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _fail(name, "a string or None", value)
    return value


def optional_path(name: str, value: Any) -> str | os.PathLike | None:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise _fail(name, "a path (string or os.PathLike) or None", value)
    return value


def optional_callable(name: str, value: Any) -> Callable | None:
    if value is not None and not callable(value):
        raise _fail(name, "a function or None", value)
    return value


def optional_dict(name: str, value: Any) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise _fail(name, "a dict of custom Keras objects or None", value, "custom_objects={'MyLayer': MyLayer}")
    return value


def columns(name: str, value: Any) -> str | list[str]:
    if isinstance(value, str) or (isinstance(value, (list, tuple)) and value and
                                  all(isinstance(v, str) for v in value)):
        return list(value) if isinstance(value, tuple) else value
    raise _fail(name, "a column name or a list of column names", value)


def workers(name: str, value: Any) -> int | tuple[int, int]:
    """A worker count, or ``(min, max)``: an elastic fit (``trainer.fit.elastic``)."""
    if isinstance(value, (tuple, list)):
        if (len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                and 1 <= value[0] <= value[1]):
            return (value[0], value[1]) if value[0] < value[1] else value[0]
        raise _fail(name, "a positive integer, or (min, max) with 1 <= min <= max for an elastic fit", value,
                    "num_workers=(2, 4)")
    return positive_int(name, value)


def feed(name: str, value: Any) -> str:
    if value not in FEEDS:
        raise _fail(name, f"one of {', '.join(map(repr, FEEDS))}", value)
    return value


def as_given(name: str, value: Any) -> Any:
    """No check of its own: the option is checked with the others (`check_together`)."""
    return value


def _domain(check: Callable[[Any], Any]) -> Callable[[str, Any], Any]:
    """A check written where its domain lives (GPUs, frame MACs, shards), raising `OptionError`."""
    def run(name: str, value: Any) -> Any:
        try:
            return check(value)
        except OptionError:
            raise
        except ValueError as exc:
            raise OptionError(str(exc)) from None
    return run


def option(default: Any, check: Callable[[str, Any], Any], *, factory: bool = False) -> Any:
    """A dataclass field with its default and its check (run by `Options.__post_init__`)."""
    if factory:
        return field(default_factory=default, metadata={"check": check})
    return field(default=default, metadata={"check": check})


@dataclass(kw_only=True)
class Options:
    """Checks every field when made; `default(name)` for those who show or reuse a default."""

    def __post_init__(self) -> None:
        for f in fields(self):
            check = f.metadata.get("check")
            if check is not None:
                setattr(self, f.name, check(f.name, getattr(self, f.name)))
        self.check_together()

    def check_together(self) -> None:
        """Checks of several options at once (after each option's own)."""

    def given(self, name: str) -> Any:
        """The value of option `name` as a user would give it again (an automatic choice gives back "auto")."""
        return getattr(self, name)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.init]

    @classmethod
    def check(cls, name: str, value: Any) -> Any:
        """One option's own check (the command lines check their flags with it before any cluster work)."""
        f = next(f for f in fields(cls) if f.name == name)
        return f.metadata["check"](name, value)

    @classmethod
    def default(cls, name: str) -> Any:
        f = next(f for f in fields(cls) if f.name == name)
        return f.default_factory() if f.default is dataclasses.MISSING else f.default

    @classmethod
    def signature(cls, positional: tuple[str, ...], **keywords: Any) -> inspect.Signature:
        """For help() and notebooks: the `positional` names, then `keywords` (name=default), then every option."""
        kinds = inspect.Parameter
        return inspect.Signature(
            [kinds(name, kinds.POSITIONAL_OR_KEYWORD) for name in positional]
            + [kinds(name, kinds.KEYWORD_ONLY, default=value) for name, value in keywords.items()]
            + [kinds(name, kinds.KEYWORD_ONLY, default=cls.default(name)) for name in cls.names()])

    @classmethod
    def of(cls, owner: str, values: dict[str, Any]) -> Options:
        """`cls(**values)`, naming `owner` and the known options for an unknown keyword."""
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}. Its options: "
                            f"{', '.join(cls.names())}.")
        return cls(**values)


class OptionAttributes:
    """Mixed into the classes that hold an `options` object (`Trainer`, `ModelSelector`): each option reads as
    an attribute of the same name (``trainer.epochs``), and setting one checks it again into a new `options`,
    so the attribute and `options` never differ (the driver reads `options`)."""

    options: Options

    def __getattr__(self, name: str) -> Any:  # only for names not found the usual way
        options = self.__dict__.get("options")
        if options is not None and name in options.names():
            return getattr(options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        options = self.__dict__.get("options")
        if options is not None and name in options.names():
            values = {n: options.given(n) for n in options.names()}
            name, value = "options", type(options).of(type(self).__name__, {**values, name: value})
        object.__setattr__(self, name, value)


@dataclass(kw_only=True)
class SharedOptions(Options):
    """The options of a fit and of a search (the `Trainer` and `ModelSelector` docstrings say what each does)."""

    num_workers: int = option(2, positive_int)
    features_col: str | list[str] = option("features", columns)
    label_col: str = option("label", columns)
    custom_objects: dict[str, Any] | None = option(None, optional_dict)
    seed: int = option(0, integer)
    checkpoint_dir: str | os.PathLike | None = option(None, optional_path)
    ps_host: str | None = option(None, optional_text)
    ps_port: int | None = option(None, optional_port)
    ps_bind_host: str | None = option(None, optional_text)
    io_timeout: float = option(600.0, positive_number)
    slot_timeout: float = option(10.0, positive_number)
    max_retries: int = option(2, non_negative_int)
    gpus_per_worker: int = option(0, _domain(check_gpus_per_worker))
    verbose: bool = option(True, flag)
    check_data: bool = option(True, flag)
    mlflow: bool = option(False, flag)
    tls: bool = option(False, flag)
    frame_mac: bool | str = option(True, _domain(check_frame_mac))


@dataclass(kw_only=True)
class FitOptions(SharedOptions):
    """A fit's options: `SharedOptions` and the algorithm, the sizes, checkpoints, hooks, the feed, the server."""

    num_workers: int = option(2, workers)
    algorithm: Algorithm | str = option("auto", as_given)
    batch_size: int = option(32, positive_int)
    epochs: int = option(1, positive_int)
    retry_timeout: float = option(60.0, positive_number)
    min_workers: int = option(1, positive_int)
    checkpoint_every: int = option(100, positive_int)
    checkpoint_keep: int = option(2, positive_int)
    on_update: Callable[[Any], None] | None = option(None, optional_callable)
    on_epoch_end: Callable | None = option(None, optional_callable)
    share_epochs: bool = option(True, flag)
    compression: str | None = option(None, as_given)
    compress_replies: bool = option(False, flag)
    history_size: int = option(DEFAULT_HISTORY_SIZE, positive_int)
    feed: str = option("auto", feed)
    shard_budget_mb: float | None = option(None, optional_positive_number)
    ps_shards: int = option(1, positive_int)
    overlap: bool = option(False, flag)

    #: ``(min, max)`` of an elastic fit, else None; `num_workers` is then the max and `min_workers` the min.
    elastic: tuple[int, int] | None = field(default=None, init=False, repr=False)

    def check_together(self) -> None:
        if isinstance(self.num_workers, tuple):
            self.elastic = self.num_workers
            if self.min_workers not in (1, self.elastic[0]):
                raise _fail("min_workers", f"left out with num_workers={self.elastic} (its min is the floor)",
                            self.min_workers, f"num_workers=({self.min_workers}, {self.elastic[1]})")
            self.min_workers, self.num_workers = self.elastic
        # "auto": the algorithm for what is known here (no hosts yet); each fit chooses again with its cluster's hosts
        self.algorithm_choice = choose_algorithm(self.facts()) if _is_auto(self.algorithm) else None
        algorithm = self.algorithm_choice.algorithm if self.algorithm_choice is not None else self.algorithm
        self.algorithm = with_compression(get_algorithm(algorithm), self.compression, replies=self.compress_replies)
        self.ps_shards = _domain(lambda shards: check_shards(shards, self.algorithm))("ps_shards", self.ps_shards)
        try:
            self.algorithm.check_workers(self.num_workers)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        if self.min_workers > self.num_workers:
            raise _fail("min_workers", f"<= num_workers={self.num_workers}", self.min_workers)
        if self.elastic is not None:
            check_elastic(self.algorithm, self.ps_shards)
        if self.overlap and not overlappable(self.algorithm):
            raise OptionError(f"`overlap=True` needs a delta algorithm with a window (downpour, adag, dynsgd). "
                              f"Received: {self.algorithm.describe()}. Fix: use one of those algorithms or "
                              "overlap=False.")


    def given(self, name: str) -> Any:
        if name == "num_workers" and self.elastic is not None:
            return self.elastic
        if name == "min_workers" and self.elastic is not None:
            return 1
        return "auto" if name == "algorithm" and self.algorithm_choice is not None else getattr(self, name)

    def facts(self, hosts: int | None = None) -> FitFacts:
        """What an automatic choice of the algorithm goes by (``trainer.fit.choice``), `hosts` from the cluster."""
        compressed = parse_compression(self.compression) is not None  # "none" is no compression
        ps_options = tuple(name for name, given in (("compression", compressed), ("overlap", self.overlap),
                                                    ("ps_shards", self.ps_shards != 1)) if given)
        return FitFacts(self.num_workers, self.gpus_per_worker, hosts, ps_options, elastic=self.elastic is not None)


def check_elastic(algorithm: Algorithm, ps_shards: int) -> None:
    """Raise `OptionError` when an elastic fit (``num_workers=(min, max)``) cannot run `algorithm`."""
    collective = algorithm.fit_kind != PARAMETER_SERVER
    if collective and getattr(algorithm, "periodic", False):
        return  # local SGD: averaged by the server over the workers of each round (trainer.fit.kinds.ElasticFit)
    if collective or algorithm.synchronous:
        raise OptionError(
            f"An elastic fit (num_workers=(min, max)) runs local SGD and the asynchronous parameter-server "
            f"algorithms, whose workers may come and go between exchanges; {algorithm.describe()} needs the same "
            f"workers at every {'step' if collective else 'round'}. Fix: leave `algorithm` out (an elastic fit then "
            "runs DOWNPOUR), name localsgd, downpour, adag, dynsgd or aeasgd, or give num_workers as one integer.")
    if ps_shards != 1:
        raise OptionError(f"An elastic fit (num_workers=(min, max)) serves one parameter server; received ps_shards="
                          f"{ps_shards}. Fix: ps_shards=1, or give num_workers as one integer.")


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.lower() == AUTO


@dataclass(kw_only=True)
class SelectionOptions(SharedOptions):
    """A search's options: `SharedOptions` (a longer `io_timeout`, the module docstring) and the evaluation batch."""

    num_workers: int = option(2, workers)
    io_timeout: float = option(3600.0, positive_number)
    eval_batch_size: int = option(256, positive_int)

    #: ``(min, max)`` of an elastic search, else None; `num_workers` is then the max.
    elastic: tuple[int, int] | None = field(default=None, init=False, repr=False)

    def check_together(self) -> None:
        if isinstance(self.num_workers, tuple):
            self.elastic = self.num_workers
            self.num_workers = self.elastic[1]

    def given(self, name: str) -> Any:
        return self.elastic if name == "num_workers" and self.elastic is not None else super().given(name)
