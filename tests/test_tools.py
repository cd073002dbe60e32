"""tools/: the development tools read the one table of benchmark cases (kermac.benchmarking); no GPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import load_script

from kermac import benchmarking as bm
from kermac.costs import CostTable

TOOLS = ("nvrtc_bench", "nvrtc_profile", "nvrtc_sass_report", "nvrtc_compile_times", "nvrtc_sass_digest")


@pytest.mark.parametrize(
    "name", [*TOOLS, "mg_eigh_bench", "triton_bench", "costs_from_bench", "first_call_times", "half_packed_accuracy"]
)
def test_every_tool_imports_without_a_gpu(name: str) -> None:
    load_script(name)


def test_nvrtc_bench_rows_are_the_peer_table_and_its_extra_cases() -> None:
    tool = load_script("nvrtc_bench")
    labels = [c.label for c in (*bm.PEERS_CASES, *tool.EXTRA_CASES)]
    assert len(set(labels)) == len(labels)
    assert not set(tool.EXTRA_CASES) & set(bm.PEERS_CASES)


@pytest.mark.parametrize("case", bm.CPU_QUICK_CASES, ids=lambda c: c.label)
def test_triton_bench_builds_the_problem_kermac_bench_runs(case: bm.BenchCase) -> None:
    """The problem the tool times directly on Triton's launcher computes the case (interpreter, CPU)."""
    tool = load_script("triton_bench")
    from kermac_backend_triton import launch

    small = bm.BenchCase(case.op, (24, 8, 3, 16) if case.op == "grad" else (24, 20, 16), case.p, case.kernel)
    inputs = small.make_inputs(1)
    out = torch.full(small.out_shape, math.nan)
    pr = tool.problem(small, inputs, out)
    (launch.run_grad if small.op == "grad" else launch.run_pairwise)(pr)
    assert bm.max_rel_error(out, bm.reference(small, inputs)) < bm.tolerance(small)


def test_costs_from_bench_converts_saved_reports(tmp_path) -> None:
    tool = load_script("costs_from_bench")
    cls = {"op": "pairwise", "family": "l1", "dtype": "float32", "size": "large"}
    report = {
        "device_class": "sm_80",
        "device_name": "A GPU",
        "date": "d",
        "kermac": "k",
        "torch": "t",
        "backends": ["nvrtc", "triton"],
        "cases": [
            {
                "problem_class": cls,
                "sizes": [4096, 4096, 64],
                "results": {
                    "nvrtc": {"median_ms": 2.0, "ok": True, "error": None},
                    "triton": {"median_ms": 1.0, "ok": True, "error": None},
                },
            }
        ],
    }
    (tmp_path / "run.json").write_text(json.dumps(report))
    out = tmp_path / "sm_80.json"
    assert tool.main([str(tmp_path / "run.json"), "-o", str(out)]) == 0
    table = CostTable.load(out)
    assert table.device_class == "sm_80" and list(table.costs.values()) == [{"triton": 1.0, "nvrtc": 2.0}]
    assert [case.features for cases in table.cases.values() for case in cases] == [64]
    (tmp_path / "bad.json").write_text("{")
    assert tool.main([str(tmp_path / "bad.json"), "-o", str(out)]) == 1


def test_first_call_times_runs_cold_and_warm_processes_on_the_cpu(capsys) -> None:
    """One cold and one warm child per variant (the reference backend on CPU tensors): a row each, then medians."""
    tool = load_script("first_call_times")
    tool.main(["--backends", "torch", "--variants", "p1,gaussian", "--size", "8x3", "--warm", "1", "--device", "cpu"])
    rows = capsys.readouterr().out.splitlines()
    runs = [r.split()[:3] for r in rows[1:5]]
    assert runs == [["torch", v, k] for v in ("p1", "gaussian") for k in ("cold", "warm")]
    assert rows[0].split()[3:] == ["import", "kermac", "load", "backend", "first", "call", "second"]
    assert rows[5].startswith("cold first call: median") and rows[6].startswith("warm first call: median")
    assert "; loading the backend before it: median " in rows[5]


def test_first_call_times_precompiled_runs_a_process_after_kermac_precompile(capsys) -> None:
    """`--precompiled`: `kermac precompile` once per backend (its time printed), then a third child per variant on a
    copy of what it filled."""
    tool = load_script("first_call_times")
    argv = ["--backends", "torch", "--variants", "p1,p2", "--size", "8x3", "--warm", "1", "--device", "cpu"]
    tool.main([*argv, "--precompiled"])
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].startswith("torch: kermac precompile took ")
    runs = [r.split()[:3] for r in rows[2:8]]
    assert runs == [["torch", v, k] for v in ("p1", "p2") for k in ("cold", "warm", "precompiled")]
    assert rows[10].startswith("precompiled first call: median")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warm", "0"], "expected at least 1 warm process, got 0"),
        (["--size", "64"], "expected ROWSxFEATURES such as 4096x64, got '64'"),
        (["--size", "0x3"], "expected positive rows and features, got '0x3'"),
    ],
)
def test_first_call_times_refuses_bad_arguments(argv: list[str], message: str, capsys) -> None:
    tool = load_script("first_call_times")
    with pytest.raises(SystemExit):
        tool.parse_args(argv)
    assert message in capsys.readouterr().err


def test_first_call_times_names_a_failing_variant() -> None:
    tool = load_script("first_call_times")
    with pytest.raises(RuntimeError, match="torch no_such_kernel: the child process failed"):
        tool.main(["--backends", "torch", "--variants", "no_such_kernel", "--size", "8x3", "--device", "cpu"])


def test_half_packed_accuracy_emulates_half_sums_against_the_exact_distance() -> None:
    """Today's float32 sum is within 0.5 ulp of float16; packed partial sums of exact, representable terms lose
    nothing, and of rounded terms lose more the more terms a lane adds in float16 (a summation it would not catch
    would not show)."""
    tool = load_script("half_packed_accuracy")
    g = torch.Generator().manual_seed(0)
    x, z = torch.randn(32, 32, generator=g).half(), torch.randn(32, 32, generator=g).half()
    rows = tool.errors_in_ulps(x, z, [1, 16])
    assert rows["float32 (today)"][0] <= 0.5
    assert 0.5 < rows["half2, 1 term(s) per lane"][0] < rows["half2, 16 term(s) per lane"][0]
    small = torch.tensor([[0.25, 0.5, 1.0, 2.0]]).half()  # differences and partial sums exact in float16
    assert tool.errors_in_ulps(small, torch.zeros(1, 4).half(), [2])["half2, 2 term(s) per lane"][0] == 0
    exact = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    assert torch.equal(tool.ulps(torch.tensor([[1.0, 2.001953125]]).half(), exact), torch.tensor([[0.0, 1.0]]).double())


def test_half_packed_accuracy_prints_a_table_and_refuses_bad_arguments(capsys) -> None:
    tool = load_script("half_packed_accuracy")
    assert tool.main(["--features", "4", "--points", "3", "--lane-terms", "1,2"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| D | inputs | summation") and len(rows) == 2 + 3 * 3
    with pytest.raises(SystemExit):
        tool.main(["--features", "0"])
    assert "expected positive --features" in capsys.readouterr().err
