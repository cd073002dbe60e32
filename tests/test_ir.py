"""The expression IR, semiring programs and descriptors (construction, validation, canonical keys)."""

from __future__ import annotations

import math

import pytest
import torch

from kermac import GradProgram, KernelDescriptor, PairwiseProgram, ir, presets
from kermac.ir_eval import evaluate

x, z, p = ir.Var("x"), ir.Var("z"), ir.Hyper("p")


def test_operators_build_trees_that_compare_by_value() -> None:
    e = ir.exp(-abs(x - z) / p) + 2 * x**0.5
    same = ir.exp(-abs(x - z) / p) + 2 * x**0.5
    assert e == same and hash(e) == hash(same)
    assert e != ir.exp(-abs(z - x) / p) + 2 * x**0.5
    assert str(e) == "(add (exp (div (neg (abs (sub x z))) $p)) (mul 2.0 (pow x 0.5)))"
    assert ir.free_vars(e) == {"x", "z"} and ir.hyper_names(e) == {"p"}


def test_constants_compare_by_their_bits() -> None:
    """0.0 and −0.0 are different constants (1/−0 = −∞: a backend caching kernels by program must not
    reuse one for the other); every NaN constant equals every other, so a program with a NaN
    constant equals a rebuilt copy of itself and its kernel is found again."""
    assert ir.Const(0.0) != ir.Const(-0.0) and ir.pow(x, -0.0) != ir.pow(x, 0.0)
    assert ir.Const(math.nan) == ir.Const(float("nan")) and hash(ir.Const(math.nan)) == hash(ir.Const(-math.nan))
    prog = PairwiseProgram(x * math.nan, "sum", ir.Var("acc"))
    assert prog == PairwiseProgram(x * float("nan"), "sum", ir.Var("acc")) and len({prog, prog}) == 1
    assert ir.Const(1) == ir.Const(1.0) and ir.Const(math.inf) != ir.Const(-math.inf)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="Call op: expected one of"):
        ir.Call("tanh", (x,))
    with pytest.raises(ValueError, match="'sub': expected 2 argument"):
        ir.Call("sub", (x,))
    with pytest.raises(TypeError, match="Expr or a real number, got str"):
        x + "1"
    with pytest.raises(ValueError, match="Var name: expected a Python identifier"):
        ir.Var("not a name")
    with pytest.raises(TypeError, match="Const value: expected a real number, got bool"):
        ir.Const(True)


def test_render_with_a_backend_table() -> None:
    ops = {"sub": "({0} - {1})", "abs": "fabsf({0})", "pow": "powf({0}, {1})"}
    text = ir.render(ir.pow(abs(x - z), p), const=repr, var=lambda n: f"{n}_v", hyper=lambda n: f"h_{n}", ops=ops)
    assert text == "powf(fabsf((x_v - z_v)), h_p)"
    with pytest.raises(KeyError, match="'exp' has no rendering"):
        ir.render(ir.exp(x), const=repr, var=str, hyper=str, ops=ops)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (ir.sign(x - z), [-1.0, 0.0, 1.0]),
        (ir.sign(x * ir.Const(math.inf) - x * ir.Const(math.inf)), [math.nan] * 3),
        (ir.select(ir.gt(x, z), x, z), [2.0, 1.0, 3.0]),
        (ir.maximum(x, ir.Const(math.nan)), [math.nan] * 3),
        (ir.ne(x, z) + ir.le(x, z) * 10, [11.0, 10.0, 1.0]),
    ],
)
def test_semantics_table(expr: ir.Expr, expected: list[float]) -> None:
    """The reference evaluator implements the documented semantics.

    sign(0) = 0, NaN-propagating max, comparisons give 0/1.
    """
    env = {
        "x": torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64),
        "z": torch.tensor([2.0, 1.0, -1.0], dtype=torch.float64),
    }
    got = evaluate(expr, env, like=env["x"])
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), equal_nan=True)


def test_programs_validate_variables_and_reductions() -> None:
    with pytest.raises(ValueError, match=r"inner: may use variables \['x', 'z'\], got unknown \['acc'\]"):
        PairwiseProgram(ir.Var("acc"), "sum", ir.Var("acc"))
    with pytest.raises(ValueError, match="reduction: expected one of"):
        PairwiseProgram(x, "prod", ir.Var("acc"))
    with pytest.raises(ValueError, match=r"multiply: may use variables \['b', 'd'\]"):
        GradProgram(x, ir.Var("acc"))
    prog = presets.laplace_lp.lower(regularized=True)
    assert prog.hypers == ("bandwidth", "p", "regularization") and prog.uses_diag
    assert not presets.laplace_lp.lower().uses_diag


