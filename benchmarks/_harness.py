"""What the asv suites share: the cases, the implementations compared, and set-up/timing.

Each suite of a pairwise operation is parameterised by implementation -- every backend kermac's
registry knows (:func:`kermac.backends`: the built-in ones and any installed third-party plugin,
so a new backend shows up here without editing the suites) and PyTorch's own way of computing the
same result (its own row, named after it) -- and by case (:func:`cases`): tiny problems on the
CPU, and on a CUDA GPU the same operations at sizes of the peer table
(:data:`kermac.benchmarking.GPU_CASES`) plus the problems whose time is each call's host work
(:data:`kermac.benchmarking.SMALL_CASES`), the distances with few features, bound by writing their output
(:data:`kermac.benchmarking.FEW_FEATURE_CASES`), the p = 2 gradient of one output
(:data:`kermac.benchmarking.SINGLE_OUTPUT_GRADIENT_CASES`) and half-precision distances
(:data:`kermac.benchmarking.HALF_CASES`).

An implementation that cannot run a case here raises ``NotImplementedError`` in ``setup``, which
asv reports as n/a rather than as a failure: a backend that is unavailable, broken, opt-in (e.g.
Triton's CPU interpreter; :data:`OPT_IN_VARIABLE` names those to time anyway) or, on a GPU, the
float64 reference backend -- the same choice ``kermac bench`` makes by default
(:func:`kermac.cli.bench.default_backends`) --, a backend that
refuses the problem (:class:`kermac.errors.BackendError`), or no PyTorch equivalent.

``setup`` builds the inputs and a preallocated ``out`` and makes one untimed call (JIT
compilation happens there); the timed call synchronises the device, so asv's wall-clock timer
measures the kernel.  Inputs are rotated among several sets when one set would stay L2-resident.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

import kermac
from kermac import benchmarking as bm
from kermac.cli.bench import default_backends
from kermac.errors import BackendError
from kermac.registry import BackendStatus

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (M, N, D) of the pairwise cases and (M, N, O, K) of the gradient: tiny on the CPU (only the
# Python path and the reference backend run there), the peer table's sizes on a GPU.
PAIR_SIZES = (8192, 8192, 256) if DEVICE == "cuda" else (64, 48, 8)
GRAD_SIZES = (4096, 256, 16, 4096) if DEVICE == "cuda" else (64, 8, 2, 48)
BANDWIDTHS = 4
"""How many bandwidths the batched Gaussian case evaluates in one call."""


def _statuses() -> list[BackendStatus]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a broken plugin shows as n/a with its reason
        return kermac.backends()


def backend_names() -> list[str]:
    """Every backend name the registry reports, in its order (unavailable and broken ones too)."""
    return list(dict.fromkeys(s.name for s in _statuses()))


def implementations(baseline: str) -> list[str]:
    """A suite's ``implementation`` parameter: PyTorch's row ``baseline``, then every registered backend."""
    return [baseline, *backend_names()]


OPT_IN_VARIABLE = "KERMAC_ASV_BACKENDS"
"""Comma-separated backends to time although they are opt-in (negative priority), as
``kermac bench --backends`` names them; an unavailable or broken one stays n/a."""


def refusal(backend: str) -> str | None:
    """Why ``backend`` is not timed on this machine (``None`` when it is)."""
    statuses = _statuses()
    timed, skipped = default_backends(statuses, torch.device(DEVICE))
    if backend in timed:
        return None
    named = {n.strip() for n in os.environ.get(OPT_IN_VARIABLE, "").split(",")}
    if backend in named and any(s.name == backend and s.available and not s.broken for s in statuses):
        return None
    return skipped.get(backend, "not registered")


@dataclass(frozen=True)
class Case:
    """One row of a suite: a :class:`kermac.benchmarking.BenchCase`, and for a Gaussian kernel
    evaluated with several bandwidths in one call, how many (``out`` is then ``[bandwidths, M, N]``)."""

    base: bm.BenchCase
    bandwidths: int = 1

    @property
    def label(self) -> str:
        return self.base.label + (f" {self.bandwidths} bandwidths" if self.bandwidths > 1 else "")

    def sigmas(self) -> torch.Tensor:
        """``bandwidths`` values from σ/2 to 2σ around the case's σ, on its device."""
        sigma = self.base.bandwidth
        return torch.linspace(sigma / 2, 2 * sigma, self.bandwidths, device=self.base.device)

    def make_out(self) -> torch.Tensor:
        shape = (self.bandwidths, *self.base.out_shape) if self.bandwidths > 1 else self.base.out_shape
        return torch.empty(shape, device=self.base.device, dtype=self.base.torch_dtype)

    def kermac_fn(self, backend: str) -> Callable[..., torch.Tensor]:
        """``fn(*inputs, out)`` through ``backend``."""
        if self.bandwidths == 1:
            return bm.kermac_fn(self.base, backend)
        sigmas = self.sigmas()
        return lambda x, z, out: kermac.run_kernel("gaussian", x, z, out=out, bandwidth=sigmas, backend=backend)

    def torch_fn(self) -> Callable[..., torch.Tensor] | None:
        """``fn(*inputs)``: PyTorch's way (``None`` where it has no memory-bounded one)."""
        if self.bandwidths == 1:
            return bm.torch_fn(self.base)
        scale = (-0.5 / self.sigmas() ** 2)[:, None, None]
        return lambda x, z: torch.cdist(x, z).square_().mul(scale).exp_()


