"""The all-reduce group under JAX: ONE Keras ``DataParallel`` distribution, the local-gradients step inside it.

`BackendGroup.join` starts JAX's distributed runtime with process 0's
"host:port" as its coordinator (``keras.distribution.initialize``) and makes
every process's devices one ``DataParallel`` distribution with
``auto_shard_dataset=False``: each process feeds its own rows, and Keras
makes every step's global batch of the processes' local batches in process
order (gloo between CPUs, NCCL between GPUs). Processes that share a GPU
(``job.shared_gpu``) make the distribution of their CPU devices instead and
train alone on the GPU: their periodic averages, broadcasts and gathers, all
sums over the mesh, then go over gloo, since NCCL takes one process per GPU.

The train step:

Under ``keras.distribution.DataParallel`` Keras's own train step is one SPMD
program over the global batch, and XLA's partitioner all-reduces wherever a
contraction runs over the sharded batch dimension. In a recurrent layer that
is inside the backward loop over time: one all-reduce per timestep and weight
(measured here: a GRU(128) over 24 hours, 2 processes on 2 cores, 230 ms a
step against 7 ms alone; the dump of the compiled step shows the all-reduce in
the ``while`` body). `use_local_gradients` gives the model the step
data-parallel frameworks take instead (PyTorch's DDP, Horovod): inside
``jax.shard_map`` each process runs Keras's own ``train_step`` on its local
rows; the gradients, concatenated into one vector per dtype, are averaged in
ONE all-reduce before the optimizer applies them (20 ms a step for that GRU;
the MNIST CNN 109 ms against 145). Every replica then holds the same state:

* weights and optimizer variables: the optimizer applies the same averaged
  gradients to the same state (equal local batches: the mean of the local
  mean gradients is the global batch's mean gradient, so the step equals
  plain Keras's on the global batch within float tolerance);
* metric variables (Keras metrics accumulate sums and counts): each process's
  increment is summed over the processes, so the logs cover the global batch;
* other float variables (BatchNormalization's moving statistics): averaged;
  integer ones (the random seeds' state) advance alike everywhere. A layer's
  random seed is offset by the process's index for the step, so each process
  draws its own dropout masks, as over a global batch.

What differs from one process: a layer that computes statistics over the
batch in the forward pass (BatchNormalization in training) sees the local
batch, as under DDP without SyncBatchNorm. A model whose class overrides
``train_step`` keeps it: the step stays Keras's SPMD one (correct, and slower
for recurrent layers).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from trainer.runtime.collective.group import Group
from trainer.runtime.collective.local_step import SEED_STATE, SEED_STRIDE, has_keras_train_step


class BackendGroup(Group):
    def __init__(self, process_id: int, num_processes: int, distribution) -> None:
        super().__init__(process_id, num_processes)
        self.distribution = distribution
        self.alone = False  # train_alone: each process trains its replica outside the distribution
        self.host_sum = None

    @classmethod
    def join(cls, job) -> "BackendGroup":
        if job.shared_gpu and not job.cadence.periodic:
            raise ValueError(
                "Under JAX, processes that share a GPU cannot all-reduce every step: XLA's collectives between GPUs "
                "run on NCCL, which takes one process per GPU. Fix: give each worker a GPU of its own, or average "
                "every few steps (algorithm=LocalSGD(), the default for several workers on GPUs), whose averages "
                "these processes make over their CPUs.")
        import keras

        keras.distribution.initialize(job_addresses=job.addresses[0], num_processes=job.num_processes,
                                      process_id=job.process_id)
        # Processes sharing a GPU average over their CPU devices (gloo), the steps staying on the GPU (train_alone).
        devices = keras.distribution.list_devices("cpu" if job.shared_gpu else None)
        distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
        keras.distribution.set_distribution(distribution)
        return cls(job.process_id, job.num_processes, distribution)

    def use_local_gradients(self, model) -> bool:
        return use_local_gradients(model, self.distribution)

    def train_alone(self) -> None:
        import keras

        self.alone = True
        keras.distribution.set_distribution(None)

    def all_reduce_host(self, array: np.ndarray) -> np.ndarray:
        """A ``psum`` over the distribution's mesh of every device's copy of its process's `array`."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec

        mesh, axis = self.distribution.device_mesh.backend_mesh, self.distribution.batch_dim_name
        if self.host_sum is None:
            self.host_sum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, axis), mesh=mesh,
                                                  in_specs=PartitionSpec(axis), out_specs=PartitionSpec(),
                                                  check_vma=False))
        copies = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
        local = np.tile(np.asarray(array), copies)
        total = self.host_sum(jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec(axis)), local))
        summed = np.asarray(total.addressable_data(0))
        if copies == 1:
            return summed
        if np.issubdtype(summed.dtype, np.integer):
            return summed // copies
        return (summed.astype(np.float32) / copies).astype(summed.dtype)

    def broadcast(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Process 0's arrays, summed with the others' zeros over the mesh: one sum per dtype."""
        arrays = [np.asarray(a) for a in arrays]
        mine = arrays if self.process_id == 0 else [np.zeros_like(a) for a in arrays]
        out: list[np.ndarray | None] = [None] * len(arrays)
        for dtype in {a.dtype for a in arrays}:
            at = [i for i, a in enumerate(arrays) if a.dtype == dtype]
            flat = np.concatenate([mine[i].reshape(-1) for i in at])
            summed = self.all_reduce_host(flat).astype(dtype, copy=False)
            pieces = np.split(summed, np.cumsum([arrays[i].size for i in at])[:-1])
            for i, piece in zip(at, pieces):
                out[i] = piece.reshape(arrays[i].shape).copy()
        return out

    def allgather(self, array: np.ndarray) -> np.ndarray:
        """Each process's `array` in its own row of zeros, summed over the mesh."""
        array = np.asarray(array)
        rows = np.zeros((self.num_processes, *array.shape), array.dtype)
        rows[self.process_id] = array
        return self.all_reduce_host(rows.reshape(-1)).astype(array.dtype, copy=False).reshape(rows.shape)

    def local_state(self, model) -> list[np.ndarray]:
        out = []
        for variable in list(model.weights) + list(model.optimizer.variables):
            value = variable.value
            local = value.addressable_data(0) if hasattr(value, "addressable_data") else value
            out.append(np.array(local, copy=True))
        return out

    def fit_callbacks(self) -> list:
        return [_committed_state()]

    @contextlib.contextmanager
    def outside(self):
        import keras

        if self.alone:  # already outside, for good
            yield
            return
        keras.distribution.set_distribution(None)
        try:
            yield
        finally:
            keras.distribution.set_distribution(self.distribution)

    def describe(self) -> dict:
        import jax

        return {"collective": "jax distributed", "devices": len(jax.devices()), "local_devices": len(jax.local_devices())}

    def leave(self) -> None:
        import jax

        jax.distributed.shutdown()


def _committed_state():
    """A callback that commits every variable's array to its device(s) before the first step. Keras leaves
    the arrays it creates uncommitted and the state its steps return committed, so without it XLA compiles
    the train step a second time at the second epoch (measured: 10 s of the MNIST CNN's on this machine)."""
    import jax
    import keras

    class CommittedState(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            model = self.model
            for variable in list(model.variables) + list(model.optimizer.variables) + list(model.metrics_variables):
                value = variable.value
                if not getattr(value, "committed", True):
                    variable.assign(jax.device_put(value, value.sharding))

    return CommittedState()


def use_local_gradients(model, distribution) -> bool:
    """Give `model` the local-gradients train step (module docstring) under `distribution` (a ``DataParallel``);
    returns False, leaving the model as it is, when its class has a ``train_step`` of its own."""
    if not has_keras_train_step(model):
        return False
    import jax
    from jax.sharding import PartitionSpec

    mesh, axis = distribution.device_mesh.backend_mesh, distribution.batch_dim_name
    seeds = [i for i, v in enumerate(model.non_trainable_variables) if v.path.endswith(SEED_STATE)]

    def local_step(state, data):
        trainable, non_trainable, optimizer_vars, metrics = state
        offset = seed_offset(axis)
        non_trainable = shift_seeds(non_trainable, seeds, offset)
        with _averaged_gradients(model.optimizer, axis):
            _, (trainable, new_non_trainable, optimizer_vars, new_metrics) = type(model).train_step(
                model, (trainable, non_trainable, optimizer_vars, metrics), data)
        new_non_trainable = shift_seeds(new_non_trainable, seeds, -offset)
        new_non_trainable = [jax.lax.pmean(v, axis) if _is_float(v) else v for v in new_non_trainable]
        new_metrics = [old + jax.lax.psum(new - old, axis) for old, new in zip(metrics, new_metrics)]
        return _metrics_logs(model, new_metrics), (trainable, new_non_trainable, optimizer_vars, new_metrics)

    replicated, sharded = PartitionSpec(), PartitionSpec(axis)

    def train_step(state, data):
        # check_vma=False: every output is made equal across the processes above, by construction.
        return jax.shard_map(local_step, mesh=mesh, in_specs=(replicated, sharded),
                             out_specs=(replicated, replicated), check_vma=False)(state, data)

    model.train_step = train_step
    return True


def _is_float(value) -> bool:
    import jax.numpy as jnp

    return jnp.issubdtype(value.dtype, jnp.floating)


def seed_offset(axis: str):
    """This device's seed offset inside ``shard_map`` over mesh axis `axis`: its index times `SEED_STRIDE`."""
    import jax
    import jax.numpy as jnp

    return jax.lax.axis_index(axis).astype(jnp.uint32) * jnp.uint32(SEED_STRIDE)


def shift_seeds(variables: list, seeds: list[int], offset) -> list:
    """`variables` with `offset` added (modulo 2**32: ``-offset`` takes it back) to the seed of each seed state
    in `seeds`."""
    import jax.numpy as jnp

    out = list(variables)
    for i in seeds:
        out[i] = out[i] + jnp.stack([offset, jnp.zeros_like(offset)]).astype(out[i].dtype)
    return out


@contextlib.contextmanager
def _averaged_gradients(optimizer, axis: str):
    """Within the block, `optimizer.stateless_apply` first averages the gradients over mesh axis `axis`
    (`average_flat`): an instance attribute over the method, for the trace only."""
    apply = optimizer.stateless_apply
    optimizer.stateless_apply = lambda variables, grads, trainable: apply(variables, average_flat(grads, axis),
                                                                          trainable)
    try:
        yield
    finally:
        del optimizer.stateless_apply


def average_flat(grads: list, axis: str) -> list:
    """The mean of `grads` over mesh axis `axis`, in one ``pmean`` per dtype of the gradients concatenated (XLA
    on CPU runs each all-reduce on its own: one per gradient would pay the link's latency once each)."""
    import jax
    import jax.numpy as jnp

    out: list = list(grads)
    by_dtype: dict[Any, list[int]] = {}
    for i, g in enumerate(grads):
        by_dtype.setdefault(jnp.dtype(g.dtype), []).append(i)
    for indices in by_dtype.values():
        flat = jax.lax.pmean(jnp.concatenate([jnp.ravel(grads[i]) for i in indices]), axis)
        start = 0
        for i in indices:
            size = grads[i].size
            out[i] = flat[start:start + size].reshape(grads[i].shape)
            start += size
    return out


def _metrics_logs(model, metrics_variables: list) -> dict:
    """The model's metric results computed from `metrics_variables` (the global ones)."""
    import keras

    with keras.StatelessScope(state_mapping=list(zip(model.metrics_variables, metrics_variables))):
        return model.get_metrics_result()
