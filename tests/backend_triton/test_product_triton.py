"""The Triton backend's fused kernel product `out = K(x, z) @ v` (`TritonBackend.product`).

Every value is checked against an independent float64 dense reference: the reference backend's
pairwise program on float64 copies of the inputs, then a float64 matrix product.  On the CPU the
kernels run in Triton's interpreter at small sizes; the `gpu` tests run the same at real sizes,
tuned and untuned.

- presets (Gaussian, Laplace-L1/L2, Matérn) and a user program with a max reduction, on both
  kernels whose K tiles the product contracts (SIMT; the guarded tensor-core tile of the
  (x − z)² family, its recompute of near-duplicate rows included), in float32 and float64;
- sizes that are no tile multiple (M, N, D, C), C = 1, 3 and 70 (two column tiles), every size
  0 (N = 0 writes zeros, the others nothing), broadcast batches with batched hyperparameters,
  transposed and strided views of x, z, v and `out`;
- regularisation on a shifted diagonal (both offsets), NaN and ±inf in `v` propagating as in
  the dense product, half inputs (float16, bfloat16) computed in float32 and stored in their dtype;
- `check_product`'s refusals, and the generated kernels compiling to cubins (sm_80, sm_90) in a
  clean process.
"""

from __future__ import annotations

import random
from pathlib import Path

import fuzz_programs
import pytest
import torch
from cubin_jobs import assert_compiled, compile_in_clean_process
from helpers import assert_close, device_under_test, skip_unless_triton_runs, tolerance

import kermac
from kermac import ir, presets, testing
from kermac.hyperparams import program_hypers
from kermac.problem import ProductProblem, product_problem
from kermac.programs import PairwiseProgram

backend_module = pytest.importorskip("kermac_backend_triton.backend")
launch = pytest.importorskip("kermac_backend_triton.launch")
configs = pytest.importorskip("kermac_backend_triton.configs")
TritonTuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning

UNTUNED = TritonTuning(autotune=False)
SIMT = TritonTuning(autotune=False, tensor_cores=False)
PRESET_HYPERS = {"bandwidth": 1.7}


def _program(name: str, regularized: bool = False) -> PairwiseProgram:
    return presets.ALL[name].lower(regularized=regularized)


def _max_program() -> PairwiseProgram:
    """A user program: exp(−max_k |x − z| / h) + λ·diag (a max reduction, two hyperparameters)."""
    t, acc = ir.Var("x") - ir.Var("z"), ir.Var("acc")
    return PairwiseProgram(
        abs(t), "max", ir.exp(-acc / ir.Hyper("h")) + ir.select(ir.Var("diag"), ir.Hyper("lam"), 0.0)
    )


def _product(
    program: PairwiseProgram,
    x: torch.Tensor,
    z: torch.Tensor,
    v: torch.Tensor,
    hypers: dict,
    *,
    tuning: TritonTuning = UNTUNED,
    out: torch.Tensor | None = None,
    offset_m: int = 0,
    offset_n: int = 0,
) -> torch.Tensor:
    hv = program_hypers(program.hypers, hypers, x.device, False)
    problem = product_problem(program, x, z, v, out=out, hypers=hv, offset_m=offset_m, offset_n=offset_n)
    backend = backend_module.TritonBackend(tuning)
    assert backend.check_product(problem) is None
    backend.product(problem)
    return problem.out


def _reference(
    program: PairwiseProgram, x: torch.Tensor, z: torch.Tensor, v: torch.Tensor, hypers: dict, **offsets: int
) -> torch.Tensor:
    """K in float64 by the reference backend, then K @ v in float64."""
    h64 = {k: val.double() if isinstance(val, torch.Tensor) else val for k, val in hypers.items()}
    k = kermac.run_program(program, x.double(), z.double(), hypers=h64, backend="torch", **offsets)
    return k @ v.double()


def _randn(*shape: int, dtype: torch.dtype = torch.float32, device: str | None = None) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).to(dtype=dtype, device=device or device_under_test())


