"""The local-gradients train step (trainer.runtime.collective.jax_group) compiled and run over 2 CPU devices of ONE
process, for tests/test_collective_step.py.

Runs in its own process: ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` and ``KERAS_BACKEND=jax`` hold
only before JAX and Keras start. ``python tests/collective_step_client.py OUT.json`` writes, for a GRU over 12
timesteps under ``DataParallel`` on the 2 devices, the all-reduces of Keras's own SPMD step and of the local
step (how many, and how many inside a ``while`` loop's body) from XLA's compiled text; the largest difference
between the weights after 3 local steps and plain Keras's (one device, the same global batches), and between
their epoch's logs (the loss and a metric, over the global batches); and, for a
model with Dropout, the seed state after a step against plain Keras's and whether the two devices' halves of
the batch drew different masks.
"""

from __future__ import annotations

import json
import re
import sys

import numpy as np

GLOBAL_BATCH = 16


def allreduces(hlo: str) -> dict[str, int]:
    """All-reduce instructions in compiled HLO text: in all, and inside the body computation of a ``while``."""
    bodies = set(re.findall(r"\bbody=%?([\w.\-]+)", hlo))
    total = in_loops = 0
    name = None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(", line)
        if head and not line.startswith(" "):
            name = head.group(1)
        if re.search(r"\ball-reduce(?:-start)?\(", line):
            total += 1
            in_loops += name in bodies
    return {"total": total, "in_loops": in_loops}


def gru(keras):
    model = keras.Sequential([keras.Input((12, 3)), keras.layers.GRU(16), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mae", metrics=["mse"])
    return model


def dropout(keras):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dropout(0.5, seed=3), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def state_of(model):
    return ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables], [v.value for v in model.metrics_variables])


def main(out_path: str) -> None:
    import jax
    import keras
    from jax.sharding import NamedSharding, PartitionSpec

    from trainer.runtime.collective.jax_group import use_local_gradients

    rng = np.random.default_rng(0)
    x = rng.random((3 * GLOBAL_BATCH, 12, 3), np.float32)
    y = rng.random((3 * GLOBAL_BATCH, 1), np.float32)
    keras.utils.set_random_seed(1)
    plain = gru(keras)
    start = plain.get_weights()
    plain_logs = plain.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0).history

    distribution = keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    sharded = NamedSharding(distribution.device_mesh.backend_mesh, PartitionSpec(distribution.batch_dim_name))
    model = gru(keras)
    model.set_weights(start)
    installed = use_local_gradients(model, distribution)
    logs = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0).history
    logs_rel_diff = max(abs(logs[k][0] - plain_logs[k][0]) / abs(plain_logs[k][0]) for k in ("loss", "mse"))
    weight_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), plain.get_weights()))
    compiled = {}
    for step in ("spmd", "local"):  # a model each: tracing leaves tracers in a model that fit would trip over
        model = gru(keras)
        model.optimizer.build(model.trainable_variables)
        if step == "local":
            use_local_gradients(model, distribution)
        batch = tuple(jax.device_put(a[:GLOBAL_BATCH], sharded) for a in (x, y))
        compiled[step] = allreduces(jax.jit(model.train_step).lower(state_of(model), batch).compile().as_text())

    keras.distribution.set_distribution(None)
    xd, yd = np.ones((GLOBAL_BATCH, 8), np.float32), np.ones((GLOBAL_BATCH, 1), np.float32)
    plain_drop = dropout(keras)
    plain_drop.fit(xd, yd, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    keras.distribution.set_distribution(distribution)
    drop = dropout(keras)
    use_local_gradients(drop, distribution)
    drop.fit(xd, yd, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    halves = _dropout_halves(drop.layers[0], distribution, xd)

    out = {
        "devices": len(jax.devices()),
        "installed": installed,
        **compiled,
        "weight_diff": weight_diff,
        "logs_rel_diff": logs_rel_diff,
        "seed_state": [int(v) for v in np.asarray(drop.layers[0].seed_generator.state.value)],
        "plain_seed_state": [int(v) for v in np.asarray(plain_drop.layers[0].seed_generator.state.value)],
        "halves_differ": halves,
    }
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(out, fh)


def _dropout_halves(layer, distribution, x) -> bool:
    """Whether the two devices draw different masks when `layer` (a Dropout) runs as the local step runs it:
    inside ``shard_map``, its seed shifted by the device's offset."""
    import jax
    from jax.sharding import PartitionSpec

    from trainer.runtime.collective.jax_group import seed_offset, shift_seeds

    axis = distribution.batch_dim_name

    def apply(seed_state, data):
        (shifted,) = shift_seeds([seed_state], [0], seed_offset(axis))
        return layer.stateless_call([], [shifted], data, training=True)[0]

    run = jax.shard_map(apply, mesh=distribution.device_mesh.backend_mesh,
                        in_specs=(PartitionSpec(), PartitionSpec(axis)), out_specs=PartitionSpec(axis),
                        check_vma=False)
    out = np.asarray(run(layer.seed_generator.state.value, x))
    half = len(out) // 2
    return bool(np.any((out[:half] != 0) != (out[half:] != 0)))


if __name__ == "__main__":
    main(sys.argv[1])
