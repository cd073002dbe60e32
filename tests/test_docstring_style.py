"""Docstrings are Google style with Markdown (docs/dev/docstrings.md): no reStructuredText roles or
directives, which mkdocstrings would show raw in the API reference."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SOURCES = sorted((Path(__file__).resolve().parents[1] / "packages").glob("*/src/**/*.py"))
RST = re.compile(r":(func|class|mod|meth|data|attr|exc|math|obj|ref):`|^\s*\.\. (math|code-block|note|warning)::", re.M)


def _docstrings(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:  # module/class/function docstrings and attribute docstrings alike
                if (
                    isinstance(stmt, ast.Expr)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    found.append((stmt.lineno, stmt.value.value))
    return found


def test_sources_are_found() -> None:
    assert len(SOURCES) > 50


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p).split("packages/")[1])
def test_docstrings_carry_no_restructuredtext(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = [(line, m.group(0).strip()) for line, text in _docstrings(tree) for m in [RST.search(text)] if m]
    assert not bad, f"{path}: reStructuredText in docstrings (write Markdown, docs/dev/docstrings.md): {bad}"
