"""Per-batch-entry status (``info``) tensors: combining, poisoning failed entries, ``check=True``.

``info`` follows LAPACK/cuSOLVER: 0 is success, ``i > 0`` a numerical failure of the entry
(see :data:`MEANINGS`), ``-i`` an invalid i-th argument. Everything here stays on the device
except :func:`raise_for_info`, which is what ``check=True`` asks for and synchronises.
"""

from __future__ import annotations

import math

import torch

__all__ = ["MEANINGS", "LinalgError", "combine_info", "poison_failed", "raise_for_info"]

MEANINGS = {
    "cholesky": "the leading minor of order {i} is not positive definite",
    "cholesky_solve": "the leading minor of order {i} is not positive definite",
    "solve": "the matrix is singular: pivot {i} of its LU factorisation is exactly zero",
    "eigh": "the eigensolver did not converge (info = {i})",
    "eigh_range": "the eigensolver did not converge (info = {i})",
}
_LISTED = 20


class LinalgError(torch.linalg.LinAlgError):
    """A factorisation failed in some batch entries (raised only with ``check=True``).

    ``failed`` lists ``(batch_index, info)`` for every failing entry; ``info`` is the full status
    tensor on the CPU. A subclass of ``torch.linalg.LinAlgError``, so code that catches torch's
    errors catches this one too.
    """

    def __init__(self, message: str, failed: list[tuple[tuple[int, ...], int]], info: torch.Tensor):
        super().__init__(message)
        self.failed = failed
        self.info = info


def combine_info(factor: torch.Tensor, solve: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    """Status of each solve: the factorisation's when non-zero (broadcast to ``batch``), else the solve's."""
    factor = factor.expand(batch)
    return torch.where(factor != 0, factor, solve.reshape(batch))


def poison_failed(info: torch.Tensor, *outputs: torch.Tensor) -> None:
    """Fill every entry of ``outputs`` (shape ``info.shape + [...]``) whose info is non-zero with NaN."""
    failed = info != 0
    for out in outputs:
        mask = failed.reshape(failed.shape + (1,) * (out.dim() - failed.dim()))
        out.masked_fill_(mask, math.nan)


def raise_for_info(op: str, info: torch.Tensor) -> None:
    """Synchronise, and raise :class:`LinalgError` listing every entry whose info is non-zero."""
    host = info.cpu()
    bad = torch.nonzero(host, as_tuple=False)
    if bad.numel() == 0:
        return
    failed = [(tuple(int(i) for i in idx), int(host[tuple(idx)])) for idx in bad]
    lines = [f"  entry {idx or '()'}: {_meaning(op, code)}" for idx, code in failed[:_LISTED]]
    if len(failed) > _LISTED:
        lines.append(f"  ... and {len(failed) - _LISTED} more (see the error's .failed)")
    total = max(1, host.numel())
    message = f"{op}: failed in {len(failed)} of {total} batch entries:\n" + "\n".join(lines)
    raise LinalgError(message, failed, host)


def _meaning(op: str, code: int) -> str:
    if code < 0:
        return f"argument {-code} of the solver call was invalid (info = {code})"
    return MEANINGS[op].format(i=code)
