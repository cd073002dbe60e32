"""kermac's fused passes as `torch.library` custom operations.

Every public operation ([`kermac.api`][kermac.api]) ends in one of these fused passes, each registered as a
custom operation in the `kermac` namespace, with a fake (meta) implementation and, in
[`kermac.autograd`][kermac.autograd], its backward:

| operation | computes |
|---|---|
| `kermac::pairwise(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op)` | pairwise |
| `kermac::pairwise_out(..., Tensor(a!) out) -> ()` | the same into `out` |
| `kermac::grad(a, b, c, d, program, hyper_names, numbers, tensors, backend, debug, op)` | gradient |
| `kermac::grad_out(..., Tensor(a!) out) -> ()` | the same into `out` |
| `kermac::product(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op)` | K v |
| `kermac::product_out(..., Tensor(a!) out) -> ()` | the same into `out` |
| `kermac::product_grad(x, z, v, g, program, ..., offset_m, offset_n, backend, debug, op)` | ∂(g · K v)/∂x |
| `kermac::product_grad_out(..., Tensor(a!) out) -> ()` | the same into `out` |
| `kermac::no_gradient(like, reason) -> Tensor` | raises `NotImplementedError(reason)` when run |
| `kermac::first_order_only(value, reason) -> Tensor` | a copy of `value` whose own backward is `no_gradient` |

A program ([`kermac.programs`][kermac.programs]) travels as its key (its canonical text,
[`program_from_key`][kermac.programs.program_from_key]); hyperparameters as `hyper_names`
(comma-separated, the order of the two lists) with, per name, a number (`numbers[i]`) or a tensor
(`tensors[i]`, which then wins).  The backend is chosen inside the
operation, so a trace (`torch.compile`, `torch.export`, `make_fx`) records one opaque call whose
fake implementation gives the exact output shape, dtype, device and (contiguous) strides, after the
same validation the real one runs.

[`pairwise`][kermac.ops.pairwise], [`grad`][kermac.ops.grad], [`product`][kermac.ops.product] and
[`product_grad`][kermac.ops.product_grad] are what the public operations (and their backward) call: for plain
tensors on a real device with no autograd to record, outside any trace or dispatch mode, they run the pass
directly (the dispatcher would add its own host time to every small call and change nothing);
otherwise they call the registered operation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch

from kermac.dispatch import run_grad, run_pairwise, run_product, run_product_grad
from kermac.hyperparams import HyperValue
from kermac.problem import check_out_type, grad_problem, pairwise_problem, product_grad_problem, product_problem
from kermac.programs import GradProgram, PairwiseProgram, program_from_key

__all__ = ["constant_for_compile", "grad", "pairwise", "product", "product_grad", "runs_directly"]

_PAIRWISE_ARGS = (
    "Tensor x, Tensor z, str program, str hyper_names, float[] numbers, Tensor?[] tensors, "
    "int offset_m, int offset_n, str backend, bool debug, str op"
)
_GRAD_ARGS = (
    "Tensor a, Tensor b, Tensor c, Tensor d, str program, str hyper_names, float[] numbers, Tensor?[] tensors, "
    "str backend, bool debug, str op"
)
_PRODUCT_ARGS = (
    "Tensor x, Tensor z, Tensor v, str program, str hyper_names, float[] numbers, Tensor?[] tensors, "
    "int offset_m, int offset_n, str backend, bool debug, str op"
)

_PRODUCT_GRAD_ARGS = (
    "Tensor x, Tensor z, Tensor v, Tensor g, str program, str hyper_names, float[] numbers, Tensor?[] tensors, "
    "int offset_m, int offset_n, str backend, bool debug, str op"
)


F = TypeVar("F", bound=Callable[..., object])


def constant_for_compile(fn: F) -> F:
    """Mark `fn` as `torch.compiler.assume_constant_result` does: `torch.compile` calls it once while
    tracing and keeps its result as a constant instead of tracing its body.

    Set here as the attribute that function sets, because calling it imports `torch._dynamo`, which
    would add about a second to `import kermac` (tests/test_ops.py checks that the two agree).
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


