"""tools/nvrtc_sass_report.py: finding a kernel's main loop in SASS, and where ptxas puts the
SIMT kernels' next-tile loads (no GPU: NVRTC compiles, cuobjdump disassembles)."""

from __future__ import annotations

import pytest
from helpers import load_script

SASS = """\
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   FADD R2, R3, R4 ;
        /*0020*/                   BRA 0x10 ;
        /*0030*/                   LDG.E.128 R8, desc[UR4][R6.64] ;
        /*0040*/                   LDS.128 R12, [R5] ;
        /*0050*/                   FADD R20, R20, R21 ;
        /*0060*/                   FADD R20, |R12|, R20 ;
        /*0070*/               @!P0 FFMA R22, R13, R14, R22 ;
        /*0080*/                   STS [R5], R8 ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00a0*/               @P1 BRA 0x30 ;
        /*00b0*/                   EXIT ;
"""


@pytest.fixture(scope="module")
def sass_script():
    return load_script("nvrtc_sass_report")


def test_main_loop_positions_and_shared_load_distances(sass_script) -> None:
    """The loop with the most arithmetic wins (4 instructions of it against 1); positions are
    fractions of its length; a shared load's distance counts to the first reader of any of its
    four registers (R12, read two instructions later by the FADD with |R12|)."""
    loop = sass_script.main_loop(sass_script.parse_sass(SASS))
    assert loop.ops[0].startswith("LDG") and loop.ops[-1] == "BRA" and len(loop.ops) == 8
    assert loop.mix()["FADD"] == 2 and loop.mix()["FFMA"] == 1
    assert [round(pos, 3) for pos, _ in loop.positions()] == [0.0, 0.625, 0.75]  # LDG, STS, BAR of 8
    assert loop.lds_distances() == [2]
    text = sass_script.report(loop)
    assert "main loop: 8 instructions" in text and "median 2" in text


BANKS = """\
        /*0000*/                   FADD R2, R4.reuse, -R7 ;
        /*0010*/                   FADD R3, R4, -R8 ;
        /*0020*/                   FADD R5, R5, |R3| ;
        /*0030*/                   FADD R7, R6, |R3| ;
        /*0040*/               @!P0 FFMA R9, R2, R4, R7 ;
        /*0050*/                   FADD R9, R9, 1 ;
        /*0060*/                   FADD R10, R6.reuse, R8 ;
        /*0070*/                   LDS.128 R12, [R5] ;
        /*0080*/                   BRA 0x0 ;
"""


def test_register_bank_conflicts(sass_script) -> None:
    """Two register-file sources of equal parity conflict: R5/R3, R2/R4 in the FFMA (R4 sits in
    another slot than the one the first FADD cached it in), R6/R8 (a ``.reuse`` mark serves the next
    instruction, not its own).  R4 in the second FADD comes from the reuse cache, so R8 reads alone;
    an immediate operand and the LDS do not count."""
    loop = sass_script.main_loop(sass_script.parse_sass(BANKS))
    assert loop.bank_conflicts() == (6, 3)
    assert "register bank conflicts: 3 of 6" in sass_script.report(loop)


def test_sass_without_a_loop_is_refused(sass_script) -> None:
    with pytest.raises(ValueError, match="no loop"):
        sass_script.main_loop(sass_script.parse_sass("        /*0000*/                   EXIT ;\n"))


@pytest.mark.parametrize(
    ("kind", "arch"),
    [
        (("cdist_p", 1.0, 1024), "sm_90"),
        (("cdist_p", 1.3, 256), "sm_90"),
        (("preset", "laplace_l1", 128), "sm_90"),
        (("cdist_p", 1.0, 1024), "sm_80"),
    ],
)
def test_simt_loops_issue_the_next_tiles_loads_before_the_math(sass_script, kind, arch) -> None:
    """The register-staged SIMT kernels (p = 1, the split fractional-p kernel, Laplace-L1; p = 1 and
    Laplace-L1 with k-contiguous tiles off, as for layouts those cannot read) must load the next tile
    in the first third of the k loop (at the top, or after 4 of 16 steps in p = 1's one-path loop) and
    store it at the bottom: with the loads sunk to their stores the loop lost 8 % on the H100
    (docs/dev/simt-pairwise-loops.md)."""
    from kermac_backend_nvrtc import NvrtcTuning

    try:
        sass_script.cuobjdump()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    field, value, d = kind
    source, name, _ = sass_script.planned(arch, **{field: value}, d=d, tuning=NvrtcTuning(k_contiguous_tiles=False))
    _, sass = sass_script.kernel_sass(source, arch, name)
    loop = sass_script.main_loop(sass_script.parse_sass(sass))
    loads = [pos for pos, text in loop.positions(("LDG",))]
    stores = [pos for pos, text in loop.positions(("STS",))]
    assert loads and stores, loop.positions()
    assert max(loads) < 1 / 3 and min(stores) > 0.75, sass_script.report(loop)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_k_contiguous_loop_copies_the_next_tile_first_without_bank_conflicts(sass_script, arch) -> None:
    """The k-contiguous loop (cdist p = 1) issues the next tile's cp.async copies (2 of x, 8 of z) at
    its top, stages nothing through registers (no shared stores), does not spill, and almost none of
    its 2048 FADDs per 16 k read two registers of one bank (the one-path loop: 306)."""
    try:
        sass_script.cuobjdump()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    source, name, _ = sass_script.planned(arch, cdist_p=1.0, d=1024)
    assert "#define KM_K_CONTIGUOUS 1" in source
    ptxas, sass = sass_script.kernel_sass(source, arch, name)
    assert " 0 bytes spill stores" in ptxas
    loop = sass_script.main_loop(sass_script.parse_sass(sass))
    copies = [pos for pos, _ in loop.positions(("LDGSTS",))]
    assert len(copies) == 10 and max(copies) < 0.1 and not loop.positions(("STS",)), sass_script.report(loop)
    arithmetic, conflicts = loop.bank_conflicts()
    assert arithmetic == 2048 and conflicts < 32, sass_script.report(loop)
