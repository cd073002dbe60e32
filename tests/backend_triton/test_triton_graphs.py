"""The Triton backend on a GPU: direct launches of compiled variants, and CUDA graphs.

- A variant that ran before launches its `CompiledKernel` directly (where this Triton has the
  API, `kermac_backend_triton.launchers.DIRECT_LAUNCH`), autotuned or not; calls alternating
  between keys that differ in one component (alignment, N % 16, N = 1, unit strides, dtype,
  hyperparameter kind and dtype, batch) stay right against float64.  The same with the direct
  launch switched off (the `kernel[grid]` path older or newer Tritons would take).
- CUDA graphs: a warmed-up call captured on a side stream replays with new input values, and with
  a batch of bandwidths held in a device tensor changed in place; a variant that would compile
  during the capture is refused with an error that says what to do.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from helpers import assert_close, ref_cdist, ref_grad, require_backend, tolerance

import kermac
from kermac import presets
from kermac.hyperparams import HyperValue
from kermac.problem import pairwise_problem

launch = pytest.importorskip("kermac_backend_triton.launch")
launchers = importlib.import_module("kermac_backend_triton.launchers")  # part of the backend: never skipped
TritonTuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning

pytestmark = pytest.mark.gpu

MODES = ["direct", "kernel[grid]"]


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Fresh launcher caches; "kernel[grid]" switches the direct launch off (as a Triton without it)."""
    require_backend("triton", "cuda")
    monkeypatch.setattr(launch, "_families", {})
    if request.param != "direct":
        monkeypatch.setattr(launchers, "DIRECT_LAUNCH", "switched off by the test")
    return request.param


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device="cuda")


def _laplace(x: torch.Tensor, z: torch.Tensor, bandwidth: torch.Tensor | float) -> torch.Tensor:
    bw = torch.as_tensor(bandwidth, dtype=torch.float64).cpu()
    return torch.exp(-ref_cdist(x.cpu(), z.cpu(), 2.0) / bw.reshape(bw.shape + (1, 1)))


def _hyper(name: str, value: object) -> HyperValue:
    return HyperValue(name, None, value) if isinstance(value, torch.Tensor) else HyperValue(name, float(value))


def _cases() -> dict[str, tuple]:
    """(program, x, z, out, hypers) per key component; sizes past every tile, odd where it matters."""
    l1, lap = presets.l1_distance.lower(), presets.laplace_l2.lower()
    x, z = _randn(301, 40), _randn(203, 40)
    shifted = _randn(302 * 40 + 1)[1 : 1 + 301 * 40].view(301, 40)
    xt = _randn(40, 301).t()
    bw = torch.tensor([0.5, 2.0, 1.5], device="cuda")
    xb, zb = _randn(3, 77, 40), _randn(3, 45, 40)
    x48, z48 = _randn(301, 48), _randn(203, 48)  # D = 48 and 40 share a bucket; D is specialised on % 16
    return {
        "base": (l1, x, z, torch.empty(301, 203, device="cuda"), {}),
        "misaligned x": (l1, shifted, z, torch.empty(301, 203, device="cuda"), {}),
        "misaligned out": (l1, x, z, torch.empty(301 * 203 + 1, device="cuda")[1:].view(301, 203), {}),
        "N = 48": (l1, x, z[:48], torch.empty(301, 48, device="cuda"), {}),
        "N = 1": (l1, x, z[:1], torch.empty(301, 1, device="cuda"), {}),
        "transposed x": (l1, xt, z, torch.empty(301, 203, device="cuda"), {}),
        "float64": (l1, x.double(), z.double(), torch.empty(301, 203, device="cuda", dtype=torch.float64), {}),
        "tensor cores, D = 40": (lap, x, z, torch.empty(301, 203, device="cuda"), {"bandwidth": 1.5}),
        "tensor cores, D = 48": (lap, x48, z48, torch.empty(301, 203, device="cuda"), {"bandwidth": 1.5}),
        "batched bandwidth": (lap, xb, zb, torch.empty(3, 77, 45, device="cuda"), {"bandwidth": bw}),
        "float64 bandwidth": (lap, xb, zb, torch.empty(3, 77, 45, device="cuda"), {"bandwidth": bw.double()}),
    }


