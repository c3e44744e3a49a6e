"""`ship_by_value`: user code reaches executors that do not have the user's files."""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
import textwrap
import threading

import pytest
from pyspark import cloudpickle

from trainer.runtime.shipping import ship_by_value


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module outside site-packages, importable here only (like a user's script folder)."""
    (tmp_path / "user_models.py").write_text(textwrap.dedent("""
        def build(units, scale=1.0):
            return {"units": units, "scale": scale}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("user_models")
    yield module
    cloudpickle.unregister_pickle_by_value(module)
    sys.modules.pop("user_models", None)


def _load_elsewhere(payload: bytes) -> str:
    """Unpickle in a fresh interpreter that cannot import user_models; return what the builder gives."""
    code = "import sys, pickle; print(pickle.loads(sys.stdin.buffer.read())())"
    proc = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.stdout.decode().strip()


@pytest.mark.timeout(120)
def test_a_partial_builder_ships_its_function_by_value(user_module):
    builder = functools.partial(user_module.build, 128, scale=2.0)
    ship_by_value(builder)  # used to register functools itself, which then failed to pickle
    assert _load_elsewhere(cloudpickle.dumps(builder)) == "{'units': 128, 'scale': 2.0}"


@pytest.mark.timeout(120)
def test_a_plain_builder_ships_by_value(user_module):
    ship_by_value(user_module.build)
    assert "units" in _load_elsewhere(cloudpickle.dumps(functools.partial(user_module.build, 8)))


@pytest.mark.timeout(60)
def test_a_builder_that_cannot_be_serialized_fails_with_the_fix():
    lock = threading.Lock()

    def builder():
        with lock:
            return None

    with pytest.raises(TypeError, match="cannot be sent to the executors.*module level"):
        ship_by_value(builder)
