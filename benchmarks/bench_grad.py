"""The gradient contraction ``kermac.cdist_grad`` (p = 1 and 2) per registered backend, beside PyTorch's
matrix products (p = 2 only: PyTorch has no memory-bounded way to compute other p).

Cases: ``benchmarks._harness.cases("grad")`` -- tiny on the CPU, the peer table's sizes, the
host-bound small problems and the p = 2 gradient of one output on a GPU.
"""

from __future__ import annotations

from ._harness import OpSuite, cases, implementations


class CDistGrad(OpSuite):
    op = "grad"
    baseline = "torch.matmul"
    params = (implementations(baseline), list(cases(op)))
    param_names = ["implementation", "case"]

    def time_cdist_grad(self, impl: str, label: str) -> None:
        self.run()
