"""The benchmarks and profiling scripts, installed as the package ``trainer_benchmarks``.

    bench_defaults     the defaults (or all-reduce) against plain Keras at 1..N workers
    bench_quality      the 20-run spread behind the tests' quality floors        (make bench-quality)
    bench_staleness    the staleness bound with workers committing in turn
    bench_out_of_core  a shard in memory against one streamed from a spill file  (make bench-out-of-core)
    bench_ps           the parameter server against raw loopback and an echo     (make bench-ps)
    bench_compression  compressed commits and replies: accuracy and bytes
    bench_security     what authentication and TLS cost a fit
    bench_gpu          the worker loop against plain Keras on a GPU, no Spark    (make bench-gpu)
    bench_ring         the all-reduce ring's hop time and bandwidth here
    profile_overhead   where a worker's time goes against plain Keras
    scale_model        the queueing model of speed-up against workers

Run one with ``python benchmarks/NAME.py --help`` from a checkout, or
``spark-keras-trainer bench NAME --help`` wherever the package is installed.
They use the jobs' support (``trainer_jobs.support``: datasets, models, reports,
the plain-Keras baseline); what they need of the package beyond its public API
comes through the one declared seam, ``trainer.internals``
(docs/architecture.md). ``make bench`` itself runs the jobs (``jobs/bench.py``).
"""
