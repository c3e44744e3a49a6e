#!/usr/bin/env python3
"""`make bench-lab`: the MNIST and forecasting jobs on the lab at each link, then their tables.

For each link (``unshaped`` or a tc rate such as ``1gbit``) it brings the lab up with the most workers asked
for (``make up WORKERS=3 LINK=1gbit``; compose/shape-links.sh shapes every container), then runs each job
once with the defaults, ``--workers 1,2,3 --repeats RUNS``, and once per algorithm, ``--algorithm ALGORITHM``
(``make submit``, whose driver container is shaped too). The first link's default run of each job also
trains plain Keras, one process in the driver's container, with the same seeds: the reference for
"time to plain Keras's metric". A submit that fails (an unknown algorithm, a crash, --timeout) is recorded as an
error for its cells and the bench goes on.

Written under --out: ``submits.jsonl`` (one line per submit: link, job, asked: the defaults or an algorithm,
status, error, seconds),
``runs/lab/NAME/JOB.json`` (the job's own results), ``logs/NAME.log`` (each submit's output), and from
them ``bench-lab.csv`` (one row per run) and ``bench-lab.md`` (means per cell, then every run).
``--tables-only`` rebuilds the last two from the first three.

Time to plain Keras's metric: the training time (the sum of the epoch times) up to the first epoch end
whose test accuracy reaches plain Keras's mean accuracy (MNIST), or whose MAPE is at most plain Keras's
mean MAPE (forecasting); empty when no epoch did.

    python3 compose/bench_lab.py --out results/lab/bench-lab                       (what make bench-lab runs)
    python3 compose/bench_lab.py --links "unshaped 100mbit" --workers "1 2" --runs 1 --algorithms allreduce
Stdlib only, like bench_table.py: it drives make and reads JSON.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

JOBS = ("mnist", "forecast")
# Small enough that 3 links x 3 lab sizes x (RUNS + algorithms) fit in about an hour on 2 cores. Forecasting keeps
# the job's whole series and 4 epochs (a second or two each): at 3,000 rows and 2 epochs the averaged center of 2-3
# workers had not caught up with one worker (MAPE +0.8 to +1.8 points), which the job at its own size does not show.
JOB_ARGS = {"mnist": "--limit 6000 --epochs 2", "forecast": "--models lstm --epochs 4"}
HIGHER_IS_BETTER = {"accuracy": True, "mape": False}
RESULTS_IN_VOLUME = "/results/bench-lab"
CSV_COLUMNS = ["link", "job", "model", "asked", "algorithm", "workers", "run", "epoch_time_s", "time_to_keras_s",
               "keras_metric", "metric_name", "metric_value", "bytes", "period", "average_ms", "timing_valid", "error"]


@dataclass
class Submit:
    """One `make submit`: a job at one link with the defaults (``asked`` "default") or one algorithm."""

    link: str
    job: str
    asked: str
    workers: list[int]
    runs: int
    baseline: bool

    @property
    def name(self) -> str:
        return f"{self.link}-{self.job}-{self.asked}"

    def job_args(self, extra: str) -> list[str]:
        args = ["--workers", ",".join(map(str, self.workers)), *shlex.split(extra),
                "--out", f"{RESULTS_IN_VOLUME}/{self.name}"]
        if self.asked != "default":
            args += ["--algorithm", self.asked]
        if self.runs > 1:
            args += ["--repeats", str(self.runs)]
        return args if self.baseline else args + ["--no-baseline"]


def words(text: str) -> list[str]:
    """'a b,c' -> ['a', 'b', 'c']: make passes lists space-separated, people type commas too."""
    return [w for w in re.split(r"[\s,]+", text.strip()) if w]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/lab/bench-lab", help="results folder (default %(default)s)")
    parser.add_argument("--publish", metavar="DIR", default=None,
                        help="also write DIR/bench-lab.json, the results file the docs quote (the Makefile passes "
                             "docs/results; PUBLISH= leaves it out)")
    parser.add_argument("--project", default="trainer-lab",
                        help="the lab's compose project, for its containers (default %(default)s; make passes "
                             "LAB_PROJECT)")
    parser.add_argument("--links", default="unshaped 1gbit 100mbit",
                        help="links to run at: 'unshaped' or tc rates (default '%(default)s')")
    parser.add_argument("--delay", default="", help="a delay at every shaped link, e.g. 1ms (default none)")
    parser.add_argument("--workers", default="1 2 3",
                        help="worker counts; the lab has the largest (default '%(default)s')")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs (seeds) of each job with the defaults (default %(default)s)")
    parser.add_argument("--algorithms", default="allreduce downpour",
                        help="algorithms run once each with --algorithm ALGORITHM (default '%(default)s'; '' for none)")
    parser.add_argument("--jobs", default=" ".join(JOBS), help="jobs to run (default '%(default)s')")
    parser.add_argument("--mnist-args", default=JOB_ARGS["mnist"],
                        help="the MNIST job's arguments besides workers, algorithm and runs (default '%(default)s')")
    parser.add_argument("--forecast-args", default=JOB_ARGS["forecast"],
                        help="the forecasting job's arguments besides workers, algorithm and runs (default "
                             "'%(default)s')")
    parser.add_argument("--timeout", type=float, default=2400,
                        help="seconds one submit may run before it is stopped and recorded as an error "
                             "(default %(default)s)")
    parser.add_argument("--make", default=os.environ.get("MAKE", "make"), help="the make to run (default make)")
    parser.add_argument("--keep-up", action="store_true", help="leave the last lab running (default: make down)")
    parser.add_argument("--dry-run", action="store_true", help="print the make commands, run nothing")
    parser.add_argument("--tables-only", action="store_true",
                        help="rebuild bench-lab.csv and bench-lab.md from what --out holds, run nothing")
    args = parser.parse_args(argv)
    args.links, args.algorithms, args.jobs = words(args.links), words(args.algorithms), words(args.jobs)
    try:
        args.workers = sorted({int(w) for w in words(args.workers)})
    except ValueError:
        parser.error(f"--workers expects whole numbers like '1 2 3'; received {args.workers!r}")
    if not args.workers or args.workers[0] < 1:
        parser.error(f"--workers expects counts of at least 1; received {args.workers}")
    if args.runs < 1:
        parser.error(f"--runs must be at least 1; received {args.runs}")
    unknown = [j for j in args.jobs if j not in JOBS]
    if unknown or not args.jobs:
        parser.error(f"--jobs expects some of {', '.join(JOBS)}; received {args.jobs}")
    if not args.links:
        parser.error("--links is empty: give 'unshaped' or tc rates such as 1gbit")
    return args


def plan(args: argparse.Namespace) -> list[Submit]:
    """Every submit, link by link: each job's defaults (plain Keras beside them at the first link), then each
    algorithm once at the worker counts above 1, where there is something to exchange (all of them if none is)."""
    submits = []
    several = [n for n in args.workers if n > 1] or args.workers
    for i, link in enumerate(args.links):
        for job in args.jobs:
            submits.append(Submit(link, job, "default", args.workers, args.runs, baseline=i == 0))
            submits += [Submit(link, job, asked, several, 1, baseline=False) for asked in args.algorithms]
    return submits


# ------------------------------------------------------------------------------------------- running


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def run_logged(cmd: list[str], logfile: Path, timeout: float) -> tuple[int, str]:
    """Run `cmd` in a process group of its own, its output appended to `logfile`: (status, output);
    status 124 when it ran past `timeout` and was stopped."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("a") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            fh.write(f"\nstopped after {timeout:.0f} s (--timeout)\n")
            status = 124
    return status, logfile.read_text(errors="replace")


