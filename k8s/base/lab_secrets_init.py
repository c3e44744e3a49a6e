"""Create the lab's Secret (JUPYTER_TOKEN, SPARK_AUTH_SECRET) with random values, unless it exists.

The Job `lab-secrets-init` (lab-secrets-init.yaml) runs this file from the ConfigMap of
the same name, with the lab image's Python and the standard library only. It asks the
API server for the Secret (GET): when it exists, it is left alone, values and all, so
applying the lab again keeps the token and the Spark secret; when it does not (404), it
creates it (POST) with values from the kernel's CSPRNG, the form `make k8s-secrets`
writes. A 409 on create means that another run created it first, which is as good.
Values are never printed.

Settings, from the environment:
    LAB_SECRET_NAME      the Secret's name (default: lab-secrets)
    SERVICEACCOUNT_DIR   the pod's token, ca.crt and namespace (default: where Kubernetes mounts them)
    KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT   the API server (set by Kubernetes in every pod)
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
KEYS = ("JUPYTER_TOKEN", "SPARK_AUTH_SECRET")
TIMEOUT_S = 30


class SecretInitError(Exception):
    """The Secret could not be checked or created; the message says why and what to do."""


def random_values() -> dict[str, str]:
    """48 hex digits of token and 64 of Spark secret, as compose/lab-secrets.sh generates them."""
    return {"JUPYTER_TOKEN": secrets.token_hex(24), "SPARK_AUTH_SECRET": secrets.token_hex(32)}


class Api:
    """The few calls this needs, authenticated with the pod's service account token."""

    def __init__(self, serviceaccount_dir: Path):
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise SecretInitError("KUBERNETES_SERVICE_HOST is not set: expected to run in a pod of the cluster")
        self.base = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.token = (serviceaccount_dir / "token").read_text().strip()
        self.namespace = (serviceaccount_dir / "namespace").read_text().strip()
        self.tls = ssl.create_default_context(cafile=str(serviceaccount_dir / "ca.crt"))

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, context=self.tls, timeout=TIMEOUT_S) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            try:
                return error.code, json.load(error)
            except ValueError:
                return error.code, {}


def failure(action: str, status: int, reply: dict) -> SecretInitError:
    message = reply.get("message", "")
    hint = ""
    if status in (401, 403):
        hint = (" The ServiceAccount lab-secrets-init needs the Role lab-secrets-init (get on that Secret, create on"
                " secrets) bound to it: apply the whole kustomization, k8s/base/lab-secrets-init.yaml included.")
    return SecretInitError(f"{action} failed: expected HTTP 200/201/404/409. Received: status={status}"
                           f" ({message}).{hint}")


def ensure_secret(api: Api, name: str) -> str:
    """Create Secret `name` unless it exists; return what was done ("kept" or "created")."""
    path = f"/api/v1/namespaces/{api.namespace}/secrets"
    status, reply = api.call("GET", f"{path}/{name}")
    if status == 200:
        missing = [key for key in KEYS if not reply.get("data", {}).get(key)]
        if missing:
            raise SecretInitError(
                f"Secret {api.namespace}/{name} exists but lacks {', '.join(missing)}: expected both {', '.join(KEYS)}."
                f" Received: keys={sorted(reply.get('data', {}))}. Add them, or delete the Secret"
                f" (kubectl -n {api.namespace} delete secret {name}) and apply the lab again to generate new ones.")
        return "kept"
    if status != 404:
        raise failure(f"GET secret {api.namespace}/{name}", status, reply)
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "trainer-lab",
                                              "app.kubernetes.io/managed-by": "lab-secrets-init"}},
        "stringData": random_values(),
    }
    status, reply = api.call("POST", path, body)
    if status == 201:
        return "created"
    if status == 409:
        return "kept"
    raise failure(f"create secret {api.namespace}/{name}", status, reply)


def main() -> int:
    name = os.environ.get("LAB_SECRET_NAME", "lab-secrets")
    try:
        api = Api(Path(os.environ.get("SERVICEACCOUNT_DIR", DEFAULT_SERVICEACCOUNT_DIR)))
        outcome = ensure_secret(api, name)
    except (SecretInitError, OSError) as error:
        print(f"lab-secrets-init: {error}", file=sys.stderr)
        return 1
    if outcome == "created":
        print(f"lab-secrets-init: created Secret {api.namespace}/{name} with a random {' and '.join(KEYS)}")
    else:
        print(f"lab-secrets-init: Secret {api.namespace}/{name} exists; left as it is")
    return 0


if __name__ == "__main__":
    sys.exit(main())
