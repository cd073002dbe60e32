"""NVRTC-specific GPU tests (``pytest -m gpu``): layouts, dtypes, tails, NaN semantics, user programs.

The shared suites (test_cdist, test_run_kernel, test_cdist_grad) cover the public operations on
every backend; these add what only a code-generating backend can get wrong: load-mode choice
(vectorised vs scalar), tile tails, half/bfloat16/float64 code paths, the polynomial pow split,
the fused sign-power of the gradient, more than 16 gradient outputs, and module loading on
several devices.  Every expected value comes from float64 (the reference backend on upcast
inputs, or the float64 helpers).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator

import pytest
import torch
from helpers import assert_close, nvrtc_tuning, randn, ref_cdist, ref_grad, require_backend, tolerance

import kermac
from kermac import ir, presets

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _nvrtc() -> None:
    require_backend("nvrtc", "cuda")
    require_backend("nvrtc", "cuda", op="grad")


def _reference_program(program, x, z, **kw) -> torch.Tensor:
    return kermac.run_program(program, x.double(), z.double(), backend="torch", **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [1.0, 1.3, 2.0, math.inf])
def test_cdist_dtypes(dtype: torch.dtype, p: float) -> None:
    x, z = randn(130, 37, dtype=dtype, device="cuda"), randn(131, 37, dtype=dtype, device="cuda")
    out = kermac.cdist(x, z, p=p, backend="nvrtc")
    assert out.dtype == dtype
    assert_close(out, ref_cdist(x, z, p), tolerance(dtype))


@pytest.mark.parametrize(("m", "n", "d"), [(1, 1, 1), (129, 257, 9), (128, 128, 8), (3, 300, 1031), (257, 5, 0)])
@pytest.mark.parametrize("p", [1.0, 1.7, 3.0])
def test_cdist_tails(m: int, n: int, d: int, p: float) -> None:
    x, z = randn(m, d, device="cuda"), randn(n, d, device="cuda")
    out = torch.full((m, n), math.nan, device="cuda")
    kermac.cdist(x, z, p=p, out=out, backend="nvrtc")
    assert_close(out, ref_cdist(x, z, p), tolerance(torch.float32))


@pytest.mark.parametrize("layout", ["k-vec", "p-vec", "p-scalar", "sliced", "misaligned", "broadcast-batch"])
def test_cdist_load_modes(layout: str) -> None:
    m, n, d = 96, 200, 64
    if layout == "k-vec":
        x, z = randn(m, d, device="cuda"), randn(n, d, device="cuda")
    elif layout == "p-vec":
        x, z = randn(d, m, device="cuda").T, randn(d, n, device="cuda").T
    elif layout == "p-scalar":
        x, z = randn(d, m + 1, device="cuda").T[:m], randn(d, n + 3, device="cuda").T[1:]
    elif layout == "sliced":
        x, z = randn(m, 2 * d, device="cuda")[:, ::2], randn(n, d + 1, device="cuda")[:, 1:]
    elif layout == "misaligned":
        x, z = randn(m * d + 1, device="cuda")[1:].view(m, d), randn(n * d + 2, device="cuda")[2:].view(n, d)
    else:
        x, z = (
            randn(3, 1, m, d, device="cuda"),
            randn(2, n, d, device="cuda").transpose(-1, -2).contiguous().transpose(-1, -2),
        )
    for p in (1.0, 1.5):
        assert_close(kermac.cdist(x, z, p=p, backend="nvrtc"), ref_cdist(x, z, p), tolerance(torch.float32))


def test_cdist_p2_near_duplicates() -> None:
    """Differences, not the matmul expansion: near-identical rows keep full relative accuracy."""
    x = randn(300, 512, device="cuda") * 100
    z = x + 1e-3 * randn(300, 512, device="cuda")
    out = kermac.cdist(x, z, p=2.0, backend="nvrtc")
    ref = ref_cdist(x, z, 2.0)
    assert ((out.diagonal().double().cpu() - ref.diagonal()).abs() / ref.diagonal()).max() < 1e-5
    assert_close(out, ref, tolerance(torch.float32))


#: The three float32 paths of p = 2 and the (x − z)² kernels: (tensor_cores, wgmma) of the tuning.
P2_PATHS = {"wgmma": (True, True), "mma-sync": (True, False), "simt": (False, False)}


def _p2_path(path: str):
    """A block in which ``backend="nvrtc"`` runs the p = 2 ``path`` (a context manager), at every D (the tensor-core
    paths below `tensor_core_min_d` too: their tails at D = 0, 1 and 9 stay tested)."""
    if path == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel runs on sm_90 only")
    tensor_cores, wgmma = P2_PATHS[path]
    return nvrtc_tuning(tensor_cores=tensor_cores, wgmma=wgmma, tensor_core_min_d=1)


@pytest.fixture(params=list(P2_PATHS))
def p2_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test on the wgmma (sm_90) and the mma.sync tensor-core kernels (3×TF32 + guard) and on
    the SIMT difference path for p = 2."""
    with _p2_path(request.param):
        yield request.param


def test_p2_path_selection(p2_path: str) -> None:
    """Each path of the fixture runs the kernel it names (sm_90 plans wgmma by default)."""
    from kermac.problem import pairwise_problem
    from kermac.registry import get_backend
    from kermac_backend_nvrtc import plan

    x = randn(40, 24, device="cuda")
    problem = pairwise_problem(presets.l2_distance.lower(), x, x, out=None, hypers={})
    from kermac_backend_nvrtc import variants

    variant = plan.plan_pairwise(problem, None, get_backend("nvrtc").tuning)[0]
    tensor_cores = isinstance(variant, variants.MmaPairwise | variants.WgmmaPairwise)
    assert (tensor_cores, isinstance(variant, variants.WgmmaPairwise)) == P2_PATHS[p2_path]


