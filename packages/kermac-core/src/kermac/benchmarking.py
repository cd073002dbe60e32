"""The benchmark harness shared by `kermac bench` and the asv suites in `benchmarks/`.

A `BenchCase` names one problem -- an operation, its sizes, `p`, the kernel function --
and builds its inputs; `kermac_fn` and `torch_fn` give the callables to time (kermac
through a chosen backend writing into a preallocated `out`, and PyTorch's own way of computing
the same thing); `reference` computes the float64 answer with the reference backend and
`max_rel_error` compares against it; `time_ms` times a callable.

Operations and shapes (`torch.randn` inputs, float32 unless a case names float16 or bfloat16, which are the
float32 values rounded):

* `"cdist"`, sizes `(M, N, D)`: `x [M, D]`, `z [N, D]` → `[M, N]`, the p-norm distance.
* `"kernel"`, sizes `(M, N, D)`: the same shapes; `kernel` is `"laplace"`
  (`exp(−‖x−z‖_p/σ)`) or `"gaussian"` (`exp(−‖x−z‖₂²/(2σ²))`, p = 2).
* `"grad"`, sizes `(M, N, O, K)`: `a [K, M]`, `b [N, K]`, `c [O, K]`, `d [N, M]` →
  `out [O, N, M] = Σ_k c[o,k]·a[k,m]·sgn(d[n,m]−b[n,k])·|d[n,m]−b[n,k]|^(p−1)`.
* `"program"`, sizes `(M, N, D)`, p = 2: the shapes of cdist; a program written in the IR as a
  user would ([`user_program`][kermac.benchmarking.user_program], the Cauchy kernel
  `1/(1 + γ‖x−z‖₂²)` with `γ = 1/σ²`), run by `kermac.run_program`.

This is the one table of benchmark cases: `kermac bench`, the asv suites in `benchmarks/` and
the development tools in `tools/` all read it.  The case lists: `CPU_CASES` (small, for
machines without a GPU), `CPU_QUICK_CASES`, `PEERS_CASES` (the peer table: every
problem other systems published H100 timings for, with those timings and the project's targets),
`GPU_CASES` (the subset `kermac bench` runs by default, < 1 minute on an H100),
`GPU_QUICK_CASES`, `SMALL_CASES` (problems so small that on a GPU a call's time is
mostly the host's per-call work: checks, planning, the launch), `FEW_FEATURE_CASES` (distances with
D ≤ 16, whose floor is writing the output), `FEW_FEATURE_GRADIENT_CASES` (gradients with 3 and 32 features and
many centres, as a predictor's gradient has), `SINGLE_OUTPUT_GRADIENT_CASES` (the p = 2 gradient with O = 1,
whose floor is one matrix product) and `HALF_CASES` (float16 and bfloat16 distances); `kermac bench --full` runs
these four after the peer table.
`BenchCase.problem_class` is the class of [`kermac.costs`][kermac.costs] a case measures.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from kermac.costs import ProblemClass
    from kermac.programs import GradProgram, PairwiseProgram

__all__ = [
    "CORNER_WORK",
    "CPU_CASES",
    "CPU_QUICK_CASES",
    "FEW_FEATURE_CASES",
    "FEW_FEATURE_GRADIENT_CASES",
    "FIRST_CALL_P",
    "FIRST_CALL_VARIANTS",
    "GPU_CASES",
    "GPU_QUICK_CASES",
    "H100_FP32_PER_MS",
    "H100_SFU_PER_MS",
    "H100_TF32_FLOP_PER_MS",
    "H100_WRITE_BYTES_PER_MS",
    "HALF_CASES",
    "PEERS_CASES",
    "REFERENCE_BACKEND",
    "SINGLE_OUTPUT_GRADIENT_CASES",
    "SMALL_CASES",
    "BenchCase",
    "call_variant",
    "cases_for",
    "checked_on_corner",
    "checked_part",
    "corner",
    "input_sets",
    "kermac_fn",
    "max_rel_error",
    "reference",
    "rotation_count",
    "time_ms",
    "tolerance",
    "torch_fn",
    "user_program",
]

REFERENCE_BACKEND = "torch"
"""The backend whose float64 results are the oracle (kermac's pure-PyTorch reference backend)."""

Op = Literal["cdist", "kernel", "grad", "program"]
_OPS = ("cdist", "kernel", "grad", "program")
_KERNELS = ("laplace", "gaussian")
_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class BenchCase:
    """One benchmark problem.

    Attributes:
        op: `"cdist"`, `"kernel"`, `"grad"` or `"program"` (see the module docstring for shapes).
        sizes: `(M, N, D)` for cdist, kernel and program, `(M, N, O, K)` for grad.
        p: the norm exponent (> 0).
        kernel: `"laplace"` or `"gaussian"` for op `"kernel"`, else `None`.
        device: where inputs are created (`"cpu"`, `"cuda"`, `"cuda:1"`, ...).
        peers: other systems' published timings in ms on an H100, by system name.
        floor_ms: the hardware floor of this case on an H100 (bytes or flops at peak), if any.
        target_ms: the project's target for this case on an H100, if any.
        dtype: the inputs' and output's dtype, `"float32"`, or `"float16"` / `"bfloat16"` for ops `"cdist"`
            and `"kernel"`.
    """

    op: Op
    sizes: tuple[int, ...]
    p: float = 2.0
    kernel: str | None = None
    device: str = "cpu"
    peers: Mapping[str, float] = field(default_factory=dict, compare=False)
    floor_ms: float | None = field(default=None, compare=False)
    target_ms: float | None = field(default=None, compare=False)
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"op: expected one of {', '.join(_OPS)}, got {self.op!r}")
        want = 4 if self.op == "grad" else 3
        if len(self.sizes) != want or not all(isinstance(s, int) and s > 0 for s in self.sizes):
            names = "(M, N, O, K)" if self.op == "grad" else "(M, N, D)"
            raise ValueError(f"sizes: expected {want} positive ints {names} for op {self.op!r}, got {self.sizes!r}")
        if not (self.p > 0 and math.isfinite(self.p)):
            raise ValueError(f"p: expected a finite number > 0, got {self.p!r}")
        if self.op == "kernel":
            if self.kernel not in _KERNELS:
                raise ValueError(f"kernel: expected one of {', '.join(_KERNELS)} for op 'kernel', got {self.kernel!r}")
            if self.kernel == "gaussian" and self.p != 2:
                raise ValueError(f"p: the gaussian kernel is defined on the L2 distance (p=2), got p={self.p!r}")
        elif self.kernel is not None:
            raise ValueError(
                f"kernel: only op 'kernel' takes a kernel function, got kernel={self.kernel!r} for op {self.op!r}"
            )
        if self.op == "program" and self.p != 2:
            raise ValueError(f"p: the user program is defined on the L2 distance (p=2), got p={self.p!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if self.dtype != "float32" and self.op not in ("cdist", "kernel"):
            raise ValueError(f"dtype: {self.dtype} inputs are benchmarked for ops cdist and kernel, got op {self.op!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """`dtype` as a torch dtype."""
        return getattr(torch, self.dtype)

    @property
    def label(self) -> str:
        """A short human-readable name, e.g. `cdist 8192x8192x256 p=1.3` (`… float16` for half inputs)."""
        return self._name + ("" if self.dtype == "float32" else f" {self.dtype}")

    @property
    def _name(self) -> str:
        p = f"p={self.p:g}"
        if self.op == "grad":
            m, n, o, k = self.sizes
            return f"grad M={m} N={n} O={o} K={k} {p}"
        dims = "x".join(str(s) for s in self.sizes)
        if self.op == "kernel":
            return f"{self.kernel} L{self.p:g} {dims}"
        if self.op == "program":
            return f"program {dims}"
        return f"cdist {dims} {p}"

    @property
    def bandwidth(self) -> float:
        """σ of a kernel or program case: the typical ‖x−z‖_p of randn rows, `√2·D^(1/p)`, so values stay O(1)."""
        return math.sqrt(2.0) * self.sizes[2] ** (1.0 / self.p)

    @property
    def out_shape(self) -> tuple[int, ...]:
        """`(M, N)`, or `(O, N, M)` for grad."""
        if self.op == "grad":
            m, n, o, _ = self.sizes
            return (o, n, m)
        return self.sizes[:2]

    @property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        """`(x, z)` shapes, or `(a, b, c, d)` for grad."""
        if self.op == "grad":
            m, n, o, k = self.sizes
            return ((k, m), (n, k), (o, k), (n, m))
        m, n, d = self.sizes
        return ((m, d), (n, d))

    @property
    def input_bytes(self) -> int:
        """Bytes of all inputs of one input set."""
        return self.torch_dtype.itemsize * sum(math.prod(s) for s in self.input_shapes)

    @property
    def program(self) -> PairwiseProgram | GradProgram:
        """The program `kermac_fn` runs for this case."""
        from kermac import presets
        from kermac.lowering import cdist_program, grad_program

        if self.op == "cdist":
            return cdist_program(self.p, dtype=self.torch_dtype)
        if self.op == "grad":
            return grad_program(self.p)
        if self.op == "program":
            return user_program()
        if self.kernel == "gaussian":
            return presets.gaussian.lower()
        return presets.ALL[_laplace_preset(self.p)].lower()

    @property
    def problem_class(self) -> ProblemClass:
        """The class of [`kermac.costs`][kermac.costs] this case measures."""
        from kermac.costs import classify

        return classify(self.program, self.torch_dtype, self.sizes)

    def on(self, device: str | torch.device) -> BenchCase:
        """The same case with inputs on `device`."""
        return dataclasses.replace(self, device=str(device))

    def make_inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Fresh `torch.randn` inputs on `device` (drawn in float32, then rounded to `dtype`), reproducible from
        `seed`."""
        device = torch.device(self.device)
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        draws = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) for shape in self.input_shapes)
        return tuple(t.to(self.torch_dtype) for t in draws)

    def make_out(self) -> torch.Tensor:
        """An uninitialised output of `out_shape` and `dtype` on `device`."""
        return torch.empty(self.out_shape, device=self.device, dtype=self.torch_dtype)


