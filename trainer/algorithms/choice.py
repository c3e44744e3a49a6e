"""The algorithm a fit runs when none is named (``algorithm="auto"``, the default): chosen from what the fit runs on.

At the start of every fit the driver looks at what it runs on (`FitFacts`:
the workers, their GPUs, the hosts of the driver and the session's executors,
and options that only the parameter server serves) and `choose_algorithm`
picks, in this order:

* **one worker**: DOWNPOUR with its time-sized window: nothing to average,
  the parameter server's exchanges kept near 5 % of the time (a worker at
  plain Keras's speed, also on a GPU);
* options only the parameter server serves (``compression``, ``overlap``,
  ``ps_shards`` above 1): DOWNPOUR, whatever the hosts and GPUs. Where the
  fit would otherwise have run local SGD, `choose_algorithm(..., warn=True)`
  (the fit's call) warns: those commits all cross the driver's one link;
* **an elastic fit** (``num_workers=(min, max)``, ``trainer.fit.kinds.ElasticFit``):
  DOWNPOUR, whose workers may leave and join between two commits and never
  wait for each other. Local SGD is elastic too (named: its rounds, taken by
  the server, re-form at every period, ``trainer.algorithms.elastic_local_sgd``)
  and exchanges less often, but "auto" does not pick it there yet: that would
  change what the default runs (`DEFAULT_GENERATION`) while the results files
  of that generation's benchmarks, measured on the GPU machine and the lab, are
  not re-run;
* **several workers on GPUs**, or **several CPU workers on more than one
  host** (distinct hosts among the block managers of the driver and of the
  executors, ``trainer.spark.session.fit_hosts``: the driver's host counts
  even when it runs no executor, a loopback address is the driver's machine,
  and in the Docker lab every container is a host): `LocalSGD`: Keras's own steps in each worker, the replicas averaged
  over the all-reduce group every ``H`` steps, ``H`` sized inside the fit
  from the link and the step it measures in its first steps
  (``trainer.runtime.collective.averaging``), bfloat16 on the wire. Its bytes
  per step are ``1 / H`` of an all-reduce's, on each worker's own link, where
  the parameter server's go through the driver's one link at every commit;
* **several CPU workers on one host** (``local[N]``, the embedded cluster):
  DOWNPOUR, whose commits over loopback cost little and which kept plain
  Keras's quality on the jobs (docs/algorithms.md);
* **several CPU workers, hosts not known** (a Spark Connect session, whose
  client cannot list the executors): DOWNPOUR, as on one host, however many
  hosts the cluster has; name ``"localsgd"`` there for several.

`default_table` is that list as the Markdown table docs/guide.md quotes
(``tests/test_default_table.py`` holds the page to it). The choice and its
reason are one line (`AlgorithmChoice.line`) the fit logs and shows above its
progress bar; ``fitted.history.choice`` keeps them, with what the tasks then
measured (the period they took, one average's time, the step's). Any
algorithm can still be named: ``algorithm="downpour"``, ``"allreduce"``,
``LocalSGD(period=8)``, ...
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from trainer.algorithms.base import Algorithm
from trainer.algorithms.downpour import DOWNPOUR
from trainer.algorithms.local_sgd import LocalSGD

#: The name that asks the fit to choose (the default of ``Trainer(algorithm=...)``).
AUTO = "auto"

#: Which default algorithm the code runs; a results file (docs/results) records it, and a page may not quote a file
#: measured more than one change ago. 1: ADAG with a window of 12; 2: DOWNPOUR with a time-sized window;
#: 3: chosen per fit (local SGD across hosts or on GPUs). Add one whenever what "auto" runs changes.
DEFAULT_GENERATION = 3


@dataclass(frozen=True)
class FitFacts:
    """What a fit runs on, as the driver sees it at the start."""

    workers: int
    gpus_per_worker: int = 0
    hosts: int | None = None  # distinct hosts of the driver and the executors; None where unknown (Spark Connect)
    ps_options: tuple[str, ...] = ()  # options given that only the parameter server serves
    elastic: bool = False  # num_workers=(min, max): workers may leave and join (workers is the max)


@dataclass(frozen=True)
class AlgorithmChoice:
    """The algorithm a fit runs, why, and the facts it was chosen from."""

    algorithm: Algorithm
    reason: str
    facts: FitFacts
    measured: dict[str, Any] = field(default_factory=dict)  # what the tasks measured (after the fit)

    def line(self) -> str:
        """One line for the user: what runs and why."""
        return f"algorithm: {self.algorithm.describe()} (chosen: {self.reason})"

    def record(self) -> dict[str, Any]:
        """The choice as ``fitted.history.choice`` keeps it."""
        return {"algorithm": self.algorithm.name, "described": self.algorithm.describe(), "reason": self.reason,
                "facts": {"workers": self.facts.workers, "gpus_per_worker": self.facts.gpus_per_worker,
                          "hosts": self.facts.hosts, "ps_options": list(self.facts.ps_options),
                          "elastic": self.facts.elastic},
                **({"measured": self.measured} if self.measured else {})}


def choose_algorithm(facts: FitFacts, *, warn: bool = False) -> AlgorithmChoice:
    """The algorithm for `facts` (the module docstring). With `warn` (the fit's own call, its hosts known), a
    UserWarning when an option only the parameter server serves made it DOWNPOUR where it would be local SGD."""
    choice = _choose(facts)
    if warn and facts.ps_options:
        without = _choose(replace(facts, ps_options=()))
        if without.algorithm != choice.algorithm:
            warnings.warn(_replaced(facts.ps_options, without), UserWarning, stacklevel=2)
    return choice


def _choose(facts: FitFacts) -> AlgorithmChoice:
    n = facts.workers
    if n == 1:
        return AlgorithmChoice(DOWNPOUR(), "one worker: nothing to average; exchanges sized by time", facts)
    if facts.ps_options:
        return AlgorithmChoice(DOWNPOUR(), f"{', '.join(facts.ps_options)} asked for the parameter server", facts)
    if facts.elastic:
        return AlgorithmChoice(DOWNPOUR(), f"an elastic fit of up to {n} workers: the parameter server's workers may "
                                           "leave and join between commits (local SGD is elastic too: "
                                           "algorithm=\"localsgd\")", facts)
    if facts.gpus_per_worker:
        return AlgorithmChoice(LocalSGD(), f"{n} workers on GPUs: replicas averaged every few steps over the "
                                           "all-reduce group, the period sized by the link and the step measured "
                                           "at the start", facts)
    if facts.hosts is not None and facts.hosts > 1:
        return AlgorithmChoice(LocalSGD(), f"{n} workers on {facts.hosts} hosts: replicas averaged every few steps "
                                           "over the all-reduce group, the period sized by the link and the step "
                                           "measured at the start", facts)
    if facts.hosts == 1:
        return AlgorithmChoice(DOWNPOUR(), f"{n} CPU workers on one host: commits over loopback cost little", facts)
    return AlgorithmChoice(DOWNPOUR(), f"{n} CPU workers on hosts not known (Spark Connect): as on one host; "
                                       "name algorithm=\"localsgd\" for several hosts", facts)


def _replaced(options: tuple[str, ...], without: AlgorithmChoice) -> str:
    """The warning of an option that turned the default from local SGD into DOWNPOUR."""
    given = " and ".join(options)
    return (f"{given} made algorithm=\"auto\" run DOWNPOUR where {without.reason.split(':')[0]} would run local "
            f"SGD: only the parameter server serves {given}, and every commit crosses the driver's one link "
            "(uncompressed, 5 to 9 times slower than local SGD on the lab's 100 Mbit/s links, docs/lab.md). To keep "
            f"local SGD, drop {given}; to run DOWNPOUR without this warning, name it: algorithm=\"downpour\".")


#: The cases of `default_table`: (the case, what counts, an example of its facts), in the order they are checked.
DEFAULT_CASES: tuple[tuple[str, str, FitFacts], ...] = (
    ("one worker", "`num_workers=1`, whatever else is given", FitFacts(workers=1, hosts=4)),
    ("an option only the parameter server serves", "`compression` (other than `\"none\"`), `overlap=True` or "
     "`ps_shards` above 1, with several workers, whatever the hosts and GPUs (a warning where the fit would "
     "otherwise run local SGD)", FitFacts(workers=3, hosts=4, ps_options=("compression",))),
    ("an elastic fit", "`num_workers=(min, max)`: workers may leave and join while it runs (docs/faults.md), "
     "whatever the hosts and GPUs", FitFacts(workers=3, hosts=4, elastic=True)),
    ("several workers on GPUs", "`gpus_per_worker` 1 or more, on any number of hosts, known or not",
     FitFacts(workers=3, gpus_per_worker=1, hosts=1)),
    ("several CPU workers on more than one host", "the distinct hosts among the block managers of the driver and "
     "of every executor: the driver's host counts even when it runs no executor; in the Docker lab every container "
     "is a host (3 workers and the driver's Jupyter: 4)", FitFacts(workers=3, hosts=4)),
    ("several CPU workers on one host", "the driver and every executor on one host: `local[N]`, `local-cluster[...]`, "
     "the embedded `LocalCluster`, also from a driver of its own (a loopback address is the driver's machine)",
     FitFacts(workers=3, hosts=1)),
    ("several CPU workers, hosts not known", "a Spark Connect session: its client cannot list the executors, so "
     "their hosts are not counted, however many the cluster has", FitFacts(workers=3, hosts=None)),
)


def default_table() -> str:
    """What ``algorithm="auto"`` runs in each case, as a Markdown table made by `choose_algorithm` itself."""
    rows = ["| case | what counts | example | algorithm run | why (the reason the fit shows) |",
            "|---|---|---|---|---|"]
    for case, counts, facts in DEFAULT_CASES:
        choice = choose_algorithm(facts)
        algorithm = f"`\"{choice.algorithm.name}\"` (`{type(choice.algorithm).__name__}()`)"
        cells = (case, counts, _example(facts), algorithm, choice.reason)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def _example(facts: FitFacts) -> str:
    words = [f"{facts.workers} worker{'s' if facts.workers > 1 else ''}"]
    if facts.gpus_per_worker:
        words.append(f"{facts.gpus_per_worker} GPU{'s' if facts.gpus_per_worker > 1 else ''} each")
    words.append("hosts not known" if facts.hosts is None else f"{facts.hosts} host{'s' if facts.hosts > 1 else ''}")
    words.extend(f"`{name}`" for name in facts.ps_options)
    if facts.elastic:
        words[0] = f"up to {words[0]}"
    return ", ".join(words)


def measured_choice(choice: AlgorithmChoice, records: list[dict]) -> AlgorithmChoice:
    """`choice` with what task 0 measured at the start (the period its group took, one average's and one step's
    time), from the tasks' records."""
    first = next((r for r in records if r.get("worker") == 0 and r.get("period") is not None), None)
    if first is None:
        return choice
    keys = ("period", "wire", "probe_step_ms", "probe_average_ms", "average_bytes")
    return AlgorithmChoice(choice.algorithm, choice.reason, choice.facts, {k: first[k] for k in keys if k in first})


def measured_line(measured: dict[str, Any]) -> str:
    """What the tasks measured and chose, in words ("averaged every 8 steps, bf16: one average 35 ms, step 31 ms")."""
    if not measured:
        return ""
    text = f"averaged every {measured['period']} steps, {measured.get('wire', 'fp32')}"
    if "probe_average_ms" in measured:
        text += f": one average {measured['probe_average_ms']:.1f} ms, a step {measured['probe_step_ms']:.1f} ms"
    return text
