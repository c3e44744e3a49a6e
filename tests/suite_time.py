"""Where the minutes of ``make test`` and ``.ci/run`` go, read from ``test-artifacts/``.

Three files feed it: ``streams.tsv`` (each stream's name, start, end and exit status: the Makefile writes the main
run, the backend runs and ``make test`` itself; ``.ci/run`` and ``.ci/beside`` the install, the venv, the lab image
build, the matrix cell and the containers), ``timeline.tsv`` (each test's stream, pytest process, xdist group,
start and end: conftest) and ``fixtures.tsv`` (each module- or session-scoped fixture's set-up: conftest).

    python tests/suite_time.py                          # the streams, the 25 slowest tests
    python tests/suite_time.py --by-file --by-fixture   # and the minutes by test file and by fixture
    python tests/suite_time.py --budget "make test=18"  # and that stream's time against its budget
    python tests/suite_time.py --publish docs/results   # add this run to docs/results/suite-time.json

The budget line is a report, not a check: the suite's time depends on the machine (docs/testing.md).
"""

from __future__ import annotations

import argparse
import collections
import json
from dataclasses import dataclass
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@dataclass(frozen=True)
class Span:
    """One stream, test or fixture set-up: what it was, where it ran, when it started and ended (epoch seconds)."""

    name: str
    start: float
    end: float
    stream: str = ""
    detail: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _rows(path: Path, columns: int) -> list[list[str]]:
    if not path.is_file():
        return []
    rows = [line.rstrip("\n").split("\t") for line in path.read_text(encoding="utf-8").splitlines()]
    return [row for row in rows if len(row) == columns]


def read_streams(artifacts: Path) -> list[Span]:
    """``streams.tsv``: name, start, end, exit status (the status in ``detail``)."""
    return [Span(name, float(start), float(end), detail=rc)
            for name, start, end, rc in _rows(artifacts / "streams.tsv", 4)]


def read_tests(artifacts: Path) -> list[Span]:
    """``timeline.tsv``: stream, pytest process, xdist group, start, end, node id (the process in ``detail``)."""
    return [Span(nodeid, float(start), float(end), stream=stream, detail=process)
            for stream, process, _group, start, end, nodeid in _rows(artifacts / "timeline.tsv", 6)]


