"""The benchmark harness: cases, inputs, the timed callables, error metric, timing and rotation."""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from pathlib import Path

import pytest
import torch

from kermac import benchmarking as bm
from kermac.benchmarking import BenchCase

PEERS_MD = Path(__file__).resolve().parents[2] / "shared" / "PEERS.md"


# -- independent float64 references (plain broadcasting) ------------------------------------


def brute_cdist(x: torch.Tensor, z: torch.Tensor, p: float) -> torch.Tensor:
    diff = (x.double()[:, None, :] - z.double()[None, :, :]).abs()
    return diff.pow(p).sum(-1).pow(1.0 / p)


def brute_grad(a, b, c, d, p: float) -> torch.Tensor:
    a, b, c, d = (t.double() for t in (a, b, c, d))
    t = d[:, None, :] - b[:, :, None]  # [N, K, M]
    f = torch.sign(t) * t.abs().pow(p - 1.0)
    return torch.einsum("ok,km,nkm->onm", c, a, f)


def brute(case: BenchCase, inputs) -> torch.Tensor:
    if case.op == "grad":
        return brute_grad(*inputs, case.p)
    dist = brute_cdist(*inputs, case.p)
    if case.op == "cdist":
        return dist
    if case.op == "program":
        return 1.0 / (1.0 + dist.square() / case.bandwidth**2)
    if case.kernel == "laplace":
        return torch.exp(-dist / case.bandwidth)
    return torch.exp(-dist.square() / (2 * case.bandwidth**2))


SMALL = [
    BenchCase("cdist", (13, 7, 5), 1.0),
    BenchCase("cdist", (13, 7, 5), 1.3),
    BenchCase("cdist", (13, 7, 5), 2.0),
    BenchCase("kernel", (9, 11, 6), 1.0, "laplace"),
    BenchCase("kernel", (9, 11, 6), 2.0, "laplace"),
    BenchCase("kernel", (9, 11, 6), 1.5, "laplace"),
    BenchCase("kernel", (9, 11, 6), 2.0, "gaussian"),
    BenchCase("program", (9, 11, 6)),
    BenchCase("grad", (10, 6, 3, 8), 1.0),
    BenchCase("grad", (10, 6, 3, 8), 1.5),
    BenchCase("grad", (10, 6, 3, 8), 2.0),
]


# -- BenchCase ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(op="matmul", sizes=(1, 1, 1)), "op"),
        (dict(op="cdist", sizes=(1, 1)), "sizes"),
        (dict(op="grad", sizes=(1, 1, 1)), "sizes"),
        (dict(op="cdist", sizes=(1, 0, 1)), "sizes"),
        (dict(op="cdist", sizes=(4, 4, 4), p=0.0), "p"),
        (dict(op="cdist", sizes=(4, 4, 4), p=math.inf), "p"),
        (dict(op="kernel", sizes=(4, 4, 4)), "kernel"),
        (dict(op="kernel", sizes=(4, 4, 4), kernel="rbf"), "kernel"),
        (dict(op="kernel", sizes=(4, 4, 4), p=1.0, kernel="gaussian"), "p"),
        (dict(op="cdist", sizes=(4, 4, 4), kernel="laplace"), "kernel"),
        (dict(op="program", sizes=(4, 4, 4), kernel="laplace"), "kernel"),
        (dict(op="program", sizes=(4, 4, 4), p=1.0), "p"),
    ],
)
def test_case_validation_names_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=f"^{needle}:"):
        BenchCase(**kwargs)


def test_make_inputs_shapes_dtype_and_seeds():
    case = BenchCase("grad", (10, 6, 3, 8), 1.5)
    a, b, c, d = case.make_inputs(0)
    assert [t.shape for t in (a, b, c, d)] == [(8, 10), (6, 8), (3, 8), (6, 10)]
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (a, b, c, d))
    assert all(torch.equal(s, t) for s, t in zip(case.make_inputs(0), (a, b, c, d), strict=True))
    assert not torch.equal(case.make_inputs(1)[0], a)
    assert case.out_shape == (3, 6, 10) and case.make_out().shape == (3, 6, 10)
    assert case.input_bytes == 4 * (80 + 48 + 24 + 60)
    x, z = BenchCase("cdist", (13, 7, 5)).make_inputs()
    assert x.shape == (13, 5) and z.shape == (7, 5)


