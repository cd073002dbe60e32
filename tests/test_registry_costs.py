"""``auto`` ranks by the cost table of the problem's device and class (kermac.costs), else by preference."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch

import kermac
from kermac import costs, presets, registry
from kermac.costs import (
    CostTable,
    CostTableError,
    CostTables,
    MeasuredCase,
    ProblemClass,
    classify,
    table_from_bench,
)
from kermac.lowering import cdist_program, grad_program
from kermac.programs import GradProgram

PLUGIN = """
    from kermac.hookspecs import hookimpl
    from kermac.reference.backend import ReferenceBackend

    CALLS = []

    def make(backend_name, backend_priority, refuses_float64=False):
        class Fake(ReferenceBackend):
            name = backend_name
            priority = backend_priority

            def check_pairwise(self, problem):
                if refuses_float64 and str(problem.dtype) == "torch.float64":
                    return "float64 is not supported"
                return None

            def pairwise(self, problem):
                CALLS.append(self.name)
                super().pairwise(problem)

            def grad(self, problem):
                CALLS.append(self.name)
                super().grad(problem)

        return Fake()

    @hookimpl
    def kermac_backends():
        return [make("high", 50, refuses_float64=True), make("low", 10)]
"""
THIRD = """
    from kermac.hookspecs import hookimpl
    from kermac.reference.backend import ReferenceBackend

    CALLS = []

    class Third(ReferenceBackend):
        name = "third"
        priority = 1

        def pairwise(self, problem):
            CALLS.append(self.name)
            super().pairwise(problem)

    @hookimpl
    def kermac_backends():
        return [Third()]
