"""The `nvrtc` backend: availability, per-problem checks, and running pairwise / gradient programs and
fused kernel products.

Flow of a call: `.plan` picks the variant and arguments; the variant's source
(`.source`) is compiled once per architecture (`.compiler`, cached on disk) and loaded
once per device (`.launcher`); the kernel is launched on torch's current stream.  Two
memos of the backend make a repeated call cheap: (device, variant) → the loaded kernel, and
`plan.call_key` (everything planning reads of a problem) → a `launcher.PreparedLaunch` with
every argument packed, so a call like an earlier one costs its key, one lookup, and the launch
with its new operand addresses.

Compiling or loading a module cannot be captured in a CUDA graph: a call that would need either
while the stream it launches on is capturing raises a `RuntimeError` telling to run the call once
before capturing; a warmed-up call only launches, which a graph captures.

Where several kernels compute the same program, the backend's
`NvrtcTuning` chooses; the registered `nvrtc` backend holds
the measured defaults, and `NvrtcBackend(tuning=...)` builds one with another choice (its memos
are its own).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import threading
import time
from collections.abc import Callable, Sequence
from functools import cache

import torch

from kermac.backend import Availability, Backend
from kermac.logs import logger
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem
from kermac_backend_nvrtc import launcher
from kermac_backend_nvrtc.compiler import CUDA_CORE_BINDINGS, INSTALL_HINT
from kermac_backend_nvrtc.plan import (
    call_key,
    cuda_capability,
    device_capability,
    plan_grad,
    plan_pairwise,
    plan_product,
    pointer_args,
    size_problem,
    size_product,
    uses_wgmma,
)
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING, NvrtcTuning

__all__ = ["MAX_PLANS", "MIN_CAPABILITY", "WGMMA_PREFERENCE", "NvrtcBackend"]

MIN_CAPABILITY = (8, 0)
MAX_PLANS = 1024
"""Plans a backend remembers (keyed by `plan.call_key`); the memo starts over when full."""
WGMMA_PREFERENCE = 30
"""`auto`'s fallback preference (used where no cost table decides, `kermac.costs`) for the float32
(x − z)² programs on sm_90, where they run the wgmma kernel, which measured faster than Triton's
tensor-core kernel (docs/dev/wgmma-sm90.md); other devices run `mma.sync` and keep the priority.
"""


def _capturing(device: int) -> bool:
    """Whether the current stream of CUDA device `device` (where a launch for it goes) is capturing a graph."""
    same = torch.cuda.current_device() == device
    with contextlib.nullcontext() if same else torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


@cache
def _cuda_device_reason(index: int) -> str | None:
    """Why CUDA device `index` cannot run these kernels, or None (decided once per device)."""
    from kermac_backend_nvrtc.compiler import supported_archs

    cap = cuda_capability(index)
    if cap < 10 * MIN_CAPABILITY[0] + MIN_CAPABILITY[1]:
        return f"needs compute capability >= 8.0; cuda:{index} is sm_{cap}"
    if cap not in supported_archs():
        return f"this NVRTC cannot generate code for sm_{cap} (cuda:{index}); install a newer NVRTC"
    return None


def _planner(problem: PairwiseProblem | GradProblem | ProductProblem) -> Callable:
    """The planner of `problem`'s operation."""
    if isinstance(problem, ProductProblem):
        return plan_product
    return plan_grad if isinstance(problem, GradProblem) else plan_pairwise


