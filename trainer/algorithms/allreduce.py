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
server as the other rules, but with one client only: task 0 commits the
model's full state (weights and optimizer variables) at every epoch end and
reports the epoch's logs. The server rule below just keeps that state as the
center: it is what checkpoints save, what the driver's callbacks see and
where a retried stage resumes from. Nothing crosses the driver per step.

``collective = True`` tells the trainer to run the collective loop instead of
the parameter-server loop; `check_backend` names the Keras backends that have
a collective path here: all three of Keras 3's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.base import Algorithm, AlgorithmConfigError

#: Keras backends with a collective path.
COLLECTIVE_BACKENDS = ("jax", "tensorflow", "torch")
#: How the compiled learning rate follows the global batch of N workers (the module docstring).
LR_SCALING = {"linear": float, "sqrt": math.sqrt, "none": lambda workers: 1.0}


@dataclass(frozen=True)
class AllReduce(Algorithm):
    """Per-step gradient all-reduce over all workers: plain Keras on the global batch (``num_workers * batch_size``).

    Example:
        >>> Trainer(model, algorithm=AllReduce(), num_workers=4, batch_size=32)

    Args:
        lr_scaling: String. How the compiled learning rate follows the global batch of
            ``num_workers * batch_size`` rows: ``"linear"`` (default: times the number of workers),
            ``"sqrt"`` (times its square root) or ``"none"`` (the compiled rate, already set for the global
            batch). A schedule's rates are scaled the same way; a rate the driver's callbacks set
            (ReduceLROnPlateau) too.
    """

    lr_scaling: str = "linear"

    name: ClassVar[str] = "allreduce"
    #: The trainer runs the collective loop (``trainer.runtime.collective``), not the parameter-server loop.
    collective: ClassVar[bool] = True
    #: Task 0 sends the optimizer's variables with the weights: a retry or a resume goes on with Adam's moments
    #: and the iteration count (a learning-rate schedule) where they were.
    exchanges_optimizer_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_scaling not in LR_SCALING:
            raise AlgorithmConfigError(
                f"AllReduce's lr_scaling is one of {', '.join(map(repr, LR_SCALING))}. Received: "
                f"lr_scaling={self.lr_scaling!r}. Fix: 'linear' (the default) to scale the compiled rate with the "
                "number of workers, or 'none' when the rate is already set for the global batch."
            )

    def learning_rate_factor(self, workers: int) -> float:
        """What the compiled learning rate is multiplied by at `workers` workers."""
        return float(LR_SCALING[self.lr_scaling](workers))

    def check_backend(self, backend: str) -> None:
        """Raise AlgorithmConfigError unless Keras's `backend` has a collective path here."""
        if backend in COLLECTIVE_BACKENDS:
            return
        raise AlgorithmConfigError(
            f"AllReduce trains on the Keras backend's own collective engine, which exists for "
            f"{', '.join(COLLECTIVE_BACKENDS)}. Received: backend={backend!r}. Fix: set KERAS_BACKEND to one of "
            "them before Keras starts (the tasks use the driver's backend), or pick a parameter-server rule "
            "(leave `algorithm` out: DOWNPOUR)."
        )

    def describe(self) -> str:
        return "allreduce(every step)" + ("" if self.lr_scaling == "linear" else f", lr_scaling={self.lr_scaling}")

    # -- server side: the center is task 0's state at its last epoch end ---------------------------
    def server_commit(self, center, payload, staleness):
        return list(payload), []  # nothing to reply: the workers already hold the state they sent

    def worker_payload(self, weights, anchor):
        return list(weights)

    def worker_apply(self, weights, anchor, reply):
        return list(weights), list(weights)

