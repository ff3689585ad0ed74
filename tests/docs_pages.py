"""The documentation site as the tests read it: the Markdown pages under ``docs/``,
with the parts ``docs/_gen.py`` generates from the code filled in, exactly as MkDocs
renders them (its hook calls the same function)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"


@functools.cache
def generator() -> ModuleType:
    """``docs/_gen.py``, the site's generator (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("zsched_docs_gen", DOCS / "_gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(path: str) -> str:
    """The Markdown of ``docs/<path>`` as the site renders it (generated parts filled in)."""
    text: str = generator().page_source(path)
    return text


def pages() -> dict[str, str]:
    """Every page of the site, by its path under ``docs/``."""
    return {str(p.relative_to(DOCS)): page(str(p.relative_to(DOCS)))
            for p in sorted(DOCS.rglob("*.md"))}


def section(text: str, heading: str) -> str:
    """The part of ``text`` under the heading line ``heading`` (e.g. ``"## Signals"``),
    up to the next heading of the same or a higher level (code blocks skipped)."""
    level = len(heading.split(" ", 1)[0])
    lines = text.splitlines()
    start = lines.index(heading)
    fenced = False
    for end in range(start + 1, len(lines)):
        line = lines[end]
        fenced ^= line.startswith("```")
        hashes = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < hashes <= level and line[hashes:hashes + 1] == " ":
            return "\n".join(lines[start:end])
    return "\n".join(lines[start:])
