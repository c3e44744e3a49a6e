"""The parameter-server worker: the training task of a fit with a parameter-server algorithm.

    task      -- the barrier task (``train_partition``): set-up, the shard, the fit calls, the record
    exchange  -- the worker's Keras callback: commits, replies, shared epochs, the server's directives
    cadence   -- when to exchange: a fixed window, once per epoch, or sized from measured times
"""
