"""The public operations: [`cdist`][kermac.api.cdist], [`run_kernel`][kermac.api.run_kernel],
[`cdist_grad`][kermac.api.cdist_grad], [`run_program`][kermac.api.run_program], and the fused kernel products
[`kernel_product`][kermac.api.kernel_product] and [`program_product`][kermac.api.program_product].

Each call validates its arguments, lowers them to a semiring program ([`kermac.programs`][kermac.programs])
and runs it through [`kermac.ops`][kermac.ops]: one `torch.library` operation (`kermac::pairwise`,
`kermac::grad` or `kermac::product`) that normalises the problem (`kermac.problem`), picks the backend
(`kermac.dispatch`) and runs it, with its backward in [`kermac.autograd`][kermac.autograd].  The lowering is a
constant of the call's Python arguments (`torch.compile` evaluates it once while tracing).  Nothing
here synchronises with the host unless `debug` is on.  On the `meta` device the output is returned
as soon as it is validated (meta tensors hold no values).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import torch

from kermac import ops, presets, registry
from kermac.descriptor import KernelDescriptor
from kermac.hyperparams import (
    Check,
    HyperValue,
    finite,
    nonnegative,
    normalize_hyper,
    positive_finite,
    positive_up_to,
    prepare_hypers,
    program_hypers,
)
from kermac.logs import debug_enabled
from kermac.lowering import cdist_program, grad_program, plain_power_limit
from kermac.ops import constant_for_compile
from kermac.problem import check_tensor
from kermac.programs import GradProgram, PairwiseProgram, program_from_key, swap_operands

__all__ = [
    "backends",
    "cdist",
    "cdist_grad",
    "kernel_product",
    "program_product",
    "run_grad_program",
    "run_kernel",
    "run_program",
]


def backends() -> list[registry.BackendStatus]:
    """Every registered backend with its availability (and the reason when unavailable)."""
    return registry.backend_statuses()


def cdist(
    x: torch.Tensor,
    z: torch.Tensor,
    p: float | torch.Tensor = 2.0,
    compute_mode: str = "use_mm_for_euclid_dist_if_necessary",
    *,
    out: torch.Tensor | None = None,
    skip_epilogue: bool = False,
    backend: str = "auto",
    debug: bool = False,
) -> torch.Tensor:
    r"""p-norm distance between every row of `x` and every row of `z`, like `torch.cdist`.

    $$
    \mathrm{out}[\dots, m, n] = \Big(\sum_k |x[\dots, m, k] - z[\dots, n, k]|^p\Big)^{1/p}
    $$

    Args:
        x: `[..., M, D]` floating tensor.
        z: `[..., N, D]`, same dtype and device; batch dimensions broadcast with `x`'s.
        p: in [0, ∞].  `p = 0` counts differing coordinates, `p = ∞` takes the maximum;
            1 and 2 have fast paths (2 is computed from differences, exact for near-duplicate
            rows); numbers above [`plain_power_limit`][kermac.lowering.plain_power_limit] (about 3.96 for
            float32, 18.7 for float64) are guarded against under- and overflow, and from
            [`linf_threshold`][kermac.lowering.linf_threshold] computed as the maximum (`docs/formulas.md`).
            A tensor gives one `p` per batch entry (values must be > 0 and at most
            `plain_power_limit(x.dtype)`: an invalid one makes its batch entry NaN, or raises
            with `debug`; see [`kermac.hyperparams`][kermac.hyperparams] for the broadcasting rule).
        compute_mode: accepted for `torch.cdist` compatibility: `"donot_use_mm_for_euclid_dist"` is what
            kermac always does (p = 2 from differences, exact for near-duplicate rows, and fast);
            `"use_mm_for_euclid_dist_if_necessary"` (the default) and `"use_mm_for_euclid_dist"` get the
            same exact route.  Any other value is a `ValueError`, as in `torch.cdist`.
        out: optional `[..., M, N]` output of the inputs' dtype and device, any strides; its
            elements must not overlap each other nor any input (`ValueError` naming `out`).
        skip_epilogue: return the inner reduction `Σ_k |x − z|^p` without the `1/p` root
            (squared distances for `p = 2`; no effect for `p` in {0, 1, ∞}).
        backend: `"auto"` or a backend name (`"torch"`, `"nvrtc"`, `"triton"`).
        debug: log backend choice and compilation through the `kermac` logger.

    Returns:
        `out`, shape `[*broadcast(batch), M, N]`.

    Differentiable: where `x` or `z` requires grad (and grad mode is on), the result has a
    backward that runs [`cdist_grad`][kermac.api.cdist_grad] on the same backend ([`kermac.autograd`][kermac.autograd];
    p = ∞ takes a subgradient; second derivatives for p = 2; no `out`; no gradient for a tensor `p`).
    """
    debug = debug_enabled(debug)
    if compute_mode not in _COMPUTE_MODES:
        raise ValueError(f"compute_mode: expected one of {', '.join(map(repr, _COMPUTE_MODES))}; got {compute_mode!r}")
    x = check_tensor("x", x)
    if isinstance(p, torch.Tensor) and not (p.dim() == 0 and p.device.type == "cpu"):
        program, reads_p = _cdist_key(None, skip_epilogue, x.dtype)
        hypers = prepare_hypers({"p": (p, _p_per_batch(x.dtype))}, x.device, debug)
    else:
        hv = normalize_hyper("p", p, device=x.device, check=nonnegative)
        program, reads_p = _cdist_key(hv.scalar, skip_epilogue, x.dtype)
        hypers = {"p": hv} if reads_p else {}
    return _pairwise(program, x, z, out=out, hypers=hypers, backend=backend, debug=debug, op="cdist")


_COMPUTE_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist")


@constant_for_compile
def _cdist_key(p: float | None, skip_epilogue: bool, dtype: torch.dtype) -> tuple[str, bool]:
    """The key of `cdist`'s program and whether it reads `p` (constants of the Python arguments)."""
    return _cdist_key_cached(p, skip_epilogue, dtype)


