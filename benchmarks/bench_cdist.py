"""``kermac.cdist`` (float32, preallocated ``out``) per backend, beside ``torch.cdist``.

Cases: the cdist rows of the peer table (``kermac.benchmarking.PEERS_CASES``) and the host-bound small
problems on a GPU, small CPU cases otherwise.
"""

from __future__ import annotations

from ._harness import KERMAC_BACKENDS, OpSuite, cases


class CDist(OpSuite):
    op = "cdist"
    baseline = "torch.cdist"
    params = ([baseline, *KERMAC_BACKENDS], list(cases(op)))
    param_names = ["implementation", "case"]

    def time_cdist(self, impl: str, label: str) -> None:
        self.run()
