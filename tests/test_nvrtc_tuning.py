"""NVRTC tuning as a value (no GPU): ``NvrtcTuning`` and its checks, backends of different tuning
side by side, nothing read from the environment, in-process registration of tuned backends."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import kermac
from kermac import presets, registry
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program
from kermac.problem import pairwise_problem
from kermac_backend_nvrtc import DEFAULT_TUNING, NvrtcBackend, NvrtcTuning, launcher, plan
from kermac_backend_nvrtc.tuned import registered

#: The planner's switches before they became a value (module globals set from KERMAC_NVRTC_*):
#: the defaults must stay these.
OLD_DEFAULTS = {
    "tensor_cores": True,
    "wgmma": True,
    "half_powers": True,
    "flush_subnormals": True,
    "power_table": True,
    "power_table_pairs": 38,
    "power_table_pairs_high_p": 32,
    "ex2_polynomial_pairs": 36,
    "inline_expensive_epilogue": True,
    "inline_expensive_combine": False,
    "zero_padded_k_tail": True,
    "k_contiguous_tiles": True,
    "tensor_core_min_d": 16,
    "tensor_core_grad_min_o": 5,
    "sign_product_min_o": 3,
    "sign_product_min_features": 96,
}

#: Every environment variable the planner used to read at import.
OLD_VARIABLES = (
    "KERMAC_NVRTC_POLY_PAIRS",
    "KERMAC_NVRTC_POW_TABLE",
    "KERMAC_NVRTC_TABLE_PAIRS",
    "KERMAC_NVRTC_TABLE_PAIRS_HIGH_P",
    "KERMAC_NVRTC_FTZ",
    "KERMAC_NVRTC_TENSOR_CORES",
    "KERMAC_NVRTC_WGMMA",
    "KERMAC_NVRTC_HALF_POWERS",
    "KERMAC_NVRTC_INLINE_EPILOGUE",
    "KERMAC_NVRTC_ONE_PATH",
    "KERMAC_NVRTC_K_CONTIGUOUS",
)


def test_defaults_are_the_measured_settings() -> None:
    assert dataclasses.asdict(NvrtcTuning()) == OLD_DEFAULTS
    assert DEFAULT_TUNING == NvrtcTuning() and NvrtcBackend().tuning is DEFAULT_TUNING


def test_tuning_is_frozen_and_hashable() -> None:
    tuning = NvrtcTuning(tensor_cores=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuning.tensor_cores = True  # type: ignore[misc]
    assert hash(tuning) == hash(NvrtcTuning(tensor_cores=False)) and tuning != DEFAULT_TUNING
    assert len({tuning, NvrtcTuning(tensor_cores=False), DEFAULT_TUNING}) == 2


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"tensor_cores": 0}, TypeError, "tensor_cores: expected a bool, got int 0"),
        ({"wgmma": "false"}, TypeError, "wgmma: expected a bool, got str 'false'"),
        ({"power_table_pairs": 38.0}, TypeError, "power_table_pairs: expected an int, got float 38.0"),
        ({"ex2_polynomial_pairs": True}, TypeError, "ex2_polynomial_pairs: expected an int, got bool"),
        ({"power_table_pairs": 65}, ValueError, "power_table_pairs: expected a number of pairs from 0 to 64, got 65"),
        ({"power_table_pairs_high_p": -1}, ValueError, "_high_p: expected a number of pairs from 0 to 64, got -1"),
        ({"tensor_core_grad_min_o": 0}, ValueError, "grad_min_o: expected a number of outputs >= 1, got 0"),
        ({"tensor_core_min_d": 0}, ValueError, "tensor_core_min_d: expected a number of features >= 1, got 0"),
        ({"tensor_core_min_d": 16.0}, TypeError, "tensor_core_min_d: expected an int, got float 16.0"),
        ({"sign_product_min_o": "3"}, TypeError, "sign_product_min_o: expected an int, got str '3'"),
    ],
)
def test_bad_values_name_the_field(changes: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)) as caught:
        NvrtcTuning(**changes)
    assert str(caught.value).startswith("NvrtcTuning.")
    with pytest.raises(error, match="NvrtcTuning"):
        dataclasses.replace(DEFAULT_TUNING, **changes)


def test_edge_values_are_accepted() -> None:
    NvrtcTuning(power_table_pairs=0, power_table_pairs_high_p=64, ex2_polynomial_pairs=0, tensor_core_grad_min_o=1)


def test_backend_refuses_what_is_not_a_tuning() -> None:
    with pytest.raises(TypeError, match=r"tuning: expected a kermac_backend_nvrtc\.NvrtcTuning, got dict"):
        NvrtcBackend({"tensor_cores": False})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name: expected a str, got int"):
        NvrtcBackend(name=3)  # type: ignore[arg-type]


def test_another_name_is_opt_in() -> None:
    default, other = NvrtcBackend(), NvrtcBackend(NvrtcTuning(wgmma=False), name="nvrtc-mma")
    assert (default.name, default.priority) == ("nvrtc", 20)
    assert (other.name, other.priority) == ("nvrtc-mma", -1)
    assert (NvrtcBackend.name, NvrtcBackend.priority) == ("nvrtc", 20)  # the class keeps its own


def test_no_module_reads_the_old_variables() -> None:
    """With every old KERMAC_NVRTC_* variable set (to "0", which used to switch a feature off, or to
    garbage, which used to fail the import), importing every module of the package and planning reads
    none of them and plans as with the defaults."""
    code = textwrap.dedent(
        """
        import importlib, os, pkgutil, sys
        read = []
        get = os._Environ.__getitem__
        def spy(self, key):
            if str(key).startswith("KERMAC_NVRTC_"):
                read.append(key)
            return get(self, key)
        os._Environ.__getitem__ = spy
        import kermac_backend_nvrtc
        for info in pkgutil.walk_packages(kermac_backend_nvrtc.__path__, "kermac_backend_nvrtc."):
            importlib.import_module(info.name)
        import torch
        from kermac import presets
        from kermac.lowering import cdist_program, grad_program
        from kermac.hyperparams import HyperValue
        from kermac.problem import grad_problem, pairwise_problem
        from kermac_backend_nvrtc import NvrtcBackend, plan
        x = torch.randn(64, 16)
        backend = NvrtcBackend()
        l2 = pairwise_problem(presets.l2_distance.lower(), x, x, out=None, hypers={})
        lp = pairwise_problem(cdist_program(1.3), x, x, out=None, hypers={"p": HyperValue("p", 1.3)})
        l1 = pairwise_problem(cdist_program(1.0), x, x, out=None, hypers={})
        a, b, c, d = torch.randn(16, 64), torch.randn(128, 16), torch.randn(8, 16), torch.randn(128, 64)
        g = grad_problem(grad_program(1.0), a, b, c, d, out=None, hypers={})
        v2, vp, v1 = (plan.plan_pairwise(pr, 90, backend.tuning)[0] for pr in (l2, lp, l1))
        vg = plan.plan_grad(g, 90, backend.tuning)[0]
        assert type(v2).__name__ == "WgmmaPairwise", v2
        assert vp.split.degree == 5 and vp.split.pairs == 38 and vp.flush_subnormals and vp.half_powers, vp
        assert type(v1).__name__ == "KContiguousPairwise", v1
        assert type(vg).__name__ == "SignGrad", vg
        assert backend.preference(l2) == backend.priority
        assert not read, read
        print("ok")
        """
    )
    env = dict(os.environ)
    env.update({name: "0" for name in OLD_VARIABLES if not name.endswith("PAIRS") and "PAIRS_" not in name})
    env.update({name: "garbage" for name in OLD_VARIABLES if "PAIRS" in name})
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def _l2_problem() -> object:
    x = torch.randn(40, 16)
    return pairwise_problem(presets.l2_distance.lower(), x, x, out=torch.empty(40, 40), hypers={})


def test_backends_of_different_tuning_keep_their_own_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two backends in one process, default and SIMT-only, alternate on one problem: each launches
    its own variant, also from its plan memo (no GPU: the kernel is the variant, launches recorded)."""
    launched = []

    class Recorded:
        def __init__(self, kernel, block, steps, pointers) -> None:
            self.kernel = kernel

        def run(self, addresses) -> None:
            launched.append(self.kernel)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launcher, "PreparedLaunch", Recorded)
    default, simt = NvrtcBackend(), NvrtcBackend(NvrtcTuning(tensor_cores=False))
    for backend in (default, simt):
        monkeypatch.setattr(backend, "_kernel", lambda device, variant, debug: variant)
    problem = _l2_problem()
    for _ in range(2):
        default.pairwise(problem)
        simt.pairwise(problem)
    assert [type(v).__name__ in ("MmaPairwise", "WgmmaPairwise") for v in launched] == [True, False, True, False]
    assert len(default._plans) == len(simt._plans) == 1  # the second round came from the memos


