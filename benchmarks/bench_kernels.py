"""Fused kernel matrices ``kermac.run_kernel`` (Laplace on L1/L2) per backend, beside ``torch.cdist`` then ``exp``.

Cases: the fused-kernel rows of the peer table (``kermac.benchmarking.PEERS_CASES``) and the host-bound small
problems on a GPU, small CPU cases otherwise.
"""

from __future__ import annotations

from ._harness import KERMAC_BACKENDS, OpSuite, cases


class Kernels(OpSuite):
    op = "kernel"
    baseline = "torch.cdist+exp"
    params = ([baseline, *KERMAC_BACKENDS], list(cases(op)))
    param_names = ["implementation", "case"]

    def time_run_kernel(self, impl: str, label: str) -> None:
        self.run()