def _cdist(
    sizes: tuple[int, int, int],
    p: float,
    floor: float | None,
    target: float,
    torch_ms: float,
    kermac_ms: float,
    mm_ms: float,
) -> BenchCase:
    peers = {"torch 2.11": torch_ms, "kermac 0.1.2": kermac_ms, "mm-kermac 1.0.0": mm_ms}
    return BenchCase("cdist", sizes, p, device="cuda", peers=peers, floor_ms=floor, target_ms=target)


def _grad(
    sizes: tuple[int, int, int, int],
    p: float,
    target: float,
    kermac_ms: float | None,
    mm_ms: float,
    torch_ms: float | None = None,
) -> BenchCase:
    peers = {"kermac 0.1.2": kermac_ms, "mm-kermac 1.0.0": mm_ms, "torch 2.11 einsum": torch_ms}
    floor = 2.2 if sizes[0] == 4096 else 26.3
    return BenchCase(
        "grad",
        sizes,
        p,
        device="cuda",
        peers={k: v for k, v in peers.items() if v is not None},
        floor_ms=floor,
        target_ms=target,
    )


PEERS_CASES: tuple[BenchCase, ...] = (
    _cdist((30000, 30000, 1024), 1.0, 58.7, 64.0, 2144.0, 73.5, 77.8),
    _cdist((30000, 30000, 1024), 1.3, 440.0, 300.0, 4060.0, 449.0, 453.0),
    _cdist((30000, 30000, 1024), 2.0, 14.0, 25.0, 41.5, 74.5, 78.1),
    _cdist((8192, 8192, 256), 1.0, 1.37, 1.5, 94.4, 1.80, 1.74),
    _cdist((8192, 8192, 256), 1.3, 8.8, 6.5, 146.7, 9.19, 8.97),
    _cdist((8192, 8192, 256), 2.0, None, 1.0, 1.60, 1.77, 1.66),
    _cdist((16384, 16384, 32), 1.0, 0.6, 0.8, 331.7, 1.12, 1.12),
    _cdist((16384, 16384, 32), 2.0, 0.6, 0.8, 2.32, 1.13, 1.17),
    BenchCase(
        "kernel",
        (16384, 16384, 128),
        1.0,
        "laplace",
        "cuda",
        {"torch 2.11 cdist+exp": 351.0, "kermac 0.1.2": 3.33},
        None,
        2.6,
    ),
    BenchCase(
        "kernel",
        (16384, 16384, 128),
        2.0,
        "laplace",
        "cuda",
        {"torch 2.11 cdist+exp": 5.93, "kermac 0.1.2": 3.32},
        None,
        1.5,
    ),
    _grad((4096, 256, 16, 4096), 1.0, 3.0, 6.38, 6.31),
    _grad((4096, 256, 16, 4096), 2.0, 3.0, 6.12, 6.03, torch_ms=6.38),
    _grad((4096, 256, 16, 4096), 1.5, 3.5, 7.38, 7.42),
    _grad((8192, 768, 16, 8192), 1.0, 30.0, 74.2, 73.3),
    _grad((8192, 768, 16, 8192), 1.5, 35.0, None, 84.4),
)
"""The peer table (float32, one H100 80GB): other systems' published timings, floors and targets."""

