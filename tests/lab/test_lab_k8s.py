"""The kustomize base and overlays: render offline, validate strictly, and hold the lab's rules."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest
import yaml

from .labtools import REPO, require_tool, run

K8S = REPO / "k8s"
K8S_VERSION = "1.32.0"  # the kubectl installed here; kubernetes-validate checks against its schemas
OVERLAYS = {"default": K8S, "workers-3": K8S / "overlays" / "workers-3", "gpu": K8S / "overlays" / "gpu"}
EXPECTED_KINDS = {
    "Namespace": 1,
    "ConfigMap": 1,
    "PersistentVolumeClaim": 1,
    "Deployment": 2,  # spark-master, jupyter
    "StatefulSet": 1,  # spark-worker
    "Service": 4,  # spark-master, spark-worker (headless), spark-driver (headless), jupyter
}
WORKER_REPLICAS = {"default": 2, "workers-3": 3, "gpu": 2}


def render(path) -> str:
    kubectl = require_tool("kubectl", "install kubectl (1.32 renders kustomize offline)")
    return run([kubectl, "kustomize", str(path)], timeout=120).stdout


@pytest.fixture(scope="module", params=sorted(OVERLAYS), ids=sorted(OVERLAYS))
def rendered(request) -> tuple[str, str, list[dict]]:
    text = render(OVERLAYS[request.param])
    return request.param, text, [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def test_every_kustomization_has_a_usage_header():
    files = sorted(K8S.rglob("kustomization.yaml"))
    assert len(files) >= 4, files
    for path in files:
        head = path.read_text().split("apiVersion:")[0]
        assert head.lstrip().startswith("#") and "Usage:" in head, f"{path} needs a header comment with Usage:"


def test_render_has_the_expected_inventory(rendered):
    name, _, docs = rendered
    assert Counter(d["kind"] for d in docs) == Counter(EXPECTED_KINDS), name
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "trainer-lab", f"{doc['kind']}/{doc['metadata']['name']}"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trainer-lab"


def test_render_passes_kubernetes_validate_strict(rendered, tmp_path):
    name, text, _ = rendered
    tool = require_tool("kubernetes-validate", "pip install the test extra (kubernetes-validate)")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    run([tool, "--strict", "--quiet", "-k", K8S_VERSION, str(path)])


def test_strict_validation_rejects_an_unknown_field(rendered, tmp_path):
    """The check above can fail: one misspelled field makes kubernetes-validate exit non-zero."""
    name, text, _ = rendered
    tool = require_tool("kubernetes-validate", "pip install the test extra (kubernetes-validate)")
    path = tmp_path / f"{name}-broken.yaml"
    path.write_text(text.replace("readinessProbe:", "readynessProbe:", 1))
    proc = subprocess.run([tool, "--strict", "--quiet", "-k", K8S_VERSION, str(path)], capture_output=True)
    assert proc.returncode != 0


def test_worker_replicas(rendered):
    name, _, docs = rendered
    workers = by_kind(docs, "StatefulSet")["spark-worker"]
    assert workers["spec"]["replicas"] == WORKER_REPLICAS[name]
    assert workers["spec"]["serviceName"] == "spark-worker"
    headless = by_kind(docs, "Service")["spark-worker"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True, (
        "workers register with their pod DNS name, which must resolve before they are Ready"
    )


def test_driver_is_reachable_through_a_headless_service(rendered):
    _, _, docs = rendered
    config = by_kind(docs, "ConfigMap")
    (data,) = [c["data"] for c in config.values()]
    driver = by_kind(docs, "Service")[data["SPARK_DRIVER_HOST"]]["spec"]
    assert driver["clusterIP"] == "None", "executors must reach the Jupyter pod itself"
    assert driver["selector"] == by_kind(docs, "Deployment")["jupyter"]["spec"]["selector"]["matchLabels"]
    ports = {p["port"] for p in driver["ports"]}
    assert {int(data["SPARK_DRIVER_PORT"]), int(data["SPARK_BLOCKMANAGER_PORT"]), int(data["TRAINER_PS_PORT"])} <= ports
    assert data["SPARK_DRIVER_BIND_ADDRESS"] == "0.0.0.0"
    assert data["SPARK_MASTER_URL"] == "spark://spark-master:7077" and "spark-master" in by_kind(docs, "Service")


def test_every_container_has_probes_resources_and_runs_non_root(rendered):
    name, _, docs = rendered
    for pod_name, spec in pod_specs(docs).items():
        where = f"{name}:{pod_name}"
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 185, f"{where}: pods run as UID 185, never root"
        for c in spec["containers"]:
            assert c["image"].startswith("trainer-lab:"), f"{where}: one image for every role"
            assert "readinessProbe" in c and "livenessProbe" in c, f"{where}: needs readiness and liveness probes"
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][bound]), f"{where}: cpu/memory {bound}"
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"], where


def test_shared_claim_is_mounted_by_workers_and_jupyter(rendered):
    _, _, docs = rendered
    claim = next(iter(by_kind(docs, "PersistentVolumeClaim")))
    for pod_name in ("spark-worker", "jupyter"):
        spec = pod_specs(docs)[pod_name]
        claims = {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
        assert claims == {claim}, pod_name
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert {"/data", "/checkpoints", "/results"} <= mounts, pod_name


def test_gpu_limit_only_in_the_gpu_overlay(rendered):
    name, _, docs = rendered
    worker = pod_specs(docs)["spark-worker"]["containers"][0]
    limits = worker["resources"]["limits"]
    if name != "gpu":
        assert "nvidia.com/gpu" not in limits, "GPUs are opt-in (k8s/overlays/gpu)"
        return
    assert limits["nvidia.com/gpu"] == 1
    assert worker["image"] == "trainer-lab:gpu"
    worker_conf = {e["name"]: e.get("value", "") for e in worker["env"]}["SPARK_CONF"]
    assert "spark.worker.resource.gpu.amount=1" in worker_conf and "gpu-discovery.sh" in worker_conf
    jupyter = pod_specs(docs)["jupyter"]["containers"][0]
    driver_conf = {e["name"]: e.get("value", "") for e in jupyter["env"]}["SPARK_CONF"]
    assert "spark.executor.resource.gpu.amount=1" in driver_conf and "spark.task.resource.gpu.amount=1" in driver_conf
