"""The conformance suite of `kermac.testing` catches what it promises to: deliberately faulty
backends (built on the reference backend) registered in process fail it, or are skipped with their
reason where they refuse."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata

import pytest
import torch

from kermac import hookspecs, ir, registry, testing
from kermac.backend import Availability, Backend
from kermac.hookspecs import hookimpl
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem
from kermac.programs import PairwiseProgram
from kermac.reference.backend import ReferenceBackend
from kermac.testing import (
    CASES,
    PRODUCT_CASES,
    PRODUCT_COLUMNS,
    TRANSPOSED_PRODUCT_CASE,
    check_case,
    check_hooks,
    check_product_case,
    check_registry,
    conformance_tests,
)


class Honest(ReferenceBackend):
    """The reference under another name: passes everything."""

    name = "fake-honest"
    priority = -1  # opt-in: `auto` elsewhere in the test session never picks it


class LeavesLastRow(Honest):
    """Writes every row of `out` but the last."""

    name = "fake-lazy"

    def pairwise(self, problem: PairwiseProblem) -> None:
        x, out = problem.x, problem.out
        problem.x, problem.out = x[..., :-1, :], out[..., :-1, :]
        try:
            super().pairwise(problem)
        finally:
            problem.x, problem.out = x, out


class Inaccurate(Honest):
    """Gradients off by a relative 1e-3."""

    name = "fake-inaccurate"

    def grad(self, problem: GradProblem) -> None:
        super().grad(problem)
        problem.out.mul_(1.001)


class RefusesFloat64(Honest):
    name = "fake-float32"

    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        return "float64 is not supported" if problem.dtype == torch.float64 else None


class MuteRefusal(Honest):
    """Refuses with an empty reason."""

    name = "fake-mute"

    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        return " "


class BadPrecompile(Honest):
    name = "fake-precompile"

    def precompile(self, problems: list, *, archs: object = None) -> list[str]:
        return ("kernel",)  # a tuple, not the documented list


class RefusesAll(Honest):
    name = "fake-refuses-all"

    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        return "nothing is supported yet"

    def check_grad(self, problem: GradProblem) -> str | None:
        return "nothing is supported yet"

    def check_product(self, problem: ProductProblem) -> str | None:
        return "nothing is supported yet"


class Unavailable(Honest):
    name = "fake-unavailable"

    def availability(self) -> Availability:
        return Availability.no("needs the frobnicator")


class ReductionFromZero(Honest):
    """Starts a max or min reduction from 0 instead of its identity (−∞, +∞): right wherever a term
    is positive (max) or negative (min), as for every distance."""

    name = "fake-from-zero"

    def pairwise(self, problem: PairwiseProblem) -> None:
        program = problem.program
        if program.reduction not in ("max", "min"):
            return super().pairwise(problem)
        clip = ir.maximum if program.reduction == "max" else ir.minimum
        problem.program = PairwiseProgram(clip(program.inner, 0.0), program.reduction, program.epilogue)
        try:
            super().pairwise(problem)
        finally:
            problem.program = program


class OneTile(Honest):
    """Handles one tile of 64 where a dimension is longer: reduces over the first 64 features only
    (pairwise) and writes the first 64 rows of `o` only (gradients)."""

    name = "fake-one-tile"
    TILE = 64

    def pairwise(self, problem: PairwiseProblem) -> None:
        x, z = problem.x, problem.z
        problem.x, problem.z = x[..., : self.TILE], z[..., : self.TILE]
        try:
            super().pairwise(problem)
        finally:
            problem.x, problem.z = x, z

    def grad(self, problem: GradProblem) -> None:
        c, out = problem.c, problem.out
        problem.c, problem.out = c[..., : self.TILE, :], out[..., : self.TILE, :, :]
        try:
            super().grad(problem)
        finally:
            problem.c, problem.out = c, out


class ProductLeftUnwritten(Honest):
    """Claims every product and returns without writing `out`."""

    name = "fake-product-unwritten"

    def product(self, problem: ProductProblem) -> None:
        pass


class ProductOneTile(Honest):
    """Sums over the first 64 columns of K only (drops every later tile of N)."""

    name = "fake-product-one-tile"
    TILE = 64

    def product(self, problem: ProductProblem) -> None:
        z, v = problem.z, problem.v
        problem.z, problem.v = z[..., : self.TILE, :], v[..., : self.TILE, :]
        try:
            super().product(problem)
        finally:
            problem.z, problem.v = z, v


class ProductMuteRefusal(Honest):
    """Refuses products with an empty reason."""

    name = "fake-product-mute"

    def check_product(self, problem: ProductProblem) -> str | None:
        return ""


class ProductRaises(Honest):
    """Claims every product, then raises running it."""

    name = "fake-product-raises"

    def product(self, problem: ProductProblem) -> None:
        raise RuntimeError("the product kernel is not written yet")


class PredatesProducts(Honest):
    """A backend written before the fused product: it defines neither product hook, so it gets the defaults
    of `Backend` (a refusal, and a `product` that is never called)."""

    name = "fake-predates-products"
    check_product = Backend.check_product
    product = Backend.product


class _Plugin:
    backends = (
        ProductLeftUnwritten(),
        ProductOneTile(),
        ProductMuteRefusal(),
        ProductRaises(),
        PredatesProducts(),
        Honest(),
        LeavesLastRow(),
        Inaccurate(),
        RefusesFloat64(),
        MuteRefusal(),
        BadPrecompile(),
        RefusesAll(),
        Unavailable(),
        ReductionFromZero(),
        OneTile(),
    )

    @hookimpl
    def kermac_backends(self) -> list:
        return list(self.backends)


PLUGIN = _Plugin()


@pytest.fixture(autouse=True)
def fakes() -> Iterator[None]:
    """The fake backends registered beside the installed ones for one test."""
    group = hookspecs.ENTRY_POINT_GROUP
    own = metadata.EntryPoint("fake-conformance", f"{__name__}:PLUGIN", group)
    registry.reset([own, *metadata.entry_points(group=group)])
    yield
    registry.reset()


def _case(name: str) -> testing.Case:
    return next(c for c in CASES if c.name == name)


def test_an_honest_backend_passes_every_case() -> None:
    check_registry("fake-honest")
    check_hooks("fake-honest", "cpu")
    for case in CASES:
        assert check_case("fake-honest", case, "cpu", torch.float32) is None, case.name


def test_unwritten_out_fails() -> None:
    with pytest.raises(AssertionError, match="out was left unwritten"):
        check_case("fake-lazy", _case("l1_distance"), "cpu", torch.float64)


def test_wrong_values_fail() -> None:
    with pytest.raises(AssertionError, match="entries differ from the reference"):
        check_case("fake-inaccurate", _case("grad_p2"), "cpu", torch.float32)


def test_a_refusal_is_returned_as_the_reason() -> None:
    assert check_case("fake-float32", _case("l1_distance"), "cpu", torch.float64) == "float64 is not supported"
    assert check_case("fake-float32", _case("l1_distance"), "cpu", torch.float32) is None


def test_an_empty_refusal_fails() -> None:
    with pytest.raises(AssertionError, match="check_pairwise returned ' '"):
        check_case("fake-mute", _case("l1_distance"), "cpu", torch.float32)


def test_a_hook_of_the_wrong_type_fails() -> None:
    with pytest.raises(AssertionError, match=r"precompile\(\): expected a list of str"):
        check_hooks("fake-precompile", "cpu")


def test_an_unregistered_backend_fails() -> None:
    with pytest.raises(AssertionError, match="'fake-missing' is not registered"):
        check_registry("fake-missing")


def test_infinite_gradients_may_be_nan_only_below_float64() -> None:
    ref = torch.tensor([1.0, torch.inf], dtype=torch.float64)
    got = torch.tensor([1.0, torch.nan], dtype=torch.float32)
    testing.assert_matches_reference(got, ref, rtol=None, what="t", inf_may_be_nan=True)
    with pytest.raises(AssertionError, match="1 of 2 entries differ"):
        testing.assert_matches_reference(got, ref, rtol=None, what="t")
    assert torch.float64 not in testing.GRAD_INF_MAY_BE_NAN and torch.float32 in testing.GRAD_INF_MAY_BE_NAN


def test_the_suite_names_one_test_per_check() -> None:
    tests = conformance_tests("fake-honest", devices=["cpu"])
    checks = ("hooks", "products", "reached", "registry", "transposed_product", "values")
    assert sorted(tests) == [f"test_fake_honest_{check}" for check in checks]


def test_the_suite_skips_a_refused_problem_with_the_reason() -> None:
    test_values = conformance_tests("fake-float32")["test_fake_float32_values"]
    refused = r"refuses l1_distance \(float64 on cpu\): float64 is not supported"
    with pytest.raises(pytest.skip.Exception, match=refused):
        test_values("cpu", torch.float64, _case("l1_distance"))
    test_values("cpu", torch.float32, _case("l1_distance"))


def test_an_unavailable_backend_skips_or_fails_if_required() -> None:
    with pytest.raises(pytest.skip.Exception, match="unavailable: needs the frobnicator"):
        conformance_tests("fake-unavailable")["test_fake_unavailable_values"]("cpu", torch.float32, CASES[0])
    required = conformance_tests("fake-unavailable", required=True)["test_fake_unavailable_values"]
    with pytest.raises(pytest.fail.Exception, match="unavailable: needs the frobnicator"):
        required("cpu", torch.float32, CASES[0])


def test_reached_runs_the_hooks_or_skips_where_everything_is_refused() -> None:
    with pytest.MonkeyPatch.context() as patch:
        conformance_tests("fake-honest")["test_fake_honest_reached"]("cpu", patch)
        reached = conformance_tests("fake-refuses-all")["test_fake_refuses_all_reached"]
        with pytest.raises(pytest.skip.Exception, match="refuses the sample problems"):
            reached("cpu", patch)


def test_backend_names_lists_the_registry() -> None:
    assert set(testing.backend_names()) == set(registry.registered_backends())
    assert "fake-honest" in testing.backend_names() and "torch" in testing.backend_names()


def _rejected(backend: str, dtype: torch.dtype = torch.float64) -> list[str]:
    """The cases of `CASES` on which `backend` fails the suite."""
    rejected = []
    for case in CASES:
        try:
            check_case(backend, case, "cpu", dtype)
        except AssertionError:
            rejected.append(case.name)
    return rejected


def test_a_reduction_started_from_zero_fails() -> None:
    """Every distance's max has positive terms: only the cases whose terms all have the wrong sign tell."""
    assert _rejected("fake-from-zero") == ["user_max_of_negatives", "user_min_of_positives"]
    with pytest.raises(AssertionError, match="entries differ from the reference"):
        check_case("fake-from-zero", _case("user_max_of_negatives"), "cpu", torch.float32)


