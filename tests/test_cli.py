"""The ``kermac`` command line: info, cache info/clear, bench (on the CPU here)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch

import kermac
from kermac import benchmarking as bm
from kermac import jit_cache, registry, small_calls
from kermac.cli import bench_calls, main
from kermac.cli.bench import CaseResult, Measurement, Progress, default_backends
from kermac.costs import CostTable, CostTables

REFERENCE_EP = metadata.EntryPoint(name="torch", value="kermac.reference.plugin", group="kermac.backends")

PLUGIN = '''
import torch
from kermac.backend import Availability, Backend
from kermac.hookspecs import hookimpl
from kermac.reference.backend import ReferenceBackend


class Wrong(Backend):
    """Fast and wrong: zeros for pairwise problems, refuses gradients."""
    name = "wrong"
    priority = 10

    def availability(self):
        return Availability.yes("0.0")

    def check_pairwise(self, problem):
        return None

    def pairwise(self, problem):
        problem.out.zero_()

    def check_grad(self, problem):
        return "gradients are not implemented"

    def grad(self, problem):
        raise AssertionError("never selected")


class Lazy(Wrong):
    """Writes nothing at all into out."""
    name = "lazy"

    def pairwise(self, problem):
        pass


class Right(Wrong):
    """Correct: delegates to the reference backend, gradients too."""
    name = "right"

    def pairwise(self, problem):
        ReferenceBackend().pairwise(problem)

    def check_grad(self, problem):
        return None

    def grad(self, problem):
        ReferenceBackend().grad(problem)


class Missing(Wrong):
    name = "missing"

    def availability(self):
        return Availability.no("needs the FakeAccelerator 3000")


class Picky(Wrong):
    """Available, but runs nothing."""
    name = "picky"

    def check_pairwise(self, problem):
        return "runs FakeAccelerator tensors only"

    def check_grad(self, problem):
        return "runs FakeAccelerator tensors only"


@hookimpl
def kermac_backends():
    return [Wrong(), Lazy(), Right(), Missing(), Picky()]
'''


@pytest.fixture(autouse=True)
def _isolated_cache_dir(tmp_path, monkeypatch):
    """Never let a test reach the user's real cache."""
    monkeypatch.setenv(jit_cache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv("KERMAC_BACKEND", raising=False)


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    """The reference backend plus the fakes of PLUGIN, and a plugin that fails to import."""
    (tmp_path / "kermac_cli_fake_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        REFERENCE_EP,
        metadata.EntryPoint(name="fakes", value="kermac_cli_fake_plugin", group="kermac.backends"),
        metadata.EntryPoint(name="shattered", value="kermac_cli_no_such_module_xyz", group="kermac.backends"),
    ]
    with pytest.warns(RuntimeWarning, match="shattered"):
        registry.reset(eps)
    yield
    registry.reset()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- general --------------------------------------------------------------------------------


def test_no_command_prints_usage_and_fails(capsys):
    code, _, err = run_cli(capsys)
    assert code == 2 and "info" in err and "bench" in err and "cache" in err


def test_version(capsys):
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out.strip() == f"kermac {kermac.__version__}"


def test_python_dash_m_kermac(tmp_path):
    env = {**os.environ, jit_cache.ENV_CACHE_DIR: str(tmp_path / "sub")}
    src = str(Path(jit_cache.__file__).parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "kermac", "cache", "info", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["path"] == str(tmp_path / "sub" / f"v{jit_cache.LAYOUT_VERSION}")


# -- info -----------------------------------------------------------------------------------


def test_info_text(capsys, tmp_path):
    jit_cache.default_cache().put("a" * 64, b"x" * 2048)
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert f"kermac   {kermac.__version__}" in out
    assert torch.__version__ in out
    if torch.cuda.is_available():
        assert torch.cuda.get_device_name(0) in out and "compute capability" in out
    else:
        assert "no CUDA GPU" in out
    assert any(line.split()[:2] == ["torch", "yes"] for line in out.splitlines())
    assert str(tmp_path / "cache" / f"v{jit_cache.LAYOUT_VERSION}") in out
    assert f"1 entry, {jit_cache.default_cache().info().total_bytes / 1024:.1f} KiB (capped at " in out


def test_info_names_what_the_cache_does_not_trust(capsys, tmp_path):
    cache = jit_cache.default_cache()
    cache.put("a" * 64, b"x" * 16)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (cache.path / "bb").symlink_to(elsewhere, target_is_directory=True)
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    problems = [line for line in out.splitlines() if line.strip().startswith("problem:")]
    assert len(problems) == 1 and str(cache.path / "bb") in problems[0]


def test_info_names_the_cost_tables_auto_ranks_by(capsys, tmp_path):
    registry.reset([REFERENCE_EP], costs=CostTables(tmp_path))
    try:
        code, out, _ = run_cli(capsys, "info")
        assert code == 0 and "  cpu     none: auto ranks by priority" in out
        CostTable("cpu", "a test CPU", "written by a test", {}).write(tmp_path / "cpu.json")
        registry.reset([REFERENCE_EP], costs=CostTables(tmp_path))
        code, out, _ = run_cli(capsys, "info", "--json")
        assert json.loads(out)["cost_tables"]["cpu"] == {"device": "a test CPU", "source": "written by a test"}
        (tmp_path / "cpu.json").write_text("[]")
        registry.reset([REFERENCE_EP], costs=CostTables(tmp_path))
        code, out, _ = run_cli(capsys, "info")
        assert code == 0 and f"cpu     unusable: cost table {tmp_path / 'cpu.json'}: expected a JSON object" in out
    finally:
        registry.reset()


def test_info_reports_unavailable_and_broken_backends(capsys, fake_plugins):
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert rows["missing"].split()[1] == "no" and "needs the FakeAccelerator 3000" in rows["missing"]
    assert rows["shattered"].split()[1] == "BROKEN" and "kermac_cli_no_such_module_xyz" in rows["shattered"]
    assert rows["wrong"].split()[1:5] == ["yes", "10", "fakes", "0.0"]


def test_info_json(capsys, fake_plugins):
    code, out, _ = run_cli(capsys, "info", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["kermac"] == kermac.__version__ and data["torch"] == torch.__version__
    assert len(data["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    backends = {b["name"]: b for b in data["backends"]}
    assert (
        backends["torch"]["available"] and backends["torch"]["priority"] == 0 and backends["torch"]["plugin"] == "torch"
    )
    assert backends["missing"] == {
        "name": "missing",
        "available": False,
        "reason": "needs the FakeAccelerator 3000",
        "priority": 10,
        "plugin": "fakes",
        "distribution": None,
        "version": None,
        "broken": False,
    }
    assert backends["shattered"]["broken"] and not backends["shattered"]["available"]
    info = jit_cache.default_cache().info()
    assert data["cache"] == {
        "path": str(info.path),
        "count": 0,
        "total_bytes": 0,
        "max_bytes": info.max_bytes,
        "problems": [],
    }


# -- cache ----------------------------------------------------------------------------------


def test_cache_info_and_clear(capsys, tmp_path):
    cache = jit_cache.default_cache()
    for i in range(3):
        key = jit_cache.cache_key(source=f"k{i}", compiler="nvrtc", compiler_version="12.8", arch="sm_90")
        cache.put(key, bytes(1000), {"compiler": "nvrtc", "arch": "sm_90", "build_seconds": 0.25})
    total = cache.info().total_bytes
    code, out, _ = run_cli(capsys, "cache", "info")
    assert code == 0 and str(cache.path) in out and "3 entries" in out
    code, out, _ = run_cli(capsys, "cache", "info", "-v")
    assert code == 0 and sum("sm_90" in line and "0.25 s" in line for line in out.splitlines()) == 3
    code, out, _ = run_cli(capsys, "cache", "info", "--json")
    data = json.loads(out)
    assert data["count"] == 3 and data["total_bytes"] == total and len(data["entries"]) == 3
    assert all(e["size"] == 1000 and e["meta"]["arch"] == "sm_90" for e in data["entries"])
    code, out, _ = run_cli(capsys, "cache", "clear")
    assert code == 0 and out.strip() == f"Removed 3 entries ({total / 1024:.1f} KiB) from {cache.path}"
    assert cache.info().count == 0
    code, out, _ = run_cli(capsys, "cache", "clear", "--json")
    assert json.loads(out) == {"path": str(cache.path), "removed": 0, "freed_bytes": 0}


def test_cache_needs_an_action(capsys):
    code, _, err = run_cli(capsys, "cache")
    assert code == 2 and "ACTION" in err


def _strict_json(text: str) -> object:
    """``text`` parsed as strict JSON: NaN and infinities are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("created", ["NaN", "Infinity", "-Infinity", "1e20", "1e400", '"noon"'])
def test_cache_info_survives_a_bad_sidecar_and_prints_strict_json(capsys, created):
    cache = jit_cache.default_cache()
    key = jit_cache.cache_key(source="k", compiler="nvrtc", compiler_version="12.8", arch="sm_90")
    cache.put(key, bytes(100), {"compiler": "nvrtc", "arch": "sm_90", "build_seconds": 0.5})
    sidecar = cache._meta_path(key)
    document = sidecar.read_text()
    sidecar.write_text(document.replace('"build_seconds": 0.5', f'"build_seconds": NaN, "extra": [{created}]'))
    sidecar.write_text(re.sub(r'"created": [^,\n]+', f'"created": {created}', sidecar.read_text()))
    code, out, _ = run_cli(capsys, "cache", "info", "-v")
    assert code == 0
    (row,) = [line for line in out.splitlines() if line.startswith(key[:16])]
    assert row.split()[-2:] == ["?", "?"] and "sm_90" in row  # build time and date unknown
    code, out, _ = run_cli(capsys, "cache", "info", "--json")
    assert code == 0
    (entry,) = _strict_json(out)["entries"]
    assert entry["meta"]["created"] is None and entry["meta"]["build_seconds"] is None


def test_cache_info_reports_the_cap_and_problems(capsys, tmp_path, monkeypatch):
    cache = jit_cache.default_cache()
    key = "ab" + "0" * 62
    cache.put(key, bytes(100))
    shard = cache._payload_path(key).parent
    elsewhere = tmp_path / "elsewhere"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere, target_is_directory=True)
    code, out, _ = run_cli(capsys, "cache", "info")
    assert code == 0 and "0 entries" in out and "limit 2.0 GiB" in out
    assert f"problem: {shard} is a symbolic link" in out
    monkeypatch.setenv(jit_cache.ENV_CACHE_MAX_BYTES, "0")
    code, out, _ = run_cli(capsys, "cache", "info", "--json")
    data = _strict_json(out)
    assert data["max_bytes"] is None and data["count"] == 0 and data["entries"] == []
    assert len(data["problems"]) == 1 and str(shard) in data["problems"][0]
    code, out, _ = run_cli(capsys, "cache", "clear")
    assert code == 0 and not shard.exists() and (elsewhere / (key + ".bin")).exists()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_cache_clear_refuses_a_directory_others_can_write(capsys):
    cache = jit_cache.default_cache()
    key = "cd" + "0" * 62
    cache.put(key, bytes(100))
    cache.root.chmod(0o777)
    code, out, err = run_cli(capsys, "cache", "clear")
    assert code == 1 and out == ""
    assert str(cache.root) in err and "0o777" in err and "writable by its group or by others" in err
    assert cache._payload_path(key).exists()
    code, out, _ = run_cli(capsys, "cache", "info")
    assert code == 0 and "0 entries" in out and "problem: kermac refuses to use" in out


# -- bench ----------------------------------------------------------------------------------

FAST = ("--quick", "--warmup", "0", "--repeat", "1", "--device", "cpu")


def test_bench_quick_table(capsys):
    code, out, err = run_cli(capsys, "bench", "--quick", "--device", "cpu")
    assert code == 0, out
    assert "small cases on the CPU" in out or torch.cuda.is_available()
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("case"))
    assert header.split()[:8] == ["case", "reference", "ms", "torch.cdist", "ms", "speed-up", "best", "reference"]
    for case in bm.CPU_QUICK_CASES:
        row = next(line for line in lines if line.startswith(case.label + " "))
        cells = row[len(case.label) :].split()
        assert float(cells[0]) > 0 and cells[2:4] == ["-", "-"]  # the reference is never best: no speed-up
        assert float(cells[4]) <= 1e-5  # the reference backend's error column
    assert "reference = kermac's pure-PyTorch reference backend (backend='torch')" in out
    assert "!" not in out
    # Not a TTY under pytest: one progress line per step.
    steps = [line for line in err.splitlines() if line.startswith("[")]
    assert len(steps) == 3 * len(bm.CPU_QUICK_CASES) and steps[-1].startswith(f"[{len(steps)}/{len(steps)}]")
    # The progress lines name what they time as the table does: "reference", never a bare "torch".
    assert all(not line.endswith(": torch") for line in steps)
    assert sum(line.endswith(": reference") for line in steps) == len(bm.CPU_QUICK_CASES)


def test_bench_backends_accepts_the_reference_label(capsys):
    code, out, err = run_cli(capsys, "bench", "--quick", "--device", "cpu", "--backends", "reference", "--json")
    assert code == 0, err
    assert "torch" in json.loads(out)["backends"]


def test_bench_small_runs_the_small_cases(capsys):
    code, out, _ = run_cli(capsys, "bench", "--small", "--warmup", "0", "--repeat", "1", "--device", "cpu", "--json")
    assert code == 0
    assert [c["label"] for c in json.loads(out)["cases"]] == [c.label for c in bm.SMALL_CASES]
    code, _, err = run_cli(capsys, "bench", "--small", "--quick", "--device", "cpu")
    assert code == 2 and "not allowed with" in err


def test_bench_json(capsys):
    code, out, _ = run_cli(capsys, "bench", *FAST, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["device"] == "cpu" and data["backends"] == ["torch"] and data["baseline"] == "torch.cdist"
    assert data["kermac"] == kermac.__version__ and data["repeat"] == 1 and data["warmup"] == 0
    assert [c["label"] for c in data["cases"]] == [c.label for c in bm.CPU_QUICK_CASES]
    for c in data["cases"]:
        ref = c["results"]["torch"]
        assert ref["ok"] and ref["max_rel_err"] < 1e-5 and len(ref["times_ms"]) == 1 and ref["median_ms"] > 0
        base = c["results"]["torch.cdist"]
        if c["op"] == "grad" and c["p"] != 2:
            assert base["error"] and base["median_ms"] is None
        else:
            assert base["ok"] and base["max_rel_err"] < 1e-4
        assert c["best"] is None and c["speedup"] is None  # the reference backend is never best
    assert data["reference_backend"] == "torch" and data["device_class"] == "cpu"
    classes = [c["problem_class"] for c in data["cases"]]
    assert classes == [dataclasses.asdict(c.problem_class) for c in bm.CPU_QUICK_CASES]


def test_bench_cases_runs_the_cases_named(capsys):
    first, second = bm.CPU_QUICK_CASES[:2]
    code, out, _ = run_cli(capsys, "bench", *FAST, "--json", "--cases", f"{second.label}; nothing else")
    assert code == 0
    assert [c["label"] for c in json.loads(out)["cases"]] == [second.label] and first.label != second.label
    code, _, err = run_cli(capsys, "bench", *FAST, "--cases", "no such case")
    assert code == 2 and "--cases: no case of this run's section matches 'no such case'" in err
    assert first.label in err
    code, _, err = run_cli(capsys, "bench", "--calls", "10", "--device", "cpu", "--cases", "cdist")
    assert code == 2 and "--cases chooses among the timed cases, not the cases of --calls" in err


def test_bench_checks_large_cases_on_a_corner(capsys, monkeypatch):
    monkeypatch.setattr(bm, "CORNER_WORK", 1)
    code, out, _ = run_cli(capsys, "bench", *FAST, "--json")
    assert code == 0
    cases = json.loads(out)["cases"]
    assert cases and all(c["checked"] == "corner" and c["results"]["torch"]["max_rel_err"] < 1e-5 for c in cases)
    code, out, _ = run_cli(capsys, "bench", *FAST)
    assert code == 0 and "cases past 2^0 multiply-adds are checked on a corner" in out


def test_bench_flags_wrong_answers_and_explains_na(capsys, fake_plugins):
    code, out, _ = run_cli(capsys, "bench", *FAST, "--backends", "wrong,lazy,right,torch", "-v")
    assert code == 1  # a wrong answer fails the run
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("case")).split()
    label = bm.CPU_QUICK_CASES[0].label
    cells = next(line for line in lines if line.startswith(label + " "))[len(label) :].split()
    names = ["wrong", "lazy", "right", "reference", "torch.cdist"]  # no auto: it could choose 'picky', not named
    assert header[1:11:2] == names
    err_cells = cells[-7:]  # "<err> !" for wrong, "nan !" for lazy, then right, reference, torch.cdist
    assert err_cells[0:2] == ["1.0e+00", "!"] and err_cells[2:4] == ["nan", "!"]
    assert float(err_cells[4]) < 1e-5 and float(err_cells[5]) < 1e-5 and float(err_cells[6]) < 1e-4
    assert cells[6] == "right"  # best = fastest *correct* backend, never the reference
    assert "that result is WRONG" in out
    assert "/ wrong: UnsupportedProblemError: backend 'wrong' cannot run this gradient problem" in out


def test_bench_json_marks_wrong_answers(capsys, fake_plugins):
    code, out, _ = run_cli(capsys, "bench", *FAST, "--backends", "wrong,right", "--json")
    assert code == 1
    first = json.loads(out)["cases"][0]
    assert first["results"]["wrong"]["ok"] is False and first["results"]["wrong"]["max_rel_err"] == pytest.approx(1.0)
    assert first["results"]["right"]["ok"] is True and first["best"] == "right"
    assert "auto" not in first["results"]  # auto could choose backends not named (lazy, picky)


def test_auto_over_best_is_autos_time_over_the_fastest_backends():
    case = bm.CPU_QUICK_CASES[0]
    times = {"right": 2.0, "other": 4.0, "auto": 2.1, "torch.cdist": 1.0}
    result = CaseResult(case, {name: Measurement([ms], 0.0) for name, ms in times.items()})
    assert result.best(["right", "other"]) == "right"
    assert result.auto_over_best(["right", "other"]) == pytest.approx(1.05)
    assert result.auto_over_best(["other"]) == pytest.approx(2.1 / 4.0)
    del result.results["auto"]
    assert result.auto_over_best(["right", "other"]) is None


def test_bench_times_auto_only_where_it_chooses_among_the_timed_backends(capsys, fake_plugins, tmp_path, monkeypatch):
    """Every available backend timed (the default): an auto column, never a backend nor best, never in a cost
    table; a --backends list that leaves one out, one backend besides the reference, or KERMAC_BACKEND: none."""
    _, out, _ = run_cli(capsys, "bench", *FAST, "--json")
    report = json.loads(out)
    first = report["cases"][0]
    assert "auto" in first["results"] and "auto" not in report["backends"] and first["best"] != "auto"
    assert first["results"]["auto"]["ok"] is False and first["auto_over_best"] is None  # auto runs 'wrong'
    path = tmp_path / "cpu.json"
    run_cli(capsys, "bench", *FAST, "--write-costs", str(path))
    assert all("auto" not in ms for ms in CostTable.load(path).costs.values())
    for argv in (("--backends", "right,lazy"), ("--backends", "right,torch")):
        _, out, _ = run_cli(capsys, "bench", *FAST, *argv, "--json")
        assert "auto" not in json.loads(out)["cases"][0]["results"], argv
    monkeypatch.setenv("KERMAC_BACKEND", "right")
    _, out, _ = run_cli(capsys, "bench", *FAST, "--json")
    assert "auto" not in json.loads(out)["cases"][0]["results"]


def test_bench_default_skips_unavailable_and_broken_backends(capsys, fake_plugins):
    code, out, _ = run_cli(capsys, "bench", *FAST, "--json")
    data = json.loads(out)
    assert set(data["backends"]) == {"torch", "wrong", "lazy", "right", "picky"}
    assert data["skipped"] == {"missing": "needs the FakeAccelerator 3000", "shattered": data["skipped"]["shattered"]}
    assert code == 1


def test_default_backends_leave_the_reference_out_on_a_gpu_only_when_another_can_run():
    def status(name: str, available: bool = True, broken: bool = False) -> registry.BackendStatus:
        return registry.BackendStatus(name, available, None if available else "no driver", 0, name, None, broken)

    statuses = [status("nvrtc"), status("triton", available=False), status("torch"), status("bad", False, True)]
    backends, skipped = default_backends(statuses, torch.device("cuda"))
    assert backends == ["nvrtc"]
    assert skipped["triton"] == "no driver" and skipped["bad"] == "no driver" and "reference" in skipped["torch"]
    assert default_backends(statuses, torch.device("cpu"))[0] == ["nvrtc", "torch"]
    assert default_backends([status("nvrtc", False), status("torch")], torch.device("cuda"))[0] == ["torch"]


def test_bench_explicit_backends_note_the_others(capsys, fake_plugins):
    code, out, _ = run_cli(capsys, "bench", *FAST, "--backends", "right", "--json")
    data = json.loads(out)
    assert code == 0 and data["backends"] == ["right"]
    assert (
        data["skipped"]["torch"] == "not in --backends"
        and data["skipped"]["missing"] == "needs the FakeAccelerator 3000"
    )


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--device", "tpu"), "--device"),
        (("--backends", "nope"), "unknown backend(s) nope"),
        (("--repeat", "0"), "--repeat"),
        (("--warmup", "-1"), "--warmup"),
        (("--max-seconds", "-1"), "--max-seconds"),
        (("--max-seconds", "nan"), "--max-seconds"),
        (("--quick", "--full"), "not allowed with"),
    ],
)
def test_bench_rejects_bad_options(capsys, argv, needle):
    code, _, err = run_cli(capsys, "bench", *argv)
    assert code == 2 and needle in err


def test_best_is_never_the_reference_backend():
    """Where the reference backend is the fastest kermac backend timed, best names the fastest other one."""
    case = bm.CPU_QUICK_CASES[0]
    times = {"torch": 1.0, "right": 5.0, "torch.cdist": 0.01}
    result = CaseResult(case, {name: Measurement([ms], 0.0) for name, ms in times.items()})
    assert result.best(["torch", "right"]) == "right"
    assert result.speedup(["torch", "right"]) == pytest.approx(0.01 / 5.0)
    assert result.best(["torch"]) is None and result.speedup(["torch"]) is None


def test_the_floor_column_divides_the_best_time_by_the_floor():
    from kermac.cli.bench import _floor_cells

    case = bm.FEW_FEATURE_CASES[0]
    result = CaseResult(case, {"right": Measurement([0.72], 0.0), "torch.cdist": Measurement([2.0], 0.0)})
    assert _floor_cells(result, ["right"]) == ["0.36", "2.00x"]
    assert _floor_cells(CaseResult(bm.CPU_QUICK_CASES[0], result.results), ["right"]) == ["-", "-"]
    assert _floor_cells(result, ["torch"]) == ["0.36", "-"]  # no kermac backend but the reference: no best


def test_bench_fails_when_a_named_backend_is_unavailable(capsys, fake_plugins):
    code, out, err = run_cli(capsys, "bench", *FAST, "--backends", "right,missing")
    assert code == 2 and out == ""
    assert "kermac bench: backend 'missing' is unavailable here: needs the FakeAccelerator 3000" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_bench_nvrtc_without_a_gpu_says_why(capsys):
    registry.reset()
    code, out, err = run_cli(capsys, "bench", "--quick", "--backends", "nvrtc")
    assert code == 2 and out == ""
    assert "kermac bench: backend 'nvrtc' is unavailable here: " in err
    assert "no CUDA device is visible" in err or "cuda-core is not installed" in err


def test_bench_fails_when_a_named_backend_runs_no_case(capsys, fake_plugins):
    code, out, err = run_cli(capsys, "bench", *FAST, "--backends", "right,picky")
    assert code == 1 and "right" in out  # the table is printed, then the failure
    assert "kermac bench: backend 'picky' ran none of the cases: UnsupportedProblemError: " in err
    assert "runs FakeAccelerator tensors only" in err


def test_bench_full_needs_a_gpu(capsys):
    code, out, err = run_cli(capsys, "bench", "--full", "--device", "cpu")
    assert code == 2 and out == ""
    assert "kermac bench: --full: the peer-table cases need a CUDA GPU" in err
    with pytest.raises(ValueError, match="full: the peer-table cases need a CUDA device, got cpu"):
        bm.cases_for("cpu", full=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the default device on a machine without CUDA")
def test_bench_full_without_a_gpu_is_an_error(capsys):
    code, _, err = run_cli(capsys, "bench", "--full")
    assert code == 2 and "no CUDA GPU is visible" in err


def test_bench_write_costs_makes_the_table_auto_uses(capsys, fake_plugins, tmp_path):
    """``--write-costs`` writes the run as a cost table; with it, auto picks the backend it measured fastest."""
    path = tmp_path / "tables" / "cpu.json"
    path.parent.mkdir()
    code, _, err = run_cli(capsys, "bench", *FAST, "--backends", "right,torch", "--write-costs", str(path))
    assert code == 0 and f"cost table written to {path}" in err
    table = CostTable.load(path)
    assert table.device_class == "cpu"
    assert set(table.costs) == {c.problem_class for c in bm.CPU_QUICK_CASES}
    assert all(set(ms) == {"right", "torch"} for ms in table.costs.values())
    # A table in which the reference backend is cheaper than 'right' for every class:
    entries = {c: {"right": 2.0, "torch": 1.0} for c in table.costs}
    CostTable("cpu", "test", "test", entries).write(path)
    registry.reset(
        [REFERENCE_EP, metadata.EntryPoint(name="fakes", value="kermac_cli_fake_plugin", group="kermac.backends")],
        costs=CostTables(path.parent),
    )
    case = bm.CPU_QUICK_CASES[0]
    x, z = case.make_inputs()
    assert torch.equal(kermac.cdist(x, z, case.p), kermac.cdist(x, z, case.p, backend="torch"))  # not 'wrong'


def test_bench_write_costs_reports_an_unwritable_path(capsys, fake_plugins, tmp_path):
    path = tmp_path / "no" / "such" / "dir.json"
    code, _, err = run_cli(capsys, "bench", *FAST, "--backends", "right", "--write-costs", str(path))
    assert code == 1 and "kermac bench: --write-costs: " in err and str(path) in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_bench_cuda_without_gpu_is_an_error(capsys):
    code, _, err = run_cli(capsys, "bench", "--device", "cuda")
    assert code == 2 and "no CUDA GPU" in err


def test_progress_rewrites_one_line_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = Progress(2, stream)
    progress.step("a long first step")
    progress.step("short")
    progress.close()
    text = stream.getvalue()
    assert "\n" not in text
    assert text.startswith(
        "\r[1/2] a long first step\r[2/2] short" + " " * (len("[1/2] a long first step") - len("[2/2] short"))
    )
    assert text.endswith("\r")


# -- bench --calls ---------------------------------------------------------------------------

CALLS = ("--calls", "3", "--repeat", "2", "--warmup", "1", "--device", "cpu")
CALLS_PLUGIN = """
from kermac.hookspecs import hookimpl
from kermac_cli_fake_plugin import Missing, Right


@hookimpl
def kermac_backends():
    return [Right(), Missing()]
"""


@pytest.fixture
def right_and_missing(tmp_path, monkeypatch):
    """The reference backend, a correct backend ('right') and one installed but unavailable here ('missing')."""
    (tmp_path / "kermac_cli_fake_plugin.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / "kermac_cli_calls_plugin.py").write_text(textwrap.dedent(CALLS_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.reset(
        [REFERENCE_EP, metadata.EntryPoint(name="calls", value="kermac_cli_calls_plugin", group="kermac.backends")]
    )
    yield
    registry.reset()


def _calls_rows() -> list[tuple[str, str]]:
    return [(c.label, out) for c in small_calls.call_cases("cpu") for out in bench_calls.OUTS]


def test_bench_calls_json(capsys):
    code, out, err = run_cli(capsys, "bench", *CALLS, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["section"] == "calls" and data["device"] == "cpu" and data["baseline"] == "torch.cdist"
    assert data["calls_per_run"] == 3 and data["repeat"] == 2 and data["warmup"] == 1
    assert data["kermac"] == kermac.__version__ and "torch" in data["backends"] and "auto" not in data["backends"]
    assert [(r["label"], r["out"]) for r in data["calls"]] == _calls_rows()
    ops = [(c.op, list(c.sizes), c.p, c.kernel) for c in small_calls.call_cases("cpu")]
    assert [(r["op"], r["sizes"], r["p"], r["kernel"]) for r in data["calls"][::2]] == ops
    for row in data["calls"]:
        timed = ["torch", "auto"] + (["torch.cdist"] if row["out"] == "new" else [])
        assert set(timed) <= set(row["results"]) and ("torch.cdist" in row["results"]) == (row["out"] == "new")
        for name in timed:
            m = row["results"][name]
            assert m["error"] is None and m["ok"] and m["max_rel_err"] < row["tolerance"]
            assert m["calls"] == 3 and len(m["runs_us"]) == 2 and all(us > 0 for us in m["runs_us"])
            assert m["us_per_call"] == min(m["runs_us"])
        assert row["fastest"] == "torch" and row["reference_error"] is None
        auto, ref = row["results"]["auto"]["us_per_call"], row["results"]["torch"]["us_per_call"]
        assert row["auto_minus_fastest_us"] == pytest.approx(auto - ref)
    for name in set(data["backends"]) - {"torch"}:  # installed GPU backends cannot run without a GPU
        assert all(r["results"][name]["us_per_call"] is None for r in data["calls"]) or torch.cuda.is_available()


def test_bench_calls_table(capsys):
    code, out, err = run_cli(capsys, "bench", *CALLS, "--backends", "reference")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("kermac bench --calls  ")
    assert "the best of 2 runs of up to 3 back-to-back calls and one synchronisation, after 1 warm-up call(s)" in out
    head = next(line for line in lines if line.startswith("call "))
    assert head.split("  ")[0:1] == ["call"] and [c.strip() for c in re.split(r"\s{2,}", head)] == [
        "call",
        "out",
        "reference µs",
        "auto µs",
        "auto - fastest µs",
        "torch.cdist µs",
    ]
    for label, kind in _calls_rows():
        row = next(line for line in lines if re.match(rf"{re.escape(label)}\s+{kind}\s", line))
        cells = row[len(label) :].split()
        assert cells[0] == kind and float(cells[1]) > 0 and float(cells[2]) > 0
        assert re.fullmatch(r"[+-]\d+\.\d", cells[3])  # auto - fastest, signed
        assert cells[4] == "-" if kind == "given" else float(cells[4]) > 0
    assert "!" not in out and "n/a" not in out
    # One progress line per case for its inputs, then one per implementation and output.
    steps = [line for line in err.splitlines() if line.startswith("[")]
    assert len(steps) == len(small_calls.call_cases("cpu")) * (1 + 2 + 3)


def test_bench_calls_shows_an_unavailable_backend_as_na_with_its_reason(capsys, right_and_missing):
    code, out, err = run_cli(capsys, "bench", *CALLS, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["backends"] == ["right", "missing", "torch"] and data["skipped"] == {}  # the registry's order
    for row in data["calls"]:
        missing = row["results"]["missing"]
        assert missing["us_per_call"] is None and missing["runs_us"] == [] and missing["ok"]
        assert missing["error"] == "backend unavailable: needs the FakeAccelerator 3000"
        assert row["results"]["right"]["us_per_call"] > 0 and row["fastest"] in ("torch", "right")
    code, out, _ = run_cli(capsys, "bench", *CALLS)
    assert code == 0
    label = small_calls.call_cases("cpu")[0].label
    cells = next(line for line in out.splitlines() if line.startswith(label))[len(label) :].split()
    assert cells[0] == "given" and cells[2] == "n/a"  # right, missing, reference
    assert f"{2 * len(small_calls.call_cases('cpu'))} cell(s) n/a: run with -v for the reasons" in out
    code, out, _ = run_cli(capsys, "bench", *CALLS, "-v")
    assert code == 0 and "  missing: backend unavailable: needs the FakeAccelerator 3000 (every row)" in out


def test_bench_calls_with_named_backends_times_only_those(capsys, right_and_missing):
    code, out, _ = run_cli(capsys, "bench", *CALLS, "--backends", "right", "--json")
    data = json.loads(out)
    assert code == 0 and data["backends"] == ["right"]
    assert data["skipped"] == {"torch": "not in --backends", "missing": "needs the FakeAccelerator 3000"}
    assert all(
        set(r["results"]) == {"right", "auto"} | ({"torch.cdist"} if r["out"] == "new" else set())
        for r in data["calls"]
    )
    code, out, err = run_cli(capsys, "bench", *CALLS, "--backends", "right,missing")
    assert code == 2 and out == "" and "backend 'missing' is unavailable here: needs the FakeAccelerator 3000" in err


def test_bench_calls_flags_wrong_answers(capsys, fake_plugins):
    code, out, err = run_cli(capsys, "bench", *CALLS, "--backends", "wrong,lazy,right,picky", "--json")
    assert code == 1
    data = json.loads(out)
    first = data["calls"][0]
    assert first["results"]["wrong"]["ok"] is False and first["results"]["wrong"]["max_rel_err"] == pytest.approx(1.0)
    assert first["results"]["lazy"]["ok"] is False and first["results"]["lazy"]["max_rel_err"] is None  # NaN
    assert first["fastest"] == "right"  # never a wrong answer, however fast
    grad = next(r for r in data["calls"] if r["op"] == "grad")
    assert grad["results"]["wrong"]["error"].startswith("UnsupportedProblemError: backend 'wrong' cannot run")
    assert "kermac bench: backend 'picky' ran none of the calls: UnsupportedProblemError: " in err
    code, out, _ = run_cli(capsys, "bench", *CALLS, "--backends", "wrong,right")
    label = small_calls.call_cases("cpu")[0].label
    row = next(line for line in out.splitlines() if line.startswith(label))
    assert code == 1 and row[len(label) :].split()[2] == "!" and "that result is WRONG" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--calls", "0"), "--calls"),
        (("--calls", "--small"), "not allowed with"),
        (("--calls", "--quick"), "not allowed with"),
        (("--calls", "--write-costs", "cpu.json"), "--write-costs: a cost table is made from the timed cases"),
    ],
)
def test_bench_calls_rejects_bad_options(capsys, argv, needle):
    code, out, err = run_cli(capsys, "bench", "--device", "cpu", *argv)
    assert code == 2 and out == "" and needle in err


def test_bench_calls_defaults_per_device():
    assert bench_calls.defaults(torch.device("cuda", 0)) == (1000, 5, 100)
    assert bench_calls.defaults(torch.device("cpu")) == (200, 5, 10)


def test_calls_columns_add_installed_unavailable_backends_unless_named():
    def status(name: str, available: bool = True, broken: bool = False) -> registry.BackendStatus:
        return registry.BackendStatus(name, available, None if available else "no driver", 0, name, None, broken)

    statuses = {
        s.name: s for s in [status("nvrtc", False), status("triton"), status("torch"), status("bad", False, True)]
    }
    skipped = {"nvrtc": "no driver", "bad": "no driver", "triton": "opt-in backend"}
    named, left = bench_calls.columns(["torch"], skipped, statuses, named=False)
    assert named == ["nvrtc", "torch"] and left == {"bad": "no driver", "triton": "opt-in backend"}
    assert bench_calls.columns(["torch"], skipped, statuses, named=True) == (["torch"], skipped)


def test_call_row_auto_minus_fastest():
    case = small_calls.call_cases("cpu")[0]

    def row(**us: float | None) -> bench_calls.CallRow:
        results = {n: bench_calls.CallMeasurement([] if v is None else [v + 1.0, v], 3, 0.0) for n, v in us.items()}
        return bench_calls.CallRow(case, "given", results)

    r = row(a=10.0, b=7.0, auto=8.5)
    assert r.fastest(["a", "b"]) == "b" and r.auto_minus_fastest(["a", "b"]) == pytest.approx(1.5)
    r.results["b"].max_rel_err = 1.0  # a wrong answer is never the fastest
    assert r.fastest(["a", "b"]) == "a" and r.auto_minus_fastest(["a", "b"]) == pytest.approx(-1.5)
    assert row(a=None, auto=1.0).auto_minus_fastest(["a"]) is None
    assert row(a=1.0, auto=None).auto_minus_fastest(["a"]) is None
