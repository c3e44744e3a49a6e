#!/usr/bin/env python3
"""`make bench-lab-elastic`: an elastic MNIST fit in the lab, undisturbed, one worker container killed, one joining,
and under Spark's dynamic allocation; then its table.

Each run (``--runs``, default 3) makes four `make submit JOB=mnist` of the same elastic fit (``--workers 3
--min-workers 1``, the defaults: the algorithm chosen across the lab's hosts; ``--limit 6000 --epochs 4``):

* **undisturbed**: the lab at 3 workers (``make up WORKERS=3``); the first run's also trains plain Keras in the
  driver's container, the reference of the accuracy;
* **killed**: the newest worker container killed (``docker kill``, a lost machine: it stays down) when epoch 2
  starts, that is when the fit's first epoch-end checkpoint appears in the lab's checkpoints volume;
* **joined**: the lab brought down to 2 workers (``make up WORKERS=2``), and a third added (``make worker-add``)
  during epoch 1: ``--join-after`` seconds after two of the fit's chunk tasks run (the driver's UI says so; their
  processes import and build the model first), and the joiner is the process on the third host;
* **dynamic**: the lab at 3 workers and the driver with ``spark.dynamicAllocation.enabled=true`` (standalone:
  shuffle tracking, executors requested as chunks wait, from none): the fit starts on the first executor Spark
  grants and takes the others as they come.

Written under --out: ``submits.jsonl`` (one line per submit: run, case, status, seconds, the kill's or the join's
time), ``runs/lab/NAME/mnist.json`` (the job's own results, its row's ``membership`` and ``rows_by_worker``),
``logs/NAME.log``, and from them ``bench-lab-elastic.md``. ``--tables-only`` rebuilds the table.

    python3 compose/bench_lab_elastic.py --out results/lab/bench-lab-elastic       (what make bench-lab-elastic runs)
    python3 compose/bench_lab_elastic.py --cases joined       (that case again; the journal keeps the others)
Stdlib only, like bench_lab.py, whose helpers it uses.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lab import compose_containers, error_line, log, markdown, publish_results, run_logged  # noqa: E402

CASES = ("undisturbed", "killed", "joined", "dynamic")
RESULTS_IN_VOLUME = "/results/bench-lab-elastic"
CHECKPOINTS_IN_VOLUME = "/checkpoints/bench-lab-elastic"
DYNAMIC_CONF = ("spark.dynamicAllocation.enabled=true spark.dynamicAllocation.shuffleTracking.enabled=true "
                "spark.dynamicAllocation.minExecutors=0 spark.dynamicAllocation.initialExecutors=0 "
                "spark.dynamicAllocation.maxExecutors=3")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/lab/bench-lab-elastic", help="results folder (default %(default)s)")
    parser.add_argument("--publish", metavar="DIR", default=None,
                        help="also write DIR/bench-lab-elastic.json, the results file the docs quote")
    parser.add_argument("--project", default="trainer-lab", help="the lab's compose project (default %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs of the four cases (default %(default)s)")
    parser.add_argument("--cases", default=" ".join(CASES),
                        help="the cases to run (default '%(default)s'); the journal keeps the others' records")
    parser.add_argument("--job-args", default="--limit 6000 --epochs 4",
                        help="the MNIST job's arguments besides workers and out (default '%(default)s')")
    parser.add_argument("--join-after", type=float, default=5.0,
                        help="seconds after two chunk tasks of the fit run before the third worker container is "
                             "added (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one submit may run (default %(default)s)")
    parser.add_argument("--make", default=os.environ.get("MAKE", "make"), help="the make to run (default make)")
    parser.add_argument("--tables-only", action="store_true", help="rebuild the table from --out, run nothing")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1; received {args.runs}")
    args.cases = args.cases.replace(",", " ").split()
    if not args.cases or set(args.cases) - set(CASES):
        parser.error(f"--cases expects some of {', '.join(CASES)}; received {args.cases}")
    return args


# ------------------------------------------------------------------------------------------- running


def lab_up(args: argparse.Namespace, out: Path, workers: int) -> None:
    status, output = run_logged([args.make, "--no-print-directory", "up", f"WORKERS={workers}"],
                                out / "logs" / f"up-{workers}.log", 900)
    if status:
        raise SystemExit(f"make up WORKERS={workers} failed: {error_line(output, status)}")


def docker_out(*cmd: str) -> str:
    return subprocess.run(["docker", *cmd], capture_output=True, text=True, check=False).stdout.strip()


def checkpoint_written(args: argparse.Namespace, name: str) -> bool:
    """Whether the fit of submit `name` wrote its first checkpoint (an epoch ended), read in the lab's volume."""
    (jupyter,) = compose_containers(args.project, "jupyter")[:1] or [None]
    if jupyter is None:
        return False
    done = subprocess.run(["docker", "exec", jupyter, "sh", "-c",
                           f"ls {CHECKPOINTS_IN_VOLUME}/{name}/*/checkpoint.npz"], capture_output=True, check=False)
    return done.returncode == 0


