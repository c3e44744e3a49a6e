"""A table a page holds between two marker comments, replaced by the one the code makes (the docs' generated tables)."""

from __future__ import annotations


def with_table(page: str, markers: tuple[str, str], table: str) -> str:
    """`page` with the text between ``markers`` (begin, end) replaced by `table`, each on its own lines."""
    begin, end = markers
    start, stop = page.index(begin) + len(begin), page.index(end)
    return page[:start] + "\n" + table + "\n" + page[stop:]
