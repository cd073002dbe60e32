"""The NVRTC backend's modules form layers — plan (problem → variant), source (variant → kernel text),
compile/launch — with no import cycle and no module reaching into another's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

PACKAGE = "kermac_backend_nvrtc"
pytest.importorskip(PACKAGE)


def _modules() -> dict[str, ast.Module]:
    root = Path(str(resources.files(PACKAGE)))
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(root.glob("*.py"))}


def _imports(tree: ast.Module) -> set[tuple[str, str | None]]:
    """(sibling module, imported name or None) of every import of this package, at any depth."""
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found |= {(alias.name, None) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE + "."):
            found |= {(node.module.split(".")[1], alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {(a.name.split(".")[1], None) for a in node.names if a.name.startswith(PACKAGE + ".")}
    return found


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: {m for m, _ in _imports(tree) if m in modules} for name, tree in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())


def test_layers() -> None:
    """Source generation never reaches up into planning or running; planning never into compiling."""
    graph = {name: {m for m, _ in _imports(tree)} for name, tree in _modules().items()}
    for low in ("render", "tiles", "variants", "source", "compiler", "launcher", "pow_table"):
        assert not graph[low] & {"plan", "backend", "plugin"}, low
    for pure in ("render", "tiles", "variants", "source", "plan"):
        assert not graph[pure] & {"compiler", "launcher"}, pure


def test_no_private_names_across_modules() -> None:
    for name, tree in _modules().items():
        for module, imported in _imports(tree):
            assert not (imported or "").startswith("_"), f"{name} imports {module}.{imported}"
        siblings = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == PACKAGE for alias in node.names}  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in siblings:
                assert not node.attr.startswith("_"), f"{name} reads {node.value.id}.{node.attr}"


def test_each_module_imports_first() -> None:
    """Importing any module of the package first works (a cycle through ``from … import`` fails
    there): one fresh interpreter, the package's modules dropped from ``sys.modules`` before each."""
    script = (
        "import importlib, sys\n"
        f"for name in {sorted(_modules())!r}:\n"
        f"    for loaded in [m for m in sys.modules if m.startswith({PACKAGE!r})]:\n"
        "        del sys.modules[loaded]\n"
        f"    importlib.import_module({PACKAGE!r} + '.' + name)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