H100_WRITE_BYTES_PER_MS = 2**30 / 0.36
"""The rate at which an H100 80GB HBM3 writes a float32 output, bytes per millisecond: 16384² outputs (1 GiB)
in 0.36 ms (../shared/PEERS.md), about 3.0 TB/s."""
H100_FP32_PER_MS = 31.4e9
"""The H100's measured float32 instruction issue rate, per millisecond (../shared/PEERS.md)."""
H100_SFU_PER_MS = H100_FP32_PER_MS / 8
"""Its special-function unit's rate (lg2, ex2: 16 per clock and multiprocessor, 1/8 of float32)."""


def _few_features(d: int, p: float) -> BenchCase:
    """A 16384² distance with `d` features: its floor is the larger of writing the 1 GiB output and its terms'
    instructions — two float32 instructions per term for p = 1 and 2 (a difference; an add of its absolute value
    or a multiply-add of its square), two special-function operations for any other p (|t|^p = ex2(p·lg2|t|)) —
    its target 1.1× that."""
    m = n = 16384
    write = m * n * 4 / H100_WRITE_BYTES_PER_MS
    terms = m * n * d * 2 / (H100_FP32_PER_MS if p in (1.0, 2.0) else H100_SFU_PER_MS)
    floor = max(write, terms)
    return BenchCase("cdist", (m, n, d), p, device="cuda", floor_ms=floor, target_ms=round(1.1 * floor, 3))