def runs_directly(*tensors: torch.Tensor) -> bool:
    """Whether a call on `tensors` may skip the dispatcher: no trace, no dispatch or function mode, no
    autograd to record, and every tensor a plain `torch.Tensor` (no subclass, no fake tensor) off `meta`."""
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._is_torch_function_mode_enabled()
    ):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if type(t) is not torch.Tensor or t.is_meta or (grad and t.requires_grad):
            return False
    return True


def hypers_from_args(
    names: str, numbers: Sequence[float], tensors: Sequence[torch.Tensor | None]
) -> dict[str, HyperValue]:
    """The hyperparameters an operation received, as [`HyperValue`][kermac.hyperparams.HyperValue]s."""
    if not names:
        return {}
    split = names.split(",")
    if not len(split) == len(numbers) == len(tensors):
        raise ValueError(f"hyper_names: {len(split)} names for {len(numbers)} numbers and {len(tensors)} tensors")
    return {
        name: HyperValue(name, None, t) if t is not None else HyperValue(name, float(v))
        for name, v, t in zip(split, numbers, tensors, strict=True)
    }


def hypers_to_args(hypers: Mapping[str, HyperValue]) -> tuple[str, list[float], list[torch.Tensor | None]]:
    """`(hyper_names, numbers, tensors)` for an operation: the inverse of `hypers_from_args`."""
    values = list(hypers.values())
    numbers = [math.nan if h.scalar is None else h.scalar for h in values]
    return ",".join(hypers), numbers, [h.tensor for h in values]


def pairwise(
    program: str,
    x: torch.Tensor,
    z: torch.Tensor,
    hypers: Mapping[str, HyperValue],
    *,
    out: torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
    op: str = "run_program",
) -> torch.Tensor:
    """The pairwise program with key `program` on `x`, `z` (into `out` if given); see the module docstring."""
    if _direct((x, z), hypers, out):
        problem = pairwise_problem(
            _program(program, PairwiseProgram), x, z, out=out, hypers=hypers, offset_m=offset_m, offset_n=offset_n,
            debug=debug,
        )  # fmt: skip
        return run_pairwise(problem, backend, op)
    args = (x, z, program, *hypers_to_args(hypers), offset_m, offset_n, backend, debug, op)
    if out is None:
        return torch.ops.kermac.pairwise(*args)
    torch.ops.kermac.pairwise_out(*args, out)
    return out


def grad(
    program: str,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    hypers: Mapping[str, HyperValue],
    *,
    out: torch.Tensor | None = None,
    backend: str = "auto",
    debug: bool = False,
    op: str = "run_grad_program",
) -> torch.Tensor:
    """The gradient program with key `program` on `a, b, c, d` (into `out` if given)."""
    if _direct((a, b, c, d), hypers, out):
        problem = grad_problem(_program(program, GradProgram), a, b, c, d, out=out, hypers=hypers, debug=debug)
        return run_grad(problem, backend, op)
    args = (a, b, c, d, program, *hypers_to_args(hypers), backend, debug, op)
    if out is None:
        return torch.ops.kermac.grad(*args)
    torch.ops.kermac.grad_out(*args, out)
    return out


def product(
    program: str,
    x: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    hypers: Mapping[str, HyperValue],
    *,
    out: torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
    op: str = "program_product",
) -> torch.Tensor:
    """`K(x, z) @ v` for the pairwise program with key `program` (into `out` if given)."""
    if _direct((x, z, v), hypers, out):
        problem = product_problem(
            _program(program, PairwiseProgram), x, z, v, out=out, hypers=hypers, offset_m=offset_m,
            offset_n=offset_n, debug=debug,
        )  # fmt: skip
        return run_product(problem, backend, op)
    args = (x, z, v, program, *hypers_to_args(hypers), offset_m, offset_n, backend, debug, op)
    if out is None:
        return torch.ops.kermac.product(*args)
    torch.ops.kermac.product_out(*args, out)
    return out


