"""Problem → kernel variant, launch grid and argument values (no CUDA calls, no host sync).

`plan_pairwise`, `plan_grad` and `plan_product` read a normalised problem (shapes, strides,
alignment, which hyperparameters are numbers and which tensors) and choose the variant of the
generated kernel, the grid, and the value of every kernel parameter by name.  Where several
kernels compute the same program, the `NvrtcTuning` passed
in chooses (the backend passes its own).  Batches larger than the 65535 blocks a grid's z
dimension allows are split into several launches (`zbase`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache

import torch

from kermac.hyperparams import HyperValue
from kermac.ir import Call, Const, Expr, walk
from kermac.kernel_facts import cancellation_guard, fits_int32, passed_by_value, tensor_core_eligible
from kermac.layout import BatchLayout, batch_layout, grad_operands, pairwise_operands
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem
from kermac.programs import GradProgram, PairwiseProgram, is_abs_difference_sum, product_factor
from kermac.reductions import ALL as REDUCTIONS
from kermac_backend_nvrtc import pow_table, tiles
from kermac_backend_nvrtc.render import (
    half_power_hypers,
    half_steps,
    hyper_identifier,
    is_sign_product,
    rounded,
    split_exponent,
)
from kermac_backend_nvrtc.tuning import NvrtcTuning
from kermac_backend_nvrtc.variants import (
    INPUT_TYPES,
    Ex2Polynomial,
    KContiguousPairwise,
    KernelVariant,
    LoadMode,
    MmaGrad,
    MmaPairwise,
    PowerTable,
    SignGrad,
    SimtGrad,
    SimtPairwise,
    SimtProduct,
    SplitPowerPairwise,
    TileLoad,
    WgmmaPairwise,
)

__all__ = [
    "MAX_GRID_Z",
    "NT",
    "Launch",
    "call_key",
    "cuda_capability",
    "device_capability",
    "plan_grad",
    "plan_pairwise",
    "plan_product",
    "pointer_args",
    "product_operands",
    "size_problem",
    "size_product",
    "uses_tensor_cores",
    "uses_wgmma",
]

NT = 256
MAX_GRID_Z = 65535
_EXPENSIVE = frozenset({"pow", "exp", "log", "sqrt", "div"})
_TENSOR_TYPES = {torch.float32: "float", torch.float64: "double", torch.float16: "km_f16", torch.bfloat16: "km_bf16"}


@dataclass(frozen=True)
class Launch:
    """One launch: grid (x, z), threads per block, and the kernel arguments by parameter name
    (zbase set per chunk)."""

    grid_x: int
    grid_z_total: int
    args: dict[str, int | float]
    block: int = NT

    def chunks(self) -> list[tuple[int, int]]:
        """(zbase, grid_z) of each launch covering `grid_z_total` z-blocks."""
        return [(z0, min(MAX_GRID_Z, self.grid_z_total - z0)) for z0 in range(0, self.grid_z_total, MAX_GRID_Z)]


def size_problem(what: str, sizes: dict[str, int]) -> str | None:
    """A reason if any size exceeds the kernels' 32-bit row/column indices, else `None`."""
    if fits_int32(max(sizes.values())):  # fits_int32 is monotonic: the largest size decides
        return None
    big = {k: v for k, v in sizes.items() if not fits_int32(v)}
    return f"{what} sizes {big} exceed the 32-bit index range of the nvrtc kernels"


