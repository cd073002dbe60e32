"""Argument checks shared by every operation.

Bad input raises `TypeError` (wrong Python type or dtype) or `ValueError` (wrong shape, device
or range) with a message naming the argument, what was expected and what was received.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ._subspace import BLOCK_EXTRA

__all__ = [
    "DTYPES",
    "EigenRange",
    "check_flag",
    "check_matrix",
    "check_method",
    "check_overwrite",
    "check_range",
    "check_rhs",
]

DTYPES = (torch.float32, torch.float64)
METHODS = ("auto", "direct", "iterative")
AUTO_MIN_N = 4096
"""`method="auto"` iterates for end ranges of at most N / AUTO_FRACTION pairs when N >= AUTO_MIN_N."""
AUTO_FRACTION = 32


def check_flag(name: str, value: object) -> bool:
    """`value` must be a Python bool (`overwrite_a`, `check`, `upper`, ...)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")
    return value


def check_overwrite(name: str, value: object, target: str, t: torch.Tensor) -> bool:
    """`value` of the flag `name` (`overwrite_a`, ...) must be a bool, and may be True only
    if tensor `target` (already checked) does not require grad.

    Writing over a tensor that autograd tracks would fail inside torch for a leaf, or silently
    corrupt the gradients that depend on its values (cuSOLVER writes past autograd's version
    counter), so the flag is refused before any memory is touched.
    """
    check_flag(name, value)
    if value and t.requires_grad:
        raise ValueError(
            f"{name}=True would write over {target}, which requires grad (autograd may need its values); "
            f"pass {name}=False, or a tensor that does not require grad"
        )
    return value


def _check_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} must have dtype torch.float32 or torch.float64, got {t.dtype}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be on a CPU or CUDA device, got {t.device}")
    return t


def check_matrix(name: str, t: object) -> int:
    """`t` must be a float32/float64 CPU or CUDA tensor of shape `[..., N, N]`; returns N."""
    t = _check_tensor(name, t)
    if t.dim() < 2 or t.shape[-1] != t.shape[-2]:
        raise ValueError(
            f"{name} must be a square matrix or a batch of them, shape [..., N, N]; got shape {tuple(t.shape)}"
        )
    return t.shape[-1]


def check_rhs(A: torch.Tensor, B: object) -> tuple[torch.Size, int]:
    """Right-hand sides `B [..., N, K]` for `A [..., N, N]` (already checked).

    Returns the broadcast batch shape of A and B (torch.linalg.solve's rule) and K.
    """
    B = _check_tensor("B", B)
    n = A.shape[-1]
    if B.dtype != A.dtype:
        raise TypeError(f"B must have the same dtype as A ({A.dtype}), got {B.dtype}")
    if B.device != A.device:
        raise ValueError(f"B must be on the same device as A ({A.device}), got {B.device}")
    if B.dim() < 2:
        raise ValueError(
            f"B must have shape [..., N, K] with N = {n}, got shape {tuple(B.shape)}; "
            "for a single right-hand side pass B.unsqueeze(-1)"
        )
    if B.shape[-2] != n:
        hint = "; for a batch of vectors [..., N] pass B.unsqueeze(-1)" if B.shape[-1] == n else ""
        raise ValueError(
            f"B must have shape [..., N, K] with N = {n} (the size of A), got shape {tuple(B.shape)}{hint}"
        )
    try:
        batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    except RuntimeError as err:
        raise ValueError(
            "the batch dimensions of A and B must broadcast, got A of shape "
            f"{tuple(A.shape)} and B of shape {tuple(B.shape)}"
        ) from err
    return batch, B.shape[-1]


@dataclass(frozen=True)
class EigenRange:
    """Which eigenpairs `eigh_range` returns.

    `by_index`: the eigenvalues with ascending indices `il..iu` (0-based, inclusive);
    otherwise those in the half-open interval `(vl, vu]` (infinite bounds allowed).
    """

    by_index: bool
    il: int = 0
    iu: int = -1
    vl: float = -math.inf
    vu: float = math.inf

    @property
    def count(self) -> int | None:
        """The number of pairs when it is known before computing (index ranges), else None."""
        return self.iu - self.il + 1 if self.by_index else None


def _index(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    return int(value)


def _bound(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} ({value!r})")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    return value


def check_range(
    n: int,
    il: object = None,
    iu: object = None,
    vl: object = None,
    vu: object = None,
    top_k: object = None,
) -> EigenRange:
    """Exactly one selection: indices `il`/`iu`, values `vl`/`vu`, or `top_k`."""
    by_index = il is not None or iu is not None
    by_value = vl is not None or vu is not None
    chosen = [name for name, on in (("il/iu", by_index), ("vl/vu", by_value), ("top_k", top_k is not None)) if on]
    if len(chosen) != 1:
        raise ValueError(
            "eigh_range needs exactly one selection: indices il/iu, values vl/vu or top_k; "
            f"got {', '.join(chosen) if chosen else 'none'} (for every eigenpair use eigh)"
        )
    if top_k is not None:
        k = _index("top_k", top_k)
        if not 1 <= k <= n:
            raise ValueError(f"top_k must be in [1, N] with N = {n}, got {k}")
        return EigenRange(True, il=n - k, iu=n - 1)
    if by_index:
        lo = 0 if il is None else _index("il", il)
        hi = n - 1 if iu is None else _index("iu", iu)
        if not 0 <= lo < n:
            raise ValueError(f"il must be in [0, N) with N = {n}, got {lo}")
        if not 0 <= hi < n:
            raise ValueError(f"iu must be in [0, N) with N = {n}, got {hi}")
        if lo > hi:
            raise ValueError(f"il must be <= iu (an inclusive index range), got il={lo}, iu={hi}")
        return EigenRange(True, il=lo, iu=hi)
    lo_v = -math.inf if vl is None else _bound("vl", vl)
    hi_v = math.inf if vu is None else _bound("vu", vu)
    if not lo_v < hi_v:
        raise ValueError(f"vl must be < vu (the half-open interval (vl, vu]), got vl={lo_v}, vu={hi_v}")
    return EigenRange(False, vl=lo_v, vu=hi_v)


def check_method(method: object, sel: EigenRange, n: int) -> bool:
    """Whether `eigh_range` iterates (True) or calls the direct solver, for `method`.

    Iteration applies to index ranges at one end of the spectrum (`top_k`, `il = 0` or
    `iu = N - 1`) whose block of `2k + 32` columns is narrower than N.
    """
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, one of {', '.join(METHODS)}; got {type(method).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    k = sel.count or 0
    at_end = sel.by_index and (sel.il == 0) != (sel.iu == n - 1)
    fits = 2 * k + BLOCK_EXTRA < n
    if method == "iterative" and not (at_end and fits):
        raise ValueError(
            "method='iterative' needs an index range at one end of the spectrum (top_k, il=0 or "
            f"iu=N-1, not both) with 2k + 32 < N; got {sel} for N = {n}"
        )
    if method == "auto":
        return at_end and fits and n >= AUTO_MIN_N and k <= n // AUTO_FRACTION
    return method == "iterative"