def test_a_backend_that_handles_one_tile_fails() -> None:
    """Features beyond 64 left out of the sum, and rows of `o` beyond 64 left unwritten: only the cases
    larger than a tile in every dimension tell."""
    assert _rejected("fake-one-tile") == ["l1_multi_block", "l2_multi_block", "grad_p2_multi_block"]
    with pytest.raises(AssertionError, match="out was left unwritten"):
        check_case("fake-one-tile", _case("grad_p2_multi_block"), "cpu", torch.float32)


def test_the_case_table_holds_cases_larger_than_any_tile_in_every_dimension() -> None:
    """Larger than 128 rows or columns of `out` and 64 features, gradients also than 64 of `k` and `o`."""
    pairwise = [c for c in CASES if c.op == "pairwise" and min(c.shapes[0][-2], c.shapes[1][-2]) > 128]
    assert [c.name for c in pairwise if c.shapes[0][-1] > 64] == ["l1_multi_block", "l2_multi_block"]
    k, m = _case("grad_p2_multi_block").shapes[0]
    n, o = _case("grad_p2_multi_block").shapes[1][0], _case("grad_p2_multi_block").shapes[2][0]
    assert min(k, m, n, o) > 64 and min(m, n) > 128
    assert _case("grad_p2_multi_block").terms == o * n * m * k
    assert _case("l1_batch0").terms == 0 and _case("l1_broadcast_batch_2d").terms == 3 * 4 * 7 * 9 * 5


