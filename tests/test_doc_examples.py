"""Every ```python block in README.md and docs/*.md runs as written.

A block is one example: it makes its own data and imports only the public API,
as on a fresh machine with the package installed. Each block is written to a
file in a temporary folder (the working directory, so the files of this
checkout are not importable by their path) and run with this interpreter (the
venv's python) in a subprocess of its own: an example that starts a cluster or
a Spark Connect session must not share a process with the test session's
SparkContext. Every block runs alone: none is meant to be read after another,
so none shares a process (or a cluster start) with the next. A block passes
when it exits with 0; on failure the test shows its output. Two blocks run at
a time (EXAMPLES_AT_ONCE): one uses about 0.8 of a core, most of its time
goes to starting the JVMs and the backend, so two side by side finish the
seven in about half the wall time on 2 cores. Nothing in a doc
can skip a block: code that is not meant to run (a signature, a command line)
goes in a ```text or ```bash block, or in inline code.

The unit tests at the bottom need no Spark: the extraction finds each block
under its heading, and the runner reports a failing block.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# One example, its cluster's start included: 86-272 s each on the shared 2-core development machine at a load
# of 4-15 (2026-11-26); the Spark Connect and LocalCluster ones cost 65-125 CPU seconds.
EXAMPLE_TIMEOUT_S = 480
EXAMPLES_AT_ONCE = 2

FENCE = re.compile(r"^(\s*)(```|~~~)\s*([\w+-]*)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    heading: str
    line: int  # of the opening fence, 1-based
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}::{self.heading}"


def python_blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The ```python blocks of a Markdown file, each with the heading it sits under (repeats numbered #2, #3)."""
    blocks: list[Block] = []
    heading, fence, indent, language, start, lines = "(top)", None, "", "", 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                indent, fence, language, start, lines = match.group(1), match.group(2), match.group(3), number, []
            elif HEADING.match(line):
                heading = HEADING.match(line).group(1)
            continue
        if match and match.group(2) == fence and not match.group(3):
            if language == "python":
                blocks.append(Block(str(path.relative_to(root)), heading, start, "\n".join(lines) + "\n"))
            fence = None
            continue
        lines.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
    if fence is not None:
        raise ValueError(f"{path}: the code block opened on line {start} is never closed")
    seen: dict[str, int] = {}
    numbered = []
    for block in blocks:
        seen[block.id] = seen.get(block.id, 0) + 1
        name = block.heading if seen[block.id] == 1 else f"{block.heading} #{seen[block.id]}"
        numbered.append(Block(block.page, name, block.line, block.code))
    return numbered


def run_example(block: Block, workdir: Path, timeout: float = EXAMPLE_TIMEOUT_S) -> tuple[int, str]:
    """Run one block as a script in `workdir`; its exit code and its output (stdout and stderr together)."""
    script = workdir / "example.py"
    script.write_text(block.code, encoding="utf-8")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The example's own group; the Spark daemons it started die with it (pdeathsig) or at its exit.
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -signal.SIGKILL, f"{output}\n[timed out after {timeout:.0f}s]"
    return proc.returncode, output


def failure_report(block: Block, code: int, output: str, keep: int = 8000) -> str:
    return (f"the example in {block.page} (line {block.line}, under '{block.heading}') exited with {code}; "
            f"fix the block so it runs as written. Its output (last {keep} characters):\n{output[-keep:]}")


BLOCKS = [block for page in PAGES for block in python_blocks(page)]


@pytest.fixture(scope="module")
def example_runs(request, tmp_path_factory):
    """Every selected block started, EXAMPLES_AT_ONCE at a time, in the order the tests ask for them."""
    selected = [item.callspec.params["block"] for item in request.session.items
                if item.originalname == "test_example_runs_as_written"]
    with ThreadPoolExecutor(max_workers=EXAMPLES_AT_ONCE) as pool:
        runs = {block.id: pool.submit(run_example, block, tmp_path_factory.mktemp("example")) for block in selected}
        yield runs
        for run in runs.values():
            run.cancel()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2 * EXAMPLE_TIMEOUT_S + 60)  # its own run, and the one beside it started first
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_example_runs_as_written(block, example_runs):
    code, output = example_runs[block.id].result()
    assert code == 0, failure_report(block, code, output)


# --------------------------------------------------------------------------- no Spark


def test_blocks_are_found_under_their_headings(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n```python\nprint(1)\n```\n\n## Two\n\n```bash\nls\n```\n\n"
        "* a list item:\n\n  ```python\n  if True:\n      print(2)\n  ```\n\n```python\nprint(3)\n```\n",
        encoding="utf-8")
    blocks = python_blocks(page, root=tmp_path)
    assert [(b.id, b.line, b.code) for b in blocks] == [
        ("page.md::Title", 3, "print(1)\n"),
        ("page.md::Two", 15, "if True:\n    print(2)\n"),
        ("page.md::Two #2", 20, "print(3)\n"),
    ]
    page.write_text("# T\n\n```python\nprint(1)\n", encoding="utf-8")
    with pytest.raises(ValueError, match="never closed"):
        python_blocks(page, root=tmp_path)


def test_the_docs_have_examples_and_no_other_python_fences():
    assert any(block.page == "README.md" for block in BLOCKS), "README.md's example must be a ```python block"
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            match = FENCE.match(line)
            language = match.group(3).lower() if match else ""
            assert language in ("", "python") or not language.startswith("py"), (
                f"{page.relative_to(ROOT)}:{number}: a ```{language} block would not be run by this test; "
                f"write ```python (an example that runs) or ```text (a fragment)")


def test_a_broken_example_fails_with_its_output(tmp_path):
    broken = Block("docs/x.md", "Broken", 7, "print('before')\nraise SystemExit(3)\n")
    code, output = run_example(broken, tmp_path, timeout=60)
    assert code == 3 and "before" in output
    assert "docs/x.md (line 7, under 'Broken') exited with 3" in failure_report(broken, code, output)
    code, output = run_example(Block("docs/x.md", "Slow", 1, "import time\ntime.sleep(30)\n"), tmp_path, timeout=1)
    assert code != 0 and "timed out after 1s" in output
