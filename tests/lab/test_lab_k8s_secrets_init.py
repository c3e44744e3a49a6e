"""k8s/base/lab_secrets_init.py, the Job's script, against a stand-in for the Kubernetes API server.

No API server runs here, so a small HTTPS server answers the two calls the script makes
(GET and POST of core/v1 Secrets) the way the API server does: 404 for a missing
Secret, 201 on create, 409 when it exists, 403 without RBAC, 401 for a wrong token.
The script itself runs unchanged, as the Job runs it, with TLS verified against a CA
file and the token from a service-account folder.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .labtools import REPO, require_tool, run

SCRIPT = REPO / "k8s" / "base" / "lab_secrets_init.py"
NAMESPACE = "trainer-lab"
TOKEN = "test-serviceaccount-token"
SECRETS_PATH = f"/api/v1/namespaces/{NAMESPACE}/secrets"
# images/entrypoint.sh refuses a SPARK_AUTH_SECRET of another form.
SPARK_SECRET_FORM = re.compile(r"^[A-Za-z0-9._~+/=-]{16,}$")


class FakeApi(ThreadingHTTPServer):
    """Secrets of one namespace, kept as the API server keeps them (base64 `data`)."""

    def __init__(self, cert: Path, key: Path):
        super().__init__(("127.0.0.1", 0), Handler)
        self.secrets: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.forbid = False  # 403 for everything: the Role is missing
        self.race = False  # GET says 404, but another run creates it before our POST: 409
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.socket = context.wrap_socket(self.socket, server_side=True)


class Handler(BaseHTTPRequestHandler):
    server: FakeApi

    def log_message(self, *args):  # quiet
        pass

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def status(self, code: int, message: str) -> None:
        self.reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})

    def authorized(self) -> bool:
        self.server.requests.append((self.command, self.path))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.status(401, "Unauthorized")
            return False
        if self.server.forbid:
            self.status(403, f'secrets is forbidden: User "system:serviceaccount:{NAMESPACE}:lab-secrets-init"'
                             f' cannot {self.command.lower()} resource "secrets"')
            return False
        return True

    def do_GET(self):
        if not self.authorized():
            return
        name = self.path.removeprefix(SECRETS_PATH + "/")
        if self.path.startswith(SECRETS_PATH + "/") and name in self.server.secrets:
            self.reply(200, self.server.secrets[name])
        else:
            self.status(404, f'secrets "{name}" not found')

    def do_POST(self):
        if not self.authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        name = body["metadata"]["name"]
        if self.path != SECRETS_PATH:
            self.status(404, "the server could not find the requested resource")
        elif self.server.race or name in self.server.secrets:
            self.status(409, f'secrets "{name}" already exists')
        else:
            data = {k: base64.b64encode(v.encode()).decode() for k, v in body.pop("stringData", {}).items()}
            self.server.secrets[name] = {**body, "data": {**body.get("data", {}), **data}}
            self.reply(201, self.server.secrets[name])


def make_cert(folder: Path) -> tuple[Path, Path]:
    openssl = require_tool("openssl", "install openssl")
    cert, key = folder / "cert.pem", folder / "key.pem"
    run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)])
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """The API server's certificate, and another one that the pod's CA file does not vouch for."""
    folder = tmp_path_factory.mktemp("certs")
    (folder / "api").mkdir()
    (folder / "other").mkdir()
    return {"api": make_cert(folder / "api"), "other": make_cert(folder / "other")}


@pytest.fixture
def api(certs):
    server = FakeApi(*certs["api"])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run_script(api: FakeApi, folder: Path, ca: Path, token: str = TOKEN) -> subprocess.CompletedProcess:
    """The script as the Job runs it: the pod's service-account folder and the KUBERNETES_SERVICE_* variables."""
    sa = folder / "serviceaccount"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(token)
    (sa / "namespace").write_text(NAMESPACE)
    (sa / "ca.crt").write_bytes(ca.read_bytes())
    env = {"PATH": "/usr/bin:/bin", "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(api.server_address[1]), "SERVICEACCOUNT_DIR": str(sa),
           "LAB_SECRET_NAME": "lab-secrets"}
    return subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


