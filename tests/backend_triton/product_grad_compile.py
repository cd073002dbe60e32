"""Compile generated gradient-product kernels to cubins without a GPU, in a clean process.

Run as ``python tests/backend_triton/product_grad_compile.py`` with a JSON list of jobs on stdin; prints a JSON
object mapping each job's ``id`` to its ``cuobjdump -res-usage`` report (or ``"error: ..."``).  A separate
process for the reasons of ``tests/gluon_compile.py`` (``TRITON_INTERPRET`` unset).

A job: ``{"id", "program" (a program's key), "spec": {ProductGradSpec field changes}, "meta", "warps", "arch",
"dtype"}``; pointers are 16-byte aligned, the unit strides 1 and the others divisible by 16.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cubin_jobs

from cubin_jobs import ast_source, resource_usage, serve, signature, spec_fields


def compile_job(job: dict) -> str:
    from triton.compiler import ASTSource

    from kermac.programs import program_from_key
    from kermac_backend_triton.generated import ProductGradSpec, kernel_source
    from kermac_backend_triton.modules import load_module

    dtype = job["dtype"]
    compute = "float64" if dtype == "float64" else "float32"
    defaults = dict(
        program=program_from_key(job["program"]), compute=compute, nbatch=0, tensor_hypers=frozenset(), int64=False
    )
    spec = ProductGradSpec(**spec_fields(job, **defaults))
    fn = load_module(kernel_source(spec)).kermac_product_grad
    consts = dict(job["meta"]) | {"SXK": 1, "SZK": 1, "SVC": 1, "SGC": 1, "SOK": 1, "KEY": 0}
    types = signature(fn.arg_names, consts, ("X", "Z", "V", "G", "OUT"), dtype=dtype, compute=compute, int64=spec.int64)
    aligned = [n for n in ("X", "Z", "V", "G", "OUT", "SXM", "SZN", "SVN", "SGM", "SOM") if n not in consts]
    return resource_usage(ast_source(ASTSource, fn, types, consts, aligned), job["arch"], job["warps"])


def main() -> None:
    serve(compile_job)


if __name__ == "__main__":
    main()
