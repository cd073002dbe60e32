"""``kermac.linalg`` (cuSOLVER, batched over streams) beside ``torch.linalg``: the linalg rows of the peer table.

Cases (float32, A symmetric positive definite ``G Gᵀ/N + I`` from ``torch.randn``, 16 right-hand
sides): Cholesky solve and LU solve of a batch of 8 × 2048 and of one 16384 matrix, eigh of 8 × 2048
and of 8192, and the top 64 eigenpairs of a 16384 Laplace kernel matrix (``eigh_range(top_k=64)``
against a full ``torch.linalg.eigh``). Without a GPU the same operations run at small sizes.

Two entry points:

* asv: the ``Linalg`` suite, parameterised by implementation and case (see ``asv.conf.json``);
* ``python -m benchmarks.bench_linalg [--json PATH] [--quick]``: a markdown table of medians of
  CUDA-event timings (after warm-up), relative residuals, both ways of issuing batches
  (``KERMAC_LINALG_DISPATCH``), whether each cuSOLVER routine blocks the host, and workspaces.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

try:
    import kermac_linalg as kl
except ImportError as exc:  # kermac-linalg is a package of its own: without it the suite is n/a, not an error
    kl = None
    MISSING = f"kermac-linalg is not installed ({exc})"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Case:
    """One linalg row of the peer table: operation, batch, N, right-hand sides, repeats, published timings (ms)."""

    label: str
    op: str  # cholesky_solve | solve | eigh | top_k
    batch: int
    n: int
    k: int = 16
    repeat: int = 10
    peers_torch: float | None = None
    peers_kermac: float | None = None
    target: str = ""


GPU_CASES = [
    Case(
        "Cholesky solve, batch 8 x 2048",
        "cholesky_solve",
        8,
        2048,
        peers_torch=11.45,
        peers_kermac=4.84,
        target="<= 4.8",
    ),
    Case("LU solve, batch 8 x 2048", "solve", 8, 2048, peers_torch=60.5, peers_kermac=15.5, target="<= 15"),
    Case(
        "Cholesky solve, 16384",
        "cholesky_solve",
        1,
        16384,
        repeat=5,
        peers_torch=57.3,
        peers_kermac=52.8,
        target="<= 53",
    ),
    Case("eigh, batch 8 x 2048", "eigh", 8, 2048, repeat=3, peers_torch=207, peers_kermac=206, target="<= 206"),
    Case("eigh, 8192", "eigh", 1, 8192, repeat=3, peers_torch=535, peers_kermac=536, target="<= 536"),
    Case(
        "top-64 eigenpairs of a 16384 kernel matrix",
        "top_k",
        1,
        16384,
        k=64,
        repeat=2,
        target=">= 3x faster than full eigh",
    ),
]
CPU_CASES = [
    Case("Cholesky solve, batch 4 x 64", "cholesky_solve", 4, 64, k=4),
    Case("LU solve, batch 4 x 64", "solve", 4, 64, k=4),
    Case("eigh, batch 4 x 64", "eigh", 4, 64, repeat=3),
    Case("top-8 eigenpairs of a 256 kernel matrix", "top_k", 1, 256, k=8, repeat=3),
]
CASES = {c.label: c for c in (GPU_CASES if DEVICE == "cuda" else CPU_CASES)}


def make_inputs(case: Case, device: str = DEVICE) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A ``[batch, N, N]`` (batch 1 is dropped) and B ``[batch, N, K]`` (None for eigensolvers)."""
    g = torch.Generator(device=device).manual_seed(0)
    shape = (case.batch,) if case.batch > 1 else ()
    if case.op == "top_k":
        x = torch.randn(case.n, 32, device=device, generator=g)
        return torch.exp(-torch.cdist(x, x) / 8.0), None
    G = torch.randn(*shape, case.n, case.n, device=device, generator=g)
    A = G @ G.mT / case.n + torch.eye(case.n, device=device)
    B = (
        torch.randn(*shape, case.n, case.k, device=device, generator=g)
        if case.op in ("cholesky_solve", "solve")
        else None
    )
    return A, B