def test_labels():
    assert BenchCase("cdist", (8192, 8192, 256), 1.3).label == "cdist 8192x8192x256 p=1.3"
    assert BenchCase("kernel", (16, 16, 4), 1.0, "laplace").label == "laplace L1 16x16x4"
    assert BenchCase("grad", (4096, 256, 16, 4096), 2.0).label == "grad M=4096 N=256 O=16 K=4096 p=2"
    assert BenchCase("program", (300, 200, 40)).label == "program 300x200x40"


def test_user_program_is_the_cauchy_kernel_with_one_hyperparameter():
    program = bm.user_program()
    assert program == bm.user_program() and hash(program) == hash(bm.user_program())  # equal programs share plans
    assert program.hypers == ("gamma",) and program.reduction == "sum" and not program.uses_diag
    assert BenchCase("program", (4, 4, 4)).program == program


def test_bandwidth_keeps_kernel_values_order_one():
    for p in (1.0, 2.0):
        case = BenchCase("kernel", (256, 256, 128), p, "laplace")
        k = brute(case, case.make_inputs())
        assert 0.05 < k.median() < 0.8


def test_on_moves_the_case():
    case = BenchCase("cdist", (3, 3, 3), peers={"x": 1.0}, target_ms=2.0).on("cuda:1")
    assert case.device == "cuda:1" and case.peers == {"x": 1.0} and case.target_ms == 2.0


# -- case lists -----------------------------------------------------------------------------


def test_case_lists_are_consistent():
    assert len(bm.PEERS_CASES) == 15
    assert all(c.target_ms is not None and c.peers and c.device == "cuda" for c in bm.PEERS_CASES)
    assert set(bm.GPU_CASES) < set(bm.PEERS_CASES) and set(bm.GPU_QUICK_CASES) <= set(bm.GPU_CASES)
    assert {c.op for c in bm.GPU_CASES} == {c.op for c in bm.CPU_CASES} == {"cdist", "kernel", "grad"}
    assert all(c.sizes[0] == 1024 for c in bm.CPU_CASES if c.op != "grad")
    assert {c.p for c in bm.CPU_CASES if c.op == "cdist"} == {1.0, 1.3, 2.0}
    assert [c.device for c in bm.cases_for("cpu")] == ["cpu"] * len(bm.CPU_CASES)
    assert [c.label for c in bm.cases_for("cpu", quick=True)] == [c.label for c in bm.CPU_QUICK_CASES]
    full = [c.label for c in bm.cases_for("cuda:0", full=True)]
    listed = (
        *bm.PEERS_CASES,
        *bm.FEW_FEATURE_CASES,
        *bm.FEW_FEATURE_GRADIENT_CASES,
        *bm.SINGLE_OUTPUT_GRADIENT_CASES,
        *bm.HALF_CASES,
    )
    assert full == [c.label for c in listed] and len(set(full)) == len(full)
    assert all(c.device == "cuda:0" for c in bm.cases_for("cuda:0"))
    assert len(bm.cases_for("cuda")) == len(bm.GPU_CASES)
    small = bm.cases_for("cuda:0", small=True)
    assert [c.label for c in small] == [c.label for c in bm.SMALL_CASES] and {c.device for c in small} == {"cuda:0"}
    assert {c.op for c in small} == {"cdist", "kernel", "grad"} and all(c.sizes[0] == 256 for c in small)
    assert [c.label for c in bm.cases_for("cpu", small=True)] == [c.label for c in bm.SMALL_CASES]


