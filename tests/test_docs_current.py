"""README.md and docs/*.md say what is true of the code now, and name only what the repository holds.

Four checks, pure Python (no Spark), in ``make test-quick``'s tier:

* **No history in the pages.** A commit hash, a date used as history ("before 2026-11-27", "until ...",
  "since ..."), a numbered issue ("issue 27") or a phrase that only meant something to the people who wrote it
  ("the morning", "the card", "the seed's CNN") belongs to CHANGELOG.md, not to a page a user reads.
  docs/benchmarks-history.md is the one archive of earlier results and is left out.
* **No files that are not there.** A page or a code comment that cites ``SOMETHING.md`` or a path under one of
  the repository's folders (``trainer/...``, ``jobs/...``, ``docs/...``) must name a file or folder that exists.
* **The test files' table of docs/testing.md is made from the tests**: one row per test file, its docstring's
  first sentence; ``python tests/test_docs_current.py --write`` writes it between its markers.
* **Defaults as the code has them.** ``STATED_DEFAULTS`` declares where a page states a default and which
  option it is; the value in the text must equal ``FitOptions.default(name)`` (``trainer/options.py``) or the
  algorithm's own field. A page that drops the sentence fails too: move the row with it.

Code blocks and code spans count for the file check (a path in backticks is a claim), not for the history check
(a hash in a command's output is not history); link targets are left to ``test_docs_links.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from marked_tables import with_table as marked_table
from trainer.algorithms import AllReduce
from trainer.options import FitOptions

ROOT = Path(__file__).resolve().parents[1]
ARCHIVES = {"docs/benchmarks-history.md"}  # earlier results, kept as a record; CHANGELOG.md is not a page either
PAGES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
         if str(p.relative_to(ROOT)) not in ARCHIVES]
CODE_DIRS = ("trainer", "jobs", "benchmarks", "tests", "images", "compose", "k8s")

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
DATE = r"20\d\d-[01]\d-[0-3]\d"
HISTORY = {
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    "a date used as history": re.compile(rf"\b(?:before|until|since|till|after|from|replaced on)\s+(?:the\s+)?{DATE}",
                                         re.IGNORECASE),
    "a numbered issue of this project": re.compile(r"\b[Ii]ssues?\s+#?\d+\b"),
    "an insider's phrase": re.compile(r"\bthe morning\b|\bthe card\b|\bthe seed's\b|\bnot measured yet\b",
                                      re.IGNORECASE),
}
#: The repository's folders: a path starting with one of them is a claim that the file is there.
TOP_LEVEL = [".ci", "benchmarks", "compose", "docs", "images", "jobs", "k8s", "requirements", "tests", "trainer"]
#: Files a command or the user writes (results/BENCH.md by `make bench`; compose/.env, Compose's optional file).
WRITTEN = {"BENCH.md", "compose/.env"}
UPPER_MD = re.compile(r"(?<![\w/.-])([A-Z][A-Z_-]+\.md)\b")
PLACEHOLDER = re.compile(r"[*<>{}]|\.\.\.|\bJOB\b|\bCELL\b|\bNAME\b")

#: (page, the sentence with the value as its one group, the option, how to read the text). Keep each row's
#: sentence in its page: a row whose sentence is gone fails, so the table cannot drift away from the pages.
STATED_DEFAULTS = [
    ("docs/guide.md", r"`Trainer\(model\)` with no `algorithm` runs the default, `\"(\w+)\"`", "algorithm", str),
    ("docs/guide.md", r"Defaults: `num_workers=(\d+)`", "num_workers", int),
    ("docs/guide.md", r"Defaults: .*?`batch_size=(\d+)`", "batch_size", int),
    ("docs/guide.md", r"Defaults: .*?`epochs=(\d+)`", "epochs", int),
    ("docs/guide.md", r"Defaults: .*?`verbose=(True|False)`", "verbose", lambda text: text == "True"),
    ("docs/guide.md", r"Defaults: .*?`algorithm=\"(\w+)\"`", "algorithm", str),
    ("docs/guide.md", r"the last `history_size` updates, ([\d,]+) by default", "history_size",
     lambda text: int(text.replace(",", ""))),
    ("docs/guide.md", r"after `slot_timeout`, (\d+) s\)", "slot_timeout", float),
    ("docs/guide.md", r"retried `max_retries` times \((\d+)\)", "max_retries", int),
    ("docs/guide.md", r"number of workers \(`lr_scaling=\"(\w+)\"`\)", "AllReduce.lr_scaling", str),
    ("README.md", r"progress bar \(`verbose=(True|False)`, the default", "verbose", lambda text: text == "True"),
]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced blocks, without code spans and link targets."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else LINK_TARGET.sub("]()", CODE_SPAN.sub("", line)))
    return lines


def history_found(text: str) -> list[tuple[int, str, str]]:
    """(line, what, the match) for every piece of history in a page's prose."""
    return [(number, what, match.group(0))
            for number, line in enumerate(prose(text), start=1)
            for what, pattern in HISTORY.items() for match in pattern.finditer(line)]


