"""Local SGD in an elastic fit: the periodic average taken by the parameter server over the workers training now.

A fixed fit's `LocalSGD` averages a fixed group on the backend's collective
engine. An elastic fit (``Trainer(num_workers=(min, max))``) has no fixed
group: its workers are chunk tasks that come and go
(``trainer.fit.kinds.ElasticFit``). There `ElasticLocalSGD` (built from the
user's `LocalSGD` or periodic `AllReduce` by `ElasticLocalSGD.of`) runs the
same method through the driver's parameter server, which every elastic
worker talks to already:

* each worker takes Keras's own steps on its chunk and, every ``period``
  steps, commits its delta since the last average (bfloat16 with error
  feedback by default, the same codec as compressed commits);
* the server's round closes when every chunk task training at that moment
  has committed (``trainer.ps.rounds``): a worker that leaves is no longer
  waited for, one that joins is in the next round it commits to; a round is
  the group re-formed at a period boundary, whatever the backend;
* every worker trains at the compiled rate times the factor of the fit's
  maximum of workers (``lr_scaling``, ``"linear"``: times max, as a fixed
  fit of max workers multiplies it by max);
* `outer_step` (pure numpy) moves the center by the averaged delta, times
  ``factor(n) / factor(max)`` for a round of ``n`` workers, with
  ``outer_momentum`` as a Nesterov step on the trained weights; the weights
  that are not trained (BatchNormalization's statistics) move by the averaged
  delta alone, integer ones (seed generators) stay each worker's own.

The learning rate when the workers change: a round of all max workers is the
fixed fit's average exactly; a round of fewer is shrunk in proportion, so an
epoch, whose rows are the same whatever the workers, moves the weights about
as far as plain Keras's (to first order: a step proportional to the rate, as
SGD's and Adam's are). The factor is not put on a smaller rate and a larger
outer step instead: the sum of N deltas each trained at the compiled rate
overshoots as DOWNPOUR's stale commits do (on the MNIST CNN at 3 workers and
16 local steps such fits diverged, while the same average of deltas trained at
3 times the rate reached the fixed fit's accuracy). A process's rate is set
once, when it builds its model, so a rate the driver's callbacks set is scaled
the same way (``trainer.runtime.collective.rates``). The outer velocity lives
on the server (`OuterRounds`) and is not checkpointed (a resumed fit starts it
again from zero).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from trainer.algorithms.allreduce import LR_SCALING, WIRES
from trainer.algorithms.base import AlgorithmConfigError, Arrays, ParameterServerAlgorithm
from trainer.algorithms.cadence import MAX_PERIOD, PROBE_STEPS
from trainer.algorithms.compression import BFloat16, compress_with_feedback


def _is_float(a: np.ndarray) -> bool:
    return np.asarray(a).dtype.kind == "f"


def outer_step(center: Sequence[np.ndarray], deltas: Sequence[Sequence[np.ndarray]],
               velocity: Sequence[np.ndarray | None] | None, trained: Sequence[bool], factor: float,
               momentum: float) -> tuple[Arrays, list[np.ndarray | None]]:
    """The new center and velocity after one round (pure: nothing given is changed).

    `deltas` holds each committing worker's float deltas (one array per center array; an integer array's entry
    is ignored); `trained[i]` says whether array `i` is trained (the factor and the momentum apply to those only);
    `velocity` is the last round's (None: zeros).
    """
    if not deltas:
        raise ValueError("outer_step needs at least one worker's delta")
    new_center: Arrays = []
    new_velocity: list[np.ndarray | None] = []
    for i, c in enumerate(center):
        if not _is_float(c):
            new_center.append(c)
            new_velocity.append(None)
            continue
        mean = np.mean(np.stack([np.asarray(d[i], np.float32) for d in deltas]), axis=0)
        if trained[i]:
            step = mean * np.float32(factor)
            if momentum:
                v = step if velocity is None or velocity[i] is None else np.float32(momentum) * velocity[i] + step
                new_velocity.append(v)
                step = step + np.float32(momentum) * v
            else:
                new_velocity.append(None)
        else:
            step = mean
            new_velocity.append(None)
        new_center.append((np.asarray(c, np.float32) + step).astype(c.dtype, copy=False))
    return new_center, new_velocity


@dataclass(frozen=True)
class ElasticLocalSGD(ParameterServerAlgorithm):
    """`LocalSGD`'s method for an elastic fit, through the parameter server (the module docstring).

    Args:
        period: Integer or ``"auto"``: steps between two commits; ``"auto"`` commits after every step for the
            first `PROBE_STEPS` (a warm-up, as the fixed fit's), then sizes the period by time (the parameter
            server's automatic window, bounded by `max_period` instead of a staleness bound: a round has none).
        max_period: Integer. The bound of an automatic period.
        wire: String. ``"bf16"`` or ``"fp32"``: how the deltas travel.
        outer_momentum: Float in [0, 1). The Nesterov momentum of the center's step.
        lr_scaling: String. ``"linear"``, ``"sqrt"`` or ``"none"``: how the compiled rate follows `max_workers`
            (the rounds of fewer are shrunk by the same factor's ratio).
        max_workers: Integer. The fit's maximum of workers.
    """

    period: int | str = "auto"
    max_period: int = MAX_PERIOD
    wire: str = "bf16"
    outer_momentum: float = 0.5
    lr_scaling: str = "linear"
    max_workers: int = 1

    name: ClassVar[str] = "localsgd"
    synchronous: ClassVar[bool] = True
    auto_window: ClassVar[bool] = True
    window_warmup: ClassVar[int] = PROBE_STEPS  # averaged every step first, as the fixed fit's warm-up

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.wire not in WIRES:
            raise AlgorithmConfigError(f"`wire` must be one of {WIRES}. Received: wire={self.wire!r}")
        if self.lr_scaling not in LR_SCALING:
            raise AlgorithmConfigError(f"`lr_scaling` must be one of {tuple(LR_SCALING)}. "
                                       f"Received: lr_scaling={self.lr_scaling!r}")

    @classmethod
    def of(cls, algorithm: Any, max_workers: int) -> ElasticLocalSGD:
        """The elastic form of a periodic `AllReduce` (`LocalSGD`), with its hyper-parameters, for a fit of up to
        `max_workers`."""
        return cls(period=algorithm.period, max_period=algorithm.max_period, wire=algorithm.wire,
                   outer_momentum=algorithm.outer_momentum, lr_scaling=algorithm.lr_scaling,
                   max_workers=int(max_workers))

    @property
    def rate_factor(self) -> float:
        """What each worker's compiled learning rate is multiplied by."""
        return float(LR_SCALING[self.lr_scaling](self.max_workers))

    def round_factor(self, workers: int) -> float:
        """What the averaged delta of a round of `workers` is multiplied by."""
        return float(LR_SCALING[self.lr_scaling](workers)) / self.rate_factor

    @property
    def window(self) -> int | str:  # type: ignore[override]
        return self.period

    @property
    def window_bound(self) -> int:  # type: ignore[override]
        return int(self.max_period)

    @property
    def codec(self) -> BFloat16 | None:
        return BFloat16() if self.wire == "bf16" else None

    # -- worker side -------------------------------------------------------
    def worker_payload(self, weights, anchor):
        return [np.subtract(w, a, dtype=np.float32) if _is_float(w) else np.zeros(np.shape(w), np.float32)
                for w, a in zip(weights, anchor, strict=True)]

    def worker_commit(self, weights, anchor, residual):
        delta = self.worker_payload(weights, anchor)
        codec = self.codec
        return (delta, residual) if codec is None else compress_with_feedback(codec, delta, residual)

    def worker_apply(self, weights, anchor, reply):
        new = [r if _is_float(w) else w for w, r in zip(weights, reply, strict=True)]
        return new, new

    # -- server side -------------------------------------------------------
    def check_payload(self, arrays: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]) -> str | None:
        """What is wrong with a received payload for a center of `shapes`, or None."""
        if self.codec is not None:
            return self.codec.check(arrays, shapes)
        if len(arrays) != len(shapes) or any(a.shape != tuple(s) or a.dtype != np.float32
                                             for a, s in zip(arrays, shapes)):
            return (f"a local SGD payload must be {len(shapes)} float32 deltas shaped as the model's weights; the "
                    "worker's model differs from the server's")
        return None

    def deltas(self, payload: Sequence[np.ndarray], center: Sequence[np.ndarray]) -> Arrays:
        """A received payload as deltas shaped and typed as the center (`outer_step` reads them as float32)."""
        codec = self.codec
        return list(payload) if codec is None else codec.decode(payload, center)

    def describe(self) -> str:
        period = f"period auto <= {self.max_period}" if self.period == "auto" else f"period {self.period}"
        return (f"localsgd({period}, {self.wire}, outer momentum {self.outer_momentum}, averaged by the parameter "
                "server over the workers of each round)")


class OuterRounds:
    """The server's side of `ElasticLocalSGD`: its rounds, with the outer velocity kept between them.

    `trained` (one bool per center array) is set by the fit before any round (``trainer.fit.kinds.ElasticFit``);
    every other attribute is the algorithm's.
    """

    def __init__(self, algorithm: ElasticLocalSGD) -> None:
        self.algorithm = algorithm
        self.trained: list[bool] | None = None
        self.velocity: list[np.ndarray | None] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.algorithm, name)

    def server_round(self, center, payloads):
        algorithm = self.algorithm
        trained = self.trained if self.trained is not None else [True] * len(center)
        deltas = [algorithm.deltas(p, center) for p in payloads]
        factor = algorithm.round_factor(len(payloads))
        new_center, self.velocity = outer_step(center, deltas, self.velocity, trained, factor,
                                               algorithm.outer_momentum)
        return new_center, [new_center for _ in payloads]