def test_few_feature_cases_are_bound_by_writing_their_output_or_their_powers():
    """D ≤ 16 for p = 1, 1.3, 2: the floor of p = 1 and 2 is the output's bytes over the H100's write rate (0.36 ms
    for 1 GiB); a fractional p's is the larger of that and two special-function operations per term (2.19 ms at
    D = 16); the target is 1.1× the floor; the problems below 16 features form the cost tables' narrow class."""
    assert {(c.sizes[2], c.p) for c in bm.FEW_FEATURE_CASES} == {(d, p) for d in (3, 8, 16) for p in (1.0, 1.3, 2.0)}
    for case in bm.FEW_FEATURE_CASES:
        assert case.op == "cdist" and case.device == "cuda" and case.sizes[:2] == (16384, 16384)
        terms = 16384**2 * case.sizes[2]
        sfu = 2 * terms / (31.4e9 / 8)
        want = 0.36 if case.p in (1.0, 2.0) else max(0.36, sfu)
        assert case.floor_ms == pytest.approx(want, rel=1e-3), case.label
        assert case.floor_ms >= 2 * terms / 31.4e9  # never below the float32 instructions of its terms
        assert case.target_ms == pytest.approx(1.1 * case.floor_ms, abs=1e-3)
        assert (case.problem_class.size == "narrow") == (case.sizes[2] < 16)
    assert max(c.floor_ms for c in bm.FEW_FEATURE_CASES) == pytest.approx(2.19, abs=0.01)


def test_few_feature_gradient_cases_place_the_gradient_classes_by_their_features():
    """Gradients of 3 and 32 features, 1, 4 and 16 outputs, p = 1, 1.5 and 2, against 50 000 centres: each in its
    family's large class, at the features a cost table ranks gradients by (N of (M, N, O, K))."""
    from kermac.costs import shape_of

    cases = bm.FEW_FEATURE_GRADIENT_CASES
    assert {(c.sizes[1], c.sizes[2], c.p) for c in cases} == {
        (n, o, p) for n in (3, 32) for o in (1, 4, 16) for p in (1.0, 1.5, 2.0)
    }
    for case in cases:
        assert case.op == "grad" and case.device == "cuda" and (case.sizes[0], case.sizes[3]) == (16384, 50000)
        assert case.problem_class.size == "large" and case.floor_ms is None and case.target_ms is None
        assert case.problem_class.family == {1.0: "l1", 1.5: "lp", 2.0: "l2"}[case.p]
        assert shape_of(case.sizes)[0] == case.sizes[1]


def test_single_output_gradient_cases_are_bound_by_one_matrix_product():
    """The p = 2 gradient with O = 1 at 8192 × 768 × 8192 and 8192 × 8192 × 768: the floor is 3×TF32's three
    products of 2·M·N·K flop at the H100's measured 386 TFLOP/s (0.80 ms), the target a fifth of the fused
    kernel's time; the floor stays below the target (the goal is reachable) and above the time of writing out."""
    assert [c.sizes for c in bm.SINGLE_OUTPUT_GRADIENT_CASES] == [(8192, 768, 1, 8192), (8192, 8192, 1, 768)]
    for case in bm.SINGLE_OUTPUT_GRADIENT_CASES:
        m, n, o, k = case.sizes
        assert case.op == "grad" and case.p == 2.0 and o == 1 and case.device == "cuda"
        assert case.floor_ms == pytest.approx(6 * m * n * k / 386e9, abs=1e-3) == pytest.approx(0.80, abs=0.01)
        assert case.floor_ms < case.target_ms < 8 and o * n * m * 4 / bm.H100_WRITE_BYTES_PER_MS < case.floor_ms