@pytest.mark.parametrize(
    ("m", "n", "d"),
    [(1, 1, 1), (129, 257, 9), (128, 128, 16), (3, 300, 1031), (257, 5, 0), (200, 190, 300), (65, 130, 8195)],
)
def test_p2_paths_tails(p2_path: str, m: int, n: int, d: int) -> None:
    x, z = randn(m, d, device="cuda"), randn(n, d, device="cuda")
    out = torch.full((m, n), math.nan, device="cuda")
    kermac.cdist(x, z, p=2.0, out=out, backend="nvrtc")
    assert_close(out, ref_cdist(x, z, 2.0), tolerance(torch.float32))


@pytest.mark.parametrize(
    "layout", ["k-vec", "p-vec", "p-scalar", "sliced", "misaligned", "broadcast-batch", "out-transposed"]
)
def test_p2_paths_layouts(p2_path: str, layout: str) -> None:
    m, n, d = 150, 133, 72
    out = None
    if layout in ("k-vec", "out-transposed"):
        x, z = randn(m, d, device="cuda"), randn(n, d, device="cuda")
        if layout == "out-transposed":
            out = torch.full((n, m), math.nan, device="cuda").T
    elif layout == "p-vec":
        x, z = randn(d, 152, device="cuda").T[:m], randn(d, 136, device="cuda").T[:n]
    elif layout == "p-scalar":
        x, z = randn(d, m + 1, device="cuda").T[:m], randn(d, n + 3, device="cuda").T[1:]
    elif layout == "sliced":
        x, z = randn(m, 2 * d, device="cuda")[:, ::2], randn(n, d + 1, device="cuda")[:, 1:]
    elif layout == "misaligned":
        x, z = randn(m * d + 1, device="cuda")[1:].view(m, d), randn(n * d + 2, device="cuda")[2:].view(n, d)
    else:
        x, z = randn(3, 1, m, d, device="cuda"), randn(2, n, d, device="cuda")
    got = kermac.cdist(x, z, p=2.0, out=out, backend="nvrtc")
    assert_close(got, ref_cdist(x, z, 2.0), tolerance(torch.float32))


@pytest.mark.parametrize("data", ["near-duplicates", "self", "offset", "zeros-and-nan"])
def test_p2_guard_keeps_entries_exact(p2_path: str, data: str) -> None:
    """Entries where the expansion cancels are recomputed from differences: per-entry 1e-5 relative."""
    m, d = 300, 256
    x = randn(m, d, device="cuda") * 10
    z = x + 1e-4 * randn(m, d, device="cuda")
    if data == "self":
        z = x
    elif data == "offset":
        x, z = randn(m, d, device="cuda") + 5.0, randn(m, d, device="cuda") + 5.0
    elif data == "zeros-and-nan":
        x[:7] = 0.0
        z[:5] = 0.0
        x[11, 3] = math.nan
    out = kermac.cdist(x, z, p=2.0, backend="nvrtc")
    ref = ref_cdist(x, z, 2.0)
    if data == "zeros-and-nan":
        assert torch.isnan(out[11]).all() and not torch.isnan(out[12:]).any()
        out, ref = out[12:], ref[12:]
    err = (out.double().cpu() - ref).abs()
    assert (err <= 1e-5 * ref).all(), f"worst relative entry {(err / ref.clamp_min(1e-300)).max():.2e}"


@pytest.fixture(
    params=[
        (0, False, False),
        (0, True, False),
        (44, True, False),
        (64, False, False),
        (28, True, True),
        (38, True, True),
        (64, True, True),
    ],
    ids=["mufu", "mufu-ftz", "split44", "split64", "table28", "table38", "table64"],
)
def split_pairs(request: pytest.FixtureRequest) -> Iterator[int]:
    """Fractional p on the MUFU only (denormal-exact or ftz), with ex2 split onto the FMA pipe, and
    with pairs from the power table (degree 5 for p <= 3, 6 up to 5; p = 7 takes the ex2 polynomial
    then)."""
    pairs, ftz, table = request.param
    counts = ("power_table_pairs", "power_table_pairs_high_p") if table else ("ex2_polynomial_pairs",)
    with nvrtc_tuning(power_table=table, flush_subnormals=ftz, **dict.fromkeys(counts, pairs)):
        yield pairs


@pytest.mark.parametrize("data", ["randn", "self", "subnormal", "large", "nan-inf"])
@pytest.mark.parametrize("p", [1.3, 2.7, 4.6, 7.0])
def test_fractional_p_split(split_pairs: int, data: str, p: float) -> None:
    """|x − z|^p split between MUFU and FMA-pipe ex2: float64 accuracy, exact zeros, and the
    tiles with inputs the polynomial cannot take (beyond 2^(125/p − 1), inf, NaN) on the MUFU."""
    m, n, d = 200, 190, 77  # tails in m, n and k (9 full k tiles and 5)
    x, z = randn(m, d, device="cuda"), randn(n, d, device="cuda")
    rows = torch.ones(m, dtype=torch.bool)
    if data == "self":
        z = x[:n].clone()
    elif data == "subnormal":  # coordinates where both sides are subnormal: flushed terms
        mask = torch.rand(d, device="cuda") < 0.3
        x[:, mask] *= 1e-39
        z[:, mask] *= 1e-39
    elif data == "large":  # one value beyond the polynomial's range, |v|^p still finite
        x[5, 40] = 1e29 if p < 2 else 3e5
        rows[5] = False
    elif data == "nan-inf":
        x[3, 20] = math.nan
        z[7, 60] = math.inf
        rows[3] = False
    # The plain (Σ|t|^p)^(1/p) program (cdist guards p > 3.96 in float32; a user program may not).
    plain = presets.lp_distance.lower()
    out = kermac.run_program(plain, x, z, hypers={"p": p}, backend="nvrtc").cpu()
    ref = ref_cdist(x, z, p)
    if data == "nan-inf":
        assert torch.isnan(out[3]).all()
        assert torch.isinf(out[4:, 7]).all() and torch.isinf(out[:3, 7]).all()
        cols = torch.arange(n) != 7
        out, ref = out[:, cols], ref[:, cols]
    elif data == "large":
        assert_close(out[5], ref[5], tolerance(torch.float32))
    assert_close(out[rows], ref[rows], tolerance(torch.float32))
    if data == "self":
        assert (out.diagonal() == 0).all()  # x = z: every term 0, the sum exactly 0 on every path


