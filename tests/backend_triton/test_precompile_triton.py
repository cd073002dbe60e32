"""`TritonBackend.precompile`: the kernels of problems compiled into Triton's cache ahead of time.

Without a GPU (clean processes, problems on the `meta` device, compiled for sm_90): for every common problem
(float32 and float16), the cache keys `precompile` compiles under are those the backend's launch path (the
autotuner timing each configuration) looks up, Triton's compilation replaced by a recording of the key.  A first
process fills an empty
cache with a distance's and a gradient's kernels and names them; a second, precompiling problems of other sizes
with the same operand layout, adds nothing to the cache (the kernels it would compile are the first's: a launch's
cache key holds the layout, not the sizes), while a third, with D = 3 (row strides no multiple of 16), compiles
kernels of its own.  The arguments it refuses, and the interpreter, which compiles nothing; the host launchers it
builds through a GPU driver (none through the stand-in).  On a GPU: a process's first `cdist` after another
process precompiled its problem compiles nothing, not even Triton 3.6's C launcher (only the autotuner's timings
are new in the cache), and is right.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cubin_jobs import compile_in_clean_process

from kermac import presets
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program
from kermac.problem import pairwise_problem, product_problem

backend_module = pytest.importorskip("kermac_backend_triton.backend")
launch = pytest.importorskip("kermac_backend_triton.launch")

SCRIPT = Path(__file__).with_name("precompile_compile.py")


PHASES = {
    "first": [["cdist", 1.0, 256, 256, 64], ["grad", 2.0, 256, 64, 256]],
    # Other sizes, the same layout (aligned pointers; N and every non-unit stride a multiple of 16).
    "same layout": [["cdist", 1.0, 1000, 4096, 128], ["grad", 2.0, 512, 128, 1024]],
    "D = 3": [["cdist", 1.0, 256, 256, 3]],
}
"""The problems each clean process precompiles for sm_90 into one cache, in this order."""


def test_a_second_process_compiles_nothing_for_the_same_layout(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    if launch.gluon_available() is not None:
        pytest.skip(launch.gluon_available())
    reports = {}
    for phase, cases in PHASES.items():
        job = {"id": phase, "cache": str(tmp_path), "archs": ["sm_90"], "cases": cases}
        report = compile_in_clean_process(SCRIPT, [job])[phase]
        assert not report.startswith("error"), report
        reports[phase] = json.loads(report)
    first, same, few = reports.values()
    assert len(first["lines"]) == 2, first["lines"]
    assert first["lines"][0].startswith("gluon sm_90 float32 pairwise;sum;(abs (sub x z))"), first["lines"]
    assert first["lines"][1].startswith("grad sm_90 float32 grad;"), first["lines"]
    assert first["entries"], "nothing was written to Triton's cache"
    assert first["device_caches"] == 0, "the stand-in target's per-device caches were kept"
    assert same["lines"] == first["lines"]
    assert same["entries"] == first["entries"], "a precompiled layout was compiled again"
    assert few["lines"] == first["lines"][:1]
    assert set(few["entries"]) > set(first["entries"]), "D = 3 (row stride 3) compiled nothing of its own"


def test_precompile_compiles_under_the_keys_a_launch_looks_up(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    if launch.gluon_available() is not None:
        pytest.skip(launch.gluon_available())
    report = compile_in_clean_process(SCRIPT, [{"id": "keys", "cache": str(tmp_path), "keys": True}])["keys"]
    assert not report.startswith("error"), report
    keys = json.loads(report)
    assert len(keys["precompile"]) > 100, len(keys["precompile"])  # every configuration of 70 problems
    assert keys["precompile"] == keys["launch"]


def _meta_problem():
    x = torch.empty(8, 4, device="meta")
    return pairwise_problem(cdist_program(1.0), x, x, out=None, hypers={})


def test_precompile_refuses_what_it_cannot_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = backend_module.TritonBackend()
    monkeypatch.setattr(pytest.importorskip("kermac_backend_triton.precompile"), "interpreting", lambda: False)
    with pytest.raises(ValueError, match=r"archs: needed for problems on meta \(no GPU to compile for\)"):
        backend.precompile([_meta_problem()])
    monkeypatch.undo()  # the checks below hold under the interpreter too
    with pytest.raises(ValueError, match=r"archs: expected names like 'sm_80' or 'sm_90'; got 'sm90'"):
        backend.precompile([_meta_problem()], archs=["sm90"])
    with pytest.raises(ValueError, match=r"archs: the Triton backend compiles for sm_80 and newer; got 'sm_75'"):
        backend.precompile([_meta_problem()], archs=["sm_75"])
    x, v = torch.empty(8, 4, device="meta"), torch.empty(8, 2, device="meta")
    hypers = {"bandwidth": HyperValue("bandwidth", 1.0)}
    problem = product_problem(presets.gaussian.lower(), x, x, v, out=None, hypers=hypers)
    with pytest.raises(TypeError, match="problems: the Triton backend precompiles pairwise and gradient problems; got"):
        backend_module.TritonBackend().precompile([problem], archs=["sm_90"])


def test_the_interpreter_precompiles_nothing() -> None:
    """Under the interpreter the backend accepts CPU problems, and has nothing to compile for them."""
    if not launch.interpreting():
        pytest.skip("runs under TRITON_INTERPRET=1")
    x = torch.randn(8, 4)
    problem = pairwise_problem(cdist_program(1.0), x, x, out=None, hypers={})
    assert backend_module.TritonBackend().precompile([problem]) == []
    assert backend_module.TritonBackend().precompile([_meta_problem()], archs=["sm_90"]) == []


@pytest.mark.parametrize("autotuned", [False, True])
def test_a_compile_only_launch_builds_the_gpu_drivers_host_launchers(monkeypatch, autotuned: bool) -> None:
    """Triton 3.6 compiles a C launcher per argument signature at a kernel's first launch; a launch under
    `compiling_only()` builds it through the GPU driver's `launcher_cls`, with each compiled kernel's source and
    metadata (`warmup` returns one kernel, or the autotuner's list, where a skipped compilation is None).  The
    stand-in driver of `--arch` has no `launcher_cls`, and nothing is built."""
    runtime = pytest.importorskip("triton.runtime")
    precompile = pytest.importorskip("kermac_backend_triton.precompile")
    binaries = [SimpleNamespace(src=f"src {i}", metadata=f"metadata {i}") for i in range(3)]
    warmed = [*binaries, None] if autotuned else binaries[0]
    kernel = SimpleNamespace(warmup=lambda *args, grid, **meta: warmed)
    monkeypatch.setattr(launch, "_kernel", lambda spec, autotune, debug: kernel)
    built = []

    class GpuDriver:
        def launcher_cls(self, src, metadata):
            built.append((src, metadata))

    def compile_only() -> list:
        with launch.compiling_only() as compiled:
            result = launch._compile_and_launch("spec", launch.TritonTuning(), False, [], {}, None, -1)
        assert result == (kernel, None) and compiled == [("spec", kernel)]
        return built

    previous = runtime.driver._active
    try:
        runtime.driver.set_active(GpuDriver())
        expected = binaries if autotuned else binaries[:1]
        assert compile_only() == [(b.src, b.metadata) for b in expected]
        built.clear()
        runtime.driver.set_active(precompile._TargetDriver(90))
        assert compile_only() == []
    finally:
        runtime.driver._active = previous


_GPU_FIRST_CALL = textwrap.dedent(
    """
    import json, sys, torch, kermac
    from kermac_backend_triton.backend import TritonBackend
    from kermac.lowering import cdist_program
    from kermac.problem import pairwise_problem
    cache, phase = sys.argv[1], sys.argv[2]
    if phase == "precompile":
        x = torch.empty(256, 64, device="cuda")
        problem = pairwise_problem(cdist_program(1.0), x, x, out=None, hypers={})
        print(json.dumps(TritonBackend().precompile([problem])))
    else:
        g = torch.Generator().manual_seed(0)
        x, z = torch.randn(1000, 64, generator=g), torch.randn(4096, 64, generator=g)
        out = kermac.cdist(x.cuda(), z.cuda(), p=1.0, backend="triton").cpu().double()
        error = ((out - torch.cdist(x.double(), z.double(), p=1.0)).abs().max() / out.abs().max()).item()
        print(json.dumps(error))
    """
)


@pytest.mark.gpu
def test_a_precompiled_first_call_compiles_nothing(tmp_path: Path) -> None:
    """`precompile` on the GPU in one process; `cdist` of other sizes, same layout, in another: every file the
    second adds to Triton's cache is an autotuning record (no compiled kernel), and its result is right."""
    from helpers import require_backend

    require_backend("triton", "cuda")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}

    def run(phase: str) -> object:
        done = subprocess.run(
            [sys.executable, "-c", _GPU_FIRST_CALL, str(tmp_path), phase], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def files() -> set[Path]:
        return {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}

    lines = run("precompile")
    assert len(lines) == 1 and lines[0].startswith("gluon sm_"), lines
    before = files()
    error = run("call")
    added = files() - before
    assert added and all(p.name.endswith(".autotune.json") for p in added), sorted(map(str, added))
    assert error < 1e-6
