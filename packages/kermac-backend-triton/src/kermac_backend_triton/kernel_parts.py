"""Source pieces every generated kernel shares: parameter lists, batch decoding, tile order.

The ``tl`` kernels (:mod:`kermac_backend_triton.kernels`) and the Gluon kernel
(:mod:`kermac_backend_triton.gluon_pairwise`) both call these; ``tl`` builtins work inside Gluon
kernels, so the lines are the same for both.
"""

from __future__ import annotations

from kermac.programs import PairwiseProgram
from kermac_backend_triton.codegen import hyper_arg, nonnegative, render_expr

__all__ = [
    "IDENTITY",
    "STREAM",
    "batch_code",
    "batch_params",
    "hyper_loads",
    "hyper_params",
    "indent",
    "operand_pointers",
    "simt_epilogue",
    "tile_order",
]

#: The reduction's identity, as source (the value masked-off terms take).
IDENTITY = {"sum": "0.0", "max": "_NINF", "min": "_INF"}
#: Store keyword of streaming (evict-first) output stores: the output is not re-read.
STREAM = ', cache_modifier=".cs"'


def simt_epilogue(prog: PairwiseProgram, compute: str, acc: str, diag: str, lang: str = "tl") -> str:
    """The epilogue of a SIMT pairwise kernel as source, reading ``acc`` and ``diag``.

    The accumulator is known to be non-negative (simpler ``pow``) when the reduction is a sum or
    a min of non-negative inner terms: every term, and the identity (0 or +inf), is then ≥ 0.
    """
    known = frozenset({"acc"}) if prog.reduction != "max" and nonnegative(prog.inner) else frozenset()
    return render_expr(prog.epilogue, {"acc": acc, "diag": diag}, compute, known, lang=lang)


def operand_pointers(tensors: dict[str, str], tensor_hypers: frozenset[str]) -> dict[str, str]:
    """Operand key → pointer parameter, tensor hyperparameters (``hyper_<name>`` → ``H_<name>``) last."""
    return tensors | {f"hyper_{n}": f"H_{n}" for n in sorted(tensor_hypers)}


def hyper_params(names: tuple[str, ...], tensor: frozenset[str], cdt: str) -> str:
    return "".join(f"H_{n}, " if n in tensor else f"{hyper_arg(n)}: {cdt}, " for n in names)


def batch_params(operands: tuple[str, ...], nbatch: int) -> str:
    params = [f"BS{i}" for i in range(nbatch)]
    params += [f"SB_{op}_{i}" for op in operands for i in range(nbatch)]
    return "".join(p + ", " for p in params)


def batch_code(operands: dict[str, str], nbatch: int) -> list[str]:
    """Lines that decode batch entry ``bat`` and move each operand's base to it.

    ``operands`` maps an operand's stride-name key to the variable holding its base pointer.
    """
    if nbatch == 0:
        return []
    lines = ["rest = bat"]
    for i in reversed(range(1, nbatch)):
        lines += [f"b{i} = rest % BS{i}", f"rest = rest // BS{i}"]
    lines.append("b0 = rest")
    for key, ptr in operands.items():
        offset = " + ".join(f"b{i} * SB_{key}_{i}" for i in range(nbatch))
        lines.append(f"{ptr} += {offset}")
    return lines


def hyper_loads(names: tuple[str, ...], tensor: frozenset[str], cdt: str, lang: str = "tl") -> list[str]:
    """Lines giving each hyperparameter's kernel-local value in the compute type ``cdt``.

    Tensors are loaded at the batch entry's offset.  Scalar arguments are cast on entry: a no-op
    on a GPU, where the typed parameter already has the compute type, but the interpreter passes
    the Python float itself, which Triton would take as float32 wherever no tensor is involved.
    ``lang``: the kernel's language module (``tl``, or ``gl`` in Gluon, whose ``full`` this is).
    """
    h = hyper_arg
    return [
        f"{h(n)} = tl.load(H_{n}).to({cdt})" if n in tensor else f"{h(n)} = {lang}.full([], {h(n)}, {cdt})"
        for n in sorted(names)
    ]


def indent(lines: list[str], depth: int = 1) -> str:
    pad = "    " * depth
    return "".join(f"{pad}{line}\n" for line in lines)


def tile_order(cast: str, lang: str = "tl") -> str:
    """Lines (one indent) mapping the program id to batch entry ``bat`` and tile ``(pm, pn)``.

    Tiles are taken in groups of ``GROUP_M`` row tiles so that consecutive programs share
    operand rows in L2.  ``lang`` names the language module of the kernel (``tl``, or ``gl`` in
    Gluon, whose own ``cdiv`` stays compilable where ``TRITON_INTERPRET`` wraps ``tl.cdiv``).
    """
    return f"""\
    pid = {lang}.program_id(0){cast}
    tiles_m = {lang}.cdiv(M, BM)
    tiles_n = {lang}.cdiv(N, BN)
    tiles = tiles_m * tiles_n
    bat = pid // tiles
    tile = pid % tiles
    width = GROUP_M * tiles_n
    first_m = (tile // width) * GROUP_M
    group_rows = {lang}.minimum(tiles_m - first_m, GROUP_M)
    pm = first_m + (tile % width) % group_rows
    pn = (tile % width) // group_rows
"""