@pytest.mark.parametrize("path", ["wgmma", "mma-sync"])
def test_p2_tensor_cores_match_simt_on_kernels(path: str) -> None:
    x, z = randn(2, 260, 96, device="cuda"), randn(2, 270, 96, device="cuda")
    bw = torch.tensor([3.0, 5.0], device="cuda")
    got = {}
    for run in (path, "simt"):
        with _p2_path(run):
            got[run] = {
                name: kermac.run_kernel(name, x, z, bandwidth=bw, regularization=0.5, offset_n=3, backend="nvrtc")
                for name in ("gaussian", "laplace_l2", "matern52", "cauchy")
            }
    for name in got[path]:
        assert_close(got[path][name], got["simt"][name].double(), 2e-6)


@pytest.mark.parametrize(
    ("name", "d"), [("laplace_l1", 4), ("laplace_l1", 12), ("laplace_l1", 132), ("l1", 8), ("l1", 24)]
)
@pytest.mark.parametrize("transposed", [False, True])
def test_one_path_loop_matches_the_branching_one(name: str, d: int, transposed: bool) -> None:
    """Laplace-L1 (8-deep tiles) and cdist p = 1 (16-deep) with every k tile on the unrolled path, the
    partial one zero-padded, give the bits of the branching loop and the float64 values, with vectors
    along k or (transposed operands) along the rows."""
    from kermac.hyperparams import HyperValue
    from kermac.problem import pairwise_problem
    from kermac_backend_nvrtc import plan

    if transposed:
        x, z = randn(d, 136, device="cuda").T, randn(d, 72, device="cuda").T
    else:
        x, z = randn(136, d, device="cuda"), randn(72, d, device="cuda")
    bw = 0.5 * d
    program = presets.laplace_l1.lower() if name == "laplace_l1" else presets.l1_distance.lower()
    hypers = {"bandwidth": HyperValue("bandwidth", bw)} if name == "laplace_l1" else {}
    problem = pairwise_problem(program, x, z, out=None, hypers=hypers)

    def run(**tuning: bool) -> torch.Tensor:
        # k-contiguous tiles off: they take the aligned row-major cases otherwise.
        with nvrtc_tuning(k_contiguous_tiles=False, **tuning) as backend:
            assert plan.plan_pairwise(problem, None, backend.tuning)[0].padded_tail is backend.tuning.zero_padded_k_tail
            if name == "laplace_l1":
                return kermac.run_kernel("laplace_l1", x, z, bandwidth=bw, backend="nvrtc")
            return kermac.cdist(x, z, p=1.0, backend="nvrtc")

    one = run()
    branching = run(zero_padded_k_tail=False)
    assert torch.equal(one, branching)
    dist = ref_cdist(x, z, 1.0)
    assert_close(one, torch.exp(-dist / bw) if name == "laplace_l1" else dist, tolerance(torch.float32))


@pytest.mark.parametrize(
    ("m", "n", "d"), [(136, 72, 4), (136, 72, 12), (300, 257, 132), (1, 129, 16), (129, 1, 1028), (257, 300, 8)]
)
@pytest.mark.parametrize("layout", ["contiguous", "strided-rows", "unaligned-z", "batch-broadcast"])
def test_k_contiguous_loop_matches_the_one_path_one(m: int, n: int, d: int, layout: str) -> None:
    """The k-contiguous loop (z's pairs swapped in shared memory, rows past M and N clamped, k past D
    zero-filled) gives the bits of the one-path loop — both sum each output's terms in k order — and
    the float64 values, for cdist p = 1 and Laplace-L1 with a regularised diagonal, on tails in m, n
    and k, rows wider than D, z rows at any 4-byte offset and a batch against a broadcast z.  Every
    output element is written (NaN-poisoned outputs)."""
    from kermac.problem import pairwise_problem
    from kermac_backend_nvrtc import DEFAULT_TUNING, plan

    if layout == "strided-rows":  # row stride D + 4 (16-byte aligned rows), x and z views of wider tensors
        x, z = randn(m, d + 4, device="cuda")[:, :d], randn(n, d + 8, device="cuda")[:, 4 : 4 + d]
    elif layout == "unaligned-z":
        x, z = randn(m, d, device="cuda"), randn(n * d + 1, device="cuda")[1:].view(n, d)
    elif layout == "batch-broadcast":
        x, z = randn(3, m, d, device="cuda"), randn(1, n, d, device="cuda").expand(3, n, d)
    else:
        x, z = randn(m, d, device="cuda"), randn(n, d, device="cuda")
    l1 = pairwise_problem(presets.l1_distance.lower(), x, z, out=None, hypers={})
    assert type(plan.plan_pairwise(l1, None, DEFAULT_TUNING)[0]).__name__ == "KContiguousPairwise"
    bw = 0.25 * d

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        dist = torch.full((*x.shape[:-2], m, n), math.nan, device="cuda")
        kermac.cdist(x, z, p=1.0, out=dist, backend="nvrtc")
        kern = torch.full_like(dist, math.nan)
        kermac.run_kernel("laplace_l1", x, z, bandwidth=bw, regularization=0.5, out=kern, backend="nvrtc")
        return dist, kern

    dist, kern = run()
    with nvrtc_tuning(k_contiguous_tiles=False):
        one_path = run()
    assert torch.equal(dist, one_path[0]) and torch.equal(kern, one_path[1])
    ref = ref_cdist(x, z, 1.0)
    assert_close(dist, ref, tolerance(torch.float32))
    eye = torch.eye(m, n, dtype=torch.float64, device=ref.device)
    assert_close(kern, torch.exp(-ref / bw) + 0.5 * eye, tolerance(torch.float32))


