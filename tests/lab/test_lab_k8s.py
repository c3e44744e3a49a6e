"""The kustomize base and overlays: render offline, validate strictly, and hold the lab's rules."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from .labtools import REPO, require_tool, run

K8S = REPO / "k8s"
K8S_VERSION = "1.32.0"  # the kubectl installed here; kubernetes-validate checks against its schemas
OVERLAYS = {"default": ".", "workers-3": "overlays/workers-3", "gpu": "overlays/gpu",
            "own-secrets": "overlays/own-secrets"}
# The variants whose Secret the Job lab-secrets-init makes in the cluster; own-secrets reads OWN_SECRETS.
IN_CLUSTER = ("default", "workers-3", "gpu")
COMMON_KINDS = {
    "Namespace": 1,
    "PersistentVolumeClaim": 2,  # lab-shared, lab-mlflow
    "Deployment": 3,  # spark-master, jupyter, mlflow
    "StatefulSet": 1,  # spark-worker
    "Service": 5,  # spark-master, spark-worker (headless), spark-driver (headless), jupyter, mlflow
    "NetworkPolicy": 5,  # default-deny-ingress, spark-master, spark-driver, spark-worker, mlflow
}
EXPECTED_KINDS = {
    # lab-config and lab-secrets-init (the Job's script); the Job makes the Secret, with its own
    # ServiceAccount, Role and RoleBinding (lab-secrets-init)
    "in-cluster": {**COMMON_KINDS, "ConfigMap": 2, "Job": 1, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1},
    # lab-config; the Secret from the file, and nothing that may create Secrets
    "own": {**COMMON_KINDS, "ConfigMap": 1, "Secret": 1},
}
WORKER_REPLICAS = {"default": 2, "workers-3": 3, "gpu": 2, "own-secrets": 2}
SECRET_NAME = "lab-secrets"
INIT = "lab-secrets-init"  # the Job, its ServiceAccount, Role, RoleBinding and ConfigMap
INIT_SCRIPT = K8S / "base" / "lab_secrets_init.py"
OWN_SECRETS = Path("components") / "own-secrets" / "lab-secrets.env"  # what `make k8s-secrets` writes, under k8s/
# The form `make k8s-secrets` writes, with fixed test values.
TEST_SECRETS = {"JUPYTER_TOKEN": "test-jupyter-token-0123456789",
                "SPARK_AUTH_SECRET": "test-spark-secret-0123456789abcdef"}
LAB_PEERS = {"app.kubernetes.io/part-of": "trainer-lab"}


def render(path) -> str:
    kubectl = require_tool("kubectl", "install kubectl (1.32 renders kustomize offline)")
    return run([kubectl, "kustomize", str(path)], timeout=120).stdout


@pytest.fixture(scope="module")
def k8s_tree(tmp_path_factory):
    """A copy of k8s/ with test secrets for own-secrets, so that rendering never reads or writes the real ones."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("lab-secrets.env"))
    (tree / OWN_SECRETS).write_text("".join(f"{k}={v}\n" for k, v in TEST_SECRETS.items()))
    return tree


def committed_k8s(dest: Path) -> Path:
    """k8s/ as a fresh clone has it: the files git tracks (their working-tree text), nothing ignored or untracked.

    Taken from the index rather than HEAD so that edits are tested before they are committed;
    a new file counts once it is `git add`ed.
    """
    git = require_tool("git", "install git")
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing tells which files a clone would have")
    listed = run([git, "-C", str(REPO), "ls-files", "-z", "--", "k8s"]).stdout.split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest / "k8s"


@pytest.fixture(scope="module", params=sorted(OVERLAYS), ids=sorted(OVERLAYS))
def rendered(request, k8s_tree) -> tuple[str, str, list[dict]]:
    text = render(k8s_tree / OVERLAYS[request.param])
    return request.param, text, [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")}


def lab_config(docs: list[dict]) -> dict[str, str]:
    """The data of the ConfigMap lab-config-<hash> (the other one holds the Job's script)."""
    (config,) = [c for name, c in by_kind(docs, "ConfigMap").items() if name.startswith("lab-config-")]
    return config["data"]


def mode(name: str) -> str:
    return "in-cluster" if name in IN_CLUSTER else "own"


def assert_secret_init_is_least_privilege(docs: list[dict], where: str) -> None:
    """The Job may get that one Secret and create Secrets, nothing else; no other pod holds a token."""
    (role,) = by_kind(docs, "Role").values()
    assert role["metadata"]["name"] == INIT
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""] and rule["resources"] == ["secrets"], f"{where}: only core Secrets, {rule}"
        assert set(rule["verbs"]) <= {"get", "create"}, f"{where}: no list/watch/update/patch/delete, {rule}"
        if rule["verbs"] != ["create"]:
            assert rule.get("resourceNames") == [SECRET_NAME], f"{where}: get only {SECRET_NAME}, {rule}"
    assert sorted(v for rule in role["rules"] for v in rule["verbs"]) == ["create", "get"], where
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding"), where
    (binding,) = by_kind(docs, "RoleBinding").values()
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": INIT}, where
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": INIT, "namespace": "trainer-lab"}], where
    assert set(by_kind(docs, "ServiceAccount")) == {INIT}, where
    job = by_kind(docs, "Job")[INIT]["spec"]["template"]["spec"]
    assert job["serviceAccountName"] == INIT and job["automountServiceAccountToken"] is True, where
    for pod_name, spec in pod_specs(docs).items():
        assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec, (
            f"{where}:{pod_name}: only the Job talks to the API server"
        )