FEW_FEATURE_CASES: tuple[BenchCase, ...] = tuple(_few_features(d, p) for d in (3, 8, 16) for p in (1.0, 1.3, 2.0))
"""Distances with few features (point clouds, spatial data): for p = 1 and 2 each output costs a handful of
instructions, so the floor is writing the output (`H100_WRITE_BYTES_PER_MS`) and the target 1.1× that; a
fractional p's powers take the special-function unit, whose floor passes the write's from D = 3 on."""

FEW_FEATURE_GRADIENT_CASES: tuple[BenchCase, ...] = tuple(
    BenchCase("grad", (16384, n, o, 50000), p, device="cuda")
    for n in (3, 32)
    for o in (1, 4, 16)
    for p in (1.0, 1.5, 2.0)
)
"""Gradients with few features (N = 3 and 32) and many centres (K = 50 000 against M = 16 384 points), for
O = 1, 4 and 16 outputs: the `cdist_grad` of a predictor's gradient on low-dimensional data
([`kermac.jacobians`][kermac.jacobians]).  Their fastest backend is not the peer rows' (N = 256 and 768): the cost
table ranks a gradient by the cases nearest in features ([`kermac.costs`][kermac.costs]).  No floor or target:
these rows measure the backends for `auto`."""

H100_TF32_FLOP_PER_MS = 386e9
"""The H100's measured TF32 matrix-product rate, flop per millisecond (../shared/PEERS.md)."""


def _single_output_gradient(sizes: tuple[int, int, int, int], fused_ms: float) -> BenchCase:
    """The p = 2 gradient of a single output (O = 1, the AGOP of a one-output predictor): its floor is the one
    matrix product `b @ (c ∘ a)` of `Σ_k c·a·(d − b)` in 3×TF32 (6·M·N·O·K flop at the measured TF32 rate); its
    target 5× faster than the fused kernel's `fused_ms`."""
    m, n, o, k = sizes
    floor = 6 * m * n * o * k / H100_TF32_FLOP_PER_MS
    return BenchCase("grad", sizes, 2.0, device="cuda", floor_ms=round(floor, 3), target_ms=round(fused_ms / 5, 2))


SINGLE_OUTPUT_GRADIENT_CASES: tuple[BenchCase, ...] = (
    _single_output_gradient((8192, 768, 1, 8192), 35.3),
    _single_output_gradient((8192, 8192, 1, 768), 37.4),
)
"""The p = 2 gradient with one output: the fused kernel forms `a·(d − b)` for every `(n, m, k)` on the SIMT units
whatever O is (35.3 and 37.4 ms on an H200, 2026-11-27, as at O = 16), where matrix products on the tensor cores
need a fraction of that; the target is 5× faster than those times."""

