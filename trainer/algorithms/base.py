"""The two contracts a distributed algorithm implements, one per kind of fit.

An algorithm is a small frozen dataclass holding its hyper-parameters. Every one
(`Algorithm`) names itself, its kind of fit (``trainer.fit.kinds`` runs each), whether
its state carries the optimizer's variables, and how it describes itself. Then:

* `CollectiveAlgorithm` (``AllReduce``, ``LocalSGD``): the tasks train and average
  among themselves on the backend's collective engine. The contract is what the
  collective loop asks: the group's cadence (``cadence()``, a
  ``trainer.algorithms.cadence.PeriodCadence``), the learning rate's factor at N
  workers and the backends with a collective path. No parameter-server function.
* `ParameterServerAlgorithm`: workers commit to the driver's server. The contract
  is four PURE functions (lists of numpy arrays in, lists of numpy arrays out),
  which know nothing about sockets, Keras or Spark:

worker side (runs in each Spark task)
    ``worker_payload(weights, anchor)`` -> arrays to send to the server.
        ``weights`` are the worker's current weights W, ``anchor`` the
        weights W0 it had right after its last exchange with the server.
    ``worker_apply(weights, anchor, reply)`` -> ``(new_weights, new_anchor)``
        once the server's reply arrives.

server side (runs in the parameter server thread of the driver)
    asynchronous algorithms (``synchronous = False``):
        ``server_commit(center, payload, staleness)`` -> ``(new_center, reply)``
        applied under a lock as soon as one worker's payload arrives.
        ``staleness`` is the number of center updates made by other workers
        since this worker last received the center.
        Optional in-place form, for algorithms whose reply is the new center
        (DOWNPOUR, ADAG, DynSGD and their compressed forms):
        ``server_apply(center, payload, staleness, out)`` writes the new center
        into `out` (arrays shaped and typed like `center`, not aliasing it) and
        returns nothing; it must give bit-identical results to
        ``server_commit``. It is element-wise per tensor, so the server may
        call it one tensor at a time (``center[i:i+1]``, the payload's
        ``payload_arrays`` arrays of that tensor, ``out[i:i+1]``) under that
        tensor's lock and keep its center allocated once
        (``trainer.ps.center``). The payload may alias `out`.
    synchronous algorithms (``synchronous = True``):
        ``server_round(center, payloads)`` -> ``(new_center, replies)``
        applied once every worker has sent its payload for the round;
        ``payloads`` and ``replies`` are ordered by worker index.

``window`` is the number of minibatches between two exchanges, ``None``
for one exchange at the end of every epoch, or ``"auto"`` (algorithms with
``auto_window``: DOWNPOUR, DynSGD) for a window the worker sizes from the
measured step and exchange times (``trainer.algorithms.cadence``). Every worker also makes one last
exchange at the end of training if batches are left since its last one.

Copies. An algorithm never modifies the arrays it is given, and nobody modifies the
arrays an algorithm returns, so returned arrays may alias inputs or each other (the
reply of DOWNPOUR is the new center itself; the worker adopts the received
reply without copying it). With a worker's 4 MB of weights every copy saved
is about a millisecond per exchange.

Shards. With ``Trainer(ps_shards=S)`` each shard of the server holds flat
pieces of the tensors; a worker's payload is cut into each shard's part by
``split_payload`` (flat views of a dense payload; a top-k payload is cut by
index). Every algorithm but those that keep optimizer state on the server is
element-wise, so each shard runs the same algorithm on its pieces.

Compression (``trainer.algorithms.compressed``) wraps a delta algorithm: the worker
calls ``worker_commit(weights, anchor, residual)``, which by default is
``worker_payload`` with the error-feedback residual passed through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from trainer.algorithms.cadence import PeriodCadence

Arrays = list[np.ndarray]
#: The window a worker sizes itself from the measured step and exchange times (``trainer.algorithms.cadence``).
AUTO = "auto"
#: The kinds of fit an algorithm declares (`Algorithm.fit_kind`; ``trainer.fit.kinds`` runs each): workers committing
#: to the driver's parameter server, or tasks averaging among themselves on the backend's collective engine.
PARAMETER_SERVER, COLLECTIVE = "parameter server", "collective"
#: Each shard's pieces of the model: ``(tensor index, first flat element, end)``.
Layout = Sequence[Sequence[tuple[int, int, int]]]


class AlgorithmConfigError(ValueError):
    """An algorithm was given hyper-parameters it cannot work with."""


@dataclass(frozen=True)
class Algorithm:
    """What every algorithm declares, whatever its kind of fit (the module docstring)."""

    name: ClassVar[str] = "algorithm"
    #: The kind of fit that runs this algorithm (``trainer.fit.kinds``): `PARAMETER_SERVER` or `COLLECTIVE`.
    fit_kind: ClassVar[str] = PARAMETER_SERVER
    #: True when the state a worker sends (and a checkpoint keeps) holds the optimizer's variables after the weights.
    exchanges_optimizer_state: ClassVar[bool] = False
    #: Minibatches between two exchanges with the parameter server (`ParameterServerAlgorithm`); None otherwise.
    window: ClassVar[int | str | None] = None

    def check_workers(self, num_workers: int) -> None:
        """Raise AlgorithmConfigError if this algorithm cannot run on `num_workers`."""

    def describe(self) -> str:
        """Short human-readable name with hyper-parameters, for logs and reports."""
        return self.name


@dataclass(frozen=True)
class CollectiveAlgorithm(Algorithm):
    """The collective contract (the module docstring): what the collective loop asks of its algorithm."""

    fit_kind: ClassVar[str] = COLLECTIVE

    def cadence(self) -> PeriodCadence:
        """How often the group exchanges and what travels."""
        raise NotImplementedError

    def learning_rate_factor(self, workers: int) -> float:
        """What the compiled learning rate is multiplied by at `workers` workers."""
        raise NotImplementedError

    def check_backend(self, backend: str) -> None:
        """Raise AlgorithmConfigError unless Keras's `backend` has a collective path for this algorithm."""
        raise NotImplementedError