@lru_cache(maxsize=256)
def _cdist_key_cached(p: float | None, skip_epilogue: bool, dtype: torch.dtype) -> tuple[str, bool]:
    program = cdist_program(p, skip_epilogue=skip_epilogue, dtype=dtype)
    return program.key(), "p" in program.hypers


def run_kernel(
    descriptor: KernelDescriptor | str,
    x: torch.Tensor,
    z: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    p: float | torch.Tensor | None = None,
    bandwidth: float | torch.Tensor | None = None,
    regularization: float | torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
) -> torch.Tensor:
    r"""One fused pass computing the kernel matrix named by `descriptor`.

    $$
    \mathrm{out}[\dots, m, n] = \kappa\big(d(x_m, z_n)\big) + \lambda\,[m + o_m = n + o_n]
    $$

    where `d` is the distance (or dot product) the descriptor defines and `κ` its kernel
    function (identity if none); see `docs/formulas.md` for every formula.

    Args:
        descriptor: a [`KernelDescriptor`][kermac.descriptor.KernelDescriptor] or the name of a preset in
            [`kermac.presets`][kermac.presets] (e.g. `"laplace_l2"`).
        x: `[..., M, D]`.
        z: `[..., N, D]` (batch dimensions broadcast with `x`'s).
        p: the norm exponent, required exactly when the descriptor uses it: > 0 and at most
            [`plain_power_limit`][kermac.lowering.plain_power_limit] of the inputs' dtype (about 3.96 for float32,
            18.7 for float64), beyond which the powers |x − z|^p lose accuracy; use
            [`cdist`][kermac.api.cdist] for larger p.
        bandwidth: σ > 0, required exactly when the descriptor has a kernel function.
        regularization: λ added on the shifted diagonal `m + offset_m == n + offset_n`;
            `None` (default) adds nothing.
        offset_m: row offset of the diagonal, e.g. the row origin of a tile of a larger kernel
            matrix; an integer in the int64 range.
        offset_n: column offset of the diagonal, likewise.
        out: optional `[..., M, N]` output, as in [`cdist`][kermac.api.cdist].
        backend: as in [`cdist`][kermac.api.cdist].
        debug: as in [`cdist`][kermac.api.cdist].

    Every hyperparameter may be a number or a tensor broadcasting against the batch dimensions
    (one value per batch entry computes a batch of kernel matrices in one launch).  Numbers are
    range-checked at once; an invalid tensor value makes every entry of its batch entry NaN (it
    raises under `debug`).
    """
    debug = debug_enabled(debug)
    descriptor = _descriptor(descriptor)
    x = check_tensor("x", x)
    program, hypers = lower_kernel(descriptor, x, p, bandwidth, regularization, debug)
    return _pairwise(
        program, x, z, out=out, hypers=hypers, offsets=(offset_m, offset_n), backend=backend, debug=debug,
        op="run_kernel",
    )  # fmt: skip


