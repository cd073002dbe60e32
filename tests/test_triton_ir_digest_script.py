"""tools/triton_ir_digest.py: digests of the Triton backend's compiled kernels without a GPU.

The script compiles for a CUDA target (no device needed) in a process of its own, without
``TRITON_INTERPRET`` (interpreted functions do not compile); its digests ignore source locations
and SSA value names, which move whenever the Python text does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "tools" / "triton_ir_digest.py"


@pytest.fixture(scope="module")
def digest():
    spec = importlib.util.spec_from_file_location("triton_ir_digest", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_locations_and_value_names_are_ignored(digest) -> None:
    a = (
        '#loc1 = loc("/a/x.py":3:4)\n'
        "  %pid = tt.get_program_id x : i32 loc(callsite(#loc1 at #loc2))\n"
        "  %0 = arith.addi %pid, %pid : i32 loc(#loc3)"
    )
    b = (
        '#loc7 = loc("/b/y.py":9:1)\n'
        "  %p = tt.get_program_id x : i32 loc(#loc9)\n"
        '  %tile = arith.addi %p, %p : i32 loc("x"(#loc1))'
    )
    assert digest._strip_locations(a) == digest._strip_locations(b)
    assert "loc" not in digest._strip_locations(a)
    ptx = '\t.file\t1 "/a/x.py"\n\tadd.s32 \t%r1, %r2, 1;\n\t.loc\t1 3 4\n\tret;'
    assert digest._strip_ptx(ptx) == "\tadd.s32 \t%r1, %r2, 1;\n\tret;"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_one_case_compiles_to_stable_digests(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    command = [sys.executable, str(SCRIPT), "--only", "simt-l1-f32", "--dump", str(tmp_path / "dump")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    digests = json.loads(done.stdout)["simt-l1-f32"]
    assert set(digests) == {"ttgir", "ptx"} and all(len(v) == 64 for v in digests.values())
    ptx = (tmp_path / "dump" / "simt-l1-f32.ptx").read_text()
    assert ".entry kermac_pairwise(" in ptx and ".loc" not in ptx