def _in_place(solver: Callable, A: torch.Tensor, column_major: bool) -> Callable:
    """``solver(work, B, overwrite_a=True)`` after a plain copy of A into a buffer of that layout.

    Times cuSOLVER on its own layout (column-major) against torch's (row-major), the copy
    included in both.
    """
    source = A.mT.contiguous().mT if column_major else A.contiguous()
    work = torch.empty_like(source)

    def run(_A: torch.Tensor, B: torch.Tensor) -> tuple:
        work.copy_(source)
        return solver(work, B, overwrite_a=True)

    return run


def implementations(case: Case, A: torch.Tensor) -> dict[str, Callable[[torch.Tensor, torch.Tensor | None], tuple]]:
    """What is timed, by row name: kermac.linalg and torch.linalg computing the same result."""
    if case.op in ("cholesky_solve", "solve"):
        solver = getattr(kl, case.op)
        torch_fn = (
            (lambda A, B: (torch.cholesky_solve(B, torch.linalg.cholesky(A)),))
            if case.op == "cholesky_solve"
            else (lambda A, B: (torch.linalg.solve(A, B),))
        )
        return {
            "kermac": solver,
            "kermac in place, column-major A": _in_place(solver, A, True),
            "kermac in place, row-major A": _in_place(solver, A, False),
            "torch": torch_fn,
        }
    if case.op == "eigh":
        return {"kermac": lambda A, B: kl.eigh(A), "torch": lambda A, B: torch.linalg.eigh(A)}
    return {
        "kermac eigh_range": lambda A, B: kl.eigh_range(A, top_k=case.k),
        "kermac eigh_range direct (xsyevdx)": lambda A, B: kl.eigh_range(A, top_k=case.k, method="direct"),
        "kermac eigh (all)": lambda A, B: kl.eigh(A),
        "torch eigh (all)": lambda A, B: torch.linalg.eigh(A),
    }


def residual(case: Case, A: torch.Tensor, B: torch.Tensor | None, result: tuple) -> float:
    """Relative residual in float64: ‖AX − B‖/(‖A‖‖X‖) or ‖AV − VΛ‖/‖A‖ (top k pairs only)."""
    A64 = A.double()
    if case.op in ("cholesky_solve", "solve"):
        X = result[0].double()
        return ((A64 @ X - B.double()).norm() / (A64.norm() * X.norm())).item()
    W, V = result[0].double(), result[1].double()
    if case.op == "top_k":
        W, V = W[..., -case.k :], V[..., -case.k :]
    return ((A64 @ V - V * W[..., None, :]).norm() / A64.norm()).item()


