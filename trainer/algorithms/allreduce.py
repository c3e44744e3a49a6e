"""AllReduce: synchronous data-parallel training on the Keras backend's own collectives, no parameter server.

The N barrier tasks become ONE group on the backend's own collective engine
(JAX's distributed runtime as a Keras ``DataParallel`` distribution,
TensorFlow's collective ops, or ``torch.distributed``). Every step, each task
feeds its ``batch_size`` rows as its part of a global batch of
``N * batch_size`` rows, computes its gradients on them with Keras's own
train step, and ONE all-reduce averages them (gloo or a gRPC ring between
CPUs, NCCL between GPUs), so every replica takes the step plain Keras takes
on the global batch. The tasks' loop is ``trainer.runtime.collective``; the
driver's side is ``trainer.fit.kinds.CollectiveFit``.

The learning rate follows the global batch (`lr_scaling`): an epoch of N
workers takes 1/N of the steps of one, so at the compiled rate it learns
less per epoch (MNIST 0.952 / 0.929 / 0.910 test accuracy at 1 / 2 / 4
workers after the same epochs, a regression's MSE 4.44 against plain
Keras's 0.70 at 2 workers). Large-batch practice raises the rate with the
batch (Goyal et al. 2017; Horovod's and PyTorch's guides): ``"linear"`` (the
default) multiplies the compiled rate by N, ``"sqrt"`` by the square root
of N, ``"none"`` keeps it (for a rate already set for the global batch).

The driver hears from task 0 once per epoch, through the same parameter
server as the other algorithms, but with one client only: task 0 commits the
model's full state (weights and optimizer variables) at every epoch end and
reports the epoch's logs. The endpoint's algorithm (``ReportedState``,
``trainer.algorithms.reported``) keeps that state as the center: it is what
checkpoints save, what the driver's callbacks see and where a retried stage resumes from. Nothing crosses the
driver per step.

``period`` sets the cadence over the group. ``1`` (the default) is the
per-step gradient all-reduce above. A larger ``period``, or ``"auto"``, is
local SGD (`LocalSGD`, ``trainer.algorithms.local_sgd``): each process takes
Keras's own steps on its own rows, and every ``period`` steps ONE all-reduce
averages the replicas' weights (``trainer.runtime.collective.averaging``),
so the link carries ``1/period`` of the bytes; ``wire="bf16"`` halves them
again; ``outer_momentum`` applies the averaged step with Nesterov momentum
(an outer optimizer, as SlowMo and DiLoCo do). The driver still hears once
per epoch.

It implements the collective contract (``trainer.algorithms.base.CollectiveAlgorithm``), so the trainer runs the
collective kind of fit (``trainer.fit.kinds``) instead of the parameter-server one; `check_backend` asks the
backends' rooms (``trainer.backends``) which have a collective path here: all three of Keras 3's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.base import AlgorithmConfigError, CollectiveAlgorithm
from trainer.algorithms.cadence import MAX_PERIOD, PeriodCadence
from trainer.backends import collective_names

#: How the compiled learning rate follows the global batch of N workers (the module docstring).
LR_SCALING = {"linear": float, "sqrt": math.sqrt, "none": lambda workers: 1.0}
#: How the averaged weights travel: as float32, or as bfloat16 with the rounding kept for the next average.
WIRES = ("fp32", "bf16")


@dataclass(frozen=True)
class AllReduce(CollectiveAlgorithm):
    """Per-step gradient all-reduce over all workers: plain Keras on the global batch (``num_workers * batch_size``).

    Example:
        >>> Trainer(model, algorithm=AllReduce(), num_workers=4, batch_size=32)

    Args:
        lr_scaling: String. How the compiled learning rate follows the global batch of
            ``num_workers * batch_size`` rows: ``"linear"`` (default: times the number of workers),
            ``"sqrt"`` (times its square root) or ``"none"`` (the compiled rate, already set for the global
            batch). A schedule's rates are scaled the same way; a rate the driver's callbacks set
            (ReduceLROnPlateau) too.
        period: Integer or ``"auto"``. ``1`` (default): every step's gradients are all-reduced. ``H > 1``: each
            worker takes ``H`` steps of its own, then the workers' weights are averaged in one all-reduce (local
            SGD). ``"auto"``: averaged every step for the first steps while the step and the average are timed,
            then every ``H`` steps, ``H`` the smallest that keeps the average under 5 % of the time, at most
            `max_period`.
        max_period: Integer. The bound of ``period="auto"`` (default 16).
        wire: String. ``"fp32"`` (default) or ``"bf16"``: the averaged deltas travel as bfloat16, half the bytes,
            the rounding carried into the next average. Periodic averaging only.
        outer_momentum: Float in [0, 1). ``0.0`` (default): the trainable weights move by the averaged delta.
            Above 0 they move by a Nesterov step over the averaged deltas with this momentum (``LocalSGD``'s
            default is 0.5). Periodic averaging only.
    """

    lr_scaling: str = "linear"
    period: int | str = 1
    max_period: int = MAX_PERIOD
    wire: str = "fp32"
    outer_momentum: float = 0.0

    name: ClassVar[str] = "allreduce"
    #: Task 0 sends the optimizer's variables with the weights: a retry or a resume goes on with Adam's moments
    #: and the iteration count (a learning-rate schedule) where they were.
    exchanges_optimizer_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.lr_scaling not in LR_SCALING:
            raise AlgorithmConfigError(
                f"AllReduce's lr_scaling is one of {', '.join(map(repr, LR_SCALING))}. Received: "
                f"lr_scaling={self.lr_scaling!r}. Fix: 'linear' (the default) to scale the compiled rate with the "
                "number of workers, or 'none' when the rate is already set for the global batch."
            )
        check_cadence(self)

    def learning_rate_factor(self, workers: int) -> float:
        """What the compiled learning rate is multiplied by at `workers` workers."""
        return float(LR_SCALING[self.lr_scaling](workers))

    def check_backend(self, backend: str) -> None:
        """Raise AlgorithmConfigError unless Keras's `backend` has a collective path here."""
        if backend in collective_names():
            return
        raise AlgorithmConfigError(
            f"AllReduce trains on the Keras backend's own collective engine, which exists for "
            f"{', '.join(collective_names())}. Received: backend={backend!r}. Fix: set KERAS_BACKEND to one of "
            "them before Keras starts (the tasks use the driver's backend), or pick a parameter-server algorithm "
            "(leave `algorithm` out: DOWNPOUR)."
        )

    def cadence(self) -> PeriodCadence:
        """The cadence's settings as the collective loop takes them."""
        return PeriodCadence(self.period, self.max_period, self.wire, float(self.outer_momentum))

    @property
    def periodic(self) -> bool:
        """Whether the workers take local steps between averages (local SGD) rather than one global step."""
        return self.cadence().periodic

    def describe(self) -> str:
        if not self.periodic:
            cadence = "every step"
        elif self.period == "auto":
            cadence = f"averaged every auto <= {self.max_period} steps"
        else:
            cadence = f"averaged every {self.period} steps"
        wire = f", {self.wire}" if self.wire != "fp32" else ""
        wire += f", outer momentum {self.outer_momentum:g}" if self.outer_momentum else ""
        scaling = "" if self.lr_scaling == "linear" else f", lr_scaling={self.lr_scaling}"
        return f"{self.name}({cadence}{wire}){scaling}"


