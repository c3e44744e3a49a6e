"""The all-reduce group under torch: a ``torch.distributed`` process group, one all-reduce a step.

`BackendGroup.join` forms the process group as Spark's TorchDistributor does:
process 0's "host:port" is the rendezvous (``init_method="tcp://..."``:
process 0 serves a TCPStore there, gloo or NCCL then open their own
connections), gloo between CPUs and NCCL between GPUs (gloo too between
processes that share a GPU, which NCCL refuses), with the fit's I/O
timeout on the rendezvous and on every collective (torch's default is 30
minutes). The step is ``local_step``'s, its all-reduce ``dist.all_reduce`` of
one flat tensor per dtype (a CUDA tensor goes through the host under gloo).

Under torch an unseeded ``Dropout`` draws its mask from torch's global
generator, not from a Keras ``SeedGenerator``: every process but 0 runs the
step on a stream of its own (`_ProcessRNG`), as it offsets its seed states.
"""

from __future__ import annotations

import datetime
import time

import numpy as np

from trainer.runtime.collective.group import Group, median_ms
from trainer.runtime.collective.local_step import (
    GRAD, MEAN, SEED_STRIDE, SUM, Collect, HeldApply, apply_summed, has_keras_train_step, is_float,
    is_seed_state,
)


class BackendGroup(Group):
    def __init__(self, process_id: int, num_processes: int, engine: str) -> None:
        super().__init__(process_id, num_processes)
        self.engine = engine
        self.collective_s = 0.0  # the steps' seconds in all_reduce_sum, on the host (gloo) only

    @classmethod
    def join(cls, job) -> "BackendGroup":
        import torch
        import torch.distributed as dist
        from keras.src.backend.torch.core import get_device

        engine = "nccl" if str(get_device()).startswith("cuda") and not job.shared_gpu else "gloo"
        extra = {"device_id": torch.device("cuda", torch.cuda.current_device())} if engine == "nccl" else {}
        # NCCL moves CUDA tensors only: the host arrays of broadcast and allgather (the state, the shard
        # sizes) go through gloo in the same group.
        dist.init_process_group("cpu:gloo,cuda:nccl" if engine == "nccl" else engine, init_method=f"tcp://{job.addresses[0]}", rank=job.process_id,
                                world_size=job.num_processes, timeout=datetime.timedelta(seconds=job.io_timeout),
                                **extra)
        return cls(job.process_id, job.num_processes, engine)

    def all_reduce_sum(self, flat):
        """The element-wise sum of the 1-D tensor `flat` over the group."""
        import torch.distributed as dist

        if flat.is_cuda:
            if self.engine == "gloo":
                host = flat.cpu()
                dist.all_reduce(host, op=dist.ReduceOp.SUM)
                return host.to(flat.device)
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)  # NCCL: queued on the stream, not timed here
            return flat
        start = time.perf_counter()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        self.collective_s += time.perf_counter() - start
        return flat

    def all_reduce_host(self, array: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        array = np.ascontiguousarray(array)
        bf16 = array.dtype.name == "bfloat16"  # numpy knows ml_dtypes' bfloat16, torch.from_numpy does not
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16) if bf16 else torch.from_numpy(array)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)  # a host tensor: gloo, also in a "cpu:gloo,cuda:nccl" group
        return tensor.view(torch.int16).numpy().view(array.dtype) if bf16 else tensor.numpy()

    def collective_seconds(self) -> float | None:
        return self.collective_s if self.engine == "gloo" else None

    def allreduce_ms(self, elements: int) -> float | None:
        if self.engine != "gloo":
            return None
        import torch

        def one(size: int) -> None:
            self.all_reduce_sum(torch.zeros(size))

        return median_ms(one, elements)

    def use_local_gradients(self, model) -> bool:
        if not has_keras_train_step(model):
            return False
        import torch

        keras_train_step, n = type(model).train_step, self.num_processes
        offset = (self.process_id * SEED_STRIDE) % 2**32
        rng = _ProcessRNG(self.process_id)
        cache: dict = {}

        def variables():
            # Walking the layers for their variables costs Python time every step: kept once a step ran.
            if not cache:
                rest = list(model.non_trainable_variables)
                return (list(model.metrics_variables), [v for v in rest if is_seed_state(v)],
                        [v for v in rest if not is_seed_state(v) and is_float(v.dtype)])
            return cache["metrics"], cache["seeds"], cache["candidates"]

        def shift_seeds(seeds, sign: int) -> None:
            with torch.no_grad():
                for s in seeds:
                    shifted = s.value.to(torch.int64) + torch.tensor([sign * offset, 0], dtype=torch.int64,
                                                                     device=s.value.device)
                    # An int32 state keeps its low 32 bits, as Keras's torch seed generator reads them.
                    s.assign(_wrap_int32(shifted) if s.value.dtype == torch.int32 else shifted)

        def train_step(data):
            metrics, seeds, candidates = variables()
            before = {id(v): v.value.detach().clone() for v in metrics}
            versions = [v.value._version for v in candidates]
            shift_seeds(seeds, +1)
            try:
                with HeldApply(model.optimizer) as held, rng:
                    keras_train_step(model, data)
            finally:
                shift_seeds(seeds, -1)
            if not cache:  # metric variables a Keras creates in its first step started at zero
                metrics = list(model.metrics_variables)
                cache.update(metrics=metrics, seeds=seeds, candidates=candidates)
            starts = [before[id(v)] if id(v) in before else torch.zeros_like(v.value) for v in metrics]
            # The float non-trainables the step wrote (BatchNormalization's statistics): their version moved.
            means = [v for v, version in zip(candidates, versions) if v.value._version != version]
            with torch.no_grad():
                collect = Collect(lambda t: t.reshape(-1), torch.cat,
                                  lambda flat, ts: [p.view(t.shape) for p, t in
                                                    zip(torch.split(flat, [t.numel() for t in ts]), ts)])
                grads = list(held.grads or [])
                for i, g in enumerate(grads):
                    if g is not None:
                        collect.add(GRAD, i, g)
                for i, v in enumerate(means):
                    collect.add(MEAN, i, v.value)
                for i, v in enumerate(metrics):
                    collect.add(SUM, i, v.value - starts[i])
                apply_summed(collect.reduce(self.all_reduce_sum), model.optimizer, held, grads, means, metrics,
                             starts, lambda total: total / n)
            return model.get_metrics_result()

        model.train_step = train_step
        model.train_function = None  # a train function an earlier fit made ran Keras's own step
        return True

    def broadcast(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        import torch
        import torch.distributed as dist

        out = []
        for a in (np.array(a, order="C") for a in arrays):  # tensors, never pickled objects; 0-d ones stay 0-d
            tensor = torch.from_numpy(a if self.process_id == 0 else np.zeros_like(a))
            dist.broadcast(tensor, src=0)
            out.append(tensor.numpy())
        return out

    def allgather(self, array: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        mine = torch.from_numpy(np.array(array, order="C"))
        out = [torch.zeros_like(mine) for _ in range(self.num_processes)]
        dist.all_gather(out, mine)
        return np.stack([t.numpy() for t in out])

    def describe(self) -> dict:
        return {"collective": f"torch.distributed ({self.engine})"}

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _wrap_int32(values):
    """An int64 tensor as the int32 with the same low 32 bits."""
    import torch

    return (((values + 2**31) % 2**32) - 2**31).to(torch.int32)


class _ProcessRNG:
    """Within the block, torch's global generators run this process's own stream (module docstring); the
    stream outside is restored after. Process 0 keeps the global stream, as one process would."""

    def __init__(self, process_id: int) -> None:
        import torch

        self.process_id = process_id
        self.state = None
        self.cuda = torch.cuda.is_available() and torch.cuda.is_initialized()

    def __enter__(self) -> "_ProcessRNG":
        import torch

        if self.process_id == 0:
            return self
        self.outer = (torch.get_rng_state(), torch.cuda.get_rng_state() if self.cuda else None)
        if self.state is None:
            torch.manual_seed((torch.initial_seed() + self.process_id * SEED_STRIDE) % 2**63)
        else:
            torch.set_rng_state(self.state[0])
            if self.cuda:
                torch.cuda.set_rng_state(self.state[1])
        return self

    def __exit__(self, *exc) -> bool:
        import torch

        if self.process_id == 0:
            return False
        self.state = (torch.get_rng_state(), torch.cuda.get_rng_state() if self.cuda else None)
        torch.set_rng_state(self.outer[0])
        if self.cuda:
            torch.cuda.set_rng_state(self.outer[1])
        return False
