"""Support of the model-selection jobs (``jobs/select_*.py``): the comparison of strategies and its reports.

Command line: ``comparison_parser`` holds the options every selection job
takes (cluster, workers, epochs, strategies, seed, data, output);
``parse_comparison_args`` checks them before any cluster work starts;
``first_configs`` applies ``--max-configs``; ``score_best_models`` tests each
strategy's best model; ``write_comparison`` writes the strategy and
configuration tables and the Gantt chart, and prints the console table.

Searches (``--search``): ``make_search`` builds any of ``SEARCHES`` at an equal
budget of epochs (Hyperband's total for ``--max-epochs``/``--eta``: random
search trains ``budget // max_epochs`` configurations fully, successive halving
as many as fit, TPE and ASHA stop asking once the budget is granted; the grid
keeps ``--epochs``). With several searches or seeds, ``compare_searches`` runs
each search per seed with one strategy and ``write_search_comparison`` writes
the table (best validation metric, time to reach Hyperband's best of the same
seed), its summary per search over the seeds (``search_summary``: the table
docs/model-selection.md quotes) and the searches' Gantt charts on one time axis.

The comparison: ``compare_strategies`` runs the same search with every strategy of
``trainer.selection.STRATEGIES`` (a fresh search object each time,
the sequential baseline on one worker) and ``comparison_rows`` /
``config_rows`` turn the results into rows for :mod:`trainer_jobs.support.report`:

* ``time_s``: the whole ``fit`` (checks, model builds, data delivery, training);
* ``ideal_s``: the sequential run's time divided by the number of workers, the
  time of perfectly packed task parallelism without any overhead;
* ``vs_ideal``: ``time_s / ideal_s`` (1.0 is ideal; the sequential run is at ``N``);
* ``vs_task_parallel``: ``time_s`` over the measured task-parallel time. On a
  machine whose cores slow each other down (2 vCPUs here: two busy processes
  each run 10-25 % slower than one alone) no strategy reaches
  ``ideal_s``; this ratio isolates what MOP adds on top of task parallelism;
* ``max_config_gap``: the largest difference, over the configurations, between
  a configuration's final metric under this strategy and under the sequential
  baseline (0 for the sequential row): how far the strategy moves accuracy;
* ``speedup``: ``t(sequential) / time_s``; ``efficiency``: ``speedup / workers``;
* ``data_bytes``: training and validation bytes held by the tasks (MOP holds the
  data once, task parallelism ``N`` copies), ``bytes``: state moved through the driver.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from statistics import fmean
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa
from pyspark import BarrierTaskContext

from trainer.selection import (
    ASHA, STRATEGIES, GridSearch, Hyperband, ModelSelector, RandomSearch, Search, SelectionResult, SuccessiveHalving,
    TPESearch,
)
from trainer.internals import holding_cores, plot_gantt_comparison, setup_barrier_task
from trainer_jobs.support.cli import add_verbose_arg, positive_int, start_logging
from trainer_jobs.support.published import add_publish_arg, publish
from trainer_jobs.support.report import markdown_table, write_results

__all__ = ["comparison_parser", "parse_comparison_args", "first_configs", "score_best_models", "write_comparison",
           "warm_up_executors", "compare_strategies", "comparison_rows", "config_rows", "plot_comparison",
           "TABLE_COLUMNS", "SEARCHES", "make_search", "hyperband_epochs", "compare_searches", "search_rows",
           "search_summary", "summary_table", "write_search_comparison"]

#: Every search a selection job takes (``--search``).
SEARCHES = ("grid", "random", "halving", "hyperband", "tpe", "asha", "tpe-asha")
#: Columns of the console table of a comparison of searches.
SEARCH_COLUMNS = ["search", "seed", "epochs", "configs", "stopped_early", "time_s", "train_s", "metric_value",
                  "best_config", "reach_hyperband_s", "vs_hyperband"]

#: Columns of the jobs' console table (the files have every column).
TABLE_COLUMNS = ["mode", "workers", "time_s", "ideal_s", "vs_ideal", "vs_task_parallel", "speedup", "data_bytes",
                 "data_copies", "bytes", "metric_value", "max_config_gap", "best_config"]


def _warm_task(backend: str, batches):
    return holding_cores(_warm_up(backend, batches))


def _warm_up(backend: str, batches):
    ctx = BarrierTaskContext.get()
    setup_barrier_task(ctx, backend, {})
    import keras  # noqa: F401  (the import is the warm-up)

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"worker": [ctx.partitionId()]})


def warm_up_executors(spark, num_workers: int) -> float:
    """Start a Python worker with TensorFlow/Keras imported on ``num_workers`` slots; returns seconds.

    Spark reuses idle Python workers, so the first timed strategy does not pay
    the start-up alone. Runs one small barrier stage (all slots at once).
    """
    import keras  # deferred: TensorFlow starts only when a job runs

    started = time.perf_counter()
    frame = spark.range(num_workers, numPartitions=num_workers)
    frame.mapInArrow(functools.partial(_warm_task, keras.backend.backend()), "worker long", barrier=True).collect()
    return time.perf_counter() - started


def compare_strategies(model_fn: Callable[[dict[str, Any]], Any], make_search: Callable[[], Search], train, validation,
                       *, strategies: Iterable[str] = STRATEGIES, num_workers: int = 2,
                       out_dir: str | Path | None = None,
                       **selector_kwargs: Any) -> dict[str, SelectionResult]:  # fmt: skip
    """Run ``make_search()`` once per strategy on ``train``/``validation``; ``{strategy: result}``.

    Executors are warmed up first (:func:`warm_up_executors`).

    ``selector_kwargs`` go to every :class:`ModelSelector` (``seed``,
    ``features_col``, ...). With ``out_dir`` each result is saved under
    ``out_dir/<strategy>/`` (leaderboard, Gantt chart, curves).
    """
    strategies = list(strategies)
    warm_up_executors(train.sparkSession, max(1 if s == "sequential" else num_workers for s in strategies))
    results: dict[str, SelectionResult] = {}
    for strategy in strategies:
        workers = 1 if strategy == "sequential" else num_workers
        selector = ModelSelector(model_fn, make_search(), strategy=strategy, num_workers=workers, **selector_kwargs)
        results[strategy] = selector.fit(train, validation)
        if out_dir is not None:
            results[strategy].save(Path(out_dir) / strategy)
    return results


def comparison_rows(results: Mapping[str, SelectionResult], name: str, *, timing_valid: bool = True,
                    extra: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One row per strategy (see the module docstring); ``extra[strategy]`` adds keys."""
    parallel = [r.num_workers for r in results.values() if r.strategy != "sequential"]
    n = max(parallel, default=1)
    seq = results.get("sequential")
    ideal = seq.timings["wall_s"] / n if seq is not None else None
    task = results.get("task_parallel")
    mop_bytes = results["mop"].data_bytes if "mop" in results else None
    rows = []
    for strategy, r in results.items():
        wall = r.timings["wall_s"]
        row = {
            "run": name, "model": name, "mode": strategy, "workers": r.num_workers, "time_s": wall,
            "train_wall_s": r.timings["train_wall_s"], "setup_s": r.timings["setup_s"],
            "data_delivery_s": r.timings["data_delivery_s"], "ideal_s": ideal,
            "vs_ideal": wall / ideal if ideal else None,
            "vs_task_parallel": wall / task.timings["wall_s"] if task is not None else None,
            "speedup": seq.timings["wall_s"] / wall if seq is not None else None,
            "efficiency": seq.timings["wall_s"] / wall / r.num_workers if seq is not None else None,
            "metric_name": r.metric.name, "metric_value": r.best_value,
            "best_config": r.best_config.id if r.best_config else None, "configs": len(r.configs),
            "updates": len(r.units), "bytes": r.bytes_moved, "data_bytes": r.data_bytes,
            "data_copies": r.data_bytes / mop_bytes if mop_bytes else None,
            "max_config_gap": _max_gap(r, seq) if seq is not None else None, "timing_valid": timing_valid,
        }
        row.update((extra or {}).get(strategy, {}))
        rows.append(row)
    return rows


