"""Lab scripts without Docker: images/install-deps.py and compose/bench_table.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib

import pytest

from .labtools import REPO

PYPROJECT = REPO / "pyproject.toml"


@pytest.fixture(scope="module")
def install_deps():
    """images/install-deps.py: the image installs pyproject.toml's requirements under constraints.txt."""
    spec = importlib.util.spec_from_file_location("install_deps", REPO / "images" / "install-deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_cpu_variant_is_the_dependencies_plus_extras_and_tensorflow_cpu(install_deps, project):
    reqs = install_deps.resolve(PYPROJECT, ["lab", "data"], "cpu")
    extras = project["optional-dependencies"]
    assert set(reqs) == set(project["dependencies"]) | set(extras["tf"]) | set(extras["lab"]) | set(extras["data"])


def test_gpu_variant_takes_the_cuda_extra_and_never_tensorflow_cpu(install_deps, project):
    reqs = install_deps.resolve(PYPROJECT, ["lab", "data"], "gpu")
    assert not any(r.startswith("tensorflow-cpu") for r in reqs), "tensorflow-cpu and tensorflow never together"
    assert set(project["optional-dependencies"]["tf-gpu"]) <= set(reqs)


def test_the_image_installs_with_the_one_constraints_file():
    dockerfile = (REPO / "images" / "Dockerfile").read_text()
    assert "--constraints /opt/trainer/src/constraints.txt" in dockerfile
    assert "==" not in dockerfile, "exact pins live in constraints.txt only"


@pytest.mark.parametrize(
    "extras,variant,message",
    [(["nope"], "cpu", "Unknown extra"), ([], "tpu", "Expected variant")],
    ids=["unknown-extra", "unknown-variant"],
)
def test_bad_arguments_say_what_was_expected(install_deps, extras, variant, message):
    with pytest.raises(ValueError, match=message):
        install_deps.resolve(PYPROJECT, extras, variant)


def test_bench_table_reports_speedup_against_the_smallest_lab(tmp_path):
    root = tmp_path / "bench-cluster"
    for n, epoch in [(1, 10.0), (2, 5.0)]:
        (root / f"workers-{n}").mkdir(parents=True)
        rows = [
            {"mode": "plain keras (1 thread)", "workers": 0, "epoch_time_s": 3.0, "metric_value": 0.9},
            {"mode": "distributed", "workers": n, "epoch_time_s": epoch, "metric_value": 0.8},
        ]
        (root / f"workers-{n}" / "mnist.json").write_text(json.dumps({"metadata": {}, "rows": rows}))
    (tmp_path / "bench-cluster.csv").write_text("workers,seconds\n1,90.0\n2,60.0\n")
    proc = subprocess.run([sys.executable, str(REPO / "compose" / "bench_table.py"), str(root), "1", "2"],
                          capture_output=True, text=True, check=True)
    lines = proc.stdout.strip().splitlines()
    assert lines[2] == "| 1 | 10.00 | 1.00x | 100% | 0.8000 | 90 |"
    assert lines[3] == "| 2 | 5.00 | 2.00x | 100% | 0.8000 | 60 |"


def test_bench_table_fails_when_no_run_left_results(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "compose" / "bench_table.py"), str(tmp_path), "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "missing" in proc.stderr