def test_programs_are_built_once_and_pickle_without_derived_values() -> None:
    """Lowering is memoised (the per-call path reuses one program and its cached hash and
    hyperparameter names); a pickled program carries only its fields, so a process with another
    hash seed recomputes the hash, and copies compare and hash equal to fresh programs."""
    import dataclasses
    import pickle

    from kermac.lowering import cdist_program, grad_program

    assert presets.laplace_lp.lower(regularized=True) is presets.laplace_lp.lower(regularized=True)
    assert cdist_program(1.3) is cdist_program(2.5) is cdist_program(None)
    assert cdist_program(50.0) is cdist_program(60.0)
    assert grad_program(1.3) is grad_program(0.5) and grad_program(1.0) is not grad_program(2.0)
    fresh = PairwiseProgram(abs(x - ir.Var("z")), "sum", ir.Var("acc") * ir.Hyper("s"))
    assert fresh.hypers == ("s",) and hash(fresh) == hash(PairwiseProgram(fresh.inner, "sum", fresh.epilogue))
    for prog in (fresh, presets.laplace_lp.lower(regularized=True), grad_program(1.3)):
        derived = (prog.hypers, hash(prog))
        assert prog.__dict__["_hash"] == derived[1] and prog.__dict__["_hypers"] == derived[0]
        assert set(prog.__getstate__()) == {f.name for f in dataclasses.fields(prog)}
        copy = pickle.loads(pickle.dumps(prog))
        assert copy == prog and hash(copy) == hash(prog) and copy.hypers == prog.hypers


def test_descriptor_validation_and_keys() -> None:
    with pytest.raises(
        ValueError, match="power: expected one of 'abs', 'square', 'pow', 'nonzero', 'identity'; got 'cube'"
    ):
        KernelDescriptor(power="cube")
    with pytest.raises(ValueError, match="kernel: a kernel function needs inner='difference'"):
        KernelDescriptor(inner="product", power="identity", kernel="laplace")
    with pytest.raises(ValueError, match="kernel: expected one of"):
        KernelDescriptor(kernel="sinc")
    d = presets.l2_distance.replace(kernel="gaussian")
    assert d == presets.gaussian and hash(d) == hash(presets.gaussian)
    assert d.key() == "inner=difference;power=square;reduction=sum;outer=sqrt;kernel=gaussian"
    assert len({desc.lower().key() for desc in presets.ALL.values()}) == len(presets.ALL)


def test_gaussian_needs_no_square_root() -> None:
    assert "sqrt" not in str(presets.gaussian.lower().epilogue)


def test_is_squared_difference_sum_recognises_the_p2_family() -> None:
    from kermac.programs import is_squared_difference_sum

    x, z = ir.Var("x"), ir.Var("z")
    t = x - z
    for desc in (presets.l2_distance, presets.gaussian, presets.laplace_l2):
        assert is_squared_difference_sum(desc.lower())
    assert is_squared_difference_sum(PairwiseProgram(t * t, "sum", ir.exp(-ir.Var("acc"))))
    assert not is_squared_difference_sum(PairwiseProgram(t * t, "max", ir.Var("acc")))
    assert is_squared_difference_sum(PairwiseProgram((z - x) * (z - x), "sum", ir.Var("acc")))  # normal form
    assert not is_squared_difference_sum(PairwiseProgram((x - z) * (z - x), "sum", ir.Var("acc")))  # −(x − z)²
    assert not is_squared_difference_sum(presets.l1_distance.lower())
    assert not is_squared_difference_sum(presets.dot_product.lower())


def test_is_abs_difference_sum_recognises_the_l1_family() -> None:
    from kermac.programs import is_abs_difference_sum

    x, z = ir.Var("x"), ir.Var("z")
    for desc in (presets.l1_distance, presets.laplace_l1):
        assert is_abs_difference_sum(desc.lower())
    assert is_abs_difference_sum(PairwiseProgram(ir.abs_(x - z), "sum", ir.sqrt(ir.Var("acc"))))
    assert not is_abs_difference_sum(PairwiseProgram(ir.abs_(x - z), "max", ir.Var("acc")))
    assert is_abs_difference_sum(PairwiseProgram(ir.abs_(z - x), "sum", ir.Var("acc")))  # normal form
    assert not is_abs_difference_sum(PairwiseProgram(ir.abs_(x + z), "sum", ir.Var("acc")))
    assert not is_abs_difference_sum(presets.l2_distance.lower())
    assert not is_abs_difference_sum(presets.lp_distance.lower())


