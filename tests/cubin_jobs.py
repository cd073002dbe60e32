"""The shared half of the scripts that compile Triton kernels to cubins without a GPU, each in a clean
process (``tests/gluon_compile.py``, ``tests/backend_triton/*_compile.py``): one compiled source's register report,
the loop that answers a JSON list of jobs on stdin, and the tests' side: running such a script and reading a report.

A report is ``cuobjdump -res-usage`` of the cubin followed by one line ``TRITON:<version> LOCAL_IN_INNER_LOOPS:<n>``:
the Triton that compiled it and how many of the machine code's local-memory instructions (``LDL``, ``STL``: ptxas's
spills) lie in an innermost loop (:func:`local_in_inner_loops`).  A spill outside the innermost loops costs a store
and a load per value per thread, or per step of an outer loop; one inside costs them on every step of the hot loop.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def spec_fields(job: dict, **defaults: Any) -> dict[str, Any]:
    """The fields of a job's kernel spec: `defaults` updated by `job["spec"]` (its `tensor_hypers` a frozenset)."""
    changes = dict(job["spec"])
    if "tensor_hypers" in changes:
        changes["tensor_hypers"] = frozenset(changes["tensor_hypers"])
    return defaults | changes


POINTER_TYPES = {"float32": "*fp32", "float64": "*fp64", "float16": "*fp16", "bfloat16": "*bf16"}
"""Triton's pointer type of each input dtype."""


def signature(
    arg_names: Sequence[str],
    consts: Mapping[str, Any],
    pointers: Sequence[str],
    *,
    dtype: str,
    compute: str,
    int64: bool,
    float32_scalars: Sequence[str] = (),
) -> dict[str, str]:
    """Triton's signature of a generated kernel's arguments `arg_names`: `constexpr` for `consts`, `dtype`'s pointer
    type for `pointers` and the tensor hyperparameters (`H_*`), the compute type for scalar hyperparameters (`h_*`),
    float32 for `float32_scalars` (a guard), and 32- or 64-bit integers (`int64`) for the sizes and strides."""
    types: dict[str, str] = {}
    for name in arg_names:
        if name in consts:
            types[name] = "constexpr"
        elif name in pointers or name.startswith("H_"):
            types[name] = POINTER_TYPES[dtype]
        elif name.startswith("h_"):
            types[name] = "fp64" if compute == "float64" else "fp32"
        elif name in float32_scalars:
            types[name] = "fp32"
        else:
            types[name] = "i64" if int64 else "i32"
    return types


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
    """``cuobjdump -res-usage`` of a compiled ``cubin`` (Triton's own cuobjdump) and the report's last line."""
    import triton

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return f"{usage} TRITON:{triton.__version__} LOCAL_IN_INNER_LOOPS:{local_in_inner_loops(sass)}\n"


#: One instruction of ``cuobjdump -sass``: its address, opcode (with modifiers) and operands.
_INSTRUCTION = re.compile(r"/\*([0-9a-f]+)\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_TARGET = re.compile(r"0x([0-9a-f]+)")


def local_in_inner_loops(sass: str) -> int:
    """How many local-memory instructions (``LDL``, ``STL``) of ``sass`` (``cuobjdump -sass`` of one kernel) lie in an
    innermost loop (from a backward branch's target to the branch, holding no other such range), or in a subroutine
    (a ``CALL`` target up to its ``RET``) called from one: the instructions run on every step of a hot loop."""
    code = [(int(address, 16), opcode, operands) for address, opcode, operands in _INSTRUCTION.findall(sass)]

    def target(operands: str) -> int:
        return int(_TARGET.search(operands)[1], 16)

    loops = {(target(ops), at) for at, op, ops in code if op.startswith("BRA") and target(ops) < at}
    inner = [(lo, hi) for lo, hi in loops if not any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in loops)]
    returns = sorted(at for at, op, _ in code if op.startswith("RET"))
    for at, op, ops in code:
        if op.startswith("CALL") and any(lo <= at <= hi for lo, hi in inner):
            ends = [r for r in returns if r >= target(ops)]
            if ends:
                inner.append((target(ops), ends[0]))
    local = [at for at, op, _ in code if op.startswith(("LDL", "STL"))]
    return sum(any(lo <= at <= hi for lo, hi in inner) for at in local)


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


SPILLS_BEFORE = (3, 9)
"""Triton releases before this one ship an older ptxas (Triton 3.6: CUDA 12.8's; 3.9: 12.9's) that spills a few
values outside the hot loops where 3.9's spills none.  Measured on the default tiles with Triton 3.6
(docs/dev/triton-version-floor.md): the gradient product at 80 registers (three 256-thread programs per
multiprocessor) spills 8-16 bytes, stored before its loops and loaded between or after them (Laplace-L1 sm_90; the
soft minimum accumulating in `out`, sm_80 and sm_90); the tensor-core product's 64 × 64 tile for sm_80 32 bytes
(float32) to 240 (float16), in its N loop but outside the k loop.  A register limit (`maxnreg`) removes the
gradient product's at the price of a program per multiprocessor, and none of the other tiles tried compiles without
spills under both releases; so a stack frame from an older Triton is accepted where no local-memory instruction
lies in an innermost loop."""


def report_triton(report: str) -> tuple[int, int]:
    """The (major, minor) version of the Triton that compiled ``report``."""
    major, minor = re.search(r"TRITON:(\d+)\.(\d+)", report).groups()
    return int(major), int(minor)


def spills_in_hot_loops(report: str) -> int:
    """The local-memory instructions of ``report``'s kernel that lie in an innermost loop."""
    return int(re.search(r"LOCAL_IN_INNER_LOOPS:(\d+)", report)[1])


def assert_compiled(report: str, *, spills: bool = False, outside_hot_loops: bool = False) -> None:
    """``report`` is a register report (not an error) and, unless ``spills``, shows no stack or local memory; compiled
    by a Triton before `SPILLS_BEFORE`, or where ``outside_hot_loops`` (a variant measured faster than those that
    fit its registers), none in an innermost loop."""
    assert "REG:" in report, report
    if spills:
        return
    if outside_hot_loops or report_triton(report) < SPILLS_BEFORE:
        assert spills_in_hot_loops(report) == 0, report
    else:
        assert "STACK:0" in report and "LOCAL:0" in report, report
