"""A pytest plugin that keeps only the tests compiling Triton kernels to cubins without a GPU.

Loaded with ``-p cubin_only`` (``tests/`` on the path) by ``python3 scripts/dev.py compile-floor``, which runs the
suite's cubin jobs again with the oldest Triton the backend supports.  A test is kept when it, or a fixture it uses
(directly or through other fixtures), calls :func:`cubin_jobs.compile_in_clean_process`: the one way the suite
compiles Triton kernels for a GPU.  Selecting on that call, not on test names, keeps every new compile test in the
run without a list to maintain.  The rest are deselected (pytest reports them as such).
"""

from __future__ import annotations

import types

import pytest
from cubin_jobs import compile_in_clean_process

CALL = compile_in_clean_process.__name__


def calls_compile(function: object) -> bool:
    """Whether ``function``'s code names :data:`CALL` (a global, an import or an attribute it reads)."""
    code = getattr(function, "__code__", None)
    return isinstance(code, types.CodeType) and CALL in code.co_names


def compiles_cubins(item: pytest.Function) -> bool:
    """Whether the test ``item`` or one of the fixtures in its closure calls :data:`CALL`."""
    # pytest's record of the fixtures a test uses, the closure included: no public API gives their functions.
    definitions = item._fixtureinfo.name2fixturedefs.values()
    return calls_compile(item.function) or any(calls_compile(f.func) for chain in definitions for f in chain)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Function]) -> None:
    kept = [item for item in items if compiles_cubins(item)]
    dropped = [item for item in items if item not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
