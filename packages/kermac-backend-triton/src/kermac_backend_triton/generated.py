"""The per-program module: the few lines of each kernel that come from the IR, as Python source.

The kernels themselves are ordinary `@triton.jit` code (`pairwise_simt`,
`pairwise_tensor_cores`, `gluon_pairwise`, `gradient`, `gradient_affine` and `general_gradient`, `product`, which
contracts the SIMT or tensor-core pairwise tiles with `v`, and `product_gradient`, the gradient of that
product).  What varies with the program and the launch's layout is generated here, as a small module
(`kernel_source`, loaded by `kermac_backend_triton.modules.load_module`) holding:

* the program's expressions as `@triton.jit` functions of their variables and the tuple
  `hypers` of hyperparameter values — `inner(x, z, hypers)` and `epilogue(acc, diag, hypers)`
  (pairwise and product); `inner(x, z, hypers)`, `slope(acc, diag, hypers)` (the epilogue's derivative
  [`kermac.programs.epilogue_slope`][kermac.programs.epilogue_slope]) and `inner_slope(x, z, hypers)`
  ([`kermac.programs.inner_slope`][kermac.programs.inner_slope]) (the gradient product);
  `multiply(d, b, hypers)` (the factor of
  [`kermac.programs.product_factor`][kermac.programs.product_factor]), `epilogue(acc, hypers)` and, for a signed
  power, `signed_base` / `signed_exponent` (a gradient program with a product factor, `gradient`);
  `combine(ds, acc, hypers)` = α·ds + β·acc (the coefficients of
  [`kermac.programs.affine_factor`][kermac.programs.affine_factor]) and `epilogue(acc, hypers)` (one whose factor
  is affine, on the tensor cores: `gradient_affine`);
  `multiply(a, b, d, hypers)`, `accumulate(c, term, hypers)` and `epilogue(acc, hypers)` (one without,
  `general_gradient`), rendered by `kermac_backend_triton.expressions`;
* its reduction's rule (`kermac.reductions`; a gradient program's only where it has no product factor):
  `combine(acc, t)` and, for the kernels that reduce a
  chunk of terms at once, `combine_chunk(acc, t)` (`t` reduced over its axis 0 by `combine`;
  by `tl.sum` for the arithmetic sum, the same values, which the CPU interpreter computes as one
  vector operation where a function of its own is folded element by element); and for the gradient product of a
  reduction other than the sum its `weight(acc, t)` (`∂acc/∂τ_j`), passed to the tile function with the
  reduction's name `REDUCTION` (a sum passes neither: the tile function's defaults);
* the entry kernel, whose parameter list depends on the program's hyperparameters (a typed
  scalar `h_<name>`, or a pointer `H_<name>` per batch entry) and on the number of coalesced
  batch dimensions of `kermac.layout.batch_layout` (sizes `BS<i>`, per-operand strides
  `SB_<operand>_<i>`).  Its body finds its tile, decodes its batch entry and moves each base
  pointer to it, loads the hyperparameters, and calls the kernel's tile function.

Argument order of the entry kernels (what `kermac_backend_triton.launch` passes): operand
pointers, hyperparameters in the program's order, sizes, offsets (pairwise, products), operand strides,
batch sizes and strides, the guard threshold (tensor cores), `KEY` (the autotuning bucket,
never specialised), then the meta-parameters.  Sizes that only bound loops (M, D, the offsets) are
never specialised; N (and D on tensor cores) are, on divisibility by 16, so the store (and k)
masks keep 16-byte vectors: at most two compilations per configuration.  The product
specialises none of its sizes but D on the tensor cores (its k masks, as the pairwise kernel); the gradient
product none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kermac.ir import Const, Expr, Var, free_vars
from kermac.kernel_facts import tensor_core_eligible
from kermac.programs import (
    GradProgram,
    PairwiseProgram,
    affine_factor,
    epilogue_slope,
    inner_slope,
    nonnegative_variables,
    product_factor,
    signed_power,
)
from kermac.reductions import ALL as REDUCTIONS
from kermac_backend_triton.expressions import COMPUTE_TYPES, hyper_arg, render_expr
from kermac_backend_triton.product_gradient import weighted_reduction

__all__ = [
    "GRAD_ENTRY",
    "GRAD_KERNELS",
    "KERNELS",
    "PAIRWISE_ENTRY",
    "PRODUCT_ENTRY",
    "PRODUCT_GRAD_ENTRY",
    "PRODUCT_KERNELS",
    "PRODUCT_SPLIT_OPERANDS",
    "GradSpec",
    "PairwiseSpec",
    "ProductGradSpec",
    "ProductSpec",
    "grad_kernel",
    "kernel_source",
]

PAIRWISE_ENTRY = "kermac_pairwise"
GRAD_ENTRY = "kermac_grad"
PRODUCT_ENTRY = "kermac_product"
PRODUCT_GRAD_ENTRY = "kermac_product_grad"
PRODUCT_SPLIT_OPERANDS = ("xh", "xl", "xn", "zh", "zl", "zn")
"""The split workspaces the tensor-core product's entry kernel takes after x, z, v, out
(`kermac_backend_triton.operand_split`: hi, lo and norms of x, then of z)."""

KERNELS = ("simt", "tensor_cores", "gluon")
"""The pairwise kernels: the `tl` SIMT kernel, the tensor-core one, the Gluon SIMT one."""
PRODUCT_KERNELS = ("simt", "tensor_cores")
"""The pairwise kernels whose K tiles the product contracts (`kermac_backend_triton.product`)."""
GRAD_KERNELS = ("grad", "grad_general", "grad_affine")
"""The gradient kernels: the product form's (`kermac_backend_triton.gradient`), the general form's
(`kermac_backend_triton.general_gradient`) and the matrix products of an affine factor
(`kermac_backend_triton.gradient_affine`)."""


def grad_kernel(program: GradProgram, tensor_cores: bool = False) -> str:
    """The gradient kernel (one of `GRAD_KERNELS`) that runs `program`: with `tensor_cores`, `"grad_affine"` where
    its product factor is `α·d + β·b` ([`kermac.programs.affine_factor`][kermac.programs.affine_factor]); else
    `"grad"` where it computes a product form `Σ_k c·a·g(d, b)`
    ([`kermac.programs.product_factor`][kermac.programs.product_factor] finds `g`), else `"grad_general"`."""
    if tensor_cores and affine_factor(program) is not None:
        return "grad_affine"
    return "grad" if product_factor(program) is not None else "grad_general"


def _check_compute(compute: str) -> None:
    """Refuse a compute type no kernel has."""
    if compute not in COMPUTE_TYPES:
        raise ValueError(f"compute: expected one of {sorted(COMPUTE_TYPES)}, got {compute!r}")


def _check_pairwise_fields(spec: PairwiseSpec | ProductSpec, kernels: tuple[str, ...]) -> None:
    """Refuse a compute type, kernel or tensor-core program that `kernels` cannot run."""
    _check_compute(spec.compute)
    if spec.kernel not in kernels:
        raise ValueError(f"kernel: expected one of {kernels}, got {spec.kernel!r}")
    if spec.kernel == "tensor_cores" and not tensor_core_eligible(spec.program, spec.compute):
        raise ValueError(
            f"kernel: 'tensor_cores' needs a float32 sum of (x - z)^2; got {spec.compute} {spec.program.key()}"
        )
    if spec.kernel == "gluon" and spec.compute != "float32":
        raise ValueError(f"kernel: the Gluon kernel computes in float32; got compute={spec.compute!r}")


@dataclass(frozen=True)
class _Spec:
    """The fields every generated module depends on.

    `compute`: `"float32"` or `"float64"`; `nbatch`: coalesced batch dimensions;
    `tensor_hypers`: hyperparameters passed as per-batch tensors; `int64`: 64-bit indices.
    """

    program: PairwiseProgram | GradProgram
    compute: str
    nbatch: int
    tensor_hypers: frozenset[str]
    int64: bool

    def __post_init__(self) -> None:
        _check_compute(self.compute)


@dataclass(frozen=True)
class PairwiseSpec(_Spec):
    """Everything a pairwise kernel's generated module depends on: the fields of every spec, and `kernel`, one
    of `KERNELS` (tensor cores only for `tensor_core_eligible` programs, Gluon only in float32)."""

    program: PairwiseProgram
    kernel: str = "simt"

    def __post_init__(self) -> None:
        _check_pairwise_fields(self, KERNELS)


@dataclass(frozen=True)
class ProductSpec(_Spec):
    """Everything a kernel product's generated module depends on (fields as `PairwiseSpec`;
    `kernel`: one of `PRODUCT_KERNELS`, the pairwise kernel whose K tiles are contracted)."""

    program: PairwiseProgram
    kernel: str = "simt"

    def __post_init__(self) -> None:
        _check_pairwise_fields(self, PRODUCT_KERNELS)


@dataclass(frozen=True)
class ProductGradSpec(_Spec):
    """Everything a gradient product's generated module depends on (the fields of every spec; one kernel,
    `kermac_backend_triton.product_gradient`)."""

    program: PairwiseProgram


@dataclass(frozen=True)
class GradSpec(_Spec):
    """Everything a gradient kernel's generated module depends on: the fields of every spec, and
    `tensor_cores`, which only a program with an affine factor may set (the kernel, `grad_kernel`,
    follows from the program and it)."""

    program: GradProgram
    tensor_cores: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tensor_cores and affine_factor(self.program) is None:
            raise ValueError(
                "tensor_cores: the tensor-core gradient kernel needs a product factor α·d + β·b "
                f"(kermac.programs.affine_factor); got program {self.program.key()}"
            )

    @property
    def kernel(self) -> str:
        """The kernel of this module (one of `GRAD_KERNELS`)."""
        return grad_kernel(self.program, self.tensor_cores)


_IMPORTS = """\
import triton
import triton.language as tl

