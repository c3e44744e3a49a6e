"""``train model``: fit the user's Keras model on a Parquet dataset from the shell.

    spark-keras-trainer train model --model mypkg.models:build --data train.parquet --workers 2 --epochs 4
    spark-keras-trainer train model --model ./models.py:build --data s3a://bucket/train/ \\
        --master spark://host:7077 --validation s3a://bucket/val/ --save fitted/ \\
        --conf spark.dynamicAllocation.enabled=false

``--model`` names a function that returns a compiled Keras model (``MODULE:FUNCTION``
of an importable module, or ``FILE.py:FUNCTION``; the file is shipped to the executors
by value) or a saved ``.keras`` file. Everything is checked before any cluster work.
Without ``--master`` the command starts an embedded cluster of ``--workers`` workers.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Callable

from trainer.errors import OptionError
from trainer.options import FitOptions
from trainer.verbosity import configure_logging, import_keras_quietly


def window_arg(text: str) -> int | str:
    """An argparse type for --window: a positive number of batches, or ``auto`` (sized by time)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}")
    return value

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def add_model_parser(actions) -> None:
    model = actions.add_parser(
        "model", help="your Keras model (a builder function or a .keras file) on a Parquet dataset",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model.add_argument("--model", required=True,
                       help="MODULE:FUNCTION or FILE.py:FUNCTION returning a compiled keras.Model, or FILE.keras")
    model.add_argument("--data", required=True, help="training data: Parquet file or folder, local or any URI Spark "
                                                     "reads (hdfs://, s3a://, ...)")
    model.add_argument("--features", default="features",
                       help="feature column, or several separated by commas (default: features)")
    model.add_argument("--label", default="label", help="label column (default: label)")
    model.add_argument("--validation", default=None, help="Parquet data evaluated after training (default: none)")
    default = FitOptions.default  # one source of the defaults: trainer.options
    model.add_argument("--workers", type=int, default=default("num_workers"),
                       help=f"workers, one Spark task each (default: {default('num_workers')})")
    model.add_argument("--epochs", type=int, default=default("epochs"), help=f"epochs (default: {default('epochs')})")
    model.add_argument("--batch-size", type=int, default=default("batch_size"),
                       help=f"minibatch size per worker (default: {default('batch_size')})")
    model.add_argument("--algorithm", default="auto",
                       help="auto, downpour, sync, adag, easgd, aeasgd, dynsgd, single, allreduce or localsgd "
                            "(default: auto, chosen from the workers, their GPUs and hosts; docs/algorithms.md)")
    model.add_argument("--window", type=window_arg, default=None,
                       help="batches between exchanges, or auto (sized by time; downpour, dynsgd) (default: the "
                            "algorithm's)")
    model.add_argument("--master", default=None,
                       help="Spark master URL (spark://..., yarn, k8s://...); default: an embedded cluster")
    model.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="a Spark setting for the session, as spark-submit's --conf (repeat it), e.g. "
                            "spark.dynamicAllocation.enabled=false")
    model.add_argument("--save", default=None, help="directory to write the fitted model to (FittedModel.save)")
    model.add_argument("--checkpoint-dir", default=None, help="save the parameter server's state here")
    model.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    model.add_argument("--seed", type=int, default=default("seed"),
                       help=f"seed (worker i uses seed + i; default: {default('seed')})")
    model.add_argument("-v", "--verbose", action="store_true", help="log what the trainer does")
    model.set_defaults(run=train_model)


def load_model_spec(spec: str) -> Any:
    """The model `spec` names: a builder function, or the path of a ``.keras`` file (checked, not loaded)."""
    if spec.endswith(".keras"):
        if not Path(spec).is_file():
            raise ValueError(f"--model {spec!r} is not a file. Expected a saved .keras model or MODULE:FUNCTION.")
        return spec
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"Expected --model as MODULE:FUNCTION, FILE.py:FUNCTION or FILE.keras. Received: {spec!r}.")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"--model {spec!r}: {path} is not a file.")
        name = f"_trainer_cli_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"
        module_spec = importlib.util.spec_from_file_location(name, path.resolve())
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # cloudpickle ships it by value from here
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"--model {spec!r}: cannot import {module_name!r} ({exc}). Install it, put it on "
                             "PYTHONPATH, or pass FILE.py:FUNCTION.") from exc
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ValueError(f"--model {spec!r}: {module_name} has no function {attr!r} "
                         f"(found {type(builder).__name__}).")
    return builder