"""

X = torch.randn(5, 20)  # pairwise, float32, D = 20: not narrow; small
L1_SMALL = ProblemClass("pairwise", "l1", "float32", "small")


def _entry_point(name: str, module: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=module, group="kermac.backends")


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "kermac_costs_fakes.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / "kermac_costs_third.py").write_text(textwrap.dedent(THIRD))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("KERMAC_BACKEND", raising=False)
    yield tmp_path
    for name in ("kermac_costs_fakes", "kermac_costs_third"):
        sys.modules.pop(name, None)
    registry.reset()


def write_table(directory: Path, entries: dict[ProblemClass, dict[str, float]], cls: str = "cpu") -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{cls}.json"
    CostTable(cls, "test device", "written by a test", entries).write(path)
    return path


def use(plugin_dir: Path, tables: Path, *names: str) -> list[str]:
    """The registry with the reference backend and the named fake modules, costs from ``tables``; their CALLS."""
    eps = [_entry_point("torch", "kermac.reference.plugin")]
    eps += [_entry_point(n, n) for n in names]
    registry.reset(eps, costs=CostTables(tables))
    calls = []
    for name in names:
        __import__(name)
        calls = sys.modules[name].CALLS  # the last module's list (the tests use one module each)
    return calls


def test_auto_picks_the_cheapest_listed_backend(plugin_dir: Path) -> None:
    tables = plugin_dir / "tables"
    write_table(tables, {L1_SMALL: {"high": 2.0, "low": 1.0}})
    calls = use(plugin_dir, tables, "kermac_costs_fakes")
    kermac.cdist(X, X, p=1.0)
    assert calls == ["low"]  # the table: low is cheaper, whatever the priorities (high: 50, low: 10)
    kermac.cdist(X, X, p=2.0)
    assert calls == ["low", "high"]  # l2: no entry, so the preference order
    kermac.cdist(X.double(), X.double(), p=1.0)
    assert calls == ["low", "high", "low"]  # float64: another class, by preference; high refuses it


def test_a_listed_backend_that_refuses_falls_through_to_the_next(plugin_dir: Path) -> None:
    tables = plugin_dir / "tables"
    f64 = ProblemClass("pairwise", "l1", "float64", "small")
    write_table(tables, {f64: {"high": 1.0, "low": 2.0}})
    calls = use(plugin_dir, tables, "kermac_costs_fakes")
    kermac.cdist(X.double(), X.double(), p=1.0)
    assert calls == ["low"]


def test_measured_backends_rank_before_unmeasured_ones(plugin_dir: Path) -> None:
    tables = plugin_dir / "tables"
    write_table(tables, {L1_SMALL: {"low": 3.0, "nvrtc": 0.1}})  # nvrtc is not registered here
    calls = use(plugin_dir, tables, "kermac_costs_fakes")
    kermac.cdist(X, X, p=1.0)
    assert calls == ["low"]  # listed, so ahead of high (priority 50, no entry)


@pytest.mark.parametrize("layout", ["no directory", "empty directory", "another device class"])
def test_without_a_table_for_the_device_auto_keeps_the_preference_order(plugin_dir: Path, layout: str) -> None:
    tables = plugin_dir / "tables"
    if layout == "empty directory":
        tables.mkdir()
    elif layout == "another device class":
        write_table(tables, {L1_SMALL: {"low": 1.0}}, cls="sm_90")
    calls = use(plugin_dir, tables, "kermac_costs_fakes")
    kermac.cdist(X, X, p=1.0)
    assert calls == ["high"]  # priority 50 before 10, as before cost tables


def test_a_third_party_backend_without_an_entry_runs_when_it_is_the_only_one(plugin_dir: Path) -> None:
    tables = plugin_dir / "tables"
    write_table(tables, {L1_SMALL: {"nvrtc": 1.0, "triton": 2.0, "torch": 9.0}})
    eps = [_entry_point("third", "kermac_costs_third")]  # no reference backend: third is alone
    registry.reset(eps, costs=CostTables(tables))
    import kermac_costs_third

    kermac.cdist(X, X, p=1.0)
    assert kermac_costs_third.CALLS == ["third"]


def test_kermac_backend_still_overrides_auto(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = plugin_dir / "tables"
    write_table(tables, {L1_SMALL: {"low": 1.0}})
    calls = use(plugin_dir, tables, "kermac_costs_fakes")
    monkeypatch.setenv("KERMAC_BACKEND", "high")
    kermac.cdist(X, X, p=1.0)
    assert calls == ["high"]


def test_auto_ranks_by_the_cases_around_the_problem(plugin_dir: Path) -> None:
    """Within a class, a measured D ranks by its case, a D between two by their times interpolated in log D,
    a D beyond the measured ones by the nearest case."""
    tables = plugin_dir / "tables"
    tables.mkdir()
    few, many = MeasuredCase(16, 2**20, {"low": 1.0, "high": 2.0}), MeasuredCase(256, 2**24, {"low": 2.0, "high": 1.0})
    CostTable("cpu", "test device", "test", {L1_SMALL: {"low": 1.4, "high": 1.4}}, {L1_SMALL: (few, many)}).write(
        tables / "cpu.json"
    )
    calls = use(plugin_dir, tables, "kermac_costs_fakes")
    kermac.cdist(X, X, p=1.0)  # D = 20: 0.08 of the way (in log D) from 16 to 256
    kermac.cdist(torch.randn(5, 100), torch.randn(5, 100), p=1.0)  # D = 100: 0.66 of the way
    assert calls == ["low", "high"]
    table = CostTables(tables).table("cpu")
    assert table.ms(L1_SMALL, 16, 2**30) == few.ms and table.ms(L1_SMALL, 256, 1) == many.ms
    assert table.ms(L1_SMALL, 4, 2**10) == few.ms and table.ms(L1_SMALL, 1024, 2**30) == many.ms  # beyond
    assert table.ms(L1_SMALL, 64, 2**22) == pytest.approx({"low": 2**0.5, "high": 2**0.5})  # half way
    assert table.ms(ProblemClass("pairwise", "l2", "float32", "small"), 20, 2**20) == {}


def test_cases_at_one_d_rank_by_the_nearest_work_and_gradients_by_their_features() -> None:
    l1 = ProblemClass("pairwise", "l1", "float32", "large")
    g1 = ProblemClass("grad", "l1", "float32", "large")
    cases = {
        l1: (MeasuredCase(32, 2**30, {"a": 1.0, "b": 2.0}), MeasuredCase(32, 2**36, {"a": 2.0, "b": 1.0})),
        g1: (
            MeasuredCase(3, 2**34, {"a": 4.0, "b": 1.0}),  # few features, many centres: b
            MeasuredCase(3, 2**36, {"a": 16.0, "b": 2.0}),
            MeasuredCase(768, 2**35, {"a": 1.0, "b": 4.0}),  # many features: a
        ),
    }
    table = CostTable("cpu", "d", "s", {l1: {"a": 1.0}, g1: {"a": 1.0}}, cases)
    assert table.ms(l1, 32, 2**31) == cases[l1][0].ms and table.ms(l1, 32, 2**35) == cases[l1][1].ms
    assert table.ms(g1, 3, 2**37) == cases[g1][1].ms and table.ms(g1, 3, 2**30) == cases[g1][0].ms
    assert table.ms(g1, 1024, 2**34) == cases[g1][2].ms
    assert table.ms(g1, 48, 2**35) == pytest.approx({"a": 2.0, "b": 2.0})  # half way in log features
    assert CostTable.from_json(json.loads(json.dumps(table.to_json())), "x") == table


def test_format_2_gradient_cases_rank_by_their_work(tmp_path: Path) -> None:
    g1 = ProblemClass("grad", "l1", "float32", "large")
    cases = {g1: (MeasuredCase(None, 2**30, {"a": 1.0, "b": 4.0}), MeasuredCase(None, 2**34, {"a": 4.0, "b": 1.0}))}
    data = {**CostTable("cpu", "d", "s", {g1: {"a": 1.0}}, cases).to_json(), "format": 2}
    (tmp_path / "cpu.json").write_text(json.dumps(data))
    table = CostTables(tmp_path).table("cpu")
    assert table.cases == cases
    assert table.to_json()["format"] == 2  # written as read: its gradient cases have no features
    assert CostTable.from_json(json.loads(json.dumps(table.to_json())), "x") == table
    assert table.ms(g1, 3, 2**32) == pytest.approx({"a": 2.0, "b": 2.0})  # half way in log work
    assert list(table.ms(g1, 768, 2**33)) == ["b", "a"]


def test_a_format_1_table_still_reads(tmp_path: Path) -> None:
    data = {**_valid(), "format": 1}
    (tmp_path / "cpu.json").write_text(json.dumps(data))
    table = CostTables(tmp_path).table("cpu")
    assert table.costs == {L1_SMALL: {"low": 1.0}} and table.ms(L1_SMALL, 20, 2**10) == {"low": 1.0}


def _valid() -> dict:
    return CostTable("cpu", "test device", "test", {L1_SMALL: {"low": 1.0}}).to_json()


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.update(format=4), "format: expected one of 1, 2, 3, got 4"),
        (lambda d: d.pop("device"), "device: expected a string, got None"),
        (lambda d: d.update(costs={}), "costs: expected a list of entries, got dict"),
        (lambda d: d["costs"][0].update(op="conv"), "costs[0].op: expected one of pairwise, grad, got 'conv'"),
        (lambda d: d["costs"][0].update(family="l7"), "costs[0].family: expected one of l1, l2, lp"),
        (lambda d: d["costs"][0].update(size="narrow", op="grad"), "costs[0].size: expected one of small, large"),
        (lambda d: d["costs"][0].update(dtype="int8"), "costs[0].dtype: expected one of float16"),
        (lambda d: d["costs"][0].update(ms={}), "costs[0].ms: expected a non-empty object"),
        (lambda d: d["costs"][0].update(ms={"low": -1}), "costs[0].ms['low']: expected a positive finite number"),
        (lambda d: d["costs"][0].update(ms={"low": "fast"}), "costs[0].ms['low']: expected a positive finite"),
        (lambda d: d["costs"].append(dict(d["costs"][0])), "costs[1]: a second entry for"),
        (lambda d: d["costs"][0].update(cases={}), "costs[0].cases: expected a list of cases, got dict"),
        (lambda d: (d.update(format=1), d["costs"][0].update(cases=[])), "costs[0].cases: a format 1 table has no"),
        (lambda d: d["costs"][0].update(cases=[3]), "costs[0].cases[0]: expected an object, got int"),
        (
            lambda d: d["costs"][0].update(cases=[{"work": 8, "ms": {"low": 1.0}}]),
            "costs[0].cases[0].features: expected a positive integer (D of a pairwise class, N of a gradient), "
            "got None",
        ),
        (
            lambda d: d["costs"][0].update(cases=[{"features": 4, "work": 2.5, "ms": {"low": 1.0}}]),
            "costs[0].cases[0].work: expected a positive integer (multiply-adds), got 2.5",
        ),
        (
            lambda d: d["costs"][0].update(cases=[{"features": 4, "work": 8, "ms": {"low": 0}}]),
            "costs[0].cases[0].ms['low']: expected a positive finite number",
        ),
        (
            lambda d: d["costs"][0].update(op="grad", cases=[{"features": None, "work": 8, "ms": {"low": 1.0}}]),
            "costs[0].cases[0].features: expected a positive integer (D of a pairwise class, N of a gradient), "
            "got None",
        ),
        (
            lambda d: (
                d.update(format=2),
                d["costs"][0].update(op="grad", cases=[{"features": 4, "work": 8, "ms": {"low": 1.0}}]),
            ),
            "costs[0].cases[0].features: expected null for a gradient class of a format 2 table, got 4",
        ),
        (lambda d: d.update(device_class="sm_90"), "device_class 'sm_90' does not match the file name"),
    ],
)
def test_a_malformed_table_is_an_error_naming_the_file_and_the_fault(plugin_dir: Path, edit, needle: str) -> None:
    tables = plugin_dir / "tables"
    tables.mkdir()
    data = _valid()
    edit(data)
    path = tables / "cpu.json"
    path.write_text(json.dumps(data))
    use(plugin_dir, tables, "kermac_costs_fakes")
    with pytest.raises(CostTableError, match=r"cost table .*cpu\.json: .*" + _escape(needle)):
        kermac.cdist(X, X, p=1.0)


def test_a_table_that_is_not_json_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text("{not json")
    with pytest.raises(CostTableError, match=f"cost table {_escape(str(path))}: cannot be read: Expecting"):
        CostTables(tmp_path).table("cpu")


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_the_shipped_tables_load_and_name_their_device_class() -> None:
    shipped = sorted(costs.DIRECTORY.glob("*.json"))
    assert [p.stem for p in shipped] == ["sm_90"]
    for path in shipped:
        assert CostTables().table(path.stem).device_class == path.stem


def test_the_shipped_sm_90_table_is_a_benchmark_run_of_both_gpu_backends() -> None:
    """The shipped sm_90 table is `kermac bench`'s output on an sm_90 GPU, timing both GPU backends
    on the float32 classes of the benchmark (large, small and few-feature problems), with its cases."""
    table = CostTables().table("sm_90")
    assert table.source.startswith("kermac bench --json") and table.device.startswith("NVIDIA H")
    classes = {(c.op, c.family, c.size) for c in table.costs}
    assert {("pairwise", f, s) for f in ("l1", "l2", "lp") for s in ("small", "large")} <= classes
    assert {("grad", f, "large") for f in ("l1", "l2", "lp")} <= classes
    assert {("pairwise", f, "narrow") for f in ("l1", "l2", "lp")} <= classes
    for cls, ms in table.costs.items():
        assert set(ms) == {"nvrtc", "triton"} and all(v > 0 for v in ms.values())
        assert table.cases[cls] and all(set(case.ms) == {"nvrtc", "triton"} for case in table.cases[cls])


# -- classes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("program", "family"),
    [
        (cdist_program(0.0), "l0"),
        (cdist_program(1.0), "l1"),
        (cdist_program(2.0), "l2"),
        (cdist_program(1.3), "lp"),
        (cdist_program(None), "lp"),
        (cdist_program(math.inf), "linf"),
        (cdist_program(2.0, skip_epilogue=True), "l2"),
        (presets.gaussian.lower(), "l2"),
        (presets.matern52.lower(regularized=True), "l2"),
        (presets.laplace_l1.lower(), "l1"),
        (presets.laplace_lp.lower(), "lp"),
        (presets.dot_product.lower(), "other"),
        (grad_program(1.0), "l1"),
        (grad_program(2.0), "l2"),
        (grad_program(1.5), "lp"),
    ],
)
def test_program_families(program, family: str) -> None:
    sizes = (64, 64, 4, 32) if isinstance(program, GradProgram) else (64, 64, 32)
    assert classify(program, torch.float32, sizes).family == family


def test_size_classes() -> None:
    l2 = cdist_program(2.0)
    assert classify(l2, torch.float32, (4096, 4096, 15)).size == "narrow"
    assert classify(l2, torch.float32, (4096, 4096, 16)).size == "large"  # 2^28 multiply-adds
    assert classify(l2, torch.float32, (2048, 4096, 16)).size == "large"  # 2^27
    assert classify(l2, torch.float32, (2048, 4095, 16)).size == "small"
    assert classify(l2, torch.float32, (2048, 4095, 16), batch=2).size == "large"
    assert classify(grad_program(1.0), torch.float32, (256, 3, 4, 8)).size == "small"  # no narrow class
    assert classify(grad_program(1.0), torch.float32, (16384, 3, 4, 50000)).size == "large"
    assert classify(l2, torch.float64, (8, 8, 32)).dtype == "float64"


def test_device_classes() -> None:
    assert costs.device_class(torch.device("cpu")) == "cpu"
    assert costs.device_class(torch.device("meta")) is None


# -- tables from benchmark reports ----------------------------------------------------------------


def _report(cases: list[dict], backends=("a", "b"), device_class="sm_90") -> dict:
    return {"device_class": device_class, "device_name": "GPU", "date": "d", "kermac": "k", "torch": "t",
            "backends": list(backends), "cases": cases}  # fmt: skip


def _case(cls: ProblemClass, sizes=None, **results: float | None) -> dict:
    def result(ms: float | None) -> dict:
        if ms is None:
            return {"median_ms": None, "ok": True, "error": "RuntimeError: out of memory"}
        if ms < 0:
            return {"median_ms": -ms, "ok": False, "error": None}  # a wrong answer
        return {"median_ms": ms, "ok": True, "error": None}

    cls_json = {"op": cls.op, "family": cls.family, "dtype": cls.dtype, "size": cls.size}
    sizes = sizes or ((64, 64, 4, 32) if cls.op == "grad" else (64, 64, 32))
    return {"problem_class": cls_json, "sizes": list(sizes), "results": {n: result(ms) for n, ms in results.items()}}


def test_table_from_bench_takes_geometric_means_of_correct_runs() -> None:
    l2 = ProblemClass("pairwise", "l2", "float32", "large")
    lp = ProblemClass("pairwise", "lp", "float32", "large")
    g1 = ProblemClass("grad", "l1", "float32", "large")
    cases = [_case(l2, a=1.0, b=2.0), _case(l2, a=4.0, b=2.0), _case(lp, a=1.0, b=None), _case(g1, a=-1.0, b=5.0)]
    cases.append({**_case(l2, a=1.0, b=1.0), "results": {"a": {"median_ms": 1.0, "ok": True, "error": None}}})
    table = table_from_bench([_report(cases[:4]), _report([cases[4]], backends=("a",))])
    assert table.device_class == "sm_90" and table.device == "GPU"
    assert table.costs[l2]["a"] == pytest.approx((1.0 * 4.0 * 1.0) ** (1 / 3))
    assert "b" not in table.costs[l2]  # b was not timed on one case of the class
    assert table.costs[lp] == {"a": 1.0}  # b failed there
    assert table.costs[g1] == {"b": 5.0}  # a was wrong there
    assert CostTable.from_json(json.loads(json.dumps(table.to_json())), "x") == table


def test_table_from_bench_keeps_each_case_of_a_class() -> None:
    l1 = ProblemClass("pairwise", "l1", "float32", "large")
    g2 = ProblemClass("grad", "l2", "float32", "large")
    cases = [
        _case(l1, (100, 100, 3), a=1.0, b=2.0),
        _case(l1, (100, 100, 300), a=8.0, b=2.0),
        _case(l1, (100, 100, 3), a=4.0, b=None),  # the first case again, b failed there
        _case(g2, (8, 8, 2, 4), a=1.0, b=3.0),
    ]
    table = table_from_bench([_report(cases[:2]), _report(cases[2:])])
    assert table.cases[l1] == (MeasuredCase(3, 30000, {"a": 2.0}), MeasuredCase(300, 3000000, {"b": 2.0, "a": 8.0}))
    assert table.cases[g2] == (MeasuredCase(8, 512, {"a": 1.0, "b": 3.0}),)  # a gradient's features: N
    assert table.ms(l1, 3, 1) == {"a": 2.0} and table.ms(l1, 400, 10**6) == {"b": 2.0, "a": 8.0}
    assert table.ms(l1, 30, 10**5) == pytest.approx({"a": 4.0})  # half way in log D; b has no time at D = 3
    assert table.ms(g2, 8, 10**9) == {"a": 1.0, "b": 3.0}
    assert CostTable.from_json(json.loads(json.dumps(table.to_json())), "x") == table


def test_table_from_bench_needs_one_device_class() -> None:
    with pytest.raises(CostTableError, match="one device class"):
        table_from_bench([_report([]), _report([], device_class="sm_80")])
    with pytest.raises(CostTableError, match="at least one report"):
        table_from_bench([])


def test_problem_class_of_a_problem_is_classify_of_its_parts() -> None:
    from kermac.problem import grad_problem, pairwise_problem

    x, z = torch.randn(3, 1, 200, 16), torch.randn(2, 300, 16)  # batch 3 × 2, M 200, N 300, D 16
    pr = pairwise_problem(cdist_program(1.0), x, z, out=None, hypers={})
    assert costs.problem_class(pr) == classify(pr.program, torch.float32, (200, 300, 16), batch=6)
    assert costs.problem_class(pr).size == "small"
    a, b, c, d = torch.randn(64, 4096), torch.randn(512, 64), torch.randn(16, 64), torch.randn(512, 4096)
    gp = grad_problem(grad_program(2.0), a, b, c, d, out=None, hypers={})
    assert costs.problem_class(gp) == ProblemClass("grad", "l2", "float32", "large")  # 4096·512·16·64 = 2^31
