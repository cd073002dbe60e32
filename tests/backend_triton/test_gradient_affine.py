"""The Triton backend's gradient kernel of an affine factor (`kermac_backend_triton.gradient_affine`, the matrix
products of the p = 2 gradient) against the reference backend on float64 copies, with
`TritonTuning(grad_tensor_cores=True)`:

- which programs take it: p = 2 and the other factors `α·d + β·b` (also written in the general form) with the
  switch on; with it off (the default) today's product-form kernel; programs without an affine factor never;
- every tile configuration (the interpreter's and the GPU space's), K below, at and past whole steps, O = 1 and
  O > 1, odd M and N; factors without `b` or without `d`, and an epilogue with a hyperparameter;
- float64, float16 and bfloat16; sizes 0 and 1, K = 0 (whatever `d` holds); views, broadcast batches and a
  per-batch hyperparameter; 64-bit indices;
- NaN and ±inf: the output is non-finite exactly where the reference is;
- cancellation: near-duplicate rows (every `b[n,k]` within 10⁻⁶ of `d[n,m]`) and coordinates offset far from 0
  within the suite's gradient tolerance, as the product-form kernel;
- the kernel compiles to cubins for sm_80 and sm_90 without spills (in a clean process).

Real sizes on the GPU are the `gpu`-marked tests at the end.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from cubin_jobs import assert_compiled, compile_in_clean_process
from helpers import device_under_test, skip_unless_triton_runs

from kermac import ir
from kermac.hyperparams import HyperValue, program_hypers
from kermac.ir import Hyper, Var
from kermac.lowering import grad_program
from kermac.problem import GradProblem, grad_problem
from kermac.programs import GradProgram
from kermac.reference.backend import ReferenceBackend

backend_module = pytest.importorskip("kermac_backend_triton.backend")
launch = pytest.importorskip("kermac_backend_triton.launch")
configs = pytest.importorskip("kermac_backend_triton.configs")
generated = pytest.importorskip("kermac_backend_triton.generated")
TritonTuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning

ON = TritonTuning(autotune=False, grad_tensor_cores=True)
OFF = TritonTuning(autotune=False)
F64 = torch.float64
GRAD_TOL = 1e-4  # the suite's bound on float32 gradients (tests/test_cdist_grad.py), ‖error‖ / ‖reference‖
A, B, C, D, TERM, ACC = (Var(n) for n in ("a", "b", "c", "d", "term", "acc"))
P2 = grad_program(2.0)


@pytest.fixture(autouse=True)
def _needs_a_runnable_backend() -> None:
    skip_unless_triton_runs(device_under_test())


def _operands(k: int, m: int, n: int, o: int, seed: int, batch: tuple[int, ...] = ()) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = ((*batch, k, m), (*batch, n, k), (*batch, o, k), (*batch, n, m))
    return [torch.randn(s, generator=gen, dtype=F64) for s in shapes]


def _hypers(program: GradProgram, hypers: dict, device: str) -> dict[str, HyperValue]:
    return program_hypers(program.hypers, hypers, torch.device(device), False)


def _triton(program, a, b, c, d, hypers=None, *, tuning=ON, meta=None) -> torch.Tensor:
    """The backend's `grad` (or the launcher with the tile configuration `meta` forced) on `a`, `b`, `c`, `d`."""
    dev = device_under_test()
    hypers = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in (hypers or {}).items()}
    problem = grad_problem(program, *(t.to(dev) for t in (a, b, c, d)), out=None, hypers=_hypers(program, hypers, dev))
    problem.out.fill_(math.nan)  # every output is written
    if meta is not None:
        launch.run_grad(problem, meta, tuning=tuning)
        return problem.out
    backend = backend_module.TritonBackend(tuning)
    assert backend.check_grad(problem) is None
    getattr(backend, problem.hooks[1])(problem)
    return problem.out


