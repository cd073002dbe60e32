"""The fused kernel product `K(x, z) @ v` (`kermac.kernel_product`, `kermac.program_product`, the operation
`kermac::product`): values against an independent float64 dense reference (`run_kernel` / `run_program` in
float64 on the reference backend, then `torch.matmul`), for every preset and random user programs, odd and
empty sizes, views, broadcast batches, regularised diagonals with offsets, the transpose, NaN/inf in `v`,
half inputs, bad input, `torch.compile`, gradients; and the backend contract of the new operation
(refusing defaults, the registry's hook checks, cost tables)."""

from __future__ import annotations

import math
import textwrap
import warnings

import fuzz_programs
import pytest
import torch
from helpers import (
    BACKEND_DEVICES,
    PairwiseOnlyBackend,
    older_backend_source,
    plugin_beside_reference,
    require_backend,
)

import kermac
from kermac import presets
from kermac.costs import CostTable, CostTables, classify
from kermac.problem import pairwise_problem, product_problem
from kermac.programs import PairwiseProgram, swap_operands

F64 = torch.float64


def _dtype(backend: str) -> torch.dtype:
    """float64 on the reference backend; the GPU backends' float32 elsewhere."""
    return F64 if backend == "torch" else torch.float32


def _rtol(dtype: torch.dtype) -> float:
    return {F64: 1e-11, torch.float32: 2e-5}.get(dtype, 2e-2)


def _randn(*shape: int, dtype: torch.dtype = F64, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype=dtype, device=device)


def _hypers_for(name: str) -> dict:
    d = presets.ALL[name]
    return ({"p": 1.5} if d.needs_p else {}) | ({"bandwidth": 1.3} if d.needs_bandwidth else {})


def _f64(value: object) -> object:
    return value.double().cpu() if isinstance(value, torch.Tensor) else value


def _dense(kernel, x, z, **kw) -> torch.Tensor:
    """The float64 kernel matrix on the reference backend."""
    kw = {k: _f64(v) for k, v in kw.items()}
    return kermac.run_kernel(kernel, x.double().cpu(), z.double().cpu(), backend="torch", **kw)


