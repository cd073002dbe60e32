"""Compile the tensor-core pairwise and product kernels to cubins without a GPU, in a clean process, and report
their dots.

Run as ``python tests/backend_triton/tensor_core_compile.py`` with a JSON list of jobs on stdin; prints a JSON
object mapping each job's ``id`` to a JSON text ``{"res": <cuobjdump -res-usage report>, "dots": [[A's element
type, B's element type], ...]}`` (one pair per dot of the kernel's TTGIR, in order) or ``"error: ..."``.  A separate
process for the reasons of ``tests/gluon_compile.py``.

A job: ``{"id", "kernel": "pairwise" | "product", "preset", "regularized", "dtype", "meta", "warps", "stages",
"maxnreg", "arch"}`` (a product job as ``tests/backend_triton/product_compile.py`` reads it, its ``spec`` made
``{"kernel": "tensor_cores"}``); pointers are 16-byte aligned, the unit strides 1, ``N``, ``D`` and the other
strides divisible by 16 (as the launcher specialises them).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cubin_jobs
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for product_compile

from cubin_jobs import ast_source, cubin_resource_usage, serve, signature
from product_compile import product_source

#: A dot of the TTGIR (sm_80: ``tt.dot``; sm_90: ``ttng.warp_group_dot``) and its operands' element types.
_DOT = re.compile(
    r"= (?:tt\.dot|ttng\.warp_group_dot) [^\n]*? : (?:!ttg\.memdesc|tensor)<[\dx]+x(\w+)[,>][^\n]*? \* "
    r"(?:!ttg\.memdesc|tensor)<[\dx]+x(\w+)[,>]"
)


def dot_operand_types(ttgir: str) -> list[list[str]]:
    """The element types of the operands of each dot in ``ttgir``, in order."""
    return [list(m.groups()) for m in _DOT.finditer(ttgir)]


def pairwise_source(job: dict):
    """The `ASTSource` of the tensor-core pairwise kernel of ``job``."""
    from triton.compiler import ASTSource

    from kermac import presets
    from kermac_backend_triton.generated import PAIRWISE_ENTRY, PairwiseSpec, kernel_source
    from kermac_backend_triton.modules import load_module

    program = presets.ALL[job["preset"]].lower(regularized=job["regularized"])
    spec = PairwiseSpec(
        program=program, compute="float32", nbatch=0, tensor_hypers=frozenset(), int64=False, kernel="tensor_cores"
    )
    fn = getattr(load_module(kernel_source(spec)), PAIRWISE_ENTRY)
    consts = dict(job["meta"]) | {"SXK": 1, "SZK": 1, "SON": 1, "KEY": 0}
    types = signature(
        fn.arg_names,
        consts,
        ("X", "Z", "OUT"),
        dtype=job["dtype"],
        compute="float32",
        int64=False,
        float32_scalars=("GUARD",),
    )
    aligned = ["X", "Z", "OUT", "N", "D", "SXM", "SZN", "SOM"]
    return ast_source(ASTSource, fn, types, consts, aligned)


def compile_job(job: dict) -> str:
    import triton
    from triton.backends.compiler import GPUTarget

    source = pairwise_source(job) if job["kernel"] == "pairwise" else product_source(job)
    options = {"num_warps": job["warps"], "num_stages": job["stages"]}
    if job["maxnreg"] is not None:
        options["maxnreg"] = job["maxnreg"]
    kernel = triton.compile(source, target=GPUTarget("cuda", job["arch"], 32), options=options)
    return json.dumps(
        {"res": cubin_resource_usage(kernel.asm["cubin"]), "dots": dot_operand_types(kernel.asm["ttgir"])}
    )


def main() -> None:
    serve(compile_job)


if __name__ == "__main__":
    main()
