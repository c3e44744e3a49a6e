"""The selection jobs' shared command line: checks before any cluster work, and --max-configs."""

from __future__ import annotations

import pytest

from trainer.selection import STRATEGIES, GridSearch, choice
from trainer_jobs.support.selection import comparison_parser, first_configs, parse_comparison_args


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
