"""Command-line helpers shared by the jobs: argparse types, the worker list and the Trainer options."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any, Callable

from trainer import get_algorithm
from trainer.algorithms import ALGORITHMS, COLLECTIVE, parse_compression, with_compression
from trainer.internals import (NAMES, FitOptions, configure_logging, configured_name, has_checkpoint,
                               import_keras_quietly, overlappable)
from trainer.internals import window_arg  # noqa: F401  (the jobs take it from here)

log = logging.getLogger("trainer_jobs")


def _positive(convert: Callable[[str], Any], noun: str):
    """An argparse type: `convert` the text and require a finite value > 0, else 'expected a positive NOUN'."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive {noun}, got {text!r}")
        return value
    return parse


positive_int = _positive(int, "integer")
positive_float = _positive(float, "number")


def compression_arg(text: str) -> str:
    """An argparse type for --compression: the text, checked by ``parse_compression``."""
    try:
        parse_compression(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().lower()


def add_verbose_arg(parser: argparse.ArgumentParser) -> None:
    """The flags every job has: -v/--verbose (our INFO logs and the libraries' warnings, ``trainer.verbosity``)
    and --backend (the Keras backend of the driver, which every task uses)."""
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what the trainer does and show Spark's and TensorFlow's warnings "
                             "(TRAINER_LOG=debug shows everything)")
    parser.add_argument("--backend", choices=NAMES, default=None,
                        help="Keras backend of the driver and every task (default: $KERAS_BACKEND, else keras.json's, "
                             "else Keras's default)")


def start_logging(args: argparse.Namespace, keras: bool = True) -> None:
    """Quiet logging for a job, or verbose with --verbose (see ``trainer.verbosity``); --backend set before Keras
    starts; with `keras` (a job that trains), Keras is imported now and TensorFlow's import banners dropped."""
    configure_logging(getattr(args, "verbose", False))
    backend = getattr(args, "backend", None)
    if backend is not None:
        import sys

        loaded = sys.modules.get("keras")
        if loaded is not None and loaded.backend.backend() != backend:
            raise SystemExit(f"--backend {backend}: Keras already started with {loaded.backend.backend()} in this "
                             "process; run the job in a fresh process (or set KERAS_BACKEND before it starts).")
        os.environ["KERAS_BACKEND"] = backend
    if keras:
        import_keras_quietly()


def add_trainer_args(parser) -> None:
    """--seed, --fixed-epochs, --checkpoint-dir, --resume, --compression, --compress-replies, --overlap,
    --retry-timeout, --tls and --no-frame-mac for a job's argument parser."""
    default = FitOptions.default  # one source of the defaults: trainer.options
    parser.add_argument("--seed", type=int, default=default("seed"),
                        help="seed of the runs (plain Keras uses it, worker i of a distributed run seed + i; "
                             f"default {default('seed')}): repeat a run with other seeds to see its run-to-run "
                             "spread")
    parser.add_argument("--fixed-epochs", action="store_true",
                        help="every worker makes exactly one pass over its shard per epoch, instead of the "
                             "workers of an asynchronous algorithm sharing each epoch (Trainer share_epochs=False)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save the parameter server's state under DIR/<model>-<N>w every 100 updates and "
                             "at every epoch (default: no checkpoints)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the runs interrupted under --checkpoint-dir (runs without a checkpoint "
                             "start afresh)")
    parser.add_argument("--compression", default="none", type=compression_arg,
                        help="lossy encoding of the workers' commits (downpour, adag, dynsgd): none, fp16, bf16 "
                             "or topk:F (the largest fraction F of each tensor), with error feedback (default none)")
    parser.add_argument("--compress-replies", action="store_true",
                        help="the parameter server's replies go through --compression too: each is the change of "
                             "the center since what the worker holds (Trainer compress_replies=True)")
    parser.add_argument("--overlap", action="store_true",
                        help="workers send each commit from a thread of their own and fold the reply in a window "
                             "later (downpour, adag, dynsgd; Trainer overlap=True)")
    parser.add_argument("--retry-timeout", type=positive_float, default=default("retry_timeout"),
                        help="seconds a retry after lost executors waits for their slots before it continues "
                             f"on the workers left (default {default('retry_timeout'):g})")
    parser.add_argument("--tls", action="store_true",
                        help="encrypt the traffic between the workers and the parameter server with TLS "
                             "(a throw-away certificate per run; needs the cryptography package or openssl)")
    parser.add_argument("--no-frame-mac", action="store_true",
                        help="send frames without their MAC (only the handshake is authenticated; with --tls, TLS "
                             "still protects every record)")


