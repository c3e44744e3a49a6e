"""The one seam between the package's internals and the bundled jobs and benchmarks (not an API for users).

The jobs (``jobs/``, ``trainer_jobs``) and the benchmarks (``benchmarks/``,
``trainer_benchmarks``) import the public API (``trainer``, ``trainer.algorithms``,
``trainer.data.prep``, ``trainer.lr_schedules``, ``trainer.selection``,
``trainer.ml``) and, for anything else, only the names below:
``tests/test_architecture.py`` checks both, and that every name here resolves.
A change inside the package that moves or renames one of these breaks this list
and its test, not a benchmark found broken months later. Imported lazily, like
``trainer``: ``make bench-gpu`` runs where pyspark cannot be imported.
"""

from __future__ import annotations

import importlib

# module -> the names the jobs (J) and the benchmarks (B) use of it.
SEAM = {
    # the command lines of jobs and benchmarks (J, B)
    "trainer.verbosity": ["configure_logging", "import_keras_quietly", "quiet_env"],
    "trainer.options": ["FitOptions"],
    "trainer.cli.train": ["window_arg"],
    "trainer.fit.checkpoints": ["has_checkpoint"],
    "trainer.algorithms.delta": ["overlappable"],
    "trainer.tracking": ["RunLogger"],
    # the jobs: free task slots, the selection jobs' search type and Gantt plots; a task's cores (J, B: the
    # plain-Keras baseline held to the cores of a worker)
    "trainer.spark.launch": ["wait_for_slots"],
    "trainer.selection.search": ["Search"],
    "trainer.selection.plots": ["plot_gantt_comparison"],
    "trainer.runtime.process": ["configure_process", "task_resources"],
    # the plain-Keras baseline on the worker's own input feed (J, B)
    "trainer.runtime.feeding.feed": ["ShardFeed"],
    # the worker loop without Spark: make bench-gpu, profile_overhead (B)
    "trainer.runtime.state": ["load_state"],
    "trainer.runtime.ps_worker.exchange": ["make_sync_callback"],
    "trainer.runtime.collective.loop": ["CollectiveJob"],
    "trainer.runtime.collective.collective_task": ["reserve_port", "start_process", "wait_process"],
    "trainer.runtime.shipping": ["ModelSource"],
    "trainer.algorithms.allreduce": ["LR_SCALING"],
    # the parameter server and its wire: make bench-ps, bench_security (B)
    "trainer.ps": ["ParameterServer", "PSClient", "ShardedParameterServer", "ShardedPSClient"],
    "trainer.transport.frame_auth": ["DEFAULT_MAC", "MAC_ALGORITHMS", "Channel", "OneTimePoly1305"],
    "trainer.transport.wire": ["Msg", "RecvBuffer", "TransportError", "encode", "frame_size", "new_secret",
                                "set_io_timeout"],
}
_WHERE = {name: module for module, names in SEAM.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"trainer.internals has no {name!r}: add it to SEAM (and say who uses it)")
    return getattr(importlib.import_module(_WHERE[name]), name)
