"""What runs inside a Spark task, on the executors, by concern.

    process, cores, allocator, memory  -- set-up of the task's process before its Keras backend starts
    shipping   -- user code and models to the executors (by value, ``.keras`` bytes, a per-process cache)
    state      -- a Keras model's weights and optimizer variables as numpy arrays
    backends   -- what differs between Keras backends in an exchange
    inference  -- prediction, evaluation and validation passes
    task_config -- what every training task gets from the driver
    feeding/   -- the task's data: Arrow to numpy, the shard in memory or spilled, the input feed
    ps_worker/ -- the training task of a parameter-server fit and its exchanges with the server
    collective/ -- the training task of a collective fit (all-reduce on the backend's own engine)

The driver side imports these modules only to build task closures; none of them
imports Keras at module level.
"""
