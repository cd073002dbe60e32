"""float16 and bfloat16 inputs on the Triton tensor-core kernels: x·zᵀ by one dot of the half operands.

`kermac_backend_triton.pairwise_tensor_cores.dot_half` forms x·zᵀ of half inputs with one `tl.dot` of the
operands in their own dtype and float32 accumulation (each product exact in float32), in the pairwise
tensor-core kernel and both branches of the product's tensor-core K tile; norms, guard and recompute are
those of float32 inputs.  Checked here:

- values against float64 references computed from the half inputs upcast (the reference sees the values
  the kernel sees), within the float32 tolerance plus the rounding of the half output: p = 2 distances,
  Gaussian and Laplace-L2, pairwise (the backend, `kermac.cdist`, `kermac.run_kernel`) and the fused product
  (`kermac.kernel_product`), sizes that are no tile multiple, near-duplicate rows and x = z rows with large
  norms (the guard's recompute), NaN and ±inf in the inputs, broadcast batches and views;
- `dot_half` under the CPU interpreter, whose own bfloat16 dot multiplies bit patterns;
- the kernels compiled for sm_80 and sm_90 in a clean process: one half dot where float32 takes three
  TF32 dots, and no spills beyond those of the float32 kernel of the same configuration.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cubin_jobs import SPILLS_BEFORE, assert_compiled, compile_in_clean_process, report_triton
from helpers import assert_close, device_under_test, skip_unless_triton_runs, tolerance

import kermac
from kermac import presets
from kermac.hyperparams import program_hypers
from kermac.problem import pairwise_problem, product_problem

backend_module = pytest.importorskip("kermac_backend_triton.backend")
launch = pytest.importorskip("kermac_backend_triton.launch")
configs = pytest.importorskip("kermac_backend_triton.configs")
TritonTuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning
tensor_cores = pytest.importorskip("kermac_backend_triton.pairwise_tensor_cores")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

HALF = [torch.float16, torch.bfloat16]
UNTUNED = TritonTuning(autotune=False)


@pytest.fixture(autouse=True)
def _needs_the_backend() -> None:
    skip_unless_triton_runs(device_under_test())


def _randn(*shape: int, dtype: torch.dtype, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=device_under_test())


def _half_tolerance(dtype: torch.dtype) -> float:
    """Relative error allowed on a half output: the float32 tolerance of the value computed in float32, plus
    the half output's rounding: half an ulp (relative), a whole one for bfloat16 under the interpreter, whose
    float32 → bfloat16 conversion truncates."""
    ulps = 1.0 if dtype == torch.bfloat16 and launch.interpreting() else 0.5
    return tolerance(torch.float32) + ulps * torch.finfo(dtype).eps


def _d2(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Σ_k (x − z)² in float64 from differences, on the CPU (batch dimensions broadcast)."""
    x, z = x.double().cpu(), z.double().cpu()
    return ((x[..., :, None, :] - z[..., None, :, :]) ** 2).sum(-1)


def _near_duplicates(m: int, d: int, dtype: torch.dtype, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x with large norms; z: x's first rows with one coordinate each one ulp away (d² about 2⁻¹⁶ of ‖x‖² in
    bfloat16, 2⁻²² in float16, far below what the expansion resolves), one exact copy, then unrelated rows."""
    x = _randn(m, d, dtype=dtype, scale=scale, seed=1) + scale
    near = x[: m // 2].clone()
    rows, cols = torch.arange(m // 2), torch.arange(m // 2) % d
    near[rows, cols] = torch.nextafter(near[rows, cols], torch.full_like(near[rows, cols], math.inf))
    z = torch.cat([near, _randn(m - m // 2 + 3, d, dtype=dtype, scale=scale, seed=3)])
    z[2] = x[2]
    return x, z


def _pairwise(name: str, x: torch.Tensor, z: torch.Tensor, hypers: dict) -> torch.Tensor:
    """The backend's pairwise output, after checking the problem takes the tensor-core kernel."""
    program = presets.ALL[name].lower()
    hv = program_hypers(program.hypers, hypers, x.device, False)
    problem = pairwise_problem(program, x, z, out=None, hypers=hv)
    backend = backend_module.TritonBackend(UNTUNED)
    assert launch.pairwise_spec(problem, backend.tuning)[0].kernel == "tensor_cores"
    backend.pairwise(problem)
    assert problem.out.dtype == x.dtype
    return problem.out