def _time_ms(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Median of ``repeat`` timings (CUDA events on the current stream; wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


class Linalg:
    """asv suite: one call per timing on preallocated inputs, synchronised."""

    params = (["kermac", "torch"], list(CASES))
    param_names = ["implementation", "case"]
    number = 0
    repeat = (2, 10, 30.0)
    warmup_time = 0.0
    timeout = 900.0
    version = "1"  # kept results stay comparable across edits of this file (as in _harness.OpSuite)

    def setup(self, impl: str, label: str) -> None:
        if kl is None:
            raise NotImplementedError(MISSING)
        case = CASES[label]
        self._A, self._B = make_inputs(case)
        fns = implementations(case, self._A)
        name = impl if impl in fns else next(k for k in fns if k.startswith(impl))
        self._fn = fns[name]
        self._fn(self._A, self._B)
        self._sync()

    def _sync(self) -> None:
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    def time_linalg(self, impl: str, label: str) -> None:
        self._fn(self._A, self._B)
        self._sync()

    def teardown(self, impl: str, label: str) -> None:
        self._A = self._B = self._fn = None
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def host_ms(case: Case) -> dict[str, float]:
    """Host milliseconds of one call queued behind ~0.5 s of GPU sleep, per dispatch mode.

    About the time to queue the work if the routines are asynchronous; the sleep and the work
    itself where they wait for their stream.
    """
    A, B = make_inputs(case)
    calls = {
        "potrf+potrs (cholesky_solve)": lambda: kl.cholesky_solve(A, B),
        "getrf+getrs (solve)": lambda: kl.solve(A, B),
        "syevd (eigh)": lambda: kl.eigh(A),
        "syevdx index range (eigh_range method=direct)": lambda: kl.eigh_range(A, top_k=8, method="direct"),
        "syevdx value range (eigh_range vl)": lambda: kl.eigh_range(A, vl=1.5),
    }
    out = {}
    for mode in ("threads", "streams"):
        os.environ["KERMAC_LINALG_DISPATCH"] = mode
        for name, call in calls.items():
            call()
            torch.cuda.synchronize()
            torch.cuda._sleep(800_000_000)
            t0 = time.perf_counter()
            call()
            out[f"{name} [{mode}]"] = 1e3 * (time.perf_counter() - t0)
            torch.cuda.synchronize()
    os.environ.pop("KERMAC_LINALG_DISPATCH", None)
    return out


def measure(case: Case, quick: bool = False) -> dict:
    """One table row: each implementation's median time and residual (batches: both dispatch modes)."""
    A, B = make_inputs(case)
    repeat = 1 if quick else case.repeat
    modes = ["auto", "streams"] if case.batch > 1 and DEVICE == "cuda" else ["auto"]
    row = {
        "case": case.label,
        "peers_torch": case.peers_torch,
        "peers_kermac": case.peers_kermac,
        "target": case.target,
    }
    for name, fn in implementations(case, A).items():
        for mode in modes if name == "kermac" else ["auto"]:
            os.environ["KERMAC_LINALG_DISPATCH"] = mode
            key = name if mode == "auto" else f"{name} [{mode}]"
            row[f"{key} residual"] = residual(case, A, B, fn(A, B))
            row[f"{key} ms"] = _time_ms(lambda fn=fn: fn(A, B), repeat)
        os.environ.pop("KERMAC_LINALG_DISPATCH", None)
    if DEVICE == "cuda":
        op = {"top_k": "eigh_range"}.get(case.op, case.op)
        row["workspace"] = kl.workspace_size(op, A, **({"top_k": case.k} if op == "eigh_range" else {})).__dict__
    return row


def run_table(quick: bool = False) -> dict:
    """Time every case; return the rows and, on a GPU, which cuSOLVER routines block the host."""
    rows = []
    for case in CASES.values():
        rows.append(measure(case, quick))
        print(json.dumps(rows[-1]), flush=True)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    info = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "max_streams": kl.max_streams(),
        "rows": rows,
    }
    if DEVICE == "cuda":
        info["host_ms"] = host_ms(Case("host time", "cholesky_solve", 8, 2048))
    return info


def markdown(info: dict) -> str:
    clock = "CUDA-event" if info["device"] != "cpu" else "wall-clock"
    lines = [f"{info['device']}, torch {info['torch']}, {info['date']}; medians of {clock} timings (ms)", ""]
    lines += [
        "| case | torch.linalg | kermac.linalg | PEERS torch | PEERS kermac | target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in info["rows"]:
        torch_ms = row.get("torch ms", row.get("torch eigh (all) ms"))
        kermac_ms = row.get("kermac ms", row.get("kermac eigh_range ms"))
        lines.append(
            f"| {row['case']} | {torch_ms:.2f} | {kermac_ms:.2f} | {row['peers_torch'] or '-'} | "
            f"{row['peers_kermac'] or '-'} | {row['target']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write all measurements to this file")
    parser.add_argument("--quick", action="store_true", help="one timed repeat per case")
    args = parser.parse_args()
    if kl is None:
        parser.error(MISSING)
    info = run_table(quick=args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)
    print(markdown(info))
    if "host_ms" in info:
        print("\nhost ms per call (8 x 2048) queued behind 0.5 s of GPU work:", json.dumps(info["host_ms"], indent=1))


if __name__ == "__main__":
    main()
