"""What this package sets in a process's environment before a Keras backend starts, and where.

Never at ``import trainer``: the user's process stays as it was until it asks
for a session. `prepare_process` is called where a session starts
(``trainer.spark.session.spark_session``, also under `LocalCluster`), and
by every task's set-up (``trainer.runtime.process``); commands set the same
through ``trainer.verbosity.configure_logging``. A value the user set wins.

* **Quiet logs** (``trainer.verbosity.quiet_env``): TensorFlow's C++ log
  level follows ``TRAINER_LOG``.
* **GPU memory** (``trainer.backends.gpu_memory_env``): tasks that share a
  GPU, and a driver on a GPU host (it builds the model too), take only what
  they use. Each backend's room says how: JAX preallocates 75 % of a GPU per
  process unless told otherwise; TensorFlow maps all of it; torch allocates
  lazily already.
"""

from __future__ import annotations

import os

from trainer import backends, verbosity


def prepare_process() -> None:
    """Quiet logs and GPU memory on demand in this process, unless the user set the variables."""
    verbosity.apply_quiet_env()
    for key, value in backends.gpu_memory_env().items():
        os.environ.setdefault(key, value)