def _own_cases(op: str) -> list[Case]:
    """The operations every machine times, at this device's sizes."""
    if op == "cdist":
        return [Case(bm.BenchCase("cdist", PAIR_SIZES, p)) for p in (1.0, 2.0, 1.5)]
    if op == "kernel":
        laplace = bm.BenchCase("kernel", PAIR_SIZES, 2.0, "laplace")
        return [Case(laplace), Case(bm.BenchCase("kernel", PAIR_SIZES, 2.0, "gaussian"), BANDWIDTHS)]
    if op == "grad":
        return [Case(bm.BenchCase("grad", GRAD_SIZES, p)) for p in (1.0, 2.0)]
    if op == "program":
        try:
            return [Case(bm.BenchCase("program", PAIR_SIZES))]
        except ValueError:  # a revision older than user-program cases, timed by the performance history
            return []
    raise ValueError(f"op: expected cdist, kernel, grad or program, got {op!r}")


def cases(op: str) -> dict[str, Case]:
    """The cases of ``op`` on this machine, by label (asv parameters must be plain values)."""
    chosen = _own_cases(op)
    if DEVICE == "cuda":
        small = getattr(bm, "SMALL_CASES", ())  # absent from revisions older than the host-time rows
        few = getattr(bm, "FEW_FEATURE_CASES", ())  # and from those older than the few-feature rows
        few_grad = getattr(bm, "FEW_FEATURE_GRADIENT_CASES", ())  # or the few-feature gradient rows
        single = getattr(bm, "SINGLE_OUTPUT_GRADIENT_CASES", ())  # or the single-output gradient rows
        half = getattr(bm, "HALF_CASES", ())  # or the half-precision rows
        chosen += [Case(c) for c in (*bm.GPU_CASES, *small, *few, *few_grad, *single, *half) if c.op == op]
    return {c.label: Case(c.base.on(DEVICE), c.bandwidths) for c in chosen}


def sync() -> None:
    """Wait for the device: each timed call ends with it, so asv's wall-clock timer measures the work."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class OpSuite:
    """Base of the suites: subclasses set ``op`` and ``baseline``, and call :meth:`run` in a ``time_`` method."""

    op: str
    baseline: str  # the row name of PyTorch's own implementation
    # A call can take a second (torch.cdist p=1 at 8192²); warm-up and JIT happen in setup.
    number = 0
    repeat = (3, 10, 20.0)
    # Results are kept across commits (perf-history/): the version changes only when what a row
    # measures changes, not with every edit of this file (asv's default hashes the source).
    version = "1"
    warmup_time = 0.0
    timeout = 600.0

    def setup(self, impl: str, label: str) -> None:
        case = cases(self.op)[label]
        if impl == self.baseline:
            fn = case.torch_fn()
            if fn is None:
                raise NotImplementedError(f"PyTorch has no memory-bounded way to compute {label}")
        else:
            why = refusal(impl)
            if why is not None:
                raise NotImplementedError(f"backend {impl!r} not timed here: {why}")
            out = case.make_out()
            kfn = case.kermac_fn(impl)

            def fn(*inputs: torch.Tensor) -> torch.Tensor:
                return kfn(*inputs, out)

        self._fn = fn
        self._sets = bm.input_sets(case.base)
        self._next = 0
        try:
            fn(*self._sets[0])
        except BackendError as exc:  # e.g. the backend does not support this problem
            raise NotImplementedError(str(exc)) from exc
        sync()

    def run(self) -> None:
        """One call on the next input set, then wait for the device."""
        self._fn(*self._sets[self._next % len(self._sets)])
        self._next += 1
        sync()

    def teardown(self, impl: str, label: str) -> None:
        self._fn = self._sets = None
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