def lower_kernel(
    descriptor: object,
    x: torch.Tensor,
    p: object,
    bandwidth: object,
    regularization: object,
    debug: bool,
    what: str = "descriptor",
) -> tuple[str, dict[str, HyperValue]]:
    """The program key and checked hyperparameters of a kernel named by `descriptor` (a descriptor or a
    preset name; errors name it `what`) on inputs like `x`: `p` and `bandwidth` required exactly where the
    descriptor uses them, each range-checked ([`run_kernel`][kermac.api.run_kernel] documents the ranges).
    What [`run_kernel`][kermac.api.run_kernel], [`kernel_product`][kermac.api.kernel_product] and
    [`KernelOperator`][kermac.operator.KernelOperator] share."""
    descriptor = _descriptor(descriptor, what)
    given = {"p": p, "bandwidth": bandwidth}
    needed = {"p": descriptor.needs_p, "bandwidth": descriptor.needs_bandwidth}
    for name, value in given.items():
        if needed[name] and value is None:
            raise ValueError(f"{name}: required by descriptor {descriptor.key()}, got None")
        if not needed[name] and value is not None:
            raise ValueError(f"{name}: descriptor {descriptor.key()} does not use {name}; got {name}={value!r}")
    checks: dict[str, tuple[object, Check]] = {}
    if p is not None:
        checks["p"] = (p, _p_per_batch(x.dtype))
    if bandwidth is not None:
        checks["bandwidth"] = (bandwidth, positive_finite)
    if regularization is not None:
        checks["regularization"] = (regularization, finite)
    hypers = prepare_hypers(checks, x.device, debug)
    d = descriptor
    return _kernel_key(d.inner, d.power, d.reduction, d.outer, d.kernel, regularization is not None), hypers


@constant_for_compile
def _kernel_key(inner: str, power: str, reduction: str, outer: str, kernel: str | None, regularized: bool) -> str:
    """The key of the program of the descriptor with these fields (a constant of the Python arguments,
    which are plain values: `torch.compile` passes no other to a constant function)."""
    return _kernel_key_cached(inner, power, reduction, outer, kernel, regularized=regularized)


@lru_cache(maxsize=256)
def _kernel_key_cached(*fields: str | None, regularized: bool) -> str:
    return KernelDescriptor(*fields).lower(regularized=regularized).key()


@lru_cache(maxsize=8)
def _p_per_batch(dtype: torch.dtype) -> Check:
    """The range of a p that runs the plain (Σ|t|^p)^(1/p): up to where its powers stay accurate
    in `dtype` ([`kermac.lowering.plain_power_limit`][kermac.lowering.plain_power_limit]; `cdist` guards a larger
    number p)."""
    return positive_up_to(plain_power_limit(dtype), f"the largest p whose powers stay accurate in {dtype}")


