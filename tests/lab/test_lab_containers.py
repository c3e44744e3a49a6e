"""End-to-end tests of the lab with the real Docker engine.

Order matters and is kept by pytest's file order: image checks, then the lab
(`make up WORKERS=3`, brought up once per session), and last `make down`.
Artifacts (timings, logs, screenshots, the executed notebook) go to
test-artifacts/.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time

import pytest

from .labtools import (ARTIFACTS, LAB_HOSTNAME, LAB_PROJECT, LAB_WORKERS, REPO, dominant_colour_share, http_get,
                       http_post_json, run, screenshot, visible_text)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2700)]


def docker_run(image: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run(["docker", "run", "--rm", image, *args], timeout=timeout, check=False)


# --- the image ---------------------------------------------------------------


def test_image_runs_as_fixed_non_root_uid_under_tini(lab_image):
    proc = docker_run(lab_image.image, "bash", "-c", "id -u; id -g; tr '\\0' ' ' </proc/1/cmdline")
    uid, gid, pid1 = proc.stdout.splitlines()
    assert uid == "185", "the image must run as the fixed non-root UID 185 (Spark images' convention)"
    assert gid == "185"
    assert "tini" in pid1, f"tini must be PID 1 to reap zombies and forward signals, got {pid1!r}"


def test_image_has_matching_python_spark_java(lab_image):
    script = (
        "import sys, pyspark, keras, tensorflow, trainer, os;"
        "print(sys.version_info[:2], pyspark.__version__, keras.__version__, tensorflow.__version__);"
        "print(os.environ['PYSPARK_PYTHON'], sys.executable)"
    )
    proc = docker_run(lab_image.image, "python", "-c", script, timeout=180)
    assert proc.returncode == 0, proc.stderr
    versions, pythons = proc.stdout.strip().splitlines()[-2:]
    lines = [line.split("#")[0].strip() for line in (REPO / "constraints.txt").read_text().splitlines()]
    pins = dict(line.split("==", 1) for line in lines if "==" in line)
    expected = f"(3, 11) {pins['pyspark']} {pins['keras']} {pins['tensorflow-cpu']}"
    assert versions == expected, f"the image must hold the pins of constraints.txt: {versions} != {expected}"
    py, exe = pythons.split()
    assert py == exe == "/opt/venv/bin/python", "executors must run the driver's venv python"
    java = docker_run(lab_image.image, "java", "-version")
    assert 'version "17' in java.stderr, java.stderr


def test_gpu_discovery_without_gpu_prints_empty_resource(lab_image):
    proc = docker_run(lab_image.image, "/opt/trainer/bin/gpu-discovery.sh")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"name": "gpu", "addresses": []}
    assert "nvidia-smi not found" in proc.stderr


def test_submit_unknown_job_names_the_available_ones(lab_image):
    proc = docker_run(lab_image.image, "submit", "no-such-job")
    assert proc.returncode == 2
    assert "no job 'no-such-job'" in proc.stderr and "/opt/trainer/jobs/no-such-job.py" in proc.stderr


# --- the running lab ----------------------------------------------------------


def test_make_up_generates_the_secrets_once_and_prints_the_urls(lab):
    assert f"{LAB_WORKERS} ALIVE worker(s)" in lab.up_output
    assert f"Spark UI: {lab.ui_url}" in lab.up_output
    assert f"MLflow:   {lab.mlflow_url}  (no login" in lab.up_output
    assert "generated a Jupyter token and a Spark secret" in lab.up_output, "the first `make up` creates the file"
    # The test's JUPYTER_TOKEN (environment) wins over the generated one, so no token is printed.
    assert f"Jupyter:  {lab.jupyter_url}/lab  (token: your JUPYTER_TOKEN)" in lab.up_output
    assert lab.secrets_file.stat().st_mode & 0o777 == 0o600, "the secrets file must be private"
    lines = lab.secrets_file.read_text().splitlines()
    stored = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    assert set(stored) == {"JUPYTER_TOKEN", "SPARK_AUTH_SECRET"} and all(len(v) >= 32 for v in stored.values())
    assert lab.secret("SPARK_AUTH_SECRET") == stored["SPARK_AUTH_SECRET"] and lab.secret("JUPYTER_TOKEN") == lab.token
    for value in (*stored.values(), lab.token):
        assert value not in lab.up_output, "make up must not print a secret it did not just generate for the user"


def test_master_rpc_port_is_not_published_on_the_host(lab):
    ports = lab.compose("port", "master", "7077", check=False)
    assert not ports.stdout.strip() or ports.stdout.strip() == ":0", f"7077 is published: {ports.stdout}"
    inspect = ["docker", "inspect", "-f", "{{json .NetworkSettings.Ports}}", lab.container_id("master")]
    published = json.loads(run(inspect).stdout)
    assert published.get("7077/tcp") is None, f"the master's RPC port must stay inside the lab network: {published}"
    assert published["8080/tcp"][0]["HostIp"] == "127.0.0.1", "the UI is published on LAB_BIND only"
    inspect[-1] = lab.container_id("mlflow")
    published = json.loads(run(inspect).stdout)
    bindings = [(p["HostIp"], p["HostPort"]) for p in published["5000/tcp"]]
    assert bindings == [("127.0.0.1", lab.env["MLFLOW_HOST_PORT"])], (
        f"the MLflow UI is published on LAB_BIND only, on MLFLOW_HOST_PORT: {published}"
    )


def test_lab_containers_run_as_uid_185_under_tini_without_capabilities(lab):
    for name, cid in lab.container_ids("master", "worker", "jupyter", "mlflow").items():
        info = json.loads(run(["docker", "inspect", cid]).stdout)[0]
        assert info["HostConfig"]["CapDrop"] == ["ALL"] and not info["HostConfig"]["CapAdd"], name
        assert "no-new-privileges:true" in info["HostConfig"]["SecurityOpt"], name
        assert info["HostConfig"]["Privileged"] is False, name
        script = "id -u; tr '\\0' ' ' </proc/1/cmdline; echo; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/1/status"
        status = run(["docker", "exec", cid, "bash", "-c", script]).stdout
        uid, pid1, *caps = status.splitlines()
        assert uid == "185" and "tini" in pid1, f"{name}: uid {uid}, PID 1 {pid1!r}"
        fields = dict(line.split(":", 1) for line in caps)
        assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0, f"{name}: {fields}"
        assert fields["NoNewPrivs"].strip() == "1", name


def test_master_json_reports_three_alive_workers(lab):
    status, body = http_get(f"{lab.ui_url}/json/")
    assert status == 200
    state = json.loads(body)
    alive = [w for w in state["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == LAB_WORKERS, f"expected {LAB_WORKERS} ALIVE workers, master says: {state['workers']}"
    assert state["aliveworkers"] == LAB_WORKERS
    assert all(w["cores"] == 1 for w in alive), "WORKER_CORES defaults to 1"
    assert all(w["memory"] >= 1024 for w in alive), "workers need >= 1 GiB"
    assert len({w["host"] for w in alive}) == LAB_WORKERS, "each worker must register its own address"


def test_jupyter_answers_http_and_requires_the_token(lab):
    status, body = http_get(f"{lab.jupyter_url}/api")
    assert status == 200 and "version" in json.loads(body)
    status, _ = http_get(f"{lab.jupyter_url}/api/contents")
    assert status == 403, "Jupyter must refuse requests without the token"
    status, _ = http_get(f"{lab.jupyter_url}/api/contents?token=wrong-{lab.token}")
    assert status == 403, "Jupyter must refuse a wrong token"
    status, _ = http_get(f"{lab.jupyter_url}/api/contents", headers={"Authorization": f"token {lab.token[::-1]}"})
    assert status == 403, "Jupyter must refuse a wrong token in the Authorization header"
    status, _ = http_get(f"{lab.jupyter_url}/api/contents", headers={"Authorization": f"token {lab.token}"})
    assert status == 200, "the right token in the Authorization header"
    status, body = http_get(f"{lab.jupyter_url}/api/contents/notebooks?token={lab.token}")
    assert status == 200, body
    names = [c["name"] for c in json.loads(body)["content"]]
    assert "train_on_cluster.ipynb" in names, "the example notebook must be seeded into Jupyter's root"
    status, body = http_get(f"{lab.jupyter_url}/lab?token={lab.token}")
    assert status == 200 and "JupyterLab" in body


def test_jupyter_refuses_host_names_that_are_not_local(lab):
    """allow_remote_access is off: a DNS-rebinding Host is refused even with the token; local names work."""
    port = lab.env["JUPYTER_HOST_PORT"]
    url = f"{lab.jupyter_url}/api/contents?token={lab.token}"
    for host in (f"evil.example:{port}", f"jupyter:{port}", f"192.0.2.7:{port}"):
        status, _ = http_get(url, headers={"Host": host})
        assert status == 403, f"Host {host} must be refused, got {status}"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"{LAB_HOSTNAME}:{port}"):
        status, body = http_get(url, headers={"Host": host})
        assert status == 200, f"Host {host} must be accepted (JUPYTER_LOCAL_HOSTNAMES={LAB_HOSTNAME}): {body[:200]}"


def test_mlflow_refuses_host_names_and_origins_that_are_not_local(lab):
    """MLflow has no login; its Host check (DNS rebinding) and its cross-origin check are what a browser meets.

    The API answers loopback names, `mlflow` (inside the lab) and MLFLOW_LOCAL_HOSTNAMES; any other Host gets
    403. A state-changing request from another site's page (its Origin) gets 403 too.
    """
    port = lab.env["MLFLOW_HOST_PORT"]
    url = f"{lab.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=5"
    for host in (f"evil.example:{port}", f"mlflow.evil.example:{port}", f"192.0.2.7:{port}", f"10.1.2.3:{port}"):
        status, body = http_get(url, headers={"Host": host})
        assert status == 403 and "DNS rebinding" in body, f"Host {host} must be refused, got {status}: {body[:200]}"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"{LAB_HOSTNAME}:{port}"):
        status, body = http_get(url, headers={"Host": host})
        assert status == 200 and "experiments" in json.loads(body), f"Host {host} must be accepted: {body[:200]}"
    search = f"{lab.mlflow_url}/api/2.0/mlflow/experiments/search"
    for origin, expected in (("http://evil.example", 403), (f"http://{LAB_HOSTNAME}.evil.example", 403),
                             (f"http://{LAB_HOSTNAME}:{port}", 200), (f"https://{LAB_HOSTNAME}", 200),
                             (f"http://127.0.0.1:{port}", 200)):
        status, body = http_post_json(search, {"max_results": 1}, headers={"Origin": origin})
        assert status == expected, f"POST with Origin {origin}: expected {expected}, got {status}: {body[:200]}"
    # Inside the lab the drivers use the service name, as MLFLOW_TRACKING_URI says.
    uri = lab.exec("jupyter", "printenv", "MLFLOW_TRACKING_URI").stdout.strip()
    assert uri == "http://mlflow:5000"
    probe = lab.exec("jupyter", "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                     f"{uri}/api/2.0/mlflow/experiments/search?max_results=1")
    assert probe.stdout.strip() == "200", f"Jupyter cannot reach {uri}: {probe.stdout} {probe.stderr}"


SECRET_PROBE = textwrap.dedent(
    r"""
    import os, sys
    secret = sys.stdin.read().strip().encode()
    conf = "/opt/spark-conf/spark-defaults.conf"
    st = os.stat(conf)
    print(oct(st.st_mode & 0o777), st.st_uid)
    print(open(conf).read())
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[pid] = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
        except OSError:
            pass
    def started_by_tini(pid):  # not `docker exec` processes (this probe, health checks): their parent is 0
        while pid not in ("0", "1"):
            pid = parents.get(pid, "0")
        return pid == "1"
    for pid in filter(started_by_tini, list(parents) + ["1"]):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        print("checked", pid, argv[0].decode(errors="replace"))
        if any(secret in a for a in argv):
            print("SECRET-IN-ARGV", pid, argv[:3])
        if any(e.startswith(b"SPARK_AUTH_SECRET=") for e in env):
            print("SECRET-IN-ENV", pid, argv[:3])
    """
)


def test_spark_settings_are_private_and_the_secret_stays_out_of_argv_env_logs_and_uis(lab):
    secret, token = lab.secret("SPARK_AUTH_SECRET"), lab.token
    for name, cid in lab.container_ids("master", "worker", "jupyter").items():
        probe = subprocess.run(["docker", "exec", "-i", cid, "python", "-c", SECRET_PROBE], input=secret,
                               capture_output=True, text=True, timeout=60)
        out = probe.stdout
        assert probe.returncode == 0, f"{name}: {probe.stderr[-2000:]}"
        mode, uid = out.splitlines()[0].split()
        assert (mode, uid) == ("0o600", "185"), f"{name}: spark-defaults.conf must be 0600, owned by 185"
        for setting in ("spark.authenticate true", f"spark.authenticate.secret {secret}",
                        "spark.network.crypto.enabled true", "spark.network.crypto.cipher AES/GCM/NoPadding",
                        "spark.network.crypto.saslFallback false"):
            assert setting in out, f"{name}: {setting.split()[0]} missing from spark-defaults.conf"
        assert "checked 1 " in out and out.count("checked") >= 2, f"{name}: the probe saw no daemon:\n{out}"
        assert "SECRET-IN-ARGV" not in out and "SECRET-IN-ENV" not in out, f"{name}:\n{out[-2000:]}"
        logs = run(["docker", "logs", cid])
        assert secret not in logs.stdout + logs.stderr and token not in logs.stdout + logs.stderr, (
            f"{name}: a secret is in the container's log"
        )
        if not name.startswith("jupyter"):
            assert token not in run(["docker", "inspect", cid]).stdout, f"{name} has no use for the Jupyter token"
    for page in ("/", "/json/"):
        status, body = http_get(lab.ui_url + page)
        assert status == 200 and secret not in body, f"the master UI {page} shows the secret"
    # MLflow needs neither secret: none in its container's configuration, processes or log.
    mlflow = lab.container_id("mlflow")
    environs = run(["docker", "exec", mlflow, "bash", "-c", "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"])
    assert "MLFLOW_SERVER_ALLOWED_HOSTS" in environs.stdout, "the probe read no MLflow process's environment"
    logs = run(["docker", "logs", mlflow])
    for text, where in ((run(["docker", "inspect", mlflow]).stdout, "docker inspect"), (environs.stdout, "environ"),
                        (logs.stdout + logs.stderr, "log")):
        assert secret not in text and token not in text, f"mlflow: a lab secret is in its {where}"


#: What Spark's client logs when the master refuses its connection (here: the authentication fails).
REFUSED = "Failed to connect to master"

# The intruders' short-lived driver JVMs take the quick JIT tier, as the JVMs of `make test` do (TEST_JVM_OPTS).
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

INTRUDER = textwrap.dedent(
    """
    import os, socket, sys
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master("spark://master:7077").appName(os.environ["APP"])
               .config("spark.driver.host", socket.gethostbyname(socket.gethostname()))
               .config("spark.executor.cores", "1").config("spark.cores.max", "1"))
    for pair in os.environ.get("CONF", "").split():
        key, value = pair.split("=", 1)
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
        print("count", spark.range(4).count(), flush=True)
    except Exception as exc:
        print("FAILED", type(exc).__name__, str(exc).splitlines()[0][:300], flush=True)
        sys.exit(1)
    """
)


def test_an_application_without_the_spark_secret_cannot_register(lab):
    """One-off containers in the lab network run a PySpark driver against spark://master:7077.

    Without authentication, with a wrong secret, or with the right secret but no
    encryption the master refuses them; the right settings (the control) register
    and run a job, so the refusals are due to the secret and not the set-up. A refused
    client is stopped at its first refusal (`REFUSED`): Spark's client would try twice
    more, 20 s apart, with the same settings, and then give up.
    """
    secret = lab.secret("SPARK_AUTH_SECRET")
    crypto = "spark.network.crypto.enabled=true spark.network.crypto.authEngineVersion=2 " \
             "spark.network.crypto.cipher=AES/GCM/NoPadding spark.network.crypto.saslFallback=false"
    cases = {
        "no-auth": "",
        "wrong-secret": f"spark.authenticate=true spark.authenticate.secret={secret[::-1]} {crypto}",
        "no-encryption": f"spark.authenticate=true spark.authenticate.secret={secret} "
                         "spark.network.crypto.enabled=false",
        "control": f"spark.authenticate=true spark.authenticate.secret={secret} {crypto}",
    }
    master = lab.container_id("master")
    (network,) = json.loads(run(["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}", master]).stdout)
    procs, names, logs = {}, {}, {}
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        for case, conf in cases.items():
            names[case] = f"{LAB_PROJECT}-intruder-{case}"
            logs[case] = ARTIFACTS / f"lab-intruder-{case}.log"
            app = f"intruder-{case}"
            with logs[case].open("w") as log:
                procs[case] = subprocess.Popen(
                    ["docker", "run", "--rm", "--name", names[case], "--network", network, "--cap-drop", "ALL",
                     "--security-opt", "no-new-privileges:true", "-e", f"APP={app}", "-e", f"CONF={conf}",
                     "-e", f"SPARK_SUBMIT_OPTS={QUICK_JVM}",
                     lab.image, "python", "-c", INTRUDER],
                    stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and any(
                p.poll() is None and (case == "control" or REFUSED not in logs[case].read_text(errors="replace"))
                for case, p in procs.items()):
            time.sleep(0.5)
    finally:
        for name in names.values():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        for p in procs.values():
            p.wait(60)
    results = {case: (logs[case].read_text(errors="replace"), p.returncode) for case, p in procs.items()}
    out, rc = results["control"]
    assert rc == 0 and "count 4" in out, f"the control with the right settings must run a job:\n{out[-4000:]}"
    _, body = http_get(f"{lab.ui_url}/json/")
    state = json.loads(body)
    registered = {a["name"] for a in state.get("activeapps", []) + state.get("completedapps", [])}
    assert "intruder-control" in registered, f"the master lists: {registered}"
    for case in ("no-auth", "wrong-secret", "no-encryption"):
        out, rc = results[case]
        assert REFUSED in out and "count 4" not in out, f"{case}: not refused, or the application ran:\n{out[-4000:]}"
        assert f"intruder-{case}" not in registered, f"{case}: the master registered it: {registered}"


NOTEBOOK_RUNNER = textwrap.dedent(
    """
    import nbformat, re, sys
    from nbclient import NotebookClient
    src, dst, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    nb = nbformat.read(src, as_version=4)
    # its parameters cell (papermill's tag) with fewer epochs: the run, its MLflow logging and the model are checked
    (cell,) = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    cell.source = re.sub(r"^EPOCHS = .*$", f"EPOCHS = {epochs}", cell.source, flags=re.MULTILINE)
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": "/tmp"}}).execute()
    finally:
        nbformat.write(nb, dst)
    print("notebook ran to completion")
    """
)


def test_example_notebook_runs_against_the_cluster(lab):
    """The lab's notebook in its Jupyter, against the lab's master: its fits' barrier stages take a task on every
    worker container, so the Jupyter driver (``spark.driver.host=jupyter``) is reachable from each, and their
    Python workers run the image's Python and PySpark as the driver does (PySpark refuses a worker whose Python
    version differs); the run and its model land on the lab's MLflow server."""
    out = "/results/notebooks/train_on_cluster.out.ipynb"
    lab.exec("jupyter", "mkdir", "-p", "/results/notebooks")
    proc = lab.exec(
        "jupyter", "python", "-c", NOTEBOOK_RUNNER,
        "/opt/trainer/jobs/notebooks/train_on_cluster.ipynb", out, str(NOTEBOOK_EPOCHS), timeout=1200, check=False,
    )
    ARTIFACTS.mkdir(exist_ok=True)
    run(["docker", "cp", f"{lab.container_id('jupyter')}:{out}", str(ARTIFACTS / "train_on_cluster.out.ipynb")],
        check=False)
    assert proc.returncode == 0, f"the notebook failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    executed = json.loads((ARTIFACTS / "train_on_cluster.out.ipynb").read_text())
    last_outputs = "".join(
        "".join(o.get("text", "")) for c in executed["cells"] if c["cell_type"] == "code" for o in c["outputs"]
    )
    assert "loss" in last_outputs or "accuracy" in last_outputs, "the notebook must print the evaluation metrics"
    assert "MLflow tracking URI: http://mlflow:5000" in last_outputs, "the notebook logs to the lab's server by default"
    assert "the model loaded from MLflow predicts as the Pipeline's KerasModel" in last_outputs
    accuracy = float(re.search(r"pipeline accuracy: ([0-9.]+)", last_outputs).group(1))
    assert accuracy > 0.8, f"the Pipeline's KerasModel predicts badly: {accuracy}"
    (run_id,) = re.findall(r"MLflow run ([0-9a-f]{32})", last_outputs)
    check_the_notebooks_mlflow_run(lab, run_id)


