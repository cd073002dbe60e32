"""The value check: one call on a backend, into a NaN-poisoned `out`, against the float64 reference."""

from __future__ import annotations

from collections.abc import Mapping

import torch

import kermac
from kermac.benchmarking import REFERENCE_BACKEND
from kermac.problem import SUPPORTED_DTYPES, compute_dtype
from kermac.programs import GradProgram, PairwiseProgram, product_factor

__all__ = [
    "GRAD_INF_MAY_BE_NAN",
    "TOLERANCE",
    "Hypers",
    "assert_grad_conforms",
    "assert_matches_reference",
    "assert_pairwise_conforms",
    "assert_product_conforms",
    "product_rtol",
    "product_scale",
]

TOLERANCE: Mapping[torch.dtype, float] = {
    torch.float64: 1e-11,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
"""Default `rtol` per dtype: `max |result − reference| / max |reference|` allowed."""

GRAD_INF_MAY_BE_NAN: frozenset[torch.dtype] = frozenset(SUPPORTED_DTYPES) - {torch.float64}
"""Dtypes whose gradient contraction may give NaN where the reference is ±inf: float32 tensor-core
kernels split each factor into parts (3×TF32), which turns an infinite term into ∞ − ∞, as the
formulas page of the documentation says; narrower types compute in float32."""

Hypers = Mapping[str, float | torch.Tensor] | None
"""Hyperparameters of a call by name: numbers or tensors (`None`: the program has none)."""


def _wide(hypers: Hypers) -> dict[str, float | torch.Tensor]:
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in (hypers or {}).items()}


def _poisoned(out: torch.Tensor | None, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """`out` (or a new contiguous tensor of `shape` like `like`) filled with NaN."""
    if out is None:
        return torch.full(shape, torch.nan, dtype=like.dtype, device=like.device)
    return out.fill_(torch.nan)


def assert_pairwise_conforms(
    backend: str,
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    *,
    hypers: Hypers = None,
    offset_m: int = 0,
    offset_n: int = 0,
    out: torch.Tensor | None = None,
    rtol: float | None = None,
) -> None:
    """`run_program(program, x, z)` on `backend` matches the float64 reference (`AssertionError` if not).

    `out` (any strides; default a new contiguous tensor) is filled with NaN and passed as the call's `out`."""
    offsets = {"offset_m": offset_m, "offset_n": offset_n}
    ref = kermac.run_program(
        program, x.double(), z.double(), hypers=_wide(hypers), backend=REFERENCE_BACKEND, **offsets
    )
    out = _poisoned(out, ref.shape, x)
    kermac.run_program(program, x, z, hypers=hypers, out=out, backend=backend, **offsets)
    assert_matches_reference(out, ref, rtol=rtol, what=f"backend {backend!r}, pairwise program {program.key()}")


def assert_grad_conforms(
    backend: str,
    program: GradProgram,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    *,
    hypers: Hypers = None,
    out: torch.Tensor | None = None,
    rtol: float | None = None,
) -> None:
    """`run_grad_program(program, a, b, c, d)` on `backend` matches the float64 reference (`out` as in
    [`assert_pairwise_conforms`][kermac.testing.assert_pairwise_conforms])."""
    wide = (t.double() for t in (a, b, c, d))
    ref = kermac.run_grad_program(program, *wide, hypers=_wide(hypers), backend=REFERENCE_BACKEND)
    out = _poisoned(out, ref.shape, a)
    kermac.run_grad_program(program, a, b, c, d, hypers=hypers, out=out, backend=backend)
    what = f"backend {backend!r}, gradient program {program.key()}"
    product_form = product_factor(program) is not None  # the 3×TF32 contraction that GRAD_INF_MAY_BE_NAN is about
    inf_may_be_nan = product_form and a.dtype in GRAD_INF_MAY_BE_NAN
    assert_matches_reference(out, ref, rtol=rtol, what=what, inf_may_be_nan=inf_may_be_nan)


def assert_matches_reference(
    result: torch.Tensor,
    ref: torch.Tensor,
    *,
    rtol: float | None,
    what: str,
    inf_may_be_nan: bool = False,
    scale: float | None = None,
) -> None:
    """`result` equals `ref` (float64) in NaN and infinite entries, and elsewhere within `rtol`.

    `rtol` (default [`TOLERANCE`][kermac.testing.TOLERANCE] of `result`'s dtype) bounds `|result − ref|` divided by
    `scale`, by default the largest finite `|ref|` (1 if there is none or it is 0).  `inf_may_be_nan` accepts NaN
    where `ref` is infinite (what float32 gradients may give, see
    [`GRAD_INF_MAY_BE_NAN`][kermac.testing.GRAD_INF_MAY_BE_NAN]).
    The error names `what`, how many entries differ and the first one.
    """
    if result.shape != ref.shape:
        raise AssertionError(f"{what}: shape {list(result.shape)}, expected {list(ref.shape)}")
    rtol = TOLERANCE[result.dtype] if rtol is None else rtol
    got, want = result.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(got) & torch.isfinite(want)
    if scale is None:
        scale = _finite_abs_max(want)
    err = torch.where(finite, (got - want).abs(), 0.0) / (scale or 1.0)
    special = (torch.isnan(got) != torch.isnan(want)) | (~finite & ~torch.isnan(want) & (got != want))
    if inf_may_be_nan:
        special &= ~(torch.isnan(got) & torch.isinf(want))
    bad = special | (err > rtol)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        hint = " (NaN where the reference has a number: out was left unwritten)" if got[first].isnan() else ""
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} entries differ from the reference (rtol {rtol:g}); "
            f"first at {list(first)}: got {got[first].item()!r}, expected {want[first].item()!r}{hint}"
        )


