"""Problem normalisation: turn a user call into one validated object every backend consumes.

Shapes follow `torch.cdist`: trailing matrix dimensions, leading batch dimensions that
broadcast.  Inputs are expanded to the common batch shape as views (broadcast dimensions get
stride 0); nothing is copied, so backends read the caller's memory with whatever strides it has.
Backends write into `problem.out`, which is either the caller's `out` (any strides; no two
of its elements overlap and it shares no memory with anything the operation reads, both tested
exactly by `kermac.memory`) or a fresh contiguous tensor.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from kermac.hyperparams import HyperValue
from kermac.memory import check_addressable, internal_overlap, overlap
from kermac.programs import GradProgram, PairwiseProgram, product_factor

__all__ = [
    "OFFSET_RANGE",
    "SUPPORTED_DTYPES",
    "GradProblem",
    "PairwiseProblem",
    "ProductGradProblem",
    "ProductProblem",
    "check_out_type",
    "check_tensor",
    "compute_dtype",
    "diagonal_offsets",
    "grad_problem",
    "pairwise_problem",
    "product_grad_problem",
    "product_problem",
]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type kermac computes `dtype` inputs in: float64 stays float64, every narrower type float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


OFFSET_RANGE = (-(2**63), 2**63 - 1)
"""The values `offset_m` and `offset_n` may take: torch's index type, int64.  Backends never see
them: a problem holds the same diagonal in the form of `diagonal_offsets`.
"""


class _OnPoints:
    """The dtype and device of a problem: those of its points `x`, which every other tensor shares."""

    __slots__ = ()
    x: torch.Tensor
    HOOKS: ClassVar[tuple[str, str]]

    @property
    def hooks(self) -> tuple[str, str]:
        """The backend hooks (`kermac.backend.Backend`) that answer whether a backend runs this problem and run it."""
        return self.HOOKS

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def device(self) -> torch.device:
        return self.x.device


class _ProductSizes(_OnPoints):
    """The sizes of a fused kernel product and of its gradient product."""

    __slots__ = ()
    z: torch.Tensor
    v: torch.Tensor

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """(M, N, D, C)."""
        return self.x.shape[-2], self.z.shape[-2], self.x.shape[-1], self.v.shape[-1]


@dataclass(eq=False, slots=True)
class PairwiseProblem(_OnPoints):
    """`out[*B, M, N] = program(x[*B, M, D], z[*B, N, D], hypers)`; see [`kermac.programs`][kermac.programs].

    `offset_m`, `offset_n` place the diagonal (`m + offset_m == n + offset_n`) in the form of
    `diagonal_offsets`: at most one is nonzero and both lie in `[0, max(M, N)]`, so a
    backend may add them to row and column indices in the indices' own integer type.
    """

    HOOKS: ClassVar[tuple[str, str]] = ("check_pairwise", "pairwise")
    program: PairwiseProgram
    x: torch.Tensor
    z: torch.Tensor
    out: torch.Tensor
    hypers: Mapping[str, HyperValue]
    offset_m: int
    offset_n: int
    batch_shape: tuple[int, ...]
    debug: bool = False

    @property
    def m(self) -> int:
        return self.x.shape[-2]

    @property
    def n(self) -> int:
        return self.z.shape[-2]

    @property
    def d(self) -> int:
        return self.x.shape[-1]


@dataclass(eq=False, slots=True)
class GradProblem:
    """`out[*B, O, N, M] = program(a[*B, K, M], b[*B, N, K], c[*B, O, K], d[*B, N, M])`.

    A program in the general form ([`kermac.programs.GradProgram`][kermac.programs.GradProgram] with an
    `accumulate`) goes to the hooks `check_general_grad` / `general_grad`, which backends written before the
    general form do not override (their defaults refuse it); one in the product form to `check_grad` / `grad`.
    [`grad_problem`][kermac.problem.grad_problem] hands a general program that computes a product form over in
    that form ([`product_factor`][kermac.programs.product_factor]), so only programs without one are general here.
    """

    program: GradProgram
    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    out: torch.Tensor
    hypers: Mapping[str, HyperValue]
    batch_shape: tuple[int, ...]
    debug: bool = False

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """(M, N, O, K)."""
        return self.a.shape[-1], self.b.shape[-2], self.c.shape[-2], self.a.shape[-2]

    @property
    def hooks(self) -> tuple[str, str]:
        """The backend hooks that answer whether a backend runs this problem and run it (see the class docs)."""
        return ("check_general_grad", "general_grad") if self.program.general else ("check_grad", "grad")

    @property
    def dtype(self) -> torch.dtype:
        return self.a.dtype

    @property
    def device(self) -> torch.device:
        return self.a.device


@dataclass(eq=False, slots=True)
class ProductProblem(_ProductSizes):
    """`out[*B, M, C] = Σ_n K[*B, m, n] · v[*B, n, C]` with `K = program(x[*B, M, D], z[*B, N, D], hypers)`
    the pairwise kernel of [`PairwiseProblem`][kermac.problem.PairwiseProblem] (the same program, diagonal
    offsets and hyperparameters), never materialised: a backend contracts each tile of K with `v` where
    it computes it.

    Accumulation is in [`compute_dtype`][kermac.problem.compute_dtype] of the inputs; `v` and `out` have
    the dtype and device of `x`.  The transposed product `Kᵀ @ u` is the product of the program with
    its operands swapped ([`kermac.programs`][kermac.programs]), so backends see only this form.
    """

    HOOKS: ClassVar[tuple[str, str]] = ("check_product", "product")
    program: PairwiseProgram
    x: torch.Tensor
    z: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    hypers: Mapping[str, HyperValue]
    offset_m: int
    offset_n: int
    batch_shape: tuple[int, ...]
    debug: bool = False


@dataclass(eq=False, slots=True)
class ProductGradProblem(_ProductSizes):
    r"""The gradient product: the derivative in `x` of `L = Σ g · (K v)` for the kernel product of
    [`ProductProblem`][kermac.problem.ProductProblem] (the same program, diagonal offsets and hyperparameters),
    with `K` and its derivative computed on the fly, never materialised:

    $$
    \mathrm{out}[*B, m, j] = \sum_n G[m, n]\,\Big(e'(\mathrm{acc}[m, n])\;w_j(m, n)\;\tau_x(x[m, j], z[n, j])\Big),
    \qquad G[m, n] = \sum_c g[*B, m, c]\, v[*B, n, c]
    $$

    with `acc = ⊕_j τ(x[m, j], z[n, j])` the program's reduction over features, `w_j = ∂acc/∂τ_j` its weights
    ([`term_weights`][kermac.reductions.term_weights]: 1 for a sum), `e'` the derivative of its epilogue in `acc`
    ([`epilogue_slope`][kermac.programs.epilogue_slope]; the regularisation of the diagonal, constant in `acc`,
    drops out) and `τ_x = ∂τ/∂x` ([`inner_slope`][kermac.programs.inner_slope]).  The bracket is taken as 0
    where `τ_x = 0` or `w_j = 0`: a flat inner term (or one the maximum passes over) contributes nothing even
    where `e'` is infinite (Laplace-L2 or the l2 distance at `x_m = z_n`, where
    `acc = 0`: torch.cdist's subgradient there is 0 too); `τ_x` of `|x − z|^P` with P < 1 is 0 at a coordinate
    tie (`inner_slope`), where `P·sgn(t)·|t|^(P−1)` would be `0·∞`.  The gradient in `z` is this problem for the
    program with its operands swapped ([`swap_operands`][kermac.programs.swap_operands]) on `(z, x)`, with
    `v` and `g` exchanged and the offsets too.

    x `[*B, M, D]`, z `[*B, N, D]`, v `[*B, N, C]`, g `[*B, M, C]` → out `[*B, M, D]`; accumulation in
    [`compute_dtype`][kermac.problem.compute_dtype]; every tensor has the dtype and device of `x`.
    """

    HOOKS: ClassVar[tuple[str, str]] = ("check_product_grad", "product_grad")
    program: PairwiseProgram
    x: torch.Tensor
    z: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    out: torch.Tensor
    hypers: Mapping[str, HyperValue]
    offset_m: int
    offset_n: int
    batch_shape: tuple[int, ...]
    debug: bool = False


def check_tensor(name: str, t: object, *, min_dim: int = 2) -> torch.Tensor:
    """`t` if it is a tensor of a supported floating dtype with at least `min_dim` dims (its memory is
    checked with the problem, `check_addressable`)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name}: expected dtype {names}; got {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name}: expected at least {min_dim} dimensions [..., rows, cols], got shape {list(t.shape)}")
    return t


def _same(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> None:
    first_name, first = names[0], tensors[0]
    for name, t in zip(names[1:], tensors[1:], strict=True):
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: expected dtype {first.dtype} (the dtype of {first_name}), got {t.dtype}")
        if t.device != first.device:
            raise ValueError(
                f"{name}: expected a tensor on {first.device} (the device of {first_name}), got {t.device}"
            )


def _check_memory(operands: Mapping[str, torch.Tensor], hypers: Mapping[str, HyperValue]) -> None:
    """Every tensor the kernel reads is addressable ([`check_addressable`][kermac.memory.check_addressable])."""
    for name, t in operands.items():
        check_addressable(name, t)
    for name, h in hypers.items():
        if h.tensor is not None:
            check_addressable(name, h.tensor)


def _batch_shape(named: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    shapes = list(named.values())
    if all(s == shapes[0] for s in shapes[1:]):  # the common case (no batch, or the same batch everywhere)
        return shapes[0]
    try:
        return tuple(torch.broadcast_shapes(*named.values()))
    except RuntimeError:
        desc = ", ".join(f"{k} {list(v)}" for k, v in named.items())
        raise ValueError(f"batch dimensions do not broadcast: {desc}") from None


def check_out_type(out: object) -> None:
    """Raise unless `out` is a tensor or None (its shape, dtype and memory are checked with the problem)."""
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"out: expected a torch.Tensor or None, got {type(out).__name__}")


def _prepare_out(
    out: torch.Tensor | None,
    shape: tuple[int, ...],
    like: torch.Tensor,
    operands: Mapping[str, torch.Tensor],
    hypers: Mapping[str, HyperValue],
    fake: bool,
) -> torch.Tensor:
    """`out` validated (or a fresh tensor); `operands` and `hypers` are what the operation reads;
    overlaps are checked unless the tensors are `fake`."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    check_out_type(out)
    if tuple(out.shape) != shape:
        raise ValueError(f"out: expected shape {list(shape)}, got {list(out.shape)}")
    if out.dtype != like.dtype:
        raise TypeError(f"out: expected dtype {like.dtype}, got {out.dtype}")
    if out.device != like.device:
        raise ValueError(f"out: expected a tensor on {like.device}, got one on {out.device}")
    check_addressable("out", out)
    if out.requires_grad and torch.is_grad_enabled():
        raise ValueError("out: must not require grad")
    if not fake:
        _check_no_overlap(out, operands, hypers)
    return out


def _check_no_overlap(
    out: torch.Tensor, operands: Mapping[str, torch.Tensor], hypers: Mapping[str, HyperValue]
) -> None:
    """Refuse an `out` whose elements overlap or that shares memory with a tensor the kernel reads
    (a kernel that writes tiles of `out` while other tiles still read the input computes garbage).
    A layout too intricate for `kermac.memory` to decide is refused too, saying so."""
    found = internal_overlap(out)
    if found is not False:
        why = "" if found else " (a layout too intricate to prove its elements distinct)"
        raise ValueError(
            f"out: expected a tensor without overlapping elements, "
            f"got shape {list(out.shape)} with strides {list(out.stride())}{why}"
        )
    reads = list(operands.items())
    reads += [(name, t) for name, h in hypers.items() for t in h.tensors()]
    for name, t in reads:
        found = overlap(out, t)
        if found is not False:
            why = "" if found else " possibly (a layout too intricate to prove otherwise)"
            raise ValueError(
                f"out: shares memory with {name}{why}; the result would overwrite {name} while it is "
                f"being read. Pass an out that does not overlap any input (e.g. a fresh tensor)"
            )


def _expand(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """`t` broadcast to `shape` as a view (`t` itself where it has that shape already)."""
    return t if t.shape == shape else t.expand(shape)


def _hyper_shapes(hypers: Mapping[str, HyperValue]) -> dict[str, tuple[int, ...]]:
    """The shapes of the tensor hyperparameters (checked readable by
    [`kermac.hyperparams.normalize_hyper`][kermac.hyperparams.normalize_hyper])."""
    return {name: tuple(h.tensor.shape) for name, h in hypers.items() if h.tensor is not None}


def _offset(name: str, off: object) -> int:
    if type(off) is int and -(2**63) <= off < 2**63:  # the common case, without the ABC check below
        return off
    if isinstance(off, bool) or not isinstance(off, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(off).__name__}")
    off = int(off)
    lo, hi = OFFSET_RANGE
    if not lo <= off <= hi:
        raise ValueError(f"{name}: expected an integer in [-2**63, 2**63 - 1] (int64), got {off}")
    return off


def diagonal_offsets(offset_m: int, offset_n: int, m: int, n: int) -> tuple[int, int]:
    """Offsets with the same diagonal on an `m × n` matrix: at most one nonzero, both in `[0, max(m, n)]`.

    Entry `(i, j)` is on the diagonal iff `j − i = offset_m − offset_n`; `j − i` lies in
    `[1 − m, n − 1]`, so a shift beyond `[−m, n]` is clamped to it (no entry either way).
    """
    shift = min(max(offset_m - offset_n, -m), n)
    return (shift, 0) if shift >= 0 else (0, -shift)


def pairwise_problem(
    program: PairwiseProgram,
    x: object,
    z: object,
    *,
    out: torch.Tensor | None,
    hypers: Mapping[str, HyperValue],
    offset_m: int = 0,
    offset_n: int = 0,
    debug: bool = False,
    fake: bool = False,
) -> PairwiseProblem:
    """Validate and normalise a pairwise call (shapes, dtypes, devices, batch, `out`).

    `fake`: the tensors are a trace's fake tensors, whose addresses mean nothing: `out`'s overlaps
    are not checked (the real call checks them)."""
    x = check_tensor("x", x)
    z = check_tensor("z", z)
    _check_memory({"x": x, "z": z}, hypers)
    _same(("x", "z"), (x, z))
    xs, zs = x.shape, z.shape
    (m, d), n = xs[-2:], zs[-2]
    if zs[-1] != d:
        raise ValueError(f"z: expected {d} features in the last dimension (as x), got shape {list(zs)} (x: {list(xs)})")
    offset_m, offset_n = _offset("offset_m", offset_m), _offset("offset_n", offset_n)
    batch = _batch_shape({"x": tuple(xs[:-2]), "z": tuple(zs[:-2]), **_hyper_shapes(hypers)})
    offset_m, offset_n = diagonal_offsets(offset_m, offset_n, m, n)
    return PairwiseProblem(
        program=program,
        x=_expand(x, batch + (m, d)),
        z=_expand(z, batch + (n, d)),
        out=_prepare_out(out, batch + (m, n), x, {"x": x, "z": z}, hypers, fake),
        hypers={k: h.expanded(batch) for k, h in hypers.items()} if hypers else hypers,
        offset_m=offset_m,
        offset_n=offset_n,
        batch_shape=batch,
        debug=debug,
    )


def grad_problem(
    program: GradProgram,
    a: object,
    b: object,
    c: object,
    d: object,
    *,
    out: torch.Tensor | None,
    hypers: Mapping[str, HyperValue],
    debug: bool = False,
    fake: bool = False,
) -> GradProblem:
    """Validate and normalise a gradient contraction: a [..,K,M], b [..,N,K], c [..,O,K], d [..,N,M]
    (`fake` as in `pairwise_problem`).  A general program that computes a product form is handed over in the
    product form (`GradProgram(product_factor(program), program.epilogue)`): the same values, and every backend's
    product-form kernels."""
    names = ("a", "b", "c", "d")
    ts = tuple(check_tensor(nm, t) for nm, t in zip(names, (a, b, c, d), strict=True))
    _check_memory(dict(zip(names, ts, strict=True)), hypers)
    _same(names, ts)
    a, b, c, d = ts
    k, m = a.shape[-2], a.shape[-1]
    n, o = b.shape[-2], c.shape[-2]
    expect = {
        "b": (b, -1, k, "K (a.shape[-2])"),
        "c": (c, -1, k, "K (a.shape[-2])"),
        "d": (d, -1, m, "M (a.shape[-1])"),
    }
    for name, (t, dim, size, what) in expect.items():
        if t.shape[dim] != size:
            raise ValueError(
                f"{name}: expected size {size} in dimension {dim} to match {what}, got shape {list(t.shape)}"
            )
    if d.shape[-2] != n:
        raise ValueError(f"d: expected size {n} in dimension -2 to match N (b.shape[-2]), got shape {list(d.shape)}")
    batch = _batch_shape({nm: tuple(t.shape[:-2]) for nm, t in zip(names, ts, strict=True)} | _hyper_shapes(hypers))
    factor = product_factor(program) if program.general else None
    return GradProblem(
        program=program if factor is None else GradProgram(factor, program.epilogue),
        a=_expand(a, batch + (k, m)),
        b=_expand(b, batch + (n, k)),
        c=_expand(c, batch + (o, k)),
        d=_expand(d, batch + (n, m)),
        out=_prepare_out(out, batch + (o, n, m), a, dict(zip(names, ts, strict=True)), hypers, fake),
        hypers={nm: h.expanded(batch) for nm, h in hypers.items()},
        batch_shape=batch,
        debug=debug,
    )


def product_problem(
    program: PairwiseProgram,
    x: object,
    z: object,
    v: object,
    *,
    out: torch.Tensor | None,
    hypers: Mapping[str, HyperValue],
    offset_m: int = 0,
    offset_n: int = 0,
    debug: bool = False,
    fake: bool = False,
) -> ProductProblem:
    """Validate and normalise a kernel product: x [..,M,D], z [..,N,D], v [..,N,C] → out [..,M,C]
    (`fake` as in `pairwise_problem`)."""
    names = ("x", "z", "v")
    (x, z, v), (m, n, d, c) = _product_operands(names, (x, z, v), hypers)
    batch, offset_m, offset_n = _product_placement(names, (x, z, v), hypers, offset_m, offset_n)
    return ProductProblem(
        program=program,
        x=_expand(x, batch + (m, d)),
        z=_expand(z, batch + (n, d)),
        v=_expand(v, batch + (n, c)),
        out=_prepare_out(out, batch + (m, c), x, dict(zip(names, (x, z, v), strict=True)), hypers, fake),
        hypers={k: h.expanded(batch) for k, h in hypers.items()} if hypers else hypers,
        offset_m=offset_m,
        offset_n=offset_n,
        batch_shape=batch,
        debug=debug,
    )


def product_grad_problem(
    program: PairwiseProgram,
    x: object,
    z: object,
    v: object,
    g: object,
    *,
    out: torch.Tensor | None,
    hypers: Mapping[str, HyperValue],
    offset_m: int = 0,
    offset_n: int = 0,
    debug: bool = False,
    fake: bool = False,
) -> ProductGradProblem:
    """Validate and normalise a gradient product: x [..,M,D], z [..,N,D], v [..,N,C], g [..,M,C] → out [..,M,D]
    (`fake` as in `pairwise_problem`)."""
    names = ("x", "z", "v", "g")
    (x, z, v, g), (m, n, d, c) = _product_operands(names, (x, z, v, g), hypers)
    gs = g.shape
    if gs[-2:] != (m, c):
        raise ValueError(
            f"g: expected sizes [{m}, {c}] in the last two dimensions to match M (x.shape[-2]) and C (v.shape[-1]), "
            f"got shape {list(gs)}"
        )
    batch, offset_m, offset_n = _product_placement(names, (x, z, v, g), hypers, offset_m, offset_n)
    return ProductGradProblem(
        program=program,
        x=_expand(x, batch + (m, d)),
        z=_expand(z, batch + (n, d)),
        v=_expand(v, batch + (n, c)),
        g=_expand(g, batch + (m, c)),
        out=_prepare_out(out, batch + (m, d), x, dict(zip(names, (x, z, v, g), strict=True)), hypers, fake),
        hypers={k: h.expanded(batch) for k, h in hypers.items()} if hypers else hypers,
        offset_m=offset_m,
        offset_n=offset_n,
        batch_shape=batch,
        debug=debug,
    )


def _product_operands(
    names: tuple[str, ...], values: tuple[object, ...], hypers: Mapping[str, HyperValue]
) -> tuple[tuple[torch.Tensor, ...], tuple[int, int, int, int]]:
    """The checked operands of a product or gradient product, whose first three are x [..,M,D], z [..,N,D] and
    v [..,N,C] (readable, one dtype and device, z's features and v's rows matching), and (M, N, D, C)."""
    ts = tuple(check_tensor(nm, t) for nm, t in zip(names, values, strict=True))
    _check_memory(dict(zip(names, ts, strict=True)), hypers)
    _same(names, ts)
    xs, zs, vs = (t.shape for t in ts[:3])
    (m, d), n, c = xs[-2:], zs[-2], vs[-1]
    if zs[-1] != d:
        raise ValueError(f"z: expected {d} features in the last dimension (as x), got shape {list(zs)} (x: {list(xs)})")
    if vs[-2] != n:
        raise ValueError(
            f"v: expected size {n} in dimension -2 to match N (z.shape[-2]), got shape {list(vs)} (z: {list(zs)})"
        )
    return ts, (m, n, d, c)


def _product_placement(
    names: tuple[str, ...],
    ts: tuple[torch.Tensor, ...],
    hypers: Mapping[str, HyperValue],
    offset_m: int,
    offset_n: int,
) -> tuple[tuple[int, ...], int, int]:
    """The batch shape of a product's operands and hyperparameters, and its diagonal offsets in the form of
    `diagonal_offsets` (M and N from x and z, the first two operands)."""
    offset_m, offset_n = _offset("offset_m", offset_m), _offset("offset_n", offset_n)
    batch = _batch_shape({nm: tuple(t.shape[:-2]) for nm, t in zip(names, ts, strict=True)} | _hyper_shapes(hypers))
    return (batch, *diagonal_offsets(offset_m, offset_n, ts[0].shape[-2], ts[1].shape[-2]))
