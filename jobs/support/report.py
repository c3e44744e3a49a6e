"""Benchmark results: speed-up arithmetic, JSON/CSV/Markdown files and a plot.

A result row is a plain dict, one per (model, number of workers) run::

    model          str    model name ("cnn", "lstm", ...)
    workers        int    number of Spark workers that trained it
    time_s         float  wall-clock training time
    epoch_time_s   float  mean time per epoch
    speedup        float  time_s of the 1-worker row / time_s  (speedup_rows)
    efficiency     float  speedup / workers                     (speedup_rows)
    metric_name    str    "accuracy", "mape", ...
    metric_value   float  the metric on the test set
    updates        int    parameter-server updates (commits) made
    bytes          int    bytes exchanged with the parameter server
    timing_valid   bool   False when the timing is not trustworthy (e.g. more
                          worker processes than cores), drawn hollow in plots

Rows may carry more keys (``run``, ``algorithm``, ...); they are kept, and
written after the standard columns.

Markdown tables are for people: every table the jobs print or write goes
through ``markdown_table``, which leaves out the columns that are empty in
every row (None, NaN or ""), e.g. the baseline and time-to-target columns of
a run with --no-baseline or whose target was never reached. The CSV and JSON
files are data for scripts and keep every column, empty or not.

Functions: ``speedup_rows``, ``write_results``, ``markdown_table``,
``markdown_row`` (one line at a time under a header printed before),
``plot_speedup`` (matplotlib Agg canvas, no pyplot, no global backend change)
and ``mape``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import socket
import sys
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trainer.internals import NAMES, backend_for, configured_name

__all__ = [
    "COLUMNS",
    "speedup_rows",
    "write_results",
    "markdown_table",
    "markdown_row",
    "is_empty",
    "plot_speedup",
    "mape",
    "run_metadata",
]

COLUMNS = [
    "model",
    "workers",
    "time_s",
    "epoch_time_s",
    "speedup",
    "efficiency",
    "metric_name",
    "metric_value",
    "updates",
    "bytes",
    "timing_valid",
]

#: The distributions a results file records the version of (those installed): every backend's among them.
_VERSIONED = ("pyspark", *(d for name in NAMES for d in backend_for(name).distributions), "keras", "numpy", "pandas",
              "pyarrow", "matplotlib")


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# ----------------------------------------------------------------------- speed-up


def speedup_rows(
    rows: Iterable[Mapping[str, Any]],
    group_by: Sequence[str] = ("run", "model"),
    time_key: str = "time_s",
) -> list[dict]:
    """Return copies of ``rows`` with ``speedup`` and ``efficiency`` filled in.

    Within each group (rows with equal values for the ``group_by`` keys that
    are present; by default the same run and model), the baseline is the
    1-worker row (the mean time when the run was repeated):
    ``speedup = t(1) / t(N)``, ``efficiency = speedup / N``. Rows of a group
    without a 1-worker row, or without a positive time, get None.
    """
    out = [dict(r) for r in rows]

    def key(r: dict) -> tuple:
        return tuple(r.get(k) for k in group_by)

    baselines: dict[tuple, list[float]] = {}
    for r in out:
        t = _number(r.get(time_key))
        if _number(r.get("workers")) == 1 and t is not None and t > 0:
            baselines.setdefault(key(r), []).append(t)
    for r in out:
        base = baselines.get(key(r))
        t = _number(r.get(time_key))
        n = _number(r.get("workers"))
        if base and t is not None and t > 0 and n is not None and n > 0:
            r["speedup"] = (sum(base) / len(base)) / t
            r["efficiency"] = r["speedup"] / n
        else:
            r["speedup"] = None
            r["efficiency"] = None
    return out


# -------------------------------------------------------------------------- files


def run_metadata(extra: Mapping[str, Any] | None = None) -> dict:
    """Where and when results were produced: host, cores, versions, UTC timestamp."""
    versions = {}
    for dist in _VERSIONED:
        try:
            versions[dist] = _metadata.version(dist)
        except _metadata.PackageNotFoundError:
            continue
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    meta = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        # the driver's Keras backend, which every task uses (KERAS_BACKEND, the jobs' --backend)
        "keras_backend": (sys.modules["keras"].backend.backend() if "keras" in sys.modules
                          else configured_name()),
    }
    if extra:
        meta.update(extra)
    return meta


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None  # strict JSON has no NaN/inf
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, (int, str)):
        return value
    return str(value)


def _columns_of(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> list[str]:
    if columns is not None:
        return list(columns)
    present = {k for r in rows for k in r}
    cols = [c for c in COLUMNS if c in present]
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def write_results(
    rows: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    name: str,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Write ``rows`` as ``<name>.json``, ``<name>.csv`` and ``<name>.md`` in ``out_dir``.

    * JSON: ``{"metadata": run_metadata(metadata), "rows": [...]}``; NaN and
      infinities become null.
    * CSV: one row per result; the standard ``COLUMNS`` first (all of them,
      empty where unknown), then any extra keys in order of appearance.
    * Markdown: a heading, the metadata and ``markdown_table(rows)``.

    ``speedup``/``efficiency`` are filled with ``speedup_rows`` when a row lacks
    them. Returns ``{"json": path, "csv": path, "md": path}``.
    """
    rows = [dict(r) for r in rows]
    if not name or any(sep in name for sep in ("/", "\\")):
        raise ValueError(f"write_results: name must be a plain file stem like 'mnist', got {name!r}.")
    if any("speedup" not in r for r in rows):
        rows = speedup_rows(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(metadata)
    paths = {"json": out / f"{name}.json", "csv": out / f"{name}.csv", "md": out / f"{name}.md"}

    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(_jsonable({"metadata": meta, "rows": rows}), f, indent=2, allow_nan=False)
        f.write("\n")

    columns = COLUMNS + [c for c in _columns_of(rows) if c not in COLUMNS]
    with open(paths["csv"], "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({c: ("" if (v := _jsonable(r.get(c))) is None else v) for c in columns})

    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    lines = [
        f"# {name}",
        "",
        f"- produced: {meta['timestamp']} on {meta['host']} ({meta['cores']} cores, {meta['usable_cores']} usable)",
        f"- python {meta['python']}; {versions}",
    ]
    for k, v in meta.items():
        if k not in {"timestamp", "host", "cores", "usable_cores", "python", "versions", "platform"}:
            lines.append(f"- {k}: {_jsonable(v)}")
    lines += ["", markdown_table(rows), ""]
    paths["md"].write_text("\n".join(lines), encoding="utf-8")
    return paths


def write_report(out: Path, name: str, title: str, note: str, rows: list[dict], columns: Sequence[str],
                 metadata: Mapping[str, Any], **extra: Any) -> str:
    """A benchmark's ``<name>.json`` (``{"metadata", "rows", **extra}``) and ``<name>.md`` (`title`, when and
    where, `note`, the table of `columns`) in `out`; returns the Markdown, for the console."""
    meta = run_metadata(metadata)
    (out / f"{name}.json").write_text(json.dumps({"metadata": meta, "rows": rows, **extra}, indent=2) + "\n",
                                      encoding="utf-8")
    text = (f"# {title}\n\n- {meta['timestamp']} on {meta['host']} ({meta['cores']} cores); {note}\n\n"
            f"{markdown_table(rows, columns)}\n")
    (out / f"{name}.md").write_text(text, encoding="utf-8")
    return text


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}" if abs(int(value)) >= 10_000 else str(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if not math.isfinite(f):
            return str(f)
        if f == int(f) and abs(f) >= 1_000:
            return f"{int(f):,}"
        if abs(f) >= 100:
            return f"{f:,.1f}"
        if abs(f) >= 1:
            return f"{f:.2f}"
        if 0 < abs(f) < 0.01:  # a small loss keeps 4 significant digits
            return f"{f:.4g}"
        return f"{f:.4f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def is_empty(value: Any) -> bool:
    """True for a cell with nothing to show: None, NaN or the empty string."""
    if value is None or (isinstance(value, str) and value == ""):
        return True
    return isinstance(value, (float, np.floating)) and math.isnan(value)


def _line(row: Mapping[str, Any], cols: Sequence[str]) -> str:
    return "| " + " | ".join(_fmt(row.get(c)) for c in cols) + " |"


def markdown_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``rows``.

    ``columns`` defaults to the standard ``COLUMNS`` present in the rows, then
    the extra keys. A column that is empty in every row (missing, None, NaN
    or "", see ``is_empty``) is left out, asked for or not; with no rows the
    header of ``columns`` stays. Numeric columns are right-aligned; floats get
    4 decimals below 1 (4 significant digits below 0.01), 2 below 100, 1 above; booleans read yes/no; missing
    cells are empty.
    """
    rows = list(rows)
    cols = _columns_of(rows, columns)
    if rows:
        cols = [c for c in cols if not all(is_empty(r.get(c)) for r in rows)]
    if not cols:
        return ""
    numeric = {
        c: all(v is None or (isinstance(v, (int, float, np.number)) and not isinstance(v, bool)) for v in (r.get(c) for r in rows))
        for c in cols
    }
    lines = [
        "| " + " | ".join(cols) + " |",
        "|" + "|".join("---:" if numeric[c] else "---" for c in cols) + "|",
    ]
    lines += [_line(r, cols) for r in rows]
    return "\n".join(lines)


def markdown_row(row: Mapping[str, Any], columns: Sequence[str]) -> str:
    """One body line of a Markdown table with every one of ``columns``, empty or not, formatted as
    ``markdown_table`` does: for printing results as they come under a header printed once before."""
    return _line(row, columns)


def metric_pivot(rows: Sequence[Mapping[str, Any]], label: str) -> str:
    """A model x workers markdown table of the test metric (``metric_value``) after a line naming it.

    Repeated runs of one set-up (several rows with the same model and
    workers) show as ``mean ± sd (n runs)``; time-shared runs are marked '*';
    workers 0 is the plain Keras column.
    """
    workers = sorted({int(r["workers"]) for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    table = []
    for model in models:
        line: dict[str, Any] = {"model": model}
        for n in workers:
            mine = [r for r in rows if r["model"] == model and int(r["workers"]) == n]
            values = [v for r in mine if (v := _number(r.get("metric_value"))) is not None]
            key = "plain Keras" if n == 0 else f"{n} worker{'s' if n > 1 else ''}"
            line[key] = _mean_sd(values)
            if values and any(r.get("timing_valid") is False for r in mine):
                line[key] += " *"
        table.append(line)
    return f"{label} on the test set:\n\n{markdown_table(table)}"


def against_plain_keras(rows: Sequence[Mapping[str, Any]], label: str, *, higher_is_better: bool,
                        tolerance: float, advice: str, spread: str | None = None) -> list[str]:
    """Plain-language lines: does each worker count reach plain Keras's test metric (the mean over its runs)?

    A worker count within `tolerance` of plain Keras's mean "reaches" it; one further behind gets the reason and
    `advice` (what to change), so that a short first run does not read as the trainer losing accuracy for good.
    With `spread`, the run-to-run spread of one fit that `tolerance` allows for (e.g. "one fit of 12,000 images
    moves 0.007-0.013 between runs"), a first line states the rule (the tolerance and that spread) and a line
    that does not reach it says how far behind it is. Nothing without a plain Keras baseline row."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        plain = [v for r in rows if r["model"] == model and _is_plain(r) if (v := _number(r.get("metric_value")))]
        if not plain:
            continue
        reference = float(np.mean(plain))
        for n in sorted({int(r["workers"]) for r in rows if r["model"] == model and not _is_plain(r)}):
            values = [v for r in rows if r["model"] == model and int(r["workers"]) == n and not _is_plain(r)
                      if (v := _number(r.get("metric_value"))) is not None]
            if not values:
                continue
            mean = float(np.mean(values))
            behind = reference - mean if higher_is_better else mean - reference
            who = f"{model}, {n} worker{'s' if n > 1 else ''}"
            if behind <= tolerance + 1e-9:  # 0.967 - 0.962 is 0.0050000000000000044 in floats
                lines.append(f"{who}: {label} {mean:.4g}, plain Keras {reference:.4g}: reaches plain Keras's.")
            else:
                lines.append(f"{who}: {label} {mean:.4g}, plain Keras {reference:.4g}: not yet"
                             + (f", {behind:.2g} behind" if spread else "") + ". Each of N workers "
                             f"takes 1/N of an epoch's steps, and the center needs some epochs from random "
                             f"weights before it catches up: {advice}.")
    if lines and spread:
        lines.insert(0, f"Reaching plain Keras's {label}: within {tolerance:g} of it ({spread}).")
    return lines


def _mean_sd(values: Sequence[float]) -> str:
    if not values:
        return ""
    digits = 4 if abs(float(np.mean(values))) < 1 else 2
    text = f"{np.mean(values):.{digits}f}"
    if len(values) > 1:
        text += f" ± {np.std(values, ddof=1):.{digits}f} ({len(values)} runs)"
    return text


# --------------------------------------------------------------------------- plot


def _metric_value(row: Mapping[str, Any], metric: str) -> float | None:
    if metric in row:
        return _number(row[metric])
    if row.get("metric_name") in (None, metric):
        return _number(row.get("metric_value"))
    return None


def _is_plain(row: Mapping[str, Any]) -> bool:
    """A plain Keras baseline row (workers 0, mode "plain keras (...)")."""
    return str(row.get("mode", "")).startswith("plain keras") or _number(row.get("workers")) == 0


def plot_speedup(rows: Iterable[Mapping[str, Any]], out_png: str | Path, metric: str, title: str | None = None,
                 tolerance: float | None = None) -> Path:
    """`speedup_figure` written to `out_png` (PNG, the Agg canvas: no display needed); returns the path."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    speedup_figure(rows, metric, title, tolerance).savefig(out, dpi=110)
    return out


def speedup_figure(rows: Iterable[Mapping[str, Any]], metric: str, title: str | None = None,
                   tolerance: float | None = None):
    """A matplotlib Figure of two panels: speed-up vs workers (with the ideal line) and ``metric`` vs workers.

    One line per model through the mean at each worker count; every row is
    also drawn as a marker, hollow (and listed in the legend) when its
    ``timing_valid`` is False, and where several runs (seeds) share a worker
    count a bar spans their lowest to highest value. Plain Keras (the
    baseline rows) is not a worker count: on the metric panel it is a dashed
    line at its mean, labelled "plain Keras", with a band over its runs'
    range when there are several. ``metric`` is the value plotted on the
    right: the row's ``metric`` key if present, else ``metric_value`` of rows
    whose ``metric_name`` is ``metric``. Speed-ups are computed with
    ``speedup_rows`` when missing. With `tolerance` (the verdict's, see
    `against_plain_keras`) a band of plain Keras's mean ± `tolerance` is
    shaded, and the metric's axis spans at least that band, so that
    run-to-run noise does not fill the panel and read as a trend.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rows = [dict(r) for r in rows]
    if not rows:
        raise ValueError("plot_speedup: no result rows to plot.")
    if any("speedup" not in r for r in rows):
        rows = speedup_rows(rows)
    models = list(dict.fromkeys(r.get("model") for r in rows))
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_s, ax_m = fig.subplots(1, 2)
    distributed = [r for r in rows if not _is_plain(r)]
    workers_all = sorted({int(n) for r in distributed if (n := _number(r.get("workers"))) is not None})
    any_invalid = False
    band: tuple[float, float] | None = None  # the lowest and highest edge of the tolerance bands
    for i, model in enumerate(models):
        color = f"C{i % 10}"
        mine = [r for r in distributed if r.get("model") == model]
        for ax, getter in ((ax_s, lambda r: _number(r.get("speedup"))), (ax_m, lambda r: _metric_value(r, metric))):
            points = [(_number(r.get("workers")), getter(r), r.get("timing_valid", True) is not False) for r in mine]
            points = [(w, v, ok) for w, v, ok in points if w is not None and v is not None]
            if not points:
                continue
            xs = sorted({w for w, _, _ in points})
            values = {x: [v for w, v, _ in points if w == x] for x in xs}
            ax.plot(xs, [float(np.mean(values[x])) for x in xs], "-", color=color, label=str(model))
            for x in xs:
                if len(values[x]) > 1:  # the spread over seeds
                    ax.plot([x, x], [min(values[x]), max(values[x])], "-", color=color, linewidth=4, alpha=0.3)
            for w, v, ok in points:
                ax.plot([w], [v], "o", color=color, markersize=7, markerfacecolor=color if ok else "none",
                        markeredgewidth=1.5)
                any_invalid |= not ok
        plain = [v for r in rows if _is_plain(r) and r.get("model") == model
                 if (v := _metric_value(r, metric)) is not None]
        if plain:
            label = f"plain Keras ({model})" if len(models) > 1 else "plain Keras"
            if len(plain) > 1:
                label += f", {len(plain)} runs"
                ax_m.axhspan(min(plain), max(plain), color=color, alpha=0.12, linewidth=0)
            ax_m.axhline(float(np.mean(plain)), linestyle="--", color=color, linewidth=1.2, label=label)
            if tolerance:
                mean = float(np.mean(plain))
                ax_m.axhspan(mean - tolerance, mean + tolerance, color=color, alpha=0.1, linewidth=0,
                             label=f"plain Keras ± {tolerance:g} (run-to-run spread)")
                band = (min(band[0], mean - tolerance), max(band[1], mean + tolerance)) if band else \
                    (mean - tolerance, mean + tolerance)
    if workers_all:
        ax_s.plot([min(workers_all), max(workers_all)], [min(workers_all), max(workers_all)], "--", color="grey",
                  label="ideal")
        for ax in (ax_s, ax_m):
            ax.set_xticks(workers_all)
    ax_s.set_xlabel("workers")
    ax_s.set_ylabel("speed-up  t(1) / t(N)")
    ax_s.set_title("speed-up")
    if band:
        low, high = ax_m.get_ylim()
        low, high = min(low, band[0]), max(high, band[1])
        pad = 0.05 * (high - low)
        ax_m.set_ylim(low - pad, high + pad)
    ax_m.set_xlabel("workers")
    ax_m.set_ylabel(metric)
    ax_m.set_title(f"{metric} vs workers")
    handles, labels = ax_s.get_legend_handles_labels()
    if any_invalid:
        handles.append(Line2D([], [], marker="o", linestyle="", color="black", markerfacecolor="none"))
        labels.append("timing not valid")
    ax_s.legend(handles, labels, fontsize="small")
    if any(label.startswith("plain Keras") for label in ax_m.get_legend_handles_labels()[1]):
        ax_m.legend(fontsize="small")
    for ax in (ax_s, ax_m):
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


# ------------------------------------------------------------------------- metric


def mape(y_true, y_pred) -> float:
    """Mean absolute percentage error in percent: ``100 * mean(|y - yhat| / |y|)``.

    Compute it in ORIGINAL units (invert any scaling first, e.g. with
    ``FittedMinMax.inverse``): on min-max-scaled values the minimum maps to 0
    and the percentage is meaningless. Shapes must agree up to size-1 axes.
    """
    t = np.asarray(y_true, dtype=np.float64)
    p = np.asarray(y_pred, dtype=np.float64)
    if np.squeeze(t).shape != np.squeeze(p).shape:
        raise ValueError(f"mape: y_true has shape {t.shape} but y_pred has shape {p.shape}; they must match.")
    t, p = t.reshape(-1), p.reshape(-1)
    if t.size == 0:
        raise ValueError("mape: no values.")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(p))):
        raise ValueError("mape: y_true and y_pred must be finite (found NaN or inf).")
    if np.any(t == 0):
        raise ValueError(
            f"mape: y_true has {int(np.sum(t == 0))} zero value(s); MAPE is undefined there. "
            "Use original (unscaled) units, or another metric."
        )
    return float(np.mean(np.abs(t - p) / np.abs(t)) * 100.0)
