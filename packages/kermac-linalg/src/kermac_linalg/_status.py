"""Per-batch-entry status (`info`) tensors: combining, poisoning failed entries, `check=True`.

`info` follows LAPACK/cuSOLVER: 0 is success, `i > 0` a numerical failure of the entry
(see `MEANINGS`), `-i` an invalid i-th argument. kermac adds [`NONFINITE_INPUT`][kermac_linalg._status.NONFINITE_INPUT]
for an entry whose input holds a NaN or an infinity where the operation reads it (see
`NONFINITE_MEANINGS`). Everything here stays on the device except
`raise_for_info`, which is what `check=True` asks for and synchronises.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "MEANINGS",
    "NONFINITE_INPUT",
    "NONFINITE_MEANINGS",
    "LinalgError",
    "combine_info",
    "finish",
    "poison_failed",
    "raise_for_info",
]

NONFINITE_INPUT = -(2**31)
"""`info` of an entry whose input holds NaN or ±inf where the operation reads it: -2³¹, the
smallest int32. LAPACK/cuSOLVER codes are `i > 0` (an order, a pivot or a count) or `-i` (an
argument position, at most a few dozen), and -2³¹ is neither: no positive int32 negates to it."""

MEANINGS = {
    "cholesky": "the leading minor of order {i} is not positive definite",
    "cholesky_solve": "the leading minor of order {i} is not positive definite",
    "solve": "the matrix is singular: pivot {i} of its LU factorisation is exactly zero",
    "eigh": "the eigensolver did not converge (info = {i})",
    "eigh_range": "the eigensolver did not converge (info = {i})",
}
# What NONFINITE_INPUT means for each operation: the part of the input it reads.
NONFINITE_MEANINGS = {
    "cholesky": "the lower triangle of A holds a NaN or an infinity",
    "cholesky_solve": "the lower triangle of A or the right-hand sides B hold a NaN or an infinity",
    "solve": "A or the right-hand sides B hold a NaN or an infinity",
    "eigh": "the lower triangle of A holds a NaN or an infinity",
    "eigh_range": "the lower triangle of A holds a NaN or an infinity",
}
_LISTED = 20


class LinalgError(torch.linalg.LinAlgError):
    """A factorisation failed in some batch entries (raised only with `check=True`).

    `failed` lists `(batch_index, info)` for every failing entry; `info` is the full status
    tensor on the CPU. A subclass of `torch.linalg.LinAlgError`, so code that catches torch's
    errors catches this one too.
    """

    def __init__(self, message: str, failed: list[tuple[tuple[int, ...], int]], info: torch.Tensor):
        super().__init__(message)
        self.failed = failed
        self.info = info


def combine_info(factor: torch.Tensor, solve: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    """Status of each solve: the factorisation's when non-zero (broadcast to `batch`), else the solve's."""
    factor = factor.expand(batch)
    return torch.where(factor != 0, factor, solve.reshape(batch))


def poison_failed(info: torch.Tensor, *outputs: torch.Tensor) -> None:
    """Fill every entry of `outputs` (shape `info.shape + [...]`) whose info is non-zero with NaN."""
    failed = info != 0
    for out in outputs:
        mask = failed.reshape(failed.shape + (1,) * (out.dim() - failed.dim()))
        out.masked_fill_(mask, math.nan)


def finish(
    op: str, info: torch.Tensor, nonfinite: torch.Tensor, outputs: tuple[torch.Tensor, ...], check: bool
) -> torch.Tensor:
    """The call's final status: `info` with [`NONFINITE_INPUT`][kermac_linalg._status.NONFINITE_INPUT] where `nonfinite`
    is set.

    `info [*batch]` is the solver's status (the call's own tensor, updated in place);
    `nonfinite` (bool, broadcasting to `batch`) marks entries whose input was not finite;
    their code replaces the solver's, which is meaningless on such input. Every failed entry
    of `outputs` is then NaN (`poison_failed`); `check` raises for them
    (`raise_for_info`, which synchronises).
    """
    info.masked_fill_(nonfinite, NONFINITE_INPUT)
    poison_failed(info, *outputs)
    if check:
        raise_for_info(op, info)
    return info


def raise_for_info(op: str, info: torch.Tensor) -> None:
    """Synchronise, and raise [`LinalgError`][kermac_linalg._status.LinalgError] listing every entry whose info is
    non-zero."""
    host = info.cpu()
    bad = torch.nonzero(host, as_tuple=False)  # [failures, info.dim()]: [1, 0] for a failed 0-d info
    if bad.shape[0] == 0:
        return
    failed = [(tuple(int(i) for i in idx), int(host[tuple(idx)])) for idx in bad]
    lines = [f"  entry {idx or '()'}: {_meaning(op, code)}" for idx, code in failed[:_LISTED]]
    if len(failed) > _LISTED:
        lines.append(f"  ... and {len(failed) - _LISTED} more (see the error's .failed)")
    total = max(1, host.numel())
    message = f"{op}: failed in {len(failed)} of {total} batch entries:\n" + "\n".join(lines)
    raise LinalgError(message, failed, host)


def _meaning(op: str, code: int) -> str:
    if code == NONFINITE_INPUT:
        return f"{NONFINITE_MEANINGS[op]} (info = {code})"
    if code < 0:
        return f"argument {-code} of the solver call was invalid (info = {code})"
    return MEANINGS[op].format(i=code)