def test_the_suite_can_leave_cases_out() -> None:
    test_values = conformance_tests("fake-honest", cases=CASES[:2])["test_fake_honest_values"]
    [parametrize] = [m for m in test_values.pytestmark if m.args[0] == "case"]
    assert parametrize.args[1] == list(CASES[:2])


class BoolPriority(Honest):
    name = "fake-bool-priority"
    priority = True  # an int to isinstance, not to the contract


class FloatPreference(Honest):
    name = "fake-float-preference"

    def preference(self, problem: PairwiseProblem | GradProblem) -> int:
        return 1.5  # type: ignore[return-value]


class _Untyped:
    backends = (BoolPriority(), FloatPreference())

    @hookimpl
    def kermac_backends(self) -> list:
        return list(self.backends)


UNTYPED = _Untyped()


def test_the_registry_and_the_suite_apply_one_rule_to_declared_fields() -> None:
    """`contract_violations` words what the registry reports, and `check_hooks` fails with it."""
    group = hookspecs.ENTRY_POINT_GROUP
    registry.reset([metadata.EntryPoint("fake-untyped", f"{__name__}:UNTYPED", group)])
    sample = next(c for c in CASES if c.op == "pairwise")
    problem = sample.problem(*sample.inputs("cpu", torch.float32), None)
    assert registry.contract_violations("fake-bool-priority") == ["priority returned bool, expected an int"]
    assert registry.contract_violations("fake-float-preference") == []
    assert registry.contract_violations("fake-float-preference", [problem]) == [
        "preference() returned float, expected an int"
    ]
    with pytest.raises(AssertionError, match="breaks the backend contract: priority returned bool, expected an int"):
        check_hooks("fake-bool-priority", "cpu")
    with pytest.raises(AssertionError, match=r"breaks the backend contract: preference\(\) returned float"):
        check_hooks("fake-float-preference", "cpu")
    with pytest.warns(RuntimeWarning, match="priority returned bool, expected an int"):
        rows = {row.name: row for row in registry.backend_statuses()}
    assert rows["fake-bool-priority"].broken and not rows["fake-float-preference"].broken


