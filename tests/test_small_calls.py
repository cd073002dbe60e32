"""The harness of `kermac bench --calls`: the cases and the per-call timer (on the CPU here)."""

from __future__ import annotations

import gc
import time

import pytest
import torch

from kermac import benchmarking as bm
from kermac import small_calls


def test_call_cases_cover_every_operation_at_the_device_size():
    gpu = small_calls.call_cases("cuda:1")
    assert [(c.op, c.p, c.kernel) for c in gpu] == [
        ("cdist", 1.0, None),
        ("cdist", 2.0, None),
        ("kernel", 2.0, "laplace"),
        ("grad", 2.0, None),
        ("program", 2.0, None),
    ]
    assert {c.device for c in gpu} == {"cuda:1"}
    m, n, d = small_calls.CALL_SIZES
    assert (m, n, d) == (300, 200, 40)
    assert all(c.sizes == (m, n, d) for c in gpu if c.op != "grad")
    assert next(c for c in gpu if c.op == "grad").sizes == (m, d, 1, n)  # 300 points, 40 features, O = 1, 200 centres
    cpu = small_calls.call_cases("cpu")
    assert [c.label for c in cpu] == [
        "cdist 30x20x4 p=1",
        "cdist 30x20x4 p=2",
        "laplace L2 30x20x4",
        "grad M=30 N=4 O=1 K=20 p=2",
        "program 30x20x4",
    ]
    assert {c.device for c in cpu} == {"cpu"}
    assert all(bm.torch_fn(c) is not None for c in [*gpu, *cpu])  # each row has PyTorch's time beside kermac's


@pytest.mark.parametrize("case", small_calls.call_cases("cpu"), ids=lambda c: c.label)
def test_each_call_runs_with_out_and_allocating(case):
    """The section times `fn(*inputs, out)` and `fn(*inputs, None)`: both give the float64 answer."""
    inputs = case.make_inputs(1)
    ref = bm.reference(case, inputs)
    fn = bm.kermac_fn(case, "auto")
    out = case.make_out()
    assert fn(*inputs, out).data_ptr() == out.data_ptr()
    fresh = fn(*inputs, None)
    assert fresh.data_ptr() != out.data_ptr() and fresh.shape == case.out_shape
    for y in (out, fresh):
        assert bm.max_rel_error(y, ref) < bm.tolerance(case)


def test_per_call_us_calls_warmup_then_runs_of_back_to_back_calls():
    calls = []
    runs, n = small_calls.per_call_us(
        lambda a, b: calls.append((a, b)), (1, 2), device="cpu", calls=7, repeat=3, warmup=4
    )
    assert n == 7 and len(runs) == 3 and all(us > 0 for us in runs)
    assert calls == [(1, 2)] * (4 + 3 * 7)
    calls.clear()
    small_calls.per_call_us(lambda: calls.append(0), (), device="cpu", calls=2, repeat=1, warmup=0)
    assert calls == [0, 0]


def test_per_call_us_is_microseconds_per_call():
    runs, n = small_calls.per_call_us(time.sleep, (0.002,), device="cpu", calls=3, repeat=2, warmup=0)
    assert n == 3 and all(us >= 2000 for us in runs)


def test_per_call_us_turns_the_garbage_collector_off_only_while_timing():
    seen = []
    small_calls.per_call_us(lambda: seen.append(gc.isenabled()), (), device="cpu", calls=2, repeat=2, warmup=2)
    assert seen == [True, True, False, False, False, False] and gc.isenabled()

    def boom():
        if not gc.isenabled():
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        small_calls.per_call_us(boom, (), device="cpu", calls=1, repeat=1, warmup=1)
    assert gc.isenabled()


def test_per_call_us_max_seconds_lowers_calls_but_not_below_min_calls():
    def slow():
        time.sleep(0.002)

    # 2 ms a call: 0.1 s over 2 runs is about 25 calls a run (sleep overshoots, so at most that).
    _, n = small_calls.per_call_us(slow, (), device="cpu", calls=1000, repeat=2, warmup=3, max_seconds=0.1)
    assert small_calls.MIN_CALLS <= n <= 25
    _, n = small_calls.per_call_us(slow, (), device="cpu", calls=1000, repeat=1, warmup=3, max_seconds=1e-6)
    assert n == small_calls.MIN_CALLS
    _, n = small_calls.per_call_us(slow, (), device="cpu", calls=4, repeat=1, warmup=3, max_seconds=1e-6)
    assert n == 4  # never raised
    _, n = small_calls.per_call_us(slow, (), device="cpu", calls=30, repeat=1, warmup=1, max_seconds=1e-6)
    assert n == 30  # one warm-up call (it may compile) estimates nothing


@pytest.mark.parametrize(
    "kwargs", [dict(calls=0, repeat=1, warmup=0), dict(calls=1, repeat=0, warmup=0), dict(calls=1, repeat=1, warmup=-1)]
)
def test_per_call_us_rejects_bad_counts(kwargs):
    with pytest.raises(ValueError, match=r"^calls, repeat, warmup: expected"):
        small_calls.per_call_us(lambda: None, (), device="cpu", **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_per_call_us_waits_for_the_device_once_per_run():
    x = torch.randn(4096, 4096, device="cuda")
    runs, n = small_calls.per_call_us(lambda: x @ x, (), device="cuda", calls=20, repeat=2, warmup=2)
    # The host queues a product of 4096³ FMAs in microseconds; the GPU needs well over 200 µs for one
    # (0.3 ms at 400 TFLOP/s), and each run waits for all of its products.
    assert n == 20 and all(us > 200 for us in runs)