def _reference(case: tuple) -> torch.Tensor:
    _, x, z, _, hypers = case
    if "bandwidth" in hypers:
        return _laplace(x, z, hypers["bandwidth"])
    return ref_cdist(x.cpu(), z.cpu(), 1.0)


def _run(case: tuple, tuning: TritonTuning) -> torch.Tensor:
    program, x, z, out, hypers = case
    problem = pairwise_problem(program, x, z, out=out, hypers={k: _hyper(k, v) for k, v in hypers.items()})
    problem.out.fill_(math.nan)
    launch.run_pairwise(problem, tuning=tuning)
    return problem.out


@pytest.mark.parametrize("autotune", [False, True], ids=["untuned", "autotuned"])
def test_alternating_keys_stay_right(mode: str, autotune: bool) -> None:
    """Every case twice in turn, new input values each time; the second round hits the launchers.
    Autotuned (each configuration compiled and timed): one case per kernel and the transposed one."""
    cases = _cases()
    if autotune:
        cases = {k: cases[k] for k in ("base", "transposed x", "float64", "tensor cores, D = 40", "batched bandwidth")}
    tuning = TritonTuning(autotune=autotune)
    for _ in range(2):
        for case in cases.values():
            case[1].copy_(torch.randn_like(case[1]))
            out = _run(case, tuning)
            tol = 1e-12 if out.dtype == torch.float64 else 1e-5
            assert_close(out, _reference(case), tol)
    families = list(launch._families.values())
    assert sum(len(f.launchers) for f in families) == len(cases)
    direct = [launcher.compiled is not None for f in families for launcher in f.launchers.values()]
    if mode == "direct":
        assert launchers.DIRECT_LAUNCH is None, launchers.DIRECT_LAUNCH  # Triton 3.3 to 3.9 have it
        assert all(direct)
    else:
        assert not any(direct)


def test_gradient_launchers(mode: str) -> None:
    """The gradient: O = 16 and 17 (one bucket, two BO), each twice with new values."""
    for _ in range(2):
        for o in (16, 17):
            a, b, c, d = _randn(40, 30), _randn(20, 40), _randn(o, 40), _randn(20, 30)
            got = kermac.cdist_grad(a, b, c, d, p=1.5, backend="triton")
            assert_close(got, ref_grad(a, b, c, d, 1.5), 1e-4)


def _side_stream_warm_up(calls) -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def test_a_graph_replays_warmed_up_calls_with_new_inputs(mode: str) -> None:
    """cdist (the SIMT/Gluon kernel), a Laplace kernel matrix (tensor cores) and the gradient,
    captured after one call each, replayed three times with new values in the captured inputs."""
    x, z = _randn(300, 40), _randn(200, 40)
    a, b, c, d = _randn(40, 30), _randn(20, 40), _randn(6, 40), _randn(20, 30)
    out = torch.empty(300, 200, device="cuda")
    kout = torch.empty(300, 200, device="cuda")
    gout = torch.empty(6, 20, 30, device="cuda")

    def calls() -> None:
        kermac.cdist(x, z, 1.0, out=out, backend="triton")
        kermac.run_kernel("laplace_l2", x, z, bandwidth=1.5, out=kout, backend="triton")
        kermac.cdist_grad(a, b, c, d, p=1.5, out=gout, backend="triton")

    _side_stream_warm_up(calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for _ in range(3):
        for t in (x, z, a, d):
            t.copy_(torch.randn_like(t))
        for t in (out, kout, gout):
            t.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, ref_cdist(x, z, 1.0), tolerance(torch.float32))
        assert_close(kout, _laplace(x, z, 1.5), 1e-5)
        assert_close(gout, ref_grad(a, b, c, d, 1.5), 1e-4)