def error_line(output: str, status: int) -> str:
    """The line that says why a submit failed: the last exception or error line, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if status == 124:
        return lines[-1] if lines else "stopped by --timeout"
    for line in reversed(lines):
        if re.search(r"(Error|Exception)\b|^error:|: error:", line):
            return line[:300]
    return (lines[-1][:300] if lines else "") or f"exit status {status}"


def compose_containers(project: str, service: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={project}",
                          "--filter", f"label=com.docker.compose.service={service}"],
                         capture_output=True, text=True, check=False).stdout
    return out.split()


def run_submit(args: argparse.Namespace, submit: Submit, out: Path) -> dict:
    """One `make submit`, its results copied under out/runs/lab/NAME: its record for submits.jsonl."""
    extra = args.mnist_args if submit.job == "mnist" else args.forecast_args
    for jupyter in compose_containers(args.project, "jupyter")[:1]:  # no stale results from an earlier bench
        subprocess.run(["docker", "exec", jupyter, "rm", "-rf", f"{RESULTS_IN_VOLUME}/{submit.name}"], check=False)
    shutil.rmtree(out / "runs" / "lab" / submit.name, ignore_errors=True)
    cmd = [args.make, "--no-print-directory", "submit", f"JOB={submit.job}",
           f"ARGS={shlex.join(submit.job_args(extra))}", f"OUT={out / 'runs'}"]
    log(f"{submit.link}: {submit.job}, {submit.asked} ({submit.runs} run(s) at {submit.workers} workers)")
    start = time.monotonic()
    status, output = run_logged(cmd, out / "logs" / f"{submit.name}.log", args.timeout)
    if status == 124:
        for cid in compose_containers(args.project, "submit"):
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    seconds = round(time.monotonic() - start, 1)
    record = {**asdict(submit), "name": submit.name, "status": status, "seconds": seconds,
              "error": error_line(output, status) if status else ""}
    log(f"  {'ok' if status == 0 else 'FAILED: ' + record['error']} in {seconds:.0f} s")
    return record


def run_bench(args: argparse.Namespace, out: Path) -> None:
    submits = plan(args)
    log(f"{len(submits)} submits at {len(args.links)} link(s); results in {out}")
    if args.dry_run:
        for s in submits:
            extra = args.mnist_args if s.job == "mnist" else args.forecast_args
            print(f"{args.make} submit JOB={s.job} ARGS={shlex.quote(shlex.join(s.job_args(extra)))}"
                  f"   # lab: make up WORKERS={max(args.workers)} LINK={'' if s.link == 'unshaped' else s.link}")
        return
    journal = out / "submits.jsonl"
    journal.unlink(missing_ok=True)
    try:
        for link in args.links:
            shaped = link != "unshaped"
            up = [args.make, "--no-print-directory", "up", f"WORKERS={max(args.workers)}",
                  f"LINK={link if shaped else ''}", f"LINK_DELAY={args.delay if shaped else ''}"]
            log(f"lab at link {link}: {shlex.join(up[2:])}")
            status, output = run_logged(up, out / "logs" / f"{link}-up.log", 900)
            mine = [s for s in submits if s.link == link]
            for submit in mine:
                record = run_submit(args, submit, out) if status == 0 else {
                    **asdict(submit), "name": submit.name, "status": status, "seconds": 0.0,
                    "error": f"make up failed: {error_line(output, status)}"}
                with journal.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
    finally:
        if not args.keep_up and not args.dry_run:
            run_logged([args.make, "--no-print-directory", "down"], out / "logs" / "down.log", 300)


# -------------------------------------------------------------------------------------------- tables


def read_journal(out: Path) -> list[dict]:
    path = out / "submits.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run the bench first (without --tables-only)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def result_rows(out: Path, record: dict) -> list[dict]:
    """The job's result rows of one submit ([] when it wrote none)."""
    path = out / "runs" / "lab" / record["name"] / f"{record['job']}.json"
    if record["status"] != 0 or not path.exists():
        return []
    return json.loads(path.read_text())["rows"]


