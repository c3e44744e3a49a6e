"""The one controller of the driver's barrier stages, for fits and model selection alike.

A fit (``trainer.fit.driver``) and a search (``trainer.selection.selector``)
each serve their tasks from a server in the driver and run ONE barrier stage
of long-lived tasks. What is the same for both lives here, once:

1. `StageController.of(cluster, options)`, before any cluster work, on the
   cluster the caller made once (``trainer.spark.cluster_facts.FitCluster``): the
   TLS identity (a missing tool fails here), the addresses executors reach
   the driver at (`FitCluster.addresses`) and a fresh secret; the caller
   builds its server with `server_endpoint()`.
2. `serve(server, stage, ...)`: `stage()` inside `closing(server, ...)`; a
   fit's kind and a search each call `run(...)` there: wait for the free task slots,
   start the server, run the stage with retries (``run_stage_with_retries``,
   the result rows of ``trainer.runtime.stage_result``); an elastic fit's
   `run_elastic` starts the server and runs one job per epoch instead
   (``trainer.spark.elastic_launch``: no slots to wait for, Spark grants them). On leaving `closing`,
   whatever happens, the server stops and every closer runs, in the order
   given (one that fails does not keep the others from running; a closer
   records what it can survive, such as a checkpoint that could not be
   written, rather than raise).

What differs (the kind of fit's tasks and server, the search's hops and
scheduler) is the caller's: the tasks (`make_task`), the server, the retry
policy, what to do once the server listens (`on_started`) and on a retry.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from trainer.runtime.stage_result import RESULT_DDL, read_records
from trainer.spark.elastic_launch import ElasticPolicy, run_epoch_jobs
from trainer.spark.cluster_facts import FitCluster
from trainer.spark.launch import RetryPolicy, run_stage_with_retries, wait_for_slots
from trainer.transport.tls import TlsIdentity
from trainer.transport.wire import new_secret


@dataclass
class StageResult:
    """What a controlled stage returns: each task's record and when the stage ran."""

    records: list[dict[str, Any]]
    start: float
    end: float


class StageController:
    """Addresses, identity and secret of one stage's server, then the stage itself (the module docstring).

    Args:
        cluster: the `FitCluster` the stage runs on.
        tls: Bool. Pinned TLS on the server's links (a TLS identity is made now).
        ps_host, ps_bind_host, ps_port: where executors reach the driver's server (`FitCluster.addresses`).
        endpoints: Integer. Consecutive ports the server listens on (a sharded parameter server's shards).
    """

    def __init__(self, cluster: FitCluster, *, tls: bool, ps_host: str | None, ps_bind_host: str | None,
                 ps_port: int | None, endpoints: int = 1) -> None:
        self.spark = cluster.session
        self.identity = TlsIdentity.generate() if tls else None
        #: The address executors use, the one the server binds, and its port (0: any free one).
        self.host, self.bind, self.port = cluster.addresses(ps_host, ps_bind_host, ps_port, endpoints)
        self.secret = new_secret()

    @classmethod
    def of(cls, cluster: FitCluster, options, endpoints: int = 1) -> StageController:
        """The controller of a fit's or a search's stage on `cluster`, from their shared options (``tls``,
        ``ps_host``, ``ps_bind_host``, ``ps_port``: ``trainer.options.SharedOptions``)."""
        return cls(cluster, tls=options.tls, ps_host=options.ps_host, ps_bind_host=options.ps_bind_host,
                   ps_port=options.ps_port, endpoints=endpoints)

    def server_endpoint(self) -> dict[str, Any]:
        """The keyword arguments every server of the stage takes: where it listens, its secret, its TLS."""
        return {"host": self.bind, "port": self.port, "secret": self.secret, "tls": self.identity or False}

    @contextlib.contextmanager
    def closing(self, server, *, before_stop: Sequence[Callable[[], Any]] = (),
                closers: Sequence[Callable[[], Any]] = ()) -> Iterator[None]:
        """On leaving, whatever happens: `before_stop` (what wakes the server's handlers), the server's stop,
        then `closers`, each in the order given; one that raises does not keep the others from running."""
        with contextlib.ExitStack() as stack:
            for close in [*before_stop, server.stop, *closers][::-1]:  # an exit stack calls back last in, first out
                stack.callback(close)
            yield

    def serve(self, server, stage: Callable[[], StageResult], *, before_stop: Sequence[Callable[[], Any]] = (),
              closers: Sequence[Callable[[], Any]] = ()) -> StageResult:
        """`stage()` (which starts `server` and runs the stage: `run` or `run_elastic`) inside `closing`."""
        with self.closing(server, before_stop=before_stop, closers=closers):
            return stage()

    def run(self, frame, num_workers: int, make_task: Callable[[int, int], Callable], *, server,
            policy: RetryPolicy, description: str, slot_timeout: float,
            fatal: Callable[[], BaseException | None], profile: Any = None,
            on_started: Callable[[], None] | None = None, on_retry: Callable[[int], None] | None = None,
            events: list[dict] | None = None) -> StageResult:
        """Wait for the slots, start `server`, run the stage with retries (inside `closing`, which stops it).

        `make_task(attempt, workers)` returns the function each task runs;
        `fatal()` may return the driver's own error, raised instead of a retry.
        """
        wait_for_slots(self.spark, num_workers, slot_timeout, profile)
        server.start()
        if on_started is not None:
            on_started()
        start = time.time()
        stage = run_stage_with_retries(frame, num_workers, make_task, RESULT_DDL, policy=policy,
                                       description=description, on_retry=on_retry, events=events, fatal=fatal,
                                       profile=profile)
        return StageResult(read_records(stage.rows), start, time.time())

    def run_elastic(self, frame, chunks: int, epochs: range, make_task: Callable[[int], Callable], *, server,
                    policy: ElasticPolicy, description: str, fatal: Callable[[], BaseException | None],
                    profile: Any = None, on_started: Callable[[], None] | None = None,
                    stopped: Callable[[], bool] = lambda: False, events: list[dict] | None = None,
                    watch: Callable[[], Any] = lambda: None, retire: Callable[[set[str]], Any] = lambda e: None,
                    begun: Callable[[int], bool] = lambda epoch: False, lookahead: int = 0,
                    one_begun: Callable[[int], bool] | None = None, cold: Any = None) -> StageResult:
        """Start `server` and run an elastic fit's jobs, one per epoch (inside `closing`, which stops it);
        `make_task(epoch)` returns the function each chunk task of that epoch runs."""
        server.start()
        if on_started is not None:
            on_started()
        start = time.time()
        jobs = run_epoch_jobs(frame, chunks, epochs, make_task, RESULT_DDL, policy=policy, description=description,
                              profile=profile, stopped=stopped, fatal=fatal, events=events, watch=watch,
                              retire=retire, begun=begun, lookahead=lookahead,
                              one_begun=one_begun, cold=cold)
        return StageResult(read_records(jobs.rows), start, time.time())
