"""Feeding a task its data: Arrow record batches to numpy, the shard in memory or in a spill file, the input feed.

    arrow   -- Arrow record batches -> numpy (x, y), validation rows split off, shards padded
    shard   -- how a task holds its shard: in memory, or streamed from a spill file (``feed=``)
    spill   -- the spill file in the executor's local directory
    stream  -- reading a spill file one block at a time through a bounded shuffle buffer
    feed    -- a worker's shard as the single-threaded input of Keras's ``fit``
"""
