"""The first fit learns like plain Keras: with no algorithm named, 2 and 8 workers (8 time-shared on this
machine's cores) reach plain Keras's quality on three small problems, for the same epochs and the same compiled
optimizer (jobs/bench_defaults.py, on an embedded cluster of its own: 8 task slots, more than the session's).

Bounds (issue 29): accuracy at most 0.02 below plain Keras's, loss at most 1.2x. Measured on this machine
(docs/algorithms.md has the table): at 2 and 8 workers within 0.0005 and 0.99-1.00x, at 4 within 0.003 and
1.02x; plain Keras alone moves by 0.004 and 1.06x from seed to seed on these problems, so the bounds leave a
margin of five times that. The old default (ADAG, window 12) missed them by 0.2-0.5 accuracy (REFERENCE.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_jobs.bench_defaults import ACCURACY_GAP, LOSS_RATIO, compare, make_problem

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_defaults_learn_like_plain_keras_at_2_and_8_workers(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "jobs" / "bench_defaults.py"), "--workers", "2,8",
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=1150)
    result = json.loads((tmp_path / "defaults.json").read_text()) if (tmp_path / "defaults.json").is_file() else None
    assert result is not None, done.stdout[-2000:] + done.stderr[-3000:]
    rows = result["rows"]
    assert {(r["problem"], r["workers"]) for r in rows} == {(p, n) for p in ("binary", "classes", "regression")
                                                           for n in (2, 8)}
    for row in rows:
        assert row["loss_ratio"] <= LOSS_RATIO, row
        if "accuracy" in row:
            assert row["accuracy"] >= row["plain_accuracy"] - ACCURACY_GAP, row
    by = {(r["problem"], r["workers"]): r for r in rows}
    assert by[("binary", 8)]["window"] == 1  # 8 workers: the staleness bound holds the window at one batch
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_bounds_and_the_problems():
    (x, y), (xt, yt) = make_problem("classes")
    assert x.shape == (10_000, 8) and xt.shape == (2_000, 8) and set(y.tolist()) == {0, 1, 2, 3}
    assert make_problem("binary")[0][0].shape == (10_000, 10)
    assert abs(float(make_problem("regression")[0][1].std()) - 1.0) < 1e-3
    plain = {"accuracy": 0.95, "loss": 0.2}
    assert compare("binary", 2, plain, {"accuracy": 0.931, "loss": 0.23}, 5)["within"]
    assert not compare("binary", 2, plain, {"accuracy": 0.929, "loss": 0.23}, 5)["within"]
    assert not compare("binary", 2, plain, {"accuracy": 0.95, "loss": 0.25}, 5)["within"]
    assert compare("regression", 8, {"loss": 10.0}, {"loss": 11.9}, 1)["within"]
    with pytest.raises(ValueError, match="Unknown problem"):
        make_problem("images")