def test_half_cases_take_half_inputs_and_outputs_and_their_rounding_as_tolerance():
    """float16 and bfloat16 at 8192² × 256: inputs are the float32 draws rounded (so the rows of a case are the same
    values in every dtype), the output and the cost class take the dtype, the tolerance is four times the output's
    rounding, and PyTorch's baseline exists for p = 2 only."""
    assert [(c.dtype, c.p) for c in bm.HALF_CASES] == [("float16", 2.0), ("bfloat16", 2.0), ("float16", 1.0)]
    assert all(c.device == "cuda" and c.sizes == (8192, 8192, 256) and c.target_ms for c in bm.HALF_CASES)
    small = dataclasses.replace(bm.HALF_CASES[1], sizes=(5, 7, 3), device="cpu")
    assert small.label == "cdist 5x7x3 p=2 bfloat16" and small.input_bytes == 2 * (5 + 7) * 3
    inputs, wide = small.make_inputs(seed=3), dataclasses.replace(small, dtype="float32").make_inputs(seed=3)
    assert all(
        t.dtype == torch.bfloat16 and torch.equal(t, w.to(torch.bfloat16)) for t, w in zip(inputs, wide, strict=True)
    )
    assert small.make_out().dtype == torch.bfloat16 and small.problem_class.dtype == "bfloat16"
    assert bm.tolerance(small) == 2**-6 and bm.tolerance(bm.HALF_CASES[0]) == 2**-9
    assert bm.torch_fn(small) is not None and bm.torch_fn(bm.HALF_CASES[2]) is None  # no half torch.cdist for p = 1
    with pytest.raises(ValueError, match="dtype: expected one of float32, float16, bfloat16, got 'float64'"):
        dataclasses.replace(small, dtype="float64")
    with pytest.raises(
        ValueError, match="dtype: float16 inputs are benchmarked for ops cdist and kernel, got op 'grad'"
    ):
        bm.BenchCase("grad", (4, 5, 2, 3), 2.0, dtype="float16")


def test_a_half_case_runs_and_checks_against_its_float64_reference_on_the_cpu():
    """The reference backend on a small float16 case writes a float16 output within the case's tolerance of the
    float64 reference of the same (rounded) inputs."""
    case = dataclasses.replace(bm.HALF_CASES[0], sizes=(40, 33, 20), device="cpu")
    inputs, out = case.make_inputs(seed=1), case.make_out()
    bm.kermac_fn(case, bm.REFERENCE_BACKEND)(*inputs, out)
    assert out.dtype == torch.float16 and 0 < bm.max_rel_error(out, bm.reference(case, inputs)) <= bm.tolerance(case)


def _peers_rows() -> dict[str, list[list[str]]]:
    """The three timing tables of PEERS.md, as rows of cells, by their heading."""
    tables: dict[str, list[list[str]]] = {}
    heading = None
    for line in PEERS_MD.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif line.startswith("|") and heading and not set(line) <= set("|-: "):
            tables.setdefault(heading, []).append([c.strip() for c in line.strip("|").split("|")])
    return tables


def _num(cell: str) -> float | None:
    m = re.match(r"[≤≈ ]*([0-9.]+)", cell)
    return float(m.group(1)) if m else None


@pytest.mark.skipif(not PEERS_MD.exists(), reason="shared/PEERS.md is not beside this checkout")
def test_peers_cases_transcribe_peers_md():
    tables = _peers_rows()
    cdist_rows = next(v for k, v in tables.items() if k.startswith("cdist"))[1:]
    cdist_cases = [c for c in bm.PEERS_CASES if c.op == "cdist"]
    assert len(cdist_rows) == len(cdist_cases)
    for row, case in zip(cdist_rows, cdist_cases, strict=True):
        dims, p = row[0].split(", p=")
        m, d = dims.split("\u00b2\u00d7")  # "30000" + superscript 2 + multiplication sign + "1024"
        assert case.sizes == (int(m), int(m), int(d)) and case.p == float(p)
        assert case.target_ms == _num(row[5]) and case.floor_ms == _num(row[4])
        assert sorted(case.peers.values()) == sorted(_num(c) for c in row[1:4])
    kernel_rows = next(v for k, v in tables.items() if k.startswith("Fused"))[1:]
    kernel_cases = [c for c in bm.PEERS_CASES if c.op == "kernel"]
    assert [(c.p, c.target_ms) for c in kernel_cases] == [
        (float(re.search(r"L(\d)", r[0]).group(1)), _num(r[3])) for r in kernel_rows
    ]
    grad_rows = next(v for k, v in tables.items() if k.startswith("cdist_grad"))[1:]
    grad_cases = [c for c in bm.PEERS_CASES if c.op == "grad"]
    assert len(grad_rows) == len(grad_cases)
    for row, case in zip(grad_rows, grad_cases, strict=True):
        m, n, o, k, p = (s.strip() for s in row[0].split(","))
        assert case.sizes == (int(m), int(n), int(o), int(k)) and case.p == float(p.split("=")[1])
        assert case.target_ms == _num(row[5]) and case.floor_ms == _num(row[4])
        assert sorted(case.peers.values()) == sorted(v for v in map(_num, row[1:4]) if v is not None)


