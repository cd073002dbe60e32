"""tools/nvrtc_bench.py: its ``--knob`` settings (parsing, applying them around a run), its row filter (no GPU)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import load_script

from kermac.registry import get_backend
from kermac_backend_nvrtc import DEFAULT_TUNING, plan, tiles


@pytest.fixture(scope="module")
def bench_script():
    return load_script("nvrtc_bench")


def test_knob_settings_cover_every_combination(bench_script) -> None:
    """Tuning fields by bare name, dataclass fields by module.NAME.field; values converted to the
    type they replace (0/1 for booleans); one setting per combination, labelled."""
    knobs = ["power_table_pairs=28,32", "tiles.TC_GRAD_CONFIG.k_group=1,2", "power_table=0"]
    modes = bench_script._knob_settings(knobs)
    assert [label for label, _ in modes] == [
        "power_table_pairs=28 tiles.TC_GRAD_CONFIG.k_group=1 power_table=False",
        "power_table_pairs=28 tiles.TC_GRAD_CONFIG.k_group=2 power_table=False",
        "power_table_pairs=32 tiles.TC_GRAD_CONFIG.k_group=1 power_table=False",
        "power_table_pairs=32 tiles.TC_GRAD_CONFIG.k_group=2 power_table=False",
    ]
    assert modes[1][1] == {"power_table_pairs": 28, "tiles.TC_GRAD_CONFIG.k_group": 2, "power_table": False}


@pytest.mark.parametrize(
    "knob",
    [
        "NO_SUCH_SETTING=1",
        "TABLE_PAIRS=1",
        "power_table_pairs",
        "nosuchmodule.X=1",
        "tiles.TC_GRAD_CONFIG.nosuchfield=1",
    ],
)
def test_knob_errors_name_the_argument(bench_script, knob: str) -> None:
    with pytest.raises(SystemExit, match="--knob: expected NAME"):
        bench_script._knob_settings([knob])


def test_settings_apply_around_a_run_and_are_restored(bench_script) -> None:
    """Inside the run the dataclass field holds the new value (other fields kept) and ``nvrtc`` is a
    backend of the new tuning (other fields default); afterwards, also when the run raises, the
    original objects and the installed backend are back."""
    config, installed = tiles.TC_GRAD_CONFIG, get_backend("nvrtc")
    seen = {}

    def probe() -> dict:
        tuning = get_backend("nvrtc").tuning
        seen.update(k_group=tiles.TC_GRAD_CONFIG.k_group, bk=tiles.TC_GRAD_CONFIG.bk, tuning=tuning)
        return {}

    settings = {"tiles.TC_GRAD_CONFIG.k_group": 1, "power_table_pairs": 7}
    bench_script.with_settings(settings, probe)()
    expected = dataclasses.replace(DEFAULT_TUNING, power_table_pairs=7)
    assert seen == {"k_group": 1, "bk": config.bk, "tuning": expected}
    assert tiles.TC_GRAD_CONFIG is config and get_backend("nvrtc").tuning == DEFAULT_TUNING

    def fail() -> dict:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        bench_script.with_settings(settings, fail)()
    assert tiles.TC_GRAD_CONFIG is config and get_backend("nvrtc").tuning == DEFAULT_TUNING
    assert type(installed) is type(get_backend("nvrtc"))


def test_tile_config_settings_reach_the_generated_source(bench_script) -> None:
    """``tiles.TC_CONFIG.min_blocks`` (the script's tc-1block rows) changes the mma.sync kernel's
    launch bounds: its source builder reads the tile config at each call."""
    import torch

    from kermac import presets
    from kermac.problem import pairwise_problem
    from kermac_backend_nvrtc.source import kernel_source
    from kermac_backend_nvrtc.variants import MmaPairwise

    x = torch.empty(64, 16, device="meta")
    problem = pairwise_problem(presets.l2_distance.lower(), x, x, out=None, hypers={})
    variant = plan.plan_pairwise(problem, 80, DEFAULT_TUNING)[0]
    assert type(variant) is MmaPairwise

    def bounds() -> dict:
        source = kernel_source(variant)[0]
        return {"one": "#define KM_MIN_BLOCKS 1\n" in source, "two": "#define KM_MIN_BLOCKS 2\n" in source}

    assert bench_script.with_settings({"tiles.TC_CONFIG.min_blocks": 1}, bounds)() == {"one": True, "two": False}
    assert bounds() == {"one": False, "two": True}


def test_row_filters_split_on_semicolons_where_given(bench_script) -> None:
    assert bench_script.row_filters("p=1.3,laplace") == ["p=1.3", "laplace"]
    assert bench_script.row_filters("grad 4096,256,16,4096 p=2;grad 8192") == ["grad 4096,256,16,4096 p=2", "grad 8192"]
    assert bench_script.row_filters("") == []