def test_batched_p_and_bandwidth_tensors() -> None:
    x, z = randn(70, 33, device="cuda"), randn(90, 33, device="cuda")
    p = torch.tensor([0.6, 1.0, 1.5, 2.5], device="cuda")
    bw = torch.tensor([0.5, 1.0, 2.0, 4.0], device="cuda", dtype=torch.float64)
    out = kermac.run_kernel(kermac.presets.laplace_lp, x, z, p=p, bandwidth=bw, backend="nvrtc")
    ref = torch.stack([torch.exp(-ref_cdist(x, z, q) / s) for q, s in zip(p.tolist(), bw.tolist(), strict=True)])
    assert_close(out, ref, tolerance(torch.float32))


@pytest.mark.parametrize("offsets", [(0, 0), (5, 0), (0, 130), (-3, 7)])
def test_regularization_offsets(offsets: tuple[int, int]) -> None:
    x, z = randn(140, 20, device="cuda"), randn(150, 20, device="cuda")
    om, on = offsets
    out = kermac.run_kernel(
        kermac.presets.gaussian, x, z, bandwidth=1.5, regularization=0.25, offset_m=om, offset_n=on, backend="nvrtc"
    )
    ref = torch.exp(-ref_distance_sq(x, z) / (2 * 1.5**2))
    rows = torch.arange(140)[:, None] + om
    cols = torch.arange(150)[None, :] + on
    ref = ref + 0.25 * (rows == cols).double()
    assert_close(out, ref, tolerance(torch.float32))


def ref_distance_sq(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return ((x.double().cpu()[:, None, :] - z.double().cpu()[None, :, :]) ** 2).sum(-1)


def test_every_op_user_program_and_nan_propagation() -> None:
    x, z, acc, diag, h = ir.Var("x"), ir.Var("z"), ir.Var("acc"), ir.Var("diag"), ir.Hyper("h")
    inner = (
        ir.select(ir.lt(x, z), ir.minimum(x, z) * h, ir.maximum(x, z) / (1.0 + abs(z)))
        + ir.sign(x - z)
        + ir.le(x, 0.0)
        + ir.gt(z, 0.5)
        + ir.ge(x, z)
        + ir.eq(x, z)
        - ir.ne(x, 1.0)
        + ir.pow(abs(x), 1.5)
    )
    epi = ir.sqrt(abs(acc)) + ir.exp(-abs(acc)) + ir.log(1.0 + abs(acc)) + ir.select(diag, h, 0.0)
    xs, zs = randn(77, 19, device="cuda"), randn(66, 19, device="cuda")
    xs[3, 4] = math.nan
    for reduction in ("sum", "max", "min"):
        prog = kermac.PairwiseProgram(inner=inner, reduction=reduction, epilogue=epi)
        out = kermac.run_program(prog, xs, zs, hypers={"h": 0.5}, offset_m=2, backend="nvrtc")
        ref = _reference_program(prog, xs, zs, hypers={"h": 0.5}, offset_m=2)
        assert torch.isnan(out[3]).all() and not torch.isnan(out[4:]).any()
        mask = ~torch.isnan(ref)
        assert_close(out[mask], ref[mask].float(), 3e-5)


@pytest.mark.parametrize("h", [1.7, -2.5, 3e38, 3e-39, 1e-45, 0.0, -0.0, math.inf, -math.inf])  # NaN is refused
def test_division_by_a_hyperparameter_is_ieee(h: float) -> None:
    """acc / h (km_div_inv: h's reciprocal once per thread, then a product and a correction step)
    equals float32 IEEE division bit for bit, for special and extreme h and acc, except where the
    remainder underflows (|acc| < 2^-102) or the quotient is subnormal: within one ulp there."""
    x, z, acc = ir.Var("x"), ir.Var("z"), ir.Var("acc")
    prog = kermac.PairwiseProgram(inner=x - z, reduction="sum", epilogue=acc / ir.Hyper("h"))
    gen = torch.Generator().manual_seed(3)
    scale = torch.exp2(torch.randint(-149, 128, (300,), generator=gen).double())
    wide = (torch.rand(300, generator=gen) + 1) * scale * (torch.rand(300, generator=gen) - 0.5)
    special = torch.tensor([0.0, -0.0, 1.0, math.inf, -math.inf, math.nan, 1e-45, 3.4e38, -1e-40])
    xs = torch.cat([wide.float(), special]).cuda()[:, None]
    zs = torch.cat([special, torch.randn(40, generator=gen)]).cuda()[:, None]
    hs = torch.tensor(h, dtype=torch.float32)
    out = kermac.run_program(prog, xs, zs, hypers={"h": float(hs)}, backend="nvrtc").cpu()
    acc_ref = 0.0 + (xs.cpu() - zs.cpu().T)  # the kernel's sum: identity 0 plus the one term
    want = acc_ref / hs.expand_as(acc_ref)  # elementwise IEEE division on the CPU
    same = (out.view(torch.int32) == want.view(torch.int32)) | (out.isnan() & want.isnan())
    edge = (acc_ref.abs() < 2.0**-102) | (want.abs() < 2.0**-126)
    assert same[~edge].all(), (acc_ref[~same & ~edge][:4], out[~same & ~edge][:4])
    off = ~same
    ulp = torch.nextafter(want[off].abs(), torch.tensor(math.inf)) - want[off].abs()
    assert ((out[off].double() - want[off].double()).abs() <= ulp.double()).all()


@pytest.mark.parametrize("negate", [True, False])
@pytest.mark.parametrize("h", [1.7, -2.5, 3e38, 3e-39, 1e-45, 0.0, -0.0, math.inf, -math.inf])
def test_exp_of_a_hyperparameter_quotient(h: float, negate: bool) -> None:
    """exp(±acc / h) (km_exp_div: ex2 of acc·log2(e)/h, the factor once per thread) is within
    3 + 2·|acc/h| ulp of exp(acc/h) (subnormal results included), and exactly IEEE where the
    quotient or the result is 0, infinite or NaN."""
    x, z, acc = ir.Var("x"), ir.Var("z"), ir.Var("acc")
    quotient = acc / ir.Hyper("h")
    prog = kermac.PairwiseProgram(inner=x - z, reduction="sum", epilogue=ir.exp(-quotient if negate else quotient))
    gen = torch.Generator().manual_seed(5)
    target = torch.rand(400, generator=gen, dtype=torch.float64) * 185 - 100  # the results span float32
    scale = (h if math.isfinite(h) and h != 0 else 1.0) * (-1 if negate else 1)
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-45, 3.4e38])
    xs = torch.cat([(target * scale).float(), special]).cuda()[:, None]
    zs = torch.zeros(3, 1, device="cuda")
    out = kermac.run_program(prog, xs, zs, hypers={"h": h}, backend="nvrtc").cpu().double()
    q = xs.cpu().double().expand(-1, 3) / float(torch.tensor(h, dtype=torch.float32))  # acc = x − 0 = x
    want = torch.exp(-q if negate else q)
    want32 = want.float().double()
    exact = ~torch.isfinite(q) | ~torch.isfinite(want32)  # results 0, 1, inf or NaN from the special values
    same = (out == want32) | (out.isnan() & want32.isnan())
    assert same[exact].all(), (q[exact & ~same][:4], out[exact & ~same][:4])
    ulp = torch.nextafter(want32.abs().float(), torch.tensor(math.inf)).double() - want32.abs()
    err = (out - want).abs() / ulp  # subnormal results: ulp = 2^-149
    assert (err[~exact] <= 3 + 2 * q[~exact].abs()).all(), err[~exact].max()


