"""Everything that differs under Keras's TensorFlow backend: Keras's default, fed by ``tf.data``, a version floor.

* **Default.** Keras starts TensorFlow when neither ``KERAS_BACKEND`` nor
  ``keras.json`` names a backend.
* **Group.** TensorFlow's collective ops over a cluster of the processes
  (``trainer.runtime.collective.tensorflow_group``).
* **Feed.** Given numpy arrays, Keras's TensorFlow backend builds an input
  pipeline with an autotuned parallel ``map`` and ``prefetch``: background
  threads that fill the other cores while the step runs, which cost on a
  machine full of single-core workers (``trainer.runtime.feeding.feed``
  measures it). The shard is held as tensors on the host once, and every
  pipeline here runs on the calling thread: no parallel map, no prefetch, a
  private thread pool of one, autotune off.
* **Environment.** Its intra-op pool follows the task's cores, its inter-op
  pool is one or two threads; its GPU memory grows on demand instead of
  being mapped whole.
* **Weights.** Each variable's ``numpy()`` is already a plain host copy.
* **Version.** 2.15 and older bring Keras 2; several distributions provide
  the module.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from trainer.backends.common import KerasBackend


class TensorflowBackend(KerasBackend):
    """Keras on TensorFlow."""

    name = "tensorflow"
    extra = "tf"
    keras_default = True
    group_module = "trainer.runtime.collective.tensorflow_group"
    feeds_tf_data = True
    floor = ("2.16.1", "the oldest TensorFlow that runs Keras 3 (2.15 and older bring Keras 2)")
    distributions = ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly")

    def thread_env(self, cpus: int) -> dict[str, str]:
        return {"TF_NUM_INTRAOP_THREADS": str(cpus), "TF_NUM_INTEROP_THREADS": "1" if cpus <= 2 else "2"}

    def executor_env(self, cores: int) -> dict[str, str]:
        return {"TF_NUM_INTRAOP_THREADS": str(cores), "TF_NUM_INTEROP_THREADS": str(cores)}

    def gpu_memory_env(self) -> dict[str, str]:
        return {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}  # else it maps the whole GPU

    def read_weights(self, model) -> list[np.ndarray]:
        return [np.asarray(w) for w in model.get_weights()]

    def host_tensors(self, x: np.ndarray, y: np.ndarray) -> Any:
        import tensorflow as tf  # deferred: TensorFlow starts only when a model is needed

        with tf.device("/CPU:0"):  # tf.data runs on the host; on a GPU machine keep the shard there too
            return tf.constant(x), tf.constant(y)

    def index_dataset(self, tensors: Any, rows: int, batch_size: int, order: np.ndarray | None,
                      seed: int | None) -> Any:
        import tensorflow as tf  # deferred, as in host_tensors

        xt, yt = tensors
        if order is None:
            indices = tf.data.Dataset.range(rows).shuffle(rows, seed=seed, reshuffle_each_iteration=True)
        else:
            indices = tf.data.Dataset.from_tensor_slices(np.asarray(order, dtype=np.int64))
        return _on_one_thread(indices.batch(int(batch_size)).map(lambda i: (tf.gather(xt, i), tf.gather(yt, i))))

    def stack_dataset(self, stacks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
                      input_shape: tuple[int, ...], label_size: int | None, batches: int) -> Any:
        import tensorflow as tf  # deferred, as in host_tensors

        x_spec = tf.TensorSpec((None, None, *input_shape), tf.float32)
        y_spec = tf.TensorSpec((None, None, *((label_size,) if label_size else ())), tf.float32)
        # Each buffer goes in as a stack of minibatches, so that tf.data only slices it.
        buffers = tf.data.Dataset.from_generator(stacks, output_signature=(x_spec, y_spec))
        dataset = buffers.flat_map(lambda x, y: tf.data.Dataset.from_tensor_slices((x, y)))
        return _on_one_thread(dataset.apply(tf.data.experimental.assert_cardinality(batches)))


def _on_one_thread(dataset):
    """`dataset` run on the calling thread: a private thread pool of one, no intra-op parallelism, autotune off."""
    import tensorflow as tf  # deferred, as in host_tensors

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return dataset.with_options(options)


BACKEND = TensorflowBackend()