def test_every_kustomization_has_a_usage_header():
    files = sorted(K8S.rglob("kustomization.yaml"))
    assert len(files) >= 4, files
    for path in files:
        head = path.read_text().split("apiVersion:")[0]
        assert head.lstrip().startswith("#") and "Usage:" in head, f"{path} needs a header comment with Usage:"


def test_fresh_clone_renders_with_the_secret_made_in_the_cluster(tmp_path):
    """`kubectl apply -k k8s/` works with nothing run before it, and nothing secret is committed."""
    tree = committed_k8s(tmp_path)
    assert not (tree / OWN_SECRETS).exists() and not (tree / "base" / "lab-secrets.env").exists()
    # Values that must never be in the repository: the real ones, when this checkout has any.
    local = {REPO / "k8s" / OWN_SECRETS, REPO / "k8s" / "base" / "lab-secrets.env",
             REPO / "compose" / "lab-secrets.env"}
    values = [line.split("=", 1)[1] for path in local if path.is_file()
              for line in path.read_text().splitlines() if re.match(r"(JUPYTER_TOKEN|SPARK_AUTH_SECRET)=.", line)]
    for name in IN_CLUSTER:
        text = render(tree / OVERLAYS[name])
        docs = [d for d in yaml.safe_load_all(text) if d]
        assert Counter(d["kind"] for d in docs) == Counter(EXPECTED_KINDS["in-cluster"]), name
        assert not by_kind(docs, "Secret"), f"{name}: the Secret is made in the cluster, never rendered"
        for kind in ("Job", "ServiceAccount", "Role", "RoleBinding"):
            assert INIT in by_kind(docs, kind), f"{name}: {kind} {INIT} makes the Secret"
        assert_secret_init_is_least_privilege(docs, name)
        for value in values:
            assert value not in text, f"{name}: a local secret value is in the committed manifests"
        # Generated values are 48 or 64 hex digits; kustomize's name hashes are 10 characters.
        assert not re.search(r"(?<!sha256:)\b[0-9a-f]{32,}\b", text), f"{name}: a committed value that looks generated"
        assert "JUPYTER_TOKEN=" not in text and "SPARK_AUTH_SECRET=" not in text, name


def test_own_secrets_need_the_file_and_git_ignores_it(tmp_path):
    """Without the file `make k8s-secrets` writes, own-secrets refuses to render: no Secret by accident."""
    kubectl = require_tool("kubectl", "install kubectl (1.32 renders kustomize offline)")
    tree = committed_k8s(tmp_path)
    proc = subprocess.run([kubectl, "kustomize", str(tree / OVERLAYS["own-secrets"])], capture_output=True, text=True)
    assert proc.returncode != 0 and "lab-secrets.env" in proc.stderr, proc.stderr
    git = require_tool("git", "install git")
    for path in (f"k8s/{OWN_SECRETS}", "k8s/base/lab-secrets.env"):
        ignored = subprocess.run([git, "-C", str(REPO), "check-ignore", "-q", "--no-index", path])
        assert ignored.returncode == 0, f"{path} must stay out of git (a .gitignore)"