def spark_conf(pairs: list[str]) -> dict[str, str]:
    """The --conf KEY=VALUE pairs as a dict; raises ValueError on one that is not ``spark.KEY=VALUE``."""
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise ValueError(f"--conf {pair!r}: expected KEY=VALUE with a Spark key, e.g. "
                             "spark.dynamicAllocation.enabled=false")
        conf[key.strip()] = value.strip()
    return conf


def _check_args(args: argparse.Namespace) -> tuple[Any, Any, dict[str, str]]:
    """(model, algorithm, the session's Spark settings) after checking every flag; raises ValueError saying what
    to fix."""
    from trainer.algorithms import get_algorithm  # deferred: with the Trainer, only when a fit runs

    for flag, option in (("workers", "num_workers"), ("epochs", "epochs"), ("batch_size", "batch_size")):
        try:
            FitOptions.check(option, getattr(args, flag))
        except OptionError as exc:
            raise ValueError(f"--{flag.replace('_', '-')}: {exc}") from None
    for flag in ("data", "validation"):
        path = getattr(args, flag)
        if path is not None and not _SCHEME.match(path) and not Path(path).exists():
            raise ValueError(f"--{flag} {path!r} does not exist. Expected a Parquet file or folder, or a URI.")
    conf = spark_conf(args.conf)
    if args.resume and not args.checkpoint_dir:
        raise ValueError("--resume needs --checkpoint-dir: the folder the interrupted run saved to.")
    name = args.algorithm.lower()
    if name == "auto":
        if args.window is not None:
            raise ValueError("--window needs an algorithm named with --algorithm (auto chooses its own cadence).")
        algorithm = "auto"
    elif name == "sync":
        algorithm = get_algorithm(name, every=args.window or "epoch")
    else:
        algorithm = get_algorithm(name, **({} if args.window is None else {"window": args.window}))
    return load_model_spec(args.model), algorithm, conf


def train_model(args: argparse.Namespace) -> int:
    """Fit, print the per-epoch table (and the validation metrics), save when asked; returns the exit code."""
    configure_logging(args.verbose)
    import_keras_quietly()
    try:
        model, algorithm, conf = _check_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if isinstance(model, str):
        model = _load_keras(model)
    features = args.features.split(",") if "," in args.features else args.features
    if args.master:
        from trainer.spark.session import spark_session  # deferred: pyspark starts the JVM

        return _fit(spark_session(args.master, "spark-keras-trainer train", **conf), model,
                    algorithm, features, args)
    from trainer.spark.local_cluster import LocalCluster  # deferred, as above

    with LocalCluster(workers=args.workers) as cluster:
        spark = cluster.session("spark-keras-trainer train", **conf)
        try:
            return _fit(spark, model, algorithm, features, args)
        finally:
            spark.stop()


def _load_keras(path: str) -> Any:
    import keras  # deferred: TensorFlow starts only when a model is needed

    return keras.saving.load_model(path)


def _fit(spark, model: Any, algorithm: Any, features: Any, args: argparse.Namespace) -> int:
    from trainer.fit.trainer import Trainer  # deferred: Keras and TensorFlow start with it

    train = spark.read.parquet(args.data)
    trainer = Trainer(model, algorithm=algorithm, num_workers=args.workers, batch_size=args.batch_size,
                      epochs=args.epochs, features_col=features, label_col=args.label, seed=args.seed,
                      checkpoint_dir=args.checkpoint_dir)
    fitted = trainer.fit(train, resume_from=args.checkpoint_dir if args.resume else None)
    _print_epochs(fitted.history.epochs)
    if args.validation:
        metrics = fitted.evaluate(spark.read.parquet(args.validation))
        ordered = sorted(metrics.items(), key=lambda item: item[0] != "loss")  # the loss first, as Keras
        print("validation: " + ", ".join(f"{k} {v:.4f}" for k, v in ordered))
    if args.save:
        print(f"saved to {fitted.save(args.save)}")
    return 0


def _print_epochs(epochs: list[dict]) -> None:
    keys = [k for k in (epochs[0] if epochs else {}) if isinstance(epochs[0][k], (int, float))]
    print(" | ".join(["epoch", *keys]))
    for i, epoch in enumerate(epochs, 1):
        print(" | ".join([str(i), *(f"{epoch[k]:.4g}" for k in keys)]))


def add_parser(sub, add_jobs: Callable[[str, Any], None]) -> None:
    train = sub.add_parser(
        "train", help="train: a bundled job (mnist, forecast) or your own model (model)",
        description="Train a bundled job (every flag after its name is the job's own: "
                    "`spark-keras-trainer train mnist --help`) or your own Keras model (`train model`).",
    )
    actions = train.add_subparsers(dest="job", required=True, metavar="JOB")
    add_jobs("train", actions)
    add_model_parser(actions)
