"""``--mlflow`` on the jobs: one MLflow run per job with its arguments and its result rows.

Every numeric field of every result row (epoch time, speed-up, efficiency,
accuracy or MAPE...) becomes a metric named ``<model>.<N>w.<field>``, in the
active run or a new one under the current tracking URI (``MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from trainer.internals import RunLogger


def add_mlflow_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mlflow", action="store_true",
                        help="log the arguments and the result rows (speed-ups, metrics) to MLflow: the tracking "
                             "URI comes from MLFLOW_TRACKING_URI (needs the mlflow extra)")


def log_results(job: str, args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    """Log `rows` of `job` run with `args`; returns the run id."""
    with RunLogger(run_name=job, tags={"trainer.job": job}) as run:
        run.log_params({k: v for k, v in vars(args).items() if v is not None})
        metrics = {}
        for row in rows:
            prefix = f"{row.get('model', job)}.{row.get('workers', 0)}w"
            for key, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(float(value)):
                    metrics[f"{prefix}.{key}"] = float(value)
        run.log_metrics(metrics)
        return run.run_id