def path_pattern(folders: list[str]) -> re.Pattern:
    """Paths that start with one of the repository's `folders` (``trainer/fit/driver.py``, ``docs/``)."""
    return re.compile(rf"(?<![\w./-])((?:{'|'.join(map(re.escape, folders))})/[\w./*<>-]*[\w/*>])")


def missing_files(text: str, root: Path = ROOT, paths: re.Pattern | None = None) -> list[tuple[int, str]]:
    """(line, name) for every repository path or ``NAME.md`` a text names that the repository does not hold."""
    found, paths = [], paths or path_pattern(TOP_LEVEL)
    for number, line in enumerate(text.splitlines(), start=1):
        line = LINK_TARGET.sub("]()", line)
        for match in paths.finditer(line):
            name = match.group(1).rstrip(".")
            if PLACEHOLDER.search(name) or name in WRITTEN or (root / name).exists() or (root == ROOT and made_by_a_command(name)):
                continue
            found.append((number, name))
        for match in UPPER_MD.finditer(line):
            name = match.group(1)
            if not any((where / name).exists() for where in (root, root / "docs")):
                found.append((number, name))
    return found


@lru_cache(maxsize=None)
def made_by_a_command(name: str) -> bool:
    """Whether the repository ignores `name`: a file a command makes (``make up`` writes compose/lab-secrets.env).
    git answers in a checkout; elsewhere (an sdist, an exported tree) the patterns of .gitignore do."""
    try:
        code = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT, timeout=30,
                              capture_output=True).returncode
        if code in (0, 1):
            return code == 0
    except (OSError, subprocess.SubprocessError):
        pass
    path = Path(name)
    for folder in [Path("."), *reversed(path.parents[:-1])]:  # the root's .gitignore, then each folder's own
        ignore = ROOT / folder / ".gitignore"
        rest = str(path.relative_to(folder))
        for pattern in ignore.read_text(encoding="utf-8").splitlines() if ignore.exists() else []:
            pattern = pattern.strip().lstrip("/").rstrip("/")
            if pattern and not pattern.startswith(("#", "!")) and any(
                    fnmatch.fnmatch(candidate, pattern) or fnmatch.fnmatch(candidate, pattern + "/*")
                    for candidate in (rest, path.name)):
                return True
    return False


def stated_default(option: str):
    if option.startswith("AllReduce."):
        field = {f.name: f for f in dataclasses.fields(AllReduce)}[option.split(".", 1)[1]]
        return field.default
    return FitOptions.default(option)


@pytest.mark.parametrize("page", PAGES, ids=_shown)
def test_pages_keep_history_out(page):
    problems = [f"{_shown(page)}:{number}: {what}: {text!r}"
                for number, what, text in history_found(page.read_text(encoding="utf-8"))]
    assert not problems, ("History belongs in CHANGELOG.md; say what is true now (and the command that shows it):\n"
                          + "\n".join(problems))


@pytest.mark.parametrize("page", PAGES, ids=_shown)
def test_pages_name_only_files_in_the_repository(page):
    problems = [f"{_shown(page)}:{number}: {name}" for number, name in missing_files(page.read_text(encoding="utf-8"))]
    assert not problems, "No such file or folder in the repository:\n" + "\n".join(problems)


def test_the_code_cites_no_file_outside_the_repository():
    problems = []
    for folder in CODE_DIRS:
        for source in sorted((ROOT / folder).rglob("*")):
            if (source.suffix not in {".py", ".sh", ".yaml", ".yml", ".toml", ""} or not source.is_file()
                    or source == Path(__file__).resolve()):  # this module names examples
                continue
            try:
                text = source.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for number, line in enumerate(text.splitlines(), start=1):
                for match in UPPER_MD.finditer(line):
                    name = match.group(1)
                    if name not in WRITTEN and not any((where / name).exists() for where in (ROOT, ROOT / "docs")):
                        problems.append(f"{source.relative_to(ROOT)}:{number}: {name}")
    assert not problems, "Cited, but not in the repository (say what it stood for instead):\n" + "\n".join(problems)


@pytest.mark.parametrize("page, sentence, option, read", STATED_DEFAULTS,
                         ids=[f"{row[0]}:{row[2]}" for row in STATED_DEFAULTS])