from kermac_backend_triton.kernel_math import INF, NINF, exp_accurate, max_nan, min_nan, pow_ieee, pow_nonneg
from kermac_backend_triton.kernel_math import pow_nonneg_fast, sign, sqrt_approx
"""
_SKELETON_IMPORTS = {
    "simt": "from kermac_backend_triton.pairwise_simt import grouped_tile, simt_tile\n",
    "tensor_cores": "from kermac_backend_triton.pairwise_simt import grouped_tile\n"
    "from kermac_backend_triton.pairwise_tensor_cores import tensor_core_tile\n",
    "gluon": "from triton.experimental import gluon\n"
    "from triton.experimental.gluon import language as gl\n\n"
    "from kermac_backend_triton.gluon_pairwise import gluon_tile\n"
    "from kermac_backend_triton.pairwise_simt import grouped_tile\n",
    "grad": "from kermac_backend_triton.gradient import gradient_tile, grid_order\n",
    "grad_general": "from kermac_backend_triton.general_gradient import general_gradient_tile\n"
    "from kermac_backend_triton.gradient import grid_order\n",
    "grad_affine": "from kermac_backend_triton.gradient import grid_order\n"
    "from kermac_backend_triton.gradient_affine import affine_gradient_tile\n",
    "product_simt": "from kermac_backend_triton.product import product_order, simt_product_tile\n",
    "product_tensor_cores": "from kermac_backend_triton.product import product_order, tensor_core_product_tile\n",
    "product_grad": "from kermac_backend_triton.product import product_order\n"
    "from kermac_backend_triton.product_gradient import product_grad_tile\n",
}

_SIZES_AND_STRIDES = {
    "pairwise": "M, N, D, OFF_M, OFF_N,\n    SXM, SXK, SZN, SZK, SOM, SON, ",
    "grad": "M, N, O, K,\n    SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, ",
    "product": "M, N, D, C, OFF_M, OFF_N,\n    SXM, SXK, SZN, SZK, SVN, SVC, SOM, SOC, ",
    "product_tensor_cores": "M, N, D, DP, C, OFF_M, OFF_N,\n    SXM, SXK, SZN, SZK, SVN, SVC, SOM, SOC, ",
    "product_grad": "M, N, D, C, OFF_M, OFF_N,\n    SXM, SXK, SZN, SZK, SVN, SVC, SGM, SGC, SOM, SOK, ",
}
"""Parameters of each entry kernel between the hyperparameters and the batch layout."""
_META = {
    "simt": ("BK MI NI MT NT PF GROUP_M", '"M", "D", "OFF_M", "OFF_N", "KEY"'),
    "tensor_cores": ("BM BN BK GROUP_M", '"M", "OFF_M", "OFF_N", "GUARD", "KEY"'),
    "gluon": ("BM BN BK TM GROUP_M XT ZT FEW", '"M", "D", "OFF_M", "OFF_N", "KEY"'),
    "grad": ("BN BM BK BO", '"M", "N", "O", "K", "KEY"'),
    "grad_general": ("BN BM BK BO", '"M", "N", "O", "K", "KEY"'),
    "grad_affine": ("BN BM BK BO", '"M", "N", "O", "K", "KEY"'),
    "product_simt": ("BK MI NI MT NT PF BC", '"M", "N", "D", "C", "OFF_M", "OFF_N", "KEY"'),
    "product_tensor_cores": ("BM BN BK BC X_RESIDENT PRESPLIT", '"M", "N", "C", "OFF_M", "OFF_N", "GUARD", "KEY"'),
    "product_grad": ("BM BN BK BD RMW", '"M", "N", "D", "C", "OFF_M", "OFF_N", "KEY"'),
}
"""Meta-parameters of each kernel (after `KEY`), and the sizes never specialised on."""
_ENTRIES = {
    "grad": GRAD_ENTRY,
    "grad_general": GRAD_ENTRY,
    "grad_affine": GRAD_ENTRY,
    "product_simt": PRODUCT_ENTRY,
    "product_tensor_cores": PRODUCT_ENTRY,
    "product_grad": PRODUCT_GRAD_ENTRY,
}
"""The entry kernel's name, where it is not `PAIRWISE_ENTRY`."""