def time_to(row: dict, target: float | None, higher_is_better: bool) -> float | None:
    """Training time to the first epoch end whose score reaches `target` (module docstring)."""
    scores, times = row.get("metric_by_epoch") or [], row.get("epoch_times_s") or []
    if target is None:
        return None
    for i, (score, _) in enumerate(zip(scores, times)):
        if score is not None and (score >= target if higher_is_better else score <= target):
            return float(sum(times[: i + 1]))
    return None


def keras_reference(out: Path, records: list[dict]) -> dict[tuple[str, str], dict]:
    """(job, model) -> plain Keras's mean metric and s/epoch over its runs (rows with workers 0)."""
    found: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        for row in result_rows(out, record):
            if row.get("workers") == 0:
                found.setdefault((record["job"], row["model"]), []).append(row)
    return {key: {"metric_name": rows[0]["metric_name"],
                  "metric": statistics.fmean(r["metric_value"] for r in rows),
                  "epoch_time_s": statistics.fmean(r["epoch_time_s"] for r in rows), "runs": len(rows)}
            for key, rows in found.items()}


def run_rows(out: Path, records: list[dict]) -> list[dict]:
    """One CSV row per distributed run; a failed submit gives one error row per worker count."""
    keras = keras_reference(out, records)
    rows = []
    for record in records:
        base = {"link": record["link"], "job": record["job"], "asked": record["asked"]}
        results = [r for r in result_rows(out, record) if r.get("workers", 0) > 0]
        if not results:
            error = record["error"] or "the job wrote no results"
            rows += [{**base, "workers": n, "error": error} for n in record["workers"]]
            continue
        for r in results:
            ref = keras.get((record["job"], r["model"]))
            better = HIGHER_IS_BETTER.get(r.get("metric_name"), True)
            rows.append({**base, "model": r["model"], "algorithm": r.get("algorithm"), "workers": r["workers"],
                         "run": r.get("seed"), "epoch_time_s": r.get("epoch_time_s"),
                         "time_to_keras_s": time_to(r, ref and ref["metric"], better),
                         "keras_metric": ref and ref["metric"], "metric_name": r.get("metric_name"),
                         "metric_value": r.get("metric_value"), "bytes": r.get("bytes"), "period": r.get("period"),
                         "average_ms": r.get("average_ms"),
                         "timing_valid": r.get("timing_valid"), "error": ""})
    return rows


