"""Conformance checks a backend -- kermac's own or a third party's -- must pass.

Each check runs one program on the backend under test into an `out` *poisoned* with NaN, and
compares it with the reference backend (`torch`, whose name no plugin may take) evaluated on
the inputs upcast to float64.  A backend that leaves part of `out` unwritten fails: the poison
shows where the reference has a number.  Entries must agree in their NaN and infinite values and
otherwise within `rtol` relative to the largest finite reference entry:

```text
from kermac import presets, testing

testing.assert_pairwise_conforms("mybackend", presets.l1_distance.lower(), x, z)
```

The checks synchronise with the host (they are tests, not a hot path).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

import kermac
from kermac.benchmarking import REFERENCE_BACKEND
from kermac.programs import GradProgram, PairwiseProgram

__all__ = ["TOLERANCE", "assert_grad_conforms", "assert_matches_reference", "assert_pairwise_conforms"]

TOLERANCE: Mapping[torch.dtype, float] = {
    torch.float64: 1e-11,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
"""Default `rtol` per dtype: `max |result − reference| / max |reference|` allowed."""

Hypers = Mapping[str, float | torch.Tensor] | None


def _wide(hypers: Hypers) -> dict[str, float | torch.Tensor]:
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in (hypers or {}).items()}


def assert_pairwise_conforms(
    backend: str,
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    *,
    hypers: Hypers = None,
    rtol: float | None = None,
) -> None:
    """`run_program(program, x, z)` on `backend` matches the float64 reference (`AssertionError` if not)."""
    ref = kermac.run_program(program, x.double(), z.double(), hypers=_wide(hypers), backend=REFERENCE_BACKEND)
    out = torch.full(ref.shape, torch.nan, dtype=x.dtype, device=x.device)
    kermac.run_program(program, x, z, hypers=hypers, out=out, backend=backend)
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
    rtol: float | None = None,
) -> None:
    """`run_grad_program(program, a, b, c, d)` on `backend` matches the float64 reference."""
    wide = (t.double() for t in (a, b, c, d))
    ref = kermac.run_grad_program(program, *wide, hypers=_wide(hypers), backend=REFERENCE_BACKEND)
    out = torch.full(ref.shape, torch.nan, dtype=a.dtype, device=a.device)
    kermac.run_grad_program(program, a, b, c, d, hypers=hypers, out=out, backend=backend)
    assert_matches_reference(out, ref, rtol=rtol, what=f"backend {backend!r}, gradient program {program.key()}")


def assert_matches_reference(result: torch.Tensor, ref: torch.Tensor, *, rtol: float | None, what: str) -> None:
    """`result` equals `ref` (float64) in NaN and infinite entries, and elsewhere within `rtol`.

    `rtol` (default [`TOLERANCE`][kermac.testing.TOLERANCE] of `result`'s dtype) bounds `|result − ref|` divided by
    the largest finite `|ref|` (1 if there is none).  The error names `what`, how many entries
    differ and the first one.
    """
    if result.shape != ref.shape:
        raise AssertionError(f"{what}: shape {list(result.shape)}, expected {list(ref.shape)}")
    rtol = TOLERANCE[result.dtype] if rtol is None else rtol
    got, want = result.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(got) & torch.isfinite(want)
    scale = want[torch.isfinite(want)].abs().max().item() if torch.isfinite(want).any() else 0.0
    err = torch.where(finite, (got - want).abs(), 0.0) / (scale or 1.0)
    special = (torch.isnan(got) != torch.isnan(want)) | (~finite & ~torch.isnan(want) & (got != want))
    bad = special | (err > rtol)
    if bad.any():
        first = tuple(int(i) for i in bad.nonzero()[0])
        hint = " (NaN where the reference has a number: out was left unwritten)" if got[first].isnan() else ""
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} entries differ from the reference (rtol {rtol:g}); "
            f"first at {list(first)}: got {got[first].item()!r}, expected {want[first].item()!r}{hint}"
        )