def check_checkpoint_args(parser, args) -> None:
    """Exit through `parser.error` on checkpoint flags that do not go together."""
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir: the folder the interrupted run saved its checkpoints to")


def check_trainer_args(parser, args) -> None:
    """Exit through `parser.error` on Trainer flags that are wrong or do not go together: an unknown
    --algorithm, checkpoints, and --compression or --overlap with an algorithm whose workers send full
    weights. Runs before anything is loaded."""
    check_checkpoint_args(parser, args)
    try:
        algorithm = algorithm_from_args(args.algorithm, args.window)
        if algorithm == "auto":
            return  # the Trainer chooses, the parameter server wherever compression or overlap asks for it
        if getattr(args, "compression", "none") != "none" or getattr(args, "compress_replies", False):
            algorithm = with_compression(algorithm, args.compression, replies=getattr(args, "compress_replies", False))
    except ValueError as exc:
        parser.error(str(exc))
    if getattr(algorithm, "fit_kind", None) == COLLECTIVE:
        try:  # the fit would refuse it before any cluster work; the job refuses it before loading any data
            algorithm.check_backend(getattr(args, "backend", None) or configured_name())
        except ValueError as exc:
            parser.error(f"{exc} In a job: --backend {'/'.join(NAMES)}.")
    if getattr(args, "overlap", False) and not overlappable(algorithm):
        parser.error(f"--overlap needs a delta algorithm with a window (downpour, adag, dynsgd); received "
                     f"{algorithm.describe()}. Fix: pass --algorithm dynsgd (or downpour, adag), or drop --overlap.")


def trainer_options(args, model_name: str, workers: int, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Trainer keyword arguments, fit keyword arguments) for one run of a job: seeded with `seed`
    (default --seed); a repeat with another seed checkpoints to its own folder."""
    seed = args.seed if seed is None else seed
    options: dict[str, Any] = {"retry_timeout": args.retry_timeout, "share_epochs": not args.fixed_epochs,
                               "seed": seed, "compression": getattr(args, "compression", "none"),
                               "compress_replies": getattr(args, "compress_replies", False),
                               "tls": getattr(args, "tls", False), "frame_mac": not getattr(args, "no_frame_mac", False),
                               "overlap": getattr(args, "overlap", False)}
    if args.checkpoint_dir is None:
        return options, {}
    directory = Path(args.checkpoint_dir) / f"{model_name}-{workers}w{'' if seed == args.seed else f'-seed{seed}'}"
    resume = args.resume and has_checkpoint(directory)
    if args.resume and not resume:
        log.info("No checkpoint in %s: %s with %d worker(s) starts afresh", directory, model_name, workers)
    options["checkpoint_dir"] = str(directory)
    return options, ({"resume_from": str(directory)} if resume else {})


def algorithm_options(text: str) -> dict[str, Any]:
    """'outer_momentum=0,wire=fp32' -> {'outer_momentum': 0, 'wire': 'fp32'}: a number where the value reads as
    one, else the text; ValueError for an item without '='."""
    options: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--algorithm takes NAME or NAME:KEY=VALUE,... (e.g. localsgd:outer_momentum=0). "
                             f"Received the option {item!r}.")
        try:
            options[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            options[key.strip()] = value.strip()
    return options


def algorithm_from_args(name: str, window: int | str | None):
    """An algorithm from CLI flags: `name` is NAME or NAME:KEY=VALUE,... (the algorithm's own arguments,
    e.g. ``localsgd:outer_momentum=0``, which win over `window`); `window` is the exchange window (``every``
    for sync, the period for localsgd); None keeps the algorithm's default (per epoch for sync); allreduce has
    none."""
    name, _, text = name.partition(":")
    options = algorithm_options(text)
    if name.lower() == "auto":
        if options:
            raise ValueError(f"--algorithm auto takes no options (the fit chooses). Received: {text!r}.")
        return "auto"  # the Trainer chooses per fit (trainer.algorithms.choice); the window is its choice too
    if name.lower() == "sync":
        cadence = {"every": window or "epoch"}  # "auto" is refused there, with the reason
    elif name.lower() == "localsgd":
        cadence = {} if window is None else {"period": window}  # its period
    elif getattr(ALGORITHMS.get(name.lower()), "fit_kind", None) == COLLECTIVE:
        cadence = {}  # all-reduce exchanges every step: the jobs' default window does not apply
    else:
        cadence = {} if window is None else {"window": window}
    return get_algorithm(name, **{**cadence, **options})


def parse_workers(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] with a clear error for anything else."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ValueError(f"--workers expects a comma-separated list of positive integers, e.g. 1,2,4. Received: {text!r}")
    return sorted(set(counts))
