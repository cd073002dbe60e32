"""Differential fuzzing of the generated kernels against the reference backend.

Every case is a random pairwise program (any reduction: sum, max, min, logsumexp) or gradient program
(the product form, or the general form with an accumulation and any reduction) of :mod:`kermac.ir` with
random inputs
(:mod:`fuzz_programs`: constants from 0 and −0 to subnormals, huge values, ±inf and NaN; scalar and
per-batch hyperparameters; comparisons and selects; shapes with 0 and 1; transposed, strided and
broadcast operands; float16, bfloat16, float32 and float64; NaN/inf entries), run on a backend and
on the reference backend (in the case's dtype and in float64), each element checked against its
error interval (:mod:`fuzz_bounds`: rounding of the compute type propagated through the
expression, so ill-conditioned elements get wide intervals instead of flaky failures, while NaN
positions and infinities must match exactly).

* On the CPU, every run fuzzes the Triton backend through its interpreter: :data:`FIXED_CASES` cases
  with fixed seeds (the same every run) and :data:`FRESH_CASES` new ones derived from the suite's
  ``seed`` fixture (``KERMAC_TEST_SEED`` replays a run), within :data:`CPU_BUDGET_S` seconds.
* ``pytest -m gpu`` fuzzes both GPU backends on CUDA tensors (``KERMAC_FUZZ_GPU_CASES`` cases each,
  fixed and fresh seeds, within ``KERMAC_FUZZ_GPU_BUDGET_S`` seconds per backend).

A failure prints the first failing case shrunk to a small reproducer (program s-expressions, shapes,
strides, dtype, values, hyperparameters) and ``python tests/fuzz_programs.py SEED BACKEND DEVICE``,
which replays the unshrunk case.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import fuzz_bounds as fb
import fuzz_programs as fp
import pytest
import torch
from helpers import require_backend

from kermac import ir, lowering
from kermac.programs import GradProgram, PairwiseProgram, product_factor

#: Cases with fixed seeds per CPU run, and fresh ones (from the suite's seed) per run.
FIXED_CASES = 400
FRESH_CASES = 80
#: Wall-clock bound of the CPU fuzz tests together (a loaded machine runs fewer cases, and says so).
CPU_BUDGET_S = 50.0

# Triton's interpreter evaluates with numpy, which warns about the NaN and inf the cases feed it.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
#: Fresh case seeds start above every fixed one.
FRESH_BASE = 1 << 20


def _fresh_seeds(seed: int, count: int) -> list[int]:
    return [FRESH_BASE + (seed % (1 << 32)) * 1024 + i for i in range(count)]


def _fuzz(seeds: list[int], backend: str, device: str, budget_s: float) -> None:
    """Run every case of ``seeds`` (until the budget is spent); fail with a shrunk reproducer."""
    failures: list[fp.Failure] = []
    deadline = time.monotonic() + budget_s
    ran = 0
    for case_seed in seeds:
        if time.monotonic() > deadline:
            break
        failure = fp.verify(fp.generate(case_seed), backend, device)
        ran += 1
        if failure is not None:
            failures.append(failure)
    print(f"fuzzed {ran} of {len(seeds)} cases on {backend}/{device}: {len(failures)} failed")
    if ran < len(seeds):
        print(f"(stopped after {budget_s:.0f} s)")
    if failures:
        first = failures[0]

        def still_fails(case: fp.Case) -> bool:
            found = fp.verify(case, backend, device)
            return found is not None and found.backend == first.backend

        small = fp.shrink(first.case, still_fails)
        shrunk = fp.verify(small, backend, device) if small is not first.case else first
        seeds_failed = ", ".join(str(f.case.seed) for f in failures)
        pytest.fail(
            f"{len(failures)} of {ran} fuzz cases failed on {backend}/{device} (seeds {seeds_failed}).\n"
            f"First failure:\n{first}\n\nShrunk:\n{shrunk or first}",
            pytrace=False,
        )


def test_fuzz_triton_interpreter_fixed_seeds() -> None:
    """The fixed cases on the Triton interpreter (and the reference backend in every case)."""
    require_backend("triton", "cpu")
    _fuzz(list(range(FIXED_CASES)), "triton", "cpu", CPU_BUDGET_S * 0.8)


def test_fuzz_triton_interpreter_fresh_seeds(seed: int) -> None:
    """New cases every run, from the suite's seed (replay with the printed KERMAC_TEST_SEED)."""
    require_backend("triton", "cpu")
    _fuzz(_fresh_seeds(seed, FRESH_CASES), "triton", "cpu", CPU_BUDGET_S * 0.2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "nvrtc"])
