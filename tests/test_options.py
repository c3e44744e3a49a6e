"""The options of a fit and of a search are declared, defaulted and checked once (trainer.options)."""

from __future__ import annotations

import argparse
import inspect
import re

import pytest

from trainer import OptionError, Trainer
from trainer.options import FitOptions, SelectionOptions, SharedOptions
from trainer.selection import GridSearch, ModelSelector, choice


def _selector(**options):
    return ModelSelector(lambda p: None, GridSearch({"x": choice([1])}, metric="val_loss"), **options)


def _documented(owner) -> set[str]:
    """Every name documented in the Args of `owner`'s docstring ("name:" or "a, b, c:")."""
    args = inspect.getdoc(owner).split("Args:", 1)[1]
    names = set()
    for line in args.splitlines():
        match = re.match(r"^    (\w+(?:, \w+)*):", line)
        if match:
            names.update(match.group(1).split(", "))
    return names


@pytest.mark.parametrize(("owner", "options"), [(Trainer, FitOptions), (ModelSelector, SelectionOptions)])
def test_every_option_is_a_keyword_argument_with_its_default_and_documented(owner, options):
    parameters = inspect.signature(owner).parameters
    for name in options.names():
        assert parameters[name].default == options.default(name), name
    assert set(options.names()) <= _documented(owner), sorted(set(options.names()) - _documented(owner))


@pytest.mark.parametrize(("name", "value", "message"), [
    ("max_retries", -1, "`max_retries` must be an integer >= 0. Received: max_retries=-1"),
    ("num_workers", 0, "`num_workers` must be a positive integer. Received: num_workers=0"),
    ("io_timeout", 0, "`io_timeout` must be a number > 0. Received: io_timeout=0"),
    ("seed", "1", "`seed` must be an integer. Received: seed='1'"),
    ("ps_port", 70000, "`ps_port` must be a TCP port (0 for any free one) or None. Received: ps_port=70000"),
    ("gpus_per_worker", -1, "`gpus_per_worker` must be an integer >= 0"),
    ("frame_mac", "md5", "`frame_mac` must be True, False or one of"),
])
def test_a_shared_option_fails_alike_in_a_fit_and_a_search(name, value, message):
    assert name in SharedOptions.names()
    for make in (lambda: Trainer(lambda: None, **{name: value}), lambda: _selector(**{name: value})):
        with pytest.raises(OptionError) as caught:
            make()
        assert str(caught.value).startswith(message)


def test_an_unknown_keyword_names_its_owner_and_the_options():
    with pytest.raises(TypeError, match=r"Trainer\(\) got an unexpected keyword argument 'num_worker'\. Its "
                                        r"options: num_workers,"):
        Trainer(lambda: None, num_worker=2)
    with pytest.raises(TypeError, match=r"ModelSelector\(\) got an unexpected keyword argument 'window'"):
        _selector(window=3)


def test_only_the_io_timeout_defaults_differ_between_a_fit_and_a_search():
    shared = SharedOptions.names()
    differ = [n for n in shared if FitOptions.default(n) != SelectionOptions.default(n)]
    assert differ == ["io_timeout"]  # a search's task reports once per sub-epoch (the module docstring)
    assert (FitOptions.default("io_timeout"), SelectionOptions.default("io_timeout")) == (600.0, 3600.0)


def test_options_are_readable_as_attributes_and_normalized_once():
    trainer = Trainer(lambda: None, num_workers=3, compression="bf16", io_timeout=5, seed=2)
    assert trainer.num_workers == trainer.options.num_workers == 3
    assert trainer.io_timeout == 5.0 and isinstance(trainer.io_timeout, float)
    assert trainer.algorithm.describe() == "downpour(auto window) [bf16]"
    with pytest.raises(OptionError, match="`min_workers` must be <= num_workers=2. Received: min_workers=3"):
        Trainer(lambda: None, min_workers=3)


def test_the_spark_ml_params_and_the_command_lines_take_their_defaults_from_the_options():
    from trainer.cli import parser as command_parser
    from trainer.ml import KerasEstimator
    from trainer_jobs.support.cli import add_trainer_args

    estimator = KerasEstimator()
    assert (estimator.getNumWorkers(), estimator.getEpochs(), estimator.getBatchSize(), estimator.getSeed(),
            estimator.getAlgorithm()) == tuple(FitOptions.default(n) for n in (
                "num_workers", "epochs", "batch_size", "seed", "algorithm"))
    parser = argparse.ArgumentParser()
    add_trainer_args(parser)
    args = parser.parse_args([])
    assert (args.seed, args.retry_timeout) == (FitOptions.default("seed"), FitOptions.default("retry_timeout"))
    train = command_parser().parse_args(["train", "model", "--model", "m:f", "--data", "."])
    assert (train.workers, train.epochs, train.batch_size) == tuple(FitOptions.default(n) for n in (
        "num_workers", "epochs", "batch_size"))


@pytest.mark.parametrize("owner", ["Trainer", "ModelSelector"])
def test_an_option_set_as_an_attribute_is_checked_again_and_is_what_the_driver_reads(owner):
    holder = Trainer(lambda: None, epochs=2) if owner == "Trainer" else _selector(max_retries=1)
    name, good, bad = ("epochs", 5, 0) if owner == "Trainer" else ("max_retries", 3, -1)
    setattr(holder, name, good)
    assert getattr(holder, name) == good == getattr(holder.options, name)  # one value, never two
    with pytest.raises(OptionError, match=name):
        setattr(holder, name, bad)
    assert getattr(holder.options, name) == good  # a refused value changes nothing
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        holder.nope  # noqa: B018