def kernel_source(spec: PairwiseSpec | ProductSpec | ProductGradSpec | GradSpec) -> str:
    """Python source of the module for `spec`: imports, the program's functions, the entry kernel."""
    if isinstance(spec, ProductGradSpec):
        kind, operation = "product_grad", "product_grad"
        operands, pointers = ("x", "z", "v", "g", "out"), "X, Z, V, G, OUT"
        functions = _product_grad_functions(spec)
    elif isinstance(spec, ProductSpec):
        kind, operation = f"product_{spec.kernel}", "product"
        operands, pointers = ("x", "z", "v", "out"), "X, Z, V, OUT"
        if spec.kernel == "tensor_cores":  # with the split workspaces (`operand_split`)
            operation = "product_tensor_cores"
            operands += PRODUCT_SPLIT_OPERANDS
            pointers += ", XH, XL, XN, ZH, ZL, ZN"
        functions = _pairwise_functions(spec)
    elif isinstance(spec, PairwiseSpec):
        kind, operation, operands, pointers = spec.kernel, "pairwise", ("x", "z", "out"), "X, Z, OUT"
        functions = _pairwise_functions(spec)
    else:
        kind = spec.kernel
        operation, operands, pointers = "grad", ("a", "b", "c", "d", "out"), "A, B, C, DD, OUT"
        functions = _GRAD_FUNCTIONS[kind](spec)
    prog, cdt = spec.program, COMPUTE_TYPES[spec.compute]
    gluon = kind == "gluon"
    lang = "gl" if gluon else "tl"
    meta, fixed = _META[kind]
    sizes = _SIZES_AND_STRIDES[operation]
    scalars = "".join(f"H_{n}, " if n in spec.tensor_hypers else f"{hyper_arg(n)}: {cdt}, " for n in prog.hypers)
    batch = [f"BS{i}" for i in range(spec.nbatch)]
    pointer_keys = [*operands, *(f"hyper_{n}" for n in sorted(spec.tensor_hypers))]
    batch += [f"SB_{key}_{i}" for key in pointer_keys for i in range(spec.nbatch)]
    guard = "GUARD, " if kind.endswith("tensor_cores") else ""
    head = [
        f"@{'gluon' if gluon else 'triton'}.jit(do_not_specialize=[{fixed}])",
        f"def {_ENTRIES.get(kind, PAIRWISE_ENTRY)}(",
        f"    {pointers}, {scalars}{sizes}{''.join(p + ', ' for p in batch)}{guard}KEY,",
        "    " + ", ".join(f"{m}: {lang}.constexpr" for m in meta.split()) + ",",
        "):",
        f"    # program {prog.key()}",
    ]
    hypers = "(" + "".join(f"{hyper_arg(n)}, " for n in prog.hypers).removesuffix(", ")
    hypers += ",)" if len(prog.hypers) == 1 else ")"
    body = [_TILE_ORDER[kind].format(int64=spec.int64), *_batch_decoding(spec.nbatch, pointer_keys)]
    body += _hyper_loads(prog.hypers, spec.tensor_hypers, cdt, lang)
    body.append(_CALL[kind].format(hypers=hypers, int64=spec.int64, cdt=cdt, **_program_constants(spec)))
    imports = _IMPORTS + _SKELETON_IMPORTS[kind]
    entry = "\n".join(head) + "\n" + "".join(f"    {line}\n" for line in body)
    return imports + "".join(f"\n\n{f}" for f in functions) + "\n\n" + entry