#: The notebook's EPOCHS as the test sets it (its parameters cell; the notebook's own: 10): one val_loss per epoch
#: in its MLflow run. Digits on the lab's 3 workers learn past the 0.8 the test asks in 3 (tests/test_notebooks.py).
NOTEBOOK_EPOCHS = 4


def check_the_notebooks_mlflow_run(lab, run_id: str) -> None:
    """The run is in the lab's MLflow server (its REST API, from the host): params, metrics, the model's files."""
    status, body = http_get(f"{lab.mlflow_url}/api/2.0/mlflow/runs/get?run_id={run_id}")
    assert status == 200, f"the lab's MLflow server has no run {run_id}: {status} {body[:300]}"
    run_ = json.loads(body)["run"]
    assert run_["info"]["status"] == "FINISHED" and run_["info"]["run_name"] == "digits pipeline", run_["info"]
    params = {p["key"]: p["value"] for p in run_["data"]["params"]}
    # the notebook's defaults: the algorithm chosen for the lab's hosts (local SGD), the lab's workers, its EPOCHS
    expected = ("localsgd", str(LAB_WORKERS), str(NOTEBOOK_EPOCHS))
    assert (params["algorithm"], params["num_workers"], params["epochs"]) == expected, params
    metrics = {m["key"] for m in run_["data"]["metrics"]}
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "epoch_time_s"} <= metrics, metrics
    experiment_id = run_["info"]["experiment_id"]
    status, body = http_get(f"{lab.mlflow_url}/api/2.0/mlflow/experiments/get?experiment_id={experiment_id}")
    assert status == 200 and json.loads(body)["experiment"]["name"] == "lab-notebook", body[:300]
    status, body = http_post_json(f"{lab.mlflow_url}/api/2.0/mlflow/runs/search",
                                  {"experiment_ids": [experiment_id], "filter": "attributes.status = 'FINISHED'"})
    assert status == 200 and run_id in [r["info"]["run_id"] for r in json.loads(body).get("runs", [])], body[:300]
    history = f"{lab.mlflow_url}/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key=val_loss"
    status, body = http_get(history)
    steps = [m["step"] for m in json.loads(body)["metrics"]] if status == 200 else None
    assert steps == list(range(NOTEBOOK_EPOCHS)), body[:300]
    status, body = http_post_json(f"{lab.mlflow_url}/api/2.0/mlflow/logged-models/search",
                                  {"experiment_ids": [experiment_id]})
    assert status == 200, body[:300]
    models = [m["info"] for m in json.loads(body).get("models", []) if m["info"].get("source_run_id") == run_id]
    assert len(models) == 1, f"expected the run's one logged model: {body[:500]}"
    # The artifacts went through the server onto its own volume: the model's MLmodel file is there.
    found = lab.exec("mlflow", "find", "/mlflow/artifacts", "-name", "MLmodel", "-path", f"*{models[0]['model_id']}*")
    assert found.stdout.strip(), f"no MLmodel of {models[0]['model_id']} under the server's /mlflow/artifacts"


