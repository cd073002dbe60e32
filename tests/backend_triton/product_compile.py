"""Compile generated kernel-product kernels to cubins without a GPU, in a clean process.

Run as ``python tests/backend_triton/product_compile.py`` with a JSON list of jobs on stdin;
prints a JSON object mapping each job's ``id`` to its ``cuobjdump -res-usage`` report (or
``"error: ..."``).  A separate process for the reasons of ``tests/gluon_compile.py`` (the
interpreter patches ``triton.language`` for the whole process; ``TRITON_INTERPRET`` unset).

A job: ``{"id", "preset", "regularized", "spec": {ProductSpec field changes}, "meta", "warps",
"arch", "dtype"}``, or ``"program"`` (a program's key) in place of ``"preset"`` and ``"regularized"``;
pointers are 16-byte aligned, the unit strides 1 and the others divisible by 16; a tensor-core job with
``"PRESPLIT": 1`` in ``meta`` reads float32 split workspaces of DP (divisible by 16) features per row.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cubin_jobs

from cubin_jobs import ast_source, resource_usage, serve, signature, spec_fields


def compile_job(job: dict) -> str:
    return resource_usage(product_source(job), job["arch"], job["warps"])


def product_source(job: dict):
    """The `ASTSource` of the job's generated product kernel (its constants, signature and alignment)."""
    from triton.compiler import ASTSource

    from kermac import presets
    from kermac.programs import program_from_key
    from kermac_backend_triton.generated import ProductSpec, kernel_source
    from kermac_backend_triton.modules import load_module

    dtype = job["dtype"]
    compute = "float64" if dtype == "float64" else "float32"
    program = (
        program_from_key(job["program"])
        if "program" in job
        else presets.ALL[job["preset"]].lower(regularized=job["regularized"])
    )
    spec = ProductSpec(
        **spec_fields(
            job, program=program, compute=compute, nbatch=0, tensor_hypers=frozenset(), int64=False, kernel="simt"
        )
    )
    fn = load_module(kernel_source(spec)).kermac_product
    consts = dict(job["meta"]) | {"SXK": 1, "SZK": 1, "SVC": 1, "SOC": 1, "KEY": 0}
    # the tensor-core kernel's split workspaces: float32 where it reads them, else x and z stand in
    workspaces = [n for n in ("XH", "XL", "XN", "ZH", "ZL", "ZN") if n in fn.arg_names]
    pointers = ("X", "Z", "V", "OUT", *workspaces)
    types = signature(
        fn.arg_names, consts, pointers, dtype=dtype, compute=compute, int64=spec.int64, float32_scalars=("GUARD",)
    )
    presplit = bool(job["meta"].get("PRESPLIT"))
    if presplit:
        types.update({n: "*fp32" for n in workspaces})
    aligned = [n for n in (*pointers, "SXM", "SZN", "SVN", "SOM") if n not in consts]
    aligned += ["DP"] if presplit else []  # a multiple of PRODUCT_TC_SPLIT_BK
    return ast_source(ASTSource, fn, types, consts, aligned)


def main() -> None:
    serve(compile_job)


if __name__ == "__main__":
    main()
