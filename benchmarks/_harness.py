"""What the asv suites share: the cases, the implementations compared, and set-up/timing.

Each suite is parameterised by implementation -- a kermac backend (``torch``, ``nvrtc``,
``triton``) or PyTorch's own way of computing the same result (its own row, named after it) --
and by case: with a CUDA GPU, every row of the peer table for the operation
(:data:`kermac.benchmarking.PEERS_CASES`) and the small problems whose time is each call's host work
(:data:`kermac.benchmarking.SMALL_CASES`); without one, the small CPU cases
(:data:`kermac.benchmarking.CPU_CASES`).  An implementation that cannot run a case here (backend
unavailable or unsupported problem, no PyTorch equivalent) raises ``NotImplementedError`` in
``setup``, which asv reports as n/a.

``setup`` builds the inputs and a preallocated ``out`` and makes one untimed call (JIT
compilation happens there); the timed call synchronises the device, so asv's wall-clock timer
measures the kernel.  Inputs are rotated among several sets when one set would stay L2-resident.
"""

from __future__ import annotations

import torch

import kermac
from kermac import benchmarking as bm
from kermac.errors import BackendError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERMAC_BACKENDS = ("torch", "nvrtc", "triton")


def cases(op: str) -> dict[str, bm.BenchCase]:
    """The cases of ``op`` for this machine, by label (asv parameters must be plain values)."""
    chosen = (*bm.PEERS_CASES, *bm.SMALL_CASES) if DEVICE == "cuda" else bm.CPU_CASES
    return {c.label: c.on(DEVICE) for c in chosen if c.op == op}


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class OpSuite:
    """Base of the suites: subclasses set ``op`` and ``baseline``, and call :meth:`run` in a ``time_`` method."""

    op: str
    baseline: str  # the row name of PyTorch's own implementation
    # A call can take seconds (torch.cdist on 30000² rows); warm-up and JIT happen in setup.
    number = 0
    repeat = (3, 10, 20.0)
    warmup_time = 0.0
    timeout = 600.0

    def setup(self, impl: str, label: str) -> None:
        case = cases(self.op)[label]
        if impl == self.baseline:
            fn = bm.torch_fn(case)
            if fn is None:
                raise NotImplementedError(f"PyTorch has no memory-bounded way to compute {label}")
        else:
            status = {s.name: s for s in kermac.backends()}.get(impl)
            if status is None or not status.available:
                raise NotImplementedError(
                    f"backend {impl!r} unavailable: {status.reason if status else 'not installed'}"
                )
            out = case.make_out()
            kfn = bm.kermac_fn(case, impl)

            def fn(*inputs: torch.Tensor) -> torch.Tensor:
                return kfn(*inputs, out)

        self._fn = fn
        self._sets = bm.input_sets(case)
        self._next = 0
        try:
            fn(*self._sets[0])
        except BackendError as exc:  # e.g. the backend does not support this problem
            raise NotImplementedError(str(exc)) from exc
        _sync()

    def run(self) -> None:
        """One call on the next input set, then wait for the device."""
        self._fn(*self._sets[self._next % len(self._sets)])
        self._next += 1
        _sync()

    def teardown(self, impl: str, label: str) -> None:
        self._fn = self._sets = None
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