def decoded(secret: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_creates_the_secret_with_random_values_once(api, certs, tmp_path):
    first = run_script(api, tmp_path, certs["api"][0])
    assert first.returncode == 0, first.stderr
    assert "created Secret trainer-lab/lab-secrets" in first.stdout
    values = decoded(api.secrets["lab-secrets"])
    assert set(values) == {"JUPYTER_TOKEN", "SPARK_AUTH_SECRET"}
    assert re.fullmatch(r"[0-9a-f]{48}", values["JUPYTER_TOKEN"]), "48 hex digits, as make up generates"
    assert re.fullmatch(r"[0-9a-f]{64}", values["SPARK_AUTH_SECRET"]) and SPARK_SECRET_FORM.match(
        values["SPARK_AUTH_SECRET"]), "a Spark secret that images/entrypoint.sh accepts"
    labels = api.secrets["lab-secrets"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "trainer-lab"
    assert api.secrets["lab-secrets"]["type"] == "Opaque"
    for value in values.values():
        assert value not in first.stdout + first.stderr, "values are never printed"

    second = run_script(api, tmp_path, certs["api"][0])
    assert second.returncode == 0, second.stderr
    assert "exists; left as it is" in second.stdout
    assert decoded(api.secrets["lab-secrets"]) == values, "applying again keeps the values"
    assert [m for m, _ in api.requests] == ["GET", "POST", "GET"], "the second run only reads"


def test_an_existing_secret_is_left_alone(api, certs, tmp_path):
    """Values chosen with make k8s-secrets (or by hand) stay: the script neither reads nor changes them."""
    mine = {"JUPYTER_TOKEN": "my-own-token-value", "SPARK_AUTH_SECRET": "my-own-spark-secret-value"}
    api.secrets["lab-secrets"] = {"metadata": {"name": "lab-secrets"}, "type": "Opaque",
                                  "data": {k: base64.b64encode(v.encode()).decode() for k, v in mine.items()}}
    proc = run_script(api, tmp_path, certs["api"][0])
    assert proc.returncode == 0 and decoded(api.secrets["lab-secrets"]) == mine, proc.stderr
    assert all(m == "GET" for m, _ in api.requests)


def test_a_secret_created_meanwhile_counts_as_existing(api, certs, tmp_path):
    api.race = True
    proc = run_script(api, tmp_path, certs["api"][0])
    assert proc.returncode == 0 and "left as it is" in proc.stdout, proc.stderr


def test_a_secret_without_a_key_is_an_error_that_says_what_to_do(api, certs, tmp_path):
    api.secrets["lab-secrets"] = {"metadata": {"name": "lab-secrets"}, "data": {"JUPYTER_TOKEN": "eA=="}}
    proc = run_script(api, tmp_path, certs["api"][0])
    assert proc.returncode == 1
    assert "lacks SPARK_AUTH_SECRET" in proc.stderr and "delete secret lab-secrets" in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", ["forbidden", "wrong-token"])
def test_missing_rights_fail_with_the_status_and_the_fix(api, certs, tmp_path, case):
    api.forbid = case == "forbidden"
    proc = run_script(api, tmp_path, certs["api"][0], token=TOKEN if case == "forbidden" else "stale")
    assert proc.returncode == 1 and not api.secrets
    status = 403 if case == "forbidden" else 401
    assert f"Received: status={status}" in proc.stderr and "Role lab-secrets-init" in proc.stderr, proc.stderr


def test_the_api_server_certificate_is_verified(api, certs, tmp_path):
    """A server the pod's ca.crt does not vouch for gets neither the token nor a request."""
    proc = run_script(api, tmp_path, certs["other"][0])
    assert proc.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in proc.stderr, proc.stderr
    assert not api.requests and not api.secrets