def test_render_has_the_expected_inventory(rendered):
    name, _, docs = rendered
    assert Counter(d["kind"] for d in docs) == Counter(EXPECTED_KINDS[mode(name)]), name
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
    assert lab_config(docs)["TRAINER_WORKERS"] == str(WORKER_REPLICAS[name]), (
        "the notebooks train on TRAINER_WORKERS workers: an overlay that changes the replicas changes it too")
    assert workers["spec"]["serviceName"] == "spark-worker"
    headless = by_kind(docs, "Service")["spark-worker"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True, (
        "workers register with their pod DNS name, which must resolve before they are Ready"
    )


def test_driver_is_reachable_through_a_headless_service(rendered):
    _, _, docs = rendered
    data = lab_config(docs)
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


def claims_of(spec: dict) -> set[str]:
    return {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}


def test_shared_claim_is_mounted_by_workers_and_jupyter(rendered):
    _, _, docs = rendered
    assert set(by_kind(docs, "PersistentVolumeClaim")) == {"lab-shared", "lab-mlflow"}
    for pod_name in ("spark-worker", "jupyter"):
        spec = pod_specs(docs)[pod_name]
        assert claims_of(spec) == {"lab-shared"}, pod_name
        mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert {"/data", "/checkpoints", "/results"} <= mounts, pod_name
    assert claims_of(pod_specs(docs)["mlflow"]) == {"lab-mlflow"}, "only the MLflow server mounts its store"
    assert not claims_of(pod_specs(docs)["spark-master"])
    # Jupyter's folder ($HOME/work, images/entrypoint.sh) is on the claim: a user's notebooks outlive the pod.
    jupyter = pod_specs(docs)["jupyter"]
    (work,) = [m for m in jupyter["containers"][0]["volumeMounts"] if m["mountPath"] == "/home/spark/work"]
    assert work["name"] == "shared" and work["subPath"] == "notebooks", work


def test_mlflow_server_is_the_tracking_uri_of_the_lab(rendered):
    """Jupyter logs to the Service `mlflow`; the server gets no secret; no service links (MLFLOW_PORT)."""
    name, _, docs = rendered
    jupyter = pod_specs(docs)["jupyter"]["containers"][0]
    uri = {e["name"]: e.get("value") for e in jupyter["env"]}["MLFLOW_TRACKING_URI"]
    service = by_kind(docs, "Service")["mlflow"]["spec"]
    assert uri == f"http://mlflow:{service['ports'][0]['port']}" == "http://mlflow:5000", uri
    deployment = by_kind(docs, "Deployment")["mlflow"]
    assert service["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate", (
        "one SQLite writer at a time"
    )
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"] == ["mlflow"] and container["ports"] == [{"name": "http", "containerPort": 5000}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp", "/home/spark", "/mlflow"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health", f"{probe}: the path MLflow's Host check exempts"
    assert "envFrom" not in container and {e["name"] for e in container["env"]} == {"MLFLOW_LOCAL_HOSTNAMES"}, (
        "the server gets neither the Spark secret nor the Jupyter token"
    )
    for pod_name in ("mlflow", "jupyter"):
        assert pod_specs(docs)[pod_name]["enableServiceLinks"] is False, (
            f"{name}:{pod_name}: the Service `mlflow` would set MLFLOW_PORT=tcp://..., which MLflow's CLI reads"
        )
    config = lab_config(docs)
    assert "MLFLOW_TRACKING_URI" not in config, "the master and the workers log nothing (as in compose)"
    assert config["MLFLOW_LOCAL_HOSTNAMES"] == ""


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


def test_spark_secret_and_token_come_from_the_secret(rendered):
    """Every Spark pod gets SPARK_AUTH_SECRET, Jupyter also JUPYTER_TOKEN, by reference to the Secret lab-secrets."""
    name, text, docs = rendered
    secret_name = SECRET_NAME
    if mode(name) == "own":
        secret = by_kind(docs, "Secret")[secret_name]
        assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == TEST_SECRETS
    else:
        job = by_kind(docs, "Job")[INIT]["spec"]["template"]["spec"]["containers"][0]
        assert {e["name"]: e.get("value") for e in job["env"]}["LAB_SECRET_NAME"] == secret_name, (
            "the Job must make the Secret the pods reference"
        )
    wanted = {"spark-master": {"SPARK_AUTH_SECRET"}, "spark-worker": {"SPARK_AUTH_SECRET"},
              "jupyter": {"SPARK_AUTH_SECRET", "JUPYTER_TOKEN"}, "mlflow": set()}
    for pod_name, spec in pod_specs(docs).items():
        env = {e["name"]: e for e in spec["containers"][0].get("env", [])}
        for key in wanted[pod_name]:
            ref = env[key].get("valueFrom", {}).get("secretKeyRef")
            assert ref == {"name": secret_name, "key": key}, f"{name}:{pod_name}: {key} must come from the Secret"
        assert "JUPYTER_TOKEN" in env or pod_name != "jupyter"
        assert pod_name == "jupyter" or "JUPYTER_TOKEN" not in env, f"{pod_name} has no use for the Jupyter token"
        refs = {e["name"] for e in env.values() if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs == wanted[pod_name], f"{name}:{pod_name}: secrets {refs}"
    for config in by_kind(docs, "ConfigMap").values():
        assert not {"JUPYTER_TOKEN", "SPARK_AUTH_SECRET"} & set(config["data"]), "secrets never go in a ConfigMap"
    for value in TEST_SECRETS.values():
        assert value not in text, "the Secret's values appear only base64-encoded in the Secret"


def test_secret_init_job_is_least_privilege_and_non_root(rendered):
    """The Job that makes the Secret: its script, its narrow Role, the lab's pod security; own-secrets drops it all."""
    name, _, docs = rendered
    if mode(name) == "own":
        for kind in ("Job", "ServiceAccount", "Role", "RoleBinding"):
            assert not by_kind(docs, kind), f"{name}: with your values nothing may create Secrets ({kind})"
        assert not [c for c in by_kind(docs, "ConfigMap") if c.startswith(INIT)], name
        return
    assert_secret_init_is_least_privilege(docs, name)
    job = by_kind(docs, "Job")[INIT]["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never" and job["backoffLimit"] >= 1
    assert 0 < job["ttlSecondsAfterFinished"] <= 600, "gone soon after, so that the next apply may change its image"
    spec = job["template"]["spec"]
    sc = spec["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 185, f"{name}: the Job runs as UID 185, never root"
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    worker_image = pod_specs(docs)["spark-worker"]["containers"][0]["image"]
    assert container["image"] == worker_image, f"{name}: the lab image, already on the nodes; no other pull"
    csc = container["securityContext"]
    assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"]
    assert csc["readOnlyRootFilesystem"] is True
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][bound]), f"{name}: cpu/memory {bound}"
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    script = by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"]
    assert script == {INIT_SCRIPT.name: INIT_SCRIPT.read_text()}, "the ConfigMap carries k8s/base/lab_secrets_init.py"
    assert container["args"] == ["python3", f"{mount['mountPath']}/{INIT_SCRIPT.name}"]
    labels = job["template"]["metadata"]["labels"]
    selecting = [p_name for p_name, p in by_kind(docs, "NetworkPolicy").items()
                 if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()]
    assert selecting == ["default-deny-ingress"], f"{name}: the Job listens on nothing; only default-deny selects it"


def test_jupyter_probes_send_a_local_host_header(rendered):
    """allow_remote_access is off: Jupyter answers 403 to the pod IP the kubelet would send as Host."""
    _, _, docs = rendered
    jupyter = pod_specs(docs)["jupyter"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        headers = jupyter[probe]["httpGet"].get("httpHeaders", [])
        assert {"name": "Host", "value": "localhost"} in headers, f"{probe} needs Host: localhost"


def allowed_ports(rule: dict) -> set[int] | None:
    """The TCP ports one ingress rule opens; None means every port."""
    if "ports" not in rule:
        return None
    ports = set()
    for p in rule["ports"]:
        assert p.get("protocol", "TCP") == "TCP"
        ports |= set(range(p["port"], p.get("endPort", p["port"]) + 1))
    return ports


def test_network_policies_admit_only_the_labs_pods(rendered):
    name, _, docs = rendered
    policies = by_kind(docs, "NetworkPolicy")
    deny = policies["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and not deny.get("ingress"), (
        "every pod of the namespace must deny ingress unless a policy below allows it"
    )
    data = lab_config(docs)
    ps = int(data["TRAINER_PS_PORT"])
    expected = {
        "spark-master": {int(data["SPARK_MASTER_PORT"]), int(data["SPARK_MASTER_WEBUI_PORT"])},
        "jupyter": {int(data["SPARK_DRIVER_PORT"]), int(data["SPARK_BLOCKMANAGER_PORT"]), *range(ps, ps + 10)},
        "spark-worker": None,  # worker RPC and executor block managers use ephemeral ports
        "mlflow": {5000},  # Jupyter's fits log there (http://mlflow:5000)
    }
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    for pod_name, labels in pods.items():
        assert LAB_PEERS.items() <= labels.items(), f"{name}:{pod_name}: the policies admit peers by {LAB_PEERS}"
        selecting = [p for p_name, p in policies.items() if p_name != "default-deny-ingress"
                     and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert len(selecting) == 1, f"{name}:{pod_name}: expected one allow policy, got {len(selecting)}"
        (rule,) = selecting[0]["spec"]["ingress"]
        assert rule["from"] == [{"podSelector": {"matchLabels": LAB_PEERS}}], (
            f"{name}:{pod_name}: only the lab's pods of this namespace may connect (no namespaceSelector, no ipBlock)"
        )
        assert allowed_ports(rule) == expected[pod_name], f"{name}:{pod_name}: ports {allowed_ports(rule)}"
    assert 8888 not in expected["jupyter"], "Jupyter is reached through kubectl port-forward, not from pods"
