"""The reference backend: chunked evaluation of semiring programs with torch operations.

Memory stays bounded: the per-element expression is evaluated on blocks of at most
`CHUNK_ELEMENTS` elements (batch × rows × columns × features), never on the whole
`M·N·D` cube.  Half-precision inputs are computed in float32 and float64 inputs in float64;
results are cast to the output's dtype when copied into it.

The fused product `out = K @ v` (`kermac.problem.ProductProblem`) evaluates K in the same
blocks (the same function as the pairwise pass, the diagonal shifted to each block) and contracts each
block with `v` at once, so K is never held whole.  Its workspace: one evaluation block (at most
`CHUNK_ELEMENTS` elements), the kernel block it reduces to, the matching rows of `v` in the compute
dtype, and one accumulator of the output's row block (batch × block rows × C) in the compute dtype.

The gradient product (`kermac.problem.ProductGradProblem`, every reduction) goes by the same blocks:
per block of pairs it evaluates the inner terms, then their derivative `∂τ/∂x`, its product with
`e'(acc)` and where it is 0 (batch × block rows × block columns × D each; for a reduction other than the sum
also the terms again, their weights `∂acc/∂τ_j`, the weighted product and its mask, four more), and `acc`,
`e'(acc)`, `G = g vᵀ` and the diagonal (batch × block rows × block columns each), all of them together at most
`CHUNK_ELEMENTS` elements, and accumulates one output row block (batch × block rows × D) in the compute dtype.
"""

from __future__ import annotations

import math

import torch

from kermac.backend import Availability, Backend
from kermac.ir import Expr
from kermac.ir_eval import evaluate
from kermac.problem import GradProblem, PairwiseProblem, ProductGradProblem, ProductProblem, compute_dtype
from kermac.programs import epilogue_slope, inner_slope
from kermac.reductions import ALL, term_weights

__all__ = ["CHUNK_ELEMENTS", "REDUCE", "ReferenceBackend", "blocks", "hyper_env", "tile"]

CHUNK_ELEMENTS = 1 << 22
"""Upper bound on the elements of one evaluated block (~16 MB in float32)."""

REDUCE = {name: r.reference for name, r in ALL.items()}
"""The reductions as torch functions `f(terms, dim)` ([`kermac.reductions`][kermac.reductions]: NaN-propagating
maximum and minimum, as the IR defines them; `torch.logsumexp`)."""


def _pairs_shape(*tensors: torch.Tensor) -> torch.Size:
    """The broadcast shape of a block's tensors `[..., bm, bn, D]` (a term may not read both operands)."""
    return torch.broadcast_shapes(*(t.shape for t in tensors))


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

    def check_general_grad(self, problem: GradProblem) -> str | None:
        return None

    def check_product(self, problem: ProductProblem) -> str | None:
        return None

    def check_product_grad(self, problem: ProductGradProblem) -> str | None:
        return None

    def pairwise(self, problem: PairwiseProblem) -> None:
        block = _KernelBlocks(problem)
        bm, bn = block.tile()
        for m0, m1 in blocks(problem.m, bm):
            for n0, n1 in blocks(problem.n, bn):
                problem.out[..., m0:m1, n0:n1].copy_(block(m0, m1, n0, n1))

    def product(self, problem: ProductProblem) -> None:
        m, n, _, c = problem.sizes
        block = _KernelBlocks(problem)
        bm, bn = block.tile()
        for m0, m1 in blocks(m, bm):
            acc = torch.zeros(problem.batch_shape + (m1 - m0, c), dtype=block.cdtype, device=problem.device)
            for n0, n1 in blocks(n, bn):
                acc += block(m0, m1, n0, n1) @ problem.v[..., n0:n1, :].to(block.cdtype)
            problem.out[..., m0:m1, :].copy_(acc)

    def product_grad(self, problem: ProductGradProblem) -> None:
        m, n, d, _ = problem.sizes
        block = _KernelBlocks(problem)
        prog, cdtype, like = problem.program, block.cdtype, block.like
        slope, dinner = epilogue_slope(prog), inner_slope(prog)
        weighted = not ALL[prog.reduction].sum_fast_paths  # a sum weighs every term by 1
        # Per pair: the terms, or their derivative, its product with e' and a bool mask (D each; where weighted
        # also the terms again, their weights, the weighted product and the wider mask); acc, e', G, diag.
        per_pair = (7 if weighted else 3) * max(d, 1) + 4
        bm, bn = tile(m, n, math.prod(problem.batch_shape) * per_pair)
        for m0, m1 in blocks(m, bm):
            acc = torch.zeros(problem.batch_shape + (m1 - m0, d), dtype=cdtype, device=problem.device)
            gs = problem.g[..., m0:m1, :].to(cdtype)
            for n0, n1 in blocks(n, bn):
                xs = problem.x[..., m0:m1, None, :].to(cdtype)
                zs = problem.z[..., None, n0:n1, :].to(cdtype)
                env = {"x": xs, "z": zs, **block.inner_env}
                dtau = evaluate(dinner, env, like=like)
                # e'·w·∂τ/∂x, 0 where the inner term is flat or its weight w = ∂acc/∂τ_j is 0, also where e' is
                # infinite there (acc = 0 at x_m = z_n); G multiplies it afterwards, so a NaN in g or v still
                # propagates
                slopes = block.epilogue(m0, m1, n0, n1, slope)[..., None] * dtau
                flat = dtau == 0
                if weighted:
                    terms = evaluate(prog.inner, env, like=like)
                    weights = term_weights(prog.reduction, terms.expand(_pairs_shape(terms, xs, zs)))
                    slopes, flat = slopes * weights, flat | (weights == 0)
                slopes.masked_fill_(flat, 0.0)
                weight = gs @ problem.v[..., n0:n1, :].to(cdtype).mT  # G [*B, bm, bn]
                acc += (weight[..., :, None, :] @ slopes)[..., 0, :]
            problem.out[..., m0:m1, :].copy_(acc)

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

    def general_grad(self, problem: GradProblem) -> None:
        """A gradient program in the general form: `multiply` on blocks `[*B, n, m, k]`, `accumulate` on
        `[*B, O, n, m, k]`, each block of `k` reduced and combined with the value so far by the reduction."""
        prog, batch = problem.program, problem.batch_shape
        m, n, o, k = problem.sizes
        cdtype = compute_dtype(problem.dtype)
        like = torch.empty((), dtype=cdtype, device=problem.device)
        reduce = REDUCE[prog.reduction]
        term_env = hyper_env(dict(problem.hypers), cdtype, 3)  # [*B, n, m, k] and the epilogue's [*B, O, n, m]
        accumulate_env = hyper_env(dict(problem.hypers), cdtype, 4)  # [*B, O, n, m, k]
        bk = max(1, min(k, 64))
        bn, bm = tile(n, m, math.prod(batch) * (o + 1) * bk)
        for n0, n1 in blocks(n, bn):
            for m0, m1 in blocks(m, bm):
                shape = batch + (o, n1 - n0, m1 - m0)
                acc = torch.full(shape, prog.identity, dtype=cdtype, device=problem.device)
                for k0, k1 in blocks(k, bk):
                    env = {
                        "a": problem.a[..., None, k0:k1, m0:m1].to(cdtype).transpose(-1, -2),
                        "b": problem.b[..., n0:n1, None, k0:k1].to(cdtype),
                        "d": problem.d[..., n0:n1, m0:m1, None].to(cdtype),
                    }
                    term = evaluate(prog.multiply, {**env, **term_env}, like=like)
                    term = term.expand(batch + (n1 - n0, m1 - m0, k1 - k0))[..., None, :, :, :]  # [*B, 1, n, m, k]
                    c = problem.c[..., :, None, None, k0:k1].to(cdtype)
                    parts = evaluate(prog.accumulate, {"c": c, "term": term, **accumulate_env}, like=like)
                    parts = parts.expand(shape + (k1 - k0,))
                    acc = reduce(torch.stack((acc, reduce(parts, -1)), -1), -1)
                value = evaluate(prog.epilogue, {"acc": acc, **term_env}, like=like)
                problem.out[..., :, n0:n1, m0:m1].copy_(value.expand(shape))


