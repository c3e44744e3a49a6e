"""The pages' figures come from the results files (docs/results/*.json) that the bench commands write.

`trainer_jobs.support.published` ties them: every decimal figure of README.md,
docs/benchmarks.md, docs/lab.md, docs/model-selection.md and docs/faults.md
sits in a ``<!-- results: NAME -->`` block and is one of NAME.json's figures,
and no file was measured more than one change of the default algorithm ago.
"""

from __future__ import annotations

import json

import pytest

from trainer_jobs.support import published

GENERATION = published.default_generation()


def test_every_figure_of_the_pages_is_its_results_file():
    problems = published.check()
    assert not problems, "\n".join(problems)


def test_the_default_generation_is_the_code_s():
    from trainer.algorithms.choice import DEFAULT_GENERATION

    assert GENERATION == DEFAULT_GENERATION


def _write(directory, name, numbers, **fields):
    data = {"name": name, "command": "make bench", "date": "2026-12-01", "machine": {"cores": 2},
            "commit": "abc", "default_generation": GENERATION, "source": "command", "figures": numbers}
    data.update(fields)
    (directory / f"{name}.json").write_text(json.dumps(data))


def test_a_figure_that_is_not_its_file_s_fails(tmp_path):
    _write(tmp_path, "run", {"rows": [{"speedup": 1.7944, "accuracy": 0.99213}]})
    page = "<!-- results: run -->\n2 workers: **1.79x**, test accuracy 99.2 %, 0.9921\n<!-- /results -->\n"
    assert published.check_page("page.md", page, tmp_path) == []
    drifted = page.replace("1.79x", "1.89x")
    assert published.check_page("page.md", drifted, tmp_path) == ["page.md:1: figures not in run: 1.89"]


def test_a_figure_outside_a_block_or_a_missing_file_fails(tmp_path):
    problems = published.check_page("page.md", "Python 3.11 (3.12 and 3.13); `1.5` in code; it took 1.79 s\n"
                                               "\n<!-- results: gone -->\nx\n<!-- /results -->", tmp_path)
    assert problems[0] == "page.md: figures outside a results block: 1.79"
    assert "gone.json, which does not exist" in problems[1]


@pytest.mark.parametrize(("fields", "expected"), [
    ({"default_generation": GENERATION - 1}, []),
    ({"default_generation": GENERATION - 2}, ["the default changed 2 times since"]),
    ({"source": "guessed"}, ["source 'guessed'"]),
    ({"date": "yesterday"}, ["date 'yesterday'"]),
    ({"figures": {"note": "none"}}, ["has no figures"]),
])
def test_a_results_file_s_own_problems(tmp_path, fields, expected):
    _write(tmp_path, "run", {"speedup": 1.5}, **fields)
    problems = published.problems_of_file(json.loads((tmp_path / "run.json").read_text()), GENERATION)
    assert len(problems) == len(expected) and all(e in p for e, p in zip(expected, problems)), problems


def test_publish_writes_the_run_s_record(tmp_path):
    path = published.publish(tmp_path, "run", {"rows": [{"speedup": 1.5}]}, command="make bench")
    data = json.loads(path.read_text())
    assert data["name"] == "run" and data["command"] == "make bench" and data["source"] == "command"
    assert data["default_generation"] == GENERATION and data["machine"]["cores"] >= 1
    assert published.problems_of_file(data, GENERATION) == []
    assert published.publish(None, "run", {}) is None