@dataclass(frozen=True)
class ParameterServerAlgorithm(Algorithm):
    """The parameter server's contract; see the module docstring.

    Subclasses are frozen dataclasses that provide a ``window`` field or property.
    """

    fit_kind: ClassVar[str] = PARAMETER_SERVER
    #: True when ``window="auto"`` is allowed (the pure functions do not depend on the window).
    auto_window: ClassVar[bool] = False
    synchronous: ClassVar[bool] = False
    #: Arrays of a payload per model weight (a top-k payload has two: indices and values).
    payload_arrays: ClassVar[int] = 1
    #: The largest automatic window, or None for the staleness bound (``trainer.algorithms.cadence``).
    window_bound: ClassVar[int | None] = None
    #: Exchanges after every step before an automatic window is sized (local SGD's warm-up).
    window_warmup: ClassVar[int] = 0

    def __post_init__(self) -> None:
        check_window(self.window, allow_auto=self.auto_window)

    # -- worker side -------------------------------------------------------
    def worker_payload(self, weights: Sequence[np.ndarray], anchor: Sequence[np.ndarray]) -> Arrays:
        raise NotImplementedError

    def worker_commit(
        self, weights: Sequence[np.ndarray], anchor: Sequence[np.ndarray], residual: Arrays | None
    ) -> tuple[Arrays, Arrays | None]:
        """``(payload, new residual)``: the payload to send and what a lossy codec left for the next commit."""
        return self.worker_payload(weights, anchor), residual

    def worker_apply(
        self, weights: Sequence[np.ndarray], anchor: Sequence[np.ndarray], reply: Sequence[np.ndarray]
    ) -> tuple[Arrays, Arrays]:
        raise NotImplementedError

    # -- server side -------------------------------------------------------
    def server_commit(
        self, center: Sequence[np.ndarray], payload: Sequence[np.ndarray], staleness: int
    ) -> tuple[Arrays, Arrays]:
        raise NotImplementedError(f"{self.name} is synchronous; use server_round")

    def server_round(
        self, center: Sequence[np.ndarray], payloads: Sequence[Sequence[np.ndarray]]
    ) -> tuple[Arrays, list[Arrays]]:
        raise NotImplementedError(f"{self.name} is asynchronous; use server_commit")

    def split_payload(self, payload: Sequence[np.ndarray], layout: Layout) -> list[Arrays]:
        """The payload's part for each shard of a sharded server (``Trainer(ps_shards=S)``).

        `layout` lists each shard's pieces ``(tensor, start, stop)``: flat
        element ranges of the model's tensors. A dense payload (one array per
        weight) splits into flat views, no copies (`split_dense`).
        """
        return split_dense(payload, layout)

    def describe(self) -> str:
        if self.window == AUTO:
            return f"{self.name}(auto window)"
        every = "epoch" if self.window is None else f"{self.window} batches"
        return f"{self.name}(every {every})"


