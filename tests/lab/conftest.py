"""Fixtures of the lab tests: the real Docker engine, `make` targets, kubectl.

The container tests drive the lab exactly as a user does (`make build`,
`make up WORKERS=3`, `make submit`, `make down`), under a project name and host
ports of their own so that they never touch a lab a developer has running
(LAB_TEST_PROJECT names the project, for two checkouts sharing one engine).

A missing tool (Docker engine, kubectl, chromium, a validator) skips the tests
that need it on a developer's machine, with the reason; under CI (env var `CI`
set) it FAILS them instead: a test that cannot fail there proves nothing.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest

from .labtools import ARTIFACTS, LAB_HOSTNAME, LAB_PROJECT, LAB_WORKERS, Lab, docker_problem, free_port, run, skip_or_fail, write_timings


@pytest.fixture(scope="session")
def docker_engine() -> None:
    problem = docker_problem()
    if problem:
        skip_or_fail(problem)


@pytest.fixture(scope="session")
def lab_env(tmp_path_factory) -> dict[str, str]:
    """Environment for make/compose: own project name, free host ports, fresh token.

    The Spark secret is left to `make up`, which generates it (and a token the
    environment's JUPYTER_TOKEN overrides) in a secrets file of the test's own.
    """
    (ARTIFACTS / "lab-make.log").unlink(missing_ok=True)
    env = os.environ.copy()
    env.pop("SPARK_AUTH_SECRET", None)
    out = tmp_path_factory.mktemp("lab-out")
    env.update(
        LAB_PROJECT=LAB_PROJECT,
        LAB_IMAGE=env.get("LAB_IMAGE", "trainer-lab:latest"),
        LAB_BIND="127.0.0.1",
        LAB_SECRETS=str(out / "lab-secrets.env"),
        SPARK_UI_PORT=str(free_port()),
        JUPYTER_HOST_PORT=str(free_port()),
        MLFLOW_HOST_PORT=str(free_port()),
        JUPYTER_TOKEN=secrets.token_hex(12),
        JUPYTER_LOCAL_HOSTNAMES=LAB_HOSTNAME,
        MLFLOW_LOCAL_HOSTNAMES=LAB_HOSTNAME,
        OUT=str(out),
    )
    return env


@pytest.fixture(scope="session")
def lab_image(docker_engine, lab_env) -> Lab:
    """The lab image, built with `make build` (cached layers make a rebuild fast)."""
    lab = Lab(env=lab_env, out=Path(lab_env["OUT"]))
    start = time.monotonic()
    lab.make("build", timeout=2400)
    lab.timings["make_build_s"] = round(time.monotonic() - start, 1)
    size = run(["docker", "image", "inspect", "-f", "{{.Size}}", lab.image]).stdout.strip()
    lab.timings["image_size_gb"] = round(int(size) / 1e9, 2)
    write_timings(lab.timings)
    return lab


@pytest.fixture(scope="session")
def lab(lab_image: Lab):
    """`make up WORKERS=3` once for the session; ALWAYS `make down PURGE=1` afterwards."""
    lab = lab_image
    try:
        start = time.monotonic()
        up = lab.make("up", f"WORKERS={LAB_WORKERS}", timeout=900, check=False)
        lab.timings["make_up_3_workers_s"] = round(time.monotonic() - start, 1)
        write_timings(lab.timings)
        if up.returncode != 0:
            raise AssertionError(f"`make up WORKERS={LAB_WORKERS}` failed:\n{up.stdout[-4000:]}\n{up.stderr[-4000:]}")
        lab.up_output = up.stdout
        yield lab
    finally:
        lab.save_logs()
        lab.make("down", "PURGE=1", timeout=300, check=False)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The session lab's teardown test (`make down PURGE=1`) after every other test, whichever file they are
    in, so that the shaped-link tests (test_lab_link.py) share the lab instead of starting a second one."""
    last = [item for item in items if item.name == "test_make_down_leaves_no_containers_or_networks"]
    items[:] = [item for item in items if item not in last] + last
