"""`kermac.programs.affine_factor`: which gradient programs have a product factor `α·d + β·b` (the matrix-product
route of the tensor-core gradient kernels), with which coefficients, and which are refused."""

from __future__ import annotations

import math

import pytest
import torch

from kermac import ir
from kermac.ir import Const, Hyper, Var
from kermac.ir_eval import evaluate
from kermac.lowering import grad_program
from kermac.programs import GradProgram, affine_factor, product_factor

A, B, C, D, TERM, ACC = (Var(n) for n in ("a", "b", "c", "d", "term", "acc"))

AFFINE = [
    (D - B, (1.0, -1.0)),
    (-(B - D), (1.0, -1.0)),
    (D + Const(-1.0) * B, (1.0, -1.0)),
    (-B + D, (1.0, -1.0)),
    ((D - B) * 2.0, (2.0, -2.0)),
    (0.5 * (B - D), (-0.5, 0.5)),
    ((D - B) / 4.0, (0.25, -0.25)),
    (D + B, (1.0, 1.0)),
    (3.0 * D - B / 2.0, (3.0, -0.5)),
    (D, (1.0, 0.0)),
    (-B, (0.0, -1.0)),
]

NOT_AFFINE = [
    D - D,  # NaN for an infinite d, which 0·d·s is not
    (D - B) + B,
    D - B + 1.0,  # a constant term
    Hyper("alpha") * (D - B),  # a coefficient that is no number
    0.0 * (D - B),
    -0.0 * (D - B),
    math.inf * (D - B),
    math.nan * (D - B),
    (D - B) / 0.0,
    2.0 / (D - B),
    (D - B) * (D - B),
    D * B,
    ir.sign(D - B),
    abs(D - B),
    Const(1.0),
    1e300 * (1e300 * (D - B)),  # the coefficient overflows
    1e-200 * (1e-200 * (D - B)),  # the coefficient underflows to 0 although d and b are read
]


def test_the_p2_gradient_is_d_minus_b_and_other_powers_are_not_affine() -> None:
    assert affine_factor(grad_program(2.0)) == (1.0, -1.0)
    assert affine_factor(grad_program(1.0)) is None
    assert affine_factor(grad_program(1.5)) is None


@pytest.mark.parametrize(("factor", "coefficients"), AFFINE, ids=[str(f) for f, _ in AFFINE])
def test_affine_factors_and_their_coefficients(factor: ir.Expr, coefficients: tuple[float, float]) -> None:
    """The coefficients found, and the factor's value α·d + β·b on random numbers (as written, in float64)."""
    program = GradProgram(factor, ACC)
    assert affine_factor(program) == coefficients
    d, b = torch.randn(2, 50, dtype=torch.float64)
    value = evaluate(factor, {"d": d, "b": b}, like=d)
    torch.testing.assert_close(value, coefficients[0] * d + coefficients[1] * b, rtol=1e-15, atol=0)


@pytest.mark.parametrize("factor", NOT_AFFINE, ids=[str(f) for f in NOT_AFFINE])
def test_refused_factors(factor: ir.Expr) -> None:
    assert affine_factor(GradProgram(factor, ACC)) is None


def test_the_general_form_takes_its_product_factor() -> None:
    """A sum of `c·term` whose multiply is `a` times an affine factor qualifies, in either order; other general
    programs do not (no product factor), whatever their multiply."""
    assert affine_factor(GradProgram(A * (D - B), ACC, C * TERM)) == (1.0, -1.0)
    assert affine_factor(GradProgram((B - D) * A, ACC, TERM * C)) == (-1.0, 1.0)
    assert affine_factor(GradProgram(A * (D - B), ACC, C + TERM)) is None
    assert affine_factor(GradProgram(A * (D - B), ACC, C * TERM, "max")) is None
    assert product_factor(GradProgram(A * (D - B), ACC, C * TERM, "max")) is None


def test_the_epilogue_does_not_matter() -> None:
    assert affine_factor(GradProgram(D - B, ir.exp(-ACC) * Hyper("scale"))) == (1.0, -1.0)
