"""AllReduce: synchronous data-parallel training on the Keras backend's own collectives, no parameter server.

The N barrier tasks become ONE Keras distribution (``keras.distribution``:
JAX's distributed runtime and ``DataParallel``). Every step, each task feeds
its ``batch_size`` rows as its part of a global batch of ``N * batch_size``
rows, and the backend all-reduces the gradients (XLA: gloo between CPUs, NCCL
between GPUs), so every replica takes the same step plain Keras takes on the
global batch. The tasks' loop is ``trainer.runtime.collective``; the driver's
side is ``trainer.collective_fit``.

The driver hears from task 0 once per epoch, through the same parameter
server as the other rules, but with one client only: task 0 commits the
model's full state (weights and optimizer variables) at every epoch end and
reports the epoch's logs. The server rule below just keeps that state as the
center: it is what checkpoints save, what the driver's callbacks see and
where a retried stage resumes from. Nothing crosses the driver per step.

``collective = True`` tells the trainer to run the collective loop instead of
the parameter-server loop; `check_backend` names the Keras backends that have
a collective path here (JAX only: TensorFlow's MultiWorkerMirroredStrategy
fails on Keras 3 at two workers, keras-team/keras#20585, and Keras has no
distribution for torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from trainer.algorithms.base import Algorithm, AlgorithmConfigError

#: Keras backends with a collective path.
COLLECTIVE_BACKENDS = ("jax",)


@dataclass(frozen=True)
class AllReduce(Algorithm):
    """Per-step gradient all-reduce over all workers: plain Keras on the global batch (``num_workers * batch_size``).

    Example:
        >>> Trainer(model, algorithm=AllReduce(), num_workers=4, batch_size=32)  # KERAS_BACKEND=jax

    The global batch is ``num_workers * batch_size`` rows: scale the learning
    rate with it as for plain Keras at that batch size.
    """

    name: ClassVar[str] = "allreduce"
    #: The trainer runs the collective loop (``trainer.runtime.collective``), not the parameter-server loop.
    collective: ClassVar[bool] = True
    #: Task 0 sends the optimizer's variables with the weights: a retry or a resume goes on with Adam's moments
    #: and the iteration count (a learning-rate schedule) where they were.
    exchanges_optimizer_state: ClassVar[bool] = True

    def check_backend(self, backend: str) -> None:
        """Raise AlgorithmConfigError unless Keras's `backend` has a collective path here."""
        if backend in COLLECTIVE_BACKENDS:
            return
        why = {
            "tensorflow": "TensorFlow's MultiWorkerMirroredStrategy does not train Keras 3 models on two or more "
                          "workers (keras-team/keras#20585)",
            "torch": "Keras 3 has no distribution for torch (keras.distribution covers JAX)",
        }.get(backend, f"Keras has no multi-process distribution for {backend!r}")
        raise AlgorithmConfigError(
            f"AllReduce trains on Keras's own distribution engine, which runs on the JAX backend: {why}. "
            f"Received: backend={backend!r}. Fix: install JAX (pip install 'spark-keras-trainer[jax]') and set "
            "KERAS_BACKEND=jax before Keras starts (the tasks use the driver's backend), or pick a "
            "parameter-server rule (leave `algorithm` out: DOWNPOUR)."
        )

    # -- server side: the center is task 0's state at its last epoch end ---------------------------
    def server_commit(self, center, payload, staleness):
        return list(payload), []  # nothing to reply: the workers already hold the state they sent

    def worker_payload(self, weights, anchor):
        return list(weights)

    def worker_apply(self, weights, anchor, reply):
        return list(weights), list(weights)

    def describe(self) -> str:
        return "allreduce(every step)"