_TILE_ORDER = {
    "simt": "bat, pm, pn = grouped_tile(M, N, MI * MT, NI * NT, GROUP_M, {int64})",
    "tensor_cores": "bat, pm, pn = grouped_tile(M, N, BM, BN, GROUP_M, {int64})",
    "gluon": "bat, pm, pn = grouped_tile(M, N, BM, BN, GROUP_M, {int64})",
    "grad": "bat, po, pn, pm = grid_order(M, N, O, BN, BM, BO, {int64})",
    "grad_general": "bat, po, pn, pm = grid_order(M, N, O, BN, BM, BO, {int64})",
    "grad_affine": "bat, po, pn, pm = grid_order(M, N, O, BN, BM, BO, {int64})",
    "product_simt": "bat, pm, pc = product_order(M, C, MI * MT, BC, {int64})",
    "product_tensor_cores": "bat, pm, pc = product_order(M, C, BM, BC, {int64})",
    "product_grad": "bat, pm, _ = product_order(M, 1, BM, 1, {int64})",
}
"""The first line of each entry kernel's body: its tile and batch entry."""
_CALL = {
    "simt": "simt_tile(\n"
    "        X, Z, OUT, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SOM, SON, pm, pn, {hypers}, inner, epilogue,\n"
    "        combine_chunk, {reduction!r}, {uses_diag}, {cdt}, BK, MI, NI, MT, NT, PF, SPLIT_TAIL=True,\n"
    "        INT64={int64},\n    )",
    "tensor_cores": "tensor_core_tile(\n"
    "        X, Z, OUT, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SOM, SON, GUARD, pm, pn, {hypers},\n"
    "        inner, epilogue, combine_chunk, {uses_diag}, BM, BN, BK, INT64={int64},\n    )",
    "gluon": "gluon_tile(\n"
    "        X, Z, OUT, M, N, D, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SOM, SON, pm, pn, {hypers}, inner, epilogue,\n"
    "        combine, {reduction!r}, {uses_diag}, {cdt}, BM, BN, BK, TM, XT, ZT, FEW, INT64={int64},\n    )",
    "grad": "gradient_tile(\n"
    "        A, B, C, DD, OUT, M, N, O, K, SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, po, pn, pm,\n"
    "        {hypers}, multiply, epilogue, {signed_base}, {signed_exponent}, {signed}, {cdt}, BN, BM, BK, BO,\n"
    "        INT64={int64},\n    )",
    "grad_general": "general_gradient_tile(\n"
    "        A, B, C, DD, OUT, M, N, O, K, SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, po, pn, pm,\n"
    "        {hypers}, multiply, accumulate, combine, epilogue, {reduction!r}, {cdt}, BN, BM, BK, BO,\n"
    "        INT64={int64},\n    )",
    "grad_affine": "affine_gradient_tile(\n"
    "        A, B, C, DD, OUT, M, N, O, K, SAK, SAM, SBN, SBK, SCO, SCK, SDN, SDM, SOO, SON, SOM, po, pn, pm,\n"
    "        {hypers}, combine, epilogue, {read_d}, {read_b}, {center}, {cdt}, BN, BM, BK, INT64={int64},\n    )",
    "product_simt": "simt_product_tile(\n"
    "        X, Z, V, OUT, M, N, D, C, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SVN, SVC, SOM, SOC, pm, pc, {hypers},\n"
    "        inner, epilogue, combine_chunk, {reduction!r}, {uses_diag}, {cdt}, BK, MI, NI, MT, NT, PF, BC,\n"
    "        INT64={int64},\n    )",
    "product_tensor_cores": "tensor_core_product_tile(\n"
    "        X, Z, V, OUT, XH, XL, XN, ZH, ZL, ZN, M, N, D, DP, C, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SVN, SVC,\n"
    "        SOM, SOC, GUARD, pm, pc, {hypers}, inner, epilogue, combine_chunk, {uses_diag}, BM, BN, BK, BC,\n"
    "        X_RESIDENT, PRESPLIT,\n"
    "        INT64={int64},\n    )",
    "product_grad": "product_grad_tile(\n"
    "        X, Z, V, G, OUT, M, N, D, C, OFF_M, OFF_N, SXM, SXK, SZN, SZK, SVN, SVC, SGM, SGC, SOM, SOK, pm,\n"
    "        {hypers}, inner, combine_chunk, slope, inner_slope, {uses_diag}, {cdt}, BM, BN, BK, BD, RMW,\n"
    "        INT64={int64},{weighting}\n    )",
}
"""The last line of each entry kernel's body: the call of its tile function."""