class NvrtcBackend(Backend):
    """CUDA C++ kernels generated from core's IR, compiled by NVRTC; CUDA devices of sm_80 and newer.

    `tuning` chooses among kernels that compute the same program (default: the measured
    `DEFAULT_TUNING`).  `name` is what `backend=` calls it;
    under any other name than `nvrtc` the backend is opt-in (priority −1: `auto` never picks
    it), so that one of other tuning runs beside the registered one only where named
    (`kermac_backend_nvrtc.tuned.registered` registers it in process).
    """

    name = "nvrtc"
    priority = 20
    description = "CUDA C++ generated from the IR, compiled at run time by NVRTC (sm_80+)"

    def __init__(self, tuning: NvrtcTuning = DEFAULT_TUNING, *, name: str = "nvrtc") -> None:
        if not isinstance(tuning, NvrtcTuning):
            raise TypeError(f"tuning: expected a kermac_backend_nvrtc.NvrtcTuning, got {type(tuning).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"name: expected a str, got {type(name).__name__}")
        if name != NvrtcBackend.name:
            self.name = name
            self.priority = -1
        self._tuning = tuning
        self._kernels: dict[tuple[int, object], object] = {}  # (device, variant) -> loaded kernel
        self._plans: dict[tuple, launcher.PreparedLaunch] = {}  # plan.call_key -> its launch
        self._lock = threading.Lock()

    @property
    def tuning(self) -> NvrtcTuning:
        """The choices among equivalent kernels this backend plans with (fixed at construction)."""
        return self._tuning

    # ---- availability and checks ---------------------------------------------------------

    def availability(self) -> Availability:
        """Whether cuda-core is installed (imported at the first compile only: a call whose kernel is in the
        disk cache loads it through `cuda.bindings`), the NVRTC library loads, and torch sees a GPU of sm_80 or
        newer."""
        try:
            installed = importlib.util.find_spec("cuda.core") is not None
        except ModuleNotFoundError:  # no `cuda` package at all
            installed = False
        except Exception as exc:  # a broken `cuda` package
            return Availability.no(f"cuda-core cannot be found ({type(exc).__name__}: {exc}); {INSTALL_HINT}")
        if not installed:
            return Availability.no(f"cuda-core is not installed; {INSTALL_HINT}")
        try:
            from cuda import bindings
        except Exception as exc:
            return Availability.no(f"cuda-bindings is not importable ({type(exc).__name__}: {exc}); {INSTALL_HINT}")
        bindings_version = str(getattr(bindings, "__version__", "unknown"))
        if bindings_version.split(".")[0] not in CUDA_CORE_BINDINGS:  # the check cuda.core makes at its import
            return Availability.no(
                f"cuda-core imports with cuda-bindings {' or '.join(f'{v}.x' for v in CUDA_CORE_BINDINGS)}, "
                f"found cuda-bindings {bindings_version}; {INSTALL_HINT}"
            )
        try:
            from kermac_backend_nvrtc.compiler import nvrtc_version

            major, minor = nvrtc_version()
        except Exception as exc:
            return Availability.no(
                f"the NVRTC library could not be loaded ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
            )
        if not torch.cuda.is_available():
            return Availability.no("no CUDA device is visible to torch (torch.cuda.is_available() is False)")
        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
        if not any(c >= MIN_CAPABILITY for c in caps):
            found = ", ".join(f"cuda:{i} sm_{c[0]}{c[1]}" for i, c in enumerate(caps))
            return Availability.no(f"needs a GPU of compute capability >= 8.0, found {found}")
        try:
            core_version = f"cuda-core {importlib.metadata.version('cuda-core')}"
        except importlib.metadata.PackageNotFoundError:  # importable, but installed without metadata
            core_version = "cuda-core"
        return Availability.yes(f"{core_version}, NVRTC {major}.{minor}")

    def _device_reason(self, t: torch.Tensor) -> str | None:
        if not t.is_cuda:
            return f"runs CUDA tensors only; got tensors on {t.device}"
        return _cuda_device_reason(t.get_device())

    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        x = problem.x
        *_, m, d = x.shape
        return self._device_reason(x) or size_problem("pairwise", {"M": m, "N": problem.z.shape[-2], "D": d})

    def preference(self, problem: PairwiseProblem | GradProblem) -> int:
        """`WGMMA_PREFERENCE` for pairwise problems that run the wgmma kernel, else the priority."""
        if isinstance(problem, PairwiseProblem):
            dtype = str(problem.dtype).removeprefix("torch.")
            if uses_wgmma(problem.program, dtype, problem.d, device_capability(problem), self._tuning):
                return WGMMA_PREFERENCE
        return self.priority

    def check_grad(self, problem: GradProblem) -> str | None:
        m, n, o, k = problem.sizes
        return self._device_reason(problem.a) or size_problem("gradient", {"M": m, "N": n, "O": o, "K": k})

    def check_general_grad(self, problem: GradProblem) -> str | None:
        """As `check_grad`: the SIMT gradient kernel runs every program in the general form."""
        return self.check_grad(problem)

    def check_product(self, problem: ProductProblem) -> str | None:
        """Every pairwise program in every dtype runs the SIMT product kernel: refused only off a
        supported CUDA device and beyond the kernel's index and grid limits (`plan.size_product`)."""
        return self._device_reason(problem.x) or size_product(problem)

    # ---- running -------------------------------------------------------------------------

    def forget(self) -> None:
        """Drop the memos of loaded kernels and plans (after a tile configuration changed at run time)."""
        with self._lock:
            self._kernels.clear()
            self._plans.clear()

    def _kernel(self, device: int, variant: object, debug: bool) -> object:
        memo = (device, variant)
        found = self._kernels.get(memo)
        if found is not None:
            if debug:
                logger.debug(
                    "nvrtc: %s of this variant already loaded on cuda:%d (%s)", found.name, device, found.resources
                )
            return found
        if _capturing(device):
            raise RuntimeError(
                f"nvrtc: this call needs the {variant.kernel} kernel ({type(variant).__name__} of program "
                f"{variant.program.key()}, {variant.compute}) on cuda:{device}, which this backend has not loaded "
                "yet, and compiling or loading a module cannot be captured in a CUDA graph; run the same call once "
                "before capturing (a warm-up outside the graph compiles and loads it)"
            )
        from kermac_backend_nvrtc.compiler import compile_cubin
        from kermac_backend_nvrtc.source import kernel_source

        start = time.perf_counter()
        source, params = kernel_source(variant)
        name = variant.kernel
        cap = torch.cuda.get_device_capability(device)
        compiled = compile_cubin(source, variant.target(10 * cap[0] + cap[1]), name=name)
        loaded = launcher.load_kernel(
            device, compiled.key, compiled.cubin, name, params, variant.compute, variant.dynamic_smem
        )
        if debug:
            logger.debug(
                "nvrtc: %s variant %s: %s, loaded in %.1f ms; %s%s",
                name,
                compiled.key[:12],
                "cache hit" if compiled.hit else "compiled",
                1e3 * (time.perf_counter() - start),
                loaded.resources,
                f"; ptxas: {compiled.ptxas}" if compiled.ptxas else "",
            )
        with self._lock:
            self._kernels[memo] = loaded
        return loaded

    def _prepare(
        self, problem: PairwiseProblem | GradProblem | ProductProblem, planner: Callable
    ) -> launcher.PreparedLaunch:
        """Plan `problem`, load its kernel and pack its launches."""
        device, debug = problem.device, problem.debug
        index = device.index if device.index is not None else torch.cuda.current_device()
        variant, launch = planner(problem, None, self._tuning)  # None: the problem's device
        kernel = self._kernel(index, variant, debug)
        chunks = launch.chunks()
        if debug:
            logger.debug(
                "nvrtc: launch grid (%d, 1, %d) in %d launch(es), block %d, on cuda:%d's current stream",
                launch.grid_x,
                launch.grid_z_total,
                len(chunks),
                launch.block,
                index,
            )
        steps = [((launch.grid_x, 1, gz), launch.args | {"zbase": zbase}) for zbase, gz in chunks]
        return launcher.PreparedLaunch(kernel, launch.block, steps, tuple(pointer_args(problem)))

    def _run(self, problem: PairwiseProblem | GradProblem | ProductProblem, planner: Callable) -> None:
        """Launch `problem` with its remembered launches, or plan and remember them (`debug` plans,
        and logs, every call)."""
        if problem.debug:
            self._prepare(problem, planner).run(tuple(pointer_args(problem).values()))
            return
        key, addresses = call_key(problem)
        prepared = self._plans.get(key)
        if prepared is None:
            prepared = self._prepare(problem, planner)
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            self._plans[key] = prepared
        prepared.run(addresses)

    def pairwise(self, problem: PairwiseProblem) -> None:
        self._run(problem, plan_pairwise)

    def grad(self, problem: GradProblem) -> None:
        self._run(problem, plan_grad)

    def general_grad(self, problem: GradProblem) -> None:
        self._run(problem, plan_grad)

    def product(self, problem: ProductProblem) -> None:
        """`problem.out = K @ v` by the fused SIMT product kernel (`plan.plan_product`): one launch (more
        for batches beyond 65535 entries) on the current stream, no workspace."""
        self._run(problem, plan_product)

    def precompile(
        self, problems: list[PairwiseProblem | GradProblem | ProductProblem], *, archs: Sequence[str] | None = None
    ) -> list[str]:
        """Compile (into the disk cache, without loading) the variants of `problems` (pairwise, gradient
        and fused product problems).

        `archs` (e.g. `["sm_80", "sm_90"]`) are the targets; by default each problem's CUDA
        device (problems on the `meta` device, as `kermac precompile` builds without a GPU,
        then need `archs`).

        NVRTC holds the GIL, so several variants compile in worker processes (spawned: they
        never touch the GPU).  Returns one line per distinct variant and architecture.
        """
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        from kermac_backend_nvrtc.compiler import compile_cubin
        from kermac_backend_nvrtc.source import kernel_source
        from kermac_backend_nvrtc.variants import arch_capability

        jobs: dict[tuple[str, str, str], str] = {}
        for pr in problems:
            if archs:
                targets = list(archs)
            elif pr.device.type == "cuda":
                cap = torch.cuda.get_device_capability(pr.device)
                targets = [f"sm_{cap[0]}{cap[1]}"]
            else:
                raise ValueError(
                    f"archs: needed for problems on {pr.device} (no CUDA device to read the architecture from)"
                )
            for arch in targets:
                capability = arch_capability(arch)
                variant = _planner(pr)(pr, capability, self._tuning)[0]
                source, name, target = kernel_source(variant)[0], variant.kernel, variant.target(capability)
                jobs[(source, target, name)] = f"{name} {target} {pr.program.key()}"
        if len(jobs) <= 1:
            for source, arch, name in jobs:
                compile_cubin(source, arch, name=name)
        else:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(mp_context=ctx) as pool:
                done = [pool.submit(compile_cubin, source, arch, name=name) for source, arch, name in jobs]
                for f in done:
                    f.result()
        return list(jobs.values())