def _reference(program, a, b, c, d, hypers=None) -> torch.Tensor:
    """The reference backend's values on float64 copies of the (rounded) operands."""
    hypers = {k: v.double().cpu() if isinstance(v, torch.Tensor) else v for k, v in (hypers or {}).items()}
    operands = (t.double().cpu() for t in (a, b, c, d))
    problem = grad_problem(program, *operands, out=None, hypers=_hypers(program, hypers, "cpu"))
    ReferenceBackend().grad(problem)
    return problem.out


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN where `out` has a NaN the reference lacks)."""
    out = out.double().cpu()
    if out.isnan().any() and not ref.isnan().any():
        return math.nan
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    assert out.shape == ref.shape, what
    error = _error(out, ref)
    assert error <= tol, f"{what}: relative error {error:.3g} > {tol}"


def _kernels(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernels of the specs compiled from now on: the launcher's caches start empty, so each call's first
    launch compiles its spec."""
    kernels: list[str] = []
    monkeypatch.setattr(launch, "_families", {})
    monkeypatch.setattr(launch, "_kernels", {})
    real = launch._kernel
    monkeypatch.setattr(launch, "_kernel", lambda spec, *args: kernels.append(spec.kernel) or real(spec, *args))
    return kernels


def _tol(dtype: torch.dtype) -> float:
    return 1e-12 if dtype == F64 else 2e-6


# --- which programs take the kernel --------------------------------------------------------------------------


AFFINE_PROGRAMS = {
    "p2": (P2, {}),
    "general-form": (GradProgram(A * (D - B), ACC, C * TERM), {}),
    "scaled-epilogue": (GradProgram((B - D) / 4.0, Hyper("scale") * ir.exp(ACC / 8.0)), {"scale": 0.5}),
    "without-b": (GradProgram(2.0 * D, ACC), {}),
    "without-d": (GradProgram(-B, ACC), {}),
    "sum": (GradProgram(D + 3.0 * B, ACC), {}),
}


