"""How the Triton backend autotunes a large kernel product: on a corner of the problem, under the whole problem's
shape bucket (`kermac_backend_triton.launch.product_tuning_args`).

On the CPU the corner's arguments are checked as data; on the GPU the autotuner's timings are counted and every one
must be of the corner, and the product of the whole problem must still match the dense float64 product.
"""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close, tolerance

import kermac
from kermac import presets
from kermac.hyperparams import program_hypers
from kermac.problem import product_problem

launch = pytest.importorskip("kermac_backend_triton.launch")
configs = pytest.importorskip("kermac_backend_triton.configs")
backend_module = pytest.importorskip("kermac_backend_triton.backend")
TritonTuning = pytest.importorskip("kermac_backend_triton.tuning").TritonTuning

SIZE = configs.PRODUCT_TUNING_SIZE
POINTERS = 5  # x, z, v, out and one hyperparameter tensor: M and N follow them


def _args(m: int, n: int) -> list:
    """Product arguments as `launch.run_product` orders them: pointers, M, N, D, C, the two offsets, strides."""
    tensors = [object() for _ in range(POINTERS)]
    return [*tensors, m, n, 32, 16, 3, 4, 7, 8]


@pytest.mark.parametrize(("m", "n"), [(SIZE, SIZE), (1, SIZE), (SIZE, 0), (0, 0), (5, 17)])
def test_problems_within_the_corner_are_timed_whole(m: int, n: int) -> None:
    assert launch.product_tuning_args(_args(m, n), POINTERS) is None


@pytest.mark.parametrize(("m", "n"), [(SIZE + 1, 5), (3, SIZE + 1), (10**6, 10**6), (10**6, 0), (SIZE + 1, SIZE + 1)])
def test_a_larger_problem_is_timed_on_its_first_rows(m: int, n: int) -> None:
    args = _args(m, n)
    tuning_args, rows = launch.product_tuning_args(args, POINTERS)
    assert rows == min(m, SIZE)
    assert tuning_args[POINTERS : POINTERS + 2] == [min(m, SIZE), min(n, SIZE)]
    # Every other argument is the call's own object (pointers, D, C, offsets, strides), in its place.
    others = [a for i, a in enumerate(args) if i not in (POINTERS, POINTERS + 1)]
    kept = [a for i, a in enumerate(tuning_args) if i not in (POINTERS, POINTERS + 1)]
    assert len(kept) == len(others) and all(a is b for a, b in zip(kept, others, strict=True))
    assert args[POINTERS : POINTERS + 2] == [m, n]  # the call's list is not changed


def test_the_corner_is_a_multiple_of_every_tile() -> None:
    """A corner of whole tiles: its timings are of full tiles only, as most of the whole problem's are."""
    largest = max(
        max(entry[0].get("BM", 1), entry[0].get("BN", 1))
        for space in (configs.PRODUCT_SPACE, configs.PRODUCT_TC_SPACE, configs.PRODUCT_COLUMN_SPACE)
        for entry in space
    )
    assert SIZE % largest == 0


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "d", "c"), [("gaussian", 32, 1), ("laplace_l1", 8, 16)])
def test_the_autotuner_times_the_corner_only(monkeypatch: pytest.MonkeyPatch, name: str, d: int, c: int) -> None:
    """M and N past the corner: every configuration the autotuner times runs on 2¹⁶ × 2¹⁶ pairs, the corner is
    tuned once (a choice the autotuner kept on disk from an earlier run is ignored, so the timings happen here),
    and the whole product, launched with the corner's choice, matches the dense product."""
    from triton.runtime.autotuner import Autotuner

    m, n = SIZE + 77, 3 * SIZE + 5
    program = presets.ALL[name].lower(regularized=True)
    values = {"bandwidth": 5.0, "regularization": 0.1}
    x, z, v = (torch.randn(s, dtype=torch.float64).float().cuda() for s in ((m, d), (n, d), (n, c)))
    timed: list[tuple[int, int]] = []
    bench = Autotuner._bench

    def counting_bench(self, *args, **kwargs):
        named = dict(zip(self.arg_names, args, strict=False))  # the meta-parameters come as keywords
        timed.append((named["M"], named["N"]))
        return bench(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "_bench", counting_bench)
    tunings: list[int] = []
    tune = launch._tune

    def counting_tune(*args, **kwargs):
        tunings.append(1)
        return tune(*args, **kwargs)

    monkeypatch.setattr(launch, "_tune", counting_tune)

    def always_time(self, key, configs, bench) -> bool:  # a choice on disk from an earlier run would time nothing
        bench()
        return False

    monkeypatch.setattr(Autotuner, "check_disk_cache", always_time)
    hypers = program_hypers(program.hypers, values, x.device, False)
    problem = product_problem(program, x, z, v, out=None, hypers=hypers)
    backend_module.TritonBackend(TritonTuning()).product(problem)
    assert tunings == [1]
    assert timed and set(timed) == {(SIZE, SIZE)}, timed
    for first in (0, m - 64):  # rows of the corner, and past it (the regularised diagonal at row = column)
        k = kermac.run_program(program, x[first : first + 64].double(), z.double(), hypers=values, offset_m=first)
        assert_close(problem.out[first : first + 64], k.cpu() @ v.double().cpu(), tolerance(torch.float32))
