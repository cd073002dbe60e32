"""The common problems whose kernels `kermac precompile` compiles ahead of time.

Every distance of [`kermac.cdist`][kermac.cdist] (p in {0, 1, 2, ∞}, a fractional p as a number and as a
per-batch tensor, with and without `skip_epilogue`), every preset of [`kermac.presets`][kermac.presets]
(with and without regularisation), and [`kermac.cdist_grad`][kermac.cdist_grad] for p in {1, 2} and a fractional
p, on contiguous, aligned operands — the layout most calls have.  The fractional p is 1.3, not a
multiple of 1/2: a backend may compile such exponents into kernels of their own (the NVRTC
backend's square-root powers), while the kernel for 1.3 serves every other p.  Problems can be
built on the `meta` device, so no GPU is needed to describe them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kermac import presets
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program, grad_program
from kermac.problem import GradProblem, PairwiseProblem, grad_problem, pairwise_problem

__all__ = ["common_problems"]

M = N = D = 256
"""Sizes of the representative operands: multiples of every tile size, so vector loads apply."""
GRAD_SIZES = {"m": 256, "n": 64, "o": 16, "k": 256}
FRACTIONAL_P = 1.3
"""The fractional p of the common problems (see the module documentation)."""


def _hypers(names: Sequence[str], device: torch.device) -> dict[str, HyperValue]:
    values = {"p": FRACTIONAL_P, "bandwidth": 1.0, "regularization": 1e-3}
    return {n: HyperValue(n, values[n]) for n in names}


def common_problems(
    device: torch.device | str = "meta", dtypes: Sequence[torch.dtype] = (torch.float32,)
) -> list[PairwiseProblem | GradProblem]:
    """The problems listed in the module documentation, for each dtype, on `device`."""
    device = torch.device(device)
    problems: list[PairwiseProblem | GradProblem] = []
    for dtype in dtypes:
        x = torch.empty(M, D, dtype=dtype, device=device)
        z = torch.empty(N, D, dtype=dtype, device=device)
        ps = (0.0, 1.0, 2.0, FRACTIONAL_P, math.inf)
        programs = [cdist_program(p, skip_epilogue=s, dtype=dtype) for p in ps for s in (False, True)]
        for program in dict.fromkeys(programs):  # unique, in order
            problems.append(pairwise_problem(program, x, z, out=None, hypers=_hypers(program.hypers, device)))
        p_batch = torch.empty(2, dtype=dtype, device=device)
        per_batch = {"p": HyperValue("p", None, p_batch)}
        problems.append(pairwise_problem(cdist_program(None, dtype=dtype), x, z, out=None, hypers=per_batch))
        for descriptor in presets.ALL.values():
            for regularized in (False, True):
                program = descriptor.lower(regularized=regularized)
                problems.append(pairwise_problem(program, x, z, out=None, hypers=_hypers(program.hypers, device)))
        s = GRAD_SIZES
        a = torch.empty(s["k"], s["m"], dtype=dtype, device=device)
        b = torch.empty(s["n"], s["k"], dtype=dtype, device=device)
        c = torch.empty(s["o"], s["k"], dtype=dtype, device=device)
        d = torch.empty(s["n"], s["m"], dtype=dtype, device=device)
        for p in (1.0, 2.0, FRACTIONAL_P):
            program = grad_program(p)
            problems.append(grad_problem(program, a, b, c, d, out=None, hypers=_hypers(program.hypers, device)))
    return problems
