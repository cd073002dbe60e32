"""The fused kernel product ``kermac.kernel_product`` (``K(x, x) @ v``, float32) per registered backend, beside
the blocked route a user writes without it (``run_kernel`` of a block of rows into a preallocated buffer,
then ``torch.matmul``, block after block).

Cases: on a GPU the Gaussian and Laplace-L1 kernels with N = 100,000 points, D = 3 and 32 features, and
v of 1 and 16 columns (the matrix-free products' speed table); on the CPU N = 96, D = 5, C = 3.  A
revision without ``kernel_product`` (the performance history's older commits) shows n/a.
"""

from __future__ import annotations

import math

import torch

import kermac

from ._harness import DEVICE, implementations, refusal, sync

BLOCKED = "run_kernel+matmul blocked"
BLOCK_ROWS = 16384
SIZES = [(100_000, d, c) for d in (3, 32) for c in (1, 16)] if DEVICE == "cuda" else [(96, 5, 3)]
KERNELS = {"gaussian": 2.0, "laplace_l1": 1.0}  # preset: the p of its distance


def _label(kernel: str, n: int, d: int, c: int) -> str:
    return f"{kernel} N={n} D={d} C={c}"


CASES = {_label(k, n, d, c): (k, p, n, d, c) for k, p in KERNELS.items() for n, d, c in SIZES}


class Products:
    params = (implementations(BLOCKED), list(CASES))
    param_names = ["implementation", "case"]
    number = 0
    repeat = (3, 10, 20.0)
    warmup_time = 0.0
    timeout = 600.0
    version = "1"  # kept results stay comparable across edits of this file (as in _harness.OpSuite)

    def setup(self, impl: str, label: str) -> None:
        if not hasattr(kermac, "kernel_product"):
            raise NotImplementedError("this revision of kermac has no kernel_product")
        kernel, p, n, d, c = CASES[label]
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        x = torch.randn(n, d, device=DEVICE, generator=gen)
        v = torch.randn(n, c, device=DEVICE, generator=gen)
        out = torch.empty(n, c, device=DEVICE)
        sigma = math.sqrt(2.0) * d ** (1.0 / p)  # the typical distance of randn rows keeps K's entries O(1)
        if impl == BLOCKED:
            buffer = torch.empty(min(BLOCK_ROWS, n), n, device=DEVICE)

            def run() -> None:
                for start in range(0, n, BLOCK_ROWS):
                    rows = min(BLOCK_ROWS, n - start)
                    k = kermac.run_kernel(kernel, x[start : start + rows], x, out=buffer[:rows], bandwidth=sigma)
                    torch.matmul(k, v, out=out[start : start + rows])

        else:
            why = refusal(impl)
            if why is not None:
                raise NotImplementedError(f"backend {impl!r} not timed here: {why}")

            def run() -> None:
                kermac.kernel_product(kernel, x, x, v, out=out, bandwidth=sigma, backend=impl)

        try:
            run()  # JIT compilation happens here, untimed
        except kermac.errors.BackendError as exc:  # a backend that does not compute products
            raise NotImplementedError(str(exc)) from exc
        sync()
        self._run, self._out = run, out

    def time_kernel_product(self, impl: str, label: str) -> None:
        self._run()
        sync()

    def teardown(self, impl: str, label: str) -> None:
        self._run = self._out = None
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