def test_linf_skips_nan_and_max_propagates_it() -> None:
    """cdist's p = ∞ skips a NaN difference, as torch.cdist does; a max reduction of |x − z| in a
    user program (and cdist's large finite p) propagates it."""
    x, z = randn(40, 50, device="cuda"), randn(30, 50, device="cuda")
    z[7, 49] = math.nan
    out = kermac.cdist(x, z, p=math.inf, backend="nvrtc")
    torch.testing.assert_close(out, torch.cdist(x, z, p=math.inf), rtol=0, atol=0)
    assert not torch.isnan(out).any()
    program = kermac.PairwiseProgram(abs(ir.Var("x") - ir.Var("z")), "max", ir.Var("acc"))
    out = kermac.run_program(program, x, z, backend="nvrtc")
    assert torch.isnan(out[:, 7]).all() and not torch.isnan(out[:, :7]).any()


@pytest.fixture(params=["wgmma", "mma.sync", "simt"])
def grad_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a float32 gradient test on each kernel, for every O (also O = 1): ``wgmma`` (on sm_90 the
    bf16 sign product for p = 1, the mma.sync kernel for other programs), ``mma.sync`` (the 3×TF32
    kernel for every program) and ``simt``."""
    with nvrtc_tuning(
        tensor_cores=request.param != "simt",
        wgmma=request.param == "wgmma",
        tensor_core_grad_min_o=1,
        sign_product_min_o=1,
        sign_product_min_features=1,
    ):
        yield request.param


def _sign_product_device() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("p", [0.5, 1.0, 1.5, 1.7, 2.0, 3.0])
@pytest.mark.parametrize(
    ("k", "m", "n", "o"),
    [
        (70, 67, 45, 1),
        (70, 67, 45, 3),
        (301, 203, 37, 16),
        (70, 67, 45, 33),
        (1, 1, 1, 8),
        (4133, 65, 9, 12),
        (260, 131, 129, 16),  # K % 4 == 0: b's tiles copied 16 bytes at a time on the sign product
    ],
)
def test_grad(grad_path: str, p: float, k: int, m: int, n: int, o: int) -> None:
    a, b, c, d = (randn(*s, device="cuda") for s in ((k, m), (n, k), (o, k), (n, m)))
    b[0, :5] = d[0, :5]  # exact ties: the sgn(0) = 0 convention
    out = torch.full((o, n, m), math.nan, device="cuda")
    kermac.cdist_grad(a, b, c, d, p=p, out=out, backend="nvrtc")
    assert_close(out, ref_grad(a, b, c, d, p), 1e-4)


@pytest.mark.parametrize("layout", ["views", "sliced", "misaligned", "broadcast-batch", "out-transposed"])
def test_grad_paths_layouts(grad_path: str, layout: str) -> None:
    k, m, n, o = 77, 70, 19, 9
    out = None
    if layout == "views":
        a, b, c, d = (randn(*s, device="cuda").T for s in ((m, k), (k, n), (k, o), (m, n)))
    elif layout == "sliced":
        a, b = randn(k, 2 * m, device="cuda")[:, ::2], randn(n, k + 3, device="cuda")[:, 3:]
        c, d = randn(2 * o, k, device="cuda")[::2], randn(n, m + 1, device="cuda")[:, 1:]
    elif layout == "misaligned":
        a, b, c, d = (randn(x * y + 1, device="cuda")[1:].view(x, y) for x, y in ((k, m), (n, k), (o, k), (n, m)))
    elif layout == "broadcast-batch":
        a, b = randn(2, 1, k, m, device="cuda"), randn(n, k, device="cuda")
        c, d = randn(3, o, k, device="cuda"), randn(1, 1, n, m, device="cuda")
    else:
        a, b, c, d = (randn(*s, device="cuda") for s in ((k, m), (n, k), (o, k), (n, m)))
        out = torch.full((m, n, o), math.nan, device="cuda").permute(2, 1, 0)
    for p in (1.0, 1.5):
        got = kermac.cdist_grad(a, b, c, d, p=p, out=out, backend="nvrtc")
        assert_close(got, ref_grad(a, b, c, d, p), 1e-4)


@pytest.mark.parametrize("p", [1.0, 2.0, 1.5])
def test_grad_cancelling_terms(grad_path: str, p: float) -> None:
    """Mixed-sign c whose terms cancel in pairs to 1 % of their size (3×TF32 drops lo·lo products)."""
    k, m, n, o = 512, 130, 20, 16
    a, b, c, d = (randn(*s, device="cuda") for s in ((k, m), (n, k), (o, k), (n, m)))
    a[1::2], b[:, 1::2] = a[::2], b[:, ::2]
    c[:, 1::2] = -c[:, ::2] * (1 + 0.01 * randn(o, k // 2, device="cuda"))
    assert_close(kermac.cdist_grad(a, b, c, d, p=p, backend="nvrtc"), ref_grad(a, b, c, d, p), 3e-5)


@pytest.mark.parametrize("p", [1.0, 2.0])
def test_grad_long_k_accuracy(grad_path: str, p: float) -> None:
    """K = 8192: the tensor cores truncate their fp32 sums, a bias that grows with K (5.8e-5 here when
    the accumulators ran over all of k); the kernels add short partial sums with round-to-nearest."""
    k, m, n, o = 8192, 64, 8, 16
    a, b, c, d = (randn(*s, device="cuda") for s in ((k, m), (n, k), (o, k), (n, m)))
    assert_close(kermac.cdist_grad(a, b, c, d, p=p, backend="nvrtc"), ref_grad(a, b, c, d, p), 3e-6)


@pytest.mark.parametrize("p", [1.0, 2.0, 1.5])
def test_grad_nan_propagates(grad_path: str, p: float) -> None:
    k, m, n, o = 40, 37, 21, 10
    a, b, c, d = (randn(*s, device="cuda") for s in ((k, m), (n, k), (o, k), (n, m)))
    d[3, 5] = math.nan  # out[:, 3, 5]
    a[7, 11] = math.nan  # out[:, :, 11]
    b[17, 2] = d[17, 30]  # a tie (term 0) beside them
    out = kermac.cdist_grad(a, b, c, d, p=p, backend="nvrtc")
    nan = torch.zeros(o, n, m, dtype=torch.bool, device="cuda")
    nan[:, 3, 5] = True
    nan[:, :, 11] = True
    assert torch.equal(torch.isnan(out), nan)
    assert_close(out[~nan], ref_grad(a, b, c, d, p)[~nan.cpu()], 1e-4)


def test_grad_sign_special_values(grad_path: str) -> None:
    """p = 1 with non-finite b and d: a NaN in b[n, k] makes out[:, n, :] NaN, equal infinities in
    d[n, m] and b[n, k] make out[:, n, m] NaN (inf − inf), other infinities give finite signs."""
    k, m, n, o = 96, 37, 21, 10
    a, b, c, d = (randn(*s, device="cuda") for s in ((k, m), (n, k), (o, k), (n, m)))
    b[9, 4] = math.nan
    b[12, 6], d[12, 8] = math.inf, math.inf
    d[13, 2], b[14, 50] = -math.inf, math.inf
    b[17, 2] = d[17, 30]  # a tie beside them
    out = kermac.cdist_grad(a, b, c, d, p=1.0, backend="nvrtc")
    nan = torch.zeros(o, n, m, dtype=torch.bool, device="cuda")
    nan[:, 9, :] = True
    nan[:, 12, 8] = True
    assert torch.equal(torch.isnan(out), nan)
    assert_close(out[~nan], ref_grad(a, b, c, d, 1.0)[~nan.cpu()], 1e-4)


def _subnormal_differences() -> tuple[torch.Tensor, ...]:
    """(a, b, c, d) with b = 0 and d's columns 1e-39, -1e-39 (subnormal), 1e-30, 0, 2^-126, 1."""
    k, m, n, o = 40, 6, 3, 4
    a, c = randn(k, m, device="cuda"), randn(o, k, device="cuda")
    d = torch.tensor([[1e-39, -1e-39, 1e-30, 0.0, 2.0**-126, 1.0]] * n, device="cuda")
    return a, torch.zeros(n, k, device="cuda"), c, d