# -- what gets timed ------------------------------------------------------------------------


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.label)
def test_kermac_fn_computes_the_case(case):
    inputs = case.make_inputs(3)
    out = torch.full(case.out_shape, math.nan)
    result = bm.kermac_fn(case, "torch")(*inputs, out)
    assert result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out.double(), brute(case, inputs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.label)
def test_torch_fn_computes_the_case(case):
    fn = bm.torch_fn(case)
    if case.op == "grad" and case.p != 2.0:
        assert fn is None
        return
    inputs = case.make_inputs(4)
    torch.testing.assert_close(fn(*inputs).double(), brute(case, inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.label)
def test_reference_is_float64_and_exact(case):
    inputs = case.make_inputs(5)
    ref = bm.reference(case, inputs)
    assert ref.dtype == torch.float64 and ref.shape == case.out_shape
    torch.testing.assert_close(ref, brute(case, inputs), rtol=1e-10, atol=1e-12)


def test_max_rel_error():
    ref = torch.tensor([[1.0, -4.0], [2.0, 0.0]], dtype=torch.float64)
    assert bm.max_rel_error(ref.float(), ref) == 0.0
    y = ref.clone()
    y[1, 1] = 0.5
    assert bm.max_rel_error(y, ref) == pytest.approx(0.5 / 4.0)
    assert bm.max_rel_error(y, ref, chunk_elems=1) == pytest.approx(0.5 / 4.0)
    y[0, 0] = math.nan
    assert math.isnan(bm.max_rel_error(y, ref))
    assert bm.max_rel_error(torch.ones(2), torch.zeros(2, dtype=torch.float64)) == math.inf
    with pytest.raises(ValueError, match=r"^result"):
        bm.max_rel_error(torch.zeros(2, 2), torch.zeros(4, dtype=torch.float64))


# -- timing ---------------------------------------------------------------------------------


def test_time_ms_calls_and_rotation_order():
    calls = []
    times = bm.time_ms(lambda i: calls.append(i), device="cpu", warmup=2, repeat=5, args=[(0,), (1,), (2,)])
    assert len(times) == 5 and all(t >= 0 for t in times)
    assert calls == [0, 1, 2, 0, 1, 2, 0]
    calls.clear()
    bm.time_ms(lambda: calls.append("x"), device="cpu", warmup=0, repeat=3)
    assert calls == ["x"] * 3


def test_time_ms_measures_milliseconds():
    times = bm.time_ms(lambda: time.sleep(0.02), device="cpu", warmup=1, repeat=3)
    assert 19.0 <= statistics.median(times) < 200.0


def test_time_ms_max_seconds_lowers_repeat_but_not_below_three():
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.03)

    assert len(bm.time_ms(slow, device="cpu", warmup=1, repeat=50, max_seconds=0.15)) in range(3, 6)
    assert len(bm.time_ms(slow, device="cpu", warmup=1, repeat=50, max_seconds=0.001)) == 3
    assert len(bm.time_ms(slow, device="cpu", warmup=1, repeat=2, max_seconds=0.001)) == 2


