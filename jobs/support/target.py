"""Time to accuracy: how long N workers take to reach a target test metric.

The jobs pass an `EpochSnapshots` as ``Trainer(on_epoch_end=...)``: at the
end of every epoch all workers finished it keeps a copy of the center's model
weights. Nothing is evaluated while the workers train (an evaluation on the
driver would take a core from them); after ``fit`` the job scores each
snapshot on the test set (`score_epochs`) and `time_to_target` finds the
first epoch that reaches the target:

* ``time_to_target_s``: from the start of training (the first worker's first
  epoch) to the end of that epoch (its last worker's report); data delivery
  and model building are left out, as in the epoch times;
* ``target_epochs``: epochs trained up to there;
* ``target_steps``: sequential steps up to there, i.e. minibatches per worker
  (all workers' minibatches / N): the optimizer steps one worker took.

All three are None when the target was not reached within the epochs
trained (``--max-epochs``). `with_target_speedup` adds
``target_speedup`` = time to target of 1 worker / time to target of N, per
model and seed. Time-shared runs (``timing_valid`` False) keep their epochs
and steps, which say how many more updates N workers need; their times mean
nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trainer_jobs.support.report import markdown_table

TARGET_COLUMNS = ["time_to_target_s", "target_speedup", "target_epochs", "target_steps"]


class EpochSnapshots:
    """``Trainer(on_epoch_end=...)`` hook: the center's arrays at every epoch end, in epoch order."""

    def __init__(self) -> None:
        self.epochs: list[tuple[int, list[np.ndarray]]] = []

    def __call__(self, epoch: int, center: list[np.ndarray], at: float) -> None:
        self.epochs.append((epoch, center))  # already a copy (ParameterServer.center)


def score_epochs(snapshots: EpochSnapshots, model, score: Callable[[Any], float]) -> dict[int, float]:
    """``{epoch: score(model)}`` with `model` holding each snapshot's model weights in turn (the center's
    first arrays; the rest is optimizer state for the algorithms that exchange it)."""
    scores = {}
    for epoch, center in snapshots.epochs:
        model.set_weights(center[: len(model.weights)])
        scores[epoch] = float(score(model))
    return scores


def _final_attempt(history) -> list[dict]:
    last = max(w["attempt"] for w in history.workers)
    return [w for w in history.workers if w["attempt"] == last]


def time_to_target(history, scores: Mapping[int, float], target: float | None,
                   higher_is_better: bool) -> dict[str, Any]:
    """The first epoch whose score reaches `target`: time, epochs and sequential steps (module docstring)."""
    missing = {"time_to_target_s": None, "target_epochs": None, "target_steps": None}
    if target is None or not scores:
        return missing
    workers = _final_attempt(history)
    starts = [e["start"] for w in workers for e in w["epochs"]]
    if not starts:
        return missing
    start = min(starts)
    batches = {e["epoch"]: e.get("batches", 0) for e in history.epochs}
    for epoch in sorted(scores):
        value = scores[epoch]
        reached = value >= target if higher_is_better else value <= target
        if not reached or not np.isfinite(value):
            continue
        ends = [e["end"] for w in workers for e in w["epochs"] if e["epoch"] == epoch and "end" in e]
        if not ends:
            return missing
        first = min(batches) if batches else 0
        steps = sum(batches.get(e, 0) for e in range(first, epoch + 1)) / max(1, len(workers))
        return {"time_to_target_s": max(ends) - start, "target_epochs": epoch + 1, "target_steps": steps}
    return missing


def with_target_speedup(rows: list[dict[str, Any]], group_by: Sequence[str] = ("model", "seed")) -> list[dict]:
    """Add ``target_speedup``: the 1-worker time to target over this row's, in the same model and seed."""
    def key(row):
        return tuple(row.get(k) for k in group_by)

    reference = {key(r): r.get("time_to_target_s") for r in rows if r.get("workers") == 1}
    for r in rows:
        if r.get("workers", 0) < 1:
            continue
        mine, one = r.get("time_to_target_s"), reference.get(key(r))
        r["target_speedup"] = one / mine if mine and one else None
    return rows


def target_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Model x workers: time to target, its speed-up, epochs and sequential steps (means over the runs that
    reached it, and how many did); time-shared rows marked '*'."""
    table = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for n in sorted({int(r["workers"]) for r in rows if r["model"] == model and int(r["workers"]) > 0}):
            mine = [r for r in rows if r["model"] == model and int(r["workers"]) == n]
            reached = [r for r in mine if r.get("time_to_target_s") is not None]
            shared = any(r.get("timing_valid") is False for r in mine)

            def mean(key: str, rows=reached) -> float | None:
                values = [float(r[key]) for r in rows if r.get(key) is not None]
                return float(np.mean(values)) if values else None

            table.append({
                "model": model, "workers": f"{n}{' *' if shared else ''}",
                "target": mine[0].get("target"), "reached": f"{len(reached)} of {len(mine)}",
                "time_to_target_s": None if shared else mean("time_to_target_s"),
                "target_speedup": None if shared else mean("target_speedup"),
                "target_epochs": mean("target_epochs"), "target_steps": mean("target_steps"),
            })
    return markdown_table(table)
