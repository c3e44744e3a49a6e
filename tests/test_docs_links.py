"""The docs' links lead somewhere, and docs/benchmarks.md stays a page of today's numbers.

Every relative Markdown link and image in README.md and docs/*.md must name a
file that exists and, for a ``#fragment`` into a Markdown file, one of its
headings, with the anchors GitHub makes: lowercase, punctuation other than
'-' and '_' dropped, each space a '-', and '-1', '-2', ... after repeats of
one heading. Links in code blocks and code spans are text, not links.
``docs/<page>.md#anchor`` mentioned in the code (jobs/, trainer/) must hold too.
Pure Python: no Spark.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS_MAX_LINES = 250  # older runs go to docs/benchmarks-history.md

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
CODE_REFERENCE = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before any '-N' for repeats)."""
    text = INLINE_LINK.sub(r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose_lines(path: Path) -> list[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        lines.append("" if fenced else line)
    return lines


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a Markdown file, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return frozenset(found)


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link and image of a Markdown file."""
    links = []
    for number, line in enumerate(_prose_lines(path), start=1):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, mailto:, ...
                links.append((number, target))
    return links


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken(page: Path, target: str) -> str | None:
    """Why `target`, linked from `page`, leads nowhere; None when it leads somewhere."""
    file_part, _, fragment = target.partition("#")
    dest = (page.parent / file_part).resolve() if file_part else page
    if not dest.exists():
        return f"no file {_shown(dest)}"
    if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
        return f"no heading with the anchor #{fragment} in {_shown(dest)}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading(page):
    problems = [f"{_shown(page)}:{number}: ({target}) {why}"
                for number, target in relative_links(page) if (why := broken(page, target))]
    assert not problems, "Fix the link or the heading it names:\n" + "\n".join(problems)


def test_doc_anchors_named_in_the_code_exist():
    problems = []
    for source in sorted([*(ROOT / "jobs").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
                          *(ROOT / "trainer").rglob("*.py")]):
        for match in CODE_REFERENCE.finditer(source.read_text(encoding="utf-8")):
            page, fragment = ROOT / "docs" / match.group(1), match.group(2)
            if not page.exists() or fragment not in anchors(page):
                problems.append(f"{source.relative_to(ROOT)}: docs/{match.group(1)}#{fragment}")
    assert not problems, "No such page or heading:\n" + "\n".join(problems)


def test_benchmarks_page_stays_short():
    lines = [line for line in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").splitlines()
             if not line.startswith("<!-- ")]  # the results blocks' markers (tests/test_docs_results.py) are not text
    assert len(lines) <= BENCHMARKS_MAX_LINES, (
        f"docs/benchmarks.md should hold today's numbers in at most {BENCHMARKS_MAX_LINES} lines. "
        f"Received: {len(lines)} lines. Move the older runs to docs/benchmarks-history.md.")


@pytest.mark.parametrize("heading, anchor", [
    ("Benchmarks", "benchmarks"),
    ("Framework overhead: where a worker's time goes", "framework-overhead-where-a-workers-time-goes"),
    ("Phase 2: the server itself (`trainer/ps/`), and `make bench-ps` after it",
     "phase-2-the-server-itself-trainerps-and-make-bench-ps-after-it"),
    ("On a GPU (make bench-gpu)", "on-a-gpu-make-bench-gpu"),
    ("snake_case and [a link](x.md) – dash", "snake_case-and-a-link--dash"),
])
def test_github_anchor_rules(heading, anchor):
    assert github_anchor(heading) == anchor


def test_a_missing_heading_or_file_is_reported(tmp_path):
    """The checker itself: a link to a missing heading or file fails, one in a code span does not count."""
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## Top\n\n[ok](#top-1) [bad](#nowhere) ![img](missing.png) `[code](#no)`\n\n"
                    "```\n# not a heading\n[fenced](#no)\n```\n", encoding="utf-8")
    assert anchors(page) == {"top", "top-1"}
    targets = [target for _, target in relative_links(page)]
    assert targets == ["#top-1", "#nowhere", "missing.png"]
    assert [broken(page, t) is None for t in targets] == [True, False, False]
