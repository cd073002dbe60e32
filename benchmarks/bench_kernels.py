"""Fused kernel matrices ``kermac.run_kernel`` per registered backend, beside ``torch.cdist`` then ``exp``.

Cases: ``benchmarks._harness.cases("kernel")`` -- the Laplace kernel on the L2 distance and the
Gaussian kernel with several bandwidths in one call (a tensor ``bandwidth``, ``out`` of
``[bandwidths, M, N]``); tiny on the CPU, the peer table's sizes (and its Laplace rows) and the
host-bound small problems on a GPU.
"""

from __future__ import annotations

from ._harness import OpSuite, cases, implementations


class Kernels(OpSuite):
    op = "kernel"
    baseline = "torch.cdist+exp"
    params = (implementations(baseline), list(cases(op)))
    param_names = ["implementation", "case"]

    def time_run_kernel(self, impl: str, label: str) -> None:
        self.run()