def _finite_abs_max(t: torch.Tensor) -> float:
    """The largest finite `|t|` (0 if there is none)."""
    finite = t[torch.isfinite(t)]
    return finite.abs().max().item() if finite.numel() else 0.0


def product_scale(k: torch.Tensor, v: torch.Tensor) -> float:
    """What the error of a product `K @ v` is measured against: the largest finite `|K|` times the
    largest column sum `Σ_n |v[..., n, c]|` over finite entries of `v` (`k` and `v` in float64).

    This bounds every sum of absolute terms `Σ_n |K[m, n]| |v[n, c]|`, so a product whose K entries
    keep the pairwise bound (within `rtol · max |K|` of the reference) and which sums N terms in any
    order errs by at most `(rtol + N·u) · product_scale` ([`product_rtol`][kermac.testing.product_rtol])."""
    column_sums = torch.where(torch.isfinite(v), v.abs(), 0.0).sum(dim=-2)
    return _finite_abs_max(k) * _finite_abs_max(column_sums)


def product_rtol(dtype: torch.dtype, n: int) -> float:
    """The `rtol` of a product summing `n` terms in inputs of `dtype`: the pairwise
    [`TOLERANCE`][kermac.testing.TOLERANCE] of `dtype` (what each entry of K may err by) plus `n·u`, the
    worst-case rounding of a sum of `n` terms in the compute dtype (unit roundoff `u`: 2⁻⁵³ float64,
    2⁻²⁴ float32, which float16 and bfloat16 inputs are computed in; rounding the result to a half type
    stays below their `TOLERANCE`)."""
    return TOLERANCE[dtype] + n * torch.finfo(compute_dtype(dtype)).eps / 2


def assert_product_conforms(
    backend: str,
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    *,
    hypers: Hypers = None,
    offset_m: int = 0,
    offset_n: int = 0,
    transpose: bool = False,
    out: torch.Tensor | None = None,
    rtol: float | None = None,
) -> None:
    """`program_product(program, x, z, v)` (`Kᵀ @ v` with `transpose`) on `backend` matches the float64
    reference: the reference backend's K on the inputs upcast to float64, then a float64 matmul.

    `out` as in [`assert_pairwise_conforms`][kermac.testing.assert_pairwise_conforms].  Entries must agree in
    their NaN and infinite values and otherwise within `rtol` (default
    [`product_rtol`][kermac.testing.product_rtol] of the dtype and the summed length) times
    [`product_scale`][kermac.testing.product_scale]: the error of a sum is bounded by the sum of its
    absolute terms, not by its value, which cancellation can make small.  A backend that raises fails
    (`AssertionError` naming the exception)."""
    offsets = {"offset_m": offset_m, "offset_n": offset_n}
    k = kermac.run_program(program, x.double(), z.double(), hypers=_wide(hypers), backend=REFERENCE_BACKEND, **offsets)
    k = k.mT if transpose else k
    wide_v = v.double()
    ref = k @ wide_v
    out = _poisoned(out, ref.shape, x)
    kind = "transposed product" if transpose else "product"
    what = f"backend {backend!r}, {kind} of pairwise program {program.key()}"
    try:
        kermac.program_product(
            program, x, z, v, transpose=transpose, out=out, backend=backend, **offsets, **(hypers or {})
        )
    except Exception as exc:
        raise AssertionError(f"{what}: raised {type(exc).__name__}: {exc}") from exc
    rtol = product_rtol(x.dtype, k.shape[-1]) if rtol is None else rtol
    assert_matches_reference(out, ref, rtol=rtol, what=what, scale=product_scale(k, wide_v))