def read_fixtures(artifacts: Path) -> list[Span]:
    """``fixtures.tsv``: stream, fixture, scope, start, end (the scope in ``detail``)."""
    return [Span(name, float(start), float(end), stream=stream, detail=scope)
            for stream, name, scope, start, end in _rows(artifacts / "fixtures.tsv", 5)]


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def stream_table(streams: list[Span], tests: list[Span]) -> list[str]:
    """One row per stream: when it started after the first, its wall time, its tests and their summed time."""
    if not streams:
        return ["(no streams recorded: test-artifacts/streams.tsv is written by make test and .ci/run)"]
    first = min(s.start for s in streams)
    counts = collections.Counter(t.stream for t in tests)
    summed = collections.defaultdict(float)
    for t in tests:
        summed[t.stream] += t.seconds
    lines = ["| stream | starts at (min) | wall (min) | tests | tests' own time (min) | exit |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in sorted(streams, key=lambda s: (s.start, -s.end)):
        tests_cell = str(counts[s.name]) if s.name in counts else ""
        own = minutes(summed[s.name]) if s.name in summed else ""
        lines.append(f"| {s.name} | {minutes(s.start - first)} | {minutes(s.seconds)} | {tests_cell} | {own} "
                     f"| {s.detail} |")
    return lines


def slowest_table(tests: list[Span], count: int) -> list[str]:
    """The `count` slowest tests of every stream, set-up to teardown (a session fixture's start-up is charged
    to the first test that asks for it)."""
    lines = ["| seconds | stream | test |", "|---:|---|---|"]
    for t in sorted(tests, key=lambda t: -t.seconds)[:count]:
        lines.append(f"| {t.seconds:.0f} | {t.stream} | `{t.name}` |")
    return lines


def _summed(spans: list[Span], key) -> list[tuple[object, float, int]]:
    """``(key, seconds, count)`` of `spans` grouped by ``key(span)``, largest first."""
    total: dict = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    for span in spans:
        total[key(span)] += span.seconds
        count[key(span)] += 1
    return [(k, seconds, count[k]) for k, seconds in sorted(total.items(), key=lambda kv: -kv[1])]


def by_file_table(tests: list[Span]) -> list[str]:
    """Minutes by test file, over every stream, largest first."""
    return ["| minutes | tests | file |", "|---:|---:|---|"] + [
        f"| {minutes(seconds)} | {count} | `{path}` |"
        for path, seconds, count in _summed(tests, lambda t: t.name.split("::")[0])]


def by_fixture_table(fixtures: list[Span]) -> list[str]:
    """Seconds of each module- or session-scoped fixture's set-ups, summed over the streams that made it."""
    return ["| seconds | set-ups | fixture (scope) |", "|---:|---:|---|"] + [
        f"| {seconds:.0f} | {count} | `{name}` ({scope}) |"
        for (name, scope), seconds, count in _summed(fixtures, lambda f: (f.name, f.detail)) if seconds >= 1]


def budget_line(streams: list[Span], name: str, budget_minutes: float) -> str:
    """``make test: 17.2 minutes, 96 % of its 18-minute budget``, from the stream of that name."""
    mine = [s for s in streams if s.name == name]
    if not mine:
        return f"{name}: no time recorded"
    spent = mine[-1].seconds
    share = 100 * spent / (60 * budget_minutes)
    verdict = "within" if share <= 100 else "OVER"
    return (f"{name}: {minutes(spent)} minutes, {share:.0f} % of its {budget_minutes:g}-minute budget ({verdict}; "
            f"docs/testing.md says where the minutes go)")


def report(artifacts: Path, slowest: int = 25, files: bool = False, fixtures: bool = False,
           budgets: dict[str, float] | None = None) -> str:
    streams, tests = read_streams(artifacts), read_tests(artifacts)
    parts = ["Streams (wall time; they run side by side, docs/testing.md):", *stream_table(streams, tests), "",
             f"The {slowest} slowest tests:", *slowest_table(tests, slowest)]
    if files:
        parts += ["", "Minutes by test file:", *by_file_table(tests)]
    if fixtures:
        parts += ["", "Module and session fixtures:", *by_fixture_table(read_fixtures(artifacts))]
    if budgets:
        parts += [""] + [budget_line(streams, name, limit) for name, limit in budgets.items()]
    return "\n".join(parts)


def run_record(artifacts: Path) -> dict:
    """One run's figures for docs/results/suite-time.json: each stream's minutes, tests and exit status."""
    streams, tests = read_streams(artifacts), read_tests(artifacts)
    counts = collections.Counter(t.stream for t in tests)
    return {s.name: {"minutes": round(s.seconds / 60, 1), "tests": counts.get(s.name, 0), "exit": s.detail}
            for s in streams}


def publish_run(directory: Path, artifacts: Path, keep: int = 10, commit: str | None = None) -> Path:
    """Add this run (of `commit`, default this checkout's) to ``directory/suite-time.json``: its last `keep` runs,
    whose range the pages quote."""
    from trainer_jobs.support.published import code_commit, publish

    path = directory / "suite-time.json"
    runs = json.loads(path.read_text())["figures"]["runs"] if path.is_file() else []
    files = _summed(read_tests(artifacts), lambda t: t.name.split("::")[0])[:15]
    run = {"commit": commit or code_commit(), "streams": run_record(artifacts),
           "files": {path: round(seconds / 60, 1) for path, seconds, _ in files}}
    return publish(directory, "suite-time", {"runs": [*runs, run][-keep:]})


def parse_budget(text: str) -> tuple[str, float]:
    name, _, limit = text.rpartition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"--budget takes STREAM=MINUTES, not {text!r}")
    return name, float(limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=Path, default=ARTIFACTS)
    parser.add_argument("--slowest", type=int, default=25)
    parser.add_argument("--by-file", action="store_true")
    parser.add_argument("--by-fixture", action="store_true")
    parser.add_argument("--budget", type=parse_budget, action="append", default=[],
                        help="STREAM=MINUTES: print that stream's time against its budget")
    parser.add_argument("--publish", type=Path, default=None, metavar="DIR",
                        help="add this run's streams to DIR/suite-time.json, the results file the docs quote")
    parser.add_argument("--commit", default=None, help="the commit the run tested (default: this checkout's)")
    args = parser.parse_args(argv)
    print(report(args.artifacts, args.slowest, args.by_file, args.by_fixture, dict(args.budget)))
    if args.publish is not None:
        print(f"results file: {publish_run(args.publish, args.artifacts, commit=args.commit)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
