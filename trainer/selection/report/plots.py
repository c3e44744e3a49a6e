"""Plots of a model-selection run (matplotlib Agg canvas: no display, no pyplot state).

``plot_gantt``            which model trained on which worker when (one bar per unit of work)
``plot_gantt_comparison`` several runs' Gantt charts on one time axis (MOP vs the baselines)
``plot_learning_curves``  the selection metric per epoch, one line per configuration
``plot_config_curve``     one configuration: every training and validation metric per epoch
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["plot_gantt", "plot_gantt_comparison", "plot_learning_curves", "plot_config_curve"]


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, out_png: str | Path) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def _colors(keys: Sequence[Any]) -> dict[Any, str]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(keys) <= 10 else "tab20"]
    return {k: cmap(i % cmap.N) for i, k in enumerate(keys)}


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _patch(color):
    from matplotlib.patches import Patch

    return Patch(facecolor=color)


def _model_legend(fig, models: Sequence[Any], colors: Mapping[Any, Any]) -> None:
    """One colour patch per model below the chart."""
    if models:
        handles = [_patch(colors[m]) for m in models]
        fig.legend(handles, models, fontsize="x-small", ncols=min(len(models), 10), loc="outside lower center")


def _draw_gantt(ax, visits: list[Mapping[str, Any]], num_workers: int, colors: Mapping[Any, Any],
                end: float) -> None:  # fmt: skip
    for v in visits:
        width = max(v["end"] - v["start"], 1e-6)
        ax.barh(v["worker"], width, left=v["start"], height=0.7, color=colors[v["model"]], edgecolor="white",
                linewidth=0.5)
        if width > end / 40:
            ax.text(v["start"] + width / 2, v["worker"], f"{v['model']}/{v['epoch']}", ha="center", va="center",
                    fontsize=6, clip_on=True)
    ax.set_yticks(range(num_workers), [f"worker {w}" for w in range(num_workers)])
    ax.set_ylim(num_workers - 0.5, -0.5)
    ax.set_xlim(0, end * 1.01)
    ax.grid(True, axis="x", alpha=0.3)


def plot_gantt(visits: Iterable[Mapping[str, Any]], num_workers: int, out_png: str | Path,
               title: str | None = None) -> Path:  # fmt: skip
    """One row per worker, one bar per unit of work (``start``/``end`` seconds), coloured by model.

    ``visits`` are the run's unit records (``worker``, ``model``, ``epoch``,
    ``start``, ``end``, seconds since the run started). Bars are labelled
    ``model/epoch`` when wide enough.
    """
    visits = list(visits)
    models = sorted({v["model"] for v in visits})
    colors = _colors(models)
    fig = _figure(11, 1.6 + 0.55 * max(num_workers, 1))
    ax = fig.subplots()
    _draw_gantt(ax, visits, num_workers, colors, max((v["end"] for v in visits), default=1.0) or 1.0)
    ax.set_xlabel("seconds since the start of training")
    _model_legend(fig, models, colors)
    if title:
        ax.set_title(title)
    return _save(fig, out_png)


def plot_gantt_comparison(runs: Mapping[str, tuple[Sequence[Mapping[str, Any]], int]], out_png: str | Path,
                          title: str | None = None) -> Path:  # fmt: skip
    """Several runs' Gantt charts stacked on one time axis: ``{label: (visits, num_workers)}``."""
    runs = dict(runs)
    models = sorted({v["model"] for visits, _ in runs.values() for v in visits})
    colors = _colors(models)
    end = max((v["end"] for visits, _ in runs.values() for v in visits), default=1.0) or 1.0
    heights = [max(n, 1) + 1 for _, n in runs.values()]
    fig = _figure(11, 1.4 + 0.45 * sum(heights))
    axes = fig.subplots(len(runs), 1, sharex=True, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    for ax, (label, (visits, n)) in zip(axes, runs.items()):
        visits = list(visits)
        finish = max((v["end"] for v in visits), default=0.0)
        _draw_gantt(ax, visits, n, colors, end)
        ax.set_title(f"{label}: {finish:.1f} s", fontsize="small", loc="left")
    axes[-1].set_xlabel("seconds since the start of training")
    _model_legend(fig, models, colors)
    if title:
        fig.suptitle(title)
    return _save(fig, out_png)


def plot_learning_curves(curves: Mapping[str, Sequence[float]], metric: str, out_png: str | Path,
                         title: str | None = None, best: str | None = None) -> Path:  # fmt: skip
    """``curves``: ``{config_id: [value after epoch 0, 1, ...]}``; the ``best`` one drawn thicker."""
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    colors = _colors(list(curves))
    for cid, values in curves.items():
        xs = [i + 1 for i, v in enumerate(values) if v is not None and math.isfinite(v)]
        ys = [v for v in values if v is not None and math.isfinite(v)]
        ax.plot(xs, ys, "o-", color=colors[cid], linewidth=2.8 if cid == best else 1.2, markersize=3,
                label=f"{cid} (best)" if cid == best else cid)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend(fontsize="x-small", ncols=2)
    ax.set_title(title or f"{metric} per epoch")
    return _save(fig, out_png)


def plot_config_curve(config_id: str, history: Sequence[Mapping[str, Any]], out_png: str | Path,
                      params: Mapping[str, Any] | None = None) -> Path:  # fmt: skip
    """Every metric of one configuration per epoch: training solid, validation dashed.

    ``history`` holds one record per epoch with ``train`` and ``val`` dicts.
    Losses go on the left axis, the other metrics on the right one.
    """
    fig = _figure(7, 4)
    ax_loss = fig.subplots()
    ax_other = None
    keys: list[str] = []
    for h in history:
        for part in ("train", "val"):
            keys += [k for k in h.get(part, {}) if k not in keys]
    epochs = list(range(1, len(history) + 1))
    for i, key in enumerate(keys):
        values = [h.get("val" if key.startswith("val_") else "train", {}).get(key, math.nan) for h in history]
        is_loss = "loss" in key
        if not is_loss and ax_other is None:
            ax_other = ax_loss.twinx()
        ax = ax_loss if is_loss else ax_other
        base = key[4:] if key.startswith("val_") else key
        color = f"C{sorted({k[4:] if k.startswith('val_') else k for k in keys}).index(base) % 10}"
        ax.plot(epochs, values, "--" if key.startswith("val_") else "-", marker="o", markersize=3, color=color,
                label=key)
    ax_loss.set_xlabel("epoch")
    ax_loss.xaxis.set_major_locator(_integer_ticks())
    ax_loss.set_ylabel("loss")
    lines, labels = ax_loss.get_legend_handles_labels()
    if ax_other is not None:
        more = ax_other.get_legend_handles_labels()
        lines, labels = lines + more[0], labels + more[1]
        ax_other.set_ylabel("metrics")
    if lines:
        ax_loss.legend(lines, labels, fontsize="x-small")
    ax_loss.grid(True, alpha=0.3)
    text = ", ".join(f"{k}={v}" for k, v in (params or {}).items())
    ax_loss.set_title(f"{config_id}: {text}"[:110], fontsize="small")
    return _save(fig, out_png)