HALF_CASES: tuple[BenchCase, ...] = (
    BenchCase(
        "cdist",
        (8192, 8192, 256),
        2.0,
        device="cuda",
        peers={"torch 2.11 cdist": 0.55},
        target_ms=0.55,
        dtype="float16",
    ),
    BenchCase("cdist", (8192, 8192, 256), 2.0, device="cuda", target_ms=0.55, dtype="bfloat16"),
    BenchCase("cdist", (8192, 8192, 256), 1.0, device="cuda", target_ms=0.88, dtype="float16"),
)
"""Half inputs at 8192² × 256: p = 2 on the tensor cores, its target `torch.cdist`'s float16 time on an H100
(0.55 ms); p = 1 on the SIMT units, its target 1.5× faster than kermac's float32 (1.32 ms on an H100)."""

GPU_CASES: tuple[BenchCase, ...] = tuple(
    c for c in PEERS_CASES if c.sizes[0] != 30000 and not (c.op == "grad" and c.sizes[0] == 8192)
)
"""The default GPU subset: every PEERS row except the 30000² cdist and the 8192 gradient ones."""

GPU_QUICK_CASES: tuple[BenchCase, ...] = (
    next(c for c in PEERS_CASES if c.op == "cdist" and c.sizes == (8192, 8192, 256) and c.p == 1.3),
    next(c for c in PEERS_CASES if c.op == "kernel" and c.p == 2.0),
    next(c for c in PEERS_CASES if c.op == "grad" and c.sizes[0] == 4096 and c.p == 1.0),
)
"""`kermac bench --quick` on a GPU: one case per operation."""


def _small(mnd: tuple[int, int, int], grad: tuple[int, int, int, int]) -> tuple[BenchCase, ...]:
    return (
        BenchCase("cdist", mnd, 1.0),
        BenchCase("cdist", mnd, 1.3),
        BenchCase("cdist", mnd, 2.0),
        BenchCase("kernel", mnd, 1.0, "laplace"),
        BenchCase("kernel", mnd, 2.0, "laplace"),
        BenchCase("grad", grad, 1.0),
        BenchCase("grad", grad, 2.0),
    )


CPU_CASES: tuple[BenchCase, ...] = _small((1024, 1024, 64), (1024, 64, 8, 512))
"""Machines without a GPU: 1024x1024x64 distances and Laplace kernels, a small gradient."""
CPU_QUICK_CASES: tuple[BenchCase, ...] = _small((256, 256, 32), (256, 32, 4, 128))
"""`kermac bench --quick` without a GPU (a few seconds on two cores)."""


SMALL_CASES: tuple[BenchCase, ...] = CPU_QUICK_CASES
"""`kermac bench --small`: 256² distances and Laplace kernels of 32 features and a 256, 32, 4, 128
gradient on any device; a GPU finishes each kernel in a few microseconds, so these time the host.
"""


FIRST_CALL_VARIANTS: tuple[str, ...] = ("p1", "p2", "p1.3", "gaussian", "laplace_l1")
"""The kernel variants whose first call in a fresh process is timed (`kermac bench --first-call`,
`tools/first_call_times.py`, the asv suite `bench_first_call`): `pP` is `kermac.cdist` with p = P, another name a
preset of `kermac.presets` (`call_variant`)."""

FIRST_CALL_P = 1.3
"""The p of a preset that takes one (`lp_distance`, `laplace_lp`) in `call_variant`."""


def call_variant(variant: str, x: torch.Tensor, z: torch.Tensor, backend: str) -> torch.Tensor:
    """Run kernel variant `variant` (see `FIRST_CALL_VARIANTS`) on `x` `[M, D]` and `z` `[N, D]` on `backend`: the
    `[M, N]` distances (`pP`) or the preset's kernel matrix (bandwidth 2 where it takes one, p = `FIRST_CALL_P`
    where it takes one)."""
    import kermac

    if not isinstance(variant, str):
        raise TypeError(f"variant: expected a str (pP or a preset name), got {type(variant).__name__}")
    preset = kermac.presets.ALL.get(variant)
    if preset is not None:
        bandwidth = 2.0 if preset.needs_bandwidth else None
        return kermac.run_kernel(
            preset, x, z, bandwidth=bandwidth, p=FIRST_CALL_P if preset.needs_p else None, backend=backend
        )
    try:
        p = float(variant[1:]) if variant.startswith("p") else None
    except ValueError:
        p = None
    if p is None:
        presets = sorted(kermac.presets.ALL)
        raise ValueError(f"variant: expected pP with a number P (such as p1.3) or one of {presets}, got {variant!r}")
    return kermac.cdist(x, z, p=p, backend=backend)


