"""The "fit" section of `kermac bench` (`--fit`): the time each solver takes to a relative residual.

For each N of the section it builds the Gaussian kernel operator of `x = randn(N, 32)` (bandwidth √32 ≈ the
typical distance of its rows over √2, regularisation λ = `--fit-lambda`) and the target
`y = sin(x u) + 0.1·noise` for a fixed unit vector `u` — on a GPU a float32 operator with float64 `y` (mixed
precision: float32 kernels, residuals and `α` in float64, see [`kermac.solvers`][kermac.solvers]), on the CPU
float64 throughout — and solves `(K + λI) α = y` with [`kermac.solvers.solve`][kermac.solvers.solve]:

* `cholesky`, where the dense matrix fits ([`dense_fits`][kermac.solvers.dense_fits]; otherwise an n/a row);
* `cg` without a preconditioner;
* `cg` with the Nyström preconditioner (its default rank, `max(100, ⌈√N⌉)` inducing points);
* `cg` with the EigenPro preconditioner (the same rank, its default subsample of twice as many points),

each to the relative residual `--fit-tol`, with at most `MAX_ITER` iterations. Before each row an untimed solve
of the same system with the same solver (CG stopped after one iteration; `cholesky` whole) compiles the kernels of
every shape the row uses and initialises the libraries it calls (cuSOLVER, cuBLAS): costs of a process's first
call, not of a fit.
Each row is then one timed solve, from a synchronised device to a synchronised device, including the
preconditioner's set-up. The row gives the time, the iterations
(the most over the columns; 0 for `cholesky`), the residual recomputed from `α` and whether it is at most the
tol (also for `cholesky`, whose float32 factorisation need not reach it).
A solve that raises is a row with its error and makes the exit code 1; a tol not reached is a measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass

import torch

import kermac
from kermac import solvers
from kermac.cli._bench_common import describe, header, title
from kermac.cli._format import render_table

__all__ = ["FEATURES", "MAX_ITER", "FitRow", "default_sizes", "run"]

FEATURES = 32
MAX_ITER = 1000
SOLVERS: tuple[tuple[str, str | None], ...] = (
    ("cholesky", None), ("cg", None), ("cg", "nystrom"), ("cg", "eigenpro"),
)  # fmt: skip
"""The rows of each N: (method, preconditioner)."""


@dataclass
class FitRow:
    """One solver on one N: its time, iterations, residual and whether it reached the tol, or why it has none."""

    n: int
    method: str
    preconditioner: str | None
    ms: float | None = None
    iterations: int | None = None
    residual: float | None = None
    reached: bool | None = None
    why: str | None = None
    error: str | None = None


K_DTYPE = {"cuda": "float32", "cpu": "float64"}
"""The operator's dtype on each device type (y is float64 on both)."""


def default_sizes(device: torch.device) -> list[int]:
    """The N of the section when `--fit` names none: 20 000 and 100 000 on a GPU, 300 and 1 000 on the CPU."""
    return [20_000, 100_000] if device.type == "cuda" else [300, 1_000]


def _problem(n: int, lam: float, device: torch.device) -> tuple[kermac.KernelOperator, torch.Tensor]:
    dtype = getattr(torch, K_DTYPE[device.type])
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, FEATURES, generator=gen, dtype=torch.float64)
    u = torch.randn(FEATURES, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(x @ (u / u.norm())) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    x, y = x.to(device, dtype), y.to(device)  # y stays float64: mixed precision on a GPU
    K = kermac.KernelOperator("gaussian", x, x, bandwidth=math.sqrt(FEATURES), regularization=lam)
    return K, y


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _solve_row(
    K: kermac.KernelOperator, y: torch.Tensor, method: str, preconditioner: str | None, tol: float
) -> FitRow:
    n, device = K.shape[-1], K.device
    row = FitRow(n, method, preconditioner)
    if method == "cholesky" and not solvers.dense_fits(n, 1, y.dtype, device):
        row.why = f"the dense {n}x{n} matrix does not fit (kermac.solvers.dense_fits)"
        return row
    try:
        solvers.solve(K, y, method=method, preconditioner=preconditioner, tol=tol, max_iter=1)  # warm-up
        _sync(device)
        start = time.perf_counter()
        s = solvers.solve(K, y, method=method, preconditioner=preconditioner, tol=tol, max_iter=MAX_ITER)
        _sync(device)
        row.ms = (time.perf_counter() - start) * 1e3
    except Exception as exc:  # a row of the report, not a crash of the section
        row.error = describe(exc)
        return row
    row.iterations, row.residual = int(s.iterations.max()), float(s.residual.max())
    row.reached = row.residual <= tol  # not `converged`: for cholesky that says the factorisation succeeded
    return row


def run(args: argparse.Namespace, device: torch.device) -> int:
    """Run the section with the options of `args`; print the table (or JSON); return the exit code."""
    sizes = args.fit or default_sizes(device)
    rows = []
    for n in sizes:
        K, y = _problem(n, args.fit_lambda, device)  # one system per N, solved by every solver
        for method, preconditioner in SOLVERS:
            print(f"kermac bench --fit: N={n} {method} {preconditioner or ''}".rstrip(), file=sys.stderr)
            rows.append(_solve_row(K, y, method, preconditioner, args.fit_tol))
    head = {
        **header(device, 1, 1, None),
        "section": "fit",
        "kernel": "gaussian",
        "features": FEATURES,
        "lambda": args.fit_lambda,
        "tol": args.fit_tol,
        "precision": f"{K_DTYPE[device.type]} kernels, float64 y",
        "max_iter": MAX_ITER,
    }
    if args.json:
        print(json.dumps({"header": head, "rows": [vars(r) for r in rows]}, indent=2))
    else:
        print(_report(head, rows))
    return 1 if any(r.error for r in rows) else 0


def _report(head: dict[str, object], rows: list[FitRow]) -> str:
    lines = title("kermac bench --fit", head)
    lines.append(
        f"(K + λI) α = y, Gaussian kernel, D = {head['features']}, λ = {head['lambda']}, {head['precision']}, to "
        f"relative residual {head['tol']} (at most {head['max_iter']} iterations); one timed solve per row, set-up "
        "included"
    )
    lines.append("")
    cells = []
    for r in rows:
        solver = r.method + (f" + {r.preconditioner}" if r.preconditioner else "")
        if r.ms is None:
            cells.append([str(r.n), solver, "n/a", "", "", r.error or r.why or ""])
            continue
        reached = "yes" if r.reached else "no"
        cells.append([str(r.n), solver, f"{r.ms:.1f}", str(r.iterations), f"{r.residual:.2e}", reached])
    lines.append(render_table(["N", "solver", "ms", "iterations", "residual", "reached tol"], cells, left=2))
    return "\n".join(lines)
