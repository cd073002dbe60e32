"""tests/cubin_jobs.py, the tests' side of the cubin reports: where the spills of machine code lie, and which reports
`assert_compiled` accepts from which Triton."""

from __future__ import annotations

import pytest
from cubin_jobs import assert_compiled, local_in_inner_loops, report_triton

#: An outer loop (0x30 to 0x90) holding an inner one (0x40 to 0x70) that calls a subroutine (0x200 to its RET);
#: a spill before the loops, a reload in the outer loop only and one after the loops lie outside the inner loop.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                /* 0x00000a0000017a02 */
        /*0010*/                   STL [R1], R10 ;                       /* 0x0000000a01007387 */
        /*0020*/              @!P0 BRA 0xb0 ;                            /* 0x0000008000008947 */
        /*0030*/                   LDL R2, [R1] ;                        /* 0x0000000001027983 */
        /*0040*/                   FADD R3, R3, R4 ;                     /* 0x0000000403037221 */
        /*0050*/                   STL [R1+0x4], R3 ;                    /* 0x0000040301007387 */
        /*0060*/               @P2 CALL.REL.NOINC 0x200 ;                /* 0x0000019000002944 */
        /*0070*/               @P1 BRA 0x40 ;                            /* 0xffffffc000001947 */
        /*0080*/                   NOP ;                                 /* 0x0000000000007918 */
        /*0090*/               @P0 BRA 0x30 ;                            /* 0xffffff9000000947 */
        /*00a0*/                   LDL.LU R11, [R1] ;                    /* 0x00000000010b7983 */
        /*00b0*/                   EXIT ;                                /* 0x000000000000794d */
        /*0200*/                   STL [R1+0x8], R5 ;                    /* 0x0000080501007387 */
        /*0210*/                   RET.REL.NODEC R20 0x0 ;               /* 0xfffffdf014007950 */
"""


def test_only_the_spills_of_innermost_loops_and_their_subroutines_count() -> None:
    assert local_in_inner_loops(SASS) == 2  # 0x50 in the inner loop, 0x200 in the subroutine it calls
    no_call = SASS.replace("@P2 CALL.REL.NOINC 0x200", "NOP")
    assert local_in_inner_loops(no_call) == 1
    outer_only = no_call.replace("@P1 BRA 0x40", "NOP")  # the outer loop is innermost: its reload and spill count
    assert local_in_inner_loops(outer_only) == 2
    assert local_in_inner_loops(outer_only.replace("@P0 BRA 0x30", "NOP")) == 0


def _report(version: str, stack: int, inner: int) -> str:
    return (
        "\nResource usage:\n Common:\n  GLOBAL:11 CONSTANT[4]:8\n Function kermac_product:\n"
        f"  REG:80 STACK:{stack} SHARED:0 LOCAL:0 CONSTANT[0]:456 TEXTURE:0 SURFACE:0 SAMPLER:0\n"
        f" TRITON:{version} LOCAL_IN_INNER_LOOPS:{inner}\n"
    )


def test_the_report_names_the_triton_that_compiled_it() -> None:
    assert report_triton(_report("3.6.0", 0, 0)) == (3, 6)
    assert report_triton(_report("3.10.1+git1234", 0, 0)) == (3, 10)


@pytest.mark.parametrize(
    ("version", "stack", "inner", "accepted"),
    [
        ("3.9.0", 0, 0, True),
        ("3.9.0", 8, 0, False),  # the venv's Triton: no spill at all
        ("3.6.0", 8, 0, True),  # an older ptxas: spills outside the innermost loops
        ("3.6.0", 8, 1, False),
    ],
)
def test_an_older_triton_may_spill_outside_the_innermost_loops(
    version: str, stack: int, inner: int, accepted: bool
) -> None:
    report = _report(version, stack, inner)
    if accepted:
        assert_compiled(report)
    else:
        with pytest.raises(AssertionError):
            assert_compiled(report)