def _check(program, x, z, v, hypers, *, tuning=UNTUNED, **offsets) -> torch.Tensor:
    """The product's value within `tolerance` of the dense float64 one (shapes equal), in x's dtype."""
    out = _product(program, x, z, v, hypers, tuning=tuning, **offsets)
    assert out.dtype == x.dtype
    assert_close(out, _reference(program, x, z, v, hypers, **offsets), tolerance(x.dtype))
    return out


# --- values against the dense float64 product ------------------------------------------------------

CASES = [  # (preset, M, N, D, C, tuning)
    ("gaussian", 37, 45, 5, 3, UNTUNED),
    ("laplace_l1", 37, 45, 5, 1, UNTUNED),
    ("laplace_l2", 19, 33, 3, 70, UNTUNED),
    ("matern32", 17, 50, 6, 3, UNTUNED),
    ("matern52", 21, 18, 2, 16, UNTUNED),
    ("gaussian", 23, 35, 19, 3, UNTUNED),  # D >= TC_MIN_D: tensor-core K tiles
    ("laplace_l2", 23, 35, 19, 1, UNTUNED),
    ("gaussian", 23, 35, 19, 3, SIMT),
    ("gaussian", 23, 35, 19, 1, SIMT),
    ("matern32", 17, 50, 6, 1, UNTUNED),
    ("gaussian", 21, 40, 40, 5, UNTUNED),  # D > PRODUCT_TC_RESIDENT_D: x reloaded per N tile
    ("laplace_l2", 21, 40, 40, 1, UNTUNED),
]


