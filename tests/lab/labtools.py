"""Helpers of the lab tests: tool checks, subprocesses, the `Lab` handle."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
# The compose project of the test lab; LAB_TEST_PROJECT gives a checkout its own (two test runs on one engine).
LAB_PROJECT = os.environ.get("LAB_TEST_PROJECT") or "trainer-lab-test"
LAB_WORKERS = 3
# A host name the test lab's Jupyter accepts besides localhost (JUPYTER_LOCAL_HOSTNAMES).
LAB_HOSTNAME = "lab-test.example"
SECRETS_SCRIPT = REPO / "compose" / "lab-secrets.sh"


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail under CI, where every lab test must really run."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip; run .ci/install-docker.sh first)")
    pytest.skip(reason)


def require_tool(name: str, hint: str) -> str:
    """Path of `name`, looked up beside this Python (the venv) first, then on PATH."""
    path = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if path is None:
        skip_or_fail(f"`{name}` is not installed: {hint}")
    return path


def docker_problem() -> str | None:
    """Why the real Docker engine cannot be used, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker CLI; install the engine with .ci/install-docker.sh"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "`docker info` hung for 60 s; is dockerd healthy?"
    if info.returncode != 0:
        return f"the Docker engine does not answer (`docker info`: {info.stderr.strip()[-200:]}); start it with .ci/install-docker.sh"
    has_v1 = shutil.which("docker-compose") is not None
    has_v2 = subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    if not (has_v1 or has_v2):
        return "neither docker-compose nor `docker compose` is installed (.ci/install-docker.sh installs docker-compose)"
    if shutil.which("make") is None:
        return "`make` is not installed"
    return None


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range. A port from ``bind(0)`` lies in that range,
    where the Spark daemons, drivers and clients of the main run beside the lab tests draw ports all the time,
    and one took it in the ten minutes between this choice and `make up` (seen once in `.ci/run`: "bind:
    address already in use"); below it only an explicit bind can collide."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.Random().sample(range(20000, max(low, 20200)), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], *, env: dict | None = None, timeout: float = 600, check: bool = True,
        log: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command from the repository root; on failure show its output's tail."""
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n[rc={proc.returncode}]\n{proc.stdout}\n{proc.stderr}\n")
    if check and proc.returncode != 0:
        raise AssertionError(
            f"`{' '.join(cmd)}` exited with {proc.returncode}\n--- stdout (tail) ---\n{proc.stdout[-4000:]}"
            f"\n--- stderr (tail) ---\n{proc.stderr[-4000:]}"
        )
    return proc


@dataclass
class Lab:
    """A running lab: make/compose helpers plus the URLs it publishes."""

    env: dict[str, str]
    out: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.env['SPARK_UI_PORT']}"

    @property
    def jupyter_url(self) -> str:
        return f"http://127.0.0.1:{self.env['JUPYTER_HOST_PORT']}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.env['MLFLOW_HOST_PORT']}"

    @property
    def token(self) -> str:
        return self.env["JUPYTER_TOKEN"]

    @property
    def image(self) -> str:
        return self.env["LAB_IMAGE"]

    @property
    def secrets_file(self) -> Path:
        return Path(self.env["LAB_SECRETS"])

    def secret(self, key: str) -> str:
        """The value compose gets for `key` (JUPYTER_TOKEN, SPARK_AUTH_SECRET): environment first, then the file."""
        return run([str(SECRETS_SCRIPT), "get", str(self.secrets_file), key], env=self.env).stdout.strip()

    def make(self, *args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
        return run(["make", "--no-print-directory", *args], env=self.env, timeout=timeout, check=check,
                   log=ARTIFACTS / "lab-make.log")

    def compose_cmd(self) -> list[str]:
        """Compose as `make` runs it: with the lab's secrets in its environment, so nothing is recreated."""
        base = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
        return [str(SECRETS_SCRIPT), "with", str(self.secrets_file), *base,
                "-p", LAB_PROJECT, "-f", "compose/compose.yaml"]

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return run([*self.compose_cmd(), *args], env=self.env, timeout=timeout, check=check)

    def exec(self, service: str, *cmd: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return self.compose("exec", "-T", service, *cmd, timeout=timeout, check=check)

    def save_logs(self) -> None:
        """Keep the lab's logs in test-artifacts/ (call before `make down`)."""
        logs = self.compose("logs", "--no-color", "--tail=300", check=False, timeout=120)
        if logs.stdout.strip():
            ARTIFACTS.mkdir(exist_ok=True)
            (ARTIFACTS / "lab-compose.log").write_text(logs.stdout + logs.stderr)

    def container_id(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.split()[0]

    def container_ids(self, *services: str) -> dict[str, str]:
        """{"master": id, "worker-1": id, ..., "jupyter": id} of the running containers."""
        ids = {}
        for service in services:
            running = self.compose("ps", "-q", service).stdout.split()
            for i, cid in enumerate(running, 1):
                ids[service if len(running) == 1 and service != "worker" else f"{service}-{i}"] = cid
        return ids


def write_timings(timings: dict) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "lab-timings.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(timings)
    path.write_text(json.dumps(old, indent=2) + "\n")


# --- HTTP and a headless browser, from the host -----------------------------


def http_get(url: str, timeout: float = 10, headers: dict | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def http_post_json(url: str, payload: dict, timeout: float = 10, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def chromium(*args: str) -> subprocess.CompletedProcess:
    """Headless chromium with a throw-away profile; the page gets 15 s of virtual time to render."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if binary is None:
        require_tool("chromium", "run .ci/install-docker.sh (installs chromium)")
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return run([
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,900",
            "--virtual-time-budget=15000", *args,
        ], timeout=180, check=False)


def screenshot(url: str, dest: Path) -> subprocess.CompletedProcess:
    return chromium(f"--screenshot={dest}", url)


def visible_text(url: str) -> str:
    """The text of the page's DOM once its scripts ran (chromium --dump-dom), without tags, scripts and styles."""
    proc = chromium("--dump-dom", url)
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", proc.stdout, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def dominant_colour_share(png: Path) -> float:
    """The share of the screenshot's pixels in its most common colour: near 1.0 for a blank page."""
    from PIL import Image  # deferred: only the screenshot tests read images

    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24)
    return max(count for count, _ in colours) / sum(count for count, _ in colours)
