"""The collective loop's train step (trainer.runtime.collective.jax_group): local gradients, one all-reduce.

The compiled step is checked in a JAX process of its own with two CPU devices (XLA's
``--xla_force_host_platform_device_count``), no Spark: Keras's own SPMD step all-reduces inside the GRU's
backward loop (once per timestep: the reason the local step exists), the local step never does; 3 local
steps equal plain Keras's on the global batches, weights and logs; a Dropout layer's seed advances as in plain Keras while each
device draws its own masks. The whole loop with Spark is tests/test_allreduce.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).with_name("collective_step_client.py")


def test_a_model_with_its_own_train_step_keeps_it():
    import keras

    from trainer.runtime.collective.jax_group import has_keras_train_step

    class Custom(keras.Sequential):
        def train_step(self, *args, **kwargs):
            return super().train_step(*args, **kwargs)

    assert has_keras_train_step(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    assert not has_keras_train_step(Custom([keras.Input((2,)), keras.layers.Dense(1)]))


@pytest.mark.timeout(300)
def test_the_local_step_all_reduces_once_outside_any_loop_and_takes_plain_keras_steps(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "step.json"
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=os.pathsep.join([str(CLIENT.parent.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(CLIENT), str(out)], env=env, capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    seen = json.loads(out.read_text())
    assert seen["devices"] == 2 and seen["installed"]
    assert seen["spmd"]["in_loops"] >= 1, f"the control: Keras's SPMD step all-reduces in the loop ({seen})"
    assert seen["local"]["in_loops"] == 0, seen
    # The gradients in one all-reduce, the metrics' increments in at most one more (XLA may combine them).
    assert 1 <= seen["local"]["total"] <= 2, seen
    assert seen["weight_diff"] < 1e-5, seen
    assert seen["logs_rel_diff"] < 1e-5, "the logs cover the global batch, not one device's half"
    assert seen["seed_state"] == seen["plain_seed_state"], seen
    assert seen["halves_differ"], "each device draws its own dropout masks"
