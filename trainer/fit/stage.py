"""A fit's barrier stage around its parameter server: start, run with retries, stop, whatever happens.

Run by the one driver (``trainer.fit.driver``) for every kind of fit: the server and the driver-side callbacks start,
the stage runs with retries (``run_stage_with_retries``), and then the
server, the progress bar, the callbacks and the checkpointer are closed even
when the stage fails. A checkpoint that could not be written is recorded as
an event, never raised: the trained model matters more than its last file.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from trainer.errors import TrainingFailedError
from trainer.runtime.ps_worker.task import RESULT_DDL
from trainer.spark.launch import RetryPolicy, run_stage_with_retries


def run_fit_stage(frame, num_workers: int, make_task: Callable, policy: RetryPolicy, description: str, *,
                  server, progress, epoch_callbacks, checkpointer, checkpoint_dir, events: list[dict],
                  on_retry: Callable[[int], None], profile: Any = None) -> tuple[Any, float, float]:
    """Run the stage; (its result, the time it started, the time it ended)."""
    try:
        server.start()
        epoch_callbacks.start(server)
        job_start = time.time()
        stage = run_stage_with_retries(
            frame, num_workers, make_task, RESULT_DDL, policy=policy, description=description,
            on_retry=on_retry, events=events, profile=profile,
            fatal=lambda: server.failure and TrainingFailedError(
                f"Training stopped: the parameter server {server.failure}"),
        )
        job_end = time.time()
    finally:
        server.stop()
        progress.close()
        epoch_callbacks.close()
        save_problem = checkpointer.finish() if checkpointer is not None else None  # logged, never raised
    if save_problem is not None:
        events.append({"time": time.time(), "event": "checkpoint_failed", "path": str(checkpoint_dir),
                       "error": save_problem})
    return stage, job_start, job_end
