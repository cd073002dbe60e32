"""The reference backend: chunked evaluation of semiring programs with torch operations.

Memory stays bounded: the per-element expression is evaluated on blocks of at most
`CHUNK_ELEMENTS` elements (batch × rows × columns × features), never on the whole
`M·N·D` cube.  Half-precision inputs are computed in float32 and float64 inputs in float64;
results are cast to the output's dtype when copied into it.
"""

from __future__ import annotations

import math

import torch

from kermac.backend import Availability, Backend
from kermac.ir_eval import evaluate
from kermac.problem import GradProblem, PairwiseProblem, compute_dtype
from kermac.programs import REDUCTIONS

__all__ = ["CHUNK_ELEMENTS", "REDUCE", "ReferenceBackend", "blocks", "hyper_env", "tile"]

CHUNK_ELEMENTS = 1 << 22
"""Upper bound on the elements of one evaluated block (~16 MB in float32)."""

REDUCE = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}
"""The reductions as torch functions (NaN-propagating maximum and minimum, as the IR defines them)."""


def blocks(size: int, block: int) -> list[tuple[int, int]]:
    """`[start, stop)` ranges of at most `block` covering `range(size)`."""
    return [(i, min(i + block, size)) for i in range(0, size, block)]


def tile(rows: int, cols: int, per_pair: int) -> tuple[int, int]:
    """Rows × columns of a block whose `rows·cols·per_pair` stays near CHUNK_ELEMENTS."""
    pairs = max(1, CHUNK_ELEMENTS // max(1, per_pair))
    r = max(1, min(rows, math.isqrt(pairs)))
    return r, max(1, min(cols, pairs // r))


def hyper_env(problem_hypers: dict, cdtype: torch.dtype, trailing: int) -> dict[str, torch.Tensor | float]:
    """Hyperparameter values for [`evaluate`][kermac.ir_eval.evaluate]: scalars, or tensors with `trailing` unit
    dims."""
    env: dict[str, torch.Tensor | float] = {}
    for name, hv in problem_hypers.items():
        env[name] = hv.scalar if hv.tensor is None else hv.tensor.to(cdtype).reshape(hv.tensor.shape + (1,) * trailing)
    return env


class ReferenceBackend(Backend):
    """Pure PyTorch; every device, dtype and program.  Priority 0: the fallback of `auto`."""

    name = "torch"
    priority = 0
    description = "pure PyTorch reference (CPU and GPU, every dtype); the fallback and test oracle"

    def availability(self) -> Availability:
        return Availability.yes(torch.__version__)

    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        return None

    def check_grad(self, problem: GradProblem) -> str | None:
        return None

    def pairwise(self, problem: PairwiseProblem) -> None:
        prog, batch = problem.program, problem.batch_shape
        cdtype = compute_dtype(problem.dtype)
        like = torch.empty((), dtype=cdtype, device=problem.device)
        inner_env = hyper_env(dict(problem.hypers), cdtype, 3)
        epi_env = hyper_env(dict(problem.hypers), cdtype, 2)
        reduce = REDUCE[prog.reduction]
        d = problem.d
        bm, bn = tile(problem.m, problem.n, math.prod(batch) * max(d, 1))
        for m0, m1 in blocks(problem.m, bm):
            rows = torch.arange(m0, m1, device=problem.device) + problem.offset_m
            for n0, n1 in blocks(problem.n, bn):
                shape = batch + (m1 - m0, n1 - n0)
                if d == 0:
                    acc = torch.full(shape, REDUCTIONS[prog.reduction], dtype=cdtype, device=problem.device)
                else:
                    xs = problem.x[..., m0:m1, None, :].to(cdtype)
                    zs = problem.z[..., None, n0:n1, :].to(cdtype)
                    terms = evaluate(prog.inner, {"x": xs, "z": zs, **inner_env}, like=like)
                    acc = reduce(terms.expand(shape + (d,)), dim=-1)
                cols = torch.arange(n0, n1, device=problem.device) + problem.offset_n
                diag = (rows[:, None] == cols[None, :]).to(cdtype)
                value = evaluate(prog.epilogue, {"acc": acc, "diag": diag, **epi_env}, like=like)
                problem.out[..., m0:m1, n0:n1].copy_(value.expand(shape))

    def grad(self, problem: GradProblem) -> None:
        prog, batch = problem.program, problem.batch_shape
        m, n, o, k = problem.sizes
        cdtype = compute_dtype(problem.dtype)
        like = torch.empty((), dtype=cdtype, device=problem.device)
        hypers = hyper_env(dict(problem.hypers), cdtype, 3)  # [*B, 1, 1, 1]: both stages
        bk = max(1, min(k, 256))
        bn, bm = tile(n, m, math.prod(batch) * max(bk, o))
        for n0, n1 in blocks(n, bn):
            for m0, m1 in blocks(m, bm):
                acc = torch.zeros(batch + (o, n1 - n0, m1 - m0), dtype=cdtype, device=problem.device)
                for k0, k1 in blocks(k, bk):
                    ds = problem.d[..., n0:n1, m0:m1, None].to(cdtype)
                    bs = problem.b[..., n0:n1, None, k0:k1].to(cdtype)
                    terms = evaluate(prog.multiply, {"d": ds, "b": bs, **hypers}, like=like)
                    terms = terms.expand(batch + (n1 - n0, m1 - m0, k1 - k0))
                    terms = terms * problem.a[..., k0:k1, m0:m1].to(cdtype).transpose(-1, -2)[..., None, :, :]
                    acc += torch.einsum("...ok,...nmk->...onm", problem.c[..., :, k0:k1].to(cdtype), terms)
                value = evaluate(prog.epilogue, {"acc": acc, **hypers}, like=like)
                problem.out[..., :, n0:n1, m0:m1].copy_(value.expand(acc.shape))