def _max_gap(result: SelectionResult, reference: SelectionResult) -> float | None:
    """Largest |final metric - reference's final metric| over the configurations both trained."""
    mine = result.leaderboard.set_index("config_id")["final_metric"]
    theirs = reference.leaderboard.set_index("config_id")["final_metric"]
    gaps = (mine - theirs).abs().dropna()
    return float(gaps.max()) if len(gaps) else None


def config_rows(results: Mapping[str, SelectionResult], name: str) -> list[dict[str, Any]]:
    """One row per (strategy, configuration): final and best metric, epochs, time, params."""
    rows = []
    for strategy, r in results.items():
        for rec in r.leaderboard.to_dict("records"):
            rows.append({
                "run": name, "model": rec["config_id"], "mode": strategy, "workers": r.num_workers,
                "time_s": rec["time_s"], "speedup": None, "efficiency": None, "metric_name": r.metric.name,
                "metric_value": rec["final_metric"], "best_metric": rec["best_metric"], "rank": rec["rank"],
                "epochs_done": rec["epochs_done"], "params": rec["params"],
            })
    return rows


def plot_comparison(results: Mapping[str, SelectionResult], out_png: str | Path, title: str | None = None) -> Path:
    """The strategies' Gantt charts stacked on one time axis."""
    return plot_gantt_comparison({s: (r.units, r.num_workers) for s, r in results.items()}, out_png, title=title)


