"""Launch a Triton variant that has run before straight through its compiled kernel.

`kernel[grid](*args)` makes Triton, on every call, specialise every argument (its type, an
integer's equality to 1 and divisibility by 16, a pointer's 16-byte alignment), look the
compiled kernel up in its JIT cache and, through the autotuner, look the tuned configuration
up: most of a small call's host time.  The backend keys each call instead on the facts that
decide all of that, taken from values it has at hand (`int_facts`, `pointer_facts`, plus the
kernel's specialisation and the autotuning bucket, `kermac_backend_triton.launch`), and keeps
per key a `Launcher`.  The first call of a key launches through `kernel[grid]`; from the
arguments Triton bound there (recorded by the grid function, which Triton calls with them) the
`Launcher` keeps the compiled kernel and the arguments that follow the per-call ones (the
autotuning key and the meta-parameters of the configuration chosen), and launches later calls
with `CompiledKernel[grid](*args, stream=...)`, the launch Triton's JIT itself performs in every
release from 3.3 to 3.9.  `DIRECT_LAUNCH` says whether this Triton has it; where it does not,
under the interpreter, or where the first launch did not return a `CompiledKernel`, the
`Launcher` launches through `kernel[grid]` with the stored kernel and meta-parameters.

CUDA graphs: a key seen for the first time makes Triton compile and autotune (its timing runs
synchronise, which a stream capture forbids); `check_not_capturing`, consulted only then,
refuses it with an error that says what to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kermac_backend_triton.interpreter import interpreting

__all__ = [
    "DIRECT_LAUNCH",
    "Launcher",
    "check_not_capturing",
    "device_guard",
    "direct_allowed",
    "int_facts",
    "make_launcher",
    "pointer_facts",
]

_I32 = (-(2**31), 2**31 - 1)
_U64_MIN = 2**63


def _direct_launch() -> str | None:
    """`None` where Triton's `CompiledKernel` can be launched as its JIT launches it, else why not."""
    try:
        from triton.compiler import CompiledKernel
        from triton.runtime import driver
    except Exception as exc:  # an unusable triton launches nothing directly
        return f"triton.compiler.CompiledKernel or triton.runtime.driver cannot be imported ({exc})"
    missing = [name for name in ("__getitem__", "run", "launch_metadata") if not hasattr(CompiledKernel, name)]
    if not (hasattr(type(driver), "active") or "active" in vars(driver)):  # reading it would create the driver
        missing.append("driver.active")
    return f"this Triton lacks {', '.join(missing)}" if missing else None


DIRECT_LAUNCH: str | None = _direct_launch()
"""`None` where later calls of a variant launch its compiled kernel directly, else the reason why not."""


def _int_type(v: int) -> int:
    """The integer type Triton passes `v` as: 0 for int32, 1 for int64, 2 for uint64."""
    if _I32[0] <= v <= _I32[1]:
        return 0
    return 2 if v >= _U64_MIN else 1


def int_facts(specialised: Sequence[int], unspecialised: Sequence[int]) -> tuple:
    """What Triton's specialisation sees of integer arguments.

    Of each `specialised` argument, whether it is 1 (then a compile-time constant), a multiple of
    16 (`tt.divisibility`) or neither; of every argument, its integer type (listed only where one
    leaves int32).  Two calls with equal facts bind the same compiled kernel.
    """
    facts = tuple([1 if v == 1 else 0 if v & 15 else 16 for v in specialised])
    every = [*specialised, *unspecialised]
    if every and (min(every) < _I32[0] or max(every) > _I32[1]):
        return facts, tuple(_int_type(v) for v in every)
    return facts, None


def pointer_facts(args: Sequence[object]) -> tuple:
    """What Triton's specialisation sees of tensor arguments (dtype, 16-byte alignment); `None`
    for a number (a scalar hyperparameter, typed by the kernel's signature)."""
    return tuple([(a.dtype, not a.data_ptr() & 15) if isinstance(a, torch.Tensor) else None for a in args])


