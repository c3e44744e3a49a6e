"""Command line and report writing shared by the model-selection jobs (``jobs/select_*.py``).

``comparison_parser`` holds the options every selection job takes (cluster,
workers, epochs, strategies, seed, data, output); ``parse_comparison_args``
checks them before any cluster work starts; ``first_configs`` applies
``--max-configs``; ``score_best_models`` tests each strategy's best model;
``write_comparison`` writes the strategy and configuration tables and the
Gantt chart, and prints the console table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from trainer.report import markdown_table, write_results
from trainer.selection.compare import TABLE_COLUMNS, comparison_rows, config_rows, plot_comparison
from trainer.selection.runner import STRATEGIES, SelectionResult
from trainer.selection.search import Search

__all__ = ["comparison_parser", "parse_comparison_args", "first_configs", "score_best_models", "write_comparison"]


def comparison_parser(description: str | None, *, default_out: str, limit_help: str, data_help: str,
                      seed_help: str) -> argparse.ArgumentParser:  # fmt: skip
    """An argument parser with the options of every selection job; a job adds its own after."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master", default=None, help="Spark master URL; default: an embedded LocalCluster")
    parser.add_argument("--workers", type=int, default=2, help="workers of the parallel strategies (default 2)")
    parser.add_argument("--cores-per-worker", type=int, default=1, help="cores (and threads) per worker (default 1)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per configuration (default 2)")
    parser.add_argument("--limit", type=int, default=None, help=limit_help)
    parser.add_argument("--max-configs", type=int, default=None, help="search only the first N of the 8 configs")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated subset of {','.join(STRATEGIES)} (default: all)")
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--data", default=None, help=data_help)
    parser.add_argument("--out", default=default_out, help=f"results directory (default {default_out})")
    return parser


def parse_comparison_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and check the shared options; sets ``strategy_list`` (exits with a usage error if wrong)."""
    args = parser.parse_args(argv)
    args.strategy_list = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategy_list if s not in STRATEGIES]
    if unknown or not args.strategy_list:
        parser.error(f"--strategies: unknown {unknown}; expected a comma-separated subset of {','.join(STRATEGIES)}")
    for name in ("workers", "cores_per_worker", "epochs", "limit", "max_configs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    return args


def first_configs(search: Search, max_configs: int | None) -> Search:
    """``search`` itself, or a search over its first ``max_configs`` configurations."""
    return search if max_configs is None else Search(search.configs()[:max_configs], search.metric)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.5g}"


def score_best_models(results: Mapping[str, SelectionResult], column: str,
                      score: Callable[[Any], float]) -> dict[str, dict[str, float | None]]:  # fmt: skip
    """``score(best_model)`` for every strategy, printed one line each; the ``extra`` of `write_comparison`."""
    extra: dict[str, dict[str, float | None]] = {}
    for strategy, result in results.items():
        value = score(result.best_model) if result.best_model is not None else None
        extra[strategy] = {column: value}
        best = result.best_config.id if result.best_config else "-"
        print(f"{strategy}: {result.timings['wall_s']:.1f} s, best {best} {result.metric.name} "
              f"{_number(result.best_value)}, {column} {_number(value)}", flush=True)
    return extra


def write_comparison(results: Mapping[str, SelectionResult], out: Path, name: str, *, timing_valid: bool,
                     extra: Mapping[str, Mapping[str, Any]], metadata: Mapping[str, Any], title: str) -> None:
    """Write ``{name}`` and ``{name}_configs`` (JSON, CSV, markdown) and ``{name}_gantt.png``; print the table
    (the usual columns and those of `extra`)."""
    rows = comparison_rows(results, name, timing_valid=timing_valid, extra=extra)
    paths = write_results(rows, out, name, metadata=metadata)
    write_results(config_rows(results, name), out, f"{name}_configs", metadata=metadata)
    gantt = plot_comparison(results, out / f"{name}_gantt.png", title=title)
    extra_columns = list(dict.fromkeys(key for values in extra.values() for key in values))
    print(markdown_table(rows, [*TABLE_COLUMNS, *extra_columns]))
    print(f"results: {', '.join(str(p) for p in paths.values())}, {gantt}")
