"""The Keras backends' rooms (trainer.backends): one module each, one switch on the name, no name compared elsewhere.

Pure Python, no Spark and no Keras backend started: the rooms' declarations, the environment they give a task
and an executor, the version floors they lend ``trainer.versions``, and a scan of the package for a backend's
name outside its room.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer import backends, versions
from trainer.backends import KerasBackend, backend_for

REPO = Path(__file__).resolve().parents[1]
ROOM = REPO / "trainer" / "backends"
#: Where a backend's name may stand outside its room: names of modules and loggers, not a choice of backend.
NOT_A_CHOICE = {
    "trainer/verbosity.py": "the libraries' loggers quieted (py4j, absl, tensorflow, ...)",
    "trainer/runtime/shipping.py": "modules whose objects Keras saves itself (keras, tensorflow, builtins, numpy)",
}


def test_one_room_per_backend_each_with_the_same_shape():
    assert backends.NAMES == ("jax", "tensorflow", "torch")
    assert {p.stem for p in ROOM.glob("*.py")} == {"__init__", "common", *backends.NAMES}
    for name in backends.NAMES:
        room = importlib.import_module(f"trainer.backends.{name}")
        backend = backend_for(name)
        assert backend is room.BACKEND and isinstance(backend, KerasBackend) and backend.name == name
        assert backend.extra and backend.distributions and backend.group_module.startswith("trainer.runtime.")
        group = REPO.joinpath(*backend.group_module.split(".")).with_suffix(".py")
        assert group.is_file(), f"{name}'s room names {backend.group_module}, which is not there"
    assert [b.name for b in backends.BACKENDS.values() if b.keras_default] == [backends.DEFAULT_NAME]
    assert backends.collective_names() == backends.NAMES


def test_an_unknown_backend_is_named_with_the_others_and_the_fix():
    with pytest.raises(ValueError, match="Unknown Keras backend 'numpy'. Expected one of: jax, tensorflow, torch. "
                                         "Fix: set KERAS_BACKEND"):
        backend_for("numpy")


def test_the_configured_backend_is_read_as_keras_reads_it(monkeypatch, tmp_path):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert backends.configured_name() == backends.DEFAULT_NAME  # no file
    (tmp_path / "keras.json").write_text('{"backend": "jax"}')
    assert backends.configured_name() == "jax"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert backends.configured_name() == "torch"


@pytest.mark.parametrize("cores", [1, 4], ids=["one core", "four cores"])
def test_a_task_and_an_executor_get_every_backends_thread_counts(cores):
    n = str(cores)
    interop = "1" if cores <= 2 else "2"
    assert backends.thread_env(cores) == {"TF_NUM_INTRAOP_THREADS": n, "TF_NUM_INTEROP_THREADS": interop,
                                          "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}
    assert backends.executor_env(cores) == {"OMP_NUM_THREADS": n, "TF_NUM_INTRAOP_THREADS": n,
                                            "TF_NUM_INTEROP_THREADS": n}


def test_gpu_memory_grows_on_demand_unless_the_user_chose_a_fraction(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert backends.gpu_memory_env() == {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    assert backends.gpu_memory_env() == {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def test_the_version_floors_of_the_backends_are_their_rooms():
    for name, backend in backends.BACKENDS.items():
        assert versions.FLOORS.get(name) == backend.floor
    assert list(versions.FLOORS)[:3] == ["pyspark", "keras", "numpy"]


def test_a_room_fed_numpy_refuses_a_tf_data_pipeline_and_says_why():
    fed_numpy = [b for b in backends.BACKENDS.values() if not b.feeds_tf_data]
    assert fed_numpy
    for backend in fed_numpy:
        with pytest.raises(NotImplementedError, match=f"the {backend.name} backend is fed numpy batches"):
            backend.host_tensors(np.zeros((2, 1)), np.zeros(2))


def test_the_rooms_import_no_keras_backend():
    code = ("import sys, trainer.backends, trainer.versions, trainer.process_env; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'keras', 'tensorflow', 'jax', 'torch'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_no_backend_is_named_outside_its_room():
    """What differs by backend is asked of its room: no name compared, no name as a default, anywhere else in the
    package, the jobs or the benchmarks."""
    found = []
    for path in sorted(p for package in ("trainer", "jobs", "benchmarks") for p in (REPO / package).rglob("*.py")):
        where = str(path.relative_to(REPO))
        if path.is_relative_to(ROOM) or where in NOT_A_CHOICE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in backends.NAMES:
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not found, "ask trainer.backends instead of naming a backend:\n" + "\n".join(found)
