"""`kermac bench --fit`: the time each solver takes to a relative residual, on small CPU systems."""

from __future__ import annotations

import json

import pytest
import torch

from kermac import solvers
from kermac.cli import bench_fit, main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_rows_reach_the_tol_and_the_preconditioner_saves_iterations(capsys):
    code, out, err = run_cli(capsys, "bench", "--fit", "40,90", "--device", "cpu", "--json", "--fit-tol", "1e-6")
    assert code == 0, err
    data = json.loads(out)
    head = data["header"]
    assert head["section"] == "fit" and head["device"] == "cpu" and head["tol"] == 1e-6 and head["lambda"] == 1e-3
    rows = data["rows"]
    assert [(r["n"], r["method"], r["preconditioner"]) for r in rows] == [
        (n, m, p) for n in (40, 90) for m, p in bench_fit.SOLVERS
    ]
    for r in rows:
        assert r["error"] is None and r["why"] is None and r["ms"] > 0
        assert r["reached"] and 0 <= r["residual"] <= 1e-6
    by = {(r["n"], r["method"], r["preconditioner"]): r for r in rows}
    for n in (40, 90):
        assert by[n, "cholesky", None]["iterations"] == 0
        assert by[n, "cg", "nystrom"]["iterations"] < by[n, "cg", None]["iterations"]


def test_table_marks_a_dense_matrix_that_does_not_fit_and_a_solver_error(capsys, monkeypatch):
    monkeypatch.setattr(solvers, "dense_fits", lambda *a: False)
    solve = solvers.solve

    def failing(K, y, **kw):
        if kw["preconditioner"] == "nystrom":
            raise RuntimeError("out of memory")
        return solve(K, y, **kw)

    monkeypatch.setattr(solvers, "solve", failing)
    code, out, _ = run_cli(capsys, "bench", "--fit", "70", "--device", "cpu")
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("kermac bench --fit") and "Gaussian kernel, D = 32, λ = 0.001" in out
    cholesky, cg, nystrom, eigenpro = (line.split() for line in lines[-4:])
    assert cholesky[:3] == ["70", "cholesky", "n/a"] and "does not fit" in lines[-4]
    assert cg[:2] == ["70", "cg"] and cg[-1] == "yes"
    assert nystrom[:5] == ["70", "cg", "+", "nystrom", "n/a"] and "RuntimeError: out of memory" in lines[-2]
    assert eigenpro[:4] == ["70", "cg", "+", "eigenpro"] and eigenpro[-1] == "yes"


def test_each_row_is_timed_after_a_one_iteration_warm_up_of_the_same_solve(capsys, monkeypatch):
    """First-call costs (compilation at the row's shapes, library initialisation) stay out of the timed solve."""
    calls = []
    solve = solvers.solve

    def recorded(K, y, **kw):
        calls.append((K.shape[-1], kw["method"], kw["preconditioner"], kw["max_iter"]))
        return solve(K, y, **kw)

    monkeypatch.setattr(solvers, "solve", recorded)
    code, _, _ = run_cli(capsys, "bench", "--fit", "50", "--device", "cpu")
    assert code == 0
    solver_list = [("cholesky", None), ("cg", None), ("cg", "nystrom"), ("cg", "eigenpro")]
    assert calls == [(50, m, p, it) for m, p in solver_list for it in (1, bench_fit.MAX_ITER)]


def test_default_sizes_per_device():
    assert bench_fit.default_sizes(torch.device("cpu")) == [300, 1000]
    assert bench_fit.default_sizes(torch.device("cuda")) == [20_000, 100_000]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--fit", "0"), "expected comma-separated numbers of points >= 1"),
        (("--fit", "10,x"), "expected comma-separated numbers of points >= 1"),
        (("--fit", "--fit-lambda", "0"), "expected a finite number > 0"),
        (("--fit", "--fit-tol", "inf"), "expected a finite number > 0"),
        (("--fit", "--calls"), "not allowed with"),
        (("--fit", "--backends", "torch"), "--backends: --fit times the solvers as a user runs them"),
        (("--fit", "--write-costs", "cpu.json"), "--write-costs: --fit times the solvers"),
    ],
)
def test_bad_options(capsys, argv, needle):
    code, out, err = run_cli(capsys, "bench", "--device", "cpu", *argv)
    assert code == 2 and out == "" and needle in err