def comparison_parser(description: str | None, *, default_out: str, limit_help: str, data_help: str,
                      seed_help: str) -> argparse.ArgumentParser:  # fmt: skip
    """An argument parser with the options of every selection job; a job adds its own after."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master", default=None, help="Spark master URL; default: an embedded LocalCluster")
    parser.add_argument("--workers", type=positive_int, default=2, help="workers of the parallel strategies (default 2)")
    parser.add_argument("--cores-per-worker", type=positive_int, default=1,
                        help="cores (and threads) per worker (default 1)")
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs per configuration (default 2)")
    parser.add_argument("--limit", type=positive_int, default=None, help=limit_help)
    parser.add_argument("--max-configs", type=positive_int, default=None,
                        help="search only the first N of the 8 configs")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated subset of {','.join(STRATEGIES)} (default: all)")
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--search", default="grid",
                        help=f"comma-separated searches, of {','.join(SEARCHES)} (default grid); several, or "
                             "several --seeds, compare the searches at equal budget with the first strategy")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds of a comparison of searches (default: --seed)")
    parser.add_argument("--max-epochs", type=positive_int, default=4,
                        help="most epochs of a configuration in the adaptive searches (default 4)")
    parser.add_argument("--eta", type=positive_int, default=2,
                        help="halving rate of successive halving, Hyperband and ASHA (default 2)")
    parser.add_argument("--max-concurrent", type=positive_int, default=None,
                        help="trials TPE and ASHA train at once (default: workers + 1)")
    parser.add_argument("--data", default=None, help=data_help)
    parser.add_argument("--data-dir", default=None,
                        help="where the data is written once as Parquet for Spark to read: a folder the executors "
                             "see or an hdfs://, s3://... URI (default $TRAINER_DATA_DIR or ./data)")
    parser.add_argument("--out", default=default_out, help=f"results directory (default {default_out})")
    add_publish_arg(parser, f"{Path(default_out).name.replace('_', '-')} (--compare-searches: ...-searches)")
    parser.add_argument("--tls", action="store_true",
                        help="encrypt the traffic between the tasks and the driver with TLS (a throw-away "
                             "certificate per search; needs the cryptography package or openssl)")
    add_verbose_arg(parser)
    return parser


def parse_comparison_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and check the shared options; sets ``strategy_list`` (exits with a usage error if wrong)."""
    args = parser.parse_args(argv)
    args.strategy_list = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in args.strategy_list if s not in STRATEGIES]
    if unknown or not args.strategy_list:
        parser.error(f"--strategies: unknown {unknown}; expected a comma-separated subset of {','.join(STRATEGIES)}")
    args.search_list = [s.strip() for s in args.search.split(",") if s.strip()]
    unknown = [s for s in args.search_list if s not in SEARCHES]
    if unknown or not args.search_list:
        parser.error(f"--search: unknown {unknown}; expected a comma-separated subset of {','.join(SEARCHES)}")
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else [args.seed]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated ints. Received {args.seeds!r}")
    if args.eta < 2:
        parser.error("--eta must be at least 2")
    args.compare_searches = len(args.search_list) > 1 or len(args.seed_list) > 1
    if args.max_concurrent is None:
        args.max_concurrent = args.workers + 1
    start_logging(args)
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
    configs = config_rows(results, name)
    write_results(configs, out, f"{name}_configs", metadata=metadata)
    publish(metadata.get("publish"), name.replace("_", "-"), {"rows": rows, "configs": configs})
    gantt = plot_comparison(results, out / f"{name}_gantt.png", title=title)
    extra_columns = list(dict.fromkeys(key for values in extra.values() for key in values))
    print(markdown_table(rows, [*TABLE_COLUMNS, *extra_columns]))
    print(f"results: {', '.join(str(p) for p in paths.values())}, {gantt}")