def product_grad(
    program: str,
    x: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    hypers: Mapping[str, HyperValue],
    *,
    out: torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
    backend: str = "auto",
    debug: bool = False,
    op: str = "program_product",
) -> torch.Tensor:
    """The gradient product (`kermac.problem.ProductGradProblem`) of the pairwise program with
    key `program`: `∂(Σ g · K(x, z) v)/∂x` (into `out` if given)."""
    if _direct((x, z, v, g), hypers, out):
        problem = product_grad_problem(
            _program(program, PairwiseProgram), x, z, v, g, out=out, hypers=hypers, offset_m=offset_m,
            offset_n=offset_n, debug=debug,
        )  # fmt: skip
        return run_product_grad(problem, backend, op)
    args = (x, z, v, g, program, *hypers_to_args(hypers), offset_m, offset_n, backend, debug, op)
    if out is None:
        return torch.ops.kermac.product_grad(*args)
    torch.ops.kermac.product_grad_out(*args, out)
    return out


def _direct(operands: tuple[torch.Tensor, ...], hypers: Mapping[str, HyperValue], out: object) -> bool:
    """Whether a call with these tensors [`runs_directly`][kermac.ops.runs_directly] (`out` checked to be a tensor
    or None first, so that a wrong one gets kermac's message, not the dispatcher's)."""
    check_out_type(out)
    tensors = [h.tensor for h in hypers.values() if h.tensor is not None]
    return runs_directly(*operands, *tensors, *(() if out is None else (out,)))


_P = TypeVar("_P", PairwiseProgram, GradProgram)


def _program(key: str, kind: type[_P]) -> _P:
    """The program of `key`, which must be a `kind`."""
    program = program_from_key(key)
    if not isinstance(program, kind):
        what = "pairwise" if kind is PairwiseProgram else "gradient"
        raise ValueError(f"program: expected the key of a {what} program, got {key!r}")
    return program


def _pairwise_problem(x, z, program, names, numbers, tensors, offset_m, offset_n, debug, out=None, fake=False):
    hypers = hypers_from_args(names, numbers, tensors)
    return pairwise_problem(
        _program(program, PairwiseProgram), x, z, out=out, hypers=hypers, offset_m=offset_m, offset_n=offset_n,
        debug=debug, fake=fake,
    )  # fmt: skip


def _grad_problem(a, b, c, d, program, names, numbers, tensors, debug, out=None, fake=False):
    hypers = hypers_from_args(names, numbers, tensors)
    return grad_problem(_program(program, GradProgram), a, b, c, d, out=out, hypers=hypers, debug=debug, fake=fake)


@torch.library.custom_op("kermac::pairwise", mutates_args=(), schema=f"({_PAIRWISE_ARGS}) -> Tensor")
def _pairwise_op(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op):
    problem = _pairwise_problem(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, debug)
    return run_pairwise(problem, backend, op)


@_pairwise_op.register_fake
def _(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op):
    return _pairwise_problem(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, debug, fake=True).out


@torch.library.custom_op(
    "kermac::pairwise_out", mutates_args=("out",), schema=f"({_PAIRWISE_ARGS}, Tensor(a!) out) -> ()"
)
def _pairwise_out_op(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op, out):
    problem = _pairwise_problem(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, debug, out)
    run_pairwise(problem, backend, op)


@_pairwise_out_op.register_fake
def _(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op, out):
    _pairwise_problem(x, z, program, hyper_names, numbers, tensors, offset_m, offset_n, debug, out, fake=True)


@torch.library.custom_op("kermac::grad", mutates_args=(), schema=f"({_GRAD_ARGS}) -> Tensor")
def _grad_op(a, b, c, d, program, hyper_names, numbers, tensors, backend, debug, op):
    return run_grad(_grad_problem(a, b, c, d, program, hyper_names, numbers, tensors, debug), backend, op)