def test_make_submit_survives_docker_kill_of_a_worker_and_writes_results(lab):
    """`make submit` trains MNIST on all 3 workers; `docker kill` one worker container mid-run.

    With no algorithm named the job runs what a fit chooses across the lab's hosts: local SGD, whose 3 barrier
    tasks, one per worker container, become one group on the image's Keras backend (TensorFlow: its collective
    ops, a gRPC server in each task's process, task 0's the leader) and average over the lab's network (a
    per-step gradient all-reduce takes the same group, `tests/test_allreduce.py` checks its steps).
    The killed container stays down (Docker does not restart a killed container), so the
    job's retry waits --retry-timeout for the lost slot, then goes on with the 2 workers
    left from the last epoch's state, and still writes its results. With --mlflow
    it logs them to the lab's MLflow server too (MLFLOW_TRACKING_URI of the submit container).
    The kill lands mid-stage whatever the machine's speed: once the first epoch's checkpoint
    is written, the driver's container is paused (`docker pause`: its parameter server, hence
    every worker, waits), the worker is killed, and the driver resumed. (Before, the kill
    came when the test saw the checkpoint, and on a fast machine the five epochs left were
    over by then: no retry.)
    """
    if not (REPO / "jobs" / "mnist.py").exists():
        pytest.fail("jobs/mnist.py does not exist yet: `make submit JOB=mnist` has nothing to run")
    checkpoint = "/checkpoints/lab-kill/cnn-3w/checkpoint.npz"
    lab.exec("jupyter", "rm", "-rf", "/checkpoints/lab-kill", check=False)
    jupyter, victim = lab.container_id("jupyter"), lab.compose("ps", "-q", "worker").stdout.split()[0]
    # 10 epochs of 1,500 images (about 1.5 s each): the driver is paused at the first epoch's checkpoint, so
    # the kill lands mid-stage; where the freezer refuses, the 9 epochs left outlast the test's docker exec, ps
    # and kill on a busy host (with 6 and no pause, the five left were once over before the kill).
    args = (f"ARGS=--limit 1500 --epochs 10 --workers {LAB_WORKERS} --no-baseline "
            "--checkpoint-dir /checkpoints/lab-kill --retry-timeout 5 --mlflow")
    ARTIFACTS.mkdir(exist_ok=True)
    log = (ARTIFACTS / "lab-submit.log").open("w")
    submit = subprocess.Popen(["make", "--no-print-directory", "submit", "JOB=mnist", args], env=lab.env,
                              stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    driver = None
    try:
        deadline = time.monotonic() + 1200
        while submit.poll() is None and time.monotonic() < deadline:
            if run(["docker", "exec", jupyter, "test", "-f", checkpoint], check=False, timeout=60).returncode == 0:
                break  # the first epoch is done on every worker
            time.sleep(0.2)
        assert submit.poll() is None, "the job ended before a worker could be killed; see lab-submit.log"
        (driver,) = run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={LAB_PROJECT}",
                         "--filter", "label=com.docker.compose.service=submit"]).stdout.split()
        # Where the cgroup freezer refuses (once under load: "unable to freeze"), the 9 epochs left still
        # outlast the kill.
        paused = run(["docker", "pause", driver], check=False).returncode == 0
        try:
            run(["docker", "kill", victim])
        finally:
            if paused:
                run(["docker", "unpause", driver])
        assert submit.wait(timeout=1500) == 0, "make submit failed after the kill; see lab-submit.log"
    finally:
        if submit.poll() is None:
            submit.kill()
        log.close()
    listing = lab.exec("jupyter", "find", "/results/mnist", "-type", "f").stdout.split()
    assert any(f.endswith(".json") for f in listing), f"no JSON results in the results volume: {listing}"
    assert any(f.endswith(".csv") for f in listing), listing
    assert any(f.endswith(".md") for f in listing), listing
    copied = lab.out / "lab" / "mnist"
    assert copied.is_dir() and any(copied.rglob("*.json")), f"make submit must copy the results to {copied}"
    result = json.loads(next(copied.rglob("mnist.json")).read_text())
    (row,) = result["rows"]
    assert result["metadata"]["keras_backend"] == "tensorflow", result["metadata"]
    assert row["workers"] == LAB_WORKERS and row["retries"] >= 1, row
    # the group averaged across the containers: local SGD, the lab's default, measured its period there
    assert row["algorithm"].startswith("localsgd") and row["period"] >= 1, row
    assert row["metric_value"] > 0.3, f"accuracy {row['metric_value']} after the kill (chance: 0.1)"
    status, body = http_post_json(f"{lab.mlflow_url}/api/2.0/mlflow/runs/search",
                                  {"experiment_ids": ["0"], "filter": "tags.`trainer.job` = 'mnist'"})
    assert status == 200, body[:300]
    (logged,) = json.loads(body).get("runs", [None])
    assert logged is not None and logged["info"]["status"] == "FINISHED", f"no finished mnist run in MLflow: {body[:300]}"
    params = {p["key"]: p["value"] for p in logged["data"]["params"]}
    assert float(params["retry_timeout"]) == 5 and params["workers"] == str(LAB_WORKERS), params
    metrics = {m["key"]: m["value"] for m in logged["data"]["metrics"]}
    accuracy = [v for k, v in metrics.items() if k.endswith(f".{LAB_WORKERS}w.metric_value")]
    assert accuracy == [pytest.approx(row["metric_value"])], f"the run's metrics differ from the results: {metrics}"


