"""The algorithm a fit runs when none is named (``algorithm="auto"``, the default): chosen from what the fit runs on.

At the start of every fit the driver looks at what it runs on (`FitFacts`:
the workers, their GPUs, the hosts of the session's executors, and options
that only the parameter server serves) and `choose_algorithm` picks:

* **one worker**: DOWNPOUR with its time-sized window: nothing to average,
  the parameter server's exchanges kept near 5 % of the time (a worker at
  plain Keras's speed, also on a GPU);
* **several workers whose links are a network** (executors on more than one
  host, or GPUs, whose steps are short next to any link): `LocalSGD`: Keras's
  own steps in each worker, the replicas averaged over the all-reduce group
  every ``H`` steps, ``H`` sized inside the fit from the link and the step it
  measures in its first steps (``trainer.runtime.collective.averaging``),
  bfloat16 on the wire. Its bytes per step are ``1 / H`` of an all-reduce's,
  on each worker's own link, where the parameter server's go through the
  driver's one link at every commit;
* **several CPU workers on one host** (the embedded cluster, a one-machine
  lab): DOWNPOUR, whose commits over loopback cost little and which kept
  plain Keras's quality on the jobs (docs/algorithms.md);
* options only the parameter server serves (``compression``, ``overlap``,
  ``ps_shards`` above 1): DOWNPOUR.

The choice and its reason are one line (`AlgorithmChoice.line`) the fit logs and
shows above its progress bar; ``fitted.history.choice`` keeps them, with what
the tasks then measured (the period they took, one average's time, the
step's). Any algorithm can still be named: ``algorithm="downpour"``,
``"allreduce"``, ``LocalSGD(period=8)``, ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.algorithms.base import Algorithm
from trainer.algorithms.downpour import DOWNPOUR
from trainer.algorithms.local_sgd import LocalSGD

#: The name that asks the fit to choose (the default of ``Trainer(algorithm=...)``).
AUTO = "auto"


@dataclass(frozen=True)
class FitFacts:
    """What a fit runs on, as the driver sees it at the start."""

    workers: int
    gpus_per_worker: int = 0
    hosts: int | None = None  # distinct hosts of the session's executors; None where unknown (Spark Connect)
    ps_options: tuple[str, ...] = ()  # options given that only the parameter server serves


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
                          "hosts": self.facts.hosts, "ps_options": list(self.facts.ps_options)},
                **({"measured": self.measured} if self.measured else {})}


def choose_algorithm(facts: FitFacts) -> AlgorithmChoice:
    """The algorithm for `facts` (the module docstring)."""
    n = facts.workers
    if n == 1:
        return AlgorithmChoice(DOWNPOUR(), "one worker: nothing to average; exchanges sized by time", facts)
    if facts.ps_options:
        return AlgorithmChoice(DOWNPOUR(), f"{', '.join(facts.ps_options)} asked for the parameter server", facts)
    if facts.gpus_per_worker:
        return AlgorithmChoice(LocalSGD(), f"{n} workers on GPUs: replicas averaged every few steps over the "
                                           "all-reduce group, the period sized by the link and the step measured "
                                           "at the start", facts)
    if facts.hosts is not None and facts.hosts > 1:
        return AlgorithmChoice(LocalSGD(), f"{n} workers on {facts.hosts} hosts: replicas averaged every few steps "
                                           "over the all-reduce group, the period sized by the link and the step "
                                           "measured at the start", facts)
    where = "one host" if facts.hosts == 1 else "hosts not known"
    return AlgorithmChoice(DOWNPOUR(), f"{n} CPU workers on {where}: commits over loopback cost little", facts)


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
