"""The import graph of kermac core: no circle, and the layers the design names.

Read from the source with :mod:`ast` (imports inside functions count: a deferred import is still a
dependency, and deferring one is how a circle hides).  ``from kermac import ir`` is an edge to
``kermac.ir``; the package's ``__init__`` (the public façade, which imports everything) is left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kermac

SOURCE = Path(kermac.__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SOURCE / "kermac").rglob("*.py"):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kermac modules ``name`` (at ``path``) imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    out.add(submodule)
                elif base in modules:
                    out.add(base)
    return out - {"kermac"}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {n: _imports(n, p, modules) for n, p in modules.items() if n != "kermac"}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert {
        "kermac.api",
        "kermac.autograd",
        "kermac.ops",
        "kermac.dispatch",
        "kermac.reference.backend",
    } <= graph.keys()
    assert "kermac.ops" in graph["kermac.api"] and "kermac.ir" in graph["kermac.programs"]


def test_kermac_core_has_no_import_circle() -> None:
    graph = _graph()
    circles = sorted(name for name in graph if name in _reachable(graph, name))
    assert not circles, f"modules on an import circle: {circles}"


def test_api_and_autograd_run_problems_through_the_ops() -> None:
    """The public operations and their backward (autograd) both run kermac's torch.library operations
    (ops), which run problems through dispatch; autograd never calls the public operations, and
    neither ops nor dispatch knows the public operations or autograd."""
    graph = _graph()
    assert "kermac.ops" in graph["kermac.api"] and "kermac.ops" in graph["kermac.autograd"]
    assert "kermac.dispatch" in graph["kermac.ops"]
    assert "kermac.api" not in _reachable(graph, "kermac.autograd")
    for lower in ("kermac.ops", "kermac.dispatch"):
        assert not {"kermac.api", "kermac.autograd"} & _reachable(graph, lower), lower


def test_the_ir_depends_on_no_backend() -> None:
    """The IR, its normal form, its evaluator and the programs built from it import no backend."""
    graph = _graph()
    for layer in ("kermac.ir", "kermac.canonical", "kermac.ir_eval", "kermac.programs"):
        reached = _reachable(graph, layer)
        assert not {m for m in reached if m.startswith("kermac.reference")}, (layer, sorted(reached))
        assert not {"kermac.registry", "kermac.api", "kermac.autograd", "kermac.dispatch"} & reached, layer
