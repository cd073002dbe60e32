"""The example plugin of examples/kermac-backend-numpy, registered in-process, passes the conformance suite.

CI has no network, so the package is not pip-installed here: its `src` goes on `sys.path` and the entry
point its pyproject.toml declares is handed to the registry beside the installed ones -- what an
installed distribution gives kermac, minus the wheel.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import torch

import kermac
from kermac import cli, hookspecs, ir, presets, registry, testing
from kermac.errors import UnsupportedProblemError
from kermac.programs import PairwiseProgram
from kermac.testing import conformance_tests

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "kermac-backend-numpy"


def _declared_entry_points() -> list[metadata.EntryPoint]:
    """The `kermac.backends` entry points of the example's pyproject.toml (its `name = "module"` lines
    under the group's table; read as text, since Python 3.10 has no tomllib)."""
    group = hookspecs.ENTRY_POINT_GROUP
    text = (EXAMPLE / "pyproject.toml").read_text()
    table = text.split(f'[project.entry-points."{group}"]', 1)[1].split("\n[", 1)[0]
    found = re.findall(r'^([\w.-]+) = "([\w.:]+)"$', table, flags=re.MULTILINE)
    return [metadata.EntryPoint(name, value, group) for name, value in found]


@pytest.fixture(autouse=True)
def example_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The example registered beside the installed backends for one test (in place of its installed copy,
    if the example is installed too: the test checks this tree)."""
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    declared = _declared_entry_points()
    names = {ep.name for ep in declared}
    installed = [ep for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP) if ep.name not in names]
    registry.reset([*declared, *installed])
    yield
    registry.reset()
    for module in [m for m in sys.modules if m == "kermac_backend_numpy" or m.startswith("kermac_backend_numpy.")]:
        del sys.modules[module]


globals().update(conformance_tests("numpy", devices=["cpu"]))


def test_the_package_declares_one_backend_named_numpy() -> None:
    assert [ep.name for ep in _declared_entry_points()] == ["numpy"]
    row = next(r for r in kermac.backends() if r.name == "numpy")
    assert row.available and not row.broken and row.priority < 0
    assert row.plugin == "numpy"


def test_kermac_info_and_bench_show_the_backend(capsys: pytest.CaptureFixture[str]) -> None:
    """Discovered from the registry: `kermac info` lists it, `kermac bench` names why it is left out by
    default (opt-in) and times it when named, checked against the float64 reference."""
    assert cli.main(["info", "--json"]) == 0
    row = next(b for b in json.loads(capsys.readouterr().out)["backends"] if b["name"] == "numpy")
    assert row["available"] and not row["broken"] and row["priority"] == -10
    assert cli.main(["bench", "--quick", "--json"]) == 0
    assert "opt-in" in json.loads(capsys.readouterr().out)["skipped"]["numpy"]
    assert cli.main(["bench", "--quick", "--json", "--backends", "numpy"]) == 0
    report = json.loads(capsys.readouterr().out)
    pairwise = [c for c in report["cases"] if c["op"] != "grad"]
    assert pairwise and all(c["results"]["numpy"]["ok"] for c in pairwise)


def test_the_asv_suites_time_it_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """An opt-in backend is an n/a row of the asv suites, a timed one once KERMAC_ASV_BACKENDS names it."""
    monkeypatch.syspath_prepend(str(ROOT))
    harness = importlib.import_module("benchmarks._harness")
    suite = importlib.import_module("benchmarks.bench_cdist").CDist()
    assert "numpy" in harness.implementations("torch.cdist")
    label = next(iter(harness.cases("cdist")))
    with pytest.raises(NotImplementedError, match="opt-in"):
        suite.setup("numpy", label)
    monkeypatch.setenv(harness.OPT_IN_VARIABLE, "nvrtc, numpy")
    suite.setup("numpy", label)
    suite.time_cdist("numpy", label)
    suite.teardown("numpy", label)


def test_auto_never_picks_the_opt_in_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Priority < 0: even as the only backend that accepts the problem, `auto` leaves it out."""
    reference = registry.get_backend("torch")
    monkeypatch.setattr(reference, "check_pairwise", lambda problem: "refused for this test")
    x = torch.randn(5, 3)
    with pytest.raises(UnsupportedProblemError, match="no backend can run"):
        kermac.cdist(x, x, p=1.0)
    expected = torch.cdist(x.double(), x.double(), p=1.0).float()
    assert torch.allclose(kermac.cdist(x, x, p=1.0, backend="numpy"), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_are_refused_with_a_reason(dtype: torch.dtype) -> None:
    x = torch.randn(4, 3, dtype=dtype)
    with pytest.raises(UnsupportedProblemError, match=f"float32 and float64 only, got {dtype}"):
        kermac.run_program(presets.l1_distance.lower(), x, x, backend="numpy")


def test_gradients_are_refused_with_a_reason() -> None:
    a, b, c, d = torch.randn(3, 4), torch.randn(5, 3), torch.randn(2, 3), torch.randn(5, 4)
    with pytest.raises(UnsupportedProblemError, match="pairwise programs only"):
        kermac.cdist_grad(a, b, c, d, backend="numpy")


def test_other_devices_are_refused_with_a_reason() -> None:
    from kermac.problem import pairwise_problem

    x = torch.empty(4, 3, device="meta")
    problem = pairwise_problem(presets.l1_distance.lower(), x, x, out=None, hypers={}, fake=True)
    assert registry.get_backend("numpy").check_pairwise(problem) == (
        "the numpy backend reads CPU tensors only, got tensors on meta"
    )


def test_an_ir_operation_it_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a backend does when core's IR grows: an operation missing from its table refuses the program."""
    from kermac_backend_numpy import evaluate

    monkeypatch.setattr(evaluate, "OPS", {k: v for k, v in evaluate.OPS.items() if k != "abs"})
    x = torch.randn(4, 3)
    with pytest.raises(UnsupportedProblemError, match="does not implement the IR operations abs"):
        kermac.run_program(presets.l1_distance.lower(), x, x, backend="numpy")


def test_a_reduction_it_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for operations: a reduction missing from its table (one core might add) refuses the program."""
    from kermac_backend_numpy import evaluate

    monkeypatch.setattr(evaluate, "REDUCE", {k: v for k, v in evaluate.REDUCE.items() if k != "max"})
    x = torch.randn(4, 3)
    with pytest.raises(UnsupportedProblemError, match="reduces with sum, min, logsumexp only, got 'max'"):
        kermac.run_program(presets.linf_distance.lower(), x, x, backend="numpy")


@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize("d", [0, 1, 6])
def test_max_and_min_start_from_their_identity(reduction: str, d: int) -> None:
    """−∞ / +∞, not 0: terms of one sign (all negative for max, all positive for min) and D = 0 tell."""
    sign = -1.0 if reduction == "max" else 1.0
    program = PairwiseProgram(sign * ir.abs_(ir.Var("x") - ir.Var("z")) + sign, reduction, ir.Var("acc"))
    x, z = torch.randn(2, 7, d, dtype=torch.float64), torch.randn(9, d, dtype=torch.float64)
    testing.assert_pairwise_conforms("numpy", program, x, z)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_logsumexp_has_the_values_of_kermac_reductions(dtype: torch.dtype) -> None:
    """`log Σ_k exp(x_k + z_k)` against torch.logsumexp in float64: a NaN term gives NaN, a +∞ term +∞ (even
    beside −∞ terms), terms that are all −∞ give −∞, large terms do not overflow; and D = 0 gives −∞."""
    inf, nan = torch.inf, torch.nan
    x = torch.tensor(
        [
            [0.5, -1.0, 2.0, 0.0],
            [nan, 1.0, 2.0, 3.0],
            [inf, -inf, 1.0, 0.0],
            [-inf, -inf, -inf, -inf],
            [800.0, 801.0, -800.0, 0.0],
            [1.0, 1.0, 1.0, 1.0],
        ],
        dtype=torch.float64,
    )
    z = torch.tensor([[0.25, 0.5, -0.75, 1.0], [-1.0, 2.0, 0.0, -3.0]], dtype=torch.float64)
    program = PairwiseProgram(ir.Var("x") + ir.Var("z"), "logsumexp", ir.Var("acc"))
    expected = torch.logsumexp(x[:, None, :] + z[None, :, :], -1)
    out = kermac.run_program(program, x.to(dtype), z.to(dtype), backend="numpy")
    rtol = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(out.double(), expected, rtol=rtol, atol=0, equal_nan=True)
    assert out[1].isnan().all() and (out[2] == inf).all() and (out[3] == -inf).all() and out[4].isfinite().all()
    empty = kermac.run_program(program, x[:, :0].to(dtype), z[:, :0].to(dtype), backend="numpy")
    assert torch.equal(empty, torch.full((6, 2), -inf, dtype=dtype))


def test_blocks_of_rows_cover_out_and_keep_the_diagonal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several blocks of rows (a block of 2²² terms is larger than the suite's problems): each writes its
    own rows, and the shifted diagonal of a regularised kernel lands on the right rows of every block."""
    from kermac_backend_numpy import backend

    monkeypatch.setattr(backend, "BLOCK_ELEMENTS", 3 * 2 * 11 * 5)  # 3 rows of a [2, rows, 11, 5] block
    x, z = torch.randn(2, 13, 5, dtype=torch.float64), torch.randn(11, 5, dtype=torch.float64)
    program = presets.matern52.lower(regularized=True)
    hypers = {"bandwidth": 1.3, "regularization": 0.5}
    testing.assert_pairwise_conforms("numpy", program, x, z, hypers=hypers, offset_m=0, offset_n=4)
    testing.assert_pairwise_conforms("numpy", program, x, z, hypers=hypers, offset_m=6, offset_n=0)
