"""From a normalised problem to a kernel launch: specialisation, arguments, grid.

Nothing here synchronises with the host or allocates device memory (but for the float32 tensor-core kernel
product's split operands, `kermac_backend_triton.operand_split`): scalars travel as kernel
arguments, tensor hyperparameters as pointers with per-batch strides, and every operand (any
strides, stride-0 broadcast batches) is read in place.  The kernel runs on PyTorch's current
stream of the operands' device.

A call is keyed in two steps, each a dictionary lookup: its *family* (program, tuning, dtype,
whether D reaches the tensor cores, device type; for a kernel product or its gradient also that it is
one) fixes the kernel; within it, the key holds the
facts of this call that decide the compiled kernel and its configuration (device, coalesced
batch dimensions, 64-bit indexing, the autotuning bucket, the gradient's `BO`, the product's
`BC` (and on the tensor cores `BK`, `X_RESIDENT`, `PRESPLIT`), the gradient product's `BD` and `RMW`, and what Triton
specialises on:
`kermac_backend_triton.launchers.int_facts`, `kermac_backend_triton.launchers.pointer_facts`).  A key seen
before launches its `Launcher`; a new one compiles, autotunes and launches through `kernel[grid]` (refused while
a CUDA graph is being captured).  Within `compiling_only()` (`kermac_backend_triton.precompile`) a new key
compiles every configuration the autotuner would try, through Triton's own `warmup`, and launches nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
import threading
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from kermac.kernel_facts import INT32_MAX, TILE_SLACK, cancellation_guard, tensor_core_eligible
from kermac.layout import BatchLayout, batch_layout, grad_operands, pairwise_operands
from kermac.problem import GradProblem, PairwiseProblem, ProductGradProblem, ProductProblem
from kermac_backend_triton import configs, operand_split
from kermac_backend_triton.generated import (
    GRAD_ENTRY,
    PAIRWISE_ENTRY,
    PRODUCT_ENTRY,
    PRODUCT_GRAD_ENTRY,
    PRODUCT_SPLIT_OPERANDS,
    GradSpec,
    PairwiseSpec,
    ProductGradSpec,
    ProductSpec,
    grad_kernel,
    kernel_source,
)
from kermac_backend_triton.interpreter import interpreting
from kermac_backend_triton.launchers import (
    Launcher,
    check_not_capturing,
    device_guard,
    int_facts,
    make_launcher,
    pointer_facts,
)
from kermac_backend_triton.modules import load_module
from kermac_backend_triton.product_gradient import weighted_reduction
from kermac_backend_triton.tuning import DEFAULT_TUNING, TritonTuning

__all__ = [
    "compiling_only",
    "compute_type",
    "gluon_available",
    "grad_spec",
    "grid_size_problem",
    "jit_function",
    "pairwise_kernel",
    "pairwise_spec",
    "product_kernel",
    "run_grad",
    "run_pairwise",
    "run_product",
    "run_product_grad",
    "uses_tensor_cores",
]

Problem = PairwiseProblem | GradProblem | ProductProblem | ProductGradProblem
Spec = PairwiseSpec | GradSpec | ProductSpec | ProductGradSpec

_lock = threading.Lock()
_kernels: dict[tuple[Spec, bool], Callable[..., Any]] = {}
_compile_only: ContextVar[list | None] = ContextVar("kermac_triton_compile_only", default=None)


@contextlib.contextmanager
def compiling_only() -> Iterator[list[tuple[Spec, Callable[..., Any]]]]:
    """Within: the `run_*` functions compile what a first launch would (every configuration the autotuner would
    try, by Triton's `warmup`: the argument specialisation and cache key of that launch) and launch nothing; the
    list yielded collects `(spec, kernel)` of each compilation.  Keys compiled so keep no `Launcher`."""
    compiled: list[tuple[Spec, Callable[..., Any]]] = []
    token = _compile_only.set(compiled)
    try:
        yield compiled
    finally:
        _compile_only.reset(token)


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
    """Whether an index may pass int32: a tensor's extent (with `TILE_SLACK` rows of clamped
    tiles) or the program count (doubled by index arithmetic)."""
    if programs > INT32_MAX // 2:
        return True
    for t in tensors:  # torch strides are never negative
        if sum(map(operator.mul, map(_SLACK, t.shape), t.stride())) > INT32_MAX:
            return True
    return False


_SLACK = TILE_SLACK.__add__


def _layout_args(layout: BatchLayout, operands: list[str]) -> list[int]:
    args = list(layout.shape)
    for op in operands:
        args += list(layout.strides[op])
    return args


def _kernel(spec: Spec, autotune: bool, debug: bool) -> Callable[..., Any]:
    """The compiled-on-demand kernel of `spec`: autotuned on a GPU if `autotune`, else plain."""
    autotune = autotune and not interpreting()
    key = (spec, autotune)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    module = load_module(kernel_source(spec), debug=debug)
    if isinstance(spec, GradSpec):
        space = functools.partial(_GRAD_TILES[spec.kernel].configs, spec.compute)
        fn, prune, key_args = getattr(module, GRAD_ENTRY), None, ["KEY"]
    elif isinstance(spec, ProductGradSpec):
        fn, prune, key_args, space = getattr(module, PRODUCT_GRAD_ENTRY), None, ["KEY"], configs.product_grad_configs
    elif isinstance(spec, ProductSpec):
        fn, prune, key_args = getattr(module, PRODUCT_ENTRY), {"early_config_prune": configs.prune_product}, ["KEY"]
        space = configs.product_tc_configs if spec.kernel == "tensor_cores" else configs.product_configs
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


def jit_function(kernel: Callable[..., Any]) -> Any:
    """The Triton `JITFunction` of a kernel `_kernel` returned (the autotuner wraps it where it tunes)."""
    return kernel.fn if hasattr(kernel, "configs") else kernel


def _tensor_hypers(problem: Problem) -> frozenset[str]:
    return frozenset(n for n, h in problem.hypers.items() if h.tensor is not None)


def _rows_contiguous(t: torch.Tensor) -> int:
    """1 where `t`'s unit stride is along its rows (a transposed operand), else 0."""
    return int(t.stride(-1) != 1 and t.stride(-2) == 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_size_problem(problem: Problem, tuning: TritonTuning = DEFAULT_TUNING) -> str | None:
    """`None` if the launch grid fits CUDA's limit with the smallest tiles of the kernel `tuning` chooses, else why
    not."""
    batch = math.prod(problem.batch_shape)
    if isinstance(problem, ProductGradProblem):
        m = problem.sizes[0]
        if batch * m <= INT32_MAX:
            return None
        tiles = _cdiv(m, max(meta["BM"] for meta, *_ in configs.PRODUCT_GRAD_SPACE))
    elif isinstance(problem, ProductProblem):
        m, _, _, c = problem.sizes
        if batch * m * c <= INT32_MAX:
            return None
        block_c = configs.product_block_c(c)
        simt = [_pairwise_tiles("simt")(meta)[0] for meta, *_ in configs.product_space(False, block_c)]
        tc = [*configs.product_space(True, block_c), *configs.PRODUCT_TC_SPLIT_SPACE]
        rows = max(simt + [meta["BM"] for meta, *_ in tc])
        tiles = _cdiv(m, rows) * _cdiv(c, block_c)
    elif isinstance(problem, PairwiseProblem):
        m, n = problem.m, problem.n
        if batch * m * n <= INT32_MAX:  # at most one program per output
            return None
        space = configs.PAIRWISE_SPACE
        tiles = min(_cdiv(m, c["MI"] * c["MT"]) * _cdiv(n, c["NI"] * c["NT"]) for c, _, _ in space)
    else:
        m, n, o, _ = problem.sizes
        if batch * m * n * o <= INT32_MAX:
            return None
        kernel = grad_kernel(problem.program, tuning.grad_tensor_cores)
        space = _GRAD_TILES[kernel].space(compute_type(problem.dtype))
        pairs = min(_cdiv(n, c["BN"]) * _cdiv(m, c["BM"]) for c, *_ in space)
        tiles = _cdiv(o, _grad_block_o(kernel, o)) * pairs
    if batch * tiles > INT32_MAX:
        return f"the problem needs {batch * tiles} thread blocks, more than CUDA's limit of {INT32_MAX}"
    return None


def uses_tensor_cores(problem: PairwiseProblem | ProductProblem, tuning: TritonTuning = DEFAULT_TUNING) -> bool:
    """Whether `problem` runs on (takes its K tiles from) the tensor-core kernel (float32 p = 2
    family, D ≥ `TC_MIN_D`)."""
    return (
        tuning.tensor_cores
        and problem.x.shape[-1] >= configs.TC_MIN_D
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
    int64 = _needs_int64(list(pairwise_operands(problem).values()), programs)
    kernel = _pairwise_kernel(problem, compute_type(problem.dtype), tuning)
    return _pairwise_spec(problem, kernel, len(layout.shape), int64), layout


def _grad_block_o(kernel: str, o: int) -> int:
    """Rows of `o` per program of gradient kernel `kernel` (one of `kermac_backend_triton.generated.GRAD_KERNELS`;
    the affine kernel's programs own one row)."""
    if kernel == "grad_affine":
        return 1
    return configs.grad_block_o(o) if kernel == "grad" else configs.general_grad_block_o(o)


@dataclass(frozen=True)
class _GradTiles:
    """A gradient kernel's tile configurations (`kermac_backend_triton.configs`) for a compute type: its autotuning
    space, as `triton.Config` objects, the configuration without autotuning, and the interpreter's."""

    space: Callable[[str], tuple]
    configs: Callable[[str], list]
    default: Callable[[str], dict[str, Any]]
    interpret: dict[str, int]


_GRAD_TILES = {
    "grad": _GradTiles(
        lambda _: configs.GRAD_SPACE,
        lambda _: configs.grad_configs(),
        lambda _: configs.DEFAULT_GRAD,
        configs.INTERPRET_GRAD,
    ),
    "grad_general": _GradTiles(
        lambda _: configs.GENERAL_GRAD_SPACE,
        lambda _: configs.general_grad_configs(),
        lambda _: configs.DEFAULT_GENERAL_GRAD,
        configs.INTERPRET_GENERAL_GRAD,
    ),
    "grad_affine": _GradTiles(
        configs.grad_affine_space,
        configs.grad_affine_configs,
        lambda compute: configs.launch_options(configs.grad_affine_space(compute)[0]),
        configs.INTERPRET_GRAD_AFFINE,
    ),
}
"""The tiles of each of `kermac_backend_triton.generated.GRAD_KERNELS`."""


def _grad_programs(kernel: str, batch: int, m: int, n: int, o: int) -> int:
    """A bound on the programs of a launch of gradient kernel `kernel`: every space's tiles hold at least 2 `n`
    and 8 `m`, and the product form's at least 16 `o` (its `BO`, which is 16 or more); the general form's `BO`
    is fixed by O, the affine kernel's is 1."""
    return batch * _cdiv(m, 8) * _cdiv(n, 2) * _cdiv(o, min(16, _grad_block_o(kernel, o)))


def grad_spec(problem: GradProblem, tuning: TritonTuning = DEFAULT_TUNING) -> tuple[GradSpec, BatchLayout]:
    """The kernel specialisation and batch layout of a gradient problem."""
    layout = batch_layout(problem.batch_shape, grad_operands(problem))
    m, n, o, _ = problem.sizes
    kernel = grad_kernel(problem.program, tuning.grad_tensor_cores)
    programs = _grad_programs(kernel, layout.size, m, n, o)
    int64 = _needs_int64(list(grad_operands(problem).values()), programs)
    return _grad_spec(problem, len(layout.shape), int64, kernel), layout


@dataclass(frozen=True)
class _Family:
    """What a family key decides once: the kernel, its compute type, and the `Launcher` of each
    call key seen (see the module docs)."""

    kernel: str
    compute: str
    launchers: dict[tuple, Launcher] = field(default_factory=dict, compare=False)


_families: dict[tuple, _Family] = {}


def _family(key: tuple, kernel: Callable[[], str], compute: str) -> _Family:
    family = _families.get(key)
    if family is None:
        with _lock:
            family = _families.setdefault(key, _Family(kernel(), compute))
    return family


def _pairwise_tiles(kernel: str) -> Callable[[Mapping[str, Any]], tuple[int, int]]:
    """Output rows and columns of one program of pairwise kernel `kernel`, from its meta-parameters."""
    if kernel == "simt":
        return lambda meta: (meta["MI"] * meta["MT"], meta["NI"] * meta["NT"])
    return lambda meta: (meta["BM"], meta["BN"])


def _grad_tiles(meta: Mapping[str, Any]) -> tuple[int, int]:
    """(n, m) pairs of one gradient program, from its meta-parameters."""
    return meta["BN"], meta["BM"]


def _operands(problem: Problem) -> dict[str, torch.Tensor]:
    """The batched tensors of `problem` by name (`kermac.layout`'s, and x, z, v, out and tensor
    hyperparameters of a product, with g of a gradient product)."""
    if isinstance(problem, PairwiseProblem):
        return pairwise_operands(problem)
    if isinstance(problem, GradProblem):
        return grad_operands(problem)
    ops = {"x": problem.x, "z": problem.z, "v": problem.v, "out": problem.out}
    if isinstance(problem, ProductGradProblem):
        ops["g"] = problem.g
    ops.update({f"hyper_{k}": h.tensor for k, h in problem.hypers.items() if h.tensor is not None})
    return ops


def _batch_args(
    problem: Problem, operands: list[str], workspaces: Mapping[str, torch.Tensor] | None = None
) -> tuple[list[int], int, int]:
    """(batch sizes and per-operand strides as kernel arguments, coalesced batch dimensions, entries);
    `workspaces`: batched tensors of the launch beside the problem's operands."""
    if not problem.batch_shape:
        return [], 0, 1
    layout = batch_layout(problem.batch_shape, {**_operands(problem), **(workspaces or {})})
    return _layout_args(layout, operands), len(layout.shape), layout.size


def _hyper_values(problem: Problem) -> tuple[list[object], list[str]]:
    """The hyperparameter arguments in the program's order, and the names of the tensor ones."""
    hypers = problem.hypers
    if not hypers:
        return [], []
    names = problem.program.hypers
    values = [hypers[name] for name in names]
    tensors = [name for name, h in zip(names, values, strict=True) if h.tensor is not None]
    return [h.tensor if h.tensor is not None else h.scalar for h in values], tensors


def _pairwise_args(problem: PairwiseProblem, tc: bool) -> tuple[list, list[int], list[int], int, int, int]:
    """The per-call arguments of the pairwise entry kernel (the guard included for the tensor-core
    kernel, `tc`), its specialised and unspecialised integers, the number of pointers and
    hyperparameters, the coalesced batch dimensions and the batch entries."""
    x, z, out = problem.x, problem.z, problem.out
    m, d = x.shape[-2:]
    n = z.shape[-2]
    hyper_args, tensor_names = _hyper_values(problem)
    layout_args, nbatch, batch = _batch_args(problem, ["x", "z", "out"] + [f"hyper_{h}" for h in tensor_names])
    xs, zs, os_ = x.stride(), z.stride(), out.stride()
    strides = [xs[-2], xs[-1], zs[-2], zs[-1], os_[-2], os_[-1]]
    off_m, off_n = problem.offset_m, problem.offset_n
    args = [x, z, out, *hyper_args, m, n, d, off_m, off_n, *strides, *layout_args]
    if tc:  # D is specialised too (the k loop's masks), and the guard follows the batch layout
        args.append(cancellation_guard(d))
        return args, [n, d, *strides, *layout_args], [m, off_m, off_n], 3 + len(hyper_args), nbatch, batch
    return args, [n, *strides, *layout_args], [m, d, off_m, off_n], 3 + len(hyper_args), nbatch, batch


def _pairwise_family(problem: PairwiseProblem, tuning: TritonTuning) -> _Family:
    x = problem.x
    key = (problem.program, tuning, x.dtype, x.shape[-1] >= configs.TC_MIN_D, x.is_cuda)
    family = _families.get(key)
    if family is None:
        compute = compute_type(x.dtype)
        family = _family(key, lambda: _pairwise_kernel(problem, compute, tuning), compute)
    return family


def pairwise_kernel(problem: PairwiseProblem, tuning: TritonTuning = DEFAULT_TUNING) -> str:
    """Which pairwise kernel runs `problem` (`pairwise_spec`'s `kernel`, looked up once per family)."""
    return _pairwise_family(problem, tuning).kernel


def run_pairwise(
    problem: PairwiseProblem, meta: dict[str, int] | None = None, *, tuning: TritonTuning = DEFAULT_TUNING
) -> None:
    """Launch the pairwise kernel of `problem` (`meta` forces a tile configuration, uncached)."""
    x = problem.x
    m, d = x.shape[-2:]
    n = problem.z.shape[-2]
    family = _pairwise_family(problem, tuning)
    args, specialised, unspecialised, pointers, nbatch, batch = _pairwise_args(problem, family.kernel == "tensor_cores")
    tensors = [t for t in args[:pointers] if isinstance(t, torch.Tensor)]
    int64 = _needs_int64(tensors, batch * _cdiv(m, 16) * _cdiv(n, 16))
    bucket = configs.bucket(batch, m, n, d)
    if meta is not None:
        spec = _pairwise_spec(problem, family.kernel, nbatch, int64)
        _run_forced(problem, spec, {"KEY": bucket, **meta, **_gluon_meta(problem, spec)}, args, (batch, m, n), tuning)
        return
    device = x.get_device()
    key = (device, nbatch, int64, bucket, int_facts(specialised, unspecialised), pointer_facts(args[:pointers]))
    launcher = family.launchers.get(key)
    if launcher is None:
        spec = _pairwise_spec(problem, family.kernel, nbatch, int64)
        extra = {**_launch_meta(spec, tuning, d), "KEY": bucket, **_gluon_meta(problem, spec)}
        _first_launch(family, key, spec, tuning, problem.debug, args, extra, (batch, m, n))
        return
    tm, tn = launcher.tiles
    launcher.launch(args, batch * _cdiv(m, tm) * _cdiv(n, tn), device)


def run_grad(
    problem: GradProblem, meta: dict[str, int] | None = None, *, tuning: TritonTuning = DEFAULT_TUNING
) -> None:
    """Launch the gradient kernel of `problem` (`meta` forces a tile configuration, uncached)."""
    a, b, c, d, out = problem.a, problem.b, problem.c, problem.d, problem.out
    k, m = a.shape[-2:]
    n, o = b.shape[-2], c.shape[-2]
    fkey = (problem.program, tuning, a.dtype, a.is_cuda)
    family = _families.get(fkey)
    if family is None:
        family = _family(fkey, lambda: grad_kernel(problem.program, tuning.grad_tensor_cores), compute_type(a.dtype))
    hyper_args, tensor_names = _hyper_values(problem)
    operands = ["a", "b", "c", "d", "out"] + [f"hyper_{h}" for h in tensor_names]
    layout_args, nbatch, batch = _batch_args(problem, operands)
    sa, sb, sc, sd, so = a.stride(), b.stride(), c.stride(), d.stride(), out.stride()
    strides = [sa[-2], sa[-1], sb[-2], sb[-1], sc[-2], sc[-1], sd[-2], sd[-1], so[-3], so[-2], so[-1]]
    args = [a, b, c, d, out, *hyper_args, m, n, o, k, *strides, *layout_args]
    pointers = 5 + len(hyper_args)
    programs = _grad_programs(family.kernel, batch, m, n, o)
    int64 = _needs_int64([t for t in args[:pointers] if isinstance(t, torch.Tensor)], programs)
    spec_of = functools.partial(_grad_spec, problem, nbatch, int64, family.kernel)
    block_o = _grad_block_o(family.kernel, o)
    batches = batch * _cdiv(o, block_o)  # programs per (n, m) tile
    bucket = configs.bucket(batch, m, n, o, k)
    if meta is not None:
        _run_forced(problem, spec_of(), {"KEY": bucket, "BO": block_o, **meta}, args, (batches, n, m), tuning)
        return
    device = a.get_device()
    key = (device, nbatch, int64, bucket, block_o, int_facts([*strides, *layout_args], [m, n, o, k]))
    key += (pointer_facts(args[:pointers]),)
    launcher = family.launchers.get(key)
    if launcher is None:
        spec = spec_of()
        extra = _launch_meta(spec, tuning, k) | {"KEY": bucket, "BO": block_o}
        _first_launch(family, key, spec, tuning, problem.debug, args, extra, (batches, n, m))
        return
    tn, tm = launcher.tiles
    launcher.launch(args, batches * _cdiv(n, tn) * _cdiv(m, tm), device)


def _product_family(problem: ProductProblem, tuning: TritonTuning) -> _Family:
    x = problem.x
    key = ("product", problem.program, tuning, x.dtype, x.shape[-1] >= configs.TC_MIN_D, x.is_cuda)
    family = _families.get(key)
    if family is None:
        tc = uses_tensor_cores(problem, tuning)
        family = _family(key, lambda: "tensor_cores" if tc else "simt", compute_type(x.dtype))
    return family


def product_kernel(problem: ProductProblem, tuning: TritonTuning = DEFAULT_TUNING) -> str:
    """Which kernel's K tiles `problem` contracts (one of `kermac_backend_triton.generated.PRODUCT_KERNELS`)."""
    return _product_family(problem, tuning).kernel


def run_product(problem: ProductProblem, *, tuning: TritonTuning = DEFAULT_TUNING) -> None:
    """Launch the kernel product of `problem` (`kermac_backend_triton.product`): one program per
    batch entry, `BM` rows and `BC` columns of `out`."""
    x, z, v, out = problem.x, problem.z, problem.v, problem.out
    if out.numel() == 0:  # M, C or the batch is 0: nothing to write (N = 0 writes zeros)
        return
    m, n, d, c = problem.sizes
    family = _product_family(problem, tuning)
    tc = family.kernel == "tensor_cores"
    hyper_args, tensor_names = _hyper_values(problem)
    block_c = configs.product_block_c(c)
    fixed: dict[str, int] = {"BC": block_c}
    pointer_args: list[torch.Tensor] = [x, z, v, out]
    split: dict[str, torch.Tensor] = {}
    sizes = [m, n, d, c]
    if tc:
        split, fixed["BK"], dp = _split_workspaces(x, z, d)
        fixed["X_RESIDENT"] = d <= fixed["BK"]
        fixed["PRESPLIT"] = bool(split)
        if not split:  # the kernel reads no workspace: x and z stand in for the pointers
            split = dict(zip(PRODUCT_SPLIT_OPERANDS, (x, x, x, z, z, z), strict=True))
        pointer_args += split.values()
        sizes = [m, n, d, dp, c]
    batched = ["x", "z", "v", "out", *split] + [f"hyper_{h}" for h in tensor_names]
    layout_args, nbatch, batch = _batch_args(problem, batched, split)
    xs, zs, vs, os_ = x.stride(), z.stride(), v.stride(), out.stride()
    strides = [xs[-2], xs[-1], zs[-2], zs[-1], vs[-2], vs[-1], os_[-2], os_[-1]]
    off_m, off_n = problem.offset_m, problem.offset_n
    args = [*pointer_args, *hyper_args, *sizes, off_m, off_n, *strides, *layout_args]
    pointers = len(pointer_args) + len(hyper_args)
    specialised, unspecialised = [*strides, *layout_args], [m, n, c, off_m, off_n]
    if tc:  # D and DP are specialised (the k loop's masks, as in the pairwise kernel), the guard follows
        args.append(cancellation_guard(d))
        specialised += [d, dp]
    else:
        unspecialised.append(d)
    tensors = [t for t in args[:pointers] if isinstance(t, torch.Tensor)]
    int64 = _needs_int64(tensors, batch * _cdiv(m, 16) * _cdiv(c, block_c))
    # The autotuner keeps its choice under KEY (and the dtypes): a launch from split workspaces has a space of its
    # own, so it has a KEY of its own.
    bucket = 2 * configs.bucket(batch, m, n, d, c) + fixed.get("PRESPLIT", 0)
    device = x.get_device()
    # Every meta-parameter the launch fixes is in the key: D = 32 and D = 48 share a bucket and D's facts but
    # not BK and X_RESIDENT, which select another compiled kernel.
    key = (device, nbatch, int64, bucket, tuple(sorted(fixed.items())), int_facts(specialised, unspecialised))
    key += (pointer_facts(args[:pointers]),)
    launcher = family.launchers.get(key)
    if launcher is None:
        spec = ProductSpec(problem.program, family.compute, nbatch, _tensor_hypers(problem), int64, family.kernel)
        extra = {**_launch_meta(spec, tuning, d, block_c, fixed.get("PRESPLIT", False)), "KEY": bucket, **fixed}
        tuning_args = product_tuning_args(args, pointers) if tuning.autotune and not interpreting() else None
        if tuning_args is not None:  # time the configurations on a corner of the problem, then launch it whole
            _tune(spec, tuning, problem.debug, tuning_args[0], extra, (batch, tuning_args[1], c), device)
        _first_launch(family, key, spec, tuning, problem.debug, args, extra, (batch, m, c))
        return
    tm, tc_cols = launcher.tiles
    launcher.launch(args, batch * _cdiv(m, tm) * _cdiv(c, tc_cols), device)


def _split_workspaces(x: torch.Tensor, z: torch.Tensor, d: int) -> tuple[dict[str, torch.Tensor], int, int]:
    """The tensor-core product's split workspaces by name (`kermac_backend_triton.generated.PRODUCT_SPLIT_OPERANDS`;
    empty where it splits in its main loop: half inputs, D within one step, or batch dimensions that do not
    merge), its `BK`, and the features per workspace row `DP` (D where there is none)."""
    in_loop = {}, configs.product_tc_block_k(d), d
    if x.dtype != torch.float32 or d <= in_loop[1] or not _splits_operands(x.device):
        return in_loop
    block_k = configs.PRODUCT_TC_SPLIT_BK
    with device_guard(x.get_device()):  # the split runs on the operands' device and its current stream
        xs = operand_split.split_operand(x, block_k)
        same = z is x or (z.data_ptr() == x.data_ptr() and z.shape == x.shape and z.stride() == x.stride())
        zs = xs if same or xs is None else operand_split.split_operand(z, block_k)
    if zs is None:
        return in_loop
    tensors = (xs.hi, xs.lo, xs.norm, zs.hi, zs.lo, zs.norm)
    return dict(zip(PRODUCT_SPLIT_OPERANDS, tensors, strict=True)), block_k, xs.hi.shape[-1]


def _splits_operands(device: torch.device) -> bool:
    """Whether the tensor-core product on `device` reads split workspaces: under the interpreter and on sm_90, where
    it was measured (`PRODUCT_TC_SPLIT_SPACE` spills in its innermost loop on sm_80, and outside it on sm_100 where
    it fits on sm_90: docs/dev/triton-product-presplit.md)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] == 9


def run_product_grad(problem: ProductGradProblem, *, tuning: TritonTuning = DEFAULT_TUNING) -> None:
    """Launch the gradient product of `problem` (`kermac_backend_triton.product_gradient`): one program per
    batch entry and `BM` rows of `out`.  A D beyond the features held in registers
    (`kermac_backend_triton.configs.product_grad_block_d`) is accumulated in `out` (`RMW`); a half-precision `out`
    then takes a float32 workspace of its shape, copied into it afterwards."""
    out = problem.out
    if out.numel() == 0:  # M, D or the batch is 0: nothing to write
        return
    if problem.sizes[1] == 0:  # an empty sum over n
        out.zero_()
        return
    if _product_grad_block_d(problem)[1] and out.dtype not in (torch.float32, torch.float64):
        workspace = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        _launch_product_grad(dataclasses.replace(problem, out=workspace), tuning)
        out.copy_(workspace)
        return
    _launch_product_grad(problem, tuning)


def _launch_product_grad(problem: ProductGradProblem, tuning: TritonTuning) -> None:
    x, z, v, g, out = problem.x, problem.z, problem.v, problem.g, problem.out
    m, n, d, c = problem.sizes
    fkey = ("product_grad", problem.program, tuning, x.dtype, x.is_cuda)
    family = _families.get(fkey)
    if family is None:
        family = _family(fkey, lambda: "product_grad", compute_type(x.dtype))
    hyper_args, tensor_names = _hyper_values(problem)
    operands = ["x", "z", "v", "g", "out"] + [f"hyper_{h}" for h in tensor_names]
    layout_args, nbatch, batch = _batch_args(problem, operands)
    xs, zs, vs, gs, os_ = x.stride(), z.stride(), v.stride(), g.stride(), out.stride()
    strides = [xs[-2], xs[-1], zs[-2], zs[-1], vs[-2], vs[-1], gs[-2], gs[-1], os_[-2], os_[-1]]
    off_m, off_n = problem.offset_m, problem.offset_n
    args = [x, z, v, g, out, *hyper_args, m, n, d, c, off_m, off_n, *strides, *layout_args]
    pointers = 5 + len(hyper_args)
    block_d, rmw = _product_grad_block_d(problem)
    tensors = [t for t in args[:pointers] if isinstance(t, torch.Tensor)]
    int64 = _needs_int64(tensors, batch * _cdiv(m, 8))
    bucket = configs.bucket(batch, m, n, d, c)
    device = x.get_device()
    key = (device, nbatch, int64, bucket, block_d, rmw)
    key += (int_facts([*strides, *layout_args], [m, n, d, c, off_m, off_n]), pointer_facts(args[:pointers]))
    launcher = family.launchers.get(key)
    if launcher is None:
        spec = ProductGradSpec(problem.program, family.compute, nbatch, _tensor_hypers(problem), int64)
        extra = {**_launch_meta(spec, tuning, d), "KEY": bucket, "BD": block_d, "RMW": rmw}
        _first_launch(family, key, spec, tuning, problem.debug, args, extra, (batch, m, 1))
        return
    launcher.launch(args, batch * _cdiv(m, launcher.tiles[0]), device)


def _product_grad_block_d(problem: ProductGradProblem) -> tuple[int, bool]:
    """`BD` and `RMW` of `problem` (`kermac_backend_triton.configs.product_grad_block_d`)."""
    weighted = weighted_reduction(problem.program.reduction)
    return configs.product_grad_block_d(problem.sizes[2], compute_type(problem.x.dtype), weighted)


def _pairwise_spec(problem: PairwiseProblem, kernel: str, nbatch: int, int64: bool) -> PairwiseSpec:
    return PairwiseSpec(
        program=problem.program,
        compute=compute_type(problem.dtype),
        nbatch=nbatch,
        tensor_hypers=_tensor_hypers(problem),
        int64=int64,
        kernel=kernel,
    )


def _grad_spec(problem: GradProblem, nbatch: int, int64: bool, kernel: str) -> GradSpec:
    return GradSpec(
        program=problem.program,
        compute=compute_type(problem.dtype),
        nbatch=nbatch,
        tensor_hypers=_tensor_hypers(problem),
        int64=int64,
        tensor_cores=kernel == "grad_affine",
    )


def _gluon_meta(problem: PairwiseProblem, spec: PairwiseSpec) -> dict[str, int]:
    """The Gluon kernel's `XT`, `ZT` (load along the rows where that is an operand's unit stride) and `FEW` (fewer
    than `configs.GLUON_FEW_FEATURES` features: skip the last chunk's missing ones; the autotuning key's bucket of D
    tells those apart, so `FEW` is not a key of its own)."""
    if spec.kernel != "gluon":
        return {}
    few = int(problem.x.shape[-1] < configs.GLUON_FEW_FEATURES)
    return {"XT": _rows_contiguous(problem.x), "ZT": _rows_contiguous(problem.z), "FEW": few}


def _launch_meta(spec: Spec, tuning: TritonTuning, d: int, block_c: int = 0, presplit: bool = False) -> dict[str, Any]:
    """Meta-parameters and launch options the launch fixes (the autotuner chooses the rest);
    `d`: the reduction length (D, or K of the gradient); `block_c`: a product's `BC`; `presplit`: a tensor-core
    product from split workspaces."""
    if isinstance(spec, ProductGradSpec):
        if interpreting():
            return dict(configs.INTERPRET_PRODUCT_GRAD)
        return {} if tuning.autotune else configs.launch_options(configs.PRODUCT_GRAD_SPACE[0])
    if isinstance(spec, ProductSpec):
        tc = spec.kernel == "tensor_cores"
        if interpreting():
            return dict(configs.INTERPRET_PRODUCT_TC if tc else configs.INTERPRET_PRODUCT)
        if tuning.autotune:
            return {}
        return configs.launch_options(configs.product_space(tc, block_c, presplit)[0])
    if isinstance(spec, GradSpec):
        tiles = _GRAD_TILES[spec.kernel]
        if interpreting():
            return dict(tiles.interpret)
        return {} if tuning.autotune else dict(tiles.default(spec.compute))
    tc = spec.kernel == "tensor_cores"
    if interpreting():
        return dict(configs.INTERPRET_PAIRWISE_TC if tc else configs.INTERPRET_PAIRWISE)
    if tuning.autotune:
        return {}
    if tc:
        return configs.default_pairwise_tc(d)
    return dict(configs.DEFAULT_GLUON_PAIRWISE if spec.kernel == "gluon" else configs.DEFAULT_PAIRWISE)


def _product_tiles(kernel: str) -> Callable[[Mapping[str, Any]], tuple[int, int]]:
    """Rows and columns of `out` of one program of the product on `kernel`'s K tiles."""
    rows = _pairwise_tiles(kernel)
    return lambda meta: (rows(meta)[0], meta["BC"])


def _product_grad_tiles(meta: Mapping[str, Any]) -> tuple[int, int]:
    """Rows of `out` of one gradient-product program, from its meta-parameters (and 1: it owns every feature,
    the grid's one column)."""
    return meta["BM"], 1


def _tiles_of(spec: Spec) -> Callable[[Mapping[str, Any]], tuple[int, int]]:
    if isinstance(spec, GradSpec):
        return _grad_tiles
    if isinstance(spec, ProductGradSpec):
        return _product_grad_tiles
    if isinstance(spec, ProductSpec):
        return _product_tiles(spec.kernel)
    return _pairwise_tiles(spec.kernel)


def _describe(spec: Spec) -> str:
    if isinstance(spec, ProductGradSpec):
        kernel = "kernel-product gradient"
    elif isinstance(spec, ProductSpec):
        kernel = f"kernel-product ({spec.kernel} K tiles)"
    elif isinstance(spec, GradSpec):
        kernel = {"grad": "gradient", "grad_general": "general gradient"}.get(spec.kernel, "tensor-core gradient")
    else:
        kernel = spec.kernel
    indices = "64" if spec.int64 else "32"
    return (
        f"its {kernel} kernel of program {spec.program.key()!r} ({spec.compute}, {spec.nbatch} batch "
        f"dimension(s), {indices}-bit indices) for this call's shapes, strides and alignment"
    )


def _first_launch(
    family: _Family,
    key: tuple,
    spec: Spec,
    tuning: TritonTuning,
    debug: bool,
    args: list,
    meta: dict[str, Any],
    grid_sizes: tuple[int, int, int],
) -> None:
    """Compile (and autotune) the variant of `key` through `kernel[grid]`, launch it and keep its
    `Launcher` for the key's later calls (none where Triton launched nothing: a JIT hook may skip one).

    `grid_sizes`: (programs per output tile, output rows, output columns) of the launch.
    """
    device = key[0]
    tiles_of = _tiles_of(spec)
    bound: list[Mapping[str, Any]] = []
    grid_of = _grid(tiles_of, grid_sizes)

    def grid(meta_: Mapping[str, Any]) -> tuple[int]:
        bound[:] = [meta_]  # Triton's bound arguments of the launch; the autotuner's last is the one kept
        return grid_of(meta_)

    kernel, result = _compile_and_launch(spec, tuning, debug, args, meta, grid, device)
    if bound:
        launcher = make_launcher(kernel, meta, tiles_of(bound[0]), args, result, dict(bound[0]), device)
        with _lock:
            family.launchers.setdefault(key, launcher)


def product_tuning_args(args: list, pointers: int) -> tuple[list, int] | None:
    """The kernel product's arguments `args` (M and N right after its `pointers` leading arguments: the tensors and
    the scalar hyperparameters) cut to the first `kermac_backend_triton.configs.PRODUCT_TUNING_SIZE` rows of x and
    z, and the rows kept, or None where M and N are both within that size.

    The autotuner times every configuration on the launch it is given; on a product with 10⁶ rows each timing is
    a full product.  The corner keeps every fact of the call that selects a kernel (pointers, strides, D, C and
    the shape bucket in `KEY`: the autotuner caches its choice under `KEY` and the dtypes, not under M or N), so
    the whole problem then launches the configuration chosen on the corner without timing again.  The corner's
    launch writes the first rows of `out`, which the whole launch writes again.
    """
    m, n = args[pointers], args[pointers + 1]
    size = configs.PRODUCT_TUNING_SIZE
    if m <= size and n <= size:
        return None
    rows = min(m, size)
    return [*args[:pointers], rows, min(n, size), *args[pointers + 2 :]], rows


def _tune(
    spec: Spec,
    tuning: TritonTuning,
    debug: bool,
    args: list,
    meta: dict[str, Any],
    grid_sizes: tuple[int, int, int],
    device: int,
) -> None:
    """Compile and autotune `spec` on the launch `args` through `kernel[grid]`, keeping no `Launcher`: the
    autotuner keeps its choice for the launches of the same `KEY`."""
    _compile_and_launch(spec, tuning, debug, args, meta, _grid(_tiles_of(spec), grid_sizes), device)


def _compile_and_launch(
    spec: Spec,
    tuning: TritonTuning,
    debug: bool,
    args: list,
    meta: dict[str, Any],
    grid: Callable[[Mapping[str, Any]], tuple[int]],
    device: int,
) -> tuple[Any, Any]:
    """`(kernel, Triton's result)` of launching `spec` through `kernel[grid]` on `device`, compiling (and
    autotuning) it as needed: refused while the device's current stream captures a graph.  Within
    `compiling_only()`: `(kernel, None)`, compiled and not launched."""
    kernel = _kernel(spec, tuning.autotune, debug)
    compiled = _compile_only.get()
    if compiled is not None:
        compiled.append((spec, kernel))  # before compiling: whoever undoes a compilation's effects must see it
        with device_guard(device):
            binaries = kernel.warmup(*args, grid=grid, **meta)
        _build_host_launchers(binaries if isinstance(binaries, list) else [binaries])
        return kernel, None
    check_not_capturing(device, lambda: _describe(spec))
    with device_guard(device):
        return kernel, kernel[grid](*args, **meta)


def _build_host_launchers(binaries: list[Any]) -> None:
    """Build the host-side launcher of each compiled kernel, as its first launch would.

    Triton 3.6 compiles one C launcher per argument signature at a kernel's first launch (a C compiler run,
    cached in Triton's cache beside the kernels); later Tritons build none (`launcher_cls` then only binds the
    driver's generic launch).  Only a GPU driver has `launcher_cls`: under `kermac precompile --arch` (the
    stand-in driver of `kermac_backend_triton.precompile`) the launcher is left to the first launch, as it is for
    what Triton did not compile here (None where a `jit_cache_hook` skipped a compilation; an asynchronous
    compilation's future)."""
    from triton.runtime import driver

    make = getattr(driver.active, "launcher_cls", None)
    if make is None:
        return
    for binary in binaries:
        if hasattr(binary, "src") and hasattr(binary, "metadata"):  # not None (a `jit_cache_hook` skipped it)
            make(binary.src, binary.metadata)


def _grid(
    tiles_of: Callable[[Mapping[str, Any]], tuple[int, int]], grid_sizes: tuple[int, int, int]
) -> Callable[[Mapping[str, Any]], tuple[int]]:
    """Triton's grid function of a launch of `grid_sizes` (programs per output tile, output rows, output columns):
    one program per tile of the meta-parameters' sizes."""
    count, rows, cols = grid_sizes

    def grid(meta: Mapping[str, Any]) -> tuple[int]:
        tr, tc = tiles_of(meta)
        return (count * _cdiv(rows, tr) * _cdiv(cols, tc),)

    return grid


def _run_forced(
    problem: PairwiseProblem | GradProblem,
    spec: PairwiseSpec | GradSpec,
    meta: dict[str, Any],
    args: list,
    grid_sizes: tuple[int, int, int],
    tuning: TritonTuning,
) -> None:
    """Launch `spec` with the tile configuration in `meta` (no autotuning, no `Launcher` kept)."""
    kernel = jit_function(_kernel(spec, tuning.autotune, problem.debug))
    with device_guard(problem.out.get_device()):
        kernel[_grid(_tiles_of(spec), grid_sizes)](*args, **meta)
