"""The property map of docs/testing.md: every promise it lists names tests that exist, and every real-Spark,
container or per-backend test proves a promise of the map, so cutting a test cannot drop a promise silently.

Pure Python (the tests' source is read with `ast`, nothing is collected or run): ``make test-quick``'s tier.
A heavy test is one that runs on a real cluster (it takes a Spark fixture, directly or through another fixture, or
is marked ``spark``), in containers (``docker``) or once per Keras backend (``backend``).
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "testing.md"
BEGIN, END = "<!-- property-map:begin -->", "<!-- property-map:end -->"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")
HEAVY_MARKS = {"spark", "docker", "backend"}
SPARK_FIXTURES = {"spark", "local_cluster_2", "drivers_cluster"}


def map_rows(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """``(promise, [(file, test), ...])`` for each row of the map between its markers."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"docs/testing.md has no property map between {BEGIN} and {END}")
    rows = []
    for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("promise", "") or set(cells[0]) <= {"-", ":"}:
            continue
        rows.append((cells[0], REFERENCE.findall(cells[1])))
    return rows


def _marks(decorators: list[ast.expr]) -> set[str]:
    """The ``pytest.mark.NAME`` names in a list of decorators (or of a ``pytestmark`` value's elements)."""
    names = set()
    for node in decorators:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                names.add(sub.attr)
    return names


@lru_cache(maxsize=None)
def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _fixtures(tree: ast.Module) -> dict[str, set[str]]:
    """Each fixture of a module: the names of its arguments (the fixtures it asks for)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
            found[node.name] = {a.arg for a in node.args.args}
    return found


def defined_tests(path: Path) -> dict[str, set[str]]:
    """Each test function of a file (module level or in a class): the heavy kinds it is (``spark``, ``docker``,
    ``backend``), from its marks, its module's ``pytestmark`` and the Spark fixtures it needs."""
    tree = _module(path)
    module_marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            module_marks |= _marks([node.value])
    fixtures = {**_fixtures(_module(ROOT / "tests" / "conftest.py")), **_fixtures(tree)}

    def needs_spark(names: set[str], seen: frozenset = frozenset()) -> bool:
        return bool(names & SPARK_FIXTURES) or any(
            needs_spark(fixtures[n], seen | {n}) for n in names - seen if n in fixtures)

    found = {}
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    functions += [f for c in tree.body if isinstance(c, ast.ClassDef) for f in c.body
                  if isinstance(f, ast.FunctionDef)]
    for node in functions:
        if not node.name.startswith("test"):
            continue
        kinds = (module_marks | _marks(node.decorator_list)) & HEAVY_MARKS
        if needs_spark({a.arg for a in node.args.args}):
            kinds.add("spark")
        found[node.name] = kinds
    return found


def heavy_tests() -> dict[str, set[str]]:
    """``file::test`` of every heavy test of the suite, with its kinds."""
    heavy = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for name, kinds in defined_tests(path).items():
            if kinds:
                heavy[f"{path.relative_to(ROOT)}::{name}"] = kinds
    return heavy


def problems(text: str) -> list[str]:
    """What is wrong with a map: a promise with no test, a test that does not exist, a heavy test in no row."""
    found, mapped = [], set()
    for promise, references in map_rows(text):
        if not references:
            found.append(f"the promise {promise!r} names no test (`tests/FILE.py::test_name`)")
        for file, name in references:
            path = ROOT / file
            if not path.is_file() or name not in defined_tests(path):
                found.append(f"the promise {promise!r} names {file}::{name}, which does not exist")
            mapped.add(f"{file}::{name}")
    for test, kinds in heavy_tests().items():
        if test not in mapped:
            found.append(f"{test} ({', '.join(sorted(kinds))}) proves no promise of the map: add it to a row, "
                         "or cut it if another test proves the same")
    return found


def test_every_promise_has_a_test_and_every_heavy_test_a_promise():
    assert not problems(PAGE.read_text(encoding="utf-8")), "\n".join(problems(PAGE.read_text(encoding="utf-8")))


def test_the_checker_finds_a_missing_test_an_empty_row_and_an_unmapped_heavy_test():
    text = PAGE.read_text(encoding="utf-8")
    rows = map_rows(text)
    assert len(rows) >= 20, "the map lost most of its rows"
    bad = text.replace(END, "| a promise nobody proves | |\n| renamed | `tests/test_trainer.py::test_gone` |\n" + END)
    found = problems(bad)
    assert any("a promise nobody proves" in p and "names no test" in p for p in found), found
    assert any("test_gone, which does not exist" in p for p in found), found
    first_file, first_test = rows[0][1][0]
    dropped = text.replace(f"`{first_file}::{first_test}`", "`tests/test_trainer.py::test_gone`")
    if f"{first_file}::{first_test}" in heavy_tests():
        assert any(p.startswith(f"{first_file}::{first_test} ") for p in problems(dropped))


def test_heavy_tests_are_found_by_marks_and_by_the_fixtures_they_need():
    heavy = heavy_tests()
    assert heavy["tests/test_trainer.py::test_algorithm_trains_digits"] == {"spark"}  # digits -> spark
    assert "backend" in heavy["tests/test_backends.py::test_fit_resume_transform_evaluate_and_save_under_this_backend"]
    exactness = "tests/test_allreduce.py::test_collective_processes_without_spark_take_plain_keras_steps"
    assert heavy[exactness] == {"backend"}  # by a mark on one of its parameters
    assert "tests/test_algorithms.py::test_downpour_worker_sends_sum_of_gradient_steps" not in heavy


@pytest.mark.parametrize("text", ["no map here", BEGIN + "\n| promise | proved by |\n"])
def test_a_page_without_the_map_s_markers_is_refused(text):
    with pytest.raises(ValueError, match="no property map"):
        map_rows(text)
