"""The engine that runs a search: placement, strategies, the driver-side run, the hopper transport, checkpoints.

``placement.py`` places models on workers (``MopScheduler``: model hopper parallelism; pure, events in,
assignments out), ``task_parallel.py`` the baseline that pins a configuration to a worker, ``strategies.py``
the execution strategies as objects (``mop``, ``task_parallel``, ``sequential``), ``search_run.py`` the
driver-side state the hopper server's threads act on, ``hopper.py`` the server and client of the tasks' requests,
and ``search_checkpoints.py`` a search's checkpoint directory.
"""
