"""``tools/product_bench.py``: the blocked route and the fused product compute the same K @ v, refusals are rows;
``tools/product_split_bench.py``: a few-rows product split and in one launch agree;
``tools/product_blocked_sweep.py``: the blocked route at each block size agrees with the user's blocks.

Without a GPU the script runs small problems on the CPU (a smoke test); the timings it prints there
mean nothing and are not checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import load_script

script = load_script("product_bench")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke test; the GPU machine runs the real sizes")
def test_fused_and_blocked_agree_and_a_refusal_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rows.json"
    argv = ["--n", "70", "--d", "3,5", "--c", "1,4", "--backends", "torch,nvrtc", "--block", "32", "--repeat", "1"]
    assert script.main([*argv, "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert {(r["kernel"], r["d"], r["c"]) for r in rows} == {
        (k, d, c) for k in ("gaussian", "laplace_l1") for d in (3, 5) for c in (1, 4)
    }
    for row in rows:
        assert row["routes"]["torch"]["rel_err"] < 1e-5
        assert "nvrtc" in row["routes"]["nvrtc"]["refused"]  # no GPU here: NVRTC is unavailable, said in the row
    printed = capsys.readouterr().out
    assert "| gaussian | 70 | 3 | 1 |" in printed and "refused" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke test; the GPU machine runs the real sizes")
def test_the_predictor_gradient_routes_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--gradient``: the derivative matrix + ``cdist_grad`` and ``predictor_gradient`` give the same Jacobian
    (the blocked route over columns that are not a multiple of the block)."""
    path = tmp_path / "rows.json"
    argv = ["--n", "45", "--d", "3", "--c", "1,3", "--backends", "torch", "--block", "16", "--repeat", "1"]
    assert script.main([*argv, "--gradient", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert {(r["kernel"], r["c"]) for r in rows} == {(k, c) for k in ("gaussian", "laplace_l1") for c in (1, 3)}
    for row in rows:
        assert row["routes"]["torch"]["rel_err"] < 1e-5
        slope = row["routes"].get(script.SLOPE_BLOCKS)
        assert (slope is not None) == (row["kernel"] == "gaussian")  # the Gaussian's third route, blocks of 16 rows
        assert slope is None or slope["rel_err"] < 1e-5
    printed = capsys.readouterr().out
    assert "predictor gradient" in printed and "| slope blocks ms (×, err) |" in printed
    assert "| laplace_l1 | 45 | 3 | 1 |" in printed and " - |" in printed  # no third route for Laplace-L1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kernels", "nope"], "--kernels: unknown preset(s) nope"),
        (["--kernels", "cauchy", "--gradient"], "--gradient times laplace_l1, gaussian only, got cauchy"),
        (["--n", "0"], "expected positive integers"),
    ],
)
def test_bad_arguments_are_named(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        script.main(["--n", "8", *argv] if argv[0] != "--n" else argv)
    assert done.value.code == 2 and message in capsys.readouterr().err


split_script = load_script("product_split_bench")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke test; the GPU machine runs the real sizes")
def test_the_split_bench_compares_both_routes(capsys: pytest.CaptureFixture[str]) -> None:
    """``tools/product_split_bench.py``: one row per case, both routes agreeing with the float64 product (and with
    ``--gradient`` the float64 predictor gradient; on the CPU nothing is split: S = 1)."""
    for gradient in ([], ["--gradient"]):
        argv = ["--cases", "gaussian:5:300:3:1,laplace_l1:3:200:4:2", "--repeat", "1", *gradient]
        assert split_script.main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        rows = [line for line in lines if line.startswith("| gaussian") or line.startswith("| laplace")]
        assert len(rows) == 2
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert cells[1] == "1"
            assert all(float(e) < 1e-5 for e in cells[5].split(" / "))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke test; the GPU machine runs the real sizes")
def test_the_blocked_sweep_agrees_with_the_users_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    from kermac import product_blocked

    sweep = load_script("product_blocked_sweep")  # imports `product_bench`, loaded above as `script`
    applies = product_blocked.applies
    assert sweep.main(["--cases", "90:40:3,70:130:1", "--exponents", "9,20", "--repeat", "1"]) == 0
    assert product_blocked.applies is applies and product_blocked.BLOCK_ELEMENTS == 1 << 28  # restored
    printed = capsys.readouterr().out
    assert "N=90 D=40 C=3: user 16384-row blocks" in printed and "2^9:" in printed and "(fused)" not in printed


def test_the_forced_sweep_times_a_tensor_core_program_and_its_fused_product(capsys: pytest.CaptureFixture[str]) -> None:
    from kermac import product_blocked

    sweep = load_script("product_blocked_sweep")
    applies = product_blocked.applies
    args = ["--cases", "80:33:2", "--kernel", "gaussian", "--exponents", "10", "--repeat", "1", "--force"]
    assert sweep.main(args) == 0
    assert product_blocked.applies is applies and product_blocked.BLOCK_ELEMENTS == 1 << 28  # restored
    printed = capsys.readouterr().out
    assert "N=80 D=33 C=2: user 16384-row blocks" in printed and "2^10:" in printed and "; fused:" in printed