def _num(value, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _mean_sd(values: list[float], digits: int) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return _num(values[0], digits)
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def summary_rows(rows: list[dict]) -> list[dict]:
    """Means per (job, model, link, asked, workers), in the order of the runs, with the epoch time over the
    unshaped link's for the same job, model, asked and workers."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["job"], r.get("model") or "", r["link"], r["asked"], r["workers"]), []).append(r)
    unshaped = {}
    for (job, model, link, asked, n), runs in cells.items():
        times = [r["epoch_time_s"] for r in runs if r.get("epoch_time_s")]
        if link == "unshaped" and times:
            unshaped[(job, model, asked, n)] = statistics.fmean(times)
    out = []
    for (job, model, link, asked, n), runs in cells.items():
        ok = [r for r in runs if not r.get("error")]
        times = [r["epoch_time_s"] for r in ok if r.get("epoch_time_s")]
        reached = [r["time_to_keras_s"] for r in ok if r.get("time_to_keras_s") is not None]
        base = unshaped.get((job, model, asked, n))
        out.append({"job": job, "model": model, "link": link, "asked": asked,
                    "algorithm": ok[0].get("algorithm", "") if ok else "", "workers": n,
                    "runs": f"{len(ok)}" if ok else "0",
                    "s/epoch": _mean_sd(times, 2),
                    "x unshaped": f"{statistics.fmean(times) / base:.2f}" if times and base and link != "unshaped"
                    else "",
                    "to Keras's metric (s)": f"{_mean_sd(reached, 1) or 'not reached'} ({len(reached)} of {len(ok)})"
                    if ok else "",
                    "metric": _mean_sd([r["metric_value"] for r in ok if r.get("metric_value") is not None], 4),
                    "error": "" if ok else runs[0]["error"]})
    return out


def markdown(rows: list[dict], columns: list[str]) -> str:
    def cell(value) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else "" if value is None else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def report(out: Path, args: argparse.Namespace | None = None) -> str:
    """Write bench-lab.csv and bench-lab.md from what `out` holds; return the Markdown."""
    records = read_journal(out)
    rows = run_rows(out, records)
    with (out / "bench-lab.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    keras = keras_reference(out, records)
    parts = ["# make bench-lab", ""]
    if args is not None:
        parts += [f"Links {' '.join(args.links)}{f' (delay {args.delay})' if args.delay else ''}; workers "
                  f"{' '.join(map(str, args.workers))}; {args.runs} run(s) with the defaults, one per algorithm "
                  f"({' '.join(args.algorithms) or 'none'}); MNIST `{args.mnist_args}`, forecasting "
                  f"`{args.forecast_args}`.", ""]
    parts += ["Plain Keras, one process in the lab's driver container (the reference of \"to Keras's metric\"):", ""]
    parts.append(markdown([{"job": job, "model": model, "runs": k["runs"], "s/epoch": _num(k["epoch_time_s"], 2),
                            "metric": f"{k['metric_name']} {k['metric']:.4f}"} for (job, model), k in keras.items()],
                          ["job", "model", "runs", "s/epoch", "metric"]) if keras else "(no plain Keras run)")
    columns = ["job", "model", "link", "asked", "algorithm", "workers", "runs", "s/epoch", "x unshaped",
               "to Keras's metric (s)", "metric", "error"]
    parts += ["", "Means (± sd) per cell:", "", markdown(summary_rows(rows), columns), "", "Every run:", "",
              markdown(rows, [c for c in CSV_COLUMNS if c not in ("keras_metric", "timing_valid")])]
    text = "\n".join(parts) + "\n"
    (out / "bench-lab.md").write_text(text)
    return text


def publish_results(directory: str | None, name: str, figures: dict) -> None:
    """Write ``directory/<name>.json``, the results file the docs quote (nothing when `directory` is None), with
    jobs/support/published.py, which needs only the standard library: the host's Python runs the lab's benches."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs" / "support"))
    from published import publish

    publish(directory, name, figures)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.tables_only:
        run_bench(args, out)
        if args.dry_run:
            return 0
    print(report(out, args))
    print(f"written: {out / 'bench-lab.csv'}, {out / 'bench-lab.md'}")
    if not args.tables_only and not args.dry_run:
        records = read_journal(out)
        rows = run_rows(out, records)
        publish_results(args.publish, "bench-lab", {"keras": [{"job": job, "model": model, **k} for (job, model), k in
                                                      keras_reference(out, records).items()],
                                            "means": summary_rows(rows), "runs": rows})
    failed = [r for r in read_journal(out) if r["status"] != 0]
    return 1 if failed and len(failed) == len(read_journal(out)) else 0


if __name__ == "__main__":
    sys.exit(main())
