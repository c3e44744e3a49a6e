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

import json
import os

from trainer import verbosity

#: The backend Keras starts when neither KERAS_BACKEND nor its config file names one.
KERAS_DEFAULT_BACKEND = "tensorflow"


def keras_backend() -> str:
    """The Keras backend this process's Keras starts, read as Keras reads it without importing Keras:
    ``KERAS_BACKEND``, else the ``backend`` of ``$KERAS_HOME/keras.json`` (``~/.keras/keras.json``), else
    Keras's default. The executors are given it, so they run the driver's backend."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as f:
            backend = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    return backend if isinstance(backend, str) and backend else KERAS_DEFAULT_BACKEND


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