def size_product(problem: ProductProblem) -> str | None:
    """A reason if the fused product's sizes exceed the kernel's 32-bit indices, or its row tiles
    times column chunks (`plan_product`'s grid) exceed a grid's 2^31 − 1 blocks, else `None`."""
    m, n, d, c = problem.sizes
    reason = size_problem("product", {"M": m, "N": n, "D": d, "C": c})
    if reason:
        return reason
    compute = INPUT_TYPES[str(problem.dtype).removeprefix("torch.")][1]
    cc = _product_cc(c, compute)
    blocks = -(-m // tiles.product_config(compute, cc).bm) * -(-c // cc)
    if blocks > 2**31 - 1:
        return f"product of M={m} rows and C={c} columns needs {blocks} blocks, beyond a CUDA grid's 2^31 - 1"
    return None


def _operand(t: torch.Tensor, layout: BatchLayout, name: str, pt: int, kt: int, p_dim: int, k_dim: int) -> TileLoad:
    """Load mode for a tile of `pt` positions × `kt` k-values of `t` (dims `p_dim`, `k_dim`)."""
    e = max(1, -(-pt * kt // NT))
    sp, sk = t.stride(p_dim), t.stride(k_dim)
    p_size, k_size = t.shape[p_dim], t.shape[k_dim]
    if pt * kt == NT * e and e > 1:
        aligned = t.data_ptr() % (e * t.element_size()) == 0 and all(s % e == 0 for s in layout.strides[name])
        if aligned and (sk == 1 or k_size == 1) and k_size % e == 0 and sp % e == 0:
            return TileLoad(LoadMode.VECTOR_ALONG_K, e)
        if aligned and (sp == 1 or p_size == 1) and p_size % e == 0 and sk % e == 0:
            return TileLoad(LoadMode.VECTOR_ALONG_P, e)
    return TileLoad(LoadMode.SCALAR_K_FASTEST if abs(sk) <= abs(sp) else LoadMode.SCALAR_P_FASTEST, e)


def _k_contiguous_operands(problem: PairwiseProblem, layout: BatchLayout) -> bool:
    """Whether `cuda/kcontig_loop.cuh` can read the operands: x rows 16-byte aligned with unit stride
    along k and D a multiple of 4 (whole 16-byte copies), z rows with unit stride along k and 128 rows
    within 2^31 elements (32-bit row offsets)."""
    z = problem.z
    return (
        problem.d % 4 == 0
        and _rows_aligned(problem.x, layout, "x", 4) == 1
        and z.stride(-1) == 1
        and 128 * abs(z.stride(-2)) < 2**31
    )


def _rows_aligned(t: torch.Tensor, layout: BatchLayout, name: str, e: int) -> int:
    """1 if every row (last dimension) of operand `name` = `t` in every batch entry starts
    `e`-element aligned and has unit stride along it."""
    return int(
        t.stride(-1) == 1
        and t.stride(-2) % e == 0
        and t.data_ptr() % (e * t.element_size()) == 0
        and all(s % e == 0 for s in layout.strides[name])
    )


def _expensive(expr: Expr) -> bool:
    return any(isinstance(n, Call) and n.op in _EXPENSIVE for n in walk(expr))


def _call_combine(reduction: str, tuning: NvrtcTuning) -> bool:
    """Whether a SIMT kernel calls the combine of `reduction` as a function (`inline_expensive_combine`)."""
    return not tuning.inline_expensive_combine and _expensive(REDUCTIONS[reduction].combine)


# What planning reads off a program's expressions depends on the program (and the hyperparameter
# facts passed) only: computed once per program, so a repeated call does not walk its trees again
# (a program's hash is cached on it).
@lru_cache(maxsize=256)
def _pairwise_traits(prog: PairwiseProgram) -> tuple[bool, bool, bool]:
    """(Σ (x − z)² on tensor cores in float32, the k loop's work — the inner term and the reduction's combine
    (`kermac.reductions`) — has an expensive operation, the epilogue has one)."""
    per_term = _expensive(prog.inner) or _expensive(REDUCTIONS[prog.reduction].combine)
    return tensor_core_eligible(prog, "float32"), per_term, _expensive(prog.epilogue)


@lru_cache(maxsize=256)
def _split_exponent(prog: PairwiseProgram, ge1: frozenset[str]) -> Expr | None:
    return split_exponent(prog, ge1)


def _rendered(prog: PairwiseProgram | GradProgram) -> list[Expr]:
    """The expressions of `prog` a kernel renders: a pairwise program's inner term and epilogue; a gradient
    program's factor (`kermac.programs.product_factor`) and epilogue where it is in the product form, else its
    multiply, accumulate and epilogue."""
    if isinstance(prog, PairwiseProgram):
        return [prog.inner, prog.epilogue]
    factor = product_factor(prog)
    return [prog.multiply, prog.accumulate, prog.epilogue] if factor is None else [factor, prog.epilogue]


@lru_cache(maxsize=1024)
def _half_power_hypers(
    prog: PairwiseProgram | GradProgram, scalars: tuple[tuple[str, float], ...]
) -> tuple[tuple[str, float], ...]:
    return half_power_hypers(_rendered(prog), dict(scalars))


def _exponent_value(b: Expr, problem: PairwiseProblem) -> float:
    """The value of a split exponent (a constant or a scalar hyperparameter, see `split_exponent`)."""
    return b.value if isinstance(b, Const) else problem.hypers[b.name].scalar


def _hypers(
    problem: PairwiseProblem | GradProblem, compute: str
) -> tuple[tuple[tuple[str, str], ...], frozenset[str], dict]:
    tensor, ge1, args = [], set(), {}
    for name in problem.program.hypers:
        hv = problem.hypers[name]
        if passed_by_value(hv):
            value = rounded(hv.scalar, compute)  # as the kernel reads it (1e300 is inf in float)
            if math.isfinite(value) and value >= 1.0:
                ge1.add(name)
            args[f"hv_{name}"] = value
        else:
            tensor.append((name, _TENSOR_TYPES[hv.tensor.dtype]))
    return tuple(tensor), frozenset(ge1), args


def _known_hypers(problem: PairwiseProblem | GradProblem, tuning: NvrtcTuning) -> tuple[tuple[str, float], ...]:
    """The scalar hyperparameters whose values go into the source (`tuning.half_powers`)."""
    if not tuning.half_powers:
        return ()
    hypers = problem.hypers
    scalars = tuple((n, hypers[n].scalar) for n in problem.program.hypers if hypers[n].tensor is None)
    return _half_power_hypers(problem.program, scalars)


def _batch_args(layout: BatchLayout, rename: dict[str, str]) -> dict[str, int]:
    args = {}
    for i, size in enumerate(layout.shape):
        args[f"bs{i}"] = size
        for name, strides in layout.strides.items():
            args[f"b{rename[name]}{i}"] = strides[i]
    return args


def _rename(names: list[str]) -> dict[str, str]:
    return {n: ("o" if n == "out" else hyper_identifier(n[6:]) if n.startswith("hyper_") else n) for n in names}


def device_capability(problem: PairwiseProblem | GradProblem) -> int | None:
    """Compute capability of the problem's CUDA device as one number (90 for sm_90); None off CUDA."""
    t = problem.x if isinstance(problem, PairwiseProblem) else problem.a
    return cuda_capability(t.get_device()) if t.is_cuda else None


@cache
def cuda_capability(index: int) -> int:
    """Compute capability of CUDA device `index` as one number (asked once per device and process)."""
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def uses_tensor_cores(program: PairwiseProgram, dtype: str, d: int, tuning: NvrtcTuning) -> bool:
    """Whether a pairwise program in `dtype` (e.g. `"float32"`) over `d` features runs on a tensor-core kernel:
    float32 sums of (x − z)² (`tuning.tensor_cores`) with at least `tuning.tensor_core_min_d` features."""
    return tuning.tensor_cores and dtype == "float32" and d >= tuning.tensor_core_min_d and _pairwise_traits(program)[0]


def uses_wgmma(program: PairwiseProgram, dtype: str, d: int, capability: int | None, tuning: NvrtcTuning) -> bool:
    """Whether that tensor-core kernel is the wgmma one (sm_90, `tuning.wgmma`) on a device of `capability`."""
    return tuning.wgmma and capability == 90 and uses_tensor_cores(program, dtype, d, tuning)


def _variant_fields(
    prog: PairwiseProgram | GradProgram,
    tensor_hypers: tuple[tuple[str, str], ...],
    layout: BatchLayout,
    ge1: frozenset[str],
    known: tuple[tuple[str, float], ...],
    tuning: NvrtcTuning,
) -> dict:
    """The fields every kernel variant holds (`.variants.KernelVariant`)."""
    return {
        "program": prog,
        "tensor_hypers": tensor_hypers,
        "batch_dims": len(layout.shape),
        "hypers_at_least_one": ge1,
        "half_powers": tuning.half_powers,
        "fixed_hypers": known,
    }


def plan_pairwise(
    problem: PairwiseProblem, capability: int | None, tuning: NvrtcTuning
) -> tuple[KernelVariant, Launch]:
    """Variant and launch of `problem` (which `size_problem` accepted) for a device of
    `capability` (e.g. 90; `None`: the problem's device — CPU problems plan for no particular
    architecture, which only decides whether the tensor-core programs use wgmma), chosen among
    equivalent kernels by `tuning` (`tuning.DEFAULT_TUNING`: the measured defaults)."""
    capability = device_capability(problem) if capability is None else capability
    dtype = str(problem.dtype).removeprefix("torch.")
    compute = INPUT_TYPES[dtype][1]
    prog = problem.program
    _, expensive_inner, expensive_epilogue = _pairwise_traits(prog)
    tensor_cores = uses_tensor_cores(prog, dtype, problem.d, tuning)
    deep_k = compute == "float" and not tensor_cores and not expensive_inner and not expensive_epilogue
    cfg = tiles.TC_CONFIG if tensor_cores else tiles.pairwise_config(compute, deep_k)
    ops = pairwise_operands(problem)
    layout = batch_layout(problem.batch_shape, ops)
    tensor_hypers, ge1, hyper_args = _hypers(problem, compute)
    known = _known_hypers(problem, tuning)
    exponent = _split_exponent(prog, ge1) if compute == "float" else None
    split = exponent is not None and not (tuning.half_powers and half_steps(exponent, dict(known)) is not None)
    p_value = _exponent_value(exponent, problem) if split else None
    tabled = split and tuning.flush_subnormals and tuning.power_table and pow_table.exponent_in_range(p_value)
    degree = pow_table.degree(p_value) if tabled else 0
    table_pairs = tuning.power_table_pairs if degree == 5 else tuning.power_table_pairs_high_p
    table = degree > 0 and table_pairs > 0
    x_op = _operand(problem.x, layout, "x", cfg.bm, cfg.bk, -2, -1)
    z_op = _operand(problem.z, layout, "z", cfg.bn, cfg.bk, -2, -1)
    vector_loads = x_op.mode >= LoadMode.VECTOR_ALONG_K and z_op.mode >= LoadMode.VECTOR_ALONG_K
    abs_sum = dtype == "float32" and not tensor_cores and is_abs_difference_sum(prog)
    common = _variant_fields(prog, tensor_hypers, layout, ge1, known, tuning)
    simt = {
        "dtype": dtype,
        "x": x_op,
        "z": z_op,
        "k_unroll": 2 if expensive_inner else cfg.bk,
        "flush_subnormals": tuning.flush_subnormals,
    }
    call_combine = _call_combine(prog.reduction, tuning)
    variant: KernelVariant
    if tensor_cores:
        route = WgmmaPairwise if uses_wgmma(prog, dtype, problem.d, capability, tuning) else MmaPairwise
        call = not tuning.inline_expensive_epilogue and expensive_epilogue
        variant = route(**common, x=x_op, z=z_op, call_epilogue=call)
    elif tuning.k_contiguous_tiles and abs_sum and _k_contiguous_operands(problem, layout):
        variant = KContiguousPairwise(**common)
    elif split and (table or tuning.ex2_polynomial_pairs):
        power = PowerTable(table_pairs, degree) if table else Ex2Polynomial(tuning.ex2_polynomial_pairs)
        variant = SplitPowerPairwise(**common, **simt, split=power)
    else:
        padded_tail = tuning.zero_padded_k_tail and abs_sum and vector_loads
        variant = SimtPairwise(**common, **simt, deep_k=deep_k, padded_tail=padded_tail, call_combine=call_combine)
    m, n, d = problem.m, problem.n, problem.d
    tiles_m, tiles_n = -(-m // cfg.bm), -(-n // cfg.bn)
    x, z, out = problem.x, problem.z, problem.out
    args: dict[str, int | float] = {
        **pointer_args(problem),
        "M": m,
        "N": n,
        "D": d,
        "tiles_n": tiles_n,
        "sxm": x.stride(-2),
        "sxk": x.stride(-1),
        "szn": z.stride(-2),
        "szk": z.stride(-1),
        "som": out.stride(-2),
        "son": out.stride(-1),
        "diag_shift": problem.offset_m - problem.offset_n,
    }
    # Vector stores: pairs of float32 columns on the mma.sync path, 16 bytes on the others.
    pairs = isinstance(variant, MmaPairwise)
    args["ovec"] = _rows_aligned(out, layout, "out", 2 if pairs else max(1, 16 // out.element_size()))
    if tensor_cores:
        args["guard"] = cancellation_guard(d)
    if table:
        args |= {f"pc{j}": c for j, c in enumerate(pow_table.coefficients(p_value))}
    args |= _batch_args(layout, _rename(list(ops))) | hyper_args
    return variant, Launch(tiles_m * tiles_n, layout.size, args)


def plan_grad(problem: GradProblem, capability: int | None, tuning: NvrtcTuning) -> tuple[KernelVariant, Launch]:
    """Variant and launch of `problem` (which `size_problem` accepted) for a device of
    `capability` (`None`: the problem's; it decides whether a sign program runs on wgmma),
    chosen among equivalent kernels by `tuning`.  A program in the product form (one with a factor,
    `kermac.programs.product_factor`) may run on the tensor-core kernels; any other runs on the SIMT one."""
    capability = device_capability(problem) if capability is None else capability
    dtype = str(problem.dtype).removeprefix("torch.")
    compute = INPUT_TYPES[dtype][1]
    m, n, o, _ = problem.sizes
    prog = problem.program
    wgmma = tuning.tensor_cores and tuning.wgmma and capability == 90 and dtype == "float32"
    sign = o >= tuning.sign_product_min_o and n >= tuning.sign_product_min_features and is_sign_product(prog)
    if wgmma and sign:
        return _plan_sign_grad(problem)
    tensor_cores = tuning.tensor_cores and dtype == "float32" and o >= tuning.tensor_core_grad_min_o
    tensor_cores = tensor_cores and product_factor(prog) is not None
    cfg = tiles.TC_GRAD_CONFIG if tensor_cores else tiles.grad_config(compute)
    ot = min(cfg.max_ot, 1 << max(0, (o - 1).bit_length()))
    if tensor_cores:
        ot = max(ot, 8)
    ochunks = -(-o // ot)
    ops = grad_operands(problem)
    layout = batch_layout(problem.batch_shape, ops)
    tensor_hypers, ge1, hyper_args = _hypers(problem, compute)
    common = _variant_fields(prog, tensor_hypers, layout, ge1, _known_hypers(problem, tuning), tuning)
    loads = {
        "a": _operand(problem.a, layout, "a", cfg.bmm, cfg.bk, -1, -2),
        "b": _operand(problem.b, layout, "b", cfg.bnn, cfg.bk, -2, -1),
        "c": _operand(problem.c, layout, "c", ot, cfg.bk, -2, -1),
    }
    flush = tuning.flush_subnormals and compute == "float"
    variant: KernelVariant
    if tensor_cores:
        # km_signpow_pos (p known > 1) is faster than km_signpow_ftz on the tensor-core kernel and slower
        # on the SIMT one (docs/dev/).
        above_one = frozenset(h for h in ge1 if problem.hypers[h].scalar > 1.0)
        variant = MmaGrad(**common, **loads, eights=ot // 8, flush_subnormals=flush, hypers_above_one=above_one)
    else:
        call = prog.accumulate is not None and _call_combine(prog.reduction, tuning)
        variant = SimtGrad(**common, **loads, dtype=dtype, ot=ot, k_unroll=4, flush_subnormals=flush, call_combine=call)
    tiles_m, tiles_n = -(-m // cfg.bmm), -(-n // cfg.bnn)
    args = _grad_args(problem, ochunks)
    if tensor_cores:
        args["tiles_n"] = tiles_n
    else:
        args["tiles_m"] = tiles_m
    args |= _batch_args(layout, _rename(list(ops))) | hyper_args
    return variant, Launch(tiles_m * tiles_n, layout.size * ochunks, args)


def _plan_sign_grad(problem: GradProblem) -> tuple[KernelVariant, Launch]:
    """A float32 sign(d − b) program on sm_90: the bf16 sign product (`SignGrad`)."""
    m, n, o, k = problem.sizes
    ot = 8 if o <= 8 else 16
    ochunks = -(-o // ot)
    ops = grad_operands(problem)
    layout = batch_layout(problem.batch_shape, ops)
    tensor_hypers, ge1, hyper_args = _hypers(problem, "float")
    variant = SignGrad(
        program=problem.program,
        tensor_hypers=tensor_hypers,
        batch_dims=len(layout.shape),
        hypers_at_least_one=ge1,
        eights=ot // 8,
    )
    b, out = problem.b, problem.out
    tiles_m, tiles_n = -(-m // tiles.SIGN_GRAD_TILE.mb), -(-n // tiles.SIGN_GRAD_TILE.bnn)
    args = _grad_args(problem, ochunks) | {"tiles_n": tiles_n}
    args["bvec"] = int(_rows_aligned(b, layout, "b", 4) == 1 and k % 4 == 0)
    args["ovec"] = int(_rows_aligned(out, layout, "out", 2) == 1 and out.stride(-3) % 2 == 0)
    args |= _batch_args(layout, _rename(list(ops))) | hyper_args
    return variant, Launch(tiles_m * tiles_n, layout.size * ochunks, args, tiles.SIGN_GRAD_TILE.threads)


def _grad_args(problem: GradProblem, ochunks: int) -> dict[str, int | float]:
    """Pointers, sizes and strides of a gradient launch (the parameters every gradient kernel has)."""
    m, n, o, k = problem.sizes
    a, b, c, d, out = problem.a, problem.b, problem.c, problem.d, problem.out
    return {
        **pointer_args(problem),
        "M": m,
        "N": n,
        "O": o,
        "K": k,
        "ochunks": ochunks,
        "sak": a.stride(-2),
        "sam": a.stride(-1),
        "sbn": b.stride(-2),
        "sbk": b.stride(-1),
        "sco": c.stride(-2),
        "sck": c.stride(-1),
        "sdn": d.stride(-2),
        "sdm": d.stride(-1),
        "soo": out.stride(-3),
        "son": out.stride(-2),
        "som": out.stride(-1),
    }


def product_operands(problem: ProductProblem) -> dict[str, torch.Tensor]:
    """The batched tensors of a fused product by name: x, z, v, out and tensor hyperparameters."""
    ops = {"x": problem.x, "z": problem.z, "v": problem.v, "out": problem.out}
    ops.update({f"hyper_{k}": h.tensor for k, h in problem.hypers.items() if h.tensor is not None})
    return ops


def _product_cc(c: int, compute: str) -> int:
    """Columns of out per block for C columns: the power of two >= C, at most `tiles.PRODUCT_MAX_CC`."""
    return min(tiles.PRODUCT_MAX_CC[compute], 1 << max(0, (c - 1).bit_length()))


def plan_product(problem: ProductProblem, capability: int | None, tuning: NvrtcTuning) -> tuple[KernelVariant, Launch]:
    """Variant and launch of a fused product (which `size_product` accepted): the SIMT product kernel
    for every program and dtype.  The grid's x runs over row tiles (fastest) times chunks of `cc`
    columns, its z over batch entries; `capability` decides nothing yet (the signature is the
    planners')."""
    dtype = str(problem.dtype).removeprefix("torch.")
    compute = INPUT_TYPES[dtype][1]
    prog = problem.program
    m, n, d, c = problem.sizes
    cc = _product_cc(c, compute)
    cfg = tiles.product_config(compute, cc)
    ops = product_operands(problem)
    layout = batch_layout(problem.batch_shape, ops)
    tensor_hypers, ge1, hyper_args = _hypers(problem, compute)
    variant = SimtProduct(
        **_variant_fields(prog, tensor_hypers, layout, ge1, _known_hypers(problem, tuning), tuning),
        dtype=dtype,
        x=_operand(problem.x, layout, "x", cfg.bm, cfg.bk, -2, -1),
        z=_operand(problem.z, layout, "z", cfg.bn, cfg.bk, -2, -1),
        v=_operand(problem.v, layout, "v", cfg.bn, cc, -2, -1),
        k_unroll=2 if _pairwise_traits(prog)[1] else cfg.bk,
        cc=cc,
        flush_subnormals=tuning.flush_subnormals,
        call_combine=_call_combine(prog.reduction, tuning),
    )
    x, z, v, out = problem.x, problem.z, problem.v, problem.out
    tiles_m = -(-m // cfg.bm)
    args: dict[str, int | float] = {
        **pointer_args(problem),
        "M": m,
        "N": n,
        "D": d,
        "C": c,
        "tiles_m": tiles_m,
        "sxm": x.stride(-2),
        "sxk": x.stride(-1),
        "szn": z.stride(-2),
        "szk": z.stride(-1),
        "svn": v.stride(-2),
        "svc": v.stride(-1),
        "som": out.stride(-2),
        "soc": out.stride(-1),
        "diag_shift": problem.offset_m - problem.offset_n,
    }
    args |= _batch_args(layout, _rename(list(ops))) | hyper_args
    return variant, Launch(tiles_m * -(-c // cc), layout.size, args)


def pointer_args(problem: PairwiseProblem | GradProblem | ProductProblem) -> dict[str, int]:
    """The arguments that are device addresses: the operands, `out` and tensor hyperparameters
    (`hp_<name>`) — the only ones that differ between calls with equal `call_key`, which
    returns them too, in this order."""
    if isinstance(problem, PairwiseProblem):
        named = {"x": problem.x, "z": problem.z, "out": problem.out}
    elif isinstance(problem, ProductProblem):
        named = {"x": problem.x, "z": problem.z, "v": problem.v, "out": problem.out}
    else:
        named = {"a": problem.a, "b": problem.b, "c": problem.c, "d": problem.d, "out": problem.out}
    args = {name: t.data_ptr() for name, t in named.items()}
    args |= {f"hp_{name}": h.tensor.data_ptr() for name, h in problem.hypers.items() if h.tensor is not None}
    return args


_ALIGNMENT = 256
"""Every alignment the planner tests (a vector of e elements per thread: e · element size bytes,
64 at most in today's tile configurations) divides this many bytes, so addresses equal modulo it
plan alike.
"""


def _hyper_key(hypers: Mapping[str, HyperValue]) -> tuple[tuple, tuple[int, ...]]:
    """The hyperparameters' part of a call key and the addresses of the tensor ones.  A scalar is
    keyed by its `repr`, which tells every two floats apart (−0.0 and 0.0 too, where `==` does
    not) and matches a NaN with a NaN; a tensor like an operand."""
    key, addresses = [], []
    for name, h in hypers.items():
        t = h.tensor
        if t is None:
            key.append((name, repr(h.scalar)))
        else:
            address = t.data_ptr()
            addresses.append(address)
            key.append((name, t.dtype, t.shape, t.stride(), address % _ALIGNMENT))
    return tuple(key), tuple(addresses)


def call_key(problem: PairwiseProblem | GradProblem | ProductProblem) -> tuple[tuple, tuple[int, ...]]:
    """A key under which a problem's plan can be remembered, and the problem's device addresses
    (the values of `pointer_args`, in its order), each address read once.

    Two problems with equal keys get the same variant and the same arguments from
    `plan_pairwise` / `plan_grad` / `plan_product` (with one tuning) but for the addresses; problems that plan
    alike may still differ in key (e.g. addresses of different alignment).  The key holds what
    planning reads: the program, dtype and device index (its capability), every tensor's
    strides and address modulo `_ALIGNMENT`, the shapes (those of the operands that give every
    size and the batch: `out`'s and `d`'s follow from them), the hyperparameters and the
    diagonal offsets; a product's key starts with `"product"` (a pairwise problem's never does).
    It holds neither the tuning (each backend keeps its own memo, of one tuning) nor the tile
    configurations of `tiles` (whoever replaces one clears the memo, `NvrtcBackend.forget`).
    """
    if isinstance(problem, PairwiseProblem):
        x, z, out = problem.x, problem.z, problem.out
        px, pz, po = x.data_ptr(), z.data_ptr(), out.data_ptr()
        key: tuple = (
            problem.program, x.dtype, x.get_device(), x.shape, x.stride(), px % _ALIGNMENT,
            z.shape, z.stride(), pz % _ALIGNMENT, out.stride(), po % _ALIGNMENT, problem.offset_m, problem.offset_n,
        )  # fmt: skip
        addresses: tuple[int, ...] = (px, pz, po)
    elif isinstance(problem, ProductProblem):
        x, z, v, out = problem.x, problem.z, problem.v, problem.out
        px, pz, pv, po = x.data_ptr(), z.data_ptr(), v.data_ptr(), out.data_ptr()
        key = (
            "product", problem.program, x.dtype, x.get_device(), x.shape, x.stride(), px % _ALIGNMENT, z.shape,
            z.stride(), pz % _ALIGNMENT, v.shape, v.stride(), pv % _ALIGNMENT, out.stride(), po % _ALIGNMENT,
            problem.offset_m, problem.offset_n,
        )  # fmt: skip
        addresses = (px, pz, pv, po)
    else:
        a, b, c, d, out = problem.a, problem.b, problem.c, problem.d, problem.out
        pa, pb, pc, pd, po = a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), out.data_ptr()
        key = (
            problem.program, a.dtype, a.get_device(), a.shape, a.stride(), pa % _ALIGNMENT, b.shape, b.stride(),
            pb % _ALIGNMENT, c.shape, c.stride(), pc % _ALIGNMENT, d.stride(), pd % _ALIGNMENT, out.stride(),
            po % _ALIGNMENT,
        )  # fmt: skip
        addresses = (pa, pb, pc, pd, po)
    if not problem.hypers:
        return key, addresses
    hyper_key, hyper_addresses = _hyper_key(problem.hypers)
    return key + (hyper_key,), addresses + hyper_addresses
