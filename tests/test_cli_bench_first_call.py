"""`kermac bench --first-call`: each kernel variant's first call in fresh processes (CPU, the reference backend)."""

from __future__ import annotations

import json

import pytest

from kermac import benchmarking as bm
from kermac.cli import bench_first_call, main
from kermac.first_call import FirstCallTimes


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_rows_time_a_cold_and_warm_processes_per_variant(capsys, monkeypatch):
    monkeypatch.setattr(bm, "FIRST_CALL_VARIANTS", ("p1", "gaussian"))  # two variants: six child processes
    code, out, err = run_cli(
        capsys, "bench", "--first-call", "2", "--device", "cpu", "--backends", "reference", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["header"]["section"] == "first-call" and data["header"]["warm_processes"] == 2
    assert data["header"]["size"] == list(bench_first_call.size_for(__import__("torch").device("cpu")))
    rows = data["rows"]
    assert [(r["backend"], r["variant"]) for r in rows] == [("torch", "p1"), ("torch", "gaussian")]
    for r in rows:
        assert r["error"] is None and len(r["warm_s"]) == 2
        for t in (r["cold_s"], *r["warm_s"]):
            assert t["import_s"] > 1e-3 and t["load_s"] > 0 and t["first_s"] > 0 and t["second_s"] > 0


def test_table_and_a_failing_process_is_a_cell_and_the_exit_code(capsys, monkeypatch):
    monkeypatch.setattr(bm, "FIRST_CALL_VARIANTS", ("p1", "p2"))
    times = FirstCallTimes(0.05, 0.03, 0.002, 0.0004)

    def child(backend, variant, size, device, caches):
        if variant == "p2":
            raise RuntimeError("torch p2: the child process failed (1):\nTraceback ...")
        return times

    monkeypatch.setattr(bench_first_call, "time_first_call", child)
    code, out, _ = run_cli(capsys, "bench", "--first-call", "--device", "cpu", "--backends", "reference")
    assert code == 1
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("backend"))
    assert lines[header].split() == ["backend", "variant", "cold", "first", "warm", "first", "warm", "load",
                                     "import", "kermac", "second", "ms"]  # fmt: skip
    assert lines[header + 2].split() == ["reference", "p1", "0.002", "0.002", "0.030", "0.050", "0.40"]
    assert lines[header + 3].split() == ["reference", "p2", "n/a", "n/a", "n/a", "n/a", "n/a"]
    assert "n/a: reference p2: RuntimeError: torch p2: the child process failed (1)\n" in out + "\n"
    assert f"median of {bench_first_call.DEFAULT_WARM} later process(es)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--write-costs", "x.json"), "--write-costs: a cost table is made from the timed cases, not from the first"),
        (("--cases", "p1"), "--cases chooses among the timed cases, not the cases of --first-call"),
    ],
)
def test_what_the_section_refuses(capsys, argv: tuple[str, ...], message: str):
    code, out, err = run_cli(capsys, "bench", "--first-call", "--device", "cpu", *argv)
    assert code == 2 and out == "" and message in err


def test_the_number_of_warm_processes_is_positive(capsys):
    code, _, err = run_cli(capsys, "bench", "--first-call", "0")
    assert code == 2 and "argument --first-call: expected an integer >= 1, got 0" in err
