"""Run the collective loop's processes without Spark, as a fit's tasks would: a real parameter server in this
process (process 0 reports there once per epoch), one process per shard on the backend's own engine.

Used by the tests that compare the loop with plain Keras (tests/test_allreduce.py, tests/test_local_sgd.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def run_processes(model, shards: list[tuple[np.ndarray, np.ndarray]], algorithm, *, batch_size: int, epochs: int,
                  seed: int, shared_gpu: bool = False) -> tuple[list[dict], list[np.ndarray]]:
    """(each process's record, the state process 0 last reported) after `epochs` of `algorithm` (an `AllReduce`) over
    `shards`, from compiled `model`'s weights, under this process's Keras backend; `shared_gpu`: the jobs say that
    the processes share a GPU."""
    import keras

    from trainer.algorithms.reported import ReportedState
    from trainer.ps.server import ParameterServer
    from trainer.runtime.collective.loop import CollectiveJob
    from trainer.runtime.collective.collective_task import reserve_port, start_process, wait_process
    from trainer.runtime.shipping import ModelSource, pack_model
    from trainer.transport.wire import new_secret

    rows = len(shards[0][0])
    server = ParameterServer(ReportedState(), [w.copy() for w in model.get_weights()], 1, new_secret())
    server.start()
    ports, processes = [reserve_port() for _ in shards], []
    addresses = [f"127.0.0.1:{port.getsockname()[1]}" for port in ports]
    try:
        for pid, (sx, sy) in enumerate(shards):
            directory = Path(tempfile.mkdtemp(prefix="collective-test-"))
            for name, array in (("x", sx), ("y", sy), ("vx", sx[:0]), ("vy", sy[:0])):
                np.save(directory / f"{name}.npy", array)
            job = CollectiveJob(model=ModelSource(keras_bytes=pack_model(model, None).data),
                                ps_address=server.address, secret=server.credentials, addresses=addresses,
                                process_id=pid, num_processes=len(shards), batch_size=batch_size, epochs=epochs,
                                seed=seed, keras_backend=keras.backend.backend(), shared_gpu=shared_gpu,
                                lr_factor=algorithm.learning_rate_factor(len(shards)), cadence=algorithm.cadence(),
                                parent_pid=os.getpid(),
                                record={"worker": pid, "attempt": 0, "rows": rows, "padded_rows": rows})
            processes.append((start_process(directory, job), directory))
        records = [wait_process(process, directory, pid) for pid, (process, directory) in enumerate(processes)]
        return records, server.center()
    finally:
        server.stop()
        for port in ports:
            port.close()
