"""The one seam between the package's internals and the bundled jobs and benchmarks (not an API for users).

The jobs (``jobs/``, ``trainer_jobs``) and the benchmarks (``benchmarks/``,
``trainer_benchmarks``) import the public API (``trainer``, ``trainer.algorithms``,
``trainer.data.prep``, ``trainer.lr_schedules``, ``trainer.selection``,
``trainer.ml``) and, for what it cannot give them, only the names below, by
the reason the public API does not serve them: ``tests/test_architecture.py``
checks both, and that every name here resolves and is used. A change inside
the package that moves or renames one of these breaks this list and its test,
not a benchmark found broken months later; no promise is made to anyone else. Imported lazily, like
``trainer``: ``make bench-gpu`` runs where pyspark cannot be imported.
"""

from __future__ import annotations

import importlib

#: why the public API does not serve (J: the jobs use them, B: the benchmarks) -> module -> the names used.
#: docs/architecture.md's table of the seam is made from it (``python tests/test_architecture.py --write``).
SEAM = {
    "the command lines of the jobs and benchmarks behave as `spark-keras-trainer`'s: quiet logs, Keras started "
    "without TensorFlow's banners, flags that default to the Trainer's defaults, `--window` parsed as `train` "
    "parses it, `--overlap` refused before any data is loaded, `--resume` only where a checkpoint is, MLflow runs "
    "as a fit's (J, B)": {
        "trainer.verbosity": ["configure_logging", "import_keras_quietly", "quiet_env"],
        "trainer.options": ["FitOptions"],
        "trainer.cli.train": ["window_arg"],
        "trainer.algorithms.delta": ["overlappable"],
        "trainer.fit.checkpoints": ["has_checkpoint"],
        "trainer.tracking": ["RunLogger"],
    },
    "the selection jobs' comparison of strategies, drawn as a selection draws one run's Gantt chart (J)": {
        "trainer.selection.report.plots": ["plot_gantt_comparison"],
    },
    "the plain-Keras baseline measured as a worker runs: held to a task's cores, fed by the worker's own input "
    "feed; the selection jobs' warm-up set up as a barrier task is (J, B)": {
        "trainer.runtime.process": ["configure_process", "holding_cores", "setup_barrier_task"],
        "trainer.runtime.feeding.feed": ["ShardFeed"],
    },
    "the worker loop without Spark, to measure a task apart from Spark: `make bench-gpu`, `profile_overhead` (B)": {
        "trainer.runtime.state": ["load_state"],
        "trainer.runtime.ps_worker.exchange": ["make_sync_callback"],
        "trainer.runtime.collective.loop": ["CollectiveJob"],
        "trainer.runtime.collective.collective_task": ["reserve_port", "start_process", "wait_process"],
        "trainer.runtime.shipping": ["ModelSource"],
    },
    "the jobs' and benchmarks' `--backend`: the backends' names, the one Keras starts when none is named, and "
    "what differs by backend, asked of the backends' rooms as the package asks them (J, B)": {
        "trainer.backends": ["NAMES", "DEFAULT_NAME", "configured_name", "backend_for"],
    },
    "`make bench-elastic` waits for a replaced executor's slot as a fit waits for its slots (B)": {
        "trainer.spark.launch": ["wait_for_slots"],
    },
    "the parameter server and its wire measured alone: `make bench-ps`, `bench_security` (B)": {
        "trainer.ps": ["ParameterServer", "PSClient", "ShardedParameterServer", "ShardedPSClient"],
        "trainer.transport.frame_auth": ["DEFAULT_MAC", "MAC_ALGORITHMS", "Channel", "OneTimePoly1305"],
        "trainer.transport.wire": ["Msg", "RecvBuffer", "TransportError", "encode", "frame_size", "new_secret",
                                    "set_io_timeout"],
    },
}
_WHERE = {name: module for modules in SEAM.values() for module, names in modules.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"trainer.internals has no {name!r}: add it to SEAM (and say why the public API "
                             "does not serve)")
    return getattr(importlib.import_module(_WHERE[name]), name)
