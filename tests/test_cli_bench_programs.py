"""`kermac bench --programs`: presets beside the same kernels written as lambdas, on small CPU problems."""

from __future__ import annotations

import json

import torch

import kermac
from kermac import dsl
from kermac.cli import bench_programs, main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_rows_run_the_presets_kernels(capsys):
    code, out, err = run_cli(
        capsys, "bench", "--programs", "24,16,5", "--device", "cpu", "--backends", "reference", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["header"]["section"] == "programs" and data["header"]["sizes"] == [24, 16, 5]
    rows = data["rows"]
    assert [r["label"] for r in rows] == ["gaussian L2 24x16x5", "laplace L1 24x16x5", "laplace L2 24x16x5"]
    for r in rows:
        assert r["backend"] == "torch" and r["same_kernel"] and r["ok"] and r["error"] == {}
        assert all(r["median_ms"][n] > 0 for n in bench_programs.IMPLEMENTATIONS)
        assert all(0 <= e < 1e-6 for e in r["max_rel_err"].values())
        assert r["ratio"] > 0


def test_table_and_a_wrong_program_is_flagged(capsys, monkeypatch):
    """A lambda program that computes something else than its preset is not the same kernel, and its wrong answer
    is flagged and makes the exit code 1."""
    wrong = kermac.program(lambda x, z: abs(x - z), epilogue=lambda acc, bandwidth: 2 * dsl.exp(-acc / bandwidth))
    cases = bench_programs.cases

    def one_wrong(sizes, device):
        (case, _), *_ = cases(sizes, device)
        return [(case, wrong)]

    monkeypatch.setattr(bench_programs, "cases", one_wrong)
    code, out, _ = run_cli(capsys, "bench", "--programs", "20,10,4", "--device", "cpu", "--backends", "reference")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("kermac bench --programs")
    row = next(line for line in lines if line.startswith("gaussian L2 20x10x4"))
    *_, same, preset_err, program_err, flag = row.split()
    assert (same, flag) == ("no", "!") and float(preset_err) < 1e-6 and float(program_err) > 1e-4
    assert "result is WRONG" in out


def test_usage_errors(capsys):
    code, _, err = run_cli(capsys, "bench", "--programs", "3,4", "--device", "cpu")
    assert code == 2 and "expected three comma-separated sizes M,N,D >= 1, got '3,4'" in err
    code, _, err = run_cli(capsys, "bench", "--programs", "--write-costs", "x.json", "--device", "cpu")
    assert code == 2 and "--write-costs: a cost table is made from the timed cases" in err
    code, _, err = run_cli(capsys, "bench", "--programs", "--fit", "--device", "cpu")
    assert code == 2 and "not allowed with argument" in err


def test_default_sizes_per_device():
    assert bench_programs.default_sizes(torch.device("cpu")) == (256, 256, 32)
    assert bench_programs.default_sizes(torch.device("cuda")) == (16384, 16384, 128)
