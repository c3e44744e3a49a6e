"""Everything that differs under Keras's torch backend: OpenMP and MKL thread pools, ``torch.distributed``.

* **Group.** A ``torch.distributed`` process group, gloo between CPUs and
  NCCL between GPUs (``trainer.runtime.collective.torch_group``).
* **Feed.** Numpy batches (a ``keras.utils.PyDataset`` in the collective
  loop); no ``tf.data``.
* **Environment.** Its CPU kernels run on OpenMP and MKL pools sized by
  ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` (OpenMP also serves XLA's Eigen
  on some builds). It allocates GPU memory lazily already.
* **Weights.** On CUDA steps are dispatched asynchronously: the shared wait
  for queued steps and the one host copy per dtype
  (``trainer.backends.common``).
"""

from __future__ import annotations

from trainer.backends.common import KerasBackend


class TorchBackend(KerasBackend):
    """Keras on torch."""

    name = "torch"
    extra = "torch"
    group_module = "trainer.runtime.collective.torch_group"
    distributions = ("torch",)

    def thread_env(self, cpus: int) -> dict[str, str]:
        return {"OMP_NUM_THREADS": str(cpus), "MKL_NUM_THREADS": str(cpus)}

    def executor_env(self, cores: int) -> dict[str, str]:
        return {"OMP_NUM_THREADS": str(cores)}


BACKEND = TorchBackend()
