"""What this package sets in a process's environment before a Keras backend starts, and where.

Never at ``import trainer``: the user's process stays as it was until it asks
for a session. `prepare_process` is called where a session starts
(``trainer.spark.session.spark_session``, also under `LocalCluster`), and
by every task's set-up (``trainer.runtime.process``); commands set the same
through ``trainer.verbosity.configure_logging``. A value the user set wins.

* **Quiet logs** (``trainer.verbosity.quiet_env``): TensorFlow's C++ log
  level follows ``TRAINER_LOG``.
* **GPU memory** (`gpu_memory_env`): tasks that share a GPU, and a driver on
  a GPU host (it builds the model too), take only what they use. JAX
  preallocates 75 % of a GPU per process unless told otherwise; TensorFlow
  maps all of it; torch allocates lazily already.
"""

from __future__ import annotations

import os

from trainer import verbosity


def gpu_memory_env() -> dict[str, str]:
    """The GPU memory policy: grow on demand under every backend (see the module docstring)."""
    env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    if "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ:  # a fraction the user chose means preallocate it
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def prepare_process() -> None:
    """Quiet logs and GPU memory on demand in this process, unless the user set the variables."""
    verbosity.apply_quiet_env()
    for key, value in gpu_memory_env().items():
        os.environ.setdefault(key, value)
