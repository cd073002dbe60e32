"""kermac.dsl: programs traced from Python functions — every IR operation, the names of operands and
hyperparameters, batched hyperparameters, gradient programs, the errors that point at the user's line, and the
traced programs run on the CPU backends (reference and the Triton interpreter) against float64 references."""

from __future__ import annotations

import math
import operator

import numpy as np
import pytest
import torch
from helpers import CPU_BACKENDS, assert_close, ref_cdist, ref_grad, require_backend

import kermac
from kermac import dsl, ir, presets
from kermac.dsl import canonical_key
from kermac.ir import Call, Const, Hyper, Var
from kermac.lowering import grad_program
from kermac.programs import REDUCTIONS, GradProgram, PairwiseProgram, product_factor

X, Z, ACC, DIAG = Var("x"), Var("z"), Var("acc"), Var("diag")
THIS_FILE = __file__


def inner_of(fn: object) -> ir.Expr:
    return kermac.program(fn).program.inner


# -- tracing: every operation of the IR ----------------------------------------------------------

# Each IR operation, written as a user writes it, and the tree it must trace to.
TRACED_OPS = {
    "add": (lambda x, z: x + z, Call("add", (X, Z))),
    "sub": (lambda x, z: x - z, Call("sub", (X, Z))),
    "mul": (lambda x, z: x * z, Call("mul", (X, Z))),
    "div": (lambda x, z: x / z, Call("div", (X, Z))),
    "neg": (lambda x, z: -x, Call("neg", (X,))),
    "abs": (lambda x, z: abs(x), Call("abs", (X,))),
    "sqrt": (lambda x, z: dsl.sqrt(x), Call("sqrt", (X,))),
    "exp": (lambda x, z: dsl.exp(x), Call("exp", (X,))),
    "log": (lambda x, z: dsl.log(x), Call("log", (X,))),
    "pow": (lambda x, z: x**z, Call("pow", (X, Z))),
    "min": (lambda x, z: dsl.minimum(x, z), Call("min", (X, Z))),
    "max": (lambda x, z: dsl.maximum(x, z), Call("max", (X, Z))),
    "sign": (lambda x, z: dsl.sign(x), Call("sign", (X,))),
    "lt": (lambda x, z: x < z, Call("lt", (X, Z))),
    "le": (lambda x, z: x <= z, Call("le", (X, Z))),
    "gt": (lambda x, z: x > z, Call("gt", (X, Z))),
    "ge": (lambda x, z: x >= z, Call("ge", (X, Z))),
    "eq": (lambda x, z: x == z, Call("eq", (X, Z))),
    "ne": (lambda x, z: x != z, Call("ne", (X, Z))),
    "select": (lambda x, z: dsl.where(x, z, 1.0), Call("select", (X, Z, Const(1.0)))),
}


def test_every_ir_operation_is_covered() -> None:
    """A new operation of the IR must get a way to write it (and a line above)."""
    assert set(TRACED_OPS) == set(ir.OPS)


@pytest.mark.parametrize("op", sorted(TRACED_OPS))
def test_each_operation_traces_to_its_node(op: str) -> None:
    fn, expected = TRACED_OPS[op]
    assert inner_of(fn) == expected


def test_functions_of_the_namespace_match_the_operators() -> None:
    """dsl.abs/pow/lt/... are the same trees as abs(), ** and the comparisons."""
    same = [
        (lambda x, z: dsl.abs(x), lambda x, z: abs(x)),
        (lambda x, z: dsl.pow(x, z), lambda x, z: x**z),
        (lambda x, z: dsl.lt(x, z), lambda x, z: x < z),
        (lambda x, z: dsl.le(x, z), lambda x, z: x <= z),
        (lambda x, z: dsl.gt(x, z), lambda x, z: x > z),
        (lambda x, z: dsl.ge(x, z), lambda x, z: x >= z),
        (lambda x, z: dsl.eq(x, z), lambda x, z: x == z),
        (lambda x, z: dsl.ne(x, z), lambda x, z: x != z),
        (lambda x, z: +x, lambda x, z: x),
    ]
    for a, b in same:
        assert inner_of(a) == inner_of(b)


