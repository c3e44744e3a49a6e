"""The selection jobs' shared command line: checks before any cluster work, and --max-configs.

Also --search and --seeds, and the searches they make at an equal budget of epochs.
"""

from __future__ import annotations

import pytest

from trainer.selection import STRATEGIES, GridSearch, choice
from trainer.selection import loguniform
from trainer_jobs.support.selection import (
    SEARCHES, comparison_parser, first_configs, hyperband_epochs, make_search, parse_comparison_args, search_summary,
    summary_table,
)


def _parse(argv: list[str]):
    parser = comparison_parser("doc", default_out="results/x", limit_help="l", data_help="d", seed_help="s")
    return parse_comparison_args(parser, argv)


def test_defaults_run_every_strategy():
    args = _parse([])
    assert args.strategy_list == list(STRATEGIES)
    assert (args.workers, args.epochs, args.out, args.max_configs) == (2, 2, "results/x", None)


def test_strategies_are_split_and_trimmed():
    assert _parse(["--strategies", " mop, sequential ,"]).strategy_list == ["mop", "sequential"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategies", "mop,hopper"], "unknown ['hopper']"),
        (["--strategies", ","], "--strategies"),
        (["--workers", "0"], "argument --workers: expected a positive integer"),
        (["--epochs", "-1"], "argument --epochs: expected a positive integer"),
        (["--max-configs", "0"], "argument --max-configs: expected a positive integer"),
        (["--limit", "0"], "argument --limit: expected a positive integer"),
        (["--cores-per-worker", "0"], "argument --cores-per-worker: expected a positive integer"),
        (["--search", "tpe,bayes"], "unknown ['bayes']"),
        (["--seeds", "0,x"], "--seeds: expected comma-separated ints"),
        (["--eta", "1"], "--eta must be at least 2"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_first_configs_keeps_the_order_and_the_metric():
    grid = GridSearch({"x": choice([1, 2, 3, 4])}, epochs=2, metric="val_accuracy")
    assert first_configs(grid, None) is grid
    cut = first_configs(grid, 2)
    assert [c.params for c in cut.configs()] == [c.params for c in grid.configs()[:2]]
    assert cut.metric == grid.metric


def test_searches_are_compared_at_hyperband_s_budget_of_epochs():
    args = _parse(["--search", " hyperband, tpe-asha", "--seeds", "0,1"])
    assert (args.search_list, args.seed_list, args.compare_searches) == (["hyperband", "tpe-asha"], [0, 1], True)
    assert not _parse([]).compare_searches and _parse([]).max_concurrent == 3  # workers + 1
    assert hyperband_epochs(4, 2) == 28 and hyperband_epochs(9, 3) == 69
    space = {"x": choice([1, 2, 3]), "lr": loguniform(1e-4, 1e-1)}
    searches = {name: make_search(name, grid={"x": choice([1, 2])}, space=space, epochs=2, max_epochs=4, eta=2,
                                  seed=0, metric="val_loss") for name in SEARCHES}
    assert sum(c.epochs for c in searches["random"].configs()) == 28
    assert len(searches["halving"].configs()) == 15  # 15 + 7 + 3 x 2 = 28 epochs
    assert searches["tpe"].max_total_epochs == searches["asha"].max_total_epochs == 28
    assert searches["tpe-asha"].pruner.name == "asha" and len(searches["grid"].configs()) == 2


def test_the_summary_per_search_is_the_page_s_table():
    def row(search, seed, epochs, metric, reach, ratio):
        return {"search": search, "seed": seed, "epochs": epochs, "configs": 12, "stopped_early": seed,
                "time_s": 60.0 + seed, "metric_name": "val_accuracy", "metric_value": metric,
                "reach_hyperband_s": reach, "vs_hyperband": ratio}

    rows = [row("hyperband", 0, 98, 0.97, 50.0, 1.0), row("hyperband", 1, 98, 0.96, 40.0, 1.0),
            row("tpe", 0, 96, 0.98, 25.0, 0.5), row("tpe", 1, 96, 0.95, None, None)]
    summary = search_summary(rows)
    assert [s["search"] for s in summary] == ["hyperband", "tpe"]
    tpe = summary[1]
    assert (tpe["epochs"], tpe["stopped_early"], tpe["time_s"]) == (96.0, 0.5, 60.5)
    assert (tpe["reached"], tpe["seeds"], tpe["vs_hyperband_mean"]) == (1, 2, 0.5)
    assert tpe["metric_mean"] == pytest.approx(0.965)
    table = summary_table(summary)
    assert "| tpe | 96 | 12.0 (0.5) | 60.5 | 0.9800 / 0.9500 | 0.9650 | 1/2 | 25.0 / - | 0.50 |" in table
    losses = summary_table(search_summary([{**r, "metric_value": r["metric_value"] / 1000} for r in rows]))
    assert "| 0.000980 / 0.000950 | 0.000965 |" in losses
    assert "best val_accuracy per seed" in table
