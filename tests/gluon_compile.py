"""Compile generated Gluon pairwise kernels to cubins without a GPU, in a clean process.

Run as ``python tests/gluon_compile.py`` with a JSON list of jobs on stdin; prints a JSON object
mapping each job's ``id`` to its ``cuobjdump -res-usage`` report (or ``"error: ..."``).  A
separate process because Triton's CPU interpreter, once it has run a kernel, patches
``triton.language`` for the whole process, and compiling for a GPU then fails; and the
generated helpers must be ``@triton.jit`` functions, not interpreted ones (``TRITON_INTERPRET``
unset).

A job: ``{"id", "preset", "regularized", "spec": {PairwiseSpec field changes}, "meta", "warps", "arch",
"constants": {argument: value}}``, or ``"program"`` (a program's key) in place of ``"preset"`` and
``"regularized"``; pointers are 16-byte aligned and ``N``, ``SXM``, ``SZN``, ``SOM`` divisible by 16 unless
given as constants.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[0]))  # tests/, for cubin_jobs

from cubin_jobs import ast_source, resource_usage, serve, signature, spec_fields


def compile_job(job: dict) -> str:
    from triton.experimental.gluon._runtime import GluonASTSource

    from kermac import presets
    from kermac.programs import program_from_key
    from kermac_backend_triton.generated import PairwiseSpec, kernel_source
    from kermac_backend_triton.modules import load_module

    program = (
        program_from_key(job["program"])
        if "program" in job
        else presets.ALL[job["preset"]].lower(regularized=job["regularized"])
    )
    spec = PairwiseSpec(
        **spec_fields(
            job, program=program, compute="float32", nbatch=0, tensor_hypers=frozenset(), int64=False, kernel="gluon"
        )
    )
    fn = load_module(kernel_source(spec)).kermac_pairwise
    consts = dict(job["meta"]) | job["constants"]
    types = signature(fn.arg_names, consts, ("X", "Z", "OUT"), dtype="float32", compute="float32", int64=spec.int64)
    aligned = [n for n in ("X", "Z", "OUT", "N", "SXM", "SZN", "SOM") if n not in consts]
    return resource_usage(ast_source(GluonASTSource, fn, types, consts, aligned), job["arch"], job["warps"])


def main() -> None:
    serve(compile_job)


if __name__ == "__main__":
    main()