@pytest.mark.parametrize(
    ("op", "fn"),
    [
        ("add", operator.add),
        ("sub", operator.sub),
        ("mul", operator.mul),
        ("div", operator.truediv),
        ("pow", operator.pow),
        ("lt", operator.lt),
        ("gt", operator.gt),
        ("eq", operator.eq),
    ],
)
@pytest.mark.parametrize("number", [2, 2.5, np.float64(2.5), np.float32(2.5), np.int64(2)])
def test_numbers_on_either_side(op: str, fn: object, number: object) -> None:
    """Python and numpy numbers become constants on the left and on the right (a reflected comparison
    swaps its operands, as Python does)."""
    c = Const(float(number))
    assert inner_of(lambda x, z: fn(x, number)) == Call(op, (X, c))
    swapped = {"lt": "gt", "gt": "lt"}.get(op, op)
    left = inner_of(lambda x, z: fn(number, x))
    assert left in (Call(op, (c, X)), Call(swapped, (X, c)))


def test_sigmoid_and_tanh_are_written_with_exp() -> None:
    assert inner_of(lambda x, z: dsl.sigmoid(x)) == 1.0 / (1.0 + ir.exp(-X))
    assert inner_of(lambda x, z: dsl.tanh(x)) == 1.0 - 2.0 / (ir.exp(2.0 * X) + 1.0)
    t = torch.linspace(-30, 30, 601, dtype=torch.float64)
    env = {"x": t, "z": t}
    from kermac.ir_eval import evaluate

    assert torch.allclose(evaluate(inner_of(lambda x, z: dsl.tanh(x)), env, like=t), torch.tanh(t), atol=1e-15)
    assert torch.allclose(evaluate(inner_of(lambda x, z: dsl.sigmoid(x)), env, like=t), torch.sigmoid(t), atol=1e-15)


def test_a_constant_function_and_a_def() -> None:
    def term(z, x):  # any parameter order; a def as well as a lambda
        scaled = 2.0 * x
        return scaled - z

    assert inner_of(term) == Call("sub", (Call("mul", (Const(2.0), X)), Z))
    assert inner_of(lambda x, z: 1) == Const(1.0)


# -- names ---------------------------------------------------------------------------------------


def test_operands_by_name_and_hyperparameters_by_keyword() -> None:
    k = kermac.program(
        inner=lambda x, z, p: abs(x - z) ** p,
        reduce="sum",
        epilogue=lambda acc, diag, p, lam: acc ** (1 / p) + dsl.where(diag, lam, 0.0),
    )
    p = Hyper("p")
    assert k.program == PairwiseProgram(abs(X - Z) ** p, "sum", ACC ** (1 / p) + ir.select(DIAG, Hyper("lam"), 0.0))
    assert k.hypers == ("p", "lam")  # in the order the functions declare them; p once
    assert k.key() == k.program.key()


