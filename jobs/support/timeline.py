"""An elastic fit's run as a picture: its workers over time and the rows it trained per second.

`fit_timeline` keeps, from a fitted model's history, what the picture needs
(JSON-ready, so a bench can keep it with its results): the fit's start and
end, each membership change (``history.membership``: time, workers after,
join or leave) and each chunk task's training span and rows
(``history.workers``). `plot_timelines` draws one column per fit: the
workers on top (a step at each join and leave, the disturbance marked), the
throughput below (each task's rows spread evenly over its training span,
summed per second). Agg canvas: no display, no pyplot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np


def fit_timeline(fitted, start: float, end: float, disturbed: float | None = None) -> dict[str, Any]:
    """The picture's data of one fit (the module docstring); times are seconds from `start`."""
    history = fitted.history
    changes = [{"t": e["time"] - start, "workers": e["workers_after"], "event": e["event"]}
               for e in history.membership]
    tasks = []
    for w in history.workers:
        if w.get("end") is None or not w.get("trained_rows"):
            continue
        t1 = w["end"] - start
        tasks.append({"t0": t1 - float(w.get("train_s") or 0.0), "t1": t1, "rows": int(w["trained_rows"])})
    return {"wall_s": end - start, "disturbed_s": None if disturbed is None else disturbed - start,
            "membership": changes, "tasks": tasks}


def throughput(tasks: Sequence[Mapping[str, Any]], wall_s: float, bin_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(bin starts, rows per second in each bin) of `tasks`, each task's rows spread evenly over its span."""
    edges = np.arange(0.0, max(wall_s, bin_s) + bin_s, bin_s)
    rows = np.zeros(len(edges) - 1)
    for task in tasks:
        t0, t1 = float(task["t0"]), float(task["t1"])
        if t1 <= t0:
            continue
        overlap = np.clip(np.minimum(edges[1:], t1) - np.maximum(edges[:-1], t0), 0.0, None)
        rows += task["rows"] * overlap / (t1 - t0)
    return edges[:-1], rows / bin_s


def plot_timelines(fits: Mapping[str, Mapping[str, Any]], out_png: str | Path) -> Path:
    """One column per fit of `fits` (title -> `fit_timeline`), written to `out_png`; returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not fits:
        raise ValueError("plot_timelines: no fits to draw.")
    fig = Figure(figsize=(4.2 * len(fits), 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(fits), sharex="col", squeeze=False)
    top = max(1, *(c["workers"] for fit in fits.values() for c in fit["membership"]))
    for column, (title, fit) in enumerate(fits.items()):
        ax_w, ax_t = axes[0][column], axes[1][column]
        times = [0.0, *(c["t"] for c in fit["membership"]), fit["wall_s"]]
        workers = [0, *(c["workers"] for c in fit["membership"])]
        ax_w.stairs(workers, np.maximum.accumulate(np.array(times)), baseline=None, color="C0")
        ax_w.set_ylim(0, top + 0.5)
        ax_w.set_yticks(range(top + 1))
        ax_w.set_title(title)
        starts, rate = throughput(fit["tasks"], fit["wall_s"])
        ax_t.bar(starts, rate, width=1.0, align="edge", color="C1")
        for ax in (ax_w, ax_t):
            if fit.get("disturbed_s") is not None:
                ax.axvline(fit["disturbed_s"], color="C3", linestyle="--", linewidth=1)
            ax.grid(alpha=0.3)
        ax_t.set_xlabel("seconds from the fit's start")
        if column == 0:
            ax_w.set_ylabel("workers")
            ax_t.set_ylabel("rows trained per second")
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