def test_a_default_a_page_states_is_the_code_s(page, sentence, option, read):
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())  # sentences may wrap
    match = re.search(sentence, text)
    assert match, f"{page} no longer says {sentence!r}: put the sentence back or move its STATED_DEFAULTS row"
    assert read(match.group(1)) == stated_default(option), (
        f"{page} states {option}={match.group(1)}, the code's default is {stated_default(option)!r}. "
        f"Fix the page (trainer/options.py declares the defaults).")


TESTING = ROOT / "docs" / "testing.md"
TABLE_BEGIN, TABLE_END = "<!-- test-files:begin -->", "<!-- test-files:end -->"


def list_test_files() -> list[Path]:
    """The test files of the repository (git's, when there is a checkout: a file not yet added is not listed)."""
    try:
        listed = subprocess.run(["git", "ls-files", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=30,
                                check=True).stdout.split()
        files = [ROOT / name for name in listed]
    except (OSError, subprocess.SubprocessError):
        files = list((ROOT / "tests").rglob("*.py"))
    return sorted(f for f in files if f.name.startswith("test_") and f.suffix == ".py" and f.exists())


def first_sentence(source: Path) -> str:
    """The first sentence of a module's docstring, on one line (the whole first paragraph if it has no '. ')."""
    doc = ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(?:\s|$)(?=[A-Z`(*]|$)", paragraph)
    return (match.group(1) if match else paragraph).replace("|", "\\|")


def make_test_files_table() -> str:
    rows = [f"| `{f.relative_to(ROOT)}` | {first_sentence(f) or '(no docstring: add one)'} |" for f in list_test_files()]
    return "\n".join(["| file | what it checks |", "|---|---|", *rows])


def with_table(page: str, table: str) -> str:
    return marked_table(page, (TABLE_BEGIN, TABLE_END), table)


def test_the_test_files_table_is_made_from_the_tests():
    page = TESTING.read_text(encoding="utf-8")
    assert TABLE_BEGIN in page and TABLE_END in page, f"docs/testing.md lost its markers {TABLE_BEGIN} {TABLE_END}"
    assert page == with_table(page, make_test_files_table()), (
        "docs/testing.md's table of test files differs from the tests' docstrings: run "
        "`python tests/test_docs_current.py --write` (a new file needs a docstring whose first sentence says what "
        "it checks)")
    assert all("(no docstring" not in line for line in make_test_files_table().splitlines()), "a test file has no docstring"


# ----------------------------------------------------------------------------- the checks themselves


def test_history_is_found_in_prose_and_not_in_code():
    text = ("Since 2026-11-27 it is faster (7363d6a), as issue 27 wanted; the morning's run.\n"
            "Measured 2026-11-27 on this machine: 1.2x.\n"
            "`git show 425d20a` and [a link](history.md#run-2026-11-26)\n"
            "```\nbefore 2026-11-20 deadbeef1\n```\n")
    found = [(number, what) for number, what, _ in history_found(text)]
    assert found == [(1, "a commit hash"), (1, "a date used as history"), (1, "a numbered issue of this project"),
                     (1, "an insider's phrase")]


def test_a_missing_file_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "here.py").write_text("")
    (tmp_path / "README.md").write_text("")
    text = "`trainer/here.py` and trainer/gone.py; see REFERENCE.md and README.md; jobs/JOB.py\n"
    assert missing_files(text, root=tmp_path, paths=path_pattern(["trainer", "jobs"])) == [
        (1, "trainer/gone.py"), (1, "REFERENCE.md")]


def test_a_wrong_default_is_found(tmp_path):
    sentence, option, read = r"Defaults: `num_workers=(\d+)`", "num_workers", int
    match = re.search(sentence, "Defaults: `num_workers=3`, ...")
    assert read(match.group(1)) != stated_default(option)  # the check above would fail on this page
    match = re.search(sentence, "Defaults: `num_workers=2`, ...")
    assert read(match.group(1)) == stated_default(option)


def test_the_first_sentence_is_cut_where_the_sentence_ends(tmp_path):
    source = tmp_path / "test_x.py"
    source.write_text('"""The algorithm (trainer.algorithms.x): exact values. Then more.\n\nDetails."""\n')
    assert first_sentence(source) == "The algorithm (trainer.algorithms.x): exact values."
    source.write_text('"""No full stop here\nbut two lines\n\nDetails."""\n')
    assert first_sentence(source) == "No full stop here but two lines"
    page = f"a\n{TABLE_BEGIN}\nold\n{TABLE_END}\nb"
    assert with_table(page, "new") == f"a\n{TABLE_BEGIN}\nnew\n{TABLE_END}\nb"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_docs_current.py --write   (writes docs/testing.md's table of test files)")
    TESTING.write_text(with_table(TESTING.read_text(encoding="utf-8"), make_test_files_table()), encoding="utf-8")
    print(f"wrote the table of {len(list_test_files())} test files into {TESTING.relative_to(ROOT)}")
