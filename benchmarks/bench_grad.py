"""The gradient contraction ``kermac.cdist_grad`` per backend, beside PyTorch's matrix products (p = 2 only).

Cases: the cdist_grad rows of the peer table (``kermac.benchmarking.PEERS_CASES``) and the host-bound small
problems on a GPU, small CPU cases otherwise.
"""

from __future__ import annotations

from ._harness import KERMAC_BACKENDS, OpSuite, cases


class CDistGrad(OpSuite):
    op = "grad"
    baseline = "torch.matmul"
    params = ([baseline, *KERMAC_BACKENDS], list(cases(op)))
    param_names = ["implementation", "case"]

    def time_cdist_grad(self, impl: str, label: str) -> None:
        self.run()
