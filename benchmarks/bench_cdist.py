"""``kermac.cdist`` (float32, preallocated ``out``; p = 1, 2 and 1.5) per registered backend, beside ``torch.cdist``.

Cases: ``benchmarks._harness.cases("cdist")`` -- tiny on the CPU, the peer table's sizes, the
host-bound small problems, the few-feature distances (D ≤ 16, bound by writing the output) and float16/bfloat16
distances on a GPU.
"""

from __future__ import annotations

from ._harness import OpSuite, cases, implementations


class CDist(OpSuite):
    op = "cdist"
    baseline = "torch.cdist"
    params = (implementations(baseline), list(cases(op)))
    param_names = ["implementation", "case"]

    def time_cdist(self, impl: str, label: str) -> None:
        self.run()
