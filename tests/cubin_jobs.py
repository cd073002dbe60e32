"""The shared half of the scripts that compile Triton kernels to cubins without a GPU, each in a clean
process (``tests/gluon_compile.py``, ``tests/backend_triton/product_compile.py``): one compiled source's
register report, and the loop that answers a JSON list of jobs on stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
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
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
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
