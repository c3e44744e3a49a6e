"""Where the suite's minutes go (tests/suite_time.py): the streams, the slowest tests, the budget line, read from
files as make test and .ci/run write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import suite_time

TIMED = Path(__file__).with_name("timed.sh")


def _write(artifacts: Path) -> None:
    artifacts.mkdir(exist_ok=True)
    (artifacts / "streams.tsv").write_text("make test\t1000\t2080\t0\nmain\t1000\t2060\t0\njax\t1000\t1150\t1\n")
    (artifacts / "timeline.tsv").write_text(
        "main\tgw0:tensorflow\tsession-cluster\t1000\t1100\ttests/test_a.py::test_slow\n"
        "main\tgw1:tensorflow\ttests/test_b.py\t1000\t1002\ttests/test_b.py::test_quick\n"
        "jax\tmain:jax\ttests/test_a.py\t1000\t1030\ttests/test_a.py::test_slow\n"
        "a torn line\n")
    (artifacts / "fixtures.tsv").write_text("main\tlocal_cluster_2\tsession\t1000\t1025\n")


def test_the_report_gives_each_stream_the_slowest_tests_and_the_budget(tmp_path):
    _write(tmp_path)
    text = suite_time.report(tmp_path, slowest=2, files=True, fixtures=True, budgets={"make test": 18, "jax": 2})
    assert "| make test | 0.0 | 18.0 |  |  | 0 |" in text
    assert "| main | 0.0 | 17.7 | 2 | 1.7 | 0 |" in text  # two tests, 102 s of their own
    assert "| jax | 0.0 | 2.5 | 1 | 0.5 | 1 |" in text
    slowest = text.split("slowest tests:")[1].split("Minutes by")[0]
    assert slowest.index("| 100 | main | `tests/test_a.py::test_slow`") < slowest.index("| 30 | jax |")
    assert "test_quick" not in slowest  # only the 2 slowest
    assert "| 2.2 | 2 | `tests/test_a.py` |" in text  # 130 s over two streams
    assert "| 25 | 1 | `local_cluster_2` (session) |" in text
    assert "make test: 18.0 minutes, 100 % of its 18-minute budget (within;" in text
    assert "jax: 2.5 minutes, 125 % of its 2-minute budget (OVER;" in text


def test_nothing_recorded_is_said_and_a_bad_budget_refused(tmp_path, capsys):
    assert "no streams recorded" in suite_time.report(tmp_path, budgets={"make test": 18})
    assert "make test: no time recorded" in suite_time.report(tmp_path, budgets={"make test": 18})
    with pytest.raises(SystemExit):
        suite_time.main(["--artifacts", str(tmp_path), "--budget", "eighteen"])
    assert "STREAM=MINUTES" in capsys.readouterr().err


def test_timed_sh_records_a_stream_with_its_status_and_names_it_for_the_tests(tmp_path):
    """tests/timed.sh writes the checkout's test-artifacts/streams.tsv: here a copy of it in a folder of its own."""
    (tmp_path / "tests").mkdir()
    script = tmp_path / "tests" / "timed.sh"
    script.write_text(TIMED.read_text())
    done = subprocess.run(["bash", str(script), "probe", sys.executable, "-c",
                           "import os, sys; print(os.environ['TEST_STREAM']); sys.exit(3)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout.strip() == "probe"
    subprocess.run(["bash", str(script), "--record", "make test", "100.5", "0"], check=True, timeout=60)
    streams = suite_time.read_streams(tmp_path / "test-artifacts")
    assert [(s.name, s.detail) for s in streams] == [("probe", "3"), ("make test", "0")]
    assert streams[1].start == 100.5 and streams[1].end > streams[0].start


def test_a_published_run_joins_the_last_ones(tmp_path):
    _write(tmp_path / "artifacts")
    for _ in range(3):
        path = suite_time.publish_run(tmp_path / "results", tmp_path / "artifacts", keep=2, commit="abc")
    runs = json.loads(path.read_text())["figures"]["runs"]
    assert len(runs) == 2 and runs[-1]["commit"] == "abc"
    assert runs[-1]["streams"]["make test"] == {"minutes": 18.0, "tests": 0, "exit": "0"}
    assert runs[-1]["streams"]["main"]["tests"] == 2
    assert runs[-1]["files"] == {"tests/test_a.py": 2.2, "tests/test_b.py": 0.0}