def test_precompile_plans_with_the_backends_tuning(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wgmma off: the l2 program compiles as the mma.sync kernel, a plain sm_90 cubin (wgmma: sm_90a)."""
    pytest.importorskip("cuda.core")
    monkeypatch.setenv("KERMAC_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.empty(40, 16, device="meta")
    problem = pairwise_problem(presets.l2_distance.lower(), x, x, out=None, hypers={})
    built = NvrtcBackend(NvrtcTuning(wgmma=False)).precompile([problem], archs=["sm_90"])
    assert [line.split()[1] for line in built] == ["sm_90"]


def test_registered_backends_are_there_by_name_and_leave_afterwards() -> None:
    simt = NvrtcBackend(NvrtcTuning(tensor_cores=False), name="nvrtc-simt")
    before = {name: type(b) for name, b in registry.registered_backends().items()}
    with registered(simt):
        backends = registry.registered_backends()
        assert backends["nvrtc-simt"] is simt
        assert backends["nvrtc"].tuning == DEFAULT_TUNING  # the installed one stays
        assert {s.name: s.priority for s in kermac.backends()}["nvrtc-simt"] == -1
    assert {name: type(b) for name, b in registry.registered_backends().items()} == before
    replacement = NvrtcBackend(NvrtcTuning(wgmma=False))
    with registered(replacement):
        assert registry.get_backend("nvrtc") is replacement
        assert not [s for s in kermac.backends() if s.broken]  # it took the installed one's place cleanly
    assert registry.get_backend("nvrtc").tuning == DEFAULT_TUNING


def test_registered_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match=r"backends\[1\]: expected a kermac_backend_nvrtc\.NvrtcBackend, got str"):
        with registered(NvrtcBackend(name="a"), "b"):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match=r"backends: expected distinct names, got \['a', 'a'\]"):
        with registered(NvrtcBackend(name="a"), NvrtcBackend(name="a")):
            pass
    with registered(NvrtcBackend(name="a")):
        with pytest.raises(RuntimeError, match="blocks do not nest"):
            with registered(NvrtcBackend(name="b")):
                pass
    assert "a" not in registry.registered_backends()


def test_plan_functions_take_the_tuning() -> None:
    """The SIMT, mma.sync and power-table-off variants are reachable through tuning values alone."""
    problem = _l2_problem()
    assert type(plan.plan_pairwise(problem, 90, DEFAULT_TUNING)[0]).__name__ == "WgmmaPairwise"
    assert type(plan.plan_pairwise(problem, 90, NvrtcTuning(wgmma=False))[0]).__name__ == "MmaPairwise"
    assert type(plan.plan_pairwise(problem, 90, NvrtcTuning(tensor_cores=False))[0]).__name__ == "SimtPairwise"
    x = torch.randn(40, 16)
    from kermac.hyperparams import HyperValue

    lp = pairwise_problem(cdist_program(1.3), x, x, out=None, hypers={"p": HyperValue("p", 1.3)})
    assert plan.plan_pairwise(lp, 90, NvrtcTuning(power_table=False))[0].split.pairs == 36
    assert (
        type(plan.plan_pairwise(lp, 90, NvrtcTuning(ex2_polynomial_pairs=0, power_table=False))[0]).__name__
        == "SimtPairwise"
    )


@pytest.mark.parametrize("inline", [False, True])
def test_an_expensive_combine_is_called_unless_inlined(inline: bool) -> None:
    """Log-sum-exp's combine (exp and log) is a called function by default, in the pairwise, product and general
    gradient kernels; a cheap combine (max) stays inlined either way."""
    from kermac.problem import grad_problem, product_problem
    from kermac.testing import MAX_GRAD, SOFT_MAX_GRAD, SOFT_MIN
    from kermac_backend_nvrtc.source import kernel_source

    tuning = dataclasses.replace(DEFAULT_TUNING, inline_expensive_combine=inline)
    x, z, v = (torch.empty(s, device="meta") for s in ((37, 5), (29, 5), (29, 3)))
    a, b, c, d = (torch.empty(s, device="meta") for s in ((7, 9), (6, 7), (2, 7), (6, 9)))
    hypers = {"gamma": HyperValue("gamma", 0.5)}
    problems = {
        "pairwise": (plan.plan_pairwise, pairwise_problem(SOFT_MIN, x, z, out=None, hypers=hypers)),
        "product": (plan.plan_product, product_problem(SOFT_MIN, x, z, v, out=None, hypers=hypers)),
        "grad": (plan.plan_grad, grad_problem(SOFT_MAX_GRAD, a, b, c, d, out=None, hypers=hypers)),
        "max grad": (plan.plan_grad, grad_problem(MAX_GRAD, a, b, c, d, out=None, hypers={})),
    }
    for what, (planner, problem) in problems.items():
        source = kernel_source(planner(problem, 90, tuning)[0])[0]
        called = "max" not in what and not inline
        expected = "__noinline__" if called else "__forceinline__"
        assert f"__device__ {expected} km_t km_reduce(" in source, what