@pytest.mark.parametrize(
    ("kwargs", "needle"), [(dict(warmup=-1), "warmup"), (dict(repeat=0), "warmup, repeat"), (dict(args=[]), "args")]
)
def test_time_ms_rejects_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=f"^{needle}"):
        bm.time_ms(lambda: None, device="cpu", **kwargs)


def test_rotation_count():
    small = BenchCase("cdist", (1024, 1024, 64), device="cuda")  # 512 KiB of inputs
    assert bm.rotation_count(small.on("cpu")) == 1
    assert bm.rotation_count(small, l2_bytes=2**20) == 4  # 2 MiB / 512 KiB
    assert bm.rotation_count(small, l2_bytes=50 * 2**20) == 32  # capped
    assert bm.rotation_count(small, l2_bytes=50 * 2**20, max_sets=8) == 8
    assert bm.rotation_count(small, l2_bytes=2**18) == 1  # inputs already 2x the cache
    assert len(bm.input_sets(small.on("cpu"))) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_time_ms_with_cuda_events_and_rotated_inputs():
    case = BenchCase("cdist", (2048, 2048, 64), 2.0, device="cuda")
    sets = bm.input_sets(case)
    assert len(sets) == bm.rotation_count(case) > 1
    assert len({s[0].data_ptr() for s in sets}) == len(sets)
    x = torch.randn(4096, 4096, device="cuda")
    times = bm.time_ms(lambda: x @ x, device="cuda", warmup=2, repeat=5)
    # 4096³ FMAs: between 0.2 ms (beyond any GPU) and 1 s.
    assert len(times) == 5 and all(0.2 < t < 1000 for t in times)


@pytest.mark.parametrize(
    "case",
    [
        BenchCase("cdist", (40, 300, 5), 1.3),
        BenchCase("kernel", (300, 30, 4), 2.0, "gaussian"),
        BenchCase("grad", (300, 20, 3, 6), 1.5),
    ],
    ids=lambda c: c.label,
)
def test_corner_is_the_matching_block_of_the_whole_answer(case):
    inputs = case.make_inputs(2)
    out = torch.empty(case.out_shape)
    whole = bm.reference(case, inputs)
    sub, sub_inputs, view = bm.corner(case, inputs, out)
    assert view.shape == sub.out_shape and view.data_ptr() != 0
    out.copy_(whole)
    assert torch.allclose(bm.reference(sub, sub_inputs).float(), view, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "case",
    [BenchCase("cdist", (300, 290, 5), 1.0), BenchCase("grad", (300, 20, 3, 6), 2.0)],
    ids=lambda c: c.label,
)
def test_a_case_past_corner_work_is_checked_on_its_corner(case, monkeypatch):
    inputs = case.make_inputs(3)
    whole = bm.reference(case, inputs)
    ref, part = bm.checked_part(case, inputs)
    assert not bm.checked_on_corner(case) and ref.shape == whole.shape and part(whole) is whole
    monkeypatch.setattr(bm, "CORNER_WORK", math.prod(case.sizes) - 1)
    ref, part = bm.checked_part(case, inputs)
    assert bm.checked_on_corner(case) and ref.shape == bm.corner(case, inputs, whole)[2].shape
    assert bm.max_rel_error(part(whole), ref) < 1e-12
    wrong = whole.clone()
    part(wrong).mul_(1.01)
    assert bm.max_rel_error(part(wrong), ref) > 1e-3


@pytest.mark.parametrize("case", [*bm.PEERS_CASES, *bm.CPU_QUICK_CASES], ids=lambda c: c.label)
def test_problem_class_of_each_case(case):
    cls = case.problem_class
    assert cls.op == ("grad" if case.op == "grad" else "pairwise") and cls.dtype == "float32"
    assert cls.family == {1.0: "l1", 2.0: "l2"}.get(case.p, "lp")
    assert cls.size == ("small" if case in bm.CPU_QUICK_CASES else "large")