def cases_for(
    device: str | torch.device, *, full: bool = False, quick: bool = False, small: bool = False
) -> list[BenchCase]:
    """The cases `kermac bench` runs on `device`: CPU or GPU lists, `full` = the whole peer
    table, then `FEW_FEATURE_CASES`, `FEW_FEATURE_GRADIENT_CASES`, `SINGLE_OUTPUT_GRADIENT_CASES` and `HALF_CASES`
    (a CUDA device only:
    `ValueError` otherwise), `small` = `SMALL_CASES` on either."""
    device = torch.device(device)
    if full and device.type != "cuda":
        raise ValueError(f"full: the peer-table cases need a CUDA device, got {device}")
    if small:
        chosen = SMALL_CASES
    elif device.type == "cpu":
        chosen = CPU_QUICK_CASES if quick else CPU_CASES
    else:
        chosen = (
            PEERS_CASES + FEW_FEATURE_CASES + FEW_FEATURE_GRADIENT_CASES + SINGLE_OUTPUT_GRADIENT_CASES + HALF_CASES
            if full
            else GPU_QUICK_CASES
            if quick
            else GPU_CASES
        )
    return [c.on(device) for c in chosen]


# -- what gets timed --------------------------------------------------------------------------


def kermac_fn(case: BenchCase, backend: str) -> Callable[..., torch.Tensor]:
    """`fn(*inputs, out)`: the case's kermac operation through `backend`, writing into `out`."""
    import kermac

    if case.op == "cdist":
        p = case.p
        return lambda x, z, out: kermac.cdist(x, z, p, out=out, backend=backend)
    if case.op == "grad":
        p = case.p
        return lambda a, b, c, d, out: kermac.cdist_grad(a, b, c, d, p=p, out=out, backend=backend)
    sigma = case.bandwidth
    if case.op == "program":
        program, hypers = user_program(), {"gamma": sigma**-2}
        return lambda x, z, out: kermac.run_program(program, x, z, hypers=hypers, out=out, backend=backend)
    if case.kernel == "gaussian":
        return lambda x, z, out: kermac.run_kernel("gaussian", x, z, out=out, bandwidth=sigma, backend=backend)
    preset = _laplace_preset(case.p)
    if preset != "laplace_lp":
        return lambda x, z, out: kermac.run_kernel(preset, x, z, out=out, bandwidth=sigma, backend=backend)
    p = case.p
    return lambda x, z, out: kermac.run_kernel(preset, x, z, out=out, p=p, bandwidth=sigma, backend=backend)


def user_program() -> PairwiseProgram:
    """The program of op `"program"`: `out[m, n] = 1 / (1 + γ·Σ_k (x[m,k] − z[n,k])²)`, the Cauchy
    kernel with the hyperparameter `γ`, built from [`kermac.ir`][kermac.ir] nodes as a user would."""
    from kermac import ir
    from kermac.programs import PairwiseProgram

    t = ir.Var("x") - ir.Var("z")
    return PairwiseProgram(inner=t * t, reduction="sum", epilogue=1.0 / (1.0 + ir.Hyper("gamma") * ir.Var("acc")))


def _laplace_preset(p: float) -> str:
    """The preset of a Laplace kernel case: `laplace_l1`, `laplace_l2` or `laplace_lp`."""
    return {1.0: "laplace_l1", 2.0: "laplace_l2"}.get(p, "laplace_lp")