def _descriptor(descriptor: object, what: str = "descriptor") -> KernelDescriptor:
    """The descriptor `descriptor` names (itself, or a preset); errors name the argument `what`."""
    if isinstance(descriptor, KernelDescriptor):
        return descriptor
    if isinstance(descriptor, str):
        try:
            return presets.ALL[descriptor]
        except KeyError:
            raise ValueError(
                f"{what}: expected a KernelDescriptor or a preset name ({', '.join(presets.ALL)}); got {descriptor!r}"
            ) from None
    raise TypeError(f"{what}: expected a KernelDescriptor or a preset name, got {type(descriptor).__name__}")


def cdist_grad(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    *,
    p: float | torch.Tensor = 2.0,
    out: torch.Tensor | None = None,
    backend: str = "auto",
    debug: bool = False,
) -> torch.Tensor:
    r"""The gradient contraction behind AGOP and kernel-predictor gradients.

    $$
    \mathrm{out}[o, n, m] = \sum_k c[o, k]\, a[k, m]\,
        \operatorname{sgn}(d[n, m] - b[n, k])\, |d[n, m] - b[n, k]|^{p - 1}
    $$

    with sgn(0) = 0, so a term with `d[n, m] == b[n, k]` is 0 for every p (also 0 < p < 1).

    Args:
        a: `[..., K, M]` (e.g. the kernel matrix's derivative factor).
        b: `[..., N, K]` (e.g. the centres, features × points).
        c: `[..., O, K]` (e.g. the coefficients).
        d: `[..., N, M]` (e.g. the evaluation points, features × points).
        p: > 0 and finite; a tensor gives one p per batch entry (an invalid value makes its batch
            entry NaN, or raises with `debug`).  1 and 2 have fast paths.
        out: optional `[..., O, N, M]` output of the inputs' dtype and device, any strides,
            sharing no memory with the inputs.
        backend: as in [`cdist`][kermac.api.cdist].
        debug: as in [`cdist`][kermac.api.cdist].

    Differentiable for p = 2 ([`kermac.autograd`][kermac.autograd]); for other p a backward raises
    `NotImplementedError`.
    """
    debug = debug_enabled(debug)
    a = check_tensor("a", a)
    hypers = prepare_hypers({"p": (p, positive_finite)}, a.device, debug)
    program, reads_p = _grad_key(hypers["p"].scalar)
    return ops.grad(
        program, a, b, c, d, hypers if reads_p else {}, out=out, backend=backend, debug=debug, op="cdist_grad"
    )


@constant_for_compile
def _grad_key(p: float | None) -> tuple[str, bool]:
    """The key of `cdist_grad`'s program and whether it reads `p`."""
    program = grad_program(p)  # built once per kind of p
    return program.key(), "p" in program.hypers


def run_program(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    *,
    hypers: Mapping[str, float | torch.Tensor] | None = None,
    out: torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
) -> torch.Tensor:
    """Run a pairwise semiring program written directly in [`kermac.ir`][kermac.ir].

    `hypers` maps every [`Hyper`][kermac.ir.Hyper] name the program reads to a number or tensor
    (any value but NaN; tensors broadcast against the batch dimensions).
    """
    debug = debug_enabled(debug)
    if not isinstance(program, PairwiseProgram):
        raise TypeError(f"program: expected a kermac.programs.PairwiseProgram, got {type(program).__name__}")
    x = check_tensor("x", x)
    hv = program_hypers(program.hypers, hypers, x.device, debug)
    return _pairwise(
        program.key(), x, z, out=out, hypers=hv, offsets=(offset_m, offset_n), backend=backend, debug=debug,
        op="run_program",
    )  # fmt: skip


