"""The asv suites in ``benchmarks/``: backends come from the registry, refusals are n/a, every row computes its case.

``tools/asv_quick.sh`` (run by CI) runs every suite once through asv itself; these tests check
what asv cannot: that a third-party backend shows up without editing the suites, that what it
cannot run is reported as n/a (``NotImplementedError`` in ``setup``), and that each timed call
computes the right answer.
"""

from __future__ import annotations

import importlib
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

import kermac
from kermac import benchmarking as bm
from kermac import registry

ROOT = Path(__file__).resolve().parents[1]
SUITES = ("bench_cdist", "bench_grad", "bench_kernels", "bench_programs")

PLUGIN = """
    from kermac.backend import Availability, Backend
    from kermac.hookspecs import hookimpl
    from kermac.reference.backend import ReferenceBackend

    class PairwiseOnly(Backend):
        name = "asv_pairwise_only"
        priority = 50

        def availability(self):
            return Availability.yes("1.0")

        def check_pairwise(self, problem):
            return None

        def pairwise(self, problem):
            ReferenceBackend().pairwise(problem)

        def check_grad(self, problem):
            return "this backend computes no gradients"

        def grad(self, problem):
            raise AssertionError("refused in check_grad")

    class Missing(PairwiseOnly):
        name = "asv_missing"
        priority = 40

        def availability(self):
            return Availability.no("needs the FakeAccelerator 3000")

    @hookimpl
    def kermac_backends():
        return [PairwiseOnly(), Missing()]
"""


def _suite(name: str) -> ModuleType:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A third-party plugin (one pairwise-only backend, one unavailable) installed from ``tmp_path``."""
    (tmp_path / "asv_fake_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "asv_fake_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: asv-fake-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kermac.backends]\nasv_fake = asv_fake_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.reset()
    yield
    sys.modules.pop("asv_fake_plugin", None)
    registry.reset()


def _suite_class(module: str) -> type:
    mod = _suite(module)
    return next(v for v in vars(mod).values() if isinstance(v, type) and getattr(v, "__module__", "") == mod.__name__)


def test_implementations_are_the_registry_backends(plugin) -> None:
    harness = _suite("_harness")
    names = [s.name for s in kermac.backends()]
    assert "asv_pairwise_only" in names and "asv_missing" in names
    assert harness.implementations("torch.cdist") == ["torch.cdist", *names]


def test_a_plugin_backend_is_timed_and_its_refusals_are_na(plugin) -> None:
    harness = _suite("_harness")
    cdist, grad = _suite_class("bench_cdist")(), _suite_class("bench_grad")()
    label = next(iter(harness.cases("cdist")))
    cdist.setup("asv_pairwise_only", label)
    cdist.time_cdist("asv_pairwise_only", label)
    cdist.teardown("asv_pairwise_only", label)
    with pytest.raises(NotImplementedError, match="computes no gradients"):
        grad.setup("asv_pairwise_only", next(iter(harness.cases("grad"))))
    with pytest.raises(NotImplementedError, match=r"asv_missing.*FakeAccelerator 3000"):
        cdist.setup("asv_missing", label)


def test_unavailable_builtin_backends_are_na_on_this_machine() -> None:
    harness = _suite("_harness")
    statuses = {s.name: s for s in kermac.backends()}
    unavailable = [n for n, s in statuses.items() if not s.available]
    if not unavailable:
        pytest.skip("every registered backend is available here")
    suite = _suite_class("bench_kernels")()
    label = next(iter(harness.cases("kernel")))
    for name in unavailable:
        with pytest.raises(NotImplementedError, match=f"backend {name!r} not timed here"):
            suite.setup(name, label)


def test_the_suites_cover_every_operation() -> None:
    labels = {module: list(_suite_class(module).params[1]) for module in SUITES}
    if _suite("_harness").DEVICE == "cpu":
        assert labels["bench_cdist"] == ["cdist 64x48x8 p=1", "cdist 64x48x8 p=2", "cdist 64x48x8 p=1.5"]
        assert labels["bench_kernels"] == ["laplace L2 64x48x8", "gaussian L2 64x48x8 4 bandwidths"]
        assert labels["bench_grad"] == ["grad M=64 N=8 O=2 K=48 p=1", "grad M=64 N=8 O=2 K=48 p=2"]
        assert labels["bench_programs"] == ["program 64x48x8"]
    assert all(labels.values())


@pytest.mark.parametrize("module", SUITES)
def test_every_row_computes_its_case(module: str) -> None:
    """The reference backend's timed call and PyTorch's row agree with an independent float64 computation."""
    harness = _suite("_harness")
    cls = _suite_class(module)
    suite = cls()
    for label, case in harness.cases(cls.op).items():
        inputs = harness.bm.input_sets(case.base)[0]
        expected = case.torch_fn()
        wide = [t.double() for t in inputs]
        if expected is None:  # no PyTorch row (gradient p != 2): the float64 reference backend
            want = harness.bm.reference(case.base, inputs)
        else:
            want = expected(*wide)
        suite.setup("torch", label)
        got = suite._fn(*inputs)
        suite.teardown("torch", label)
        assert got.shape == want.shape, label
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item(), msg=label)
        if expected is not None:
            suite.setup(cls.baseline, label)
            torch.testing.assert_close(suite._fn(*inputs).double(), want, rtol=1e-5, atol=1e-5, msg=label)
            suite.teardown(cls.baseline, label)


def test_the_batched_gaussian_row_evaluates_each_bandwidth() -> None:
    harness = _suite("_harness")
    case = harness.cases("kernel")[f"gaussian L2 {'x'.join(map(str, harness.PAIR_SIZES))} 4 bandwidths"]
    x, z = (t.double() for t in harness.bm.input_sets(case.base)[0])
    sigmas = case.sigmas().double()
    assert sigmas.shape == (4,) and len(set(sigmas.tolist())) == 4
    d2 = ((x[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    want = torch.exp(-d2[None] / (2 * sigmas[:, None, None] ** 2))
    torch.testing.assert_close(case.torch_fn()(x, z), want)


def test_linalg_without_kermac_linalg_is_na(monkeypatch: pytest.MonkeyPatch) -> None:
    linalg = _suite("bench_linalg")
    monkeypatch.setattr(linalg, "kl", None)
    monkeypatch.setattr(linalg, "MISSING", "kermac-linalg is not installed (test)", raising=False)
    with pytest.raises(NotImplementedError, match="kermac-linalg is not installed"):
        linalg.Linalg().setup("kermac", next(iter(linalg.CASES)))


def test_the_product_rows_compute_k_times_v() -> None:
    """The blocked route and the fused product through the reference backend agree with a float64 K @ v."""
    suite_module = _suite("bench_product")
    suite = suite_module.Products()
    for label, (kernel, p, n, d, c) in suite_module.CASES.items():
        for impl in (suite_module.BLOCKED, "torch"):
            suite.setup(impl, label)
            suite.time_kernel_product(impl, label)
            got = suite._out.double()
            suite.teardown(impl, label)
            gen = torch.Generator(device=suite_module.DEVICE).manual_seed(0)  # the suite's inputs, in float64
            x = torch.randn(n, d, device=suite_module.DEVICE, generator=gen).double()
            v = torch.randn(n, c, device=suite_module.DEVICE, generator=gen).double()
            sigma = 2.0**0.5 * d ** (1.0 / p)
            want = kermac.run_kernel(kernel, x, x, bandwidth=sigma, backend="torch") @ v
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item(), msg=f"{impl} {label}")


def test_a_revision_without_kernel_product_is_na(monkeypatch: pytest.MonkeyPatch) -> None:
    suite_module = _suite("bench_product")
    monkeypatch.delattr(kermac, "kernel_product")
    with pytest.raises(NotImplementedError, match="no kernel_product"):
        suite_module.Products().setup("torch", next(iter(suite_module.CASES)))


def test_the_first_call_suite_times_each_backend_variant_and_cache_state() -> None:
    suite = _suite("bench_first_call")
    backends, variants, caches = suite.FirstCall.params
    assert backends == _suite("_harness").backend_names() and caches == ["cold", "warm"]
    expected = list(bm.FIRST_CALL_VARIANTS) if _suite("_harness").DEVICE == "cuda" else ["p1"]
    assert variants == expected and suite.FirstCall.number == 1


@pytest.mark.parametrize("caches", ["cold", "warm"])
def test_a_first_call_runs_in_a_new_process_with_private_caches(caches: str) -> None:
    """The suite's code computes the variant in a fresh process; a cold process gets a new private directory."""
    suite = _suite("bench_first_call")
    bench = suite.FirstCall()
    bench.setup("torch", "p1", caches)
    try:
        before = set(Path(bench.caches).iterdir())
        statement, setup = bench.timeraw_first_call("torch", "p1", caches)
        check = "\nassert torch.allclose(call_variant('p1', x, z, 'torch'), torch.cdist(x, z, p=1), rtol=1e-5)\n"
        subprocess.run([sys.executable, "-c", setup + statement + check], check=True, capture_output=True)
        made = set(Path(bench.caches).iterdir()) - before
        if caches == "cold":
            (new,) = made
            assert stat.S_IMODE(new.stat().st_mode) == 0o700
        else:
            assert not made
    finally:
        bench.teardown("torch", "p1", caches)
    assert not Path(bench.caches).exists()