def torch_fn(case: BenchCase) -> Callable[..., torch.Tensor] | None:
    """`fn(*inputs)`: how plain PyTorch computes the case (it allocates its output), or `None` where it has no way.

    cdist: `torch.cdist`; kernel: `torch.cdist` then `exp`; program: `torch.cdist`, then the
    Cauchy kernel's arithmetic in place; grad: only for p = 2,
    `d[n,m]·(c a)[o,m] − Σ_k c[o,k] a[k,m] b[n,k]` with two matrix products (`None` for
    other p: PyTorch has no memory-bounded way to compute it).  Half inputs: only p = 2 (`torch.cdist` has no
    float16 or bfloat16 kernel for other p).
    """
    p = case.p
    if case.dtype != "float32" and p != 2.0:
        return None
    if case.op == "cdist":
        return lambda x, z: torch.cdist(x, z, p)
    if case.op == "program":
        gamma = case.bandwidth**-2
        return lambda x, z: torch.cdist(x, z).square_().mul_(gamma).add_(1.0).reciprocal_()
    if case.op == "kernel":
        sigma = case.bandwidth
        if case.kernel == "gaussian":
            return lambda x, z: torch.cdist(x, z).square_().mul_(-0.5 / sigma**2).exp_()
        return lambda x, z: torch.cdist(x, z, p).mul_(-1.0 / sigma).exp_()
    if p != 2.0:
        return None

    def grad_p2(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        ca = c @ a  # [O, M]
        cab = torch.matmul(c[:, None, :] * b[None, :, :], a)  # [O, N, K] @ [K, M] -> [O, N, M]
        return cab.neg_().add_(ca[:, None, :] * d[None, :, :])

    return grad_p2


def reference(case: BenchCase, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The float64 answer for `inputs` (upcast), from `REFERENCE_BACKEND`."""
    wide = [t.double() for t in inputs]
    out = torch.empty(case.out_shape, device=wide[0].device, dtype=torch.float64)
    return kermac_fn(case, REFERENCE_BACKEND)(*wide, out)


CORNER_WORK = 1 << 36
"""Multiply-adds (M·N·D; M·N·O·K for gradients) past which a case's float64 reference would take longer than
timing the case: `checked_part` then checks it on its `corner`."""


def checked_on_corner(case: BenchCase) -> bool:
    """Whether `checked_part` checks `case` on its `corner` (past `CORNER_WORK` multiply-adds)."""
    return math.prod(case.sizes) > CORNER_WORK


def checked_part(
    case: BenchCase, inputs: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The float64 reference of what a check of `case` on `inputs` compares, and the map from a whole answer to
    that part: the whole answer, or past `CORNER_WORK` multiply-adds the corner of `corner` (the whole reduction
    of its rows and columns)."""
    if not checked_on_corner(case):
        return reference(case, inputs), lambda answer: answer
    sub, sub_inputs, _ = corner(case, inputs, torch.empty(case.out_shape, device="meta"))
    return reference(sub, sub_inputs), lambda answer: corner(case, inputs, answer)[2]


def corner(
    case: BenchCase, inputs: Sequence[torch.Tensor], out: torch.Tensor, *, size: int = 256
) -> tuple[BenchCase, tuple[torch.Tensor, ...], torch.Tensor]:
    """A corner of `case` whose float64 reference is cheap, for checking a problem too large to check whole.

    Pairwise: the first `size` rows of x against the last `size` rows of z, `out[:size, -size:]`;
    gradient: the first `size` columns m of a and d and the first 8 rows n of b and d,
    `out[:, :8, :size]` (the whole reduction either way).  Returns (the corner as a case, its
    inputs, the view of `out` that holds its answer).
    """
    if case.op == "grad":
        a, b, c, d = inputs
        m, n = min(size, a.shape[1]), min(8, b.shape[0])
        sub = dataclasses.replace(case, sizes=(m, n, *case.sizes[2:]))
        return sub, (a[:, :m], b[:n], c, d[:n, :m]), out[:, :n, :m]
    x, z = inputs
    m, n = min(size, x.shape[0]), min(size, z.shape[0])
    sub = dataclasses.replace(case, sizes=(m, n, case.sizes[2]))
    return sub, (x[:m], z[z.shape[0] - n :]), out[:m, out.shape[1] - n :]


def max_rel_error(result: torch.Tensor, ref: torch.Tensor, *, chunk_elems: int = 1 << 26) -> float:
    """`max |result − ref| / max |ref|` (relative error in the max norm), in float64.

    Computed over chunks of at most `chunk_elems` elements so it needs no full-size temporary.
    NaN anywhere in `result` gives NaN.  Shapes must match.
    """
    if result.shape != ref.shape:
        raise ValueError(f"result: expected shape {tuple(ref.shape)} (the reference's), got {tuple(result.shape)}")
    flat_res = result.reshape(-1)
    flat_ref = ref.reshape(-1)
    err = torch.zeros((), dtype=torch.float64, device=ref.device)
    scale = torch.zeros((), dtype=torch.float64, device=ref.device)
    for start in range(0, flat_ref.numel(), chunk_elems):
        r = flat_ref[start : start + chunk_elems].double()
        y = flat_res[start : start + chunk_elems].to(device=ref.device, dtype=torch.float64)
        err = torch.maximum(err, (y - r).abs().max())  # maximum propagates NaN
        scale = torch.maximum(scale, r.abs().max())
    err, scale = float(err), float(scale)
    if math.isnan(err):
        return math.nan
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def tolerance(case: BenchCase) -> float:
    """Largest `max_rel_error` a result may show before `kermac bench` flags it: float32's, or for a half output
    four times its rounding (float16 2⁻¹¹, bfloat16 2⁻⁸ relative): the rounding of the output, and of what a
    baseline computes in the half dtype (`torch.cdist`'s p = 2 expansion cancels there)."""
    if case.dtype != "float32":
        return 2 * torch.finfo(case.torch_dtype).eps  # eps / 2 is the rounding
    return 1e-3 if case.op == "grad" else 1e-4


# -- timing -----------------------------------------------------------------------------------


def _l2_bytes(device: torch.device) -> int:
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def rotation_count(case: BenchCase, *, l2_bytes: int | None = None, max_sets: int = 32) -> int:
    """How many input sets to rotate among so the inputs are not L2-resident between calls.

    On CUDA, when one input set is smaller than twice the L2 cache (`l2_bytes`, default: the
    device's), `ceil(2·L2 / input_bytes)` sets (at most `max_sets`); otherwise, and on the
    CPU, 1.
    """
    device = torch.device(case.device)
    if device.type != "cuda":
        return 1
    l2 = _l2_bytes(device) if l2_bytes is None else l2_bytes
    if case.input_bytes >= 2 * l2:
        return 1
    return min(max_sets, math.ceil(2 * l2 / case.input_bytes))


def input_sets(case: BenchCase, *, seed: int = 0, rotate: bool = True) -> list[tuple[torch.Tensor, ...]]:
    """Input sets for timing: one, or `rotation_count` of them if `rotate`."""
    n = rotation_count(case) if rotate else 1
    return [case.make_inputs(seed + i) for i in range(n)]


def time_ms(
    fn: Callable[..., object],
    *,
    device: str | torch.device,
    warmup: int = 2,
    repeat: int = 10,
    args: Sequence[Sequence[object]] | None = None,
    max_seconds: float | None = None,
) -> list[float]:
    """Milliseconds of each of `repeat` calls of `fn` after `warmup` untimed calls.

    Call `i` (warm-up included) is `fn(*args[i % len(args)])`, so several input sets can be
    rotated; `args=None` calls `fn()`.  On CUDA each call is bracketed by CUDA events on the
    current stream and the host synchronises only after the warm-up and after the last call; on
    the CPU `time.perf_counter` is used.  With `max_seconds`, the last warm-up call's time
    estimates the cost and `repeat` is lowered (to no fewer than 3 calls) so the timed calls
    take about `max_seconds`.  Report the median with `statistics.median`.
    """
    if warmup < 0 or repeat < 1:
        raise ValueError(f"warmup, repeat: expected warmup >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")
    device = torch.device(device)
    sets = [()] if args is None else [tuple(a) for a in args]
    if not sets:
        raise ValueError("args: expected at least one argument set (or None), got an empty sequence")
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    estimate = None
    for i in range(warmup):
        start = time.perf_counter()
        fn(*sets[i % len(sets)])
        sync()
        estimate = time.perf_counter() - start
    if max_seconds is not None and estimate:
        repeat = max(min(repeat, 3), min(repeat, int(max_seconds / estimate)))
    calls = [sets[(warmup + i) % len(sets)] for i in range(repeat)]
    if not cuda:
        times = []
        for a in calls:
            start = time.perf_counter()
            fn(*a)
            times.append(1e3 * (time.perf_counter() - start))
        return times
    with torch.cuda.device(device):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in calls]
        for a, (start_ev, end_ev) in zip(calls, events, strict=True):
            start_ev.record()
            fn(*a)
            end_ev.record()
        sync()
    return [s.elapsed_time(e) for s, e in events]
