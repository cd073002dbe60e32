"""kermac.kernel_facts: the facts every GPU backend's kernels agree on, and the NVRTC backend using them."""

from __future__ import annotations

import math

import pytest
import torch

from kermac import ir, kernel_facts
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program
from kermac.problem import pairwise_problem
from kermac.programs import PairwiseProgram


def test_index_limit_keeps_the_tile_slack() -> None:
    assert kernel_facts.TILE_SLACK == 512
    assert kernel_facts.fits_int32(kernel_facts.INT32_MAX - 512)
    assert not kernel_facts.fits_int32(kernel_facts.INT32_MAX - 511)
    assert kernel_facts.fits_int32(0)


def test_nvrtc_refuses_sizes_within_the_slack() -> None:
    """The NVRTC backend allowed 256 below INT32_MAX, the Triton backend 512: one limit for both now."""
    plan = pytest.importorskip("kermac_backend_nvrtc.plan")
    assert plan.size_problem("pairwise", {"M": kernel_facts.INT32_MAX - 512}) is None
    reason = plan.size_problem("pairwise", {"M": kernel_facts.INT32_MAX - 300, "N": 7})
    assert reason is not None and "'M'" in reason and "'N'" not in reason


@pytest.mark.parametrize("d", [0, 1, 3, 64, 1000, 2**20, 2**40])
def test_cancellation_guard_follows_its_error_bound(d: int) -> None:
    bound = (math.sqrt(max(d, 1)) * 2.0**-24 + 3 * 2.0**-23) * 2.0**16
    assert kernel_facts.cancellation_guard(d) == min(0.5, bound)
    assert 0 < kernel_facts.cancellation_guard(d) <= 0.5


def test_cancellation_guard_grows_with_d_and_is_capped() -> None:
    values = [kernel_facts.cancellation_guard(d) for d in (1, 16, 256, 4096, 2**30, 2**50)]
    assert values == sorted(values)
    assert values[-1] == 0.5


def test_tensor_core_eligibility() -> None:
    x, z, acc = ir.Var("x"), ir.Var("z"), ir.Var("acc")
    squared = PairwiseProgram((x - z) * (x - z), "sum", ir.sqrt(acc))
    assert kernel_facts.tensor_core_eligible(squared, torch.float32)
    assert kernel_facts.tensor_core_eligible(squared, "float32")
    for dtype in (torch.float64, torch.float16, torch.bfloat16, "float64"):
        assert not kernel_facts.tensor_core_eligible(squared, dtype)
    assert not kernel_facts.tensor_core_eligible(PairwiseProgram(abs(x - z), "sum", acc), torch.float32)
    assert not kernel_facts.tensor_core_eligible(PairwiseProgram((x - z) * (x - z), "max", acc), torch.float32)
    assert kernel_facts.tensor_core_eligible(cdist_program(2.0, dtype=torch.float32), torch.float32)


def test_hyperparameters_pass_by_value_or_pointer() -> None:
    assert kernel_facts.passed_by_value(HyperValue("p", 1.5))
    assert not kernel_facts.passed_by_value(HyperValue("p", None, torch.ones(3)))


@pytest.mark.parametrize("shape", [(1,), (5,), (2, 3), (3, 1, 4), (2, 2, 2, 3)])
def test_batch_index_is_row_major(shape: tuple[int, ...]) -> None:
    """Every kernel decodes its flat batch entry innermost dimension first: torch's row-major order."""
    for entry in range(math.prod(shape)):
        expected = tuple(int(i) for i in torch.unravel_index(torch.tensor(entry), shape))
        assert kernel_facts.batch_index(entry, shape) == expected


def test_batch_index_rejects_entries_outside_the_batch() -> None:
    with pytest.raises(ValueError, match="entry"):
        kernel_facts.batch_index(6, (2, 3))
    with pytest.raises(ValueError, match="entry"):
        kernel_facts.batch_index(-1, (2, 3))


def test_nvrtc_decodes_batches_in_that_order() -> None:
    """The generated offsets take the innermost dimension's index first (``r % bs<last>``)."""
    source = pytest.importorskip("kermac_backend_nvrtc.source")
    plan = pytest.importorskip("kermac_backend_nvrtc.plan")
    x = torch.empty(3, 1, 4, 8, device="meta")
    z = torch.empty(1, 2, 5, 8, device="meta")
    problem = pairwise_problem(cdist_program(1.0), x, z, out=None, hypers={})
    variant, launch = plan.plan_pairwise(problem, 80, pytest.importorskip("kermac_backend_nvrtc.tuning").DEFAULT_TUNING)
    text = source.kernel_source(variant)[0]
    offsets = next(line for line in text.splitlines() if line.startswith("#define KM_BATCH_OFFSETS"))
    assert offsets.index("q = r % bs1;") < offsets.index("q = r % bs0;")
    assert (launch.args["bs0"], launch.args["bs1"]) == (3, 2)