@pytest.mark.parametrize(("name", "m", "n", "d", "c", "tuning"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_presets_match_the_dense_product(name, m, n, d, c, tuning, dtype) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = _program(name)
    x, z, v = _randn(m, d, dtype=dtype), _randn(n, d, dtype=dtype), _randn(n, c, dtype=dtype)
    _check(program, x, z, v, PRESET_HYPERS, tuning=tuning)
    expected = "tensor_cores" if d >= configs.TC_MIN_D and tuning.tensor_cores and dtype == torch.float32 else "simt"
    hv = program_hypers(program.hypers, PRESET_HYPERS, x.device, False)
    assert launch.product_kernel(product_problem(program, x, z, v, out=None, hypers=hv), tuning) == expected


def test_a_user_program_with_a_max_reduction() -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x, z, v = _randn(29, 7), _randn(41, 7), _randn(41, 5)
    _check(_max_program(), x, z, v, {"h": 1.3, "lam": 0.25}, offset_m=2)
    _check(_max_program(), x, z, v[:, 2:3], {"h": 1.3, "lam": 0.25}, offset_m=2)  # one column: no dot


@pytest.mark.parametrize("seed", range(10))
def test_random_user_programs_contract_their_pairwise_matrix(seed: int) -> None:
    """Random programs of the fuzzer (`fuzz_programs`: every operation, special constants, every
    reduction): the product equals the backend's own pairwise matrix K times v, NaN and ±inf
    included.  K itself is fuzzed against the reference by `tests/test_fuzz.py`; a float64
    reference K would differ from the float32 one by K's own rounding (comparisons that flip,
    huge values), which is not what this test checks.  Rows whose finite terms could overflow
    float32 in another summation order are left out."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    rng = random.Random(seed)
    program = fuzz_programs._pairwise_program(rng, fuzz_programs.HYPERS)
    dtype = (torch.float32, torch.float64)[seed % 2]
    hypers = {
        name: value for name, value in zip(fuzz_programs.HYPERS, (0.7, 1.9), strict=True) if name in program.hypers
    }
    x, z, v = _randn(13, 5, dtype=dtype), _randn(21, 5, dtype=dtype), _randn(21, 3, dtype=dtype)
    got = _product(program, x, z, v, hypers, offset_m=1).double()
    k = kermac.run_program(program, x, z, hypers=hypers, offset_m=1, backend="triton").double()
    ref, vd = k @ v.double(), v.double()
    finite_scale = torch.where(torch.isfinite(k), k.abs(), 0.0) @ vd.abs()
    safe = (finite_scale < 1e30).expand_as(ref)
    column = _product(program, x, z, v[:, 1:2], hypers, offset_m=1).double()  # one column: no dot
    got = torch.cat([got, column], dim=1)
    ref, finite_scale, safe = (torch.cat([t, t[:, 1:2]], dim=1) for t in (ref, finite_scale, safe))
    for special in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(special(got)[safe], special(ref)[safe]), (special.__name__, program.key())
    close = safe & torch.isfinite(ref)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert ((got - ref).abs()[close] <= tol * finite_scale[close] + 1e-300).all(), program.key()


def test_the_tensor_core_recompute_of_near_duplicate_rows() -> None:
    """z holds x's rows (d² = 0 exactly on the diagonal): the guard flags those tiles and the SIMT
    tile recomputes them; the result stays within the float32 tolerance."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(20, 24) * 30.0 + 100.0  # large norms: the expansion cancels badly near d = 0
    z = torch.cat([x[:13], _randn(7, 24) * 30.0 + 100.0])
    _check(_program("laplace_l2"), x, z, _randn(20, 2), {"bandwidth": 40.0})
    x = _randn(20, 40) * 30.0 + 100.0  # x not resident: its rows reloaded for each N tile
    _check(
        _program("laplace_l2"), x, torch.cat([x[:13], _randn(7, 40) * 30.0 + 100.0]), _randn(20, 1), {"bandwidth": 60.0}
    )


@pytest.mark.parametrize("tuning", [UNTUNED, SIMT], ids=["tensor_cores", "simt"])
def test_regularisation_on_a_shifted_diagonal(tuning: TritonTuning) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = _program("gaussian", regularized=True)
    x, z, v = _randn(18, 17), _randn(40, 17), _randn(40, 3)
    hypers = {"bandwidth": 2.5, "regularization": 0.75}
    for offsets in ({"offset_m": 5}, {"offset_n": 3}, {"offset_m": 100}):
        _check(program, x, z, v, hypers, tuning=tuning, **offsets)
        _check(program, x, z, v[:, :1], hypers, tuning=tuning, **offsets)


@pytest.mark.parametrize(("name", "d"), [("laplace_l1", 4), ("gaussian", 17)])
def test_broadcast_batches_and_batched_hyperparameters(name: str, d: int) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = _program(name, regularized=True)
    x, z, v = _randn(2, 1, 17, d), _randn(3, 19, d), _randn(1, 19, 2)
    hypers = {"bandwidth": torch.tensor([1.0, 2.0, 3.5], device=device) * d, "regularization": 0.5}
    out = _check(program, x, z, v, hypers, offset_m=1)
    assert out.shape == (2, 3, 17, 2)
    assert _check(program, x, z, v[..., 1:], hypers, offset_m=1).shape == (2, 3, 17, 1)


@pytest.mark.parametrize("tuning", [UNTUNED, SIMT], ids=["tensor_cores", "simt"])
def test_64_bit_indices(tuning: TritonTuning, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variant with 64-bit indices (chosen for operands past 2³¹ elements) computes the same
    values; forced here on small operands."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    monkeypatch.setattr(launch, "_families", {})
    monkeypatch.setattr(launch, "_needs_int64", lambda tensors, programs: True)
    program = _program("gaussian", regularized=True)
    x, z, v = _randn(2, 18, 17), _randn(2, 21, 17), _randn(21, 3)
    _check(program, x, z, v, {"bandwidth": 3.0, "regularization": 0.5}, tuning=tuning, offset_n=2)
    _check(program, x, z, v[:, 1:2], {"bandwidth": 3.0, "regularization": 0.5}, tuning=tuning, offset_n=2)


@pytest.mark.parametrize("c", [1, 3])
def test_a_kept_launch_never_serves_a_d_it_was_not_compiled_for(c: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """D = 32 and D = 48 share the autotuning bucket and D's facts (multiples of 16), but D = 32 takes every
    feature in one step with x kept in registers (`BK` = 32) and D = 48 does not: the second call must not reuse
    the first one's kernel (it read features 0–31 only)."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    monkeypatch.setattr(launch, "_families", {})  # a fresh cache: the order below is what is tested
    program = _program("gaussian")
    for d in (32, 48):
        _check(program, _randn(20, d), _randn(24, d), _randn(24, c), {"bandwidth": 5.0})


@pytest.mark.parametrize("tuning", [UNTUNED, SIMT], ids=["tensor_cores", "simt"])
def test_views_of_every_operand_and_out(tuning: TritonTuning) -> None:
    """x and v transposed, z a strided slice, `out` a transposed view poisoned with NaN: every
    element is written, nothing is copied."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    x = _randn(17, 21).t()  # [21, 17], unit stride along the rows
    z = _randn(50, 34)[::2, ::2]  # [25, 17]
    v = _randn(3, 25).t()  # [25, 3]
    out = torch.full((3, 21), float("nan"), device=device).t()
    program = _program("gaussian")
    got = _product(program, x, z, v, PRESET_HYPERS, tuning=tuning, out=out)
    assert got is out
    assert_close(out, _reference(program, x, z, v, PRESET_HYPERS), tolerance(torch.float32))
    column = torch.full((3, 21), float("nan"), device=device).t()[:, 1:2]  # one column: strides (1, 21)
    _product(program, x, z, v[:, 2:], PRESET_HYPERS, tuning=tuning, out=column)
    assert_close(column, _reference(program, x, z, v[:, 2:], PRESET_HYPERS), tolerance(torch.float32))


def test_size_zero_dimensions() -> None:
    """N = 0 writes zeros (an empty sum); M, C, D = 0 and an empty batch compute what the dense product does."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = _program("laplace_l2")
    out = torch.full((5, 3), float("nan"), device=device)
    _product(program, _randn(5, 4), _randn(0, 4), _randn(0, 3), PRESET_HYPERS, out=out)
    assert torch.equal(out, torch.zeros(5, 3, device=device))
    for x, z, v in [
        (_randn(0, 4), _randn(6, 4), _randn(6, 3)),
        (_randn(5, 4), _randn(6, 4), _randn(6, 0)),
        (_randn(5, 0), _randn(6, 0), _randn(6, 3)),  # D = 0: K = exp(0) = 1 everywhere
        (_randn(0, 5, 4), _randn(6, 4), _randn(6, 3)),
    ]:
        _check(program, x, z, v, PRESET_HYPERS)


@pytest.mark.parametrize("tuning", [UNTUNED, SIMT], ids=["tensor_cores", "simt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_and_inf_in_v_propagate_as_in_the_dense_product(tuning: TritonTuning, dtype: torch.dtype) -> None:
    """A NaN in v makes its column NaN, +inf its column +inf (K > 0), −inf and +inf in one column
    NaN; the other columns stay exact.  (In 3×TF32 an inf split into hi and lo gave NaN.)"""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = _program("gaussian")
    x, z, v = _randn(19, 17, dtype=dtype), _randn(37, 17, dtype=dtype), _randn(37, 5, dtype=dtype)
    v[3, 0] = float("nan")
    v[30, 1] = float("inf")
    v[5, 2], v[20, 2] = float("inf"), float("-inf")
    v[33, 3] = float("-inf")
    hypers = {"bandwidth": 8.0}  # every K entry well above 0
    out = _product(program, x, z, v, hypers, tuning=tuning)
    ref = _reference(program, x, z, v, hypers)
    assert torch.isnan(out[:, 0]).all() and torch.isnan(out[:, 2]).all()
    assert (out[:, 1] == float("inf")).all() and (out[:, 3] == float("-inf")).all()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))
    assert_close(out[:, 4], ref[:, 4], tolerance(dtype))
    for j in range(5):  # one column at a time: the path without a dot
        column = _product(program, x, z, v[:, j : j + 1], hypers, tuning=tuning)
        assert torch.equal(torch.isnan(column), torch.isnan(ref[:, j : j + 1]))
        assert torch.equal(torch.isinf(column), torch.isinf(ref[:, j : j + 1]))
        assert torch.equal(column[torch.isinf(column)], ref[:, j : j + 1][torch.isinf(column)].to(dtype))
    assert_close(column, ref[:, 4:], tolerance(dtype))


def test_columns_past_n_never_reach_the_sum() -> None:
    """K = 1/Σ|x − z| is +inf where z holds x's row; the last N tile's columns past N repeat z's
    first rows (clamped), and their +inf must not meet v's zero padding (inf·0 = NaN): the rows
    stay ±inf as in the dense product."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    t, acc = ir.Var("x") - ir.Var("z"), ir.Var("acc")
    program = PairwiseProgram(abs(t), "sum", 1.0 / acc)
    x, z = _randn(6, 3), _randn(20, 3)  # N = 20: the second 16-column tile repeats z[0:12]
    z[2] = x[1]
    for v in (_randn(20, 2).abs() + 0.5, _randn(20, 1).abs() + 0.5):  # the dot and the one-column path
        out = _product(program, x, z, v, {}, tuning=SIMT)
        ref = _reference(program, x, z, v, {})
        assert (out[1] == float("inf")).all() and (ref[1] == float("inf")).all()
        assert_close(out[[0, 2, 3, 4, 5]], ref[[0, 2, 3, 4, 5]], tolerance(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [5, 18])
def test_half_inputs_compute_in_float32(dtype: torch.dtype, d: int) -> None:
    device = device_under_test()
    skip_unless_triton_runs(device)
    x, z, v = _randn(19, d, dtype=dtype), _randn(22, d, dtype=dtype), _randn(22, 3, dtype=dtype)
    _check(_program("gaussian"), x, z, v, {"bandwidth": 4.0})


def test_repeated_calls_reuse_their_launcher_with_new_values() -> None:
    """The second call of a key launches through its kept `Launcher`; it reads the new inputs."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    program = _program("laplace_l1")
    for _ in range(2):
        _check(program, _randn(20, 3), _randn(30, 3), _randn(30, 2), PRESET_HYPERS)


def test_check_product_refuses_a_grid_beyond_cudas_limit() -> None:
    """Shapes alone decide (stride-0 views, nothing allocated): 2³¹ rows and one column of v fit
    (2²⁴ row tiles), 2⁴⁰ rows and 1024 columns do not."""
    device = device_under_test()
    skip_unless_triton_runs(device)
    backend = backend_module.TritonBackend(UNTUNED)
    program = _program("laplace_l1")
    for m, c, fits in [(2**31, 1, True), (2**40, 1024, False)]:
        x, z = torch.zeros(1, 2, device=device).expand(m, 2), torch.zeros(3, 2, device=device)
        v, out = torch.zeros(1, 1, device=device).expand(3, c), torch.zeros(1, 1, device=device).expand(m, c)
        reason = backend.check_product(ProductProblem(program, x, z, v, out, {}, 0, 0, ()))
        assert (reason is None) if fits else ("thread blocks" in reason), reason


def test_the_autotuner_times_each_configuration_of_the_launch_once() -> None:
    """The configuration lists hold each entry once (the spaces of one column and of several share entries), and
    the prune by `BC` keeps exactly the launch's space."""
    pytest.importorskip("triton")
    for configs_of, tensor_cores in ((configs.product_configs, False), (configs.product_tc_configs, True)):
        listed = configs_of()
        entries = [(c.kwargs, c.num_warps, c.num_stages, c.maxnreg) for c in listed]
        assert all(entries.count(e) == 1 for e in entries)
        for block_c in (1, 16, 64):
            kept = configs.prune_product(listed, {}, BC=block_c)
            kept_entries = [(c.kwargs, c.num_warps, c.num_stages, c.maxnreg) for c in kept]
            assert sorted(map(repr, kept_entries)) == sorted(map(repr, configs.product_space(tensor_cores, block_c)))


def test_check_product_refuses_other_devices_with_a_sentence() -> None:
    backend = backend_module.TritonBackend(UNTUNED)
    x = torch.zeros(3, 2, device="meta")
    problem = product_problem(_program("laplace_l1"), x, x, torch.zeros(3, 1, device="meta"), out=None, hypers={})
    reason = backend.check_product(problem)
    assert isinstance(reason, str) and "meta" in reason


# --- the generated kernels compile for the GPU ------------------------------------------------------


def _compile_jobs() -> dict[str, dict]:
    """The default tiles of both product kernels (C up to 16, and C = 64 on SIMT), float32 and a
    batched float64 variant with 64-bit indices; a log-sum-exp program (its combine of a chunk) in both;
    one column (`BC` = 1) on both kernels."""
    simt_meta, simt_warps, _, _ = configs.PRODUCT_SPACE[0]
    tc_meta, tc_warps, _, _ = configs.PRODUCT_TC_SPACE[0]
    column_meta, column_warps, _, _ = configs.PRODUCT_COLUMN_SPACE[0]
    tc_column_meta, tc_column_warps, _, _ = configs.PRODUCT_TC_COLUMN_SPACE[1]
    base = dict(regularized=True, spec={}, meta=simt_meta | {"BC": 16}, warps=simt_warps, arch=90, dtype="float32")
    tc = dict(
        spec={"kernel": "tensor_cores"},
        meta=tc_meta | {"BC": 16, "BK": 32, "X_RESIDENT": 0, "PRESPLIT": 0},
        warps=tc_warps,
    )
    batched = {"nbatch": 2, "tensor_hypers": ["bandwidth"], "int64": True}
    jobs = {
        "simt-laplace_l1-sm90": base | dict(preset="laplace_l1"),
        "simt-laplace_l1-c64-sm80": base | dict(preset="laplace_l1", meta=simt_meta | {"BC": 64}, arch=80),
        "tc-gaussian-sm80": base | tc | dict(preset="gaussian", arch=80),
        "tc-gaussian-sm90": base | tc | dict(preset="gaussian"),
        "simt-float64-batched-int64-sm90": base | dict(preset="laplace_l2", dtype="float64", spec=batched),
        "simt-logsumexp-sm90": base | dict(program=testing.SOFT_MIN.key()),
        "simt-logsumexp-float64-sm80": base | dict(program=testing.SOFT_MIN.key(), dtype="float64", arch=80),
        # one column (BC = 1): no dot, the pairwise tiles
        "simt-c1-laplace_l1-sm90": base | dict(preset="laplace_l1", meta=column_meta | {"BC": 1}, warps=column_warps),
        "simt-c1-float64-sm80": base
        | dict(preset="laplace_l2", meta=column_meta | {"BC": 1}, warps=column_warps, dtype="float64", arch=80),
        "tc-c1-gaussian-sm90": base
        | tc
        | dict(
            preset="gaussian",
            meta=tc_column_meta | {"BC": 1, "BK": 16, "X_RESIDENT": 0, "PRESPLIT": 0},
            warps=tc_column_warps,
        ),
        # D ≤ 32: x split once, in registers across the N tiles
        "tc-resident-gaussian-sm90": base
        | tc
        | dict(preset="gaussian", meta=tc_meta | {"BC": 16, "BK": 32, "X_RESIDENT": 1, "PRESPLIT": 0}),
        "tc-resident-c1-gaussian-sm80": base
        | tc
        | dict(
            preset="gaussian",
            meta=tc_column_meta | {"BC": 1, "BK": 32, "X_RESIDENT": 1, "PRESPLIT": 0},
            warps=tc_column_warps,
            arch=80,
        ),
        # D > 32 in float32: operands split once into workspaces, each space's tiles, one column and several
        **{
            f"tc-presplit-{meta['BM']}x{meta['BN']}-c{block_c}-sm{arch}": base
            | tc
            | dict(
                preset="gaussian",
                meta=meta | {"BC": block_c, "BK": configs.PRODUCT_TC_SPLIT_BK, "X_RESIDENT": 0, "PRESPLIT": 1},
                warps=warps,
                arch=arch,
            )
            for meta, warps, _, _ in configs.PRODUCT_TC_SPLIT_SPACE
            for block_c in (1, 16)
            for arch in (90,)
        },
    }
    return {key: job | {"id": key} for key, job in jobs.items()}


@pytest.fixture(scope="module")
def compile_reports() -> dict[str, str]:
    """`cuobjdump -res-usage` of every job, compiled in one clean process (tests/backend_triton/product_compile.py)."""
    pytest.importorskip("triton")
    return compile_in_clean_process(Path(__file__).with_name("product_compile.py"), list(_compile_jobs().values()))


@pytest.mark.parametrize("job", sorted(_compile_jobs()))
def test_product_kernels_compile_without_spills(job: str, compile_reports: dict[str, str]) -> None:
    """Each variant compiles to a cubin without a GPU; the default tiles do not spill (the tensor-core product from
    split workspaces with several columns of `v`, at 64 × 128 and 128 × 128: none in its innermost loop;
    docs/dev/triton-product-presplit.md)."""
    spilling_presplit = job in ("tc-presplit-64x128-c16-sm90", "tc-presplit-128x128-c16-sm90")
    assert_compiled(compile_reports[job], outside_hot_loops=spilling_presplit)


# --- real sizes on the GPU ------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [TritonTuning(), UNTUNED, SIMT], ids=["tuned", "untuned", "simt"])
@pytest.mark.parametrize(
    ("name", "d", "c"), [("gaussian", 3, 1), ("gaussian", 37, 16), ("laplace_l1", 32, 16), ("laplace_l2", 130, 70)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_real_sizes_on_the_gpu(tuning: TritonTuning, name: str, d: int, c: int, dtype: torch.dtype) -> None:
    x, z, v = _randn(3001, d, dtype=dtype), _randn(4099, d, dtype=dtype), _randn(4099, c, dtype=dtype)
    _check(_program(name, regularized=True), x, z, v, {"bandwidth": 3.0, "regularization": 1e-2}, tuning=tuning)


@pytest.mark.gpu
def test_gpu_batches_views_and_half_inputs() -> None:
    program = _program("gaussian", regularized=True)
    hypers = {"bandwidth": torch.tensor([2.0, 3.0], device="cuda"), "regularization": 0.1}
    x, z, v = _randn(2, 40, 1000).mT[..., :33], _randn(2, 1500, 33), _randn(1, 3, 1500).mT
    _check(program, x, z, v, hypers, offset_n=7)
    for dtype in (torch.float16, torch.bfloat16):
        _check(
            program, _randn(999, 20, dtype=dtype), _randn(1001, 20, dtype=dtype), _randn(1001, 5, dtype=dtype), hypers
        )


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [UNTUNED, SIMT], ids=["tensor_cores", "simt"])
def test_gpu_memory_stays_that_of_the_operands(tuning: TritonTuning) -> None:
    """M = 65,536 rows against N = 10⁶ (K would take 262 GB in float32): the product runs into a
    given `out` without allocating anything, and its first rows match the dense product.

    v ≥ 0, so the 10⁶-term sums of the (positive) Gaussian kernel do not cancel: with signed v each sum is
    about 10³ times smaller than the sum of its terms' magnitudes, and float32 accumulation of any order
    loses those digits against the float64 reference (signed v is checked at smaller N)."""
    program = _program("gaussian", regularized=True)
    hypers = {"bandwidth": 4.0, "regularization": 0.1}
    x, z, v = _randn(2**16, 32), _randn(10**6, 32), _randn(10**6, 1).abs()
    out = torch.empty(2**16, 1, device="cuda")
    _product(program, x, z, v, hypers, tuning=tuning, out=out)  # compiles and loads the variant
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    _product(program, x, z, v, hypers, tuning=tuning, out=out)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == before
    rows = 64
    k = kermac.run_program(program, x[:rows].double(), z.double(), hypers=hypers, backend="torch")
    assert_close(out[:rows], k @ v.double(), tolerance(torch.float32))
