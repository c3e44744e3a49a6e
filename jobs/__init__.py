"""The jobs: scripts users run, installed as the package ``trainer_jobs``.

    mnist            the MNIST CNN on 1..N workers against plain Keras
    forecast         energy-demand forecasting (LSTM, GRU) on 1..N workers
    bench            what ``make bench`` runs: both, then one summary
    select_mnist     model selection (MOP vs task parallelism vs sequential) on MNIST
    select_forecast  the same on the forecasting models

Run one with ``python jobs/mnist.py ...`` from a checkout, or ``python -m trainer
train mnist ...`` wherever the package is installed. ``trainer_jobs.support``
holds what they share (datasets, result rows, reports, argparse helpers, the
plain-Keras baseline); the jobs use the public ``trainer`` API and, for the few
internals they need, the declared seam ``trainer.internals``. The benchmark and
profiling scripts live apart, in ``benchmarks/`` (``trainer_benchmarks``).
"""