def test_grad_fractional_flushes_subnormal_differences(grad_path: str) -> None:
    """For a known p > 1, sgn(t)·|t|^(p−1) with |t| < 2^-126 is 0 in float32, as a tie (lg2/ex2 .ftz);
    larger differences are exact."""
    a, b, c, d = _subnormal_differences()
    got = kermac.cdist_grad(a, b, c, d, p=1.01, backend="nvrtc")
    expected = ref_grad(a, b, c, d, 1.01)
    expected[:, :, :2] = 0.0
    assert_close(got, expected, 1e-5)


def test_sign_product_flushes_subnormal_differences() -> None:
    """The bf16 sign product (sm_90) counts |d − b| < 2^-126 as a tie (0); the other kernels do not."""
    if not _sign_product_device():
        pytest.skip("the sign product runs on sm_90 only")
    from kermac.lowering import grad_program
    from kermac.problem import grad_problem
    from kermac_backend_nvrtc import plan

    a, b, c, d = _subnormal_differences()
    with nvrtc_tuning(sign_product_min_o=1, sign_product_min_features=1) as backend:
        got = kermac.cdist_grad(a, b, c, d, p=1.0, backend="nvrtc")
    expected = ref_grad(a, b, c, d, 1.0)
    expected[:, :, :2] = 0.0  # subnormal differences: ties
    assert_close(got, expected, 1e-6)
    problem = grad_problem(grad_program(1.0), a, b, c, d, out=None, hypers={})
    assert type(plan.plan_grad(problem, None, backend.tuning)[0]).__name__ == "SignGrad"