def training_tasks(args: argparse.Namespace) -> int:
    """Chunk tasks of the elastic fit running now, from the driver's own UI inside the submit container (its REST
    API: the active stages whose job description is the fit's, "trainer: ... elastic MIN-MAX"). The job's output
    reaches `make submit` only when it ends, so it cannot time the join."""
    for submit in compose_containers(args.project, "submit")[:1]:
        api = "http://localhost:4040/api/v1/applications"
        try:
            app = json.loads(docker_out("exec", submit, "curl", "-fsS", api))[0]["id"]
            stages = json.loads(docker_out("exec", submit, "curl", "-fsS", f"{api}/{app}/stages?status=active"))
        except (ValueError, LookupError, TypeError):
            return 0
        return sum(int(s.get("numActiveTasks", 0)) for s in stages if "elastic" in (s.get("description") or ""))
    return 0


def disturb(args: argparse.Namespace, case: str, name: str, running: threading.Event, record: dict) -> None:
    """The killed case's kill and the joined case's join, timed on this host's clock (the containers share it)."""
    while running.is_set():
        if case == "killed" and checkpoint_written(args, name):
            victim = compose_containers(args.project, "worker")[0]
            record["disturbed_at"] = time.time()
            docker_out("kill", victim)
            log(f"  killed worker container {victim[:12]} at the first epoch's end")
            return
        if case == "joined" and training_tasks(args) >= 2:
            time.sleep(args.join_after)
            record["disturbed_at"] = time.time()
            status, output = run_logged([args.make, "--no-print-directory", "worker-add"],
                                        Path(args.out) / "logs" / f"{name}-add.log", 600)
            record["add_s"] = round(time.time() - record["disturbed_at"], 1)
            log(f"  worker added ({'ok' if status == 0 else error_line(output, status)}) in {record['add_s']} s")
            return
        time.sleep(0.3)


def run_submit(args: argparse.Namespace, out: Path, run: int, case: str) -> dict:
    name = f"run{run}-{case}"
    job_args = ["--workers", "3", "--min-workers", "1", *shlex.split(args.job_args), "--seed", str(run),
                "--out", f"{RESULTS_IN_VOLUME}/{name}", "--checkpoint-dir", f"{CHECKPOINTS_IN_VOLUME}/{name}"]
    if not (run == 1 and case == "undisturbed"):
        job_args.append("--no-baseline")
    for jupyter in compose_containers(args.project, "jupyter")[:1]:
        subprocess.run(["docker", "exec", jupyter, "rm", "-rf", f"{RESULTS_IN_VOLUME}/{name}",
                        f"{CHECKPOINTS_IN_VOLUME}/{name}"], check=False)
    # compose reads DRIVER_SPARK_CONF from the environment: the driver's spark-defaults.conf (images/entrypoint.sh)
    cmd = ["env", f"DRIVER_SPARK_CONF={DYNAMIC_CONF if case == 'dynamic' else ''}", args.make, "--no-print-directory",
           "submit", "JOB=mnist", f"ARGS={shlex.join(job_args)}", f"OUT={out / 'runs'}"]
    (out / "logs" / f"{name}.log").unlink(missing_ok=True)  # the joined case reads it: this submit's lines only
    record: dict = {"run": run, "case": case, "name": name}
    log(f"run {run}: {case}")
    running = threading.Event()
    running.set()
    watcher = threading.Thread(target=disturb, args=(args, case, name, running, record), daemon=True)
    start = time.monotonic()
    record["started_at"] = time.time()
    watcher.start()
    status, output = run_logged(cmd, out / "logs" / f"{name}.log", args.timeout)
    running.clear()
    watcher.join(timeout=700)
    record.update(status=status, seconds=round(time.monotonic() - start, 1),
                  error=error_line(output, status) if status else "")
    log(f"  {'ok' if status == 0 else 'FAILED: ' + record['error']} in {record['seconds']:.0f} s")
    return record


def run_bench(args: argparse.Namespace, out: Path) -> None:
    journal = out / "submits.jsonl"
    kept = [r for r in read_journal(out, missing_ok=True) if r["case"] not in args.cases]
    journal.write_text("".join(json.dumps(r) + "\n" for r in kept))
    try:
        for run in range(1, args.runs + 1):
            for case in (c for c in CASES if c in args.cases):
                lab_up(args, out, 2 if case == "joined" else 3)
                record = run_submit(args, out, run, case)
                with journal.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
    finally:
        run_logged([args.make, "--no-print-directory", "up", "WORKERS=3"], out / "logs" / "up-3.log", 900)


def read_journal(out: Path, missing_ok: bool = False) -> list[dict]:
    path = out / "submits.jsonl"
    if not path.exists():
        if missing_ok:
            return []
        raise SystemExit(f"{path} is missing: run the bench first (without --tables-only)")
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(records, key=lambda r: (r["run"], CASES.index(r["case"])))


# -------------------------------------------------------------------------------------------- tables