def test_the_issue_example_is_cdist() -> None:
    k = kermac.program(inner=lambda x, z, p: abs(x - z) ** p, reduce="sum", epilogue=lambda acc, p: acc ** (1 / p))
    x, z = torch.randn(7, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    assert_close(k(x, z, p=1.3), ref_cdist(x, z, 1.3), 1e-13)


def test_reserved_names() -> None:
    assert {"x", "z", "acc", "diag", "a", "b", "c", "d", "term"} == dsl.OPERANDS
    assert dsl.OPERANDS | {"v", "out", "transpose", "offset_m", "offset_n", "backend", "debug"} == dsl.RESERVED
    # every call keyword of the kernels is reserved, so no hyperparameter can shadow one
    import inspect

    for fn in (dsl.Kernel.__call__, dsl.Kernel.product, dsl.Kernel.operator, dsl.GradKernel.__call__):
        names = {n for n, p in inspect.signature(fn).parameters.items() if p.kind != p.VAR_KEYWORD} - {"self"}
        assert names <= dsl.RESERVED, fn


@pytest.mark.parametrize("reduce", sorted(REDUCTIONS))
def test_every_reduction_name_is_accepted(reduce: str) -> None:
    assert kermac.program(lambda x, z: x * z, reduce=reduce).program.reduction == reduce


# -- errors that point at the user's function ------------------------------------------------------


def _line_of(fn: object) -> str:
    return f"{THIS_FILE}:{fn.__code__.co_firstlineno}"


BAD_INNER = [
    ("if", lambda x, z: x if x > z else z, "no truth value"),
    ("and", lambda x, z: (x > 0) and (z > 0), "no truth value"),
    ("not", lambda x, z: not x, "no truth value"),
    ("builtin max", lambda x, z: max(x, z), "no truth value"),
    ("chained comparison", lambda x, z: 0 < x < 1, "no truth value"),
    ("math.exp", lambda x, z: math.exp(x), "cannot become a Python number"),
    ("float()", lambda x, z: float(x), "cannot become a Python number"),
    ("round()", lambda x, z: round(x, 2), "cannot become a Python number"),
    ("numpy function", lambda x, z: np.exp(x), "numpy.exp cannot trace"),
    ("numpy where", lambda x, z: np.where(x > z, x, z), "cannot"),
    ("torch function", lambda x, z: torch.exp(x), "torch function exp cannot trace"),
    ("tensor on the right", lambda x, z: x * torch.ones(()), "torch.Tensor cannot enter a program"),
    ("tensor on the left", lambda x, z: torch.ones(()) * x, "torch"),  # either refusal: torch may defer to __rmul__
    ("attribute", lambda x, z: x.exp(), "no attribute 'exp'"),
    ("indexing", lambda x, z: x[0], "no items"),
    ("unpacking", lambda x, z: sum(x), "cannot be iterated"),
    ("modulo", lambda x, z: x % 2, "no %"),
    ("floor division", lambda x, z: x // z, "no %, //"),
    ("string", lambda x, z: x + "1", "got str"),
    ("returns None", lambda x, z: None, "returned NoneType"),
    ("returns a bool", lambda x, z: True, "returned bool"),
    ("raises", lambda x, z: 1 / 0, "ZeroDivisionError"),
    ("wrong arity", lambda x, z: dsl.where(x > z, x), "missing 1 required positional argument"),
    ("unknown dsl function", lambda x, z: dsl.erf(x), "has no attribute 'erf'"),
]


@pytest.mark.parametrize(("what", "fn", "message"), BAD_INNER, ids=[b[0] for b in BAD_INNER])
def test_what_the_ir_cannot_express_names_the_users_line(what: str, fn: object, message: str) -> None:
    with pytest.raises(TypeError) as info:
        kermac.program(fn)
    text = str(info.value)
    assert text.startswith(f"inner (<lambda> at {_line_of(fn)})"), text
    assert message in text, text


def test_the_failing_line_of_a_def_is_shown() -> None:
    def epilogue(acc, p):
        root = acc ** (1 / p)
        return math.sqrt(root)

    with pytest.raises(TypeError) as info:
        kermac.program(lambda x, z: x * z, epilogue=epilogue)
    line = epilogue.__code__.co_firstlineno + 2
    assert f"epilogue (epilogue at {_line_of(epilogue)}) (line {line}: return math.sqrt(root))" in str(info.value)


BAD_NAMES = [
    ("operand of the epilogue in the inner term", dict(inner=lambda x, acc: x), "'acc' is an operand of an epilogue"),
    ("operand of a gradient", dict(inner=lambda a, b: a), "'a' is an operand of the multiply of a gradient program"),
    ("inner operand in the epilogue", dict(inner=lambda x, z: x, epilogue=lambda acc, x: acc), "'x' is an operand"),
    ("c", dict(inner=lambda x, c: x), "'c' is an operand of the accumulate of a gradient program"),
    ("call keyword", dict(inner=lambda x, z, out: x * out), "'out' is a keyword of the kernel's call"),
    ("call keyword backend", dict(inner=lambda x, z, backend: x), "'backend' is a keyword"),
    ("underscore", dict(inner=lambda x, z, _p: x * _p), "cannot start with '_'"),
    ("unused hyperparameter", dict(inner=lambda x, z, q: x), "['q'] not used"),
]


@pytest.mark.parametrize(("what", "kwargs", "message"), BAD_NAMES, ids=[b[0] for b in BAD_NAMES])
def test_bad_names_are_value_errors_naming_them(what: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match="at " + THIS_FILE) as info:
        kermac.program(**kwargs)
    assert message in str(info.value)


def test_signature_errors() -> None:
    with pytest.raises(TypeError, match=r"parameter \*args: every parameter must be named"):
        kermac.program(lambda x, *args: x)
    with pytest.raises(TypeError, match=r"parameter \*\*kw"):
        kermac.program(lambda x, **kw: x)
    with pytest.raises(TypeError, match="parameter 'p' has a default"):
        kermac.program(lambda x, z, p=2.0: x**p)
    with pytest.raises(TypeError, match="inner: expected a function"):
        kermac.program(2.0)
    with pytest.raises(ValueError, match=r"reduce: expected one of .*'sum'.*, got 'prod'"):
        kermac.program(lambda x, z: x * z, reduce="prod")
    with pytest.raises(ValueError, match=r"reduce: expected one of .*, got \['sum'\]"):
        kermac.program(lambda x, z: x * z, reduce=["sum"])


# -- hyperparameters at call time -----------------------------------------------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_batched_hyperparameters_and_the_diagonal(backend: str) -> None:
    """A tensor hyperparameter computes one matrix per value; `diag` with offsets adds λ on the shifted
    diagonal; numbers and tensors mix."""
    require_backend(backend, "cpu")
    k = kermac.program(
        lambda x, z: (x - z) ** 2,
        epilogue=lambda acc, diag, bandwidth, lam: dsl.exp(-dsl.sqrt(acc) / bandwidth) + diag * lam,
    )
    x, z = torch.randn(9, 4, dtype=torch.float64), torch.randn(7, 4, dtype=torch.float64)
    sigma = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    out = k(x, z, bandwidth=sigma, lam=0.25, offset_m=2, backend=backend)
    d = ref_cdist(x, z, 2.0)
    eye = torch.zeros(9, 7, dtype=torch.float64)
    for m in range(9):
        if 0 <= m + 2 < 7:
            eye[m, m + 2] = 1.0
    ref = torch.exp(-d / sigma[:, None, None]) + 0.25 * eye
    assert_close(out, ref, 1e-12)


def test_missing_and_unknown_hyperparameters() -> None:
    k = kermac.program(lambda x, z, p: abs(x - z) ** p)
    x = torch.randn(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"missing \['p'\]"):
        k(x, x)
    with pytest.raises(ValueError, match=r"unknown \['q'\]"):
        k(x, x, p=1.0, q=2.0)


def test_bind_fixes_a_hyperparameter_and_keeps_the_program() -> None:
    k = kermac.program(lambda x, z, p: abs(x - z) ** p, epilogue=lambda acc, p: acc ** (1 / p))
    bound = k.bind(p=1.5)
    assert bound.program is k.program and bound.hypers == () and bound.bound == {"p": 1.5}
    x, z = torch.randn(4, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    assert torch.equal(bound(x, z), k(x, z, p=1.5))
    with pytest.raises(ValueError, match="p: fixed by bind"):
        bound(x, z, p=2.0)
    with pytest.raises(ValueError, match=r"bind: expected hyperparameters of \['p'\], got unknown \['q'\]"):
        k.bind(q=1.0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_product_and_operator(backend: str) -> None:
    require_backend(backend, "cpu", "product")
    k = kermac.program(lambda x, z: (x - z) ** 2, epilogue=lambda acc, gamma: 1 / (1 + gamma * acc))
    x, z = torch.randn(6, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    v = torch.randn(5, 2, dtype=torch.float64)
    dense = 1 / (1 + 0.7 * ref_cdist(x, z, 2.0) ** 2)
    assert_close(k.product(x, z, v, gamma=0.7, backend=backend), dense @ v, 1e-12)
    assert_close(k.operator(x, z, gamma=0.7, backend=backend) @ v, dense @ v, 1e-12)


# -- gradient programs --------------------------------------------------------------------------


def test_the_factor_a_is_taken_out_of_the_multiply() -> None:
    b, d = Var("b"), Var("d")
    alpha = Hyper("alpha")
    cases = [
        (lambda a, b, d, alpha: alpha * (d - b) * a, alpha * (d - b)),
        (lambda a, b, d: a * dsl.sign(d - b), ir.sign(d - b)),
        (lambda d, a, b: (d - b) * (a * 2.0), (d - b) * 2.0),
        (lambda a: a, Const(1.0)),
    ]
    for fn, factor in cases:
        assert kermac.gradient_program(fn).program.multiply == factor


@pytest.mark.parametrize(
    "fn",
    [lambda a, b, d: a + d - b, lambda a, b, d: a * a * (d - b), lambda b, d: d - b, lambda a, b, d: dsl.exp(a) * b],
)
def test_a_multiply_without_the_factor_a_is_a_general_program(fn: object) -> None:
    """Multiplies that are not `a · g(b, d)` keep the sum of `c · term` in the general form (they were refused
    before the general gradient kernels existed)."""
    program = kermac.gradient_program(fn).program
    assert program.accumulate == Var("c") * Var("term") and program.reduction == "sum"
    assert product_factor(program) is None


def test_gradient_program_names() -> None:
    with pytest.raises(ValueError, match="'c' is an operand of the accumulate"):
        kermac.gradient_program(lambda a, b, c, d: a * c)
    with pytest.raises(ValueError, match=r"accumulate .*'a' is an operand of the multiply"):
        kermac.gradient_program(lambda a: a, accumulate=lambda a, term: a * term)
    with pytest.raises(ValueError, match="reduce: expected one of"):
        kermac.gradient_program(lambda a: a, reduce="prod")
    with pytest.raises(ValueError, match="'x' is an operand of the inner term"):
        kermac.gradient_program(lambda a, x: a * x)
    with pytest.raises(ValueError, match="'diag' is an operand"):
        kermac.gradient_program(lambda a: a, epilogue=lambda acc, diag: acc)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_the_mm_kermac_gradient_sketch(backend: str) -> None:
    """mm-kermac's README gradient example, in one line: scale · Σ_k c·(alpha·(d − b)·a)."""
    require_backend(backend, "cpu", "grad")
    g = kermac.gradient_program(lambda a, b, d, alpha: alpha * (d - b) * a, epilogue=lambda acc, scale: scale * acc)
    a, b = torch.randn(2, 9, 5, dtype=torch.float64), torch.randn(2, 4, 9, dtype=torch.float64)
    c, d = torch.randn(2, 3, 9, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    out = g(a, b, c, d, alpha=0.25, scale=torch.tensor([2.0, 4.0], dtype=torch.float64), backend=backend)
    ref = ref_grad(a, b, c, d, 2.0) * torch.tensor([0.5, 1.0], dtype=torch.float64)[:, None, None, None]
    assert_close(out, ref, 1e-12)


# -- the canonical key: the same kernel as a preset -------------------------------------------------


def test_canonical_key_of_rewritten_presets() -> None:
    """`(x - z) ** 2`, `(z - x) * (z - x)` and the preset's `(x - z) * (x - z)` have one canonical key, and a
    program that differs has another."""
    l2 = presets.l2_distance.lower()
    for inner in (lambda x, z: (x - z) ** 2, lambda x, z: (z - x) * (z - x), lambda x, z: abs(x - z) * abs(z - x)):
        traced = kermac.program(inner, epilogue=lambda acc: dsl.sqrt(acc)).program
        assert traced.key() != l2.key()
        assert canonical_key(traced) == canonical_key(l2)
    other = kermac.program(lambda x, z: (x - z) * (z - x), epilogue=lambda acc: dsl.sqrt(acc)).program
    assert canonical_key(other) != canonical_key(l2)
    assert canonical_key(grad_program(2.0)) == canonical_key(
        kermac.gradient_program(lambda a, b, d: a * (d - b)).program
    )
    with pytest.raises(TypeError, match="program: expected a PairwiseProgram or GradProgram, got str"):
        canonical_key("pairwise;sum;x;acc")


def test_a_traced_program_is_an_ordinary_program() -> None:
    k = kermac.program(lambda x, z: x * z)
    assert isinstance(k.program, PairwiseProgram) and k.key() == presets.dot_product.lower().key()
    g = kermac.gradient_program(lambda a, b, d: a * dsl.sign(d - b))
    assert isinstance(g.program, GradProgram) and g.key() == grad_program(1.0).key()
    x = torch.randn(3, 2, dtype=torch.float64)
    assert torch.equal(kermac.run_program(k.program, x, x), k(x, x))


# -- the examples --------------------------------------------------------------------------------

EXAMPLES = {
    "build_a_kernel.py": ["-m", "23", "-n", "17", "-d", "5"],
    "broadcast_kernel.py": ["-l", "3", "-m", "13", "-n", "11", "-d", "5"],
    "hyper_semiring.py": ["-m", "19", "-n", "23", "-k", "7"],
    "hyper_semiring_gradient.py": ["-m", "9", "-n", "7", "-o", "2", "-k", "11", "-l", "2"],
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs_and_checks_its_results(script: str, backend: str) -> None:
    """Each example of the DSL runs on the CPU and passes its own float64 checks (exit code 0, no line flagged)."""
    import subprocess
    import sys
    from pathlib import Path

    require_backend(backend, "cpu", "grad" if "gradient" in script else "pairwise")
    path = Path(__file__).resolve().parents[1] / "examples" / script
    result = subprocess.run(
        [sys.executable, str(path), "--device", "cpu", "--backend", backend, *EXAMPLES[script]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) >= 3 and all("max rel error" in line for line in lines), result.stdout
    assert "TOO LARGE" not in result.stdout


def test_a_traced_kernel_is_differentiable_like_its_program() -> None:
    """A traced kernel's call is `run_program`, so autograd differentiates it wherever it differentiates the program
    (here a sum of squared differences; tests/test_autograd.py covers which programs)."""
    k = kermac.program(lambda x, z: (x - z) ** 2, epilogue=lambda acc, gamma: 1 / (1 + gamma * acc))
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    z = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, z: k(x, z, gamma=0.7, backend="torch"), (x, z))
