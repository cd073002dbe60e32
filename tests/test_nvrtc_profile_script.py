"""tools/nvrtc_profile.py: the summary it prints from an Nsight Compute text report (no GPU)."""

from __future__ import annotations

import pytest
from helpers import load_script

REPORT = """\
==PROF== Profiling "kermac_grad": 0%....50%....100% - 23 passes
  kermac_grad (2048, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    SM Frequency                    Ghz         1.44
    Duration                         ms         3.97
    Issue Slots Busy                 %        51.56
    Registers Per Thread             register/thread             128
    Registers Per Thread           register/thread                            64
    Warp Stall Sampling (All Samples) (smsp__pcsamp_warps_issue_stalled_wait)          warp        100,509
    Warp Stall Sampling (All Samples) (smsp__pcsamp_warps_issue_stalled_barrier)       warp         19,448
    Warp Stall Sampling (All Samples) (smsp__pcsamp_warps_issue_stalled_membar)        warp              0
    Warp Stall Sampling (Not-issued Samples) (smsp__pcsamp_warps_issue_stalled_barrier_not_issued)   warp  10,858
    Warp Stall Sampling (Not-issued Samples) (smsp__pcsamp_warps_issue_stalled_wait_not_issued)      warp  43,535
    L1 Wavefronts Shared                                                          sectors    285,212,672
    L1 Wavefronts Shared Excessive                                                            90,177,536
"""


@pytest.fixture(scope="module")
def profile_script():
    return load_script("nvrtc_profile")


def test_summary_of_an_ncu_report(profile_script) -> None:
    """Each summary metric once (its first occurrence), with its unit; stall samples by reason,
    largest first, zero counts dropped, all samples and not-issued ones apart."""
    lines = profile_script.summarise(REPORT).splitlines()
    assert lines[:4] == [
        f"{'Duration':34s} 3.97 ms",
        f"{'SM Frequency':34s} 1.44 Ghz",
        f"{'Issue Slots Busy':34s} 51.56 %",
        f"{'Registers Per Thread':34s} 128 register/thread",
    ]
    assert f"{'L1 Wavefronts Shared':34s} 285,212,672 sectors" in lines
    assert f"{'L1 Wavefronts Shared Excessive':34s} 90,177,536" in lines
    assert lines[-2] == "stall samples (all): wait 100509, barrier 19448"
    assert lines[-1] == "stall samples (not-issued): wait 43535, barrier 10858"


def test_summary_without_a_profiled_launch(profile_script) -> None:
    assert "no kermac kernel launch was profiled" in profile_script.summarise("==PROF== No kernels were profiled.\n")


def test_unknown_operation_is_refused(profile_script) -> None:
    pytest.importorskip("torch")
    with pytest.raises(SystemExit, match="expected cdist:M:D:p, kernel:NAME:M:D or grad:M:N:O:K:p, got 'pairwise:3'"):
        profile_script.run_operation("pairwise:3")


def test_tuning_arguments(profile_script) -> None:
    """``--tuning FIELD=VALUE``: the default tuning with those fields replaced (0/1 for switches);
    an unknown field or a value that is no whole number is refused, naming the argument."""
    import dataclasses

    from kermac_backend_nvrtc import DEFAULT_TUNING

    got = profile_script.tuning_of(["power_table_pairs=36", "power_table=0"])
    assert got == dataclasses.replace(DEFAULT_TUNING, power_table_pairs=36, power_table=False)
    assert profile_script.tuning_of([]) == DEFAULT_TUNING
    for bad in ("TABLE_PAIRS=36", "power_table_pairs", "power_table=off"):
        with pytest.raises(SystemExit, match=f"--tuning: expected FIELD=VALUE, .* got '{bad}'"):
            profile_script.tuning_of([bad])