def test_a_graph_replays_a_batch_of_bandwidths_changed_in_place(mode: str) -> None:
    """Bandwidths held in a device tensor [L]: the replay reads the values written in place."""
    xb, zb = _randn(4, 130, 40), _randn(4, 90, 40)
    bw = torch.tensor([0.5, 1.0, 2.0, 4.0], device="cuda")
    out = torch.empty(4, 130, 90, device="cuda")

    def calls() -> None:
        kermac.run_kernel("laplace_l2", xb, zb, bandwidth=bw, out=out, backend="triton")
        kermac.run_kernel("laplace_l1", xb, zb, bandwidth=bw, out=lout, backend="triton")

    lout = torch.empty(4, 130, 90, device="cuda")
    _side_stream_warm_up(calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    for new in ([3.0, 0.25, 1.5, 0.75], [1.0, 2.0, 3.0, 4.0]):
        bw.copy_(torch.tensor(new))
        xb.copy_(torch.randn_like(xb))
        out.fill_(math.nan)
        lout.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, _laplace(xb, zb, bw), 1e-5)
        want = torch.exp(-ref_cdist(xb.cpu(), zb.cpu(), 1.0) / bw.double().cpu()[:, None, None])
        assert_close(lout, want, 1e-5)


def test_a_cold_variant_under_capture_is_refused_with_what_to_do(mode: str) -> None:
    """A call that would compile and autotune during a capture raises before touching the stream;
    the same call run once before capturing is then captured and replayed."""
    x, z = _randn(61, 23, dtype=torch.float64), _randn(37, 23, dtype=torch.float64)
    out = torch.empty(61, 37, device="cuda", dtype=torch.float64)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError) as info:
        with torch.cuda.graph(graph):
            kermac.cdist(x, z, 3.0, out=out, backend="triton")
    message = str(info.value)
    assert "capturing" in message and "run the same call" in message and "once before capturing" in message
    assert "float64" in message  # names the variant
    assert not torch.cuda.is_current_stream_capturing()

    def call() -> None:
        kermac.cdist(x, z, 3.0, out=out, backend="triton")

    _side_stream_warm_up(call)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    x.copy_(torch.randn_like(x))
    out.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, ref_cdist(x, z, 3.0), 1e-12)


def test_a_split_product_captured_at_another_row_count_compiles_nothing(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tensor-core product past 32 features splits x and z first (`operand_split.split_rows`): warmed up at
    48 rows, a capture at 61 rows (a row count not a multiple of 16, the same product key) launches the split
    compiled at warm-up, and the replay reads new values.  z's 208 rows are a multiple of 16 too, and the split's
    compiled variants are dropped first: before the capture only row counts that are multiples of 16 were split."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the product splits its operands first on sm_90 only")
    operand_split = importlib.import_module("kermac_backend_triton.operand_split")
    operand_split.split_rows.device_caches.clear()
    z, v = _randn(208, 40), _randn(208, 1)
    warm, x = _randn(48, 40), _randn(61, 40)  # one bucket of the product key
    out = torch.empty(61, 1, device="cuda")
    _side_stream_warm_up(lambda: kermac.kernel_product("laplace_l2", warm, z, v, bandwidth=1.5, backend="triton"))
    compile_split = operand_split.split_rows.compile

    def no_compile_under_capture(*args, **kwargs):
        assert not torch.cuda.is_current_stream_capturing(), "split_rows compiled a variant during the capture"
        return compile_split(*args, **kwargs)

    monkeypatch.setattr(operand_split.split_rows, "compile", no_compile_under_capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kermac.kernel_product("laplace_l2", x, z, v, bandwidth=1.5, out=out, backend="triton")
    x.copy_(torch.randn_like(x))
    out.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, _laplace(x, z, 1.5) @ v.double().cpu(), 1e-5)