def split_dense(arrays: Sequence[np.ndarray], layout: Layout) -> list[Arrays]:
    """For each shard of `layout`, the flat slice ``ravel(arrays[t])[start:stop]`` of each of its pieces (views of
    contiguous arrays)."""
    return [[np.ravel(arrays[t])[start:stop] for t, start, stop in pieces] for pieces in layout]


def copy_arrays(arrays: Sequence[np.ndarray]) -> Arrays:
    return [np.array(a, copy=True) for a in arrays]


def add(a: Sequence[np.ndarray], b: Sequence[np.ndarray], scale: float = 1.0) -> Arrays:
    """Element-wise ``a + scale * b`` keeping the dtype of ``a`` (one pass, no temporary when scale is 1)."""
    out = []
    for x, y in zip(a, b, strict=True):
        if scale == 1.0:
            r = np.add(x, y)
        else:
            r = np.asarray(np.multiply(y, scale))  # 0-d weights give numpy scalars, which take no out=
            r = np.add(r, x, out=r) if r.dtype.kind == "f" and r.shape == np.shape(x) else r + x
        out.append(r.astype(np.asarray(x).dtype, copy=False))
    return out


def sub(a: Sequence[np.ndarray], b: Sequence[np.ndarray], scale: float = 1.0) -> Arrays:
    """Element-wise ``scale * (a - b)`` keeping the dtype of ``a`` (scaled in place)."""
    out = []
    for x, y in zip(a, b, strict=True):
        r = np.asarray(np.subtract(x, y))  # as in add: a 0-d array, not a numpy scalar
        if scale != 1.0:
            r = np.multiply(r, scale, out=r) if r.dtype.kind == "f" else r * scale
        out.append(r.astype(np.asarray(x).dtype, copy=False))
    return out


def add_into(out: Sequence[np.ndarray], a: Sequence[np.ndarray], b: Sequence[np.ndarray],
             scale: float = 1.0) -> None:
    """``out[i] = a[i] + scale * b[i]``: exactly what `add` returns, written into `out` without temporaries.

    `b` may be `out` itself. Float arrays of one dtype take the in-place ufuncs
    (the same operations in the same order as `add`, so the bits are the
    same); anything else (integer weights, mixed dtypes, a numpy scalar
    `scale` that widens the arithmetic) goes through `add` and is copied in.
    """
    for o, x, y in zip(out, a, b, strict=True):
        if (o.dtype.kind == "f" and o.dtype == x.dtype == y.dtype and o.shape == np.shape(x) == np.shape(y)
                and (scale == 1.0 or np.result_type(y, scale) == o.dtype)):
            if scale == 1.0:
                np.add(x, y, out=o)
            else:
                np.multiply(y, scale, out=o)
                np.add(o, x, out=o)
        else:
            np.copyto(o, add([x], [y], scale)[0])


def check_window(window: int | str | None, *, allow_epoch: bool = True, allow_auto: bool = False) -> None:
    if (window is None and allow_epoch) or (window == AUTO and allow_auto):
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        expected = ("a positive number of batches" + (" or None (once per epoch)" if allow_epoch else "")
                    + (' or "auto" (sized by time)' if allow_auto else ""))
        raise AlgorithmConfigError(f"`window` must be {expected}. Received: window={window!r}")