class _KernelBlocks:
    """Blocks `K[..., m0:m1, n0:n1]` of the pairwise kernel of a pairwise or product problem, in the compute
    dtype and with the batch shape: what the pairwise pass writes and the product contracts with `v`."""

    def __init__(self, problem: PairwiseProblem | ProductProblem | ProductGradProblem) -> None:
        self.problem = problem
        self.cdtype = compute_dtype(problem.dtype)
        self.like = torch.empty((), dtype=self.cdtype, device=problem.device)
        self.inner_env = hyper_env(dict(problem.hypers), self.cdtype, 3)
        self.epi_env = hyper_env(dict(problem.hypers), self.cdtype, 2)
        self.reduce = REDUCE[problem.program.reduction]

    def tile(self) -> tuple[int, int]:
        """Rows × columns of a block whose evaluation stays near `CHUNK_ELEMENTS` elements."""
        pr = self.problem
        return tile(pr.x.shape[-2], pr.z.shape[-2], math.prod(pr.batch_shape) * max(pr.x.shape[-1], 1))

    def __call__(self, m0: int, m1: int, n0: int, n1: int) -> torch.Tensor:
        return self.epilogue(m0, m1, n0, n1, self.problem.program.epilogue)

    def epilogue(self, m0: int, m1: int, n0: int, n1: int, expr: Expr) -> torch.Tensor:
        """`expr` (an expression in `acc`, `diag` and the hyperparameters: the epilogue or its derivative) on the
        block's `acc`."""
        pr, prog, device = self.problem, self.problem.program, self.problem.device
        d = pr.x.shape[-1]
        shape = pr.batch_shape + (m1 - m0, n1 - n0)
        if d == 0:
            acc = torch.full(shape, ALL[prog.reduction].identity, dtype=self.cdtype, device=device)
        else:
            xs = pr.x[..., m0:m1, None, :].to(self.cdtype)
            zs = pr.z[..., None, n0:n1, :].to(self.cdtype)
            terms = evaluate(prog.inner, {"x": xs, "z": zs, **self.inner_env}, like=self.like)
            acc = self.reduce(terms.expand(shape + (d,)), dim=-1)
        rows = torch.arange(m0, m1, device=device) + pr.offset_m
        cols = torch.arange(n0, n1, device=device) + pr.offset_n
        diag = (rows[:, None] == cols[None, :]).to(self.cdtype)
        value = evaluate(expr, {"acc": acc, "diag": diag, **self.epi_env}, like=self.like)
        return value.expand(shape)
