"""From a normalised problem to a kernel launch: specialisation, arguments, grid.

Nothing here synchronises with the host or allocates device memory: scalars travel as kernel
arguments, tensor hyperparameters as pointers with per-batch strides, and every operand (any
strides, stride-0 broadcast batches) is read in place.  The kernel runs on PyTorch's current
stream of the operands' device.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from kermac.kernel_facts import INT32_MAX, TILE_SLACK, cancellation_guard, tensor_core_eligible
from kermac.layout import BatchLayout, batch_layout, grad_operands, pairwise_operands
from kermac.problem import GradProblem, PairwiseProblem
from kermac_backend_triton import configs
from kermac_backend_triton.generated import GRAD_ENTRY, PAIRWISE_ENTRY, GradSpec, PairwiseSpec, kernel_source
from kermac_backend_triton.interpreter import interpreting
from kermac_backend_triton.modules import load_module
from kermac_backend_triton.tuning import DEFAULT_TUNING, TritonTuning

__all__ = [
    "compute_type",
    "gluon_available",
    "grad_spec",
    "grid_size_problem",
    "pairwise_spec",
    "run_grad",
    "run_pairwise",
    "uses_tensor_cores",
]

_lock = threading.Lock()
_kernels: dict[tuple[PairwiseSpec | GradSpec, bool], Callable[..., Any]] = {}


@functools.cache
def gluon_available() -> str | None:
    """`None` if this Triton has the Gluon features the Gluon kernel uses, else what is missing."""
    try:
        from triton.experimental.gluon import language as gl
    except ImportError as exc:
        return f"triton.experimental.gluon cannot be imported ({exc})"
    needed = ("allocate_shared_memory", "BlockedLayout", "SliceLayout", "SwizzledSharedLayout", "num_warps")
    missing = [name for name in needed if not hasattr(gl, name)]
    if not (hasattr(gl, "barrier") or hasattr(gl, "thread_barrier")):
        missing.append("barrier")
    if missing:
        return f"triton.experimental.gluon.language lacks {', '.join(missing)}"
    return None


def compute_type(dtype: torch.dtype) -> str:
    """float64 computes in float64; float32, float16 and bfloat16 in float32."""
    return "float64" if dtype == torch.float64 else "float32"


def _needs_int64(tensors: list[torch.Tensor], programs: int) -> bool:
    for t in tensors:
        extent = sum((size + TILE_SLACK) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))
        if extent > INT32_MAX:
            return True
    return programs > INT32_MAX // 2


def _layout_args(layout: BatchLayout, operands: list[str]) -> list[int]:
    args = list(layout.shape)
    for op in operands:
        args += list(layout.strides[op])
    return args


def _kernel(spec: PairwiseSpec | GradSpec, autotune: bool, debug: bool) -> Callable[..., Any]:
    """The compiled-on-demand kernel of `spec`: autotuned on a GPU if `autotune`, else plain."""
    autotune = autotune and not interpreting()
    key = (spec, autotune)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    module = load_module(kernel_source(spec), debug=debug)
    if isinstance(spec, GradSpec):
        fn, space, prune, key_args = getattr(module, GRAD_ENTRY), configs.grad_configs, None, ["KEY"]
    else:
        fn, prune, key_args = getattr(module, PAIRWISE_ENTRY), None, ["KEY"]
        if spec.kernel == "tensor_cores":
            space, prune = configs.pairwise_tc_configs, {"early_config_prune": configs.prune_pairwise_tc}
        elif spec.kernel == "gluon":
            space = configs.gluon_pairwise_configs
            key_args = ["KEY", "XT", "ZT"]  # transposed operands load along other dimensions
        else:
            space = configs.pairwise_configs
    if autotune:
        import triton

        fn = triton.autotune(configs=space(), key=key_args, cache_results=True, prune_configs_by=prune)(fn)
    with _lock:
        return _kernels.setdefault(key, fn)


def _device_guard(t: torch.Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


def _tensor_hypers(problem: PairwiseProblem | GradProblem) -> frozenset[str]:
    return frozenset(n for n, h in problem.hypers.items() if h.tensor is not None)


def _hyper_args(problem: PairwiseProblem | GradProblem, names: tuple[str, ...]) -> list[object]:
    values = [problem.hypers[n] for n in names]
    return [h.tensor if h.tensor is not None else h.scalar for h in values]


def _rows_contiguous(t: torch.Tensor) -> int:
    """1 where `t`'s unit stride is along its rows (a transposed operand), else 0."""
    return int(t.stride(-1) != 1 and t.stride(-2) == 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_size_problem(problem: PairwiseProblem | GradProblem) -> str | None:
    """`None` if the launch grid fits CUDA's limit with the smallest tiles, else why not."""
    batch = math.prod(problem.batch_shape)
    if isinstance(problem, PairwiseProblem):
        space = configs.PAIRWISE_SPACE
        tiles = min(_cdiv(problem.m, c["MI"] * c["MT"]) * _cdiv(problem.n, c["NI"] * c["NT"]) for c, _, _ in space)
    else:
        m, n, o, _ = problem.sizes
        pairs = min(_cdiv(n, c["BN"]) * _cdiv(m, c["BM"]) for c, *_ in configs.GRAD_SPACE)
        tiles = _cdiv(o, configs.grad_block_o(o)) * pairs
    if batch * tiles > INT32_MAX:
        return f"the problem needs {batch * tiles} thread blocks, more than CUDA's limit of {INT32_MAX}"
    return None


def uses_tensor_cores(problem: PairwiseProblem, tuning: TritonTuning = DEFAULT_TUNING) -> bool:
    """Whether `problem` runs on the tensor-core kernel (float32 p = 2 family, D ≥ `TC_MIN_D`)."""
    return (
        tuning.tensor_cores
        and problem.d >= configs.TC_MIN_D
        and tensor_core_eligible(problem.program, compute_type(problem.dtype))
    )


def _pairwise_kernel(problem: PairwiseProblem, compute: str, tuning: TritonTuning) -> str:
    """Which pairwise kernel runs `problem` (one of `kermac_backend_triton.generated.KERNELS`)."""
    if uses_tensor_cores(problem, tuning):
        return "tensor_cores"
    gpu_float32 = compute == "float32" and not interpreting()
    if gpu_float32 and tuning.gluon and gluon_available() is None:
        return "gluon"
    return "simt"


def pairwise_spec(problem: PairwiseProblem, tuning: TritonTuning = DEFAULT_TUNING) -> tuple[PairwiseSpec, BatchLayout]:
    """The kernel specialisation and batch layout of a pairwise problem."""
    layout = batch_layout(problem.batch_shape, pairwise_operands(problem))
    programs = layout.size * _cdiv(problem.m, 16) * _cdiv(problem.n, 16)
    tensors = [problem.x, problem.z, problem.out] + [h.tensor for h in problem.hypers.values() if h.tensor is not None]
    compute = compute_type(problem.dtype)
    spec = PairwiseSpec(
        program=problem.program,
        compute=compute,
        nbatch=len(layout.shape),
        tensor_hypers=_tensor_hypers(problem),
        int64=_needs_int64(tensors, programs),
        kernel=_pairwise_kernel(problem, compute, tuning),
    )
    return spec, layout


def grad_spec(problem: GradProblem) -> tuple[GradSpec, BatchLayout]:
    """The kernel specialisation and batch layout of a gradient problem."""
    layout = batch_layout(problem.batch_shape, grad_operands(problem))
    m, n, o, _ = problem.sizes
    programs = layout.size * _cdiv(m, 8) * _cdiv(n, 2) * _cdiv(o, 16)
    tensors = [problem.a, problem.b, problem.c, problem.d, problem.out]
    tensors += [h.tensor for h in problem.hypers.values() if h.tensor is not None]
    spec = GradSpec(
        program=problem.program,
        compute=compute_type(problem.dtype),
        nbatch=len(layout.shape),
        tensor_hypers=_tensor_hypers(problem),
        int64=_needs_int64(tensors, programs),
    )
    return spec, layout


def run_pairwise(
    problem: PairwiseProblem, meta: dict[str, int] | None = None, *, tuning: TritonTuning = DEFAULT_TUNING
) -> None:
    """Launch the pairwise kernel of `problem` (`meta` forces a tile configuration)."""
    spec, layout = pairwise_spec(problem, tuning)
    kernel = _kernel(spec, tuning.autotune, problem.debug)
    x, z, out = problem.x, problem.z, problem.out
    m, n, d = problem.m, problem.n, problem.d
    operands = ["x", "z", "out"] + [f"hyper_{h}" for h in sorted(spec.tensor_hypers)]
    args = [x, z, out, *_hyper_args(problem, spec.program.hypers), m, n, d, problem.offset_m, problem.offset_n]
    args += [x.stride(-2), x.stride(-1), z.stride(-2), z.stride(-1), out.stride(-2), out.stride(-1)]
    args += _layout_args(layout, operands)
    batch = layout.size
    tc = spec.kernel == "tensor_cores"
    if tc:
        args.append(cancellation_guard(d))

    def grid(meta_: dict[str, int]) -> tuple[int]:
        if spec.kernel == "simt":
            return (batch * _cdiv(m, meta_["MI"] * meta_["MT"]) * _cdiv(n, meta_["NI"] * meta_["NT"]),)
        return (batch * _cdiv(m, meta_["BM"]) * _cdiv(n, meta_["BN"]),)

    extra: dict[str, int] = {}
    if interpreting():
        extra = dict(configs.INTERPRET_PAIRWISE_TC if tc else configs.INTERPRET_PAIRWISE)
    elif not tuning.autotune:
        if tc:
            extra = configs.default_pairwise_tc(d)
        else:
            extra = dict(configs.DEFAULT_GLUON_PAIRWISE if spec.kernel == "gluon" else configs.DEFAULT_PAIRWISE)
    if meta is not None:
        kernel = kernel.fn if hasattr(kernel, "configs") else kernel  # unwrap the autotuner
        extra = dict(meta)
    if spec.kernel == "gluon":  # load along the rows where that is an operand's unit stride
        extra |= {"XT": _rows_contiguous(x), "ZT": _rows_contiguous(z)}
    with _device_guard(out):
        kernel[grid](*args, KEY=configs.bucket(batch, m, n, d), **extra)


def run_grad(
    problem: GradProblem, meta: dict[str, int] | None = None, *, tuning: TritonTuning = DEFAULT_TUNING
) -> None:
    """Launch the gradient kernel of `problem` (`meta` forces a tile configuration)."""
    spec, layout = grad_spec(problem)
    kernel = _kernel(spec, tuning.autotune, problem.debug)
    a, b, c, d, out = problem.a, problem.b, problem.c, problem.d, problem.out
    m, n, o, k = problem.sizes
    operands = ["a", "b", "c", "d", "out"] + [f"hyper_{h}" for h in sorted(spec.tensor_hypers)]
    args = [a, b, c, d, out, *_hyper_args(problem, spec.program.hypers), m, n, o, k]
    args += [a.stride(-2), a.stride(-1), b.stride(-2), b.stride(-1), c.stride(-2), c.stride(-1)]
    args += [d.stride(-2), d.stride(-1), out.stride(-3), out.stride(-2), out.stride(-1)]
    args += _layout_args(layout, operands)
    batch = layout.size
    block_o = configs.grad_block_o(o)

    def grid(meta_: dict[str, int]) -> tuple[int]:
        return (batch * _cdiv(o, block_o) * _cdiv(n, meta_["BN"]) * _cdiv(m, meta_["BM"]),)

    extra: dict[str, int] = {}
    if interpreting():
        extra = dict(configs.INTERPRET_GRAD)
    elif not tuning.autotune:
        extra = dict(configs.DEFAULT_GRAD)
    if meta is not None:
        kernel = kernel.fn if hasattr(kernel, "configs") else kernel  # unwrap the autotuner
        extra = dict(meta)
    with _device_guard(out):
        kernel[grid](*args, KEY=configs.bucket(batch, m, n, o, k), BO=block_o, **extra)
