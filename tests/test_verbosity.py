"""Quiet by default: the JVM's start-up banners are filtered, our logs follow TRAINER_LOG (trainer.verbosity)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from trainer import verbosity

CHILD = textwrap.dedent("""
    import subprocess, sys
    from trainer import verbosity
    with verbosity.quiet_child_stderr():
        child = subprocess.Popen([sys.executable, "-c", (
            "import sys, time\\n"
            "sys.stderr.write('WARNING: Using incubator modules: jdk.incubator.vector\\\\n')\\n"
            "sys.stderr.write('Setting default log level to \\"WARN\\".\\\\n')\\n"
            "sys.stderr.write('kept before\\\\n'); sys.stderr.flush(); time.sleep(0.5)\\n"
            "sys.stderr.write('kept after the block\\\\n')\\n")])
    sys.stderr.write("parent writes directly\\n")
    sys.stderr.flush()
    child.wait()
""")


def _run(level: str) -> str:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60,
                          env={"TRAINER_LOG": level, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_child_banners_are_dropped_and_everything_else_passes():
    err = _run("warning")
    assert "Using incubator modules" not in err and "Setting default log level" not in err
    assert "kept before" in err and "kept after the block" in err  # the child keeps the filter
    assert "parent writes directly" in err


def test_nothing_is_filtered_when_the_user_asks_for_info():
    err = _run("info")
    assert "Using incubator modules" in err and "Setting default log level" in err


@pytest.mark.parametrize(("name", "tf_level"), [("debug", "0"), ("info", "1"), ("warning", "2"), ("bogus", "2")])
def test_tensorflow_logs_follow_the_level(monkeypatch, name, tf_level):
    monkeypatch.setenv(verbosity.ENV, name)
    assert verbosity.quiet_env()["TF_CPP_MIN_LOG_LEVEL"] == tf_level


def test_configure_logging_quiet_and_verbose(monkeypatch):
    monkeypatch.setenv(verbosity.ENV, "warning")  # restored (or removed again) after the test
    monkeypatch.delenv(verbosity.ENV)
    assert verbosity.configure_logging(False) == logging.WARNING
    assert logging.getLogger("trainer").level == logging.WARNING
    assert logging.getLogger("py4j").level == logging.ERROR
    assert verbosity.configure_logging(True) == logging.INFO
    assert logging.getLogger("trainer").level == logging.INFO


def test_driver_log4j_levels(monkeypatch):
    assert "rootLogger.level = error" in verbosity.spark_log4j(logging.WARNING)
    assert "rootLogger.level = warn" in verbosity.spark_log4j(logging.INFO)
    assert "rootLogger.level = info" in verbosity.spark_log4j(logging.DEBUG)


IMPORT_KERAS = textwrap.dedent("""
    import os, sys
    from trainer import verbosity
    os.write(2, b"before\\n")
    verbosity.import_keras_quietly()
    import keras
    os.write(2, b"after " + keras.__version__.encode() + b"\\n")
""")


@pytest.mark.parametrize("level", ["warning", "info"])
def test_keras_import_banners_are_dropped_unless_asked_for(level):
    proc = subprocess.run([sys.executable, "-c", IMPORT_KERAS], capture_output=True, text=True, timeout=120,
                          env={"TRAINER_LOG": level, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "before" and lines[-1].startswith("after 3.")
    banners = [line for line in lines if any(b.decode() in line for b in verbosity.TF_BANNERS)]
    if level == "warning":
        assert banners == [], banners
    else:  # the banners TensorFlow prints on this CPU are passed on (x86 builds print oneDNN's)
        assert len(lines) - 2 == len(banners)


def test_importing_the_package_leaves_the_process_as_it_was_and_a_session_sets_its_defaults():
    # A notebook's own Keras must see its own settings (GPU memory, log levels) after `import trainer`;
    # the defaults apply where a session starts (trainer.process_env), a value the user set still wins.
    script = textwrap.dedent("""
        import json, os, warnings
        before = dict(os.environ)
        import trainer
        from trainer import Trainer, LocalCluster, FittedModel, spark_session
        from trainer.ml import KerasEstimator
        from trainer.selection import ModelSelector
        ours = [f for f in warnings.filters if f[1] is not None and "PySpark does not" in f[1].pattern]
        unchanged = dict(os.environ) == before and not ours  # (numpy and pyspark add filters of their own)
        from trainer.process_env import prepare_process
        os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "false"
        prepare_process()
        print(json.dumps([unchanged, {k: os.environ.get(k) for k in (
            "TF_CPP_MIN_LOG_LEVEL", "XLA_PYTHON_CLIENT_PREALLOCATE", "TF_FORCE_GPU_ALLOW_GROWTH")}]))
    """)
    env = {k: v for k, v in __import__("os").environ.items()
           if not k.startswith(("TF_", "XLA_", "ABSL_", "GRPC_", "TRAINER_"))}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    import json

    unchanged, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert unchanged, "importing trainer changed os.environ or added its warning filter"
    assert after == {"TF_CPP_MIN_LOG_LEVEL": "2", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                     "TF_FORCE_GPU_ALLOW_GROWTH": "false"}