def check_not_capturing(device_index: int, variant: Callable[[], str]) -> None:
    """Refuse a first launch while the current CUDA stream of `device_index` is capturing a graph.

    A first launch compiles and autotunes; the autotuner's timing synchronises the device,
    which a capture forbids (CUDA would invalidate the capture with an unrelated error).
    `variant` describes what would be compiled.
    """
    if device_index < 0:  # CPU tensors (the interpreter): nothing is captured
        return
    with torch.cuda.device(device_index):
        capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        raise RuntimeError(
            f"kermac's Triton backend would compile and autotune {variant()} while the current CUDA stream "
            f"is capturing a graph, and autotuning synchronises the device, which a capture forbids; "
            f"run the same call (same shapes, dtypes, layout and alignment) once before capturing"
        )


class Launcher:
    """How the calls of one key launch: through the compiled kernel directly (`compiled` set), or
    through `kernel[grid](*args, **meta)`.

    `tail`: the arguments after the per-call ones (the autotuning key and the meta-parameters)
    in the kernel's parameter order; `tiles`: the output tile of the configuration launched
    (rows and columns of the grid's unit); `meta`: the keyword arguments of the indirect launch.
    """

    __slots__ = ("compiled", "kernel", "meta", "stream", "tail", "tiles")

    def __init__(
        self,
        kernel: Any,
        meta: Mapping[str, object],
        tiles: tuple[int, int],
        compiled: Any = None,
        tail: tuple = (),
        stream: Callable[[int], int] | None = None,
    ) -> None:
        self.kernel, self.meta, self.tiles = kernel, meta, tiles
        self.compiled, self.tail, self.stream = compiled, tail, stream

    def launch(self, args: list, grid: int, device_index: int) -> None:
        """Launch `grid` programs on `args` (the per-call arguments) on the current stream of the device."""
        if self.compiled is None:
            with device_guard(device_index):
                self.kernel[(grid,)](*args, **self.meta)
        elif device_index >= 0 and device_index != torch.cuda.current_device():
            with torch.cuda.device(device_index):
                self.compiled[(grid, 1, 1)](*args, *self.tail, stream=self.stream(device_index))
        else:
            self.compiled[(grid, 1, 1)](*args, *self.tail, stream=self.stream(device_index))


def device_guard(device_index: int) -> contextlib.AbstractContextManager:
    """Make CUDA device `device_index` current (nothing for -1, the CPU)."""
    return torch.cuda.device(device_index) if device_index >= 0 else contextlib.nullcontext()


def direct_allowed(device_index: int) -> bool:
    """Whether a launch on device `device_index` (-1: the CPU) may keep its compiled kernel:
    on a GPU, with `DIRECT_LAUNCH`, and not under the interpreter (which compiles nothing)."""
    return device_index >= 0 and DIRECT_LAUNCH is None and not interpreting()


def _stream_source() -> Callable[[int], int]:
    """Triton's own source of the current stream (PyTorch's, of a device index)."""
    from triton.runtime import driver

    return driver.active.get_current_stream


def make_launcher(
    kernel: Any,
    meta: Mapping[str, object],
    tiles: tuple[int, int],
    args: list,
    result: object,
    bound: Mapping[str, object],
    device_index: int,
) -> Launcher:
    """The `Launcher` of a key whose first launch `kernel[grid](*args, **meta)` returned `result`
    and bound `bound` (the arguments Triton passed to the grid function, in parameter order).

    Direct where `direct_allowed`, `result` is a `CompiledKernel` and `bound` starts with
    exactly `args` (the same objects); otherwise through `kernel[grid]`.
    """
    if direct_allowed(device_index):
        from triton.compiler import CompiledKernel

        values = list(bound.values())
        same = len(values) >= len(args) and all(a is b for a, b in zip(args, values, strict=False))
        if isinstance(result, CompiledKernel) and same:
            return Launcher(kernel, meta, tiles, result, tuple(values[len(args) :]), _stream_source())
    return Launcher(kernel, meta, tiles)
