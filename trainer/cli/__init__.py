"""The ``spark-keras-trainer`` command (also ``python -m trainer``).

    spark-keras-trainer cluster up --workers 3                     an embedded Spark cluster until Ctrl-C
    spark-keras-trainer train model --model pkg.mod:build --data train.parquet --workers 2
    spark-keras-trainer train mnist --workers 1,2 --epochs 1       a bundled job, its own flags
    spark-keras-trainer select mnist --limit 6000 --epochs 2       a bundled model-selection job
    spark-keras-trainer bench --quick                              the jobs' benchmarks (make bench)
    spark-keras-trainer bench ps --help                            one benchmark (bench --help lists them)

Each subcommand wraps what the package already offers; ``--help`` on each lists
its options. The bundled jobs parse their own flags (``cli/jobs.py``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from trainer.cli import cluster, jobs, train

PROG = jobs.PROG


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Distributed training of Keras models on Apache Spark.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cluster.add_parser(sub)
    train.add_parser(sub, jobs.add_job_parsers)
    jobs.add_select_parser(sub)
    jobs.add_bench_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``spark-keras-trainer`` and ``python -m trainer``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    job = jobs.find_job(argv)
    if job is not None:
        return jobs.run_job(*job)
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