def _program_constants(spec: PairwiseSpec | ProductSpec | ProductGradSpec | GradSpec) -> dict[str, object]:
    if isinstance(spec, ProductGradSpec):
        reduction = spec.program.reduction
        weight = "weight" if weighted_reduction(reduction) else "None"  # a sum's module has no weight function
        weighting = f" REDUCTION={reduction!r}, weight={weight},"
        return {"uses_diag": "diag" in free_vars(epilogue_slope(spec.program)), "weighting": weighting}
    if not isinstance(spec, GradSpec):
        return {"reduction": spec.program.reduction, "uses_diag": spec.program.uses_diag}
    if spec.kernel == "grad_affine":
        alpha, beta = affine_factor(spec.program)
        return {"read_d": alpha != 0.0, "read_b": beta != 0.0, "center": alpha != 0.0 and alpha + beta == 0.0}
    factor = product_factor(spec.program)
    if factor is None:
        return {"reduction": spec.program.reduction}
    signed = _scalar_signed_power(factor) is not None
    names = ("signed_base", "signed_exponent") if signed else ("None", "None")
    return {"signed_base": names[0], "signed_exponent": names[1], "signed": signed}


def _batch_decoding(nbatch: int, pointer_keys: list[str]) -> list[str]:
    """Lines that decode batch entry `bat` (row-major over `BS0 … BS<n-1>`) and move each base
    pointer (`X`; `H_<name>` for tensor hyperparameter `name`) to it."""
    if nbatch == 0:
        return []
    lines = ["rest = bat"]
    for i in reversed(range(1, nbatch)):
        lines += [f"b{i} = rest % BS{i}", f"rest = rest // BS{i}"]
    lines.append("b0 = rest")
    names = {"x": "X", "z": "Z", "v": "V", "g": "G", "out": "OUT", "a": "A", "b": "B", "c": "C", "d": "DD"}
    names.update({key: key.upper() for key in PRODUCT_SPLIT_OPERANDS})
    for key in pointer_keys:
        pointer = names.get(key) or f"H_{key.removeprefix('hyper_')}"
        lines.append(f"{pointer} += " + " + ".join(f"b{i} * SB_{key}_{i}" for i in range(nbatch)))
    return lines