@_grad_op.register_fake
def _(a, b, c, d, program, hyper_names, numbers, tensors, backend, debug, op):
    return _grad_problem(a, b, c, d, program, hyper_names, numbers, tensors, debug, fake=True).out


@torch.library.custom_op("kermac::grad_out", mutates_args=("out",), schema=f"({_GRAD_ARGS}, Tensor(a!) out) -> ()")
def _grad_out_op(a, b, c, d, program, hyper_names, numbers, tensors, backend, debug, op, out):
    run_grad(_grad_problem(a, b, c, d, program, hyper_names, numbers, tensors, debug, out), backend, op)


@_grad_out_op.register_fake
def _(a, b, c, d, program, hyper_names, numbers, tensors, backend, debug, op, out):
    _grad_problem(a, b, c, d, program, hyper_names, numbers, tensors, debug, out, fake=True)


def _product_problem(x, z, v, program, names, numbers, tensors, offset_m, offset_n, debug, out=None, fake=False):
    hypers = hypers_from_args(names, numbers, tensors)
    return product_problem(
        _program(program, PairwiseProgram), x, z, v, out=out, hypers=hypers, offset_m=offset_m, offset_n=offset_n,
        debug=debug, fake=fake,
    )  # fmt: skip


@torch.library.custom_op("kermac::product", mutates_args=(), schema=f"({_PRODUCT_ARGS}) -> Tensor")
def _product_op(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op):
    problem = _product_problem(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, debug)
    return run_product(problem, backend, op)


@_product_op.register_fake
def _(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op):
    return _product_problem(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, debug, fake=True).out


@torch.library.custom_op(
    "kermac::product_out", mutates_args=("out",), schema=f"({_PRODUCT_ARGS}, Tensor(a!) out) -> ()"
)
def _product_out_op(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op, out):
    problem = _product_problem(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, debug, out)
    run_product(problem, backend, op)


@_product_out_op.register_fake
def _(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op, out):
    _product_problem(x, z, v, program, hyper_names, numbers, tensors, offset_m, offset_n, debug, out, fake=True)


def _product_grad_problem(
    x, z, v, g, program, names, numbers, tensors, offset_m, offset_n, debug, out=None, fake=False
):  # fmt: skip
    hypers = hypers_from_args(names, numbers, tensors)
    return product_grad_problem(
        _program(program, PairwiseProgram), x, z, v, g, out=out, hypers=hypers, offset_m=offset_m,
        offset_n=offset_n, debug=debug, fake=fake,
    )  # fmt: skip


@torch.library.custom_op("kermac::product_grad", mutates_args=(), schema=f"({_PRODUCT_GRAD_ARGS}) -> Tensor")
def _product_grad_op(x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op):
    problem = _product_grad_problem(x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, debug)
    return run_product_grad(problem, backend, op)


@_product_grad_op.register_fake
def _(x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op):
    args = (x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, debug)
    return _product_grad_problem(*args, fake=True).out


@torch.library.custom_op(
    "kermac::product_grad_out", mutates_args=("out",), schema=f"({_PRODUCT_GRAD_ARGS}, Tensor(a!) out) -> ()"
)
def _product_grad_out_op(
    x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op, out
):  # fmt: skip
    args = (x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, debug)
    run_product_grad(_product_grad_problem(*args, out), backend, op)


@_product_grad_out_op.register_fake
def _(x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, backend, debug, op, out):
    _product_grad_problem(x, z, v, g, program, hyper_names, numbers, tensors, offset_m, offset_n, debug, out, True)


@torch.library.custom_op("kermac::no_gradient", mutates_args=(), schema="(Tensor like, str reason) -> Tensor")
def _no_gradient_op(like, reason):
    raise NotImplementedError(reason)


@_no_gradient_op.register_fake
def _(like, reason):
    return torch.empty_like(like)


@torch.library.custom_op("kermac::first_order_only", mutates_args=(), schema="(Tensor value, str reason) -> Tensor")
def _first_order_only_op(value, reason):
    return value.clone()


@_first_order_only_op.register_fake
def _(value, reason):
    return torch.empty_like(value)
