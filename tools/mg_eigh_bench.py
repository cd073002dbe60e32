"""Multi-GPU eigh (cusolverMg) beside one-GPU eigh, on the GPU machine; a table last.

For each size: ``torch.linalg.eigh`` and ``kermac.linalg.eigh`` on cuda:0, then
``eigh_multi_gpu`` on 1..G devices (fresh process per call), each checked by its residual
‖AV − VΛ‖/‖A‖ and orthogonality.  Also the start-up cost of the isolated call (N = 256), the
workspace per device, and whether repeated in-process calls (``isolate=False``) stay correct.

    python tools/mg_eigh_bench.py [--sizes 8192,16384] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import kermac_linalg as kl

IN_PROCESS_CHECK = r"""
import torch, kermac_linalg as kl
for i in range(3):
    g = torch.Generator(device="cuda").manual_seed(i)
    G = torch.randn(512, 512, device="cuda", generator=g, dtype=torch.float64)
    A = (G + G.mT) / 2
    W, V, info = kl.eigh_multi_gpu(A, isolate=False, block_size=64)
    r = ((A @ V - V * W).norm() / A.norm()).item()
    print(f"in-process call {i}: info={int(info)} residual={r:.2e}", flush=True)
"""


def timed(fn, reps: int = 1) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best, out


def residual(A: torch.Tensor, W: torch.Tensor, V: torch.Tensor) -> str:
    A, W, V = A.double(), W.double(), V.double()
    r = ((A @ V - V * W).norm() / A.norm()).item()
    o = (V.mT @ V - torch.eye(A.shape[0], device=A.device, dtype=A.dtype)).norm().item() / A.shape[0] ** 0.5
    return f"res {r:.1e} orth {o:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8192,16384,32768")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    count = torch.cuda.device_count()
    rows: list[dict] = []
    print(f"{count} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)

    t, _ = timed(lambda: kl.eigh_multi_gpu(torch.eye(256, device="cuda", dtype=dtype)))
    print(f"isolated call start-up (N=256): {t:.2f} s", flush=True)
    rows.append({"case": "isolated N=256", "seconds": t})
    proc = subprocess.run([sys.executable, "-c", IN_PROCESS_CHECK], capture_output=True, text=True, timeout=120)
    print(proc.stdout + proc.stderr[-2000:], flush=True)

    for n in (int(s) for s in args.sizes.split(",")):
        g = torch.Generator(device="cuda").manual_seed(n)
        X = torch.randn(n, 64, device="cuda", dtype=dtype, generator=g)
        A = torch.exp(-torch.cdist(X, X) / 8.0)  # a kernel matrix
        cases = [("torch.linalg.eigh", lambda A=A: torch.linalg.eigh(A))]
        if n <= 16384:  # beyond, only the two that matter (each single-GPU run costs ~N^3)
            cases.append(("kermac eigh", lambda A=A: kl.eigh(A)[:2]))
        cases += [
            (f"eigh_multi_gpu x{k}", lambda A=A, k=k: kl.eigh_multi_gpu(A, devices=list(range(k)))[:2])
            for k in range(1, count + 1)
            if k == count or n <= 16384
        ]
        for name, fn in cases:
            t, (W, V) = timed(fn)
            check = residual(A, W, V) if n <= 16384 else ""
            print(f"N={n} {name}: {t:.3f} s {check}", flush=True)
            rows.append({"case": f"{name} N={n} {args.dtype}", "seconds": t, "check": check})
            del W, V
        ws = kl.eigh_multi_gpu_workspace(n, dtype=dtype)
        mib = 1 << 20
        print(
            f"N={n} workspace per device (x{count}): matrix {[m // mib for m in ws.matrix_bytes]} MiB, "
            f"cuSOLVER {ws.workspace_bytes // mib} MiB",
            flush=True,
        )
        del A, X
        torch.cuda.empty_cache()

    print("\n| case | s | check |\n|---|---:|---|")
    for r in rows:
        print(f"| {r['case']} | {r['seconds']:.3f} | {r.get('check', '')} |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "mg_eigh.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
