"""The all-reduce group under TensorFlow: a TensorFlow cluster of the processes and its collective ops.

`BackendGroup.join` makes this process task `process_id` of the cluster
``{"worker": addresses}`` (every process's own "host:port": each runs a gRPC
server), with TensorFlow's coordination service led by task 0 and collective
ops enabled: what ``MultiWorkerMirroredStrategy`` does when it starts, without
the strategy (``model.fit`` under it does not train Keras 3 models on two
workers, keras-team/keras#20585). The step's all-reduce is then
``collective_ops.all_reduce_v2`` (``CollectiveReduceV2``, a ring over gRPC
between CPUs; on the CPUs also for processes that share a GPU) inside
Keras's own ``tf.function`` train function.

Found while building it (TensorFlow 2.21, 2 processes on loopback):

* without the coordination service the first collective waits forever;
* a collective's instance key is bound to one shape: a key is taken when an
  all-reduce is traced, and every process traces the same ones in the same
  order (the same model, equal batches: the padded shards);
* XLA cannot compile a cross-process collective on CPU: the step keeps
  ``jit_compile`` off;
* a peer that never starts leaves the others waiting in the join, in C++
  holding the GIL, with TensorFlow's own SIGTERM handler installed, past
  ``cluster_register_timeout``: only a signal whose default action kills
  ends it, so the join arms ``SIGALRM``;
* TensorFlow has no call to stop its server: the process exits as it is.
"""

from __future__ import annotations

import signal
import threading

import numpy as np

from trainer.runtime.collective.group import Group, median_ms
from trainer.runtime.collective.local_step import (
    GRAD, MEAN, SEED_STRIDE, SUM, Collect, HeldApply, apply_summed, has_keras_train_step, is_float,
    is_seed_state,
)

#: The collective group of the N processes (any int, the same in every process).
GROUP_KEY = 1
#: Seconds the join waits for every process to register before this one is ended.
REGISTER_TIMEOUT_S = 300