# --------------------------------------------------------------------------- searches at equal budget
def _halving_epochs(n: int, rungs: Sequence[int], eta: int) -> int:
    """Epochs successive halving trains: ``n`` configurations to the first rung, then the best ``1/eta``."""
    total, alive, previous = 0, n, 0
    for i, rung in enumerate(rungs):
        total += alive * (rung - previous)
        previous = rung
        if i < len(rungs) - 1:
            alive = max(1, alive // eta)
    return total


def hyperband_epochs(max_epochs: int, eta: int, min_epochs: int = 1) -> int:
    """Total epochs of ``Hyperband(space, max_epochs, eta, min_epochs=min_epochs)``: the budget of the others."""
    search = Hyperband({}, max_epochs, eta=eta, min_epochs=min_epochs)
    return sum(_halving_epochs(len(b.configs()), b.rungs, eta) for b in search.brackets)


def make_search(name: str, *, grid: Mapping[str, Any], space: Mapping[str, Any], epochs: int, max_epochs: int,
                eta: int, seed: int, metric: str, batch_size: int = 32, max_concurrent: int = 3) -> Search:
    """The search ``name`` (one of ``SEARCHES``) at Hyperband's budget of epochs (see the module docstring)."""
    budget = hyperband_epochs(max_epochs, eta)
    common = {"batch_size": batch_size, "metric": metric}
    if name == "grid":
        return GridSearch(grid, epochs=epochs, **common)
    if name == "hyperband":
        return Hyperband(space, max_epochs, eta=eta, seed=seed, **common)
    if name == "random":
        return RandomSearch(space, n=max(1, budget // max_epochs), seed=seed, epochs=max_epochs, **common)
    if name == "halving":
        rungs = Hyperband({}, max_epochs, eta=eta).brackets[0].rungs
        n = max([k for k in range(1, budget + 1) if _halving_epochs(k, rungs, eta) <= budget], default=1)
        return SuccessiveHalving(RandomSearch(space, n=n, seed=seed, epochs=max_epochs, **common), 1, max_epochs, eta,
                                 metric=metric)
    asked = {"max_total_epochs": budget, "max_concurrent": max_concurrent, "seed": seed, **common}
    if name == "tpe":
        return TPESearch(space, max_epochs, **asked)
    if name == "asha":
        return ASHA(space, max_epochs, eta=eta, **asked)
    if name == "tpe-asha":
        return TPESearch(space, max_epochs, pruner="asha", eta=eta, **asked)
    raise ValueError(f"Unknown search {name!r}. Expected one of {', '.join(SEARCHES)}.")


def compare_searches(model_fn: Callable[[dict[str, Any]], Any], make: Callable[[str, int], Search], train, validation,
                     *, searches: Sequence[str], seeds: Sequence[int], strategy: str = "mop", num_workers: int = 2,
                     out_dir: str | Path | None = None,
                     **selector_kwargs: Any) -> dict[tuple[str, int], SelectionResult]:  # fmt: skip
    """Run ``make(search, seed)`` for every seed and search with one strategy; ``{(search, seed): result}``.

    The selector's seed is the search's seed; with ``out_dir`` each result is
    saved under ``out_dir/<search>-<seed>/``.
    """
    workers = 1 if strategy == "sequential" else num_workers
    warm_up_executors(train.sparkSession, workers)
    results: dict[tuple[str, int], SelectionResult] = {}
    for seed in seeds:
        for name in searches:
            selector = ModelSelector(model_fn, make(name, seed), strategy=strategy, num_workers=workers, seed=seed,
                                     **selector_kwargs)
            result = results[(name, seed)] = selector.fit(train, validation)
            print(f"{name} seed {seed}: {result.timings['wall_s']:.1f} s, best {result.metric.name} "
                  f"{_number(result.best_value)} ({result.best_config.id if result.best_config else '-'})", flush=True)
            if out_dir is not None:
                result.save(Path(out_dir) / f"{name}-{seed}")
    return results


def _time_to_reach(result: SelectionResult, target: float | None) -> float | None:
    """Seconds from the start of training until some configuration's epoch value was as good as ``target``."""
    if target is None:
        return None
    ends = sorted((r["end"], r["value"]) for records in result.history.values() for r in records)
    return next((end for end, value in ends if not result.metric.better(target, value)), None)


def search_rows(results: Mapping[tuple[str, int], SelectionResult], name: str) -> list[dict[str, Any]]:
    """One row per (search, seed): epochs trained, configurations, wall and training time, the best metric,
    and the seconds to reach Hyperband's best of the same seed (``vs_hyperband``: over Hyperband's own)."""
    rows = []
    for (search, seed), r in results.items():
        hyperband = results.get(("hyperband", seed))
        target = hyperband.best_value if hyperband is not None else None
        reach = _time_to_reach(r, target)
        own = _time_to_reach(hyperband, target) if hyperband is not None else None
        rows.append({
            "run": name, "model": search, "mode": r.strategy, "search": search, "seed": seed,
            "workers": r.num_workers, "epochs": sum(len(h) for h in r.history.values()), "configs": len(r.configs),
            "stopped_early": int(r.leaderboard["stopped"].sum()), "time_s": r.timings["wall_s"],
            "train_s": r.timings["train_wall_s"], "metric_name": r.metric.name, "metric_value": r.best_value,
            "best_config": r.best_config.id if r.best_config else None, "reach_hyperband_s": reach,
            "vs_hyperband": reach / own if reach is not None and own else None,
        })
    return rows


def search_summary(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per search over its seeds (the table docs/model-selection.md quotes): the means of epochs,
    configurations, configurations stopped early and wall time; the best metric per seed and its mean; on how
    many seeds it reached Hyperband's best, the seconds it took per seed, and its mean ratio to Hyperband's own
    time over the seeds where it did."""
    summary = []
    for search in dict.fromkeys(row["search"] for row in rows):
        own = [row for row in rows if row["search"] == search]
        reached = [row for row in own if row["reach_hyperband_s"] is not None]
        ratios = [row["vs_hyperband"] for row in reached if row["vs_hyperband"] is not None]
        summary.append({
            "search": search, "seeds": len(own), "epochs": fmean([row["epochs"] for row in own]),
            "configs": fmean([row["configs"] for row in own]),
            "stopped_early": fmean([row["stopped_early"] for row in own]),
            "time_s": fmean([row["time_s"] for row in own]), "metric_name": own[0]["metric_name"],
            "metric_per_seed": [row["metric_value"] for row in own],
            "metric_mean": fmean([row["metric_value"] for row in own]), "reached": len(reached),
            "reach_hyperband_s_per_seed": [row["reach_hyperband_s"] for row in own],
            "vs_hyperband_mean": fmean(ratios) if ratios else None,
        })
    return summary


def summary_table(summary: Sequence[Mapping[str, Any]]) -> str:
    """`search_summary` as the page's Markdown table."""
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def metric(value: float) -> str:  # accuracies to 4 decimals, small losses to 6
        return f"{value:.4f}" if abs(value) >= 0.01 else f"{value:.6f}"

    name = summary[0]["metric_name"] if summary else "metric"
    rows = [{
        "search": s["search"], "epochs": f"{s['epochs']:.0f}", "configs (stopped early)":
            f"{s['configs']:.1f} ({s['stopped_early']:.1f})", "wall s, mean": f"{s['time_s']:.1f}",
        f"best {name} per seed": " / ".join(metric(v) for v in s["metric_per_seed"]),
        "mean": metric(s["metric_mean"]), "reached Hyperband's best": f"{s['reached']}/{s['seeds']}",
        "time to reach it, s per seed": " / ".join(seconds(v) for v in s["reach_hyperband_s_per_seed"]),
        "vs Hyperband's time, mean": "-" if s["vs_hyperband_mean"] is None else f"{s['vs_hyperband_mean']:.2f}",
    } for s in summary]
    return markdown_table(rows, list(rows[0]) if rows else [])


def write_search_comparison(results: Mapping[tuple[str, int], SelectionResult], out: Path, name: str, *,
                            metadata: Mapping[str, Any], title: str) -> None:  # fmt: skip
    """Write ``{name}_searches`` (JSON, CSV, markdown), its summary per search (``{name}_searches_summary.md``)
    and ``{name}_searches_gantt.png`` (the first seed's searches on one time axis); print both tables; publish the
    rows and the summary."""
    rows = search_rows(results, name)
    summary = search_summary(rows)
    paths = write_results(rows, out, f"{name}_searches", metadata=metadata)
    publish(metadata.get("publish"), f"{name.replace('_', '-')}-searches", {"rows": rows, "summary": summary})
    first = next(iter(results))[1]
    gantt = plot_gantt_comparison({s: (r.units, r.num_workers) for (s, seed), r in results.items() if seed == first},
                                  out / f"{name}_searches_gantt.png", title=f"{title} (seed {first})")
    print(markdown_table(rows, SEARCH_COLUMNS))
    table = summary_table(summary)
    (out / f"{name}_searches_summary.md").write_text(table + "\n")
    print(table)
    print(f"results: {', '.join(str(p) for p in paths.values())}, {gantt}")


def run_search_comparison(args, model_fn: Callable[[dict[str, Any]], Any], make: Callable[[str, int], Search], train,
                          validation, out: Path, name: str, *, title: str, metadata: Mapping[str, Any]) -> None:
    """A job's ``--search A,B --seeds ...``: every search at every seed on the job's first strategy, then written
    as `write_search_comparison` writes it."""
    results = compare_searches(model_fn, make, train, validation, searches=args.search_list, seeds=args.seed_list,
                               strategy=args.strategy_list[0], num_workers=args.workers, out_dir=out,
                               verbose=False, tls=args.tls)
    write_search_comparison(results, out, name, title=title, metadata=metadata)