def test_grad_paths_agree_on_user_program() -> None:
    a, b, c, d = (randn(*s, device="cuda") for s in ((2, 90, 75), (40, 90), (2, 12, 90), (40, 75)))
    prog = kermac.GradProgram(
        ir.Hyper("alpha") * ir.exp(-abs(ir.Var("d") - ir.Var("b"))), ir.Var("acc") * ir.Hyper("s")
    )
    hypers = {"alpha": torch.tensor([0.5, 2.0], device="cuda"), "s": 3.0}
    got = {}
    for tc in (True, False):
        with nvrtc_tuning(tensor_cores=tc):
            got[tc] = kermac.run_grad_program(prog, a, b, c, d, hypers=hypers, backend="nvrtc")
    assert_close(got[True], got[False].double(), 2e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_grad_dtypes_and_views(dtype: torch.dtype) -> None:
    k, m, n, o = 40, 35, 33, 5
    a = randn(m, k, dtype=dtype, device="cuda").T
    b, c, d = (
        randn(n, k, dtype=dtype, device="cuda"),
        randn(o, k, dtype=dtype, device="cuda"),
        randn(n, m, dtype=dtype, device="cuda"),
    )
    out = kermac.cdist_grad(a, b, c, d, p=1.5, backend="nvrtc")
    assert_close(
        out, ref_grad(a, b, c, d, 1.5), {torch.float64: 1e-10, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]
    )


def test_grad_batched_p(grad_path: str) -> None:
    k, m, n, o = 50, 40, 20, 4
    a, b, c, d = (randn(*s, device="cuda") for s in ((k, m), (n, k), (o, k), (n, m)))
    ps = [0.8, 1.5, 2.0]
    out = kermac.cdist_grad(a, b, c, d, p=torch.tensor(ps, device="cuda"), backend="nvrtc")
    assert_close(out, torch.stack([ref_grad(a, b, c, d, q) for q in ps]), 1e-4)


def test_debug_logs_compile_and_launch(caplog: pytest.LogCaptureFixture) -> None:
    x = randn(10, 10, device="cuda")
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        kermac.cdist(x, x, p=1.25, backend="nvrtc", debug=True)
    text = caplog.text
    assert "launch grid" in text and "registers" in text


def test_repeated_calls_read_each_calls_tensors() -> None:
    """A call like an earlier one reuses its plan (the backend's memo) with the new call's addresses:
    fresh tensors, an in-place change, and a view one element off (another alignment, another plan)."""
    base = randn(2, 65, 40, device="cuda")
    z = randn(70, 40, device="cuda")
    for x in (base[0], base[1], base[0, 1:], base[1, :64]):
        for p in (1.0, 1.3, 2.0):
            out = torch.full((x.shape[0], 70), math.nan, device="cuda")
            kermac.cdist(x, z, p=p, out=out, backend="nvrtc")
            assert_close(out, ref_cdist(x, z, p), tolerance(torch.float32))
    x = base[0].clone()
    first = kermac.cdist(x, z, p=1.0, backend="nvrtc")
    x.mul_(2.0)
    second = kermac.cdist(x, z, p=1.0, backend="nvrtc")
    assert_close(first, ref_cdist(x / 2, z, 1.0), tolerance(torch.float32))
    assert_close(second, ref_cdist(x, z, 1.0), tolerance(torch.float32))


def test_launch_goes_to_the_current_stream_and_into_graphs() -> None:
    """Kernels go to torch's current stream: a side stream's CUDA graph captures them, and a replay
    reads the captured tensors' new contents."""
    x, z = randn(90, 33, device="cuda"), randn(70, 33, device="cuda")
    a, b, c, d = (randn(*s, device="cuda") for s in ((40, 30), (20, 40), (6, 40), (20, 30)))  # K=40 M=30 N=20 O=6
    out, gout = torch.empty(90, 70, device="cuda"), torch.empty(6, 20, 30, device="cuda")

    def calls() -> None:
        kermac.cdist(x, z, p=1.3, out=out, backend="nvrtc")
        kermac.cdist_grad(a, b, c, d, p=1.5, out=gout, backend="nvrtc")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls()  # compiles and loads outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    x.copy_(randn(90, 33, device="cuda"))
    d.copy_(randn(20, 30, device="cuda"))
    out.fill_(math.nan)
    gout.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, ref_cdist(x, z, 1.3), tolerance(torch.float32))
    assert_close(gout, ref_grad(a, b, c, d, 1.5), 1e-4)


def test_launch_from_a_thread_without_a_current_context() -> None:
    """A thread that never touched CUDA has no current context: the launch makes the device's
    primary context current for itself and leaves the thread as it found it."""
    import threading

    from kermac_backend_nvrtc import launcher

    x, z = randn(50, 20, device="cuda"), randn(60, 20, device="cuda")
    out = torch.full((50, 60), math.nan, device="cuda")  # no allocation on the thread (it would bind a context)
    kermac.cdist(x, z, p=1.0, backend="nvrtc")  # compiled and loaded on this thread
    torch.cuda.synchronize()
    seen: dict[str, object] = {}

    def work() -> None:
        try:
            seen["before"] = launcher._current_context()
            kermac.cdist(x, z, p=1.0, out=out, backend="nvrtc")
            seen["after"] = launcher._current_context()
        except Exception as exc:  # reported below, on the test's thread
            seen["error"] = exc

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert "error" not in seen, seen.get("error")
    assert seen["before"] == 0, "the new thread already had a current context: the test shows nothing"
    assert seen["after"] == 0
    torch.cuda.synchronize()
    assert_close(out, ref_cdist(x, z, 1.0), tolerance(torch.float32))


def test_a_failing_launch_names_the_kernel_and_the_driver_error() -> None:
    from kermac.problem import pairwise_problem
    from kermac.registry import get_backend
    from kermac_backend_nvrtc import launcher
    from kermac_backend_nvrtc.plan import plan_pairwise
    from kermac_backend_nvrtc.tuning import DEFAULT_TUNING

    x = randn(20, 8, device="cuda")
    problem = pairwise_problem(presets.l1_distance.lower(), x, x, out=None, hypers={})
    variant, launch = plan_pairwise(problem, None, DEFAULT_TUNING)
    kernel = get_backend("nvrtc")._kernel(0, variant, False)
    args = launch.args | {"zbase": 0}
    empty = launcher.PreparedLaunch(kernel, launch.block, [((0, 1, 1), args)])  # an empty grid
    with pytest.raises(RuntimeError, match=r"launching kermac_pairwise on cuda:0 failed: CUDA_ERROR_INVALID_VALUE"):
        empty.run(())
    launcher.PreparedLaunch(kernel, launch.block, [((launch.grid_x, 1, 1), args)]).run(())
    assert_close(problem.out, ref_cdist(x, x, 1.0), tolerance(torch.float32))


