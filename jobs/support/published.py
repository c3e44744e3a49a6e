"""Results files kept in the repository (``docs/results/<name>.json``), and the pages' figures tied to them.

A page never types a measured figure: it quotes one from a results file. A
bench command given ``--publish DIR`` (the Makefile's bench targets pass
``docs/results``) writes ``DIR/<name>.json``:

    {"name": ..., "command": the command line, "date": UTC day, "machine": cores, CPU, platform,
     "commit": the code's commit (with "+dirty" when the work tree had changes),
     "default_generation": trainer.algorithms.choice.DEFAULT_GENERATION when it ran,
     "source": "command" (or "transcribed": figures carried over from a page, see docs/benchmarks.md),
     "figures": the run's rows and numbers, any JSON}

A page quotes a file inside a block::

    <!-- results: bench-quick, gpu -->
    ... tables and prose ...
    <!-- /results -->

and ``check_page`` (run by tests/test_docs_results.py, and by
``python -m trainer_jobs.support.published`` for a writer) finds every
decimal figure of the block (outside code) and asks that it be one of the
files' figures, rounded as the page writes it (a percentage may quote a
fraction: 99.2 % for 0.992). Outside a block, a page of ``QUOTING_PAGES``
may hold no decimal figure but version numbers. A file is stale when the
default algorithm changed more than once since it ran (``STALE_AFTER``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "docs" / "results"
#: The pages whose figures must come from results files.
QUOTING_PAGES = ("README.md", "docs/benchmarks.md", "docs/lab.md", "docs/model-selection.md", "docs/faults.md")
#: A file measured before more than this many changes of the default algorithm may not be quoted.
STALE_AFTER = 1
SOURCES = ("command", "transcribed")

_BLOCK = re.compile(r"^<!-- results: ([\w ,.-]+?) -->$(.*?)^<!-- /results -->$", re.S | re.M)  # each on its line
_FIGURE = re.compile(r"(?<![\w.\-/#])\d[\d,]*\.\d+(?:\.\d+)*(?=x?(?:[^\w/]|$))")  # "1.79", "1.79x", not "3.11.7"
# Version numbers are not figures: "Python 3.11 (3.12 and 3.13 declared)", "pyspark 3.5", "Keras 3.15.1".
_SOFTWARE = re.compile(r"\b(Python|pyspark|Spark|Keras|TensorFlow|JAX|jax|torch|NumPy|numpy|Java|CUDA|MLflow|"
                       r"Debian|Ubuntu|Optuna|version|versions)[ ]+(?:[\d.]+[ ,()+-]*(?:and|or|to)?[ ]*)*$")


def default_generation() -> int:
    """``DEFAULT_GENERATION`` of trainer/algorithms/choice.py, read from its text: this module needs only the
    standard library (the lab's bench runs it with the host's Python)."""
    text = (REPO / "trainer" / "algorithms" / "choice.py").read_text()
    return int(re.search(r"^DEFAULT_GENERATION(?:: int)? = (\d+)", text, re.M).group(1))


def code_commit() -> str | None:
    """The checkout's commit, ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine() -> dict:
    """Cores, the CPU's model name and the platform: enough to tell two machines' files apart."""
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {"cores": os.cpu_count(), "usable_cores": usable, "cpu": model or platform.processor(),
            "platform": platform.platform()}


def record(name: str, figures: Any, command: str | None = None) -> dict:
    """A results file's content for `figures` measured now by `command` (default: this process's argv)."""
    if command is None:
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    return {"name": name, "command": command, "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
            "machine": machine(), "commit": code_commit(), "default_generation": default_generation(),
            "source": "command", "figures": figures}


def publish(directory: str | os.PathLike | None, name: str, figures: Any, command: str | None = None) -> Path | None:
    """Write ``directory/<name>.json`` (nothing when `directory` is None); return its path."""
    if directory is None:
        return None
    path = Path(directory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record(name, figures, command), indent=1, sort_keys=False, default=_plain) + "\n")
    return path


def add_publish_arg(parser, name: str) -> None:
    """The ``--publish DIR`` option of a bench command that writes ``DIR/<name>.json``."""
    parser.add_argument("--publish", metavar="DIR", default=None,
                        help=f"also write DIR/{name}.json, the results file the docs quote (the Makefile passes "
                             "docs/results; PUBLISH= leaves it out)")


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not a figure")


def load(name: str, directory: Path = RESULTS_DIR) -> dict:
    return json.loads((directory / f"{name}.json").read_text())


