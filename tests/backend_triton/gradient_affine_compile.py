"""Compile generated gradient kernels of affine factors to cubins without a GPU, in a clean process.

Run as ``python tests/backend_triton/gradient_affine_compile.py`` with a JSON list of jobs on stdin; prints a JSON
object mapping each job's ``id`` to its ``cuobjdump -res-usage`` report (or ``"error: ..."``).  A separate
process for the reasons of ``tests/gluon_compile.py`` (``TRITON_INTERPRET`` unset).

A job: ``{"id", "program" (a program's key), "spec": {GradSpec field changes}, "meta", "warps", "arch",
"dtype"}``; the spec has ``tensor_cores`` set; pointers are 16-byte aligned, the unit strides 1
and the others (batch strides included: the launcher specialises them on that) divisible by 16.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for cubin_jobs

from cubin_jobs import ast_source, resource_usage, serve, signature, spec_fields


def compile_job(job: dict) -> str:
    from triton.compiler import ASTSource

    from kermac.programs import program_from_key
    from kermac_backend_triton.generated import GradSpec, kernel_source
    from kermac_backend_triton.modules import load_module

    dtype = job["dtype"]
    compute = "float64" if dtype == "float64" else "float32"
    defaults = dict(
        program=program_from_key(job["program"]),
        compute=compute,
        nbatch=0,
        tensor_hypers=frozenset(),
        int64=False,
        tensor_cores=True,
    )
    spec = GradSpec(**spec_fields(job, **defaults))
    fn = load_module(kernel_source(spec)).kermac_grad
    consts = dict(job["meta"]) | {"SAM": 1, "SBK": 1, "SCK": 1, "SDM": 1, "SOM": 1, "KEY": 0}
    types = signature(
        fn.arg_names, consts, ("A", "B", "C", "DD", "OUT"), dtype=dtype, compute=compute, int64=spec.int64
    )
    names = ("A", "B", "C", "DD", "OUT", "SAK", "SBN", "SCO", "SDN", "SON", "SOO")
    aligned = [n for n in fn.arg_names if (n in names or n.startswith("SB_")) and n not in consts]
    return resource_usage(ast_source(ASTSource, fn, types, consts, aligned), job["arch"], job["warps"])


def main() -> None:
    serve(compile_job)


if __name__ == "__main__":
    main()