def _hyper_loads(names: tuple[str, ...], tensor: frozenset[str], cdt: str, lang: str) -> list[str]:
    """Lines giving each hyperparameter's kernel-local value in the compute type `cdt`.

    Tensors are loaded at the batch entry's offset.  Scalar arguments are cast on entry: a no-op
    on a GPU, where the typed parameter already has the compute type, but the interpreter passes
    the Python float itself, which Triton would take as float32 wherever no tensor is involved.
    `lang`: the kernel's language module (`tl`, or `gl` in Gluon, whose `full` this is).
    """
    h = hyper_arg
    return [
        f"{h(n)} = tl.load(H_{n}).to({cdt})" if n in tensor else f"{h(n)} = {lang}.full([], {h(n)}, {cdt})"
        for n in sorted(names)
    ]


def _function(name: str, params: str, hypers: tuple[str, ...], body: str, used: set[str], gluon: bool) -> str:
    """A `@triton.jit` (`@gluon.jit`) function returning `body`, unpacking the hyperparameters it uses."""
    lines = [f"@{'gluon' if gluon else 'triton'}.jit", f"def {name}({params}):"]
    lines += [f"    {hyper_arg(n)} = hypers[{i}]" for i, n in enumerate(hypers) if hyper_arg(n) in used]
    lines.append(f"    return {body}")
    return "\n".join(lines) + "\n"