def test_fuzz_gpu(backend: str, seed: int) -> None:
    """Both GPU backends on CUDA tensors: fixed and fresh cases (one compilation per program and
    dtype: conftest runs the Triton backend untuned, else every configuration would compile)."""
    require_backend(backend, "cuda")
    count = int(os.environ.get("KERMAC_FUZZ_GPU_CASES", "300"))
    budget = float(os.environ.get("KERMAC_FUZZ_GPU_BUDGET_S", "420"))
    seeds = list(range(count - count // 5)) + _fresh_seeds(seed, count // 5)
    _fuzz(seeds, backend, "cuda", budget)


#: The programs of cdist_grad (p = 1, p = 2, any other p).
CDIST_GRADS = tuple(lowering.grad_program(p) for p in (1.0, 2.0, 1.5))


def test_generated_cases_are_deterministic_and_varied() -> None:
    """A seed gives one case; the cases cover both program kinds, every dtype and reduction (of pairwise
    programs and of general gradient programs), the product form of gradients (cdist's among them) and
    general programs that compute one, empty and single-element shapes, views, batches, tensor
    hyperparameters and special values."""
    for seed in (7, 120):  # a pairwise program; a general gradient program
        a, b = fp.generate(seed), fp.generate(seed)
        assert a.program == b.program and a.dtype == b.dtype
        assert all(torch.equal(a.operands[k].nan_to_num(), b.operands[k].nan_to_num()) for k in a.operands)
    cases = [fp.generate(s) for s in range(FIXED_CASES)]
    kinds = {c.pairwise for c in cases}
    dtypes = {c.dtype for c in cases}
    reductions = {c.program.reduction for c in cases if c.pairwise}
    assert kinds == {True, False} and dtypes == set(fp.DTYPES) and reductions == set(fp.REDUCTIONS)
    grads = [c.program for c in cases if not c.pairwise]
    general = [p for p in grads if p.general]
    assert {p.reduction for p in general if product_factor(p) is None} == set(fp.REDUCTIONS)
    assert any(product_factor(p) is not None for p in general)  # runs the product-form kernels
    assert any(not p.general and p not in CDIST_GRADS for p in grads)
    assert {p for p in grads if p in CDIST_GRADS} == set(CDIST_GRADS)
    sizes = {s for c in cases for t in c.operands.values() for s in t.shape[-2:]}
    assert {0, 1} <= sizes
    assert any(not t.is_contiguous() for c in cases for t in c.operands.values())
    assert any(len(c.out_shape()) > 3 for c in cases)
    assert any(isinstance(v, torch.Tensor) for c in cases for v in c.hypers.values())
    values = torch.cat([t.detach().double().flatten() for c in cases for t in c.operands.values()])
    assert values.isnan().any() and values.isinf().any() and (values == 0).any()
    texts = " ".join(c.describe() for c in cases)
    for op in ("select", "pow", "sign", "exp", "log", "sqrt", "lt", "ne", "nan", "inf", "1e-310", "accumulate="):
        assert op in texts, op
    # Fresh seeds (the suite's seed picks them) draw the new kinds too.
    fresh = [fp.generate(s).program for s in _fresh_seeds(12345, 200)]
    assert any(isinstance(p, GradProgram) and p.general for p in fresh)
    assert any(isinstance(p, PairwiseProgram) and p.reduction == "logsumexp" for p in fresh)


def test_the_oracle_catches_wrong_results() -> None:
    """The intervals are tight where the computation is well-conditioned: the reference output of
    fixed cases passes, and a relative change of 1e-4 (float64, float32) or 2e-2 (16-bit types) of a
    finite element, a NaN in a finite element, a finite value where NaN is certain and a flipped
    infinity are all caught."""
    caught = {"value": 0, "nan": 0, "not nan": 0, "infinity": 0}
    for case_seed in range(60):
        case = fp.generate(case_seed)
        iv = fp.bounds(case, fp._compute_dtype(case.dtype), flush=False)
        got = case.run("torch").double()
        assert not fb.check(got, iv).any(), case.describe()
        exact = ~iv.may & (iv.lo > 0) & (iv.hi < math.inf)
        narrow = exact & ((iv.hi - iv.lo) < 1e-6 * iv.hi)
        step = 2e-2 if case.dtype in (torch.float16, torch.bfloat16) else 1e-4
        checks = {
            "value": (narrow, lambda g, step=step: g * (1 + step)),
            "nan": (~iv.may, lambda g: torch.full_like(g, math.nan)),
            "not nan": (iv.must, lambda g: torch.zeros_like(g)),
            "infinity": (~iv.may & (iv.lo == math.inf), lambda g: -g),
        }
        for name, (where, corrupt) in checks.items():
            if where.any():
                wrong = torch.where(where, corrupt(got), got)
                assert fb.check(wrong, iv)[where].all(), (name, case.describe())
                caught[name] += 1
    assert all(count > 0 for count in caught.values()), caught


#: The wrong reduction each reduction is swapped for: the others' values differ from its own.
WRONG_REDUCTION = {"sum": "logsumexp", "logsumexp": "sum", "max": "min", "min": "max"}


def test_the_oracle_catches_a_wrong_reduction() -> None:
    """A program run with another reduction (log-sum-exp as a sum and back, max as min and back), pairwise or
    general gradient, is caught wherever the interval is narrow and the wrong value is off by more than 1%
    (D = 1, or terms that are all equal, give some reductions the same values); cases of every reduction
    have such elements (the intervals of each reduction are narrow where it is well-conditioned)."""
    caught = dict.fromkeys(WRONG_REDUCTION, 0)
    tight = dict.fromkeys(WRONG_REDUCTION, 0)  # cases with narrow, rounded intervals the wrong values leave
    for case_seed in range(FIXED_CASES):
        case = fp.generate(case_seed)
        program = case.program
        if not case.pairwise and not (program.general and product_factor(program) is None):
            continue  # the product form sums by definition
        wrong_program = dataclasses.replace(program, reduction=WRONG_REDUCTION[program.reduction])
        iv = fp.bounds(case, fp._compute_dtype(case.dtype), flush=False)
        right = case.run("torch").double()
        wrong = dataclasses.replace(case, program=wrong_program).run("torch").double()
        flagged = fb.check(wrong, iv)
        narrow = ~iv.may & iv.lo.isfinite() & iv.hi.isfinite()
        narrow &= (iv.hi - iv.lo) <= 1e-3 * torch.maximum(iv.lo.abs(), iv.hi.abs()) + 1e-6
        far = ((wrong - right).abs() > 1e-2 * right.abs() + 1e-2) | (wrong.isnan() | wrong.isinf())
        must = narrow & far & right.isfinite()
        assert flagged[must].all(), (program.reduction, case.describe())
        caught[program.reduction] += bool(flagged.any())
        tight[program.reduction] += bool((must & (iv.hi > iv.lo)).any())  # not only exact elements
    assert all(count >= 3 for count in caught.values()), caught
    assert all(count >= 3 for count in tight.values()), tight


@pytest.mark.parametrize("compute", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_logsumexp_intervals(compute: torch.dtype) -> None:
    """The log-sum-exp interval of exact terms (numbers of the compute type) holds torch.logsumexp and a
    fold of the stable combine, both in the compute type; it lies within [max, max + log n], is exact for
    special values (NaN, +inf, all −inf, n = 0) and for one finite term, and is narrow for moderate terms:
    1e-3 (float32) or 1e-11 (float64) wide, so a sum in its place, or a value 1% of the width off, is caught."""
    prec = fb.Precision.of(compute)
    gen = torch.Generator().manual_seed(0)
    for n in (0, 1, 2, 7, 33):
        terms = (torch.randn((300, n), generator=gen, dtype=torch.float64) * 4.0).to(compute).double()
        iv = fb.reduce_terms(fb.point(terms), "logsumexp", prec)
        fold = torch.full((300,), -math.inf, dtype=compute)
        for j in range(n):  # the combine of kermac.reductions, left to right in the compute type
            t = terms[:, j].to(compute)
            step = torch.maximum(fold, t) + torch.log1p(torch.exp(-(fold - t).abs()))
            fold = torch.where(fold == t, fold + math.log(2.0), step)
        for got in (torch.logsumexp(terms.to(compute), -1), fold):
            assert not fb.check(got, iv).any(), n
        if n == 0:
            assert (iv.lo == -math.inf).all() and (iv.hi == -math.inf).all()
            continue
        largest = terms.amax(-1)
        assert (iv.lo >= largest - 1e-3).all() and (iv.hi <= largest + math.log(n) + 1e-3).all()
        width = (iv.hi - iv.lo).max().item()
        assert width <= (1e-3 if compute == torch.float32 else 1e-11), width
        if n == 1:
            assert torch.equal(iv.lo, terms[:, 0]) and torch.equal(iv.hi, terms[:, 0])
        else:
            assert fb.check(terms.sum(-1), iv).any()
            assert fb.check(iv.hi + max(width, 1e-12) / 100 + 1e-6 * iv.hi.abs(), iv).all()
    inf, nan = math.inf, math.nan
    special = torch.tensor([[nan, 1.0], [inf, 1.0], [inf, -inf], [-inf, -inf], [inf, inf], [-inf, 2.5]])
    iv = fb.reduce_terms(fb.point(special), "logsumexp", prec)
    assert iv.must.tolist() == [True, False, False, False, False, False] and not iv.may[1:].any()
    assert iv.lo[1:].tolist() == [inf, inf, -inf, inf, 2.5] and iv.hi[1:].tolist() == [inf, inf, -inf, inf, 2.5]


def test_gpu_intervals_contain_the_cpu_results() -> None:
    """The intervals of GPU code (subnormal results and operands may flush, 3×TF32 products) only
    widen the CPU ones: the reference backend's exact-underflow results lie inside them too."""
    for case_seed in range(80):
        case = fp.generate(case_seed)
        compute = fp._compute_dtype(case.dtype)
        iv = fp.bounds(case, compute, flush=True, tf32_split=compute == torch.float32)
        assert not fb.check(case.run("torch"), iv).any(), case.describe()


def test_tf32_intervals_allow_nan_where_a_term_overflows() -> None:
    """3×TF32 splits each factor into parts whose products overflow with either sign where a term c·a·g
    overflows float32, though no factor does (docs/formulas.md): the entry may be NaN where the exact sum
    is +inf.  The interval of the tensor-core kernels allows it (the Triton interpreter gives it here),
    the plain float32 interval does not."""
    require_backend("triton", "cpu")
    program = GradProgram(ir.Const(1.0), ir.Var("acc"))
    operands = {
        "a": torch.tensor([[1e30], [0.5]]),
        "b": torch.zeros(1, 2),
        "c": torch.tensor([[1e30, 2.0]]),
        "d": torch.zeros(1, 1),
    }
    case = fp.Case(0, program, torch.float32, operands, {})
    split = fp.bounds(case, torch.float32, flush=False, tf32_split=True)
    plain = fp.bounds(case, torch.float32, flush=False)
    assert not fb.check(case.run("triton"), split).any() and not fb.check(case.run("torch"), split).any()
    nan, inf = torch.full((1, 1, 1), math.nan), torch.full((1, 1, 1), math.inf)
    assert not fb.check(nan, split).any() and fb.check(nan, plain).all() and not fb.check(inf, plain).any()


def _text(case: fp.Case) -> str:
    return ir.to_sexpr(case.program.inner) + ir.to_sexpr(case.program.epilogue)


def test_shrinking_keeps_the_failure_and_simplifies() -> None:
    """A failing case shrinks to smaller operands and a smaller program that still fail (here a
    synthetic failure: the program uses ``exp`` and x has at least two rows)."""
    cases = (fp.generate(s) for s in range(500))
    case = next(c for c in cases if c.pairwise and "exp" in _text(c) and c.operands["x"].shape[-2] > 2)

    def fails(c: fp.Case) -> bool:
        return "exp" in _text(c) and c.operands["x"].shape[-2] >= 2

    small = fp.shrink(case, fails)
    assert fails(small) and small.note == "shrunk"
    assert small.operands["x"].shape[-2] == 2 and small.operands["x"].numel() < case.operands["x"].numel()
    assert len(_text(small)) < len(_text(case))
