"""The house rules of docs/architecture.md: which room may import which, module size, absolute imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from marked_tables import with_table

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "trainer"

def _rooms_of_the_docs() -> dict[str, set[str]]:
    """room -> rooms it may import, read from the table of docs/architecture.md ("The rooms"): one source.

    A row names its rooms in the first column (`fit/`, `errors.py`; several rooms share a row and may import
    each other) and what they may import in the last (rooms in backticks, or "nothing").
    """
    import re

    allowed: dict[str, set[str]] = {}
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    for line in text.split("## The rooms", 1)[1].split("## Outside the package", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) < 3 or cells[0].startswith("`trainer/__init__"):
            continue
        rooms = [name.removesuffix("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", cells[0])]
        imports = set(re.findall(r"`([^`]+)`", cells[-1]))
        assert imports or cells[-1] == "nothing", f"docs/architecture.md: cannot read what {rooms} may import"
        for room in rooms:
            allowed[room] = imports | set(rooms)
    return allowed


ALLOWED = _rooms_of_the_docs()


def test_the_rooms_table_names_every_room_and_only_rooms():
    rooms = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert set(ALLOWED) == rooms, f"docs/architecture.md's table lists {sorted(set(ALLOWED) - rooms)} that the " \
                                  f"package lacks and lacks {sorted(rooms - set(ALLOWED))}"
    for room, imports in ALLOWED.items():
        assert imports <= rooms, f"docs/architecture.md: {room} may import {sorted(imports - rooms)}: not rooms"


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "trainer" or len(parts) == 1:
        return None  # the package's __init__ re-exports lazily; it is not a room
    return parts[1]


def _imports(path: Path) -> list[tuple[str, ast.AST, bool]]:
    """(imported module, node, inside a function) for every import of a `trainer` module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, ast.AST, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module:
                if child.module == "trainer":  # from trainer import verbosity: the submodules are the rooms
                    found.extend((f"trainer.{a.name}", child, in_function) for a in child.names)
                elif child.module.startswith("trainer."):
                    found.append((child.module, child, in_function))
            elif isinstance(child, ast.Import):
                found.extend((a.name, child, in_function) for a in child.names if a.name.startswith("trainer."))
            visit(child, inner)

    visit(tree, False)
    return found


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_rooms_import_only_what_architecture_md_allows(path):
    module = _module_name(path)
    room = _room(module)
    if room is None:
        return
    assert room in ALLOWED, f"{module} is in a room docs/architecture.md does not list: {room!r}"
    for imported, node, _ in _imports(path):
        target = _room(imported)
        if target is None or target == room:
            continue
        assert target in ALLOWED[room], (
            f"{module}:{node.lineno} imports {imported}: room {room!r} may import only {sorted(ALLOWED[room])} "
            "(docs/architecture.md)"
        )


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_modules_stay_small(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 600, f"{path.relative_to(REPO)} has {lines} lines; split it along a real seam"


def test_no_two_modules_of_the_package_share_a_name():
    """A name says what a module holds: two rooms' `task.py` (or `driver.py`, `client.py`) would not."""
    by_name: dict[str, list[str]] = {}
    for path in _modules():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules that share a name: {shared}; name each for what it holds (docs/architecture.md)"


def test_one_word_for_an_update_rule_in_the_package_and_the_docs():
    """`algorithm` (the parameter, the package, the class); "rule" only where it means another thing."""
    import re

    other_senses = re.compile(r"MOP rules|house rules|lab's rules|one more rule \(\[lab")
    pages = [*_modules(), REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = []
    for path in pages:
        if path.name == "benchmarks-history.md":  # measurements of past changes, kept as they were written
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\b[Rr]ules?\b", other_senses.sub("", line)):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:80]}")
    assert not found, "say 'algorithm' for an update rule:\n" + "\n".join(found)


def test_imports_are_absolute_and_local_ones_say_why():
    problems = []
    for path in _modules() + _outside_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        source = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                problems.append(f"{path.relative_to(REPO)}:{node.lineno}: relative import")
        if path.is_relative_to(PACKAGE):
            for imported, node, in_function in _imports(path):
                if in_function and "#" not in source[node.lineno - 1]:
                    problems.append(f"{path.relative_to(REPO)}:{node.lineno}: local import of {imported} "
                                    "without a comment saying why")
    assert not problems, "\n".join(problems)


def _trainer_imports_in_user_facing_code() -> list[tuple[str, str, str]]:
    """(where, module, name) for every `from trainer... import name` in the notebooks and the docs' examples."""
    import json
    import re

    found = []
    sources = [(str(p.relative_to(REPO)), "".join(c["source"]))
               for p in sorted((REPO / "jobs").rglob("*.ipynb"))
               for c in json.loads(p.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)
        sources.extend((str(page.relative_to(REPO)), block) for block in blocks)
    for where, text in sources:
        for module, names in re.findall(r"^\s*from (trainer[\w.]*) import ([\w, ]+)", text, flags=re.M):
            found.extend((where, module, name.strip()) for name in names.split(",") if name.strip())
    return found


def test_notebooks_and_docs_import_what_the_package_has():
    # The container test runs the notebook only where a Docker engine is; a moved module must fail here too.
    import importlib

    missing = []
    for where, module, name in _trainer_imports_in_user_facing_code():
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{where}: from {module} import {name}: {exc}")
            continue
        if not hasattr(imported, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{where}: {module} has no {name}")
    assert _trainer_imports_in_user_facing_code(), "found no examples: the pattern is broken"
    assert not missing, "\n".join(missing)


def test_every_module_path_the_readme_and_docs_name_exists():
    # Users copy the paths the pages name (``trainer.lr_schedules.warmup_cosine``); a moved module must fail
    # here. A history row of docs/testing.md that names an old path says so with "imported".
    import importlib
    import re

    missing, checked = [], set()
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in page.read_text(encoding="utf-8").splitlines():
            if "imported `trainer." in line or "tagged trainer." in line:
                continue
            for name in set(re.findall(r"(?<![\w/.])(trainer(?:\.[A-Za-z_]\w*)+)", line)):
                if name.endswith(".py"):
                    continue
                checked.add(name)
                parts = name.split(".")
                for cut in range(len(parts), 0, -1):
                    try:
                        found = importlib.import_module(".".join(parts[:cut]))
                        break
                    except ImportError:
                        continue
                for attribute in parts[cut:]:
                    found = getattr(found, attribute, None)
                if found is None:
                    missing.append(f"{page.relative_to(REPO)}: {name}")
    assert len(checked) > 20, sorted(checked)  # the pattern still finds the pages' paths (31 on 2026-11-27)
    assert not missing, "\n".join(sorted(set(missing)))


def test_no_function_is_longer_than_120_lines():
    # A longer one hides parts that cannot be tested alone (make_sync_callback had 212 lines and a class inside).
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 120:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: "
                            f"{node.end_lineno - node.lineno + 1} lines")
    assert not long, "\n".join(long)


def _outside_rules() -> dict[str, set[str]]:
    """folder -> the modules its files may import, read from docs/architecture.md's "Outside the package" table."""
    import re

    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").split("## Outside the package", 1)[1]
    text = text.split("\n## ", 1)[0]  # the section only: later tables (the kinds of fit) are not the folders'
    rules = {}
    for line in text.splitlines():
        if line.startswith("| `") and line.count("|") >= 5:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rules[cells[0].strip("`").rstrip("/")] = set(re.findall(r"`([^`]+)`", cells[-1]))
    return rules


OUTSIDE = _outside_rules()
_OURS = ("trainer", "trainer_jobs", "trainer_benchmarks")


def _our_imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every import of our packages, at module level or inside."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in _OURS:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] in _OURS)
    return found


def _outside_modules() -> list[Path]:
    return sorted(p for folder in OUTSIDE for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_jobs_and_benchmarks_import_the_public_api_and_the_declared_seam_only():
    import trainer
    import trainer.internals as seam

    assert set(OUTSIDE) == {"jobs", "benchmarks"}, f"docs/architecture.md's outside table: {sorted(OUTSIDE)}"
    assert "trainer_benchmarks" not in OUTSIDE["jobs"], "the jobs must not depend on the benchmarks"
    problems = []
    for path in _outside_modules():
        allowed = OUTSIDE[path.relative_to(REPO).parts[0]]
        for module, names, line in _our_imports(path):
            where = f"{path.relative_to(REPO)}:{line} imports {module}"
            if module.split(".")[0] != "trainer":  # trainer_jobs / trainer_benchmarks: the folders' own packages
                if module.split(".")[0] not in allowed:
                    problems.append(f"{where}: {path.relative_to(REPO).parts[0]}/ may not import it")
            elif module == "trainer":  # `from trainer import X`: X a public name or a public module
                bad = [n for n in names if n not in trainer.__all__ and f"trainer.{n}" not in allowed]
                problems.extend(f"{where} {n}: not public" for n in bad)
            elif module not in allowed:
                problems.append(f"{where}: not public; add what it needs to trainer.internals.SEAM")
            elif module == "trainer.internals":
                problems.extend(f"{where} {n}: not in SEAM" for n in names if n not in seam.__all__)
    assert _outside_modules(), "found no modules of jobs/ or benchmarks/"
    assert not problems, "\n".join(problems)


def test_every_name_of_the_seam_resolves_and_is_used():
    import trainer.internals as seam

    used = {n for path in _outside_modules() for module, names, _ in _our_imports(path)
            if module == "trainer.internals" for n in names}
    missing = [name for name in seam.__all__ if getattr(seam, name, None) is None]
    assert not missing, f"trainer.internals names what the package no longer has: {missing}"
    assert set(seam.__all__) == used, (f"SEAM names {sorted(set(seam.__all__) - used)}, which no job or benchmark "
                                       f"uses; they use {sorted(used - set(seam.__all__))}, which it lacks")
    with pytest.raises(AttributeError, match="add it to SEAM"):
        seam.Trainer  # noqa: B018  (the public API is not re-exported here)


# ---------------------------------------------------------- the folders beside the package, drawn by path

#: The import name of each folder beside the package (pyproject.toml's package-dir): `trainer_jobs` is jobs/.
FOLDERS = {"trainer_jobs": "jobs", "trainer_benchmarks": "benchmarks"}
ARCHITECTURE = REPO / "docs" / "architecture.md"
BENCHMARKS_USE_JOBS = ("<!-- benchmarks-use-jobs:begin -->", "<!-- benchmarks-use-jobs:end -->")
SEAM_TABLE = ("<!-- seam:begin -->", "<!-- seam:end -->")


def _file_of(module: str) -> Path | None:
    """The file that `module` of our folders is, by path (``trainer_jobs.support.cli`` -> jobs/support/cli.py)."""
    top, *rest = module.split(".")
    folder = REPO / FOLDERS[top]
    candidates = [folder.joinpath(*rest).with_suffix(".py")] if rest else []
    return next((c for c in [*candidates, folder.joinpath(*rest, "__init__.py")] if c.is_file()), None)


def _files_imported(path: Path) -> list[tuple[Path | None, str, int]]:
    """(the file, the module as written, line) for every import of `trainer_jobs` / `trainer_benchmarks` in `path`;
    ``from trainer_jobs.support import cli`` imports the file jobs/support/cli.py."""
    found = []
    for module, names, line in _our_imports(path):
        if module.split(".")[0] not in FOLDERS:
            continue
        submodules = [f"{module}.{n}" for n in names if _file_of(f"{module}.{n}") is not None]
        found.extend((_file_of(m), m, line) for m in submodules or [module])
    return found


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_folders_are_installed_under_the_names_their_imports_use():
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert setup["package-dir"] == FOLDERS, f"pyproject.toml installs {setup['package-dir']}; this test reads {FOLDERS}"
    for name, folder in {"trainer": "trainer", **FOLDERS}.items():  # a package left out is missing from the wheel
        packages = {p.parent for p in (REPO / folder).rglob("__init__.py") if "__pycache__" not in p.parts}
        listed = {REPO / folder / Path(*p.split(".")[1:]) for p in setup["packages"] if p.split(".")[0] == name}
        assert packages == listed, f"pyproject.toml's packages of {name} differ from the packages of {folder}/"


def test_every_import_of_the_jobs_and_benchmarks_is_a_file_of_their_folders():
    # Including the library's command, which runs them by module name (trainer/cli/jobs.py, never imported).
    from trainer.cli.jobs import JOBS

    missing = [f"{_relative(path)}:{line} imports {module}: no such file under {FOLDERS[module.split('.')[0]]}/"
               for path in _outside_modules() for found, module, line in _files_imported(path) if found is None]
    missing += [f"trainer/cli/jobs.py runs {module}: no such file" for module, _ in JOBS.values()
                if _file_of(module) is None]
    assert not missing, "\n".join(missing)


def benchmarks_use_jobs() -> dict[str, list[str]]:
    """benchmark file -> the files of jobs/ it imports, every path relative to the repository."""
    uses: dict[str, set[str]] = {}
    for path in _outside_modules():
        if path.is_relative_to(REPO / "benchmarks"):
            jobs = {_relative(f) for f, module, _ in _files_imported(path) if f is not None
                    and module.startswith("trainer_jobs")}
            if jobs:
                uses[_relative(path)] = jobs
    return {bench: sorted(jobs) for bench, jobs in sorted(uses.items())}


def make_benchmarks_use_jobs_table() -> str:
    rows = [f"| `{bench}` | {', '.join(f'`{j}`' for j in jobs)} |" for bench, jobs in benchmarks_use_jobs().items()]
    return "\n".join(["| benchmark file | the files of `jobs/` it imports |", "|---|---|", *rows])


def make_seam_table() -> str:
    import trainer.internals as seam

    rows = [f"| {why} | {'; '.join(f'`{m}`: ' + ', '.join(f'`{n}`' for n in names) for m, names in modules.items())} |"
            for why, modules in seam.SEAM.items()]
    return "\n".join(["| why the public API does not serve | module: names |", "|---|---|", *rows])


def _with_tables(page: str) -> str:
    page = with_table(page, BENCHMARKS_USE_JOBS, make_benchmarks_use_jobs_table())
    return with_table(page, SEAM_TABLE, make_seam_table())


def test_architecture_md_tables_of_the_seam_and_of_the_benchmarks_use_of_the_jobs_are_the_code_s():
    page = ARCHITECTURE.read_text(encoding="utf-8")
    assert all(m in page for m in BENCHMARKS_USE_JOBS + SEAM_TABLE), "docs/architecture.md lost a table's markers"
    assert len(benchmarks_use_jobs()) >= 5, benchmarks_use_jobs()  # the drawing still finds them (10 on 2026-11-28)
    assert page == _with_tables(page), ("docs/architecture.md's tables of the seam or of the benchmarks' use of the "
                                        "jobs differ from the code: run `python tests/test_architecture.py --write`")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_architecture.py --write   (writes docs/architecture.md's generated tables)")
    ARCHITECTURE.write_text(_with_tables(ARCHITECTURE.read_text(encoding="utf-8")), encoding="utf-8")
    print("wrote the tables of the seam and of the benchmarks' use of the jobs into docs/architecture.md")
