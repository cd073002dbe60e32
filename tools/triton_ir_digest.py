"""SHA-256 of the Triton backend's compiled kernels, per representative specialisation, without a GPU.

Compiles each case for a CUDA target (``triton.compile`` needs no device) and prints, per case,
the digest of its TTGIR and of its PTX with source locations removed (file names, line numbers
and the ``.loc``/``.file`` directives change whenever the Python text moves, the kernel does
not).  Two checkouts that print the same digests compile to the same kernels, so a change of
the generating code that keeps every digest is a pure refactoring; a differing digest is a
kernel change to measure on the GPU.

Usage (TRITON_INTERPRET must be unset: interpreted functions do not compile)::

    env -u TRITON_INTERPRET PYTHONPATH=<checkout's package src dirs> python tools/triton_ir_digest.py [--arch 90]
        [--only CASE ...] [--dump DIR]

``--dump`` writes the normalised TTGIR and PTX of each case to ``DIR`` for a diff.  The cases
cover every kernel (SIMT ``tl``, tensor cores, Gluon, gradient), every compute type and input
dtype family, fractional p, a max reduction, the diagonal, batches with tensor hyperparameters
and 64-bit indices.  The script also reads the commit before the skeleton rewrite (``da19141``,
whose sources came from ``kernels.pairwise_source`` / ``gluon_pairwise_source``), so the same
file compares both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path

#: name → (kind, preset or grad p, spec fields, input dtype, launch meta-parameters, options)
#: kind: "simt" (the ``tl`` pairwise kernel), "tc" (tensor cores), "gluon", "grad".
CASES: dict[str, tuple] = {
    "simt-l1-f32": ("simt", "l1_distance", {}, "fp32", {"BK": 4, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 2}),
    "simt-l2-f32-pf1": ("simt", "l2_distance", {}, "fp32", {"BK": 8, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 1}),
    "simt-lp-f32-pf0": ("simt", "lp_distance", {}, "fp32", {"BK": 8, "MI": 4, "NI": 4, "MT": 8, "NT": 16, "PF": 0}),
    "simt-linf-f16": ("simt", "linf_distance", {}, "fp16", {"BK": 4, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 2}),
    "simt-laplace-lp-reg-f64": (
        "simt",
        "laplace_lp+reg",
        {"compute": "float64"},
        "fp64",
        {"BK": 4, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 2},
    ),
    "simt-laplace-lp-batched-int64": (
        "simt",
        "laplace_lp",
        {"nbatch": 2, "tensor_hypers": frozenset({"bandwidth"}), "int64": True},
        "fp32",
        {"BK": 4, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 2},
    ),
    "tc-l2-f32": ("tc", "l2_distance", {}, "fp32", {"BM": 128, "BN": 128, "BK": 32, "GROUP_M": 8}, (8, 3, 128)),
    "tc-gaussian-reg-f16-short": (
        "tc",
        "gaussian+reg",
        {},
        "fp16",
        {"BM": 128, "BN": 64, "BK": 16, "GROUP_M": 8},
        (4, 4, 128),
    ),
    "tc-laplace-l2-batched-int64": (
        "tc",
        "laplace_l2",
        {"nbatch": 1, "tensor_hypers": frozenset({"bandwidth"}), "int64": True},
        "fp32",
        {"BM": 128, "BN": 128, "BK": 32, "GROUP_M": 8},
        (8, 3, 128),
    ),
    "gluon-l1-f32": (
        "gluon",
        "l1_distance",
        {},
        "fp32",
        {"BM": 128, "BN": 128, "BK": 8, "TM": 4, "XT": 0, "ZT": 0, "FEW": 0},
    ),
    "gluon-lp-reg-transposed": (
        "gluon",
        "lp_distance+reg",
        {},
        "fp32",
        {"BM": 64, "BN": 128, "BK": 8, "TM": 2, "XT": 1, "ZT": 1, "FEW": 0},
        (4, 1, None),
    ),
    "gluon-linf-batched-int64": (
        "gluon",
        "laplace_lp",
        {"nbatch": 2, "tensor_hypers": frozenset({"p"}), "int64": True},
        "fp32",
        {"BM": 128, "BN": 128, "BK": 8, "TM": 4, "XT": 0, "ZT": 0, "FEW": 0},
    ),
    "grad-p1-f32": ("grad", 1.0, {}, "fp32", {"BN": 8, "BM": 32, "BK": 32, "BO": 16}, (8, 3, 128)),
    "grad-p1.5-f32": ("grad", 1.5, {}, "fp32", {"BN": 8, "BM": 32, "BK": 32, "BO": 16}, (8, 3, 128)),
    "grad-p3-f64": ("grad", 3.0, {"compute": "float64"}, "fp64", {"BN": 8, "BM": 32, "BK": 16, "BO": 16}, (4, 4, None)),
    "grad-p1.5-batched-tensor-p": (
        "grad",
        1.5,
        {"nbatch": 1, "tensor_hypers": frozenset({"p"}), "int64": True},
        "fp32",
        {"BN": 8, "BM": 32, "BK": 32, "BO": 32},
        (8, 3, 128),
    ),
}

#: Default (num_warps, num_stages, maxnreg) per kind.
DEFAULT_OPTIONS = {"simt": (4, 3, None), "tc": (8, 3, 128), "gluon": (8, 1, None), "grad": (8, 3, 128)}

#: Arguments with the value 1 (unit strides of row-major operands): Triton makes them constants.
UNIT_STRIDES = {
    "simt": ("SXK", "SZK", "SON"),
    "tc": ("SXK", "SZK", "SON"),
    "gluon": ("SXK", "SZK", "SON"),
    "grad": ("SAM", "SBK", "SCK", "SDM", "SOM"),
}
UNIT_STRIDES_TRANSPOSED = ("SXM", "SZN", "SON")
#: Integer arguments given 16-divisibility (as Triton's specialisation finds for these launches).
DIVISIBLE = {
    "simt": ("N", "SXM", "SZN", "SOM"),
    "tc": ("N", "D", "SXM", "SZN", "SOM"),
    "gluon": ("N", "SXM", "SZN", "SOM"),
    "grad": ("SAK", "SBN", "SCO", "SDN", "SOO", "SON"),
}
POINTERS = ("X", "Z", "OUT", "A", "B", "C", "DD")


def _program(kind: str, which: object):
    from kermac import lowering, presets

    if kind == "grad":
        return lowering.grad_program(which)
    name, _, reg = str(which).partition("+")
    return presets.ALL[name].lower(regularized=bool(reg))


def _kernel(kind: str, program: object, fields: dict):
    """The ``@triton.jit`` (or Gluon) entry function of one case, from either checkout."""
    from kermac_backend_triton.modules import load_module

    pairwise = kind != "grad"
    base = dict(program=program, compute="float32", nbatch=0, tensor_hypers=frozenset(), int64=False) | fields
    try:
        from kermac_backend_triton import generated
    except ImportError:  # the commit before the skeleton rewrite
        return _baseline_kernel(kind, base)
    if pairwise:
        spec = generated.PairwiseSpec(**base, kernel={"tc": "tensor_cores"}.get(kind, kind))
    else:
        spec = generated.GradSpec(**base)
    module = load_module(generated.kernel_source(spec))
    return getattr(module, generated.PAIRWISE_ENTRY if pairwise else generated.GRAD_ENTRY)


def _baseline_kernel(kind: str, fields: dict):
    """The entry function as commit ``da19141`` generated it (its specs and source functions)."""
    from kermac_backend_triton import kernels
    from kermac_backend_triton.modules import load_module

    fields = fields | {"interpret": False}
    if kind == "grad":
        return load_module(kernels.grad_source(kernels.GradSpec(**fields))).kermac_grad
    spec = kernels.PairwiseSpec(**fields, tensor_cores=kind == "tc", gluon=kind == "gluon")
    if kind == "gluon":
        from kermac_backend_triton.gluon_pairwise import gluon_pairwise_source

        return load_module(gluon_pairwise_source(spec)).kermac_pairwise
    return load_module(kernels.pairwise_source(spec)).kermac_pairwise


def _signature(fn, kind: str, dtype: str, compute: str, meta: dict) -> tuple[dict, dict, dict]:
    index = {n: i for i, n in enumerate(fn.arg_names)}
    transposed = meta.get("XT") == 1
    consts = dict(meta) | {s: 1 for s in (UNIT_STRIDES_TRANSPOSED if transposed else UNIT_STRIDES[kind])}
    cdt = "fp64" if compute == "float64" else "fp32"
    signature = {}
    for name in fn.arg_names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = f"*{dtype}"
        elif name.startswith("H_"):
            signature[name] = f"*{dtype}"
        elif name.startswith("h_"):
            signature[name] = cdt
        elif name == "GUARD":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    aligned = [n for n in (*POINTERS, *DIVISIBLE[kind]) if n in index and n not in consts]
    aligned += [n for n in fn.arg_names if n.startswith("H_")]
    constexprs = {(index[k],): v for k, v in consts.items() if k in index}
    attrs = {(index[n],): [["tt.divisibility", 16]] for n in aligned}
    return signature, constexprs, attrs


def _strip_locations(text: str) -> str:
    """TTGIR without ``loc(...)`` attributes and ``#loc`` definitions (nested parentheses handled),
    its SSA values renamed in order of appearance."""
    out, i = [], 0
    while True:
        j = text.find(" loc(", i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        depth, k = 0, j + 4
        while True:
            depth += {"(": 1, ")": -1}.get(text[k], 0)
            k += 1
            if depth == 0:
                break
        i = k
    text = "\n".join(line for line in "".join(out).splitlines() if not line.startswith("#loc"))
    # SSA value names come from Python variable names; number them by first use instead.
    names: dict[str, str] = {}
    return re.sub(r"%[\w.$-]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), text)


def _strip_ptx(text: str) -> str:
    """PTX without ``.loc``/``.file`` directives and DWARF sections (the debug line table)."""
    lines = []
    skipping = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(".section") and ".debug" in stripped:
            skipping = True
        if skipping:
            if stripped == "}":
                skipping = False
            continue
        if stripped.startswith((".loc", ".file", "$L__func_begin", "$L__func_end", "$L__tmp")):
            continue
        lines.append(line)
    return "\n".join(lines)


def compile_case(name: str, arch: int) -> dict[str, str]:
    import triton
    from triton.backends.compiler import GPUTarget

    kind, which, fields, dtype, meta, *rest = CASES[name]
    warps, stages, maxnreg = rest[0] if rest else DEFAULT_OPTIONS[kind]
    meta = dict(meta)
    if kind in ("simt", "tc", "gluon"):
        meta.setdefault("GROUP_M", 8)
    fn = _kernel(kind, _program(kind, which), fields)
    signature, constexprs, attrs = _signature(fn, kind, dtype, fields.get("compute", "float32"), meta)
    if kind == "gluon":
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    source = Source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": warps, "num_stages": stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return {"ttgir": _strip_locations(kernel.asm["ttgir"]), "ptx": _strip_ptx(kernel.asm["ptx"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability ×10 to compile for (default 90)")
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="cases to compile (default: all)")
    parser.add_argument("--dump", type=Path, help="write each case's normalised TTGIR and PTX here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("TRITON_INTERPRET is set: interpreted kernels cannot be compiled (unset it)")
    digests = {}
    for name in args.only or CASES:
        try:
            asm = compile_case(name, args.arch)
        except Exception as exc:  # one failing case must not hide the others
            digests[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"{name}: error {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            continue
        digests[name] = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in asm.items()}
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            for k, v in asm.items():
                (args.dump / f"{name}.{k}").write_text(v)
        print(f"{name}: ttgir {digests[name]['ttgir'][:16]} ptx {digests[name]['ptx'][:16]}", file=sys.stderr)
    json.dump(digests, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