def _hypers_in(text: str, hypers: tuple[str, ...]) -> set[str]:
    """The hyperparameter variables `text` reads."""
    return {hyper_arg(n) for n in hypers if re.search(rf"\b{re.escape(hyper_arg(n))}\b", text)}


def _pairwise_functions(spec: PairwiseSpec | ProductSpec) -> list[str]:
    """`inner`, `epilogue`, `combine` and (but for Gluon) `combine_chunk` of a pairwise program.

    The accumulator may be known to be non-negative (simpler `pow`, `kermac.programs.nonnegative_variables`).  The
    inner term and the combine run in the k loop (`fast`: `log2` from the special-function unit).
    """
    prog, gluon = spec.program, spec.kernel == "gluon"
    lang = "gl" if gluon else "tl"
    inner = render_expr(prog.inner, {"x": "x", "z": "z"}, spec.compute, fast=True, lang=lang)
    known = nonnegative_variables(prog)
    epilogue = render_expr(prog.epilogue, {"acc": "acc", "diag": "diag"}, spec.compute, known, lang=lang)
    if gluon and not free_vars(prog.epilogue) & {"acc", "diag"}:
        # An epilogue without acc is a scalar: where(c, v, v) = v, broadcast to the tile (Gluon
        # tensors carry a layout, which broadcast_to of a 0-d value cannot give).
        epilogue = f"tl.where(acc == acc, {epilogue}, {epilogue})"
    functions = [
        _function("inner", "x, z, hypers", prog.hypers, inner, _hypers_in(inner, prog.hypers), gluon),
        _function("epilogue", "acc, diag, hypers", prog.hypers, epilogue, _hypers_in(epilogue, prog.hypers), gluon),
    ]
    return functions + _reduction_functions(prog.reduction, spec.compute, gluon, chunk=not gluon)


def _product_grad_functions(spec: ProductGradSpec) -> list[str]:
    """`inner`, `combine`, `combine_chunk`, `slope` (`e'`, of `acc` and `diag`), `inner_slope` (`∂τ/∂x`) and, but
    for a sum, the reduction's `weight(acc, t)` (`∂acc/∂τ_j`) of a gradient product.  The inner term, its slope and
    the weight run per feature (`fast`), `e'` per pair, as the epilogue."""
    prog, hypers, compute = spec.program, spec.program.hypers, spec.compute
    texts = {
        ("inner", "x, z, hypers"): render_expr(prog.inner, {"x": "x", "z": "z"}, compute, fast=True),
        ("slope", "acc, diag, hypers"): render_expr(
            epilogue_slope(prog), {"acc": "acc", "diag": "diag"}, compute, nonnegative_variables(prog)
        ),
        ("inner_slope", "x, z, hypers"): render_expr(inner_slope(prog), {"x": "x", "z": "z"}, compute, fast=True),
    }
    functions = [
        _function(name, params, hypers, text, _hypers_in(text, hypers), False) for (name, params), text in texts.items()
    ]
    functions += _reduction_functions(prog.reduction, compute)
    if weighted_reduction(prog.reduction):
        weight = render_expr(REDUCTIONS[prog.reduction].weight, {"acc": "acc", "t": "t"}, compute, fast=True)
        functions.append(_function("weight", "acc, t", (), weight, set(), False))
    return functions


