"""Gradient programs in the general form (`kermac.programs.GradProgram` with an `accumulate`): construction,
keys, the product-form test that sends them to the fast kernels, and their values on every backend against
independent float64 formulas written with broadcasting (no kermac code)."""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers import BACKEND_DEVICES, older_backend_source, plugin_beside_reference, require_backend

import kermac
from kermac import dsl, ir
from kermac.ir import Hyper, Var
from kermac.lowering import grad_program
from kermac.programs import GradProgram, PairwiseProgram, product_factor, program_from_key

A, B, C, D, TERM, ACC = (Var(n) for n in ("a", "b", "c", "d", "term", "acc"))


def _operands(k: int, m: int, n: int, o: int, batch: tuple[int, ...] = (), seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = ((*batch, k, m), (*batch, n, k), (*batch, o, k), (*batch, n, m))
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


def _pieces(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`a`, `b`, `c`, `d` broadcast to `[..., o, n, m, k]`."""
    return (
        a.mT[..., None, None, :, :],  # a[k, m] -> [1, 1, m, k]
        b[..., None, :, None, :],  # b[n, k] -> [1, n, 1, k]
        c[..., :, None, None, :],  # c[o, k] -> [o, 1, 1, k]
        d[..., None, :, :, None],  # d[n, m] -> [1, n, m, 1]
    )


# (name, traced kernel, hyperparameters, float64 formula of out[..., o, n, m])
KERNELS = [
    (
        "max_of_shifted_abs",
        kermac.gradient_program(lambda a, b, d: abs(d - b) - a, accumulate=lambda c, term: c * term, reduce="max"),
        {},
        lambda a, b, c, d: (c * ((d - b).abs() - a)).amax(-1),
    ),
    (
        "min_of_differences",
        kermac.gradient_program(lambda a, b, d: a * b - d, accumulate=lambda c, term: term - c, reduce="min"),
        {},
        lambda a, b, c, d: (a * b - d - c).amin(-1),
    ),
    (
        "soft_max_epilogue",
        kermac.gradient_program(
            lambda a, b, d, gamma: a * (d - b) / gamma,
            reduce="logsumexp",
            epilogue=lambda acc, gamma: gamma * acc,
        ),
        {"gamma": 0.7},
        lambda a, b, c, d: 0.7 * torch.logsumexp(c * a * (d - b) / 0.7, -1),
    ),
    (
        "sum_not_a_product",
        kermac.gradient_program(lambda a, b, d: a + (d - b) ** 2),
        {},
        lambda a, b, c, d: (c * (a + (d - b) ** 2)).sum(-1),
    ),
    (
        "sum_of_exp_accumulate",
        kermac.gradient_program(
            lambda a, b, d, s: dsl.exp(-abs(d - b) / s) * a, accumulate=lambda c, term: dsl.exp(c) * term
        ),
        {"s": 1.5},
        lambda a, b, c, d: (torch.exp(c) * torch.exp(-(d - b).abs() / 1.5) * a).sum(-1),
    ),
]


@pytest.mark.parametrize("name, kernel, hypers, formula", KERNELS, ids=[k[0] for k in KERNELS])
@pytest.mark.parametrize("backend, device", BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_values_against_the_formula(name, kernel, hypers, formula, backend, device, dtype) -> None:
    require_backend(backend, device, "grad")
    assert kernel.program.general
    a, b, c, d = _operands(37, 29, 19, 3)
    ref = formula(*_pieces(a, b, c, d))
    out = kernel(*(t.to(device, dtype) for t in (a, b, c, d)), backend=backend, **hypers)
    scale = ref.abs().max()
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    assert out.shape == ref.shape
    assert ((out.double().cpu() - ref).abs() / scale).max() <= tol


@pytest.mark.parametrize("backend, device", BACKEND_DEVICES)
def test_batched_hyperparameter_and_broadcast_batch(backend: str, device: str) -> None:
    """One gamma per batch entry; `a` without a batch dimension broadcasts against the others'."""
    require_backend(backend, device, "grad")
    kernel = KERNELS[2][1]
    _, b, c, d = _operands(11, 6, 5, 2, batch=(2,))
    (a,) = _operands(11, 6, 5, 2, seed=1)[:1]
    gamma = torch.tensor([0.5, 2.0], dtype=torch.float64)
    g = gamma[:, None, None, None, None]
    ap, bp, cp, dp = _pieces(a, b, c, d)
    ref = gamma[:, None, None, None] * torch.logsumexp(cp * ap * (dp - bp) / g, -1)
    out = kernel(*(t.to(device) for t in (a, b, c, d)), backend=backend, gamma=gamma.to(device))
    assert out.shape == (2, 2, 5, 6)
    assert ((out.cpu() - ref).abs() / ref.abs().max()).max() <= 1e-12


@pytest.mark.parametrize("backend, device", BACKEND_DEVICES)
@pytest.mark.parametrize(
    "reduce, identity", [("sum", 0.0), ("max", -torch.inf), ("min", torch.inf), ("logsumexp", -torch.inf)]
)
def test_empty_contraction_is_the_identity(backend: str, device: str, reduce: str, identity: float) -> None:
    """K = 0: every output is the epilogue of the reduction's identity."""
    require_backend(backend, device, "grad")
    kernel = kermac.gradient_program(lambda a, b, d: a - b * d, reduce=reduce, epilogue=lambda acc: acc + 1.0)
    a, b, c, d = _operands(0, 4, 3, 2)
    out = kernel(*(t.to(device) for t in (a, b, c, d)), backend=backend)
    assert out.shape == (2, 3, 4)
    assert torch.equal(out.cpu(), torch.full((2, 3, 4), identity + 1.0, dtype=torch.float64))


@pytest.mark.parametrize("backend, device", BACKEND_DEVICES)
def test_nan_and_infinities(backend: str, device: str) -> None:
    """A NaN term makes a maximum NaN (the IR's max propagates NaN); an infinite one its infinity."""
    require_backend(backend, device, "grad")
    kernel = KERNELS[0][1]
    a, b, c, d = _operands(5, 4, 3, 2)
    b[0, 1] = torch.nan
    b[2, 3] = torch.inf
    ref = KERNELS[0][3](*_pieces(a, b, c, d))
    out = kernel(*(t.to(device) for t in (a, b, c, d)), backend=backend).cpu()
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any()
    finite = ref.isfinite()
    assert torch.equal(out[~finite & ~ref.isnan()], ref[~finite & ~ref.isnan()])
    assert torch.allclose(out[finite], ref[finite], rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend, device", BACKEND_DEVICES)
def test_functions_that_read_no_operand(backend: str, device: str) -> None:
    """A constant multiply and an accumulate of `c` alone still have the shape of every operand."""
    require_backend(backend, device, "grad")
    a, b, c, d = (t.to(device) for t in _operands(6, 4, 3, 2, batch=(2,)))
    constant = kermac.run_grad_program(GradProgram(ir.Const(2.0), ACC, C * TERM, "max"), a, b, c, d, backend=backend)
    assert torch.equal(constant.cpu(), (2.0 * c.cpu()).amax(-1)[..., :, None, None].expand(2, 2, 3, 4))
    only_c = kermac.run_grad_program(GradProgram(A, ACC, C, "min"), a, b, c, d, backend=backend)
    assert torch.equal(only_c.cpu(), c.cpu().amin(-1)[..., :, None, None].expand(2, 2, 3, 4))


def test_construction_checks() -> None:
    with pytest.raises(ValueError, match="accumulate: may use variables \\['c', 'term'\\], got unknown \\['a'\\]"):
        GradProgram(A, ACC, A * TERM)
    with pytest.raises(ValueError, match="multiply: may use variables \\['a', 'b', 'd'\\], got unknown \\['c'\\]"):
        GradProgram(C * D, ACC, C * TERM)
    with pytest.raises(ValueError, match="multiply: may use variables \\['b', 'd'\\], got unknown \\['a'\\]"):
        GradProgram(A * D, ACC)  # the product form's multiply is the factor of a
    with pytest.raises(ValueError, match=r"reduction: the product form .* got 'max'"):
        GradProgram(D - B, ACC, None, "max")
    with pytest.raises(ValueError, match=r"reduction: expected one of .* got 'prod'"):
        GradProgram(D - B, ACC, C * TERM, "prod")
    with pytest.raises(TypeError, match=r"accumulate: expected a kermac\.ir\.Expr, got str"):
        GradProgram(D - B, ACC, "c * term")


@pytest.mark.parametrize("name", ["x", "z", "acc", "diag", "a", "b", "c", "d", "term"])
def test_a_hyperparameter_cannot_be_named_as_a_variable(name: str) -> None:
    """Backends look variables and hyperparameters up by name: `$d` beside `d` (or `$x` in a pairwise program, which
    becomes `d` in its gradient program) would read one for the other."""
    with pytest.raises(
        ValueError, match=rf"accumulate: a hyperparameter cannot be named as a program variable .* \['{name}'\]"
    ):
        GradProgram(A * (D - B), ACC, C * TERM * Hyper(name), "max")
    with pytest.raises(ValueError, match=rf"inner: a hyperparameter cannot be named .* \['{name}'\]"):
        PairwiseProgram(Var("x") - Var("z") * Hyper(name), "sum", ACC)
    with pytest.raises(ValueError, match=rf"multiply: a hyperparameter cannot be named .* \['{name}'\]"):
        GradProgram((D - B) * Hyper(name), ACC)


def test_keys_round_trip_and_pickle() -> None:
    programs = [
        GradProgram(ir.abs_(D - B) - A, Hyper("s") * ACC, TERM * C + Hyper("t"), "logsumexp"),
        GradProgram(D - B, ACC),
        grad_program(1.5),
    ]
    for program in programs:
        assert program_from_key(program.key()) == program
        assert pickle.loads(pickle.dumps(program)) == program
    general = programs[0]
    assert general.hypers == ("s", "t") and general.general and general.identity == -torch.inf
    assert not programs[1].general and programs[1].identity == 0.0
    # the product form and the same contraction written in the general form are different programs
    assert GradProgram(A * (D - B), ACC, C * TERM).key() != programs[1].key()


def test_product_factor_finds_the_product_form() -> None:
    """A general sum of `c·term` whose multiply is `a` times a factor runs the product-form kernels."""
    assert product_factor(GradProgram(D - B, ACC)) == D - B
    assert product_factor(GradProgram(A * (D - B), ACC, C * TERM)) == D - B
    assert product_factor(GradProgram((D - B) * A, ACC, TERM * C)) == D - B  # either order
    assert product_factor(GradProgram(A, ACC, C * TERM)) == ir.Const(1.0)
    assert product_factor(GradProgram(A * (D - B), ACC, C * TERM, "max")) is None  # not a sum
    assert product_factor(GradProgram(A * (D - B), ACC, C + TERM)) is None  # not c·term
    assert product_factor(GradProgram(A * A * (D - B), ACC, C * TERM)) is None  # a twice
    assert product_factor(GradProgram(A + D, ACC, C * TERM)) is None


@pytest.mark.parametrize("backend, device", BACKEND_DEVICES)
def test_a_general_program_equal_to_a_product_form_gives_its_values(backend: str, device: str) -> None:
    """`Σ c·(a·sign(d − b))` written in the general form runs the sign-product kernels and equals cdist_grad(p=1)."""
    require_backend(backend, device, "grad")
    program = GradProgram(A * ir.sign(D - B), ACC, C * TERM)
    operands = [t.to(device, torch.float32) for t in _operands(37, 29, 19, 3)]
    out = kermac.run_grad_program(program, *operands, backend=backend)
    expected = kermac.cdist_grad(*operands, p=1.0, backend=backend)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


# A backend written before the general form: its grad reads program.multiply as the factor of c·a·multiply.
OLD_PLUGIN = (
    older_backend_source("ProductFormOnly", "product-form-only")
    + """

@hookimpl
def kermac_backends():
    return [ProductFormOnly()]
"""
)


@pytest.fixture
def product_form_only(tmp_path, monkeypatch):
    with plugin_beside_reference(tmp_path, monkeypatch, "kermac_general_grad_test_plugin", OLD_PLUGIN, "old"):
        yield


def test_a_backend_written_for_the_product_form_is_never_handed_a_general_program(product_form_only) -> None:
    """Its check_general_grad is the refusing default: `auto` passes it over (here it outranks the reference), a
    request for it by name raises quoting the refusal; a general program equal to a product form reaches it in the
    product form and gives the right values."""
    a, b, c, d = _operands(9, 5, 4, 2)
    ap, bp, cp, dp = _pieces(a, b, c, d)
    general = GradProgram(ir.abs_(D - B) - A, ACC, C * TERM, "max")
    torch.testing.assert_close(kermac.run_grad_program(general, a, b, c, d), (cp * ((dp - bp).abs() - ap)).amax(-1))
    with pytest.raises(
        kermac.UnsupportedProblemError,
        match=r"backend 'product-form-only' cannot run this gradient problem: backend 'product-form-only' computes "
        r"gradient programs in the product form Σ_k c·a·g\(d, b\) only",
    ):
        kermac.run_grad_program(general, a, b, c, d, backend="product-form-only")
    in_general_form = GradProgram(A * ir.sign(D - B), ACC, C * TERM)
    out = kermac.run_grad_program(in_general_form, a, b, c, d, backend="product-form-only")
    torch.testing.assert_close(out, (cp * ap * torch.sign(dp - bp)).sum(-1))
