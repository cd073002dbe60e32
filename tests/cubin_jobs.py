"""The shared half of the scripts that compile Triton kernels to cubins without a GPU, each in a clean
process (``tests/gluon_compile.py``, ``tests/backend_triton/product_compile.py``,
``tests/backend_triton/product_grad_compile.py``): one compiled source's register report, the loop that answers a
JSON list of jobs on stdin, and the tests' side: running such a script and reading a report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def spec_fields(job: dict, **defaults: Any) -> dict[str, Any]:
    """The fields of a job's kernel spec: `defaults` updated by `job["spec"]` (its `tensor_hypers` a frozenset)."""
    changes = dict(job["spec"])
    if "tensor_hypers" in changes:
        changes["tensor_hypers"] = frozenset(changes["tensor_hypers"])
    return defaults | changes


def ast_source(
    source_class: Any, fn: Any, signature: dict[str, str], consts: dict[str, Any], aligned: list[str]
) -> Any:
    """`source_class` (Triton's or Gluon's AST source) of `fn` with `consts` as constexprs and the arguments
    `aligned` divisible by 16."""
    index = {n: i for i, n in enumerate(fn.arg_names)}
    return source_class(
        fn=fn,
        signature=signature,
        constexprs={(index[k],): v for k, v in consts.items()},
        attrs={(index[n],): [["tt.divisibility", 16]] for n in aligned},
    )


def resource_usage(source: Any, arch: int, warps: int) -> str:
    """``cuobjdump -res-usage`` of ``source`` compiled for ``sm_<arch>`` with ``warps`` warps."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    return cubin_resource_usage(kernel.asm["cubin"])


def cubin_resource_usage(cubin: bytes) -> str:
    """``cuobjdump -res-usage`` of a compiled ``cubin`` (Triton's own cuobjdump)."""
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        return subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout


def serve(compile_job: Callable[[dict], str]) -> None:
    """Answer the JSON list of jobs on stdin with a JSON object mapping each job's ``id`` to ``compile_job(job)``
    (or ``"error: ..."``)."""
    reports = {}
    for job in json.load(sys.stdin):
        try:
            reports[job["id"]] = compile_job(job)
        except Exception as exc:  # reported per job: one failure must not hide the others
            reports[job["id"]] = f"error: {type(exc).__name__}: {exc}"
    json.dump(reports, sys.stdout)


def compile_in_clean_process(script: Path, jobs: list[dict]) -> dict[str, str]:
    """The reports of ``script`` (a compile script answering by ``serve``) for ``jobs``, run in a fresh Python
    without ``TRITON_INTERPRET`` (which must be unset before Triton is imported to compile for a GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(script)], input=json.dumps(jobs), capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def assert_compiled(report: str, *, spills: bool = False) -> None:
    """``report`` is a register report (not an error) and, unless ``spills``, shows no stack or local memory."""
    assert "REG:" in report, report
    if not spills:
        assert "STACK:0" in report and "LOCAL:0" in report, report
