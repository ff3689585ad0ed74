"""Every test the Guarantees table names exists (docs/explanation/guarantees.md,
once the README's): a renamed or deleted test fails here, not silently in the
documentation."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.docs_pages import page

TESTS = Path(__file__).resolve().parent
# `file.py::name`, or `…::name` for another test of the file named before it.
_REF = re.compile(r"`((?:[\w/]+\.py)|…)::(\w+)")


def _guarantees() -> str:
    text = page("explanation/guarantees.md")
    start = text.index("# Guarantees")
    return text[start:]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_the_guarantees_table_names_exists() -> None:
    missing, refs, current = [], 0, None
    for line in _guarantees().splitlines():
        if not line.startswith("|"):
            continue
        current = None  # "…" never reaches back into another row
        for file, name in _REF.findall(line):
            if file != "…":
                current = TESTS / file
            assert current is not None, f"'…::{name}' with no file before it: {line[:80]}"
            refs += 1
            if not current.exists() or name not in _functions(current):
                missing.append(f"{current.relative_to(TESTS)}::{name}")
    assert refs > 50
    assert missing == []