# --- pairwise ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("d", [20, 70])  # both tensor-core spaces, no multiple of the feature step
def test_distances_of_random_and_near_duplicate_rows(dtype: torch.dtype, d: int) -> None:
    """p = 2 distances entry by entry: random rows, near-duplicates and x = z (large norms: the one-dot
    expansion loses every bit there, so only the guard's recompute keeps the entries within tolerance)."""
    random = _randn(37, d, dtype=dtype, scale=3.0, seed=4), _randn(41, d, dtype=dtype, scale=3.0, seed=5)
    for x, z in (random, _near_duplicates(36, d, dtype, 300.0)):
        out = _pairwise("l2_distance", x, z, {}).double().cpu()
        ref = _d2(x, z).sqrt()
        assert ((out - ref).abs() <= _half_tolerance(dtype) * ref).all()
    assert out[2, 2] == 0.0


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("name", "bandwidth"), [("gaussian", 30.0), ("laplace_l2", 40.0)])
def test_kernels_against_the_half_inputs_upcast(dtype: torch.dtype, name: str, bandwidth: float) -> None:
    """Gaussian and Laplace-L2 on near-duplicate and unrelated rows of large norm, odd sizes."""
    x, z = _near_duplicates(30, 23, dtype, 10.0)
    out = _pairwise(name, x, z, {"bandwidth": bandwidth})
    d = _d2(x, z).sqrt()
    ref = torch.exp(-(d**2) / (2 * bandwidth**2)) if name == "gaussian" else torch.exp(-d / bandwidth)
    assert_close(out, ref, _half_tolerance(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_nan_and_inf_inputs(dtype: torch.dtype) -> None:
    """A NaN coordinate makes its row NaN, an infinite one its row infinite (the guard recomputes
    the tiles whose expansion is not finite); the other rows keep their values."""
    x, z = _randn(21, 18, dtype=dtype, seed=6), _randn(19, 18, dtype=dtype, seed=7)
    x[3, 5] = math.nan
    x[7, 0] = math.inf
    z[4, 17] = -math.inf
    out = _pairwise("l2_distance", x, z, {}).double().cpu()
    ref = _d2(x, z).sqrt()
    assert torch.equal(out.isnan(), ref.isnan()) and out[3].isnan().all()
    assert torch.equal(out.isinf(), ref.isinf()) and out[7, :4].isposinf().all() and out[:3, 4].isposinf().all()
    finite = ref.isfinite()
    assert ((out - ref).abs()[finite] <= _half_tolerance(dtype) * ref[finite]).all()


@pytest.mark.parametrize("dtype", HALF)
def test_cdist_and_run_kernel_with_batches_and_views(dtype: torch.dtype) -> None:
    """The public calls on broadcast batches, a transposed z and per-batch bandwidths, +λ on a shifted diagonal."""
    x = _randn(2, 1, 19, 33, dtype=dtype, scale=2.0, seed=8)
    z = _randn(3, 33, 21, dtype=dtype, scale=2.0, seed=9).transpose(-1, -2)  # [3, 21, 33], k-stride 21
    d = _d2(x, z).sqrt()
    out = kermac.cdist(x, z, p=2.0, backend="triton")
    assert out.dtype == dtype
    assert ((out.double().cpu() - d).abs() <= _half_tolerance(dtype) * d).all()
    sigma = torch.tensor([[9.0], [11.0], [13.0]], device=x.device)[None, :, :].expand(2, 3, 1)[..., 0]  # [2, 3]
    out = kermac.run_kernel(
        "gaussian", x, z, bandwidth=sigma, regularization=0.5, offset_m=2, offset_n=0, backend="triton"
    )
    ref = torch.exp(-(d**2) / (2 * sigma.cpu().double()[..., None, None] ** 2))
    ref += 0.5 * (torch.arange(19)[:, None] + 2 == torch.arange(21)[None, :]).double()
    assert out.dtype == dtype
    assert_close(out, ref, _half_tolerance(dtype))


# --- the fused product --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("d", [24, 40])  # x resident (D ≤ PRODUCT_TC_RESIDENT_D), x reloaded per N tile
@pytest.mark.parametrize("c", [1, 5])  # one column (no contraction dot), several
@pytest.mark.parametrize("name", ["gaussian", "laplace_l2"])
def test_product_against_the_half_inputs_upcast(dtype: torch.dtype, d: int, c: int, name: str) -> None:
    """`K(x, z) @ v` on tensor-core K tiles: near-duplicate and x = z rows of large norm (recomputed tiles)
    and unrelated ones, odd sizes, against K from differences in float64 times v."""
    x, z = _near_duplicates(22, d, dtype, 30.0)
    v = _randn(z.shape[0], c, dtype=dtype, seed=10)
    bandwidth = 50.0
    program = presets.ALL[name].lower()
    hv = program_hypers(program.hypers, {"bandwidth": bandwidth}, x.device, False)
    problem = product_problem(program, x, z, v, out=None, hypers=hv)
    assert launch.product_kernel(problem, UNTUNED) == "tensor_cores"
    assert (d <= configs.PRODUCT_TC_RESIDENT_D) == (d == 24)
    out = kermac.kernel_product(name, x, z, v, bandwidth=bandwidth, backend="triton")
    dist = _d2(x, z).sqrt()
    k = torch.exp(-(dist**2) / (2 * bandwidth**2)) if name == "gaussian" else torch.exp(-dist / bandwidth)
    assert out.dtype == dtype
    assert_close(out, k @ v.double().cpu(), _half_tolerance(dtype))


@pytest.mark.parametrize("dtype", HALF)
def test_product_with_batches_views_and_nan(dtype: torch.dtype) -> None:
    """Broadcast batches, a transposed x and v, per-batch bandwidths; a NaN in x makes its row of `out` NaN."""
    x = _randn(2, 30, 25, dtype=dtype, seed=11).mT[..., :20]  # [2, 25, 20], k-stride 25
    z, v = _randn(1, 33, 20, dtype=dtype, seed=12), _randn(2, 3, 33, dtype=dtype, seed=13).mT
    x[1, 4, 6] = math.nan
    sigma = torch.tensor([2.0, 3.0], device=x.device)
    out = kermac.kernel_product("gaussian", x, z, v, bandwidth=sigma, backend="triton").double().cpu()
    k = torch.exp(-_d2(x, z) / (2 * sigma.cpu().double()[:, None, None] ** 2))
    ref = k @ v.double().cpu()
    assert torch.equal(out.isnan(), ref.isnan()) and out[1, 4].isnan().all()
    keep = torch.ones(2, 25, dtype=torch.bool)
    keep[1, 4] = False
    assert_close(out[keep], ref[keep], _half_tolerance(dtype))


# --- real sizes on the GPU ----------------------------------------------------------------------------


def _cdist64(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Distances in float64 from differences, on x's device (for real sizes)."""
    return torch.cdist(x.double(), z.double(), compute_mode="donot_use_mm_for_euclid_dist")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("d", [37, 130])
@pytest.mark.parametrize("tuning", [UNTUNED, TritonTuning()], ids=["untuned", "tuned"])
def test_real_sizes_on_the_gpu(dtype: torch.dtype, d: int, tuning: TritonTuning) -> None:
    """p = 2 distances entry by entry at sizes that are no tile multiple, with near-duplicate and x = z rows of
    large norm among random ones; the Gaussian product of the same inputs."""
    x = _randn(3001, d, dtype=dtype, scale=30.0, seed=15) + 30.0
    z = _randn(4099, d, dtype=dtype, scale=30.0, seed=16) + 30.0
    z[:40] = x[:40]
    z[:20, 3] = torch.nextafter(z[:20, 3], torch.full_like(z[:20, 3], math.inf))
    program = presets.l2_distance.lower()
    problem = pairwise_problem(program, x, z, out=None, hypers={})
    backend = backend_module.TritonBackend(tuning)
    assert launch.pairwise_spec(problem, tuning)[0].kernel == "tensor_cores"
    backend.pairwise(problem)
    out, ref = problem.out.double(), _cdist64(x, z)
    assert ((out - ref).abs() <= _half_tolerance(dtype) * ref).all()
    assert (out[20:40, 20:40].diagonal() == 0).all()
    for c in (1, 16):
        v = _randn(4099, c, dtype=dtype, seed=17)
        got = kermac.kernel_product("gaussian", x, z, v, bandwidth=200.0, backend="triton")
        assert_close(got, torch.exp(-(ref**2) / (2 * 200.0**2)) @ v.double(), _half_tolerance(dtype))


# --- dot_half under the interpreter -------------------------------------------------------------------


@triton.jit
def _dot_half_kernel(X, Z, OUT):
    """`OUT = dot_half(x, zᵀ, 0)` for `[16, 16]` operands (`tl.dot`'s smallest)."""
    r = tl.arange(0, 16)
    x = tl.load(X + r[:, None] * 16 + r[None, :])
    z = tl.load(Z + r[:, None] * 16 + r[None, :])
    tl.store(OUT + r[:, None] * 16 + r[None, :], tensor_cores.dot_half(x, tl.trans(z), tl.zeros([16, 16], tl.float32)))


@triton.jit
def _dot_kernel(X, Z, OUT):
    """`OUT = tl.dot(x, zᵀ)` in float32 for `[16, 16]` operands."""
    r = tl.arange(0, 16)
    x = tl.load(X + r[:, None] * 16 + r[None, :])
    z = tl.load(Z + r[:, None] * 16 + r[None, :])
    tl.store(OUT + r[:, None] * 16 + r[None, :], tl.dot(x, tl.trans(z), out_dtype=tl.float32))


@pytest.mark.parametrize("dtype", HALF)
def test_dot_half_is_exact_per_product(dtype: torch.dtype) -> None:
    """Products of half values whose float32 sums are exact (integers below 2⁸ times powers of two): the dot's
    result equals the float64 one exactly.  Under the interpreter bfloat16 takes the float32 detour of `dot_half`."""
    g = torch.Generator().manual_seed(14)
    x = (torch.randint(-255, 256, (16, 16), generator=g) * 2.0**-6).to(dtype)
    z = (torch.randint(-255, 256, (16, 16), generator=g) * 2.0**-9).to(dtype)
    out = torch.empty(16, 16, device=device_under_test())
    _dot_half_kernel[(1,)](x.to(device_under_test()), z.to(device_under_test()), out)
    assert torch.equal(out.double().cpu(), x.double() @ z.double().T)


def test_the_interpreters_own_bfloat16_dot_is_still_wrong() -> None:
    """Why `dot_half` converts bfloat16 operands under the interpreter: its `tl.dot` multiplies their uint16 bit
    patterns (triton-lang/triton#11584).  Once this fails, Triton computes it right and the detour can go."""
    if not launch.interpreting():
        pytest.skip("the interpreter's dot")
    x = torch.ones(16, 16, dtype=torch.bfloat16)
    out = torch.empty(16, 16)
    _dot_kernel[(1,)](x, x, out)
    assert not torch.equal(out, torch.full((16, 16), 16.0))


# --- compiled for the GPU -----------------------------------------------------------------------------

DTYPES = ("float32", "float16", "bfloat16")
ELEMENT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def _compile_jobs() -> dict[str, dict]:
    """Pairwise: the defaults of both tensor-core spaces (capped at 128 registers, where ptxas spills by design)
    and the uncapped 64 × 64 tile.  Product: the tensor-core jobs of `test_product_triton.py` (default tiles,
    resident x or not, several columns or one).  Each in float32, float16 and bfloat16, for sm_80 and sm_90."""
    long, short = configs.PAIRWISE_TC_SPACE_LONG, configs.PAIRWISE_TC_SPACE_SHORT
    pairwise = [long[0], short[0], long[1]]
    tc_meta, tc_warps, _, _ = configs.PRODUCT_TC_SPACE[0]
    column_meta, column_warps, _, _ = configs.PRODUCT_TC_COLUMN_SPACE[1]
    product = {  # name: (meta, warps, arches)
        "bc16-resident0": (tc_meta | {"BC": 16, "BK": 32, "X_RESIDENT": 0, "PRESPLIT": 0}, tc_warps, (80, 90)),
        "bc1-resident0": (column_meta | {"BC": 1, "BK": 16, "X_RESIDENT": 0, "PRESPLIT": 0}, column_warps, (90,)),
        "bc16-resident1": (tc_meta | {"BC": 16, "BK": 32, "X_RESIDENT": 1, "PRESPLIT": 0}, tc_warps, (90,)),
        "bc1-resident1": (column_meta | {"BC": 1, "BK": 32, "X_RESIDENT": 1, "PRESPLIT": 0}, column_warps, (80,)),
    }
    base = dict(preset="gaussian", regularized=True)
    jobs = {}
    for dtype in DTYPES:
        for arch in (80, 90):
            for i, (meta, warps, stages, maxnreg) in enumerate(pairwise):
                jobs[f"pairwise{i}-{dtype}-sm{arch}"] = base | dict(
                    kernel="pairwise", dtype=dtype, meta=meta, warps=warps, stages=stages, maxnreg=maxnreg, arch=arch
                )
        for name, (meta, warps, arches) in product.items():
            for arch in arches:
                jobs[f"product-{name}-{dtype}-sm{arch}"] = base | dict(
                    kernel="product", spec={"kernel": "tensor_cores"}, dtype=dtype, meta=meta, warps=warps,
                    stages=3, maxnreg=None, arch=arch,
                )  # fmt: skip
    return {key: job | {"id": key} for key, job in jobs.items()}


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """Register report and dots of every job, compiled in one clean process
    (tests/backend_triton/tensor_core_compile.py)."""
    script = Path(__file__).with_name("tensor_core_compile.py")
    reports = compile_in_clean_process(script, list(_compile_jobs().values()))
    return {key: json.loads(report) if report.startswith("{") else {"error": report} for key, report in reports.items()}


def _stack(report: dict) -> int:
    assert "REG:" in report.get("res", ""), report
    return int(report["res"].split("STACK:")[1].split()[0])


@pytest.mark.parametrize("job", sorted(_compile_jobs()))
def test_one_half_dot_or_three_tf32_dots(job: str, compiled: dict[str, dict]) -> None:
    """Half kernels form x·zᵀ with one dot of half operands; float32 ones with three TF32 dots of float32
    operands.  The product's contraction with v adds three float32 dots where it has several columns, twice where
    x stays in registers (one contraction for a tile of K known to be finite, one for the recompute)."""
    spec = _compile_jobs()[job]
    element = ELEMENT[spec["dtype"]]
    contractions = 0
    if spec["kernel"] == "product" and spec["meta"]["BC"] > 1:
        contractions = 2 if spec["meta"]["X_RESIDENT"] else 1
    contraction = [["f32", "f32"]] * 3 * contractions
    expansion = [["f32", "f32"]] * 3 if element == "f32" else [[element, element]]
    assert compiled[job].get("dots") == expansion + contraction, compiled[job]


OLDER_PTXAS_CAPPED_SLACK = 32
"""Bytes a capped half tile may spill beyond its float32 twin when compiled by a Triton before `SPILLS_BEFORE`:
Triton 3.6 spills 120 bytes for the 128 × 128 half tile on sm_90 against float32's 96 (3.9: 136 against 240).  The
tile is float32's, measured fastest on the GPU; what the 24 bytes cost the half kernels there is to be timed with
Triton 3.6 (docs/dev/triton-version-floor.md)."""


@pytest.mark.parametrize("job", sorted(k for k in _compile_jobs() if "float32" not in k))
def test_half_kernels_spill_no_more_than_float32(job: str, compiled: dict[str, dict]) -> None:
    """No spills (with an older Triton, none in the innermost loops: `cubin_jobs.SPILLS_BEFORE`), but for the pairwise
    tiles capped at 128 registers, whose float32 kernels spill (outside the k loop) by design: there no more than
    float32 (with an older Triton, `OLDER_PTXAS_CAPPED_SLACK` more)."""
    twin = job.replace("bfloat16", "float32").replace("float16", "float32")
    if _compile_jobs()[job]["maxnreg"] is None:
        assert_compiled(compiled[job].get("res", str(compiled[job])))
        return
    slack = OLDER_PTXAS_CAPPED_SLACK if report_triton(compiled[job]["res"]) < SPILLS_BEFORE else 0
    assert _stack(compiled[job]) <= _stack(compiled[twin]) + slack, (compiled[job]["res"], compiled[twin]["res"])
