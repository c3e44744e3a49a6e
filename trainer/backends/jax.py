"""Everything that differs under Keras's JAX backend: XLA's GPU preallocation, asynchronous dispatch, its group.

* **Group.** JAX's distributed runtime as one Keras ``DataParallel``
  distribution (``trainer.runtime.collective.jax_group``).
* **Feed.** Numpy batches (a ``keras.utils.PyDataset`` in the collective
  loop); no ``tf.data``.
* **Environment.** XLA ignores thread-count variables: a task is held to its
  cores by pinning (``trainer.runtime.cores``). It preallocates 75 % of a
  GPU per process unless told otherwise; a fraction the user chose
  (``XLA_PYTHON_CLIENT_MEM_FRACTION``) means preallocate it.
* **Weights.** Steps are dispatched asynchronously and the weights may live
  on an accelerator: the shared wait for queued steps and the one host copy
  per dtype (``trainer.backends.common``).
"""

from __future__ import annotations

import os

from trainer.backends.common import KerasBackend


class JaxBackend(KerasBackend):
    """Keras on JAX."""

    name = "jax"
    extra = "jax"
    group_module = "trainer.runtime.collective.jax_group"
    distributions = ("jax",)
    steps_on_a_shared_gpu = False  # XLA's collectives between GPUs run on NCCL: one process per GPU

    def gpu_memory_env(self) -> dict[str, str]:
        if "XLA_PYTHON_CLIENT_MEM_FRACTION" in os.environ:  # a fraction the user chose means preallocate it
            return {}
        return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


BACKEND = JaxBackend()