def check_cadence(algorithm: AllReduce) -> None:
    """Raise AlgorithmConfigError unless `algorithm`'s period, max_period, wire and outer momentum work together."""
    period, bound, wire = algorithm.period, algorithm.max_period, algorithm.wire
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise AlgorithmConfigError(f"{algorithm.name}'s max_period is an integer >= 1. Received: max_period={bound!r}. "
                                   f"Fix: leave it out ({MAX_PERIOD}) or pass e.g. max_period=8.")
    if period != "auto" and (isinstance(period, bool) or not isinstance(period, int) or period < 1):
        raise AlgorithmConfigError(
            f"{algorithm.name}'s period is an integer >= 1 or 'auto'. Received: period={period!r}. Fix: period=1 for a "
            "gradient all-reduce every step, period=8 to average the weights every 8 steps, or 'auto'.")
    if wire not in WIRES:
        raise AlgorithmConfigError(f"{algorithm.name}'s wire is one of {', '.join(map(repr, WIRES))}. Received: "
                                   f"wire={wire!r}. Fix: 'bf16' to halve the bytes of each average, else 'fp32'.")
    if wire != "fp32" and period == 1:
        raise AlgorithmConfigError(
            f"wire={wire!r} applies to periodic averaging; a gradient all-reduce every step (period=1) sends "
            "float32. Fix: period='auto' (or an integer > 1) with wire='bf16', or leave wire out.")
    momentum = algorithm.outer_momentum
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
        raise AlgorithmConfigError(
            f"{algorithm.name}'s outer_momentum is a number in [0, 1). Received: outer_momentum={momentum!r}. "
            "Fix: 0.5 (LocalSGD's default), or 0 to move the weights by the averaged delta alone.")
    if momentum and period == 1:
        raise AlgorithmConfigError(
            f"outer_momentum={momentum!r} applies to periodic averaging; a gradient all-reduce every step "
            "(period=1) is the optimizer's own step. Fix: period='auto' (or an integer > 1), or leave it out.")
