"""Lab scripts without Docker: install-deps.py, bench_table.py, lab-secrets.sh and the entrypoint's checks."""

from __future__ import annotations

import importlib.util
import json
import os
import re
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


# --- compose/lab-secrets.sh: the lab's generated secrets ------------------------

SECRETS = REPO / "compose" / "lab-secrets.sh"
ENTRYPOINT = REPO / "images" / "entrypoint.sh"


def secrets_cmd(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run([str(SECRETS), *args], capture_output=True, text=True, env={**base, **(env or {})})


def read_env_file(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def test_secrets_are_generated_once_private_and_random(tmp_path):
    first, other = tmp_path / "a" / "lab-secrets.env", tmp_path / "b.env"
    proc = secrets_cmd("ensure", str(first))
    assert proc.returncode == 0 and proc.stdout.strip() == "generated", proc.stderr
    assert first.stat().st_mode & 0o777 == 0o600
    values = read_env_file(first)
    assert set(values) == {"JUPYTER_TOKEN", "SPARK_AUTH_SECRET"}
    assert re.fullmatch(r"[0-9a-f]{48}", values["JUPYTER_TOKEN"])
    assert re.fullmatch(r"[0-9a-f]{64}", values["SPARK_AUTH_SECRET"])
    again = secrets_cmd("ensure", str(first))
    assert again.returncode == 0 and again.stdout == "", "a later call reuses the file and says nothing"
    assert read_env_file(first) == values
    secrets_cmd("ensure", str(other))
    assert not set(read_env_file(other).values()) & set(values.values()), "every file gets fresh values"


def test_secrets_file_missing_a_value_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "lab-secrets.env"
    path.write_text("JUPYTER_TOKEN=abc\n")
    proc = secrets_cmd("ensure", str(path))
    assert proc.returncode == 2 and "no value for SPARK_AUTH_SECRET" in proc.stderr and "delete the file" in proc.stderr


def test_environment_wins_over_the_secrets_file(tmp_path):
    path = tmp_path / "lab-secrets.env"
    secrets_cmd("ensure", str(path))
    stored = read_env_file(path)
    show = ["sh", "-c", 'echo "$JUPYTER_TOKEN $SPARK_AUTH_SECRET"']
    out = secrets_cmd("with", str(path), *show, env={"JUPYTER_TOKEN": "mine", "SPARK_AUTH_SECRET": ""}).stdout.split()
    assert out == ["mine", stored["SPARK_AUTH_SECRET"]], "a non-empty environment value wins; an empty one does not"
    assert secrets_cmd("get", str(path), "JUPYTER_TOKEN").stdout.strip() == stored["JUPYTER_TOKEN"]
    missing = secrets_cmd("with", str(tmp_path / "none.env"), *show, env={"JUPYTER_TOKEN": "mine"})
    assert missing.returncode == 0 and missing.stdout.split() == ["mine"], "no file: the command runs without it"


@pytest.mark.parametrize("role", ["master", "worker", "jupyter", "submit"])
def test_entrypoint_refuses_spark_roles_without_the_secret(tmp_path, role):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "mnist.py").write_text("raise SystemExit('must not run')\n")
    env = {"PATH": os.environ["PATH"], "SPARK_CONF_DIR": str(tmp_path / "conf"), "TRAINER_JOBS_DIR": str(jobs),
           "JUPYTER_TOKEN": "t" * 24}
    args = [role, "mnist"] if role == "submit" else [role]
    proc = subprocess.run(["bash", str(ENTRYPOINT), *args], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "SPARK_AUTH_SECRET is empty" in proc.stderr, proc.stderr
    assert "SPARK_AUTHENTICATE=false" in proc.stderr, "the message names the explicit opt-out"
    short = subprocess.run(["bash", str(ENTRYPOINT), *args], capture_output=True, text=True, timeout=60,
                           env={**env, "SPARK_AUTH_SECRET": "too short"})
    assert short.returncode == 2 and "at least 16 characters" in short.stderr, short.stderr
    assert "too short" not in short.stderr, "the message never repeats the secret"


def test_entrypoint_refuses_jupyter_without_a_token(tmp_path):
    env = {"PATH": os.environ["PATH"], "SPARK_CONF_DIR": str(tmp_path), "SPARK_AUTH_SECRET": "s" * 32}
    proc = subprocess.run(["bash", str(ENTRYPOINT), "jupyter"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "JUPYTER_TOKEN is empty" in proc.stderr, proc.stderr


# --- the MLflow server: its own venv, its own lock, the entrypoint's checks ------


def pins_of(path) -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    return dict(line.split("==", 1) for line in lines if "==" in line)


def test_mlflow_server_lock_is_the_clients_mlflow_release():
    """The server venv (requirements/mlflow-server.txt) runs the MLflow release the trainer's clients import."""
    client = pins_of(REPO / "constraints.txt")
    server = pins_of(REPO / "requirements" / "mlflow-server.txt")
    assert server["mlflow"] == server["mlflow-skinny"] == client["mlflow-skinny"], (
        f"server mlflow {server.get('mlflow')} vs clients' mlflow-skinny {client.get('mlflow-skinny')}: run make lock"
    )
    assert "mlflow" not in client, "the full mlflow stays out of the trainer's venv (it caps pyarrow)"
    dockerfile = (REPO / "images" / "Dockerfile").read_text()
    assert "requirements/mlflow-server.txt" in dockerfile and "--extras lab,data,mlflow,jax" in dockerfile
    assert "!requirements/mlflow-server.txt" in (REPO / ".dockerignore").read_text().splitlines()


def entrypoint_mlflow(tmp_path, **env) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "MLFLOW_DATA_DIR": str(tmp_path / "store")}
    return subprocess.run(["bash", str(ENTRYPOINT), "mlflow"], capture_output=True, text=True, timeout=60,
                          env={**base, **env})


def test_entrypoint_refuses_a_service_link_as_the_mlflow_port(tmp_path):
    """Kubernetes' service links look like MLFLOW_PORT=tcp://10.0.0.7:5000; a port must be a number."""
    proc = entrypoint_mlflow(tmp_path, MLFLOW_SERVER_PORT="tcp://10.0.0.7:5000")
    assert proc.returncode == 2 and "MLFLOW_SERVER_PORT must be a port number" in proc.stderr, proc.stderr


def test_entrypoint_names_the_missing_mlflow_server(tmp_path):
    proc = entrypoint_mlflow(tmp_path, MLFLOW_SERVER_BIN=str(tmp_path / "none" / "mlflow"))
    assert proc.returncode == 2 and f"no MLflow server at {tmp_path}/none/mlflow" in proc.stderr, proc.stderr