class BackendGroup(Group):
    def __init__(self, process_id: int, num_processes: int, device: str, timeout_s: float, token) -> None:
        super().__init__(process_id, num_processes)
        self.device, self.timeout_s, self.token = device, timeout_s, token
        self.next_key = 1
        self.host_sums: dict = {}  # (elements, dtype) -> a tf.function of all_reduce_sum: one instance key each

    @classmethod
    def join(cls, job) -> "BackendGroup":
        import tensorflow as tf
        from tensorflow.core.protobuf import tensorflow_server_pb2
        from tensorflow.python.eager import context

        addresses, task = list(job.addresses), job.process_id
        ctx = context.context()
        leader = "/job:worker/replica:0/task:0"
        ctx.configure_collective_ops(collective_leader=leader, scoped_allocator_enabled_ops=("CollectiveReduce",),
                                     device_filters=(f"/job:worker/task:{task}",))
        ctx.configure_coordination_service(
            service_type="standalone", service_leader=leader,
            coordinated_jobs=[context.coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=len(addresses))],
            cluster_register_timeout_in_ms=REGISTER_TIMEOUT_S * 1000, heartbeat_timeout_in_ms=60_000)
        server = tensorflow_server_pb2.ServerDef(
            cluster=tf.train.ClusterSpec({"worker": addresses}).as_cluster_def(), default_session_config=ctx.config,
            job_name="worker", task_index=task, protocol="grpc", port=int(addresses[task].rsplit(":", 1)[1]))
        alarm = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGALRM, signal.SIG_DFL) if alarm else None
        if alarm:
            signal.alarm(REGISTER_TIMEOUT_S)
        try:
            ctx.enable_collective_ops(server)
            ctx.ensure_initialized()
        finally:
            if alarm:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, previous)
        # Processes that share a GPU reduce on their CPUs: NCCL, which GPU collectives use, takes one per GPU.
        device_type = "GPU" if tf.config.list_logical_devices("GPU") and not job.shared_gpu else "CPU"
        device = f"/job:worker/replica:0/task:{task}/device:{device_type}:0"
        with tf.device(device):
            token = tf.Variable(0.0, trainable=False, name="collective_ordering_token")
        group = cls(task, len(addresses), device, float(job.io_timeout), token)
        with tf.device(device):
            group.collective_s = tf.Variable(0.0, trainable=False, dtype=tf.float64, name="collective_seconds")
        return group

    def _timed_all_reduce_sum(self, flat):
        """`all_reduce_sum` inside a step, its seconds (waiting for the slower process, then the reduction)
        added to ``collective_s``: two ``tf.timestamp`` ops around the collective, ordered by control
        dependencies (microseconds a step)."""
        import tensorflow as tf

        with tf.control_dependencies([flat]):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            total = self.all_reduce_sum(tf.identity(flat))
        with tf.control_dependencies([total]):
            self.collective_s.assign_add(tf.timestamp() - start)
            return tf.identity(total)

    def collective_seconds(self) -> float:
        return float(self.collective_s.numpy())

    def allreduce_ms(self, elements: int) -> float:
        import tensorflow as tf

        def one(size: int) -> None:
            self.all_reduce_sum(tf.zeros([size], tf.float32)).numpy()

        return median_ms(one, elements)

    def all_reduce_sum(self, flat):
        """The element-wise sum of the 1-D tensor `flat` over the group. Traced in a ``tf.function``, the
        instance key is taken once and reused by every call of the compiled function."""
        import tensorflow as tf
        from tensorflow.python.ops import collective_ops

        key, self.next_key = self.next_key, self.next_key + 1
        with tf.device(self.device):
            return collective_ops.all_reduce_v2(flat, group_size=self.num_processes, group_key=GROUP_KEY,
                                                instance_key=key, merge_op="Add", final_op="Id",
                                                timeout=self.timeout_s, ordering_token=self.token.handle)

    def all_reduce_host(self, array: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        array = np.asarray(array)
        key = (array.size, array.dtype.name)
        if key not in self.host_sums:  # traced once: every later call reuses the key (no resolution per call)
            self.host_sums[key] = tf.function(self.all_reduce_sum)
        with tf.device(self.device):
            return self.host_sums[key](tf.constant(array)).numpy()

    def use_local_gradients(self, model) -> bool:
        if not has_keras_train_step(model):
            return False
        import tensorflow as tf

        keras_train_step, n = type(model).train_step, self.num_processes
        offset = self.process_id * SEED_STRIDE
        model.jit_compile = False  # XLA cannot compile the cross-process collective on CPU

        def shift_seeds(seeds, sign: int) -> None:
            for s in seeds:
                s.assign(s.value + tf.constant([sign * offset, 0], dtype=s.value.dtype))

        def train_step(data):
            before = {id(v): tf.identity(v.value) for v in model.metrics_variables}
            seeds = [v for v in model.non_trainable_variables if is_seed_state(v)]
            candidates = [v for v in model.non_trainable_variables if not is_seed_state(v) and is_float(v.dtype)]
            shift_seeds(seeds, +1)
            with HeldApply(model.optimizer) as held:
                keras_train_step(model, data)
            shift_seeds(seeds, -1)
            # Metric variables a Keras creates during the first trace started at zero, as its metrics do.
            metrics = list(model.metrics_variables)
            starts = [before[id(v)] if id(v) in before else tf.zeros_like(v.value) for v in metrics]
            written = _written(candidates)
            means = candidates if written is None else written
            collect = Collect(lambda t: tf.reshape(t, [-1]), lambda parts: tf.concat(parts, 0),
                              lambda flat, ts: [tf.reshape(p, tf.shape(t)) for p, t in
                                                zip(tf.split(flat, [int(t.shape.num_elements()) for t in ts]), ts)])
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in held.grads or []]
            for i, g in enumerate(grads):
                if g is not None:
                    collect.add(GRAD, i, g)
            for i, v in enumerate(means):
                collect.add(MEAN, i, tf.identity(v.value))
            for i, v in enumerate(metrics):
                collect.add(SUM, i, tf.identity(v.value) - starts[i])
            apply_summed(collect.reduce(self._timed_all_reduce_sum), model.optimizer, held, grads, means, metrics,
                         starts, lambda total: total / tf.cast(n, total.dtype))
            return model.get_metrics_result()

        model.train_step = train_step
        model.train_function = None  # a train function an earlier fit traced ran Keras's own step
        return True

    def broadcast(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        import tensorflow as tf

        out = []
        for a in (np.asarray(a) for a in arrays):  # a sum of process 0's values and the others' zeros
            mine = a if self.process_id == 0 else np.zeros_like(a)
            flat = self.all_reduce_sum(tf.reshape(tf.constant(mine), [-1]))
            out.append(flat.numpy().reshape(a.shape).astype(a.dtype))
        return out

    def allgather(self, array: np.ndarray) -> np.ndarray:
        import tensorflow as tf
        from tensorflow.python.ops import collective_ops

        key, self.next_key = self.next_key, self.next_key + 1
        with tf.device(self.device):
            gathered = collective_ops.all_gather_v2(tf.constant(np.asarray(array)[None]),
                                                    group_size=self.num_processes, group_key=GROUP_KEY,
                                                    instance_key=key, timeout=self.timeout_s)
        return gathered.numpy()

    def describe(self) -> dict:
        return {"collective": "tensorflow collective ops", "device": self.device}


def _written(variables) -> list | None:
    """Those of `variables` that the ``tf.function`` being traced consumes other than by reading (an assign,
    or a nested call that may assign); None when not tracing (``run_eagerly``)."""
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    captures = getattr(graph, "captures", None)
    if captures is None or tf.executing_eagerly():
        return None
    external_of = {internal.name: external for external, internal in captures}
    written = {id(external_of[t.name]) for op in graph.get_operations() if op.type != "ReadVariableOp"
               for t in op.inputs if t.dtype == tf.resource and t.name in external_of}
    return [v for v in variables if id(v.value.handle) in written]