@pytest.mark.parametrize("name", sorted(AFFINE_PROGRAMS))
def test_affine_programs_take_the_kernel_with_the_switch_on(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    program, hypers = AFFINE_PROGRAMS[name]
    kernels = _kernels(monkeypatch)
    a, b, c, d = _operands(5, 4, 3, 2, seed=1)
    _triton(program, a, b, c, d, hypers, tuning=ON)
    _triton(program, a, b, c, d, hypers, tuning=OFF)
    assert kernels == ["grad_affine", "grad"]
    assert generated.grad_kernel(program, tensor_cores=True) == "grad_affine"
    assert generated.grad_kernel(program) == "grad"


def test_the_switch_is_off_by_default() -> None:
    assert not TritonTuning().grad_tensor_cores
    problem = grad_problem(P2, *_operands(5, 4, 3, 2, seed=1), out=None, hypers={})
    assert launch.grad_spec(problem)[0].kernel == "grad"
    assert launch.grad_spec(problem, ON)[0].kernel == "grad_affine"


@pytest.mark.parametrize(
    "program",
    [grad_program(1.0), grad_program(1.5), GradProgram(Hyper("alpha") * (D - B), ACC), GradProgram(D - D, ACC)],
    ids=["p1", "p1.5", "hyper-coefficient", "d-minus-d"],
)
def test_other_programs_never_take_it(program: GradProgram, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = _kernels(monkeypatch)
    a, b, c, d = _operands(5, 4, 3, 2, seed=2)
    hypers = {name: 1.5 for name in program.hypers}
    _close(_triton(program, a, b, c, d, hypers, tuning=ON), _reference(program, a, b, c, d, hypers), 2e-6, "values")
    assert kernels == ["grad"]
    with pytest.raises(ValueError, match="tensor_cores: the tensor-core gradient kernel needs a product factor"):
        generated.GradSpec(program, "float32", 0, frozenset(), False, tensor_cores=True)


def test_the_grid_size_check_counts_the_tiles_of_the_chosen_kernel() -> None:
    """One row of `o` per program: 64 rows of 2¹⁴ batch entries of 4096² outputs need 2³¹ programs of the largest
    tiles, past CUDA's limit, where the product-form kernel (its 64 rows in one program) needs 2³⁰ (stride-0
    operands: no memory behind the sizes)."""
    batch, m, n, o = 2**14, 2**12, 2**12, 64
    one = torch.zeros(1, 1)
    a, b, c, d = one.expand(batch, 1, m), one.expand(batch, n, 1), one.expand(batch, o, 1), one.expand(batch, n, m)
    problem = GradProblem(P2, a, b, c, d, one, {}, (batch,))
    assert launch.grid_size_problem(problem) is None
    assert launch.grid_size_problem(problem, OFF) is None
    assert "more than CUDA's limit" in launch.grid_size_problem(problem, ON)
    assert launch.grid_size_problem(GradProblem(P2, a, b, c[:, :16], d, one, {}, (batch,)), ON) is None
    # the backend's check asks for its own tuning's kernel
    assert backend_module.TritonBackend(OFF).check_grad(problem) is None
    assert "more than CUDA's limit" in backend_module.TritonBackend(ON).check_grad(problem)


# --- values ----------------------------------------------------------------------------------------------------


def _metas(dtype: torch.dtype) -> list[dict]:
    space = configs.grad_affine_space(launch.compute_type(dtype))
    if launch.interpreting():
        return [dict(configs.INTERPRET_GRAD_AFFINE)] + [dict(meta) for meta, *_ in space]
    return [configs.launch_options(entry) for entry in space]


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
def test_every_configuration(dtype: torch.dtype) -> None:
    """Each tile configuration forced: K below, at and past whole steps of `BK` (5, 32, 45), O = 1 and 3, odd M
    and N (clamped rows, masked stores), every output written."""
    for k, o in ((5, 3), (32, 1), (45, 2)):
        a, b, c, d = (t.to(dtype) for t in _operands(k, 37, 19, o, seed=k))
        ref = _reference(P2, a, b, c, d)
        for meta in _metas(dtype):
            out = _triton(P2, a, b, c, d, meta=meta | {"BO": 1})
            _close(out, ref, _tol(dtype), f"K={k} O={o} {meta}")


@pytest.mark.parametrize("name", sorted(AFFINE_PROGRAMS))
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
def test_affine_programs(name: str, dtype: torch.dtype) -> None:
    """Factors with both variables, without `b` (no matrix product) or without `d`, a hyperparameter in the epilogue."""
    program, hypers = AFFINE_PROGRAMS[name]
    a, b, c, d = (t.to(dtype) for t in _operands(21, 19, 17, 3, seed=3))
    _close(_triton(program, a, b, c, d, hypers), _reference(program, a, b, c, d, hypers), _tol(dtype), name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_inputs_compute_in_float32(dtype: torch.dtype) -> None:
    """Half inputs give a half output computed in float32 from the rounded inputs, rounded once."""
    a, b, c, d = (t.to(dtype) for t in _operands(21, 13, 11, 3, seed=5))
    out = _triton(P2, a, b, c, d)
    assert out.dtype == dtype
    _close(out, _reference(P2, a, b, c, d), 2 * torch.finfo(dtype).eps, str(dtype))


def test_sizes_one_and_zero() -> None:
    """Every size 1; K = 0 gives epilogue(0) = 0 even where d is NaN or ±inf; M, N or O of 0 write nothing."""
    a, b, c, d = _operands(1, 1, 1, 1, seed=6)
    _close(_triton(P2, a, b, c, d), _reference(P2, a, b, c, d), 2e-6, "sizes 1")
    a, b, c, _ = _operands(0, 3, 4, 2, seed=6)
    d = torch.tensor([math.nan, math.inf, -math.inf, 1.0], dtype=F64)[:, None].expand(4, 3)
    assert torch.equal(_triton(P2, a, b, c, d).cpu(), torch.zeros(2, 4, 3))
    program = GradProgram(D - B, ACC + 1.0)  # the epilogue's value at 0
    assert torch.equal(_triton(program, a, b, c, d).cpu(), torch.ones(2, 4, 3))
    for k, m, n, o in ((4, 0, 3, 2), (4, 5, 0, 2), (4, 5, 3, 0)):
        out = _triton(P2, *_operands(k, m, n, o, seed=7))
        assert out.shape == (o, n, m)


def test_views_batches_and_tensor_hyperparameters() -> None:
    """A transposed `a`, a strided `c`, batch `[2, 3]` with `b` broadcast over its first dimension, and one scale
    per row of the batch (a `[2, 1]` tensor)."""
    program = GradProgram(0.5 * (D - B), Hyper("scale") * ACC)
    a, _, c, d = _operands(40, 33, 18, 5, seed=8, batch=(2, 3))
    (b,) = _operands(40, 33, 18, 5, seed=9, batch=(1, 3))[1:2]
    scale = torch.tensor([[0.5], [2.0]], dtype=F64)
    a_t = a.mT.contiguous().mT  # its rows are contiguous
    c_s = torch.cat([c, c], -1)[..., ::2].copy_(c)  # every other column of a wider tensor
    assert not a_t.is_contiguous() and c_s.stride(-1) == 2
    for dtype in (torch.float32, F64):
        operands = [t.to(dtype) for t in (a_t, b.expand(2, 3, 18, 40), c_s, d)]
        out = _triton(program, *operands, {"scale": scale.to(dtype)})
        assert out.shape == (2, 3, 5, 18, 33)
        _close(out, _reference(program, *operands, {"scale": scale}), _tol(dtype), f"views {dtype}")


def test_64_bit_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 64-bit index variant (taken past 2³¹ elements) computes the same values."""
    specs = []
    real = launch._kernel
    monkeypatch.setattr(launch, "_kernel", lambda spec, *args: specs.append(spec) or real(spec, *args))
    monkeypatch.setattr(launch, "_needs_int64", lambda tensors, programs: True)
    a, b, c, d = _operands(21, 19, 17, 3, seed=10, batch=(2,))
    out = _triton(P2, a.float(), b.float(), c.float(), d.float())
    assert specs and all(s.int64 and s.kernel == "grad_affine" for s in specs)
    _close(out, _reference(P2, a.float(), b.float(), c.float(), d.float()), 2e-6, "64-bit indices")


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
def test_nan_and_infinities(dtype: torch.dtype) -> None:
    """NaN or ±inf in each operand (a row of `b`, a column of `a`, a row of `c`, entries of `d`, among them the
    first column of a row, which the kernel centres on): non-finite outputs exactly where the reference has them,
    the others within the tolerance."""
    a, b, c, d = (t.to(dtype) for t in _operands(21, 19, 17, 3, seed=11))
    b[2, 4] = math.inf
    b[5, 0] = math.nan
    a[3, 7] = -math.inf
    c[1, 9] = math.nan
    d[6, 0] = math.inf
    d[7, 11] = -math.inf
    d[8, 12] = math.nan
    ref = _reference(P2, a, b, c, d)
    out = _triton(P2, a, b, c, d).double().cpu()
    finite = ref.isfinite()
    assert (~finite).any() and finite.any()
    assert torch.equal(out.isfinite(), finite)
    _close(out[finite], ref[finite], _tol(dtype), "finite outputs")


def test_near_duplicates_and_offset_coordinates() -> None:
    """Where every `b[n,k]` is within 10⁻⁶ (relative) of `d[n,m]` (all m), d·s and Σ b·c·a cancel to six digits;
    the kernel centres each row on its tile's first `d`, so the result keeps float32 accuracy.  Coordinates offset
    by 1000 from 0 (features with a large mean): as accurate as the product-form kernel, to a small factor."""
    k, m, n, o = 45, 37, 19, 2
    a, _, c, _ = _operands(k, m, n, o, seed=12)
    gen = torch.Generator().manual_seed(13)
    v = 1e3 + torch.randn(n, 1, generator=gen, dtype=F64)
    b = v + 1e-3 * torch.randn(n, k, generator=gen, dtype=F64)
    d = v.expand(n, m)
    cases = {"near-duplicates": (a, b, c, d)}
    _, b2, _, d2 = _operands(k, m, n, o, seed=14)
    cases["offset"] = (a, 1e3 + b2, c, 1e3 + d2)
    for what, operands in cases.items():
        operands = [t.float() for t in operands]
        ref = _reference(P2, *operands)
        simt = _error(_triton(P2, *operands, tuning=OFF), ref)
        affine = _error(_triton(P2, *operands, tuning=ON), ref)
        assert affine <= max(4 * simt, 1e-6), f"{what}: {affine:.3g} against the product-form kernel's {simt:.3g}"
        assert affine <= GRAD_TOL, what


# --- the kernel compiles for the GPU ---------------------------------------------------------------------------


def _compile_jobs() -> dict[str, dict]:
    """Each entry of both spaces for p = 2 (float32 and float64; sm_90 and sm_80); with 64-bit indices, two batch
    dimensions and a tensor hyperparameter; the factor without `b`."""
    jobs: dict[str, dict] = {}
    for dtype in ("float32", "float64"):
        for i, (meta, warps, _, maxnreg) in enumerate(configs.grad_affine_space(dtype)):
            assert maxnreg is None  # the compile script compiles without a register cap
            for arch in (90, 80):
                job = dict(program=P2.key(), spec={}, meta=meta | {"BO": 1}, warps=warps, arch=arch, dtype=dtype)
                jobs[f"p2-{dtype}-config{i}-sm{arch}"] = job
    scaled = GradProgram(0.5 * (D - B), Hyper("scale") * ACC).key()
    batched = {"nbatch": 2, "tensor_hypers": ["scale"], "int64": True}
    for dtype in ("float32", "float64"):
        meta, warps, _, _ = configs.grad_affine_space(dtype)[0]
        base = dict(meta=meta | {"BO": 1}, warps=warps, arch=90, dtype=dtype)
        jobs[f"scaled-{dtype}-batched-int64-sm90"] = base | dict(program=scaled, spec=batched)
        jobs[f"without-b-{dtype}-sm90"] = base | dict(program=GradProgram(2.0 * D, ACC).key(), spec={})
    return {key: job | {"id": key} for key, job in jobs.items()}


@pytest.fixture(scope="module")
def compile_reports() -> dict[str, str]:
    """`cuobjdump -res-usage` of every job, compiled in one clean process (gradient_affine_compile.py)."""
    pytest.importorskip("triton")
    return compile_in_clean_process(
        Path(__file__).with_name("gradient_affine_compile.py"), list(_compile_jobs().values())
    )


@pytest.mark.parametrize("job", sorted(_compile_jobs()))
def test_the_kernel_compiles_without_spills(job: str, compile_reports: dict[str, str]) -> None:
    assert_compiled(compile_reports[job])


# --- real sizes on the GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tuning", [ON, TritonTuning(grad_tensor_cores=True)], ids=["untuned", "tuned"])
@pytest.mark.parametrize(("m", "n", "o", "k"), [(1203, 771, 1, 769), (1001, 37, 17, 301), (4096, 64, 3, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=["float32", "float64"])
def test_real_sizes_on_the_gpu(tuning, m: int, n: int, o: int, k: int, dtype: torch.dtype) -> None:
    a, b, c, d = (t.to(dtype) for t in _operands(k, m, n, o, seed=15))
    out = _triton(P2, a, b, c, d, tuning=tuning)
    _close(out, _reference(P2, a, b, c, d), 1e-11 if dtype == F64 else 1e-5, f"{m}x{n}x{o}x{k}")


@pytest.mark.gpu
def test_gpu_views_batches_and_half_inputs() -> None:
    a, b, c, d = _operands(700, 513, 40, 2, seed=16, batch=(2,))
    a_t = a.mT.contiguous().mT
    _close(_triton(P2, a_t.float(), b.float(), c.float(), d.float()), _reference(P2, a_t, b, c, d), 1e-5, "views")
    for dtype in (torch.float16, torch.bfloat16):
        operands = [t.to(dtype) for t in (a, b, c, d)]
        _close(_triton(P2, *operands), _reference(P2, *operands), 2 * torch.finfo(dtype).eps, str(dtype))
