"""What runs inside a Spark task, on the executors.

    process   -- threads, GPUs, backend and log levels, set before TensorFlow starts
    shipping  -- user code and models to the executors (by value, ``.keras`` bytes, a per-process cache)
    arrow     -- Arrow record batches -> numpy (x, y)
    state     -- a Keras model's weights and optimizer variables as numpy arrays
    feed      -- a worker's shard as a single-threaded ``tf.data`` input for ``fit``
    worker    -- the training task of ``Trainer.fit`` (one per worker, in a barrier stage)

The driver side imports these modules only to build task closures; none of them
imports Keras at module level.
"""