def test_contract_violations_reads_every_field_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = registry.get_backend("fake-honest")
    assert registry.contract_violations("fake-honest") == []
    monkeypatch.setattr(honest, "name", "renamed")
    monkeypatch.setattr(honest, "availability", lambda: 1 / 0)
    assert registry.contract_violations("fake-honest") == [
        "name is 'renamed', but the backend is registered as 'fake-honest'",
        "availability() raised ZeroDivisionError: division by zero",
    ]
    with pytest.raises(ValueError, match="got 'fake-missing'"):
        registry.contract_violations("fake-missing")


def test_the_triton_backend_stays_untuned_when_the_registry_is_rebuilt() -> None:
    """conftest's promise (autotuning off) holds after `registry.reset`: this module's fixture rebuilt
    the registry from the entry points, and a bare reset rebuilds it again on first use."""
    pytest.importorskip("kermac_backend_triton")
    assert registry.get_backend("triton").tuning.autotune is False
    registry.reset()
    assert registry.get_backend("triton").tuning.autotune is False


def _rejected_products(backend: str, dtype: torch.dtype = torch.float64) -> list[str]:
    """The product cases (with `v` of every number of columns, and the transposed product) on which
    `backend` fails the suite."""
    rejected = []
    for case in PRODUCT_CASES:
        for columns in PRODUCT_COLUMNS:
            try:
                check_product_case(backend, case, "cpu", dtype, columns)
            except AssertionError:
                rejected.append(f"{case.name}/{columns}")
    try:
        check_product_case(backend, TRANSPOSED_PRODUCT_CASE, "cpu", dtype, PRODUCT_COLUMNS[-1], transpose=True)
    except AssertionError:
        rejected.append("transposed")
    return rejected


def test_an_honest_backend_passes_every_product() -> None:
    for dtype in (torch.float32, torch.float16):
        assert _rejected_products("fake-honest", dtype) == []
    conformance_tests("fake-honest")["test_fake_honest_products"]("cpu", torch.float32, PRODUCT_CASES[0], 5)
    conformance_tests("fake-honest")["test_fake_honest_transposed_product"]("cpu", torch.float64)


def test_a_product_left_unwritten_fails() -> None:
    """Every product the backend is handed fails; only those never handed to a backend (an empty output,
    or N = 0, whose zeros kermac writes) pass."""
    never_handed = {f"l1_n0/{columns}" for columns in PRODUCT_COLUMNS}
    every = {f"{case.name}/{columns}" for case in PRODUCT_CASES for columns in PRODUCT_COLUMNS} | {"transposed"}
    assert set(_rejected_products("fake-product-unwritten")) == every - never_handed
    with pytest.raises(AssertionError, match="out was left unwritten"):
        check_product_case("fake-product-unwritten", _case("l1_distance"), "cpu", torch.float32, 5)
    test_products = conformance_tests("fake-product-unwritten")["test_fake_product_unwritten_products"]
    with pytest.raises(AssertionError, match="product of pairwise program"):
        test_products("cpu", torch.float32, _case("gaussian"), 1)