@pytest.mark.parametrize(
    "page,path",
    [("spark-ui", ""), ("jupyterlab", "/lab?token={token}"), ("mlflow", "/#/experiments")],
    ids=["spark-ui", "jupyterlab", "mlflow"],
)
def test_headless_chromium_renders_the_uis(lab, page, path):
    base = {"spark-ui": lab.ui_url, "jupyterlab": lab.jupyter_url, "mlflow": lab.mlflow_url}[page]
    ARTIFACTS.mkdir(exist_ok=True)
    dest = ARTIFACTS / f"lab-{page}.png"
    dest.unlink(missing_ok=True)
    proc = screenshot(base + path.format(token=lab.token), dest)
    assert dest.exists(), f"chromium wrote no screenshot (rc={proc.returncode}):\n{proc.stderr[-3000:]}"
    data = dest.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, "the screenshot is not a rendered page"
    share = dominant_colour_share(dest)
    assert share < 0.95, f"the screenshot is {share:.0%} one colour: a blank page"
    if page == "mlflow":
        # The UI is a single-page app: its experiment list comes from the REST API it calls through the
        # published port (Host 127.0.0.1:PORT passes the Host check); the fresh server's Default is in it.
        text = visible_text(base + path)
        assert "Experiments" in text and "Default" in text, f"the MLflow UI did not list the experiments: {text[:500]}"


