"""The NVRTC backend's fused kernel product `K(x, z) @ v` (`NvrtcBackend.check_product` / `product`).

Without a GPU: every kind of product variant (presets, user programs, every dtype, the column chunks,
load modes of v, views, broadcast batches, tensor hyperparameters, the shifted diagonal) compiles to a
cubin for sm_80 and sm_90; the plan (variant, grid, arguments) of odd shapes and batches; the
refusals; precompilation.  Problems are built on CPU or `meta` tensors (planning reads shapes,
strides and alignment only) and nothing loads a module (that needs a device).

On the GPU (`pytest -m gpu`): values against the float64 dense product (the reference backend's
kernel matrix in float64, then `torch.matmul`) for odd sizes, C = 1, 3, 16, 70, batches, views,
shifted diagonals, NaN and inf in v, half inputs and D = 0.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import require_backend, require_nvrtc_compiler

import kermac
from kermac import ir, presets, testing
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program
from kermac.problem import pairwise_problem, product_problem

pytest.importorskip("kermac_backend_nvrtc.source")
pytest.importorskip("cuda.core")
from kermac_backend_nvrtc import NvrtcBackend, compiler, launcher, plan, tiles, variants
from kermac_backend_nvrtc.source import kernel_file, kernel_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING

require_nvrtc_compiler(module_level=True)

ARCHS = ("sm_80", "sm_90")
F64 = torch.float64


def _t(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype=dtype, device=device)


def _hypers(**values: float | torch.Tensor) -> dict[str, HyperValue]:
    return {k: HyperValue(k, None, v) if isinstance(v, torch.Tensor) else HyperValue(k, v) for k, v in values.items()}


def _preset_hypers(name: str) -> dict[str, float]:
    d = presets.ALL[name]
    return ({"p": 1.5} if d.needs_p else {}) | ({"bandwidth": 1.3} if d.needs_bandwidth else {})


def _pr(program, x, z, v, *, out=None, offset_m=0, offset_n=0, **hypers):
    return product_problem(program, x, z, v, out=out, hypers=_hypers(**hypers), offset_m=offset_m, offset_n=offset_n)


def _user_program() -> kermac.PairwiseProgram:
    """A max-reduction with comparisons, a select, a hyperparameter and an expensive epilogue reading the diagonal."""
    x, z, acc, diag, h = ir.Var("x"), ir.Var("z"), ir.Var("acc"), ir.Var("diag"), ir.Hyper("h")
    inner = ir.select(ir.lt(x, z), ir.minimum(x, z) * h, abs(x - z)) + ir.sign(x - z)
    return kermac.PairwiseProgram(inner, "max", ir.exp(-abs(acc)) + ir.select(diag, h, 0.0))


def _cases() -> dict[str, object]:
    m, n, d = 37, 29, 13
    cases: dict[str, object] = {}
    for name in sorted(presets.ALL):
        cases[f"preset-{name}-c3"] = _pr(
            presets.ALL[name].lower(), _t(m, d), _t(n, d), _t(n, 3), **_preset_hypers(name)
        )
    gauss = presets.gaussian.lower(regularized=True)
    for c in (1, 2, 4, 8, 16, 70):  # every column chunk of float (16 at most) and several chunks
        cases[f"gaussian-c{c}"] = _pr(gauss, _t(m, d), _t(n, d), _t(n, c), bandwidth=1.0, regularization=0.1)
    for dtype in (F64, torch.float16, torch.bfloat16):
        tag = str(dtype).removeprefix("torch.")
        for c in (1, 16):  # float64: 8 columns at most
            cases[f"laplace_l1-{tag}-c{c}"] = _pr(
                presets.laplace_l1.lower(), _t(m, d, dtype=dtype), _t(n, d, dtype=dtype), _t(n, c, dtype=dtype),
                bandwidth=2.0,
            )  # fmt: skip
        cases[f"lp-{tag}"] = _pr(
            presets.laplace_lp.lower(), _t(m, d, dtype=dtype), _t(n, d, dtype=dtype), _t(n, 5, dtype=dtype),
            p=1.3, bandwidth=1.0,
        )  # fmt: skip
    cases["v-transposed"] = _pr(presets.laplace_l1.lower(), _t(m, 16), _t(64, 16), _t(8, 64).T, bandwidth=1.0)
    cases["views-sliced"] = _pr(
        presets.laplace_l2.lower(regularized=True), _t(2 * m, d + 3)[::2, 1 : d + 1], _t(d, n).T,
        _t(n, 9)[:, ::2], offset_m=3, bandwidth=1.0, regularization=0.5,
    )  # fmt: skip
    cases["batch-broadcast"] = _pr(
        presets.gaussian.lower(), _t(2, 1, m, d), _t(3, n, d), _t(1, 3, n, 4), bandwidth=torch.tensor([[1.0], [2.0]])
    )
    cases["user-max-program"] = _pr(_user_program(), _t(m, d), _t(n, d), _t(n, 3), h=0.5)
    cases["user-max-program-f64"] = _pr(
        _user_program(), _t(m, d, dtype=F64), _t(n, d, dtype=F64), _t(n, 3, dtype=F64), h=torch.tensor([0.5], dtype=F64)
    )
    cases["cdist-p-tensor"] = _pr(cdist_program(None), _t(3, m, d), _t(n, d), _t(n, 2), p=torch.tensor([0.5, 1.5, 3.0]))
    # Log-sum-exp (kermac.reductions): its combine in km_reduce, a batched tensor hyperparameter, float64.
    cases["soft-min-c3"] = _pr(testing.SOFT_MIN, _t(m, d), _t(n, d), _t(n, 3), gamma=0.5)
    cases["soft-min-f64-batched-gamma"] = _pr(
        testing.SOFT_MIN, _t(2, m, d, dtype=F64), _t(n, d, dtype=F64), _t(n, 5, dtype=F64),
        gamma=torch.tensor([0.5, 2.0], dtype=F64),
    )  # fmt: skip
    return cases


CASES = _cases()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERMAC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiler, "_memo", {})


def _plan(problem, **changes: object) -> tuple:
    return plan.plan_product(problem, None, dataclasses.replace(DEFAULT_TUNING, **changes))


# -- compiling ----------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_product_variant_compiles_to_cubin(case: str, arch: str) -> None:
    """Every product variant is one self-contained text that NVRTC builds; its parameters are the ones
    the plan fills and the launcher packs (every pointer among the per-call addresses)."""
    variant, launch = _plan(CASES[case])
    assert isinstance(variant, variants.SimtProduct) and variant.kernel == "kermac_product"
    source, params = kernel_source(variant)
    assert "#include" not in source and kernel_file("simt_mainloop.cuh") in source
    assert kernel_file("pairwise_epilogue.cuh") in source and "kermac_product(" in source
    names = [p.name for p in params]
    assert set(names) <= set(launch.args) | {"zbase"}, set(names) - set(launch.args)
    assert {p.name for p in params if p.ctype.endswith("*")} == set(plan.pointer_args(CASES[case]))
    layout = launcher.argument_layout(params, variant.compute)
    assert len(layout.unpack(bytes(layout.size))) == len(params)
    built = compiler.compile_cubin(source, arch, name=variant.kernel)
    assert built.cubin[:4] == b"\x7fELF" and "registers" in built.ptxas


def test_product_shares_the_pairwise_main_loop_and_functors() -> None:
    """The product's K tile is the SIMT pairwise kernel's: the same main loop text, inner term, reduction and
    epilogue as the pairwise variant of the same program (without the pairwise-only deep, padded and
    split forms)."""
    problem = CASES["user-max-program"]
    pairwise = pairwise_problem(problem.program, problem.x, problem.z, out=None, hypers=problem.hypers)
    pv = plan.plan_pairwise(pairwise, None, DEFAULT_TUNING)[0]
    source, pair_source = kernel_source(_plan(problem)[0])[0], kernel_source(pv)[0]
    for functor in ("km_inner(", "km_reduce(", "km_epilogue("):
        line = next(ln for ln in pair_source.splitlines() if f"km_t {functor}" in ln)
        assert line in source, functor
    assert kernel_file("simt_mainloop.cuh") in pair_source and kernel_file("simt_setup.cuh") in source
    for pairwise_only in ("#define KM_SPLIT_PAIRS 0", "#define KM_PADDED_TAIL 0", "#define KM_K_CONTIGUOUS 0"):
        assert pairwise_only in source


# -- planning -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "c", "cc", "chunks", "min_blocks"),
    [(torch.float32, 1, 1, 1, 2), (torch.float32, 3, 4, 1, 2), (torch.float32, 5, 8, 1, 1),
     (torch.float32, 16, 16, 1, 1), (torch.float32, 17, 16, 2, 1), (torch.float32, 70, 16, 5, 1),
     (F64, 1, 1, 1, 2), (F64, 16, 8, 2, 1), (F64, 70, 8, 9, 1), (torch.float16, 3, 4, 1, 2)],
)  # fmt: skip
def test_plan_column_chunks_and_grid(dtype: torch.dtype, c: int, cc: int, chunks: int, min_blocks: int) -> None:
    """A block takes the power of two >= C columns, at most 16 (float) or 8 (float64), and two blocks per SM
    up to 4 columns; the grid's x is row tiles times column chunks (M = 300: 3 tiles of 128, 5 of 64)."""
    m, n, d = 300, 77, 7
    problem = _pr(presets.laplace_l1.lower(), _t(m, d, dtype=dtype), _t(n, d, dtype=dtype), _t(n, c, dtype=dtype),
                  bandwidth=1.0)  # fmt: skip
    variant, launch = _plan(problem)
    tiles_m = -(-m // (64 if dtype == F64 else 128))
    assert variant.cc == cc and variant.dtype == str(dtype).removeprefix("torch.")
    assert launch.args["tiles_m"] == tiles_m and launch.grid_x == tiles_m * chunks and launch.grid_z_total == 1
    assert (launch.args["M"], launch.args["N"], launch.args["D"], launch.args["C"]) == (m, n, d, c)
    assert f"#define KM_MIN_BLOCKS {min_blocks}\n" in kernel_source(variant)[0]
    assert tiles.product_config(variant.compute, cc).min_blocks == min_blocks


def test_plan_strides_offsets_and_batches() -> None:
    """Strides of every operand, out's too; the diagonal as one shift; broadcast batch dimensions with stride 0
    (coalesced), tensor hyperparameters per batch entry."""
    m, n, d, c = 37, 29, 13, 5
    x = _t(d, 2, m).permute(1, 2, 0)  # [2, m, d], feature stride 2·m
    z = _t(n, d)
    v = _t(c, n).T  # unit stride along n
    out = torch.empty(2, c, m).transpose(-1, -2)  # [2, m, c] column-major rows
    bandwidth = torch.tensor([1.0, 2.0])  # one per batch entry
    problem = _pr(presets.gaussian.lower(regularized=True), x, z, v, out=out, offset_m=7, offset_n=3,
                  bandwidth=bandwidth, regularization=0.1)  # fmt: skip
    variant, launch = _plan(problem)
    a = launch.args
    assert (a["sxm"], a["sxk"], a["szn"], a["szk"]) == (1, 2 * m, d, 1)
    assert (a["svn"], a["svc"], a["som"], a["soc"]) == (1, n, 1, m)
    assert a["diag_shift"] == problem.offset_m - problem.offset_n == 4
    assert launch.grid_z_total == 2 and a["bs0"] == 2 and variant.batch_dims == 1
    assert (a["bx0"], a["bz0"], a["bv0"], a["bo0"]) == (x.stride(0), 0, 0, out.stride(0))
    assert a["bh_bandwidth0"] == 1 and variant.tensor_hypers == (("bandwidth", "float"),)
    assert a["hv_regularization"] == pytest.approx(0.1) and "hp_bandwidth" in a
    assert variant.v.mode == variants.LoadMode.SCALAR_P_FASTEST  # N = 29 is no multiple of the vector


def test_plan_load_modes_of_v() -> None:
    """v's tile (BN rows × cc columns) loads as vectors along C where rows are aligned with unit stride, along N
    for a transposed v, else as scalars."""
    x, z = _t(64, 8), _t(128, 8)
    lap = presets.laplace_l1.lower()

    def mode(v: torch.Tensor) -> variants.TileLoad:
        return _plan(_pr(lap, x, z, v, bandwidth=1.0))[0].v

    assert mode(_t(128, 16)) == variants.TileLoad(variants.LoadMode.VECTOR_ALONG_K, 8)
    assert mode(_t(16, 128).T) == variants.TileLoad(variants.LoadMode.VECTOR_ALONG_P, 8)
    assert mode(_t(128, 17)[:, 1:]).mode in (variants.LoadMode.SCALAR_K_FASTEST, variants.LoadMode.SCALAR_P_FASTEST)
    assert mode(_t(128, 1)) == variants.TileLoad(variants.LoadMode.SCALAR_K_FASTEST, 1)


def test_plan_splits_large_batches_into_launches() -> None:
    """More than 65535 batch entries take several launches (zbase), as the pairwise kernel's."""
    x = torch.empty(70000, 3, 4, device="meta")
    problem = _pr(presets.laplace_l1.lower(), x, torch.empty(5, 4, device="meta"), torch.empty(5, 2, device="meta"),
                  bandwidth=1.0)  # fmt: skip
    launch = _plan(problem)[1]
    assert launch.grid_z_total == 70000 and launch.chunks() == [(0, 65535), (65535, 70000 - 65535)]


def test_call_keys_of_products() -> None:
    """Equal products share a key; v's strides or shape, the offsets, or the pairwise
    problem of the same operands give another."""
    lap = presets.laplace_l1.lower()
    x, z, v, out = _t(37, 8), _t(29, 8), _t(29, 4), torch.empty(37, 4)
    key, addresses = plan.call_key(_pr(lap, x, z, v, out=out, bandwidth=1.0))
    assert addresses == (x.data_ptr(), z.data_ptr(), v.data_ptr(), out.data_ptr())
    assert plan.call_key(_pr(lap, x, z, v, out=out, bandwidth=1.0))[0] == key  # a new problem of the same call
    for other in (
        _pr(lap, x, z, _t(4, 29).T, out=out, bandwidth=1.0),
        _pr(lap, x, z, _t(29, 5), bandwidth=1.0),
        _pr(lap, x, z, v, out=out, offset_n=2, bandwidth=1.0),
        _pr(lap, x, z, v, out=out, bandwidth=2.0),
        pairwise_problem(lap, x, z, out=None, hypers=_hypers(bandwidth=1.0)),
    ):
        assert plan.call_key(other)[0] != key


# -- checks -------------------------------------------------------------------------------------


def test_check_product_refuses_tensors_off_cuda() -> None:
    """The backend computes fused products (no longer the contract's refusing default): off CUDA it names the
    device."""
    reason = NvrtcBackend().check_product(CASES["gaussian-c1"])
    assert reason is not None and "runs CUDA tensors only" in reason and "cpu" in reason


def test_size_product_refuses_sizes_beyond_the_kernel() -> None:
    """32-bit indices (M, N, D, C) and the grid's 2^31 − 1 blocks of row tiles times column chunks."""
    lap = presets.laplace_l1.lower()

    def meta(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, device="meta")

    assert plan.size_product(_pr(lap, meta(300, 4), meta(7, 4), meta(7, 70), bandwidth=1.0)) is None
    reason = plan.size_product(_pr(lap, meta(3, 1), meta(2**31, 1), meta(2**31, 1), bandwidth=1.0))
    assert reason is not None and "'N': 2147483648" in reason and "32-bit" in reason
    big = 2**30  # fits 32 bits; (2^30 / 128 row tiles) · (2^30 / 16 column chunks) blocks do not fit a grid
    reason = plan.size_product(_pr(lap, meta(big, 1), meta(2, 1), meta(2, big), bandwidth=1.0))
    assert reason is not None and "2^31 - 1" in reason and f"C={big}" in reason


def test_precompile_builds_product_variants() -> None:
    """`precompile` plans product problems with the product planner (problems on `meta` need `archs`)."""
    lap = presets.laplace_l1.lower()
    problem = _pr(lap, torch.empty(256, 16, device="meta"), torch.empty(256, 16, device="meta"),
                  torch.empty(256, 16, device="meta"), bandwidth=1.0)  # fmt: skip
    built = NvrtcBackend().precompile([problem], archs=["sm_80"])
    assert len(built) == 1 and built[0].startswith("kermac_product sm_80 ")


# -- values on the GPU --------------------------------------------------------------------------


def _dense_product(program, x, z, v, offsets=(0, 0), **hypers) -> torch.Tensor:
    """K @ v in float64 on the CPU: the reference backend's kernel matrix, then torch.matmul."""
    hypers = {k: h.double().cpu() if isinstance(h, torch.Tensor) else h for k, h in hypers.items()}
    k = kermac.run_program(program, x.double().cpu(), z.double().cpu(), hypers=hypers, offset_m=offsets[0],
                           offset_n=offsets[1], backend="torch")  # fmt: skip
    return k @ v.double().cpu()


def _assert_product(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Equal up to the accumulation type's rounding relative to the largest finite value; NaN and inf where
    the dense product has them."""
    assert actual.dtype == dtype and actual.shape == expected.shape
    finite = expected[torch.isfinite(expected)]
    scale = max(finite.abs().max().item(), 1.0) if finite.numel() else 1.0
    rtol = {F64: 1e-11, torch.float32: 2e-5}.get(dtype, 2e-2)
    torch.testing.assert_close(actual.double().cpu(), expected, rtol=rtol, atol=rtol * scale, equal_nan=True)


@pytest.fixture
def _gpu() -> None:
    require_backend("nvrtc", "cuda", "product")


@pytest.mark.gpu
@pytest.mark.usefixtures("_gpu")
@pytest.mark.parametrize("name", sorted(presets.ALL))
@pytest.mark.parametrize(("m", "n", "d", "c"), [(1, 1, 1, 1), (129, 257, 9, 3), (300, 130, 33, 70), (5, 600, 3, 16)])
def test_gpu_presets_match_the_dense_product(name: str, m: int, n: int, d: int, c: int) -> None:
    program = presets.ALL[name].lower()
    hy = _preset_hypers(name)
    x, z, v = _t(m, d, device="cuda", seed=1), _t(n, d, device="cuda", seed=2), _t(n, c, device="cuda", seed=3)
    out = torch.full((m, c), math.nan, device="cuda")  # every element is written
    kermac.program_product(program, x, z, v, out=out, backend="nvrtc", **hy)
    _assert_product(out, _dense_product(program, x, z, v, **hy), torch.float32)


@pytest.mark.gpu
@pytest.mark.usefixtures("_gpu")
@pytest.mark.parametrize("dtype", [F64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c", [1, 3, 16, 70])
def test_gpu_dtypes(dtype: torch.dtype, c: int) -> None:
    """float64 accumulates in float64, half inputs in float32 (the dense reference sees the rounded inputs)."""
    program = presets.laplace_l1.lower()
    x, z = _t(131, 19, dtype=dtype, device="cuda"), _t(203, 19, dtype=dtype, device="cuda", seed=1)
    v = _t(203, c, dtype=dtype, device="cuda", seed=2)
    out = kermac.program_product(program, x, z, v, backend="nvrtc", bandwidth=2.0)
    _assert_product(out, _dense_product(program, x, z, v, bandwidth=2.0), dtype)


@pytest.mark.gpu
@pytest.mark.usefixtures("_gpu")
def test_gpu_batches_views_offsets_and_tensor_hypers() -> None:
    """Broadcast batches, a batched bandwidth, transposed and sliced views, out with other strides, and the
    regularised diagonal shifted by offsets, in one call."""
    program = presets.gaussian.lower(regularized=True)
    x = _t(2, 1, 19, 150, device="cuda").transpose(-1, -2)  # [2, 1, 150, 19], unit stride along rows
    z = _t(3, 140, 40, device="cuda", seed=1)[..., 1:39:2]  # [3, 140, 19], feature stride 2
    v = _t(3, 5, 140, device="cuda", seed=2).transpose(-1, -2)  # [3, 140, 5]
    bandwidth = torch.tensor([[1.0], [2.5]], device="cuda")  # per entry of the first batch dimension
    out = torch.full((2, 3, 5, 150), math.nan, device="cuda").transpose(-1, -2)
    hy = {"bandwidth": bandwidth, "regularization": 0.7}
    kermac.program_product(program, x, z, v, out=out, offset_m=4, offset_n=1, backend="nvrtc", **hy)
    _assert_product(out, _dense_product(program, x, z, v, (4, 1), **hy), torch.float32)


@pytest.mark.gpu
@pytest.mark.usefixtures("_gpu")
def test_gpu_nan_and_inf_in_v_propagate() -> None:
    """NaN and ±inf in v reach exactly the outputs the dense product gives them; padding never adds any."""
    program = presets.laplace_l2.lower()
    x, z, v = _t(70, 6, device="cuda"), _t(133, 6, device="cuda", seed=1), _t(133, 3, device="cuda", seed=2)
    v[5, 0], v[132, 1], v[131, 2] = math.nan, math.inf, -math.inf
    out = kermac.program_product(program, x, z, v, backend="nvrtc", bandwidth=1.0)
    expected = _dense_product(program, x, z, v, bandwidth=1.0)
    assert out[:, 0].isnan().all() and out[:, 1].isposinf().all() and out[:, 2].isneginf().all()
    _assert_product(out, expected, torch.float32)


@pytest.mark.gpu
@pytest.mark.usefixtures("_gpu")
def test_gpu_infinite_kernel_entries_outside_n_do_not_poison() -> None:
    """A program whose K is infinite where x_m = z_n: for the zero row of x, K is finite at every real z
    (all >= 1) and infinite at z's zero padding past N, which must not reach the sum."""
    x, z = ir.Var("x"), ir.Var("z")
    program = kermac.PairwiseProgram(abs(x - z), "sum", 1.0 / ir.Var("acc"))
    xs = _t(9, 4, device="cuda").abs() + 1.0
    xs[0] = 0.0
    zs, v = _t(3, 4, device="cuda", seed=1).abs() + 1.0, _t(3, 2, device="cuda", seed=2)
    out = kermac.program_product(program, xs, zs, v, backend="nvrtc")
    assert torch.isfinite(out).all()
    _assert_product(out, _dense_product(program, xs, zs, v), torch.float32)


@pytest.mark.gpu
@pytest.mark.usefixtures("_gpu")
@pytest.mark.parametrize("c", [1, 16])
def test_gpu_no_features_and_user_programs(c: int) -> None:
    """D = 0 (K is the epilogue of the reduction's identity, with the diagonal) and a max-reduction user program
    with a batched hyperparameter."""
    program = _user_program()
    x, z, v = torch.empty(40, 0, device="cuda"), torch.empty(300, 0, device="cuda"), _t(300, c, device="cuda")
    out = kermac.program_product(program, x, z, v, backend="nvrtc", h=0.5, offset_n=7)
    _assert_product(out, _dense_product(program, x, z, v, (0, 7), h=0.5), torch.float32)
    x, z, v = _t(2, 65, 11, device="cuda"), _t(2, 190, 11, device="cuda", seed=1), _t(2, 190, c, device="cuda")
    h = torch.tensor([0.25, 2.0], device="cuda")
    out = kermac.program_product(program, x, z, v, backend="nvrtc", h=h)
    _assert_product(out, _dense_product(program, x, z, v, h=h), torch.float32)
