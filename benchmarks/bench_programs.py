"""A user program through ``kermac.run_program`` per registered backend, beside the same arithmetic in PyTorch.

The program is :func:`kermac.benchmarking.user_program` (the Cauchy kernel ``1/(1 + γ‖x−z‖₂²)``
written in the IR as a user would); PyTorch's row is ``torch.cdist`` followed by that arithmetic in
place.  Cases: ``benchmarks._harness.cases("program")`` -- tiny on the CPU, the peer table's cdist
size on a GPU.
"""

from __future__ import annotations

from ._harness import OpSuite, cases, implementations


class Programs(OpSuite):
    op = "program"
    baseline = "torch.cdist+cauchy"
    params = (implementations(baseline), list(cases(op)))
    param_names = ["implementation", "case"]

    def time_run_program(self, impl: str, label: str) -> None:
        self.run()
