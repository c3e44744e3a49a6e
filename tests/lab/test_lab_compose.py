"""The compose files: schema-valid for v1 and v2, and free of the usual cluster traps."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from .labtools import REPO, require_tool, run

COMPOSE = REPO / "compose" / "compose.yaml"
GPU = REPO / "compose" / "gpu.yaml"
SPARK_ROLES = ("master", "worker", "jupyter", "submit")
SERVICES = (*SPARK_ROLES, "mlflow")
DRIVERS = ("jupyter", "submit")
TRACKING_URI = "http://mlflow:5000"


@pytest.fixture(scope="module")
def spec() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def gpu() -> dict:
    return yaml.safe_load(GPU.read_text())


@pytest.mark.parametrize("path", [COMPOSE, GPU], ids=["compose.yaml", "gpu.yaml"])
def test_compose_file_matches_the_compose_spec_schema(path):
    tool = require_tool("check-jsonschema", "pip install the test extra (check-jsonschema)")
    run([tool, "--builtin-schema", "vendor.compose-spec", str(path)])


def test_schema_check_rejects_a_broken_file(tmp_path):
    """The schema check above can fail: an unknown service key is an error."""
    tool = require_tool("check-jsonschema", "pip install the test extra (check-jsonschema)")
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  worker:\n    image: x\n    replica_count: 3\n")
    proc = subprocess.run([tool, "--builtin-schema", "vendor.compose-spec", str(broken)], capture_output=True)
    assert proc.returncode != 0


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, GPU]], ids=["cpu", "gpu"])
def test_docker_compose_config_accepts_the_files(files):
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose (v1) is not installed; the schema check above still ran")
    args = [a for f in files for a in ("-f", str(f))]
    env = {"PATH": os.environ["PATH"], "SPARK_AUTH_SECRET": "s" * 32, "JUPYTER_TOKEN": "t" * 24}
    out = run(["docker-compose", "-p", "trainer-lab", *args, "config"], env=env).stdout
    config = yaml.safe_load(out)
    assert set(config["services"]) == set(SERVICES)
    # The resolved file (merge keys, overrides) keeps the hardening and the secrets.
    for name, svc in config["services"].items():
        assert svc["cap_drop"] == ["ALL"] and svc["security_opt"] == ["no-new-privileges:true"], name
        if name in SPARK_ROLES:
            assert svc["environment"]["SPARK_AUTH_SECRET"] == "s" * 32, name
        else:
            assert "s" * 32 not in str(svc) and "t" * 24 not in str(svc), f"{name} gets no secret"
        assert all(":7077" not in str(p) for p in svc.get("ports", [])), name
    assert config["services"]["jupyter"]["environment"]["JUPYTER_TOKEN"] == "t" * 24
    for name in DRIVERS:  # merged from the x-driver-env anchor, also under the GPU override
        assert config["services"][name]["environment"]["MLFLOW_TRACKING_URI"] == TRACKING_URI, name


def test_services_share_one_image(spec):
    images = {name: svc["image"] for name, svc in spec["services"].items()}
    assert len(set(images.values())) == 1, f"every role must run the same image: {images}"
    assert {svc["command"][0] for svc in spec["services"].values()} == set(SERVICES)


def test_worker_service_can_scale(spec):
    worker = spec["services"]["worker"]
    assert "container_name" not in worker, "a fixed container_name breaks --scale worker=N"
    assert "ports" not in worker, "published host ports break --scale worker=N"
    assert worker["restart"] == "unless-stopped"
    assert "master" in worker["depends_on"]
    env = worker["environment"]
    assert env["SPARK_WORKER_CORES"].startswith("${WORKER_CORES")
    assert env["SPARK_WORKER_MEMORY"].startswith("${WORKER_MEMORY")


def test_master_jupyter_and_mlflow_publish_their_uis_only(spec):
    master_ports = spec["services"]["master"]["ports"]
    assert master_ports == ["${LAB_BIND:-127.0.0.1}:${SPARK_UI_PORT:-8080}:8080"], (
        "the master publishes its UI only: RPC 7077 must stay inside the lab network"
    )
    assert spec["services"]["jupyter"]["ports"] == ["${LAB_BIND:-127.0.0.1}:${JUPYTER_HOST_PORT:-8888}:8888"]
    assert spec["services"]["mlflow"]["ports"] == ["${LAB_BIND:-127.0.0.1}:${MLFLOW_HOST_PORT:-5000}:5000"], (
        "the MLflow UI is published on LAB_BIND like the other UIs"
    )
    published = {name for name, svc in spec["services"].items() if svc.get("ports")}
    assert published == {"master", "jupyter", "mlflow"}, "workers and submit publish nothing"
    example = (REPO / "compose" / ".env.example").read_text()
    assert "MLFLOW_HOST_PORT=5000" in example and "MLFLOW_LOCAL_HOSTNAMES=" in example
    assert "7077" not in (REPO / "compose" / ".env.example").read_text(), "SPARK_RPC_PORT is gone"


def test_every_container_drops_all_capabilities(spec):
    for name, svc in spec["services"].items():
        assert svc.get("cap_drop") == ["ALL"], f"{name}: UID 185 needs no capability"
        assert svc.get("security_opt") == ["no-new-privileges:true"], f"{name}: no setuid escalation"
        for key in ("cap_add", "privileged", "user", "pid", "ipc", "network_mode"):
            assert key not in svc, f"{name}: {key} would undo the isolation (the image's USER 185 stays)"


def test_spark_roles_get_the_secret_and_only_jupyter_the_token(spec):
    for name in SPARK_ROLES:
        env = spec["services"][name]["environment"]
        assert env["SPARK_AUTH_SECRET"] == "${SPARK_AUTH_SECRET:-}", (
            f"{name}: the secret comes from the environment (make up loads compose/lab-secrets.env)"
        )
        assert ("JUPYTER_TOKEN" in env) == (name == "jupyter"), f"{name}: the Jupyter token only where Jupyter runs"
    jupyter = spec["services"]["jupyter"]["environment"]
    assert jupyter["JUPYTER_TOKEN"] == "${JUPYTER_TOKEN:-}", "no fixed default token"
    assert jupyter["JUPYTER_LOCAL_HOSTNAMES"] == "${JUPYTER_LOCAL_HOSTNAMES:-}"
    example = (REPO / "compose" / ".env.example").read_text()
    assert "JUPYTER_TOKEN=" not in example and "SPARK_AUTH_SECRET=" not in example, (
        "secrets live in the generated compose/lab-secrets.env, not in the settings example"
    )
    assert "compose/lab-secrets.env" in (REPO / ".gitignore").read_text().splitlines()


def test_every_long_running_service_has_a_healthcheck(spec):
    for name in ("master", "worker", "jupyter", "mlflow"):
        check = spec["services"][name].get("healthcheck")
        assert check and check["test"][0] == "CMD", f"{name} needs a healthcheck"


def test_jupyter_is_a_driver_the_executors_reach(spec):
    env = spec["services"]["jupyter"]["environment"]
    assert spec["services"]["jupyter"]["hostname"] == "jupyter"
    assert env["SPARK_DRIVER_HOST"] == "jupyter", "executors resolve the driver by its service name"
    assert env["SPARK_DRIVER_BIND_ADDRESS"] == "0.0.0.0"
    assert env["SPARK_DRIVER_PORT"] == "7078" and env["SPARK_BLOCKMANAGER_PORT"] == "7079", "fixed driver ports"
    assert env["TRAINER_PS_HOST"] == "jupyter" and env["TRAINER_PS_PORT"] == "7100"


def test_shared_volumes_for_data_checkpoints_results(spec):
    assert set(spec["volumes"]) == {"data", "checkpoints", "results", "mlflow", "notebooks"}
    assert "notebooks:/home/spark/work" in spec["services"]["jupyter"]["volumes"], "a user's notebooks outlive Jupyter"
    assert spec["services"]["jupyter"]["environment"]["TRAINER_WORKERS"] == "${TRAINER_WORKERS:-2}", (
        "the notebooks read the lab's worker count from TRAINER_WORKERS (make up passes WORKERS)")
    for name in ("worker", "jupyter", "submit"):
        mounts = spec["services"][name]["volumes"]
        assert {"data:/data", "checkpoints:/checkpoints", "results:/results"} <= set(mounts), name
        assert not any(m.startswith("mlflow:") for m in mounts), f"{name}: artifacts go through the MLflow server"
    assert spec["services"]["mlflow"]["volumes"] == ["mlflow:/mlflow"], "MLflow keeps its store on a volume of its own"


def test_mlflow_is_the_labs_tracking_server(spec):
    """Drivers log to http://mlflow:5000 by default; the server needs no secret and starts before them."""
    mlflow = spec["services"]["mlflow"]
    assert mlflow["command"] == ["mlflow"] and mlflow["hostname"] == "mlflow"
    assert mlflow["restart"] == "unless-stopped"
    assert "/health" in " ".join(mlflow["healthcheck"]["test"])
    assert mlflow["environment"] == {"MLFLOW_LOCAL_HOSTNAMES": "${MLFLOW_LOCAL_HOSTNAMES:-}"}, (
        "MLflow gets neither the Spark secret nor the Jupyter token"
    )
    for name in DRIVERS:
        svc = spec["services"][name]
        assert svc["environment"]["MLFLOW_TRACKING_URI"] == TRACKING_URI, f"{name} logs to the lab's server"
        assert "mlflow" in svc["depends_on"], f"{name} starts the server with it"
    for name in ("master", "worker"):
        assert "MLFLOW_TRACKING_URI" not in spec["services"][name]["environment"], f"{name} logs nothing"


def test_submit_is_a_one_off_tool(spec):
    assert spec["services"]["submit"]["profiles"] == ["tools"], "`up` must not start the submit container"


def test_gpu_override_reserves_nvidia_gpus_and_tells_spark(gpu):
    worker = gpu["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    conf = worker["environment"]["SPARK_CONF"]
    assert "spark.worker.resource.gpu.amount=1" in conf
    assert "spark.worker.resource.gpu.discoveryScript=/opt/trainer/bin/gpu-discovery.sh" in conf
    for driver in ("jupyter", "submit"):
        conf = gpu["services"][driver]["environment"]["SPARK_CONF"]
        assert "spark.executor.resource.gpu.amount=1" in conf and "spark.task.resource.gpu.amount=1" in conf
