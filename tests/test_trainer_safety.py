"""A fit on a hostile network, with a diverging worker, and on a full disk (real Spark, real Keras).

* a relay between the executors and the driver flips a byte of every COMMIT:
  the parameter server refuses them and the fit fails with a clear error;
* one worker's shard holds a row that makes its weights NaN: the server
  refuses its commits, the fit stops with a TrainingFailedError saying what
  to change, and the checkpoint on disk stays finite;
* the checkpoint directory is on a full disk: the fit still returns its model
  and says where the checkpoint could not be written.
"""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest

from conftest import digits_model
from relay import Relay
from trainer import ADAG, Trainer
from trainer.fit.checkpoints import load_checkpoint
from trainer.errors import TrainingFailedError

pytestmark = pytest.mark.spark


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_a_fit_through_a_relay_that_alters_commits_fails_with_a_clear_error(spark, digits):
    train, _ = digits
    port = _free_port()
    # Executors connect to 127.0.0.2 (the relay); the server listens on 127.0.0.1, same port.
    with Relay(("127.0.0.1", port), "flip", listen=("127.0.0.2", port)) as relay:
        trainer = Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=1, ps_host="127.0.0.2",
                          ps_bind_host="127.0.0.1", ps_port=port, verbose=False)
        with pytest.raises(TrainingFailedError, match=r"integrity check failed: .*COMMIT.*failed its integrity check"):
            trainer.fit(train.limit(400))
    assert relay.attacks_done >= 1


@pytest.mark.timeout(600)
def test_a_worker_that_diverges_to_nan_stops_the_fit_and_the_checkpoint_stays_finite(spark, digits, tmp_path, caplog):
    train, _ = digits
    # One row whose features overflow float32 in the first layer: the worker holding it gets NaN weights.
    poison = spark.createDataFrame([([3e38] * 64, 3)], "features array<float>, label int")
    data = train.limit(600).union(poison)
    trainer = Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=3, checkpoint_dir=tmp_path,
                      checkpoint_every=2, verbose=False)
    with caplog.at_level(logging.ERROR, logger="trainer.ps"):
        with pytest.raises(TrainingFailedError) as failed:
            trainer.fit(data)
    text = str(failed.value)
    assert text.startswith("Training stopped: the parameter server refused the COMMIT of worker"), text
    assert "NaN" in text and "'sequential" in text and "at step" in text, "names the weight and the step"
    assert "lower the learning rate" in text and "extreme values in its rows" in text
    assert "refused the COMMIT of worker" in caplog.text, "the driver logs an ERROR"
    saved = load_checkpoint(tmp_path)
    assert all(np.isfinite(a).all() for a in saved.center), "a non-finite model is never checkpointed"


@pytest.mark.timeout(600)
def test_a_final_save_on_a_full_disk_still_returns_the_fitted_model(spark, digits, full_disk, caplog):
    train, test = digits
    directory, _ = full_disk
    trainer = Trainer(digits_model(), algorithm=ADAG(window=4), num_workers=2, epochs=2,
                      checkpoint_dir=directory / "checkpoints", verbose=False)
    with caplog.at_level(logging.WARNING, logger="trainer.fit.checkpoints"):
        fitted = trainer.fit(train)
    failed = [e for e in fitted.history.events if e.get("event") == "checkpoint_failed"]
    assert failed and "the disk is full" in failed[0]["error"], fitted.history.events
    assert str(directory / "checkpoints") in failed[0]["error"] and str(directory / "checkpoints") in caplog.text
    assert fitted.evaluate(test)["accuracy"] >= 0.8