def test_zero_padding_is_neutral_where_the_term_of_zeros_is_the_identity() -> None:
    from kermac.programs import zero_padding_is_neutral

    x, z, acc = ir.Var("x"), ir.Var("z"), ir.Var("acc")
    for desc in (presets.l1_distance, presets.laplace_l1, presets.l2_distance, presets.gaussian, presets.dot_product):
        assert zero_padding_is_neutral(desc.lower())
    assert zero_padding_is_neutral(PairwiseProgram(ir.ne(x, z), "sum", acc))  # [0 ≠ 0] = 0
    assert zero_padding_is_neutral(PairwiseProgram(-ir.abs_(x - z), "sum", acc))  # −0 sums as 0
    assert not zero_padding_is_neutral(presets.linf_distance.lower())  # max: identity −∞
    assert not zero_padding_is_neutral(PairwiseProgram(ir.abs_(x - z), "min", acc))
    assert not zero_padding_is_neutral(PairwiseProgram(ir.exp(x - z), "sum", acc))  # e⁰ = 1
    assert not zero_padding_is_neutral(PairwiseProgram(x / z, "sum", acc))  # 0/0 = NaN
    assert not zero_padding_is_neutral(presets.lp_distance.lower())  # |x − z|^p reads p (1 at p = 0)
    assert not zero_padding_is_neutral(PairwiseProgram(ir.Hyper("h") * (x - z), "sum", acc))


def test_signed_power_recognises_the_fractional_gradient() -> None:
    from kermac.lowering import grad_program
    from kermac.programs import signed_power

    t = ir.Var("d") - ir.Var("b")
    assert signed_power(grad_program(None).multiply) == (t, p - 1.0)
    assert signed_power(ir.select(ir.ne(x, 0.0), ir.sign(x) * ir.pow(abs(x), 0.5), 0.0)) == (x, ir.Const(0.5))
    assert signed_power(grad_program(1.0).multiply) is None
    assert signed_power(ir.select(ir.ne(x, 1.0), ir.sign(x) * ir.pow(abs(x), p), 0.0)) is None  # not t != 0
    assert signed_power(ir.select(ir.ne(x, 0.0), ir.sign(x) * ir.pow(abs(x), p), 1.0)) is None  # not 0 at t = 0
    assert signed_power(ir.select(ir.ne(x, 0.0), ir.sign(z) * ir.pow(abs(x), p), 0.0)) is None  # another sign
    assert signed_power(ir.select(ir.ne(x, 0.0), ir.sign(x) * ir.pow(x, p), 0.0)) is None  # base not |t|


def test_difference_power_recognises_every_lowered_cdist_term() -> None:
    """The exponent P of each |x − z|^P form cdist lowers to (what autograd differentiates), for
    every p and dtype; other terms are not recognised."""
    import torch

    from kermac.lowering import cdist_program
    from kermac.programs import L0_TERM, LINF_TERM, difference_power

    cases = {0.0: 0.0, 1.0: 1.0, 2.0: 2.0, 1.5: p, 50.0: p, None: p, math.inf: 1.0, 1e308: 1.0}
    for dtype in (torch.float32, torch.float64, None):
        for value, exponent in cases.items():
            assert difference_power(cdist_program(value, dtype=dtype).inner) == ir.as_expr(exponent), (value, dtype)
    assert difference_power(L0_TERM) == ir.Const(0.0) and difference_power(LINF_TERM) == ir.Const(1.0)
    assert difference_power(ir.pow(abs(x - z), 3.0)) == ir.Const(3.0)
    t = x - z
    assert difference_power(ir.pow(abs(z - x), p)) == p  # |z − x| = |x − z|
    assert difference_power(ir.pow(z - x, p)) is None  # no absolute value: not |t|^p
    assert difference_power(ir.maximum(ir.pow(abs(t), p), 2.0)) is None  # a floor that is not c·[t ≠ 0]
    assert difference_power(ir.maximum(ir.pow(abs(t), p), -1.0 * ir.ne(t, 0.0))) is None  # negative floor
    assert difference_power(ir.select(ir.eq(t, t), abs(t), 1.0)) is None
    assert difference_power(x * z) is None
