"""The wheel, installed into a fresh venv with the constraints, runs a 2-worker fit through its installed command.

This is what a user does: ``pip install 'spark_keras_trainer-<version>-py3-none-any.whl[jax]'``, then
``spark-keras-trainer train model ...``, from a folder that holds no source
of this project. The JAX extra, not ``[tf]``: the test is of the wheel (its packages, metadata and command), and
JAX is the backend quickest to install (about a third of TensorFlow's size on disk); the driver's
``KERAS_BACKEND=jax`` reaches every task as a user's would. pip takes the wheels from its cache (no download once the
dev venv was built on this machine). The run goes to the session's drivers
cluster (tests/conftest.py), whose executors run the driver's Python, the
venv's, and so import the installed ``trainer``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

MODEL = '''
import keras


def build():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
'''


def _run(cmd: list, log: Path, **kwargs) -> str:
    proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **kwargs)
    log.write_text(proc.stdout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-5000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """This checkout built as a wheel (what `make dist` does), outside the source tree."""
    out = tmp_path_factory.mktemp("dist")
    # From a copy: setuptools reuses the checkout's build/lib, whose stale modules would hide a missing package.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("trainer", "jobs", "benchmarks"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, source], out / "build.log",
         timeout=600)
    (wheel,) = out.glob("spark_keras_trainer-*-py3-none-any.whl")
    return wheel


def test_wheel_holds_the_library_the_jobs_the_benchmarks_and_the_command(wheel):
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    # Every module of the source tree, sub-packages included (a package missing from pyproject's list once
    # shipped an image whose all-reduce could not import trainer.runtime.collective).
    sources = {str(p.relative_to(REPO)) for p in (REPO / "trainer").rglob("*.py")}
    for folder, package in (("jobs", "trainer_jobs"), ("benchmarks", "trainer_benchmarks")):
        sources |= {f"{package}/{p.relative_to(REPO / folder)}" for p in (REPO / folder).rglob("*.py")}
    assert sources - set(names) == set()
    assert not any(n.startswith(("tests/", "images/")) for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "spark-keras-trainer = trainer.cli:main" in meta


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_wheel_in_a_fresh_venv_runs_a_2_worker_fit(wheel, drivers_cluster, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python, command = env_dir / "bin" / "python", env_dir / "bin" / "spark-keras-trainer"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME")}
    clean["KERAS_BACKEND"] = "jax"
    # --no-compile: no bytecode for the thousands of modules of JAX and the rest that the fit never imports
    # (Python compiles what it imports); what is checked is the wheel, its dependencies and its command
    _run([python, "-m", "pip", "install", "--quiet", "--no-compile", "-c", REPO / "constraints.txt",
          f"{wheel}[jax]"],
         tmp_path / "pip.log", env=clean, timeout=900)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 8)).astype(np.float32)
    label = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"features": list(x), "label": label}), tmp_path / "train.parquet")
    (tmp_path / "my_model.py").write_text(MODEL)

    work = tmp_path / "work"  # no source of this project here: the venv's trainer must be the one used
    work.mkdir()
    probe = _run([python, "-c", "import trainer, trainer_jobs, trainer_benchmarks; "
                                 "print(trainer.__file__)"], tmp_path / "probe.log",
                 cwd=work, env=clean)
    assert str(env_dir) in probe and str(REPO) not in probe
    out = _run([command, "train", "model", "--model", tmp_path / "my_model.py:build", "--data",
                tmp_path / "train.parquet", "--validation", tmp_path / "train.parquet", "--workers", "2",
                "--master", drivers_cluster.master_url,
                "--epochs", "2", "--batch-size", "16", "--save", tmp_path / "fitted"],
               tmp_path / "train.log", cwd=work, env=clean, timeout=900)
    assert "validation: loss" in out, out
    history = json.loads((tmp_path / "fitted" / "history.json").read_text())
    assert history["num_workers"] == 2 and len(history["epochs"]) == 2
    assert {w["worker"] for w in history["workers"]} == {0, 1}
    assert {w["backend"] for w in history["workers"]} == {"jax"}, "every task runs the driver's backend"
    assert (tmp_path / "fitted" / "model.keras").stat().st_size > 0