def _check(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype and actual.shape == expected.shape
    finite = expected[torch.isfinite(expected)]
    scale = finite.abs().max().item() if finite.numel() else 1.0
    torch.testing.assert_close(
        actual.double().cpu(), expected, rtol=_rtol(dtype), atol=_rtol(dtype) * max(scale, 1.0), equal_nan=True
    )


# -- values -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("name", sorted(presets.ALL))
def test_every_preset_matches_the_dense_product(backend: str, device: str, name: str) -> None:
    """K @ v and Kᵀ @ u for every preset, with a broadcast batch, a batched bandwidth where it has one, a
    regularised shifted diagonal and odd sizes."""
    require_backend(backend, device, "product")
    dtype = _dtype(backend)
    x, z = _randn(2, 13, 5, dtype=dtype, device=device, seed=1), _randn(17, 5, dtype=dtype, device=device, seed=2)
    v, u = _randn(17, 3, dtype=dtype, device=device, seed=3), _randn(2, 13, 1, dtype=dtype, device=device, seed=4)
    kw = _hypers_for(name)
    if "bandwidth" in kw:
        kw["bandwidth"] = torch.tensor([0.9, 1.7], dtype=dtype, device=device)
    kw |= {"regularization": 0.25, "offset_m": 2, "offset_n": 5}
    k = _dense(name, x, z, **kw)
    _check(kermac.kernel_product(name, x, z, v, backend=backend, **kw), k @ v.double().cpu(), dtype)
    _check(kermac.kernel_product(name, x, z, u, transpose=True, backend=backend, **kw), k.mT @ u.double().cpu(), dtype)


def _fuzz_pairwise_cases(count: int) -> list:
    found, seed = [], 0
    while len(found) < count:
        case = fuzz_programs.generate(seed)
        if case.pairwise:
            found.append(seed)
        seed += 1
    return found


@pytest.mark.parametrize("seed", _fuzz_pairwise_cases(40))
def test_random_programs_match_the_dense_product(seed: int) -> None:
    """Random user programs of the differential fuzzer (any inner term, reduction and epilogue; NaN and
    infinities in K included), in float64 on the reference backend, K @ v and Kᵀ @ u."""
    case = fuzz_programs.generate(seed)
    x, z = case.operands["x"].double().cpu(), case.operands["z"].double().cpu()
    hypers = {k: _f64(v) for k, v in case.hypers.items()}
    m0, n0 = case.offsets
    k = kermac.run_program(case.program, x, z, hypers=hypers, offset_m=m0, offset_n=n0, backend="torch")
    c = 1 + seed % 3
    v = _randn(*k.shape[:-2], k.shape[-1], c, seed=seed)
    u = _randn(*k.shape[:-2], k.shape[-2], c, seed=seed + 1)
    got = kermac.program_product(case.program, x, z, v, offset_m=m0, offset_n=n0, backend="torch", **hypers)
    _check(got, k @ v, F64)
    got_t = kermac.program_product(
        case.program, x, z, u, transpose=True, offset_m=m0, offset_n=n0, backend="torch", **hypers
    )
    _check(got_t, k.mT @ u, F64)


@pytest.mark.parametrize("seed", _fuzz_pairwise_cases(25))
def test_swapped_program_is_the_transpose(seed: int) -> None:
    """`swap_operands(program)` on (z, x) is the transpose of `program` on (x, z), offsets exchanged."""
    case = fuzz_programs.generate(seed)
    x, z = case.operands["x"].double().cpu(), case.operands["z"].double().cpu()
    hypers = {k: _f64(v) for k, v in case.hypers.items()} or None
    m0, n0 = case.offsets
    k = kermac.run_program(case.program, x, z, hypers=hypers, offset_m=m0, offset_n=n0, backend="torch")
    swapped = swap_operands(case.program)
    kt = kermac.run_program(swapped, z, x, hypers=hypers, offset_m=n0, offset_n=m0, backend="torch")
    torch.testing.assert_close(kt, k.mT, rtol=0, atol=0, equal_nan=True)
    assert swap_operands(swapped) == case.program  # an involution


def test_swap_operands_refuses_other_values() -> None:
    with pytest.raises(TypeError, match=r"program: expected a kermac\.programs\.PairwiseProgram, got str"):
        swap_operands("gaussian")


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize(
    ("m", "n", "d", "c"),
    [(0, 5, 3, 2), (4, 0, 3, 2), (4, 5, 0, 2), (4, 5, 3, 0), (1, 1, 1, 1), (33, 1, 2, 1), (1, 40, 7, 5)],
)
def test_odd_and_empty_sizes(backend: str, device: str, m: int, n: int, d: int, c: int) -> None:
    """Every element of a NaN-poisoned `out` is written; N = 0 gives zeros (an empty sum)."""
    require_backend(backend, device, "product")
    dtype = _dtype(backend)
    x, z, v = (
        _randn(m, d, dtype=dtype, device=device, seed=1),
        _randn(n, d, dtype=dtype, device=device, seed=2),
        _randn(n, c, dtype=dtype, device=device, seed=3),
    )
    out = torch.full((m, c), math.nan, dtype=dtype, device=device)
    got = kermac.kernel_product("laplace_l1", x, z, v, bandwidth=0.8, regularization=0.5, out=out, backend=backend)
    assert got is out
    _check(out, _dense("laplace_l1", x, z, bandwidth=0.8, regularization=0.5) @ v.double().cpu(), dtype)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_views_and_out_views(backend: str, device: str) -> None:
    """Transposed and strided views of x, z, v and out are read and written where they are."""
    require_backend(backend, device, "product")
    dtype = _dtype(backend)
    x = _randn(6, 11, dtype=dtype, device=device, seed=1).mT  # [11, 6]
    z = _randn(2, 30, 6, dtype=dtype, device=device, seed=2)[:, ::3]  # [2, 10, 6], strided
    v = _randn(2, 4, 10, dtype=dtype, device=device, seed=3).mT  # [2, 10, 4]
    out = torch.full((2, 4, 11), math.nan, dtype=dtype, device=device).mT
    kermac.kernel_product("gaussian", x, z, v, bandwidth=1.1, out=out, backend=backend)
    _check(out, _dense("gaussian", x, z, bandwidth=1.1) @ v.double().cpu(), dtype)
    u = _randn(2, 3, 11, dtype=dtype, device=device, seed=4).mT
    out_t = torch.full((2, 3, 10), math.nan, dtype=dtype, device=device).mT
    kermac.kernel_product("gaussian", x, z, u, bandwidth=1.1, transpose=True, out=out_t, backend=backend)
    _check(out_t, _dense("gaussian", x, z, bandwidth=1.1).mT @ u.double().cpu(), dtype)


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize(("offset_m", "offset_n"), [(0, 0), (3, 0), (0, 4), (7, 2), (100, 0), (0, -3), (2**62, 2**62)])
def test_regularised_diagonal_with_offsets(backend: str, device: str, offset_m: int, offset_n: int) -> None:
    """`K + λI` on the shifted diagonal `m + offset_m == n + offset_n`, with one λ per batch entry."""
    require_backend(backend, device, "product")
    dtype = _dtype(backend)
    x, z, v = (
        _randn(3, 9, 4, dtype=dtype, device=device, seed=1),
        _randn(3, 12, 4, dtype=dtype, device=device, seed=2),
        _randn(12, 2, dtype=dtype, device=device),
    )
    lam = torch.tensor([0.5, 2.0, -1.0], dtype=dtype, device=device)
    kw = {"bandwidth": 1.5, "regularization": lam, "offset_m": offset_m, "offset_n": offset_n}
    k = _dense("laplace_l2", x, z, **kw)
    _check(kermac.kernel_product("laplace_l2", x, z, v, backend=backend, **kw), k @ v.double().cpu(), dtype)
    rows, cols = torch.arange(9)[:, None], torch.arange(12)[None, :]
    on_diag = (rows + offset_m == cols + offset_n).double()
    plain = _dense("laplace_l2", x, z, bandwidth=1.5)
    torch.testing.assert_close(k, plain + lam.double().cpu()[:, None, None] * on_diag)  # the reference's own diagonal


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
def test_nan_and_inf_in_v_propagate_as_in_the_dense_product(backend: str, device: str) -> None:
    require_backend(backend, device, "product")
    dtype = _dtype(backend)
    x, z = _randn(5, 3, dtype=dtype, device=device, seed=1), _randn(7, 3, dtype=dtype, device=device, seed=2)
    v = _randn(7, 3, dtype=dtype, device=device, seed=3)
    v[2, 0], v[4, 1], v[5, 1] = math.nan, math.inf, -math.inf
    v[1, 2] = math.inf
    got = kermac.kernel_product("gaussian", x, z, v, bandwidth=1.0, backend=backend)
    expected = _dense("gaussian", x, z, bandwidth=1.0) @ v.double().cpu()
    assert torch.isnan(got[:, 0]).all() and torch.isnan(got[:, 1]).all()  # NaN, and inf − inf
    assert torch.isposinf(got[:, 2]).all()
    _check(got, expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_accumulate_in_float32(dtype: torch.dtype) -> None:
    """Half inputs give a half output accumulated in float32: within the output's rounding of the exact
    product of the same half inputs, where a half accumulation over N = 3000 terms would be far off."""
    x, z = _randn(6, 4, dtype=dtype, seed=1), _randn(3000, 4, dtype=dtype, seed=2)
    v = _randn(3000, 2, dtype=dtype, seed=3).abs()
    got = kermac.kernel_product("laplace_l1", x, z, v, bandwidth=4.0, backend="torch")
    expected = _dense("laplace_l1", x, z, bandwidth=4.0) @ v.double().cpu()
    assert got.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got.double().cpu(), expected, rtol=2 * eps, atol=0)


def test_meta_tensors_give_meta_results() -> None:
    x, z, v = (torch.empty(s, device="meta") for s in ((4, 3), (2, 6, 3), (6, 5)))
    out = kermac.kernel_product("gaussian", x, z, v, bandwidth=1.0)
    assert out.is_meta and out.shape == (2, 4, 5)
    assert kermac.kernel_product("gaussian", x, z, out, bandwidth=1.0, transpose=True).shape == (2, 6, 5)


def test_blocks_cover_large_problems() -> None:
    """Sizes beyond one evaluation block of the reference backend (several blocks in M and N)."""
    x, z, v = _randn(700, 9, seed=1), _randn(1500, 9, seed=2), _randn(1500, 2, seed=3)
    got = kermac.kernel_product("matern32", x, z, v, bandwidth=2.0, regularization=0.1, offset_n=3, backend="torch")
    k = _dense("matern32", x, z, bandwidth=2.0, regularization=0.1, offset_n=3)
    _check(got, k @ v, F64)


# -- bad input ----------------------------------------------------------------------------------


def test_bad_input_is_named() -> None:
    x, z, v = _randn(4, 3), _randn(6, 3), _randn(6, 2)
    kp = kermac.kernel_product
    with pytest.raises(ValueError, match=r"v: expected size 6 in dimension -2 to match N \(z.shape\[-2\]\), got"):
        kp("gaussian", x, z, _randn(5, 2), bandwidth=1.0)
    with pytest.raises(TypeError, match=r"v: expected dtype torch.float64 \(the dtype of x\), got torch.float32"):
        kp("gaussian", x, z, v.float(), bandwidth=1.0)
    with pytest.raises(ValueError, match=r"v: expected a tensor on cpu \(the device of x\), got meta"):
        kp("gaussian", x, z, v.to("meta"), bandwidth=1.0)
    with pytest.raises(TypeError, match=r"v: expected a torch\.Tensor, got list"):
        kp("gaussian", x, z, [1.0], bandwidth=1.0)
    with pytest.raises(ValueError, match=r"out: expected shape \[4, 2\], got \[4, 3\]"):
        kp("gaussian", x, z, v, bandwidth=1.0, out=torch.empty(4, 3, dtype=F64))
    with pytest.raises(ValueError, match="out: shares memory with v"):
        kp("gaussian", x, z, v, bandwidth=1.0, out=v[:4])
    with pytest.raises(ValueError, match=r"v: expected size 4 in dimension -2 to match M \(x.shape\[-2\]; transpose"):
        kp("gaussian", x, z, v, bandwidth=1.0, transpose=True)
    with pytest.raises(ValueError, match=r"z: expected 3 features in the last dimension \(as x\), got shape \[6, 2\]"):
        kp("gaussian", x, _randn(6, 2), _randn(4, 2), bandwidth=1.0, transpose=True)
    with pytest.raises(TypeError, match="transpose: expected a bool, got int"):
        kp("gaussian", x, z, v, bandwidth=1.0, transpose=1)
    with pytest.raises(ValueError, match="kernel: expected a KernelDescriptor or a preset name"):
        kp("gausian", x, z, v, bandwidth=1.0)
    with pytest.raises(ValueError, match="bandwidth: required by descriptor"):
        kp("gaussian", x, z, v)
    with pytest.raises(ValueError, match="bandwidth: expected a finite number > 0"):
        kp("gaussian", x, z, v, bandwidth=-1.0)
    with pytest.raises(TypeError, match=r"program: expected a kermac\.programs\.PairwiseProgram, got str"):
        kermac.program_product("gaussian", x, z, v)
    program = presets.ALL["gaussian"].lower()
    with pytest.raises(ValueError, match=r"hypers: expected exactly the program's hyperparameters \['bandwidth'\]"):
        kermac.program_product(program, x, z, v)
    with pytest.raises(RuntimeError, match="kernel_product: out= is not supported when x, z or v requires grad"):
        kp("gaussian", x, z, v.clone().requires_grad_(), bandwidth=1.0, out=torch.empty(4, 2, dtype=F64))


# -- torch.compile --------------------------------------------------------------------------------


def test_compile_fullgraph_forward_and_backward() -> None:
    """One graph around kernel_product (both directions) and its backward, matching eager."""

    def f(x, z, v, bw):
        y = kermac.kernel_product("gaussian", x, z, v, bandwidth=bw, regularization=0.1, backend="torch")
        return kermac.kernel_product("gaussian", x, z, y, bandwidth=bw, transpose=True, backend="torch")

    x, z, v = _randn(9, 3, seed=1), _randn(11, 3, seed=2), _randn(11, 2, seed=3)
    bw = torch.tensor([1.2], dtype=F64)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    eager_in = [t.clone().requires_grad_() for t in (x, z, v)]
    compiled_in = [t.clone().requires_grad_() for t in (x, z, v)]
    expected, got = f(*eager_in, bw), compiled(*compiled_in, bw)
    torch.testing.assert_close(got, expected)
    expected.square().sum().backward()
    got.square().sum().backward()
    for a, b in zip(compiled_in, eager_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


# -- gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gaussian", "laplace_l2", "matern52", "cauchy", "l2_distance"])
def test_gradcheck_v_x_z_for_squared_difference_kernels(name: str) -> None:
    """gradcheck in float64 on the reference backend, K @ v and Kᵀ @ u, batched bandwidth and a shifted ridge."""
    backend = "torch"
    kw = _hypers_for(name) | {"regularization": 0.3, "offset_n": 1}
    if "bandwidth" in kw:
        kw["bandwidth"] = torch.tensor([0.9, 1.6], dtype=F64)
    x, z = _randn(2, 5, 3, seed=1).requires_grad_(), _randn(7, 3, seed=2).requires_grad_()
    v = _randn(7, 2, seed=3).requires_grad_()

    def f(x, z, v):
        return kermac.kernel_product(name, x, z, v, backend=backend, **kw)

    def f_t(x, z, u):
        return kermac.kernel_product(name, x, z, u, transpose=True, backend=backend, **kw)

    assert torch.autograd.gradcheck(f, (x, z, v))
    assert torch.autograd.gradcheck(f_t, (x, z, _randn(2, 5, 2, seed=4).requires_grad_()))


def test_second_derivatives_of_the_gaussian_product() -> None:
    x, z, v = (_randn(*s, seed=i).requires_grad_() for i, s in enumerate(((4, 2), (5, 2), (5, 2))))
    assert torch.autograd.gradgradcheck(
        lambda x, z, v: kermac.kernel_product("gaussian", x, z, v, bandwidth=1.3, backend="torch"), (x, z, v)
    )


def test_point_gradient_at_coincident_points_matches_the_dense_subgradient() -> None:
    """Laplace-L2 at x_m = z_n (acc = 0, where e' is infinite): the term is 0, as in the pairwise backward."""
    x = _randn(4, 3, seed=1)
    z = torch.cat([x[1:3], _randn(3, 3, seed=2)])
    v, g = _randn(5, 2, seed=3), _randn(4, 2, seed=4)
    leaves = [t.clone().requires_grad_() for t in (x, z)]
    kermac.kernel_product("laplace_l2", *leaves, v, bandwidth=0.7, backend="torch").mul(g).sum().backward()
    dense = [t.clone().requires_grad_() for t in (x, z)]
    (kermac.run_kernel("laplace_l2", *dense, bandwidth=0.7, backend="torch") @ v).mul(g).sum().backward()
    for a, b in zip(leaves, dense, strict=True):
        assert torch.isfinite(a.grad).all()
        torch.testing.assert_close(a.grad, b.grad)


def test_maxima_differentiate_in_v_x_and_z() -> None:
    """The l∞ distance (a maximum over features): gradcheck in v, x and z together (distinct features, so the
    maximum is differentiable)."""
    x, z, v = (_randn(*shape, seed=i).requires_grad_() for i, shape in enumerate([(4, 3), (5, 3), (5, 2)], 1))

    def f(x, z, v):
        return kermac.kernel_product("linf_distance", x, z, v, backend="torch")

    assert torch.autograd.gradcheck(f, (x, z, v))


# -- the backend contract -------------------------------------------------------------------------


def _problem() -> object:
    x = torch.zeros(3, 2)
    return product_problem(presets.ALL["gaussian"].lower(), x, x, torch.zeros(3, 1), out=None, hypers={})


def test_a_backend_without_product_methods_refuses_with_a_sentence() -> None:
    old = PairwiseOnlyBackend()
    assert old.check_product(_problem()) == "backend 'old' does not compute fused kernel products"
    with pytest.raises(NotImplementedError, match="backend 'old' does not compute fused kernel products"):
        old.product(_problem())


PLUGIN = (
    older_backend_source("Old", "old")
    + """

class Garbage(ReferenceBackend):
    name = "garbage"
    priority = 40

    def check_product(self, problem):
        return 1

    def product(self, problem):
        problem.out.fill_(123.0)


@hookimpl
def kermac_backends():
    return [Old(), Garbage()]
"""
)


@pytest.fixture
def old_plugins(tmp_path, monkeypatch):
    with plugin_beside_reference(tmp_path, monkeypatch, "kermac_product_test_plugin", textwrap.dedent(PLUGIN), "olds"):
        yield


def test_older_plugins_load_and_auto_passes_over_them_for_products(old_plugins) -> None:
    """A plugin without the product loads and keeps running pairwise calls; `auto` runs products on a
    backend that accepts them, reporting a check_product() that returns garbage as a plugin error."""
    rows = {s.name: s for s in kermac.backends()}
    assert rows["old"].available and not rows["old"].broken
    x, z, v = _randn(4, 3), _randn(5, 3), _randn(5, 2)
    torch.testing.assert_close(kermac.cdist(x, z, backend="old"), torch.cdist(x, z))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = kermac.kernel_product("gaussian", x, z, v, bandwidth=1.0)
    assert any("check_product() returned int, expected None or a str" in str(w.message) for w in caught)
    _check(got, _dense("gaussian", x, z, bandwidth=1.0) @ v, F64)
    with pytest.raises(
        kermac.UnsupportedProblemError,
        match=r"backend 'old' cannot run this kernel product problem: backend 'old' does not compute fused kernel "
        r"products. Backends that can run this kernel product problem: torch\.",
    ):
        kermac.kernel_product("gaussian", x, z, v, bandwidth=1.0, backend="old")


def test_cost_tables_leave_products_unranked(tmp_path) -> None:
    """A table measuring the pairwise class of the same program ranks pairwise problems only: a product is
    a different operation, which no table has measured."""
    x = torch.zeros(3, 20, dtype=F64)
    program = presets.ALL["gaussian"].lower()
    cls = classify(program, F64, (3, 3, 20))
    CostTable("cpu", "test", "test", {cls: {"torch": 1.0}}).write(tmp_path / "cpu.json")
    tables = CostTables(tmp_path)
    hv = {"bandwidth": kermac.hyperparams.HyperValue("bandwidth", 1.0)}
    assert tables.costs(pairwise_problem(program, x, x, out=None, hypers=hv)) == {"torch": 1.0}
    v = torch.zeros(3, 1, dtype=F64)
    assert tables.costs(product_problem(program, x, x, v, out=None, hypers=hv)) == {}


def test_program_product_of_a_user_program_runs_on_auto() -> None:
    program = PairwiseProgram(
        kermac.ir.pow(abs(kermac.ir.Var("x") - kermac.ir.Var("z")), 1.5), "sum", kermac.ir.Var("acc")
    )
    x, z, v = _randn(4, 3), _randn(6, 3), _randn(6, 2)
    k = kermac.run_program(program, x, z, backend="torch")
    _check(kermac.program_product(program, x, z, v), k @ v, F64)


def test_debug_logs_the_backend_and_sizes(caplog) -> None:
    x, z, v = _randn(4, 3), _randn(5, 3), _randn(5, 2)
    with caplog.at_level("DEBUG", logger="kermac"):
        kermac.kernel_product("gaussian", x, z, v, bandwidth=1.0, debug=True)
    assert "kernel_product: backend torch; batch [], M=4 N=5 D=3 C=2, torch.float64 on cpu" in caplog.text


def test_the_reference_product_evaluates_bounded_blocks(monkeypatch) -> None:
    """The documented workspace: with `CHUNK_ELEMENTS` = 256 every expression the reference backend evaluates
    for a 50 × 60 product (D = 4) has at most 256 elements, and the blocked product is the dense one."""
    from kermac.reference import backend as reference

    seen, original = [], reference.evaluate

    def spy(expr, env, *, like):
        value = original(expr, env, like=like)
        seen.append(value.numel())
        return value

    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 256)
    monkeypatch.setattr(reference, "evaluate", spy)
    x, z, v = _randn(50, 4, seed=1), _randn(60, 4, seed=2), _randn(60, 3, seed=3)
    got = kermac.kernel_product("gaussian", x, z, v, bandwidth=1.5, regularization=0.2, offset_m=7, backend="torch")
    assert len(seen) > 10 and max(seen) <= 256
    monkeypatch.undo()
    _check(got, _dense("gaussian", x, z, bandwidth=1.5, regularization=0.2, offset_m=7) @ v, F64)