def test_make_up_again_reuses_the_secrets_and_the_generated_token(lab):
    """A later `make up` generates nothing; without JUPYTER_TOKEN in the environment the file's token is used."""
    before = lab.secrets_file.read_text()
    env = {k: v for k, v in lab.env.items() if k != "JUPYTER_TOKEN"}
    up = run(["make", "--no-print-directory", "up", f"WORKERS={LAB_WORKERS}"], env=env, timeout=900,
             log=ARTIFACTS / "lab-make.log")
    assert lab.secrets_file.read_text() == before, "make up must reuse the secrets file"
    assert "generated" not in up.stdout
    assert f"Jupyter:  {lab.jupyter_url}/lab  (token: JUPYTER_TOKEN in {lab.secrets_file})" in up.stdout
    stored = next(line.split("=", 1)[1] for line in before.splitlines() if line.startswith("JUPYTER_TOKEN="))
    assert stored not in up.stdout and stored != lab.token
    status, _ = http_get(f"{lab.jupyter_url}/api/contents?token={stored}")
    assert status == 200, "Jupyter now takes the token from the secrets file"
    status, _ = http_get(f"{lab.jupyter_url}/api/contents?token={lab.token}")
    assert status == 403, "the environment's old token no longer works"


# --- last: tear down -----------------------------------------------------------


def test_make_down_leaves_no_containers_or_networks(lab):
    lab.save_logs()
    lab.make("down", "PURGE=1", timeout=300)
    label = f"label=com.docker.compose.project={LAB_PROJECT}"
    containers = run(["docker", "ps", "-a", "-q", "--filter", label]).stdout.split()
    networks = run(["docker", "network", "ls", "-q", "--filter", label]).stdout.split()
    volumes = run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.split()
    assert containers == [], f"containers left after make down: {containers}"
    assert networks == [], f"networks left after make down: {networks}"
    assert volumes == [], f"volumes left after make down PURGE=1: {volumes}"