def test_auto_picks_nvrtc_for_the_p2_family_on_sm90(caplog: pytest.LogCaptureFixture) -> None:
    """Where the wgmma kernel runs, auto prefers NVRTC over Triton's tensor-core kernel."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel runs on sm_90 only")
    x, z = randn(64, 32, device="cuda"), randn(48, 32, device="cuda")
    with caplog.at_level(logging.DEBUG, logger="kermac"):
        out = kermac.cdist(x, z, p=2.0, debug=True)
        kermac.run_kernel("gaussian", x, z, bandwidth=1.5, debug=True)
    assert caplog.text.count("backend nvrtc") == 2, caplog.text
    assert_close(out, ref_cdist(x, z, 2.0), tolerance(torch.float32))


def _two_device_calls(dev: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(result, float64 reference) of one call of each kernel family on ``dev``: the SIMT pairwise
    kernel (p = 1: the k-contiguous loop), the split fractional-p kernel, the (x − z)² tensor-core
    kernel with an epilogue, and the gradient."""
    x, z = randn(150, 40, device=dev), randn(131, 40, device=dev)
    a, b, c, d = (randn(*s, device=dev) for s in ((40, 30), (20, 40), (6, 40), (20, 30)))  # K=40 M=30 N=20 O=6
    gauss = kermac.run_kernel("gaussian", x.double(), z.double(), bandwidth=3.0, backend="torch")
    return [
        (kermac.cdist(x, z, p=1.0, backend="nvrtc"), ref_cdist(x, z, 1.0)),
        (kermac.cdist(x, z, p=1.3, backend="nvrtc"), ref_cdist(x, z, 1.3)),
        (kermac.run_kernel("gaussian", x, z, bandwidth=3.0, backend="nvrtc"), gauss),
        (kermac.cdist_grad(a, b, c, d, p=1.5, backend="nvrtc"), ref_grad(a, b, c, d, 1.5)),
    ]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_devices() -> None:
    """Each device loads its own module of the same variants and runs them on its own current
    stream, whichever device is current; the plan memo (keyed by device) never sends a call to
    the other device's kernel."""
    for current in (0, 1, 0):
        with torch.cuda.device(current):
            for dev in ("cuda:0", "cuda:1"):
                for out, ref in _two_device_calls(dev):
                    assert out.device == torch.device(dev)
                    assert_close(out, ref, 1e-4)
    side = torch.cuda.Stream(device="cuda:1")
    with torch.cuda.device(0), torch.cuda.stream(side):
        x, z = randn(64, 24, device="cuda:1"), randn(48, 24, device="cuda:1")
        out = torch.full((64, 48), math.nan, device="cuda:1")
        kermac.cdist(x, z, p=1.0, out=out, backend="nvrtc")
    side.synchronize()  # the kernel ran on cuda:1's side stream, the current one there
    assert_close(out, ref_cdist(x, z, 1.0), tolerance(torch.float32))


def _capture(calls: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls`, captured on a side stream (as torch.cuda.graph does)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return graph


def test_a_warmed_up_call_replays_with_new_values() -> None:
    """Warm-up, capture, then new values copied into the captured inputs (a batch of bandwidths
    held in a device tensor among them): a replay computes the float64 torch.cdist of the new values."""
    x, z = randn(300, 40, device="cuda"), randn(200, 40, device="cuda")
    xb, zb = randn(2, 90, 33, device="cuda"), randn(70, 33, device="cuda")
    bandwidth = torch.tensor([1.5, 2.5], device="cuda")
    out, kout = torch.empty(300, 200, device="cuda"), torch.empty(2, 90, 70, device="cuda")

    def calls() -> None:
        kermac.cdist(x, z, p=1.0, out=out, backend="nvrtc")
        kermac.run_kernel("laplace_l2", xb, zb, bandwidth=bandwidth, out=kout, backend="nvrtc")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls()  # compiles and loads outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = _capture(calls)
    x.copy_(randn(300, 40, device="cuda"))
    xb.copy_(randn(2, 90, 33, device="cuda"))
    bandwidth.copy_(torch.tensor([0.75, 4.0], device="cuda"))
    out.fill_(math.nan)
    kout.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, torch.cdist(x.double(), z.double(), p=1.0), tolerance(torch.float32))
    expected = torch.exp(-torch.cdist(xb.double(), zb.double()) / bandwidth.double()[:, None, None])
    assert_close(kout, expected, tolerance(torch.float32))


def test_a_call_that_would_compile_under_capture_raises() -> None:
    """A fresh backend has nothing loaded: under capture its call raises the clear error (before
    any CUDA work); run once outside, the same call captures and replays."""
    from kermac.lowering import cdist_program
    from kermac.problem import pairwise_problem
    from kermac_backend_nvrtc import NvrtcBackend

    backend = NvrtcBackend()
    x, z = randn(50, 20, device="cuda"), randn(60, 20, device="cuda")
    out = torch.empty(50, 60, device="cuda")
    problem = pairwise_problem(cdist_program(1.0), x, z, out=out, hypers={})

    def calls() -> None:
        out.fill_(math.nan)
        backend.pairwise(problem)

    with pytest.raises(RuntimeError, match=r"kermac_pairwise kernel .* run the same call once before capturing"):
        _capture(calls)
    backend.pairwise(problem)  # the warm-up
    torch.cuda.synchronize()
    graph = _capture(calls)
    x.copy_(randn(50, 20, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, torch.cdist(x.double(), z.double(), p=1.0), tolerance(torch.float32))