def _reduction_functions(name: str, compute: str, gluon: bool = False, chunk: bool = True) -> list[str]:
    """`combine(acc, t)` of reduction `name` (`kermac.reductions`), rendered from its IR as the k loop's (`fast`),
    and with `chunk` `combine_chunk(acc, t)`: `t` reduced over its axis 0 (by `tl.sum` for the sum), then
    combined with `acc`.  `gluon`: `@gluon.jit` functions."""
    reduction = REDUCTIONS[name]
    combine = render_expr(reduction.combine, {"acc": "acc", "t": "t"}, compute, fast=True, lang="gl" if gluon else "tl")
    functions = [_function("combine", "acc, t", (), combine, set(), gluon)]
    if chunk:
        reduced = "tl.sum(t, 0)" if reduction.sum_fast_paths else "tl.reduce(t, 0, combine)"
        functions.append(_function("combine_chunk", "acc, t", (), f"combine(acc, {reduced})", set(), gluon))
    return functions


def _scalar_signed_power(factor: Expr) -> tuple | None:
    """(t, e) where the factor is sgn(t)·|t|^e with an e free of variables (one value per launch)."""
    signed = signed_power(factor)
    return signed if signed is not None and not free_vars(signed[1]) else None


def _grad_functions(spec: GradSpec) -> list[str]:
    """`multiply` (the product factor `g(d, b)`, in the k loop: `fast`) and `epilogue` of a gradient program
    with a product factor, and for a signed power with a scalar exponent its base `t` and exponent `e`."""
    prog, hypers = spec.program, spec.program.hypers
    factor = product_factor(prog)
    texts = {
        ("multiply", "d, b, hypers"): render_expr(factor, {"d": "d", "b": "b"}, spec.compute, fast=True),
        ("epilogue", "acc, hypers"): render_expr(prog.epilogue, {"acc": "acc"}, spec.compute),
    }
    signed = _scalar_signed_power(factor)
    if signed is not None:
        texts[("signed_base", "d, b, hypers")] = render_expr(signed[0], {"d": "d", "b": "b"}, spec.compute, fast=True)
        texts[("signed_exponent", "hypers")] = render_expr(signed[1], {}, spec.compute)
    return [
        _function(name, params, hypers, text, _hypers_in(text, hypers), False) for (name, params), text in texts.items()
    ]


def _affine_functions(spec: GradSpec) -> list[str]:
    """`combine(ds, acc)` = α·ds + β·acc (the coefficients of
    [`kermac.programs.affine_factor`][kermac.programs.affine_factor], a term of coefficient 0 left out) and
    `epilogue(acc)` of a gradient program whose factor is `α·d + β·b`."""
    prog, hypers = spec.program, spec.program.hypers
    terms = [Const(v) * Var(n) for v, n in zip(affine_factor(prog), ("ds", "acc"), strict=True) if v != 0.0]
    combine = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    texts = {
        ("combine", "ds, acc, hypers"): render_expr(combine, {"ds": "ds", "acc": "acc"}, spec.compute),
        ("epilogue", "acc, hypers"): render_expr(prog.epilogue, {"acc": "acc"}, spec.compute),
    }
    return [
        _function(name, params, hypers, text, _hypers_in(text, hypers), False) for (name, params), text in texts.items()
    ]


def _general_grad_functions(spec: GradSpec) -> list[str]:
    """`multiply(a, b, d)` and `accumulate(c, term)` (the k loop's, `fast`), `epilogue(acc)`, and the reduction's
    `combine` of a gradient program without a product factor."""
    prog, hypers = spec.program, spec.program.hypers
    assert prog.accumulate is not None  # a program without an accumulate is its own product factor
    texts = {
        ("multiply", "a, b, d, hypers"): render_expr(
            prog.multiply, {"a": "a", "b": "b", "d": "d"}, spec.compute, fast=True
        ),
        ("accumulate", "c, term, hypers"): render_expr(
            prog.accumulate, {"c": "c", "term": "term"}, spec.compute, fast=True
        ),
        ("epilogue", "acc, hypers"): render_expr(prog.epilogue, {"acc": "acc"}, spec.compute),
    }
    functions = [
        _function(name, params, hypers, text, _hypers_in(text, hypers), False) for (name, params), text in texts.items()
    ]
    return functions + _reduction_functions(prog.reduction, spec.compute, chunk=False)


_GRAD_FUNCTIONS = {"grad": _grad_functions, "grad_general": _general_grad_functions, "grad_affine": _affine_functions}
"""The program's functions of each gradient kernel's module."""