def problems_of_file(data: dict, current_generation: int) -> list[str]:
    """What is wrong with one results file's content (empty when nothing)."""
    problems = [f"lacks {key!r}" for key in ("name", "command", "date", "machine", "commit", "default_generation",
                                             "source", "figures") if key not in data]
    if problems:
        return problems
    if data["source"] not in SOURCES:
        problems.append(f"source {data['source']!r} is none of {SOURCES}")
    if not isinstance(data["default_generation"], int) or data["default_generation"] > current_generation:
        problems.append(f"default_generation {data['default_generation']!r} is not a generation up to "
                        f"{current_generation}")
    elif current_generation - data["default_generation"] > STALE_AFTER:
        problems.append(f"measured under default generation {data['default_generation']}; the default changed "
                        f"{current_generation - data['default_generation']} times since: run `{data['command']}` again")
    try:
        dt.date.fromisoformat(data["date"])
    except (TypeError, ValueError):
        problems.append(f"date {data['date']!r} is not YYYY-MM-DD")
    if not list(numbers(data["figures"])):
        problems.append("has no figures")
    return problems


def numbers(value: Any) -> Iterator[float]:
    """Every number in a JSON value (booleans are not numbers), and every decimal written inside its strings."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        if math.isfinite(value):
            yield float(value)
    elif isinstance(value, str):
        for match in _FIGURE.finditer(value):
            yield float(match.group().replace(",", ""))
    elif isinstance(value, dict):
        for item in value.values():
            yield from numbers(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from numbers(item)


def quotes(figure: str, values: Iterable[float]) -> bool:
    """True when `figure` (as the page writes it) is one of `values` rounded to its decimals, or a fraction
    written as a percentage."""
    decimals = len(figure.split(".")[1])
    number = float(figure.replace(",", ""))
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    return any(abs(value - number) <= tolerance or abs(100 * value - number) <= tolerance for value in values)


def prose(text: str) -> str:
    """`text` without code (fenced or inline), link targets and comments: what a reader takes as figures."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]+`", "", text)  # a code span may run over a line break
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def figures(text: str) -> list[str]:
    """The decimal figures of `text`'s prose (versions and dotted numbers left out)."""
    text = prose(text)
    return [match.group() for match in _FIGURE.finditer(text)
            if match.group().count(".") == 1 and not _SOFTWARE.search(text[max(0, match.start() - 40):match.start()])]


@dataclass(frozen=True)
class Quote:
    """A block of a page and the results files it quotes."""

    page: str
    line: int
    names: tuple[str, ...]
    text: str


def blocks(page: str, text: str) -> list[Quote]:
    return [Quote(page, text.count("\n", 0, m.start()) + 1, tuple(n.strip() for n in m.group(1).split(",")),
                  m.group(2)) for m in _BLOCK.finditer(text)]


def check_page(page: str, text: str, directory: Path = RESULTS_DIR) -> list[str]:
    """Every problem of one page: a figure outside a block, a block naming no file, a figure not its files'."""
    problems = []
    outside = _BLOCK.sub("", text)
    stray = figures(outside)
    if stray:
        problems.append(f"{page}: figures outside a results block: {', '.join(stray[:12])}"
                        f"{' ...' if len(stray) > 12 else ''}")
    for block in blocks(page, text):
        values: list[float] = []
        for name in block.names:
            path = directory / f"{name}.json"
            if not path.exists():
                problems.append(f"{page}:{block.line}: quotes {path}, which does not exist")
                continue
            values.extend(numbers(json.loads(path.read_text())["figures"]))
        wrong = [figure for figure in figures(block.text) if not quotes(figure, values)]
        if wrong:
            problems.append(f"{page}:{block.line}: figures not in {', '.join(block.names)}: {', '.join(wrong)}")
    return problems


def check(repo: Path = REPO) -> list[str]:
    """Every problem of the results files and of the pages that quote them."""
    directory = repo / "docs" / "results"
    generation = default_generation()
    problems = []
    quoted = set()
    for page in QUOTING_PAGES:
        text = (repo / page).read_text()
        problems += check_page(page, text, directory)
        quoted.update(name for block in blocks(page, text) for name in block.names)
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        where = path.relative_to(repo)
        problems += [f"{where}: {problem}" for problem in problems_of_file(data, generation)]
        if data.get("name") != path.stem:
            problems.append(f"{where}: its name is {data.get('name')!r}")
        if path.stem not in quoted:
            problems.append(f"{where}: no page quotes it (remove it or quote it)")
    return problems


if __name__ == "__main__":
    found = check()
    print("\n".join(found) if found else "every figure of the pages is its results file's")
    sys.exit(1 if found else 0)
