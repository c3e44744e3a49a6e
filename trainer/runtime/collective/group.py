"""The N processes of an all-reduce fit as one group, on the Keras backend's own collective engine.

What the collective loop (`trainer.runtime.collective.loop`) needs of a
backend is a `Group`, with the same shape for every backend and one module
each (Keras's habit: ``backend/<name>/trainer.py``), which the backend's room
names (``trainer.backends``, its ``group_module``):

* ``jax_group``: JAX's distributed runtime as ONE Keras ``DataParallel``
  distribution (gloo between CPUs, NCCL between GPUs), the step inside
  ``jax.shard_map``;
* ``tensorflow_group``: a TensorFlow cluster of the processes (a gRPC server
  each, the coordination service led by process 0) and TensorFlow's
  collective ops (``CollectiveReduceV2``: a ring over gRPC between CPUs);
* ``torch_group``: a ``torch.distributed`` process group (gloo between CPUs,
  NCCL between GPUs) rendezvousing at process 0's address.

Every backend gives a compiled model the local-gradients step (each
process's gradients on its own rows, ONE all-reduce of them a step:
``local_step`` for TensorFlow and torch, ``jax_group`` for JAX), and the
loop's once-per-epoch messages: the center broadcast from process 0, the
validation logs gathered.

Processes that share one GPU (two Spark workers on a one-GPU host, the
2-worker rows of ``make bench-gpu``) cannot form an NCCL group: NCCL takes
one process per GPU and refuses a second ("Duplicate GPU detected"). The
task finds out from the GPUs' identities that the tasks gather
(`gpu_identities`, `shares_gpu`), and the job's ``shared_gpu`` has the
group keep its collectives on the host: gloo under torch, JAX's CPU
devices (gloo) under JAX, where only periodic averaging (``LocalSGD``) can
then run. The steps stay on the GPU.

One process alone (a 1-worker fit) joins no engine: `Alone` is plain Keras
with the loop around it. Under JAX a ``DataParallel`` distribution would take
the step off Keras's own input path (no batch fed one step ahead to a GPU:
0.93 of plain Keras's speed on an H100, docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import socket
import subprocess
import time
from typing import Any

import numpy as np

from trainer.backends import backend_for


class Group:
    """This process's place in the group; a backend module's `BackendGroup` subclasses it."""

    def __init__(self, process_id: int, num_processes: int) -> None:
        self.process_id, self.num_processes = process_id, num_processes

    @classmethod
    def join(cls, job) -> "Group":
        """Join the group of `job` (a `CollectiveJob`): call before the model is built."""
        raise NotImplementedError

    def use_local_gradients(self, model) -> bool:
        """Give compiled `model` the local-gradients step; False, leaving it as it is, when its class overrides
        ``train_step`` (it then trains with its own step, whatever that all-reduces)."""
        raise NotImplementedError

    def train_alone(self) -> None:
        """Let this process train its own replica with Keras's own step (periodic averaging, before the model is
        built): the backend's distribution, if any, is left for good."""

    def all_reduce_host(self, array: np.ndarray) -> np.ndarray:
        """The element-wise sum over the group of the 1-D host array `array` (float32 or bfloat16), outside any
        step: periodic averaging's one all-reduce."""
        raise NotImplementedError

    def broadcast(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Process 0's `arrays` in every process (the others pass arrays of the same shapes and dtypes)."""
        raise NotImplementedError

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """Every process's `array` (the same shape everywhere), stacked in process order."""
        raise NotImplementedError

    def local_state(self, model) -> list[np.ndarray]:
        """The weights then the optimizer's variables of this process's replica (no collective: process 0
        reads them alone)."""
        import keras

        return [np.array(keras.ops.convert_to_numpy(v.value), copy=True)
                for v in list(model.weights) + list(model.optimizer.variables)]

    def fit_callbacks(self) -> list:
        """Keras callbacks every epoch's ``fit`` needs under this backend."""
        return []

    def outside(self) -> contextlib.AbstractContextManager:
        """A block where Keras builds and runs models of this process alone (the validation model)."""
        return contextlib.nullcontext()

    def describe(self) -> dict[str, Any]:
        """What the record keeps of the group (devices, the engine)."""
        return {}

    def collective_seconds(self) -> float | None:
        """The seconds this process's steps have spent in their all-reduce so far (waiting for the slower
        process, then reducing), or None where the backend does not measure it (JAX: the all-reduce is inside
        the compiled step)."""
        return None

    def allreduce_ms(self, elements: int) -> float | None:
        """One all-reduce alone of `elements` float32 after a barrier, in ms (the median of a few; every process
        calls it at the same point), or None where not measured."""
        return None

    def leave(self) -> None:
        """Leave the group at the end of the process."""


class Alone(Group):
    """The group of one process: nothing to join, broadcast or gather; the model keeps Keras's own step."""

    @classmethod
    def join(cls, job) -> "Alone":
        return cls(0, 1)

    def use_local_gradients(self, model) -> bool:
        return False

    def all_reduce_host(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def broadcast(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(a) for a in arrays]

    def allgather(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)[None]

    def describe(self) -> dict[str, Any]:
        return {"collective": "none (one process)"}


def median_ms(all_reduce, elements: int, repeats: int = 9) -> float:
    """The median milliseconds of ``all_reduce(elements)`` (a blocking all-reduce of that many float32 in every
    process), each after ``all_reduce(1)``, a barrier: the reduction alone, without waiting for a process."""
    times = []
    for _ in range(repeats):
        all_reduce(1)
        start = time.perf_counter()
        all_reduce(elements)
        times.append(time.perf_counter() - start)
    return 1000.0 * float(np.median(times))


def join_group(job) -> Group:
    """This process's `Group` under `job.keras_backend`, joined (`Alone` for a group of one process on at most
    one GPU: one on several keeps its backend's group, whose engine spans them under JAX)."""
    if job.num_processes == 1 and len(job.gpus or []) <= 1:
        return Alone.join(job)
    return importlib.import_module(backend_for(job.keras_backend).group_module).BackendGroup.join(job)


def gpu_identities(gpus: list[str] | None) -> list[str]:
    """What identifies the GPUs at `gpus` (Spark's addresses) across the tasks of a fit: their UUIDs where
    ``nvidia-smi`` answers, else this host's name and the address."""
    if not gpus:
        return []
    if shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", f"--id={','.join(gpus)}"],
                                  capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            done = None
        uuids = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done else []
        if done is not None and done.returncode == 0 and len(uuids) == len(gpus):
            return uuids
    host = socket.gethostname()
    return [f"{host}:{address}" for address in gpus]


def shares_gpu(identities: list[list[str]], index: int) -> bool:
    """Whether process `index` shares a GPU with another process, from every process's `gpu_identities`."""
    mine = set(identities[index])
    return any(mine & set(other) for i, other in enumerate(identities) if i != index)