def run_grad_program(
    program: GradProgram,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    *,
    hypers: Mapping[str, float | torch.Tensor] | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
    debug: bool = False,
) -> torch.Tensor:
    """Run a gradient program written directly in [`kermac.ir`][kermac.ir] (shapes as in
    [`cdist_grad`][kermac.api.cdist_grad])."""
    debug = debug_enabled(debug)
    if not isinstance(program, GradProgram):
        raise TypeError(f"program: expected a kermac.programs.GradProgram, got {type(program).__name__}")
    a = check_tensor("a", a)
    hv = program_hypers(program.hypers, hypers, a.device, debug)
    return ops.grad(program.key(), a, b, c, d, hv, out=out, backend=backend, debug=debug, op="run_grad_program")


def kernel_product(
    kernel: KernelDescriptor | str,
    x: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    *,
    transpose: bool = False,
    out: torch.Tensor | None = None,
    p: float | torch.Tensor | None = None,
    bandwidth: float | torch.Tensor | None = None,
    regularization: float | torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
) -> torch.Tensor:
    r"""The kernel matrix of [`run_kernel`][kermac.api.run_kernel] times `v`, without materialising it.

    $$
    \mathrm{out}[\dots, m, c] = \sum_n K[\dots, m, n]\, v[\dots, n, c],\qquad
    K[\dots, m, n] = \kappa\big(d(x_m, z_n)\big) + \lambda\,[m + o_m = n + o_n]
    $$

    computed in the compute dtype (float64 for float64 inputs, float32 otherwise); a backend contracts
    each tile of K with `v` where it computes it, so memory stays O((M + N)(D + C)).

    Args:
        kernel: a [`KernelDescriptor`][kermac.descriptor.KernelDescriptor] or a preset name, as `descriptor` of
            [`run_kernel`][kermac.api.run_kernel].
        x: `[..., M, D]`.
        z: `[..., N, D]` (batch dimensions broadcast).
        v: `[..., N, C]` of the dtype and device of `x`; with `transpose=True`, `[..., M, C]`.
        transpose: compute `Kᵀ @ v` (`[..., N, C]`) instead, with the same K (same diagonal).
        out: optional output (`[..., M, C]`, or `[..., N, C]` with `transpose`), any strides, sharing no
            memory with the inputs.
        p: as in [`run_kernel`][kermac.api.run_kernel].
        bandwidth: as in [`run_kernel`][kermac.api.run_kernel].
        regularization: as in [`run_kernel`][kermac.api.run_kernel].
        offset_m: as in [`run_kernel`][kermac.api.run_kernel].
        offset_n: as in [`run_kernel`][kermac.api.run_kernel].
        backend: `"auto"` or a backend that computes fused products (`"torch"`; a backend that does not
            refuses with a sentence).
        debug: as in [`cdist`][kermac.api.cdist].

    NaN and infinities in `v` propagate as in the dense `K @ v`.  Differentiable in `v`, `x` and `z` for every
    kernel: to any order for kernels of `Σ (x − z)²` (Gaussian, Laplace-L2, Matérn, Cauchy, l2), first order
    (through the fused gradient product) for the others ([`kermac.autograd`][kermac.autograd]).
    """
    debug = debug_enabled(debug)
    kernel = _descriptor(kernel, "kernel")
    x = check_tensor("x", x)
    program, hypers = lower_kernel(kernel, x, p, bandwidth, regularization, debug)
    return _product(program, x, z, v, hypers, transpose, out, (offset_m, offset_n), backend, debug, "kernel_product")