def test_the_first_call_suite_leaves_unavailable_backends_na() -> None:
    suite = _suite("bench_first_call")
    missing = [b for b in suite.FirstCall.params[0] if _suite("_harness").refusal(b) is not None]
    for backend in missing:
        with pytest.raises(NotImplementedError, match=f"backend {backend!r} not timed here"):
            suite.FirstCall().setup(backend, "p1", "cold")


def test_call_variant_names_a_bad_variant() -> None:
    x = torch.zeros(2, 3)
    for bad in ("pfast", "no_such_kernel", "p"):
        with pytest.raises(ValueError, match=f"variant: expected pP with a number P .* got {bad!r}"):
            bm.call_variant(bad, x, x, "torch")
    with pytest.raises(TypeError, match="variant: expected a str"):
        bm.call_variant(1.3, x, x, "torch")


@pytest.mark.parametrize("name", sorted(kermac.presets.ALL))
def test_call_variant_runs_every_preset(name: str) -> None:
    """Each preset with the hyperparameters it takes (bandwidth 2, p = FIRST_CALL_P), as run_kernel computes it."""
    x, z = torch.randn(5, 3), torch.randn(4, 3)
    preset = kermac.presets.ALL[name]
    hypers = {"bandwidth": 2.0} if preset.needs_bandwidth else {}
    hypers |= {"p": bm.FIRST_CALL_P} if preset.needs_p else {}
    want = kermac.run_kernel(name, x, z, backend="torch", **hypers)
    torch.testing.assert_close(bm.call_variant(name, x, z, "torch"), want)
    torch.testing.assert_close(bm.call_variant("p1.5", x, z, "torch"), torch.cdist(x, z, p=1.5))