def test_a_product_that_drops_the_last_tiles_of_n_fails() -> None:
    """A sum over the first 64 columns of K only: exactly the cases with N beyond 64 tell, with `v` of
    one column and of several."""
    long = [c.name for c in PRODUCT_CASES if c.shapes[1][-2] > ProductOneTile.TILE]
    assert long == ["l1_multi_tile", "l2_multi_tile", "l2_multi_block", "gaussian_long_n"]
    assert _rejected_products("fake-product-one-tile") == [f"{n}/{c}" for n in long for c in PRODUCT_COLUMNS]
    with pytest.raises(AssertionError, match="entries differ from the reference"):
        check_product_case("fake-product-one-tile", _case("gaussian_long_n"), "cpu", torch.float32, 1)


def test_an_empty_product_refusal_fails() -> None:
    with pytest.raises(AssertionError, match="check_product returned ''"):
        check_product_case("fake-product-mute", _case("l1_distance"), "cpu", torch.float32, 1)
    with pytest.raises(AssertionError, match="check_product returned ''"):
        check_hooks("fake-product-mute", "cpu")


def test_a_product_that_raises_after_claiming_fails() -> None:
    raised = "raised RuntimeError: the product kernel is not written yet"
    with pytest.raises(AssertionError, match=raised):
        check_product_case("fake-product-raises", _case("l1_distance"), "cpu", torch.float32, 5)
    with pytest.raises(AssertionError, match=raised):
        check_product_case("fake-product-raises", TRANSPOSED_PRODUCT_CASE, "cpu", torch.float32, 5, transpose=True)


def test_a_backend_that_predates_products_passes_with_them_skipped() -> None:
    """The refusing default of `Backend.check_product` is a reason: every product is skipped with it (those
    never handed to a backend pass), and the rest of the suite runs as before."""
    name = "fake-predates-products"
    default = f"backend {name!r} does not compute fused kernel products"
    check_registry(name)
    check_hooks(name, "cpu")
    for case in PRODUCT_CASES:
        for columns in PRODUCT_COLUMNS:
            expected = None if case.name == "l1_n0" else default
            assert check_product_case(name, case, "cpu", torch.float32, columns) == expected, case.name
    tests = conformance_tests(name)
    with pytest.raises(pytest.skip.Exception, match=r"refuses the product of gaussian \(C = 5, float32 on cpu\)"):
        tests["test_fake_predates_products_products"]("cpu", torch.float32, _case("gaussian"), 5)
    with pytest.raises(pytest.skip.Exception, match=f"refuses the transposed product of .*: {default}"):
        tests["test_fake_predates_products_transposed_product"]("cpu", torch.float64)
    assert check_case(name, _case("gaussian"), "cpu", torch.float32) is None
    with pytest.MonkeyPatch.context() as patch:
        tests["test_fake_predates_products_reached"]("cpu", patch)


def test_reached_runs_the_product_hook() -> None:
    """`backend=` and KERMAC_BACKEND reach the product hook of a backend that claims products; one that
    left its product out would be caught there."""
    from kermac.testing.suite import _reaches

    with pytest.MonkeyPatch.context() as patch:
        assert _reaches("fake-honest", "cpu", patch) == ["pairwise", "grad", "product"]
    with pytest.MonkeyPatch.context() as patch:
        assert _reaches("fake-predates-products", "cpu", patch) == ["pairwise", "grad"]


def test_the_suite_can_leave_products_out() -> None:
    test_products = conformance_tests("fake-honest", products=PRODUCT_CASES[:2])["test_fake_honest_products"]
    [parametrize] = [m for m in test_products.pytestmark if m.args[0] == "case"]
    assert parametrize.args[1] == list(PRODUCT_CASES[:2])


def test_the_product_tolerance_scales_with_the_sum_of_absolute_terms() -> None:
    """The error of `K @ v` is measured against max |K| · max_c Σ_n |v[n, c]|, with the pairwise rtol plus N·u:
    a cancelling sum near 0 is not held to its own (tiny) size, and a wrong term is still caught."""
    k = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.5], [2.0, torch.nan]], dtype=torch.float64)
    assert testing.product_scale(k, v) == 2.0 * 3.0
    assert testing.product_rtol(torch.float64, 4) == testing.TOLERANCE[torch.float64] + 4 * 2.0**-53
    assert testing.product_rtol(torch.float16, 100) == testing.TOLERANCE[torch.float16] + 100 * 2.0**-24
    ref = torch.tensor([0.0], dtype=torch.float64)
    scale = testing.product_scale(k, v)
    testing.assert_matches_reference(torch.tensor([5e-6]), ref, rtol=1e-6, what="t", scale=scale)
    with pytest.raises(AssertionError, match="1 of 1 entries differ"):
        testing.assert_matches_reference(torch.tensor([7e-6]), ref, rtol=1e-6, what="t", scale=scale)