def program_product(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    *,
    transpose: bool = False,
    out: torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
    **hypers: float | torch.Tensor,
) -> torch.Tensor:
    """`K @ v` (or `Kᵀ @ v` with `transpose`) for the kernel K of a pairwise program written in
    [`kermac.ir`][kermac.ir], never materialised; arguments as in [`kernel_product`][kermac.api.kernel_product], the
    program's hyperparameters as keywords (as `hypers` of [`run_program`][kermac.api.run_program]).

    Differentiable in `v`, `x` and `z` for every program (as [`kernel_product`][kermac.api.kernel_product]: any
    order for programs summing `(x − z)²`, first order for the others).
    """
    debug = debug_enabled(debug)
    if not isinstance(program, PairwiseProgram):
        raise TypeError(f"program: expected a kermac.programs.PairwiseProgram, got {type(program).__name__}")
    x = check_tensor("x", x)
    hv = program_hypers(program.hypers, hypers, x.device, debug)
    return _product(program.key(), x, z, v, hv, transpose, out, (offset_m, offset_n), backend, debug, "program_product")


def _product(
    program: str,
    x: torch.Tensor,
    z: object,
    v: object,
    hypers: dict[str, HyperValue],
    transpose: object,
    out: torch.Tensor | None,
    offsets: tuple[int, int],
    backend: str,
    debug: bool,
    op: str,
) -> torch.Tensor:
    """`K @ v` or, with `transpose`, `Kᵀ @ v`: the product of the program with its operands swapped
    ([`swap_operands`][kermac.programs.swap_operands]) on `(z, x)` with the offsets exchanged."""
    if not isinstance(transpose, bool):
        raise TypeError(f"transpose: expected a bool, got {type(transpose).__name__}")
    _refuse_out_under_autograd(op, out, {"x": x, "z": z, "v": v})
    z = check_tensor("z", z)
    v = check_tensor("v", v)
    m0, n0 = offsets
    if not transpose:
        return ops.product(
            program, x, z, v, hypers, out=out, offset_m=m0, offset_n=n0, backend=backend, debug=debug, op=op
        )
    if z.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"z: expected {x.shape[-1]} features in the last dimension (as x), got shape {list(z.shape)} "
            f"(x: {list(x.shape)})"
        )
    if v.shape[-2] != x.shape[-2]:
        raise ValueError(
            f"v: expected size {x.shape[-2]} in dimension -2 to match M (x.shape[-2]; transpose=True computes "
            f"Kᵀ @ v), got shape {list(v.shape)} (x: {list(x.shape)})"
        )
    swapped = _swapped_key(program)
    return ops.product(swapped, z, x, v, hypers, out=out, offset_m=n0, offset_n=m0, backend=backend, debug=debug, op=op)


@constant_for_compile
def _swapped_key(program: str) -> str:
    """The key of the program of key `program` with its operands swapped (a constant of the call)."""
    return _swapped_key_cached(program)


@lru_cache(maxsize=256)
def _swapped_key_cached(program: str) -> str:
    return swap_operands(program_from_key(program)).key()


def _refuse_out_under_autograd(op: str, out: torch.Tensor | None, operands: dict[str, object]) -> None:
    """`RuntimeError` for an `out` while autograd records a call on `operands` (all tensors; a call with
    another operand fails its own check first)."""
    tensors = operands.values()
    if (
        out is not None
        and torch.is_grad_enabled()
        and all(isinstance(t, torch.Tensor) for t in tensors)
        and any(t.requires_grad for t in tensors)
    ):
        *first, last = operands
        raise RuntimeError(
            f"{op}: out= is not supported when {', '.join(first)} or {last} requires grad (autograd needs an "
            "output of its own); drop out=, or call under torch.no_grad()"
        )


def _pairwise(
    program: str,
    x: torch.Tensor,
    z: torch.Tensor,
    *,
    out: torch.Tensor | None,
    hypers: dict[str, HyperValue],
    offsets: tuple[int, int] = (0, 0),
    backend: str,
    debug: bool,
    op: str,
) -> torch.Tensor:
    """Run the pairwise program with key `program` ([`kermac.ops.pairwise`][kermac.ops.pairwise])."""
    _refuse_out_under_autograd(op, out, {"x": x, "z": z})
    m0, n0 = offsets
    return ops.pairwise(program, x, z, hypers, out=out, offset_m=m0, offset_n=n0, backend=backend, debug=debug, op=op)