def job_row(out: Path, record: dict) -> dict:
    path = out / "runs" / "lab" / record["name"] / "mnist.json"
    if record.get("status") != 0 or not path.exists():
        return {}
    result = json.loads(path.read_text())
    rows = result["rows"]
    return {"distributed": next((r for r in rows if r["mode"] == "distributed"), {}),
            "keras": next((r for r in rows if r["mode"] != "distributed"), None),
            "dynamic_allocation": result["metadata"].get("dynamic_allocation")}


def case_row(out: Path, record: dict) -> dict:
    """What one submit measured: its fit's wall time, accuracy, and the disturbance's effect."""
    found = job_row(out, record)
    row = found.get("distributed") or {}
    result = {"run": record["run"], "case": record["case"], "fit_s": row.get("time_s"),
              "accuracy": row.get("metric_value"), "algorithm": row.get("algorithm"),
              "error": record.get("error", "") or ("" if row else "no result")}
    if found.get("keras"):
        result["keras_accuracy"] = found["keras"]["metric_value"]
    events = row.get("membership") or []
    rows_by_worker = row.get("rows_by_worker") or {}
    at = record.get("disturbed_at")
    joins = [e for e in events if e["event"] == "joined"]
    result["workers_used"] = len(rows_by_worker)
    if record["case"] == "killed" and at:
        left = [e for e in events if e["event"] == "left" and e["time"] >= at - 1]
        result["noticed_s"] = round(left[0]["time"] - at, 2) if left else None
    if record["case"] == "joined" and at:  # the joiner: a process on neither host of the first two to join
        first = {e["worker"].rsplit(":", 1)[0] for e in joins[:2]}
        late = [e for e in joins[2:] if e["worker"].rsplit(":", 1)[0] not in first]
        result["joiner_ready_s"] = late[0].get("ready_s") if late else None
        result["joiner_rows"] = sum(rows_by_worker.get(e["worker"], 0) for e in late)
    result["dynamic_allocation"] = found.get("dynamic_allocation")
    if record["case"] == "dynamic" and joins:
        result["first_to_last_join_s"] = round(joins[-1]["time"] - joins[0]["time"], 1) if len(joins) > 1 else 0.0
    return result


def table_rows(out: Path) -> list[dict]:
    rows = [case_row(out, r) for r in read_journal(out)]
    undisturbed = {r["run"]: r["fit_s"] for r in rows if r["case"] == "undisturbed" and r["fit_s"]}
    for r in rows:
        if r["case"] != "undisturbed" and r["fit_s"] and undisturbed.get(r["run"]):
            r["vs_undisturbed"] = round(r["fit_s"] / undisturbed[r["run"]], 2)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per case: the runs' figures, run 1 / run 2 / ..."""
    def each(case_rows: list[dict], key: str, digits: int) -> str:
        values = [r.get(key) for r in case_rows]
        return " / ".join("-" if v is None else f"{v:.{digits}f}" for v in values) if any(
            v is not None for v in values) else ""

    out = []
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        if mine:
            out.append({"fit": case, "fit s": each(mine, "fit_s", 1), "vs undisturbed": each(mine, "vs_undisturbed", 2),
                        "noticed s": each(mine, "noticed_s", 2), "joiner ready s": each(mine, "joiner_ready_s", 1),
                        "joiner rows": each(mine, "joiner_rows", 0), "workers used": each(mine, "workers_used", 0),
                        "test accuracy": each(mine, "accuracy", 3)})
    return out


def keras_accuracies(rows: list[dict]) -> list[float]:
    """Plain Keras's test accuracy of each submit that trained it (the first run's undisturbed one)."""
    return [r["keras_accuracy"] for r in rows if r.get("keras_accuracy") is not None]


def report(out: Path, args: argparse.Namespace) -> tuple[str, list[dict]]:
    rows = table_rows(out)
    keras = keras_accuracies(rows)
    columns = ["fit", "fit s", "vs undisturbed", "noticed s", "joiner ready s", "joiner rows", "workers used",
               "test accuracy"]
    reference = f"{statistics.mean(keras):.3f}" if keras else "not run"
    every = ["run", "case", "fit_s", "vs_undisturbed", "noticed_s", "joiner_ready_s", "joiner_rows", "workers_used",
             "first_to_last_join_s", "dynamic_allocation", "accuracy", "keras_accuracy", "algorithm", "error"]
    text = "\n".join([
        "# make bench-lab-elastic", "",
        f"MNIST `{args.job_args}`, `--workers 3 --min-workers 1`, the defaults; {args.runs} run(s) of the four fits; "
        f"plain Keras's test accuracy (run 1, in the driver's container): {reference}.", "",
        markdown(summary(rows), columns), "", "Every submit:", "", markdown(rows, every), ""])
    (out / "bench-lab-elastic.md").write_text(text)
    return text, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.tables_only:
        run_bench(args, out)
    text, rows = report(out, args)
    print(text)
    if not args.tables_only:
        publish_results(args.publish, "bench-lab-elastic", {"job_args": args.job_args,
                                                            "keras_accuracy": keras_accuracies(rows),
                                                            "summary": summary(rows), "runs": rows})
    return 0 if all(not r["error"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
