"""Compile the Triton kernels of some problems into Triton's cache ahead of time (`kermac precompile`).

Each problem goes through the backend's own launch path (`kermac_backend_triton.launch`) inside
`compiling_only()`: the kernel its first launch would compile, with that launch's arguments and fixed
meta-parameters, is compiled for every configuration the autotuner would try, by Triton's `warmup`, which
specialises the arguments and computes the cache key exactly as a launch does; with the GPU's own driver, each
compiled kernel's host launcher is built too (Triton 3.6 compiles one in C per argument signature at a first
launch; later versions build none).  Triton keeps the binaries in its own cache (`~/.triton/cache` or
`TRITON_CACHE_DIR`); a later process's first call of a problem of the same kind and operand layout (alignment,
which sizes and strides are multiples of 16) finds them there and compiles nothing, though the autotuner still
times the configurations once per shape bucket.

A launch asks Triton's active driver for the GPU's architecture.  For `archs` (problems on the `meta` device,
as `kermac precompile` builds them without a GPU, or another architecture than the GPU's) a driver that answers
only that question stands in while the kernels compile (`_TargetDriver`); the kernels' per-device compilation
caches it filled are emptied afterwards, so that a later launch in the same process compiles for the real GPU.
The driver is the process's: no other thread may launch Triton kernels meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from kermac.problem import GradProblem, PairwiseProblem
from kermac_backend_triton.interpreter import interpreting
from kermac_backend_triton.launch import Spec, compiling_only, jit_function, run_grad, run_pairwise
from kermac_backend_triton.tuning import TritonTuning

__all__ = ["precompile"]


def _capability(arch: str) -> int:
    """`"sm_90"` → 90 (Triton's `GPUTarget.arch` for CUDA)."""
    digits = arch.removeprefix("sm_").removesuffix("a")
    if not arch.startswith("sm_") or not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"archs: expected names like 'sm_80' or 'sm_90'; got {arch!r}")
    if int(digits) < 80:
        raise ValueError(f"archs: the Triton backend compiles for sm_80 and newer; got {arch!r}")
    return int(digits)


class _TargetDriver:
    """Triton's active driver while compiling for a named architecture: it answers the device, stream and
    target a launch asks for, and nothing a launch on a GPU would need beyond them."""

    def __init__(self, capability: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target


@contextlib.contextmanager
def _compiling_for(capability: int | None) -> Iterator[list]:
    """`compiling_only()`, for `capability` (None: the GPU's) through `_TargetDriver`."""
    if capability is None:
        with compiling_only() as compiled:
            yield compiled
        return
    from triton.runtime import driver

    previous = driver._active  # None until a launch made one: `reset_active` would make one, and fail without a GPU
    driver.set_active(_TargetDriver(capability))
    try:
        with compiling_only() as compiled:
            yield compiled
    finally:
        driver._active = previous
        for _, kernel in compiled:
            jit_function(kernel).device_caches.clear()  # the stand-in target's binders: a launch makes its own


def _run(problem: PairwiseProblem | GradProblem, tuning: TritonTuning) -> None:
    if isinstance(problem, PairwiseProblem):
        run_pairwise(problem, tuning=tuning)
    else:
        run_grad(problem, tuning=tuning)


def _capabilities(problems: Sequence[PairwiseProblem | GradProblem], archs: Sequence[str] | None) -> list[int] | None:
    """The capabilities `archs` names (None: each problem's GPU), after checking `problems` and `archs`."""
    for problem in problems:
        if not isinstance(problem, (PairwiseProblem, GradProblem)):
            raise TypeError(
                f"problems: the Triton backend precompiles pairwise and gradient problems; got {type(problem).__name__}"
            )
    return None if archs is None else list(dict.fromkeys(_capability(arch) for arch in archs))  # sm_90a: sm_90


def _line(spec: Spec, problem: PairwiseProblem | GradProblem, arch: str) -> str:
    """`kermac precompile`'s line for a kernel: what tells it apart (kernel, target, dtype, layout), then the
    program."""
    facts = [spec.kernel, arch, str(problem.dtype).removeprefix("torch.")]
    if spec.nbatch:
        facts.append(f"batch-dims={spec.nbatch}")
    if spec.tensor_hypers:
        facts.append(f"per-batch={','.join(sorted(spec.tensor_hypers))}")
    if spec.int64:
        facts.append("int64")
    return " ".join([*facts, spec.program.key()])


def precompile(
    problems: Sequence[PairwiseProblem | GradProblem], *, archs: Sequence[str] | None, tuning: TritonTuning
) -> list[str]:
    """Compile the kernels of `problems` for `archs` (e.g. `["sm_90"]`; None: each problem's GPU) into Triton's
    cache; one line per distinct kernel, dtype and architecture.  Nothing under the interpreter, which compiles
    nothing.  A kernel that fails to compile raises (Triton's error), after the stand-in driver's state is undone."""
    capabilities = _capabilities(problems, archs)
    if interpreting():  # the problems it accepts are CPU ones, and it compiles nothing ahead
        return []
    if capabilities is None:
        elsewhere = sorted({str(p.device) for p in problems if p.device.type != "cuda"})
        if elsewhere:
            raise ValueError(f"archs: needed for problems on {', '.join(elsewhere)} (no GPU to compile for)")
    targets: list[int | None] = [None] if capabilities is None else list(capabilities)
    lines: dict[str, None] = {}
    for capability in targets:
        for problem in problems:
            with _compiling_for(capability) as compiled:
                _run(problem, tuning)
            if capability is None:
                major, minor = torch.cuda.get_device_capability(problem.device)
                arch = f"sm_{major}{minor}"
            else:
                arch = f"sm_{capability}"
            lines.update({_line(spec, problem, arch): None for spec, _ in compiled})
    return list(lines)
