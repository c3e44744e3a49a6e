"""The collective worker of an `AllReduce` fit: what runs inside a Spark task and the process it starts.

* ``task``: the barrier task (the shard, the group's addresses through one ``allGather``, the process);
* ``loop``: one process of the group, per epoch a ``model.fit`` pass and the report to the driver;
* ``group``: the group on the Keras backend's own collective engine, one module per backend
  (``jax_group``, ``tensorflow_group``, ``torch_group``; the TensorFlow and torch steps share
  ``local_step``);
* ``rates``: the learning rate scaled for the global batch.
"""
