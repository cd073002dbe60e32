"""Digest of the SASS of every NVRTC kernel variant the planner produces, to prove that a change of the
kernel sources or of the code generator leaves every compiled kernel as it was (no GPU needed).

Same SASS means bit-identical outputs and identical speed, so a refactor whose digest equals the old
tree's digest needs no GPU run.  The problems are ``kermac precompile``'s common problems in float32,
float16, bfloat16 and float64, plus a few operand layouts (a transposed x, a feature count that
defeats vector loads, a broadcast batch) and a fractional p in the power table's high-degree range;
each is planned for sm_80 and sm_90 under every planner setting in :data:`SETTINGS`.  Each distinct
(source, target) is compiled once with the backend's compiler into a private cache directory (so the
cache cannot answer), disassembled with ``cuobjdump -sass`` (Triton's bundled copy, else ``PATH``'s),
and recorded under a label made of the target, dtype, problem, layout and setting — names that do
not depend on the backend's internal types, so two trees compare label by label.

    python tools/nvrtc_sass_digest.py before.json    # on the old tree
    python tools/nvrtc_sass_digest.py after.json     # on the new tree
    python tools/nvrtc_sass_digest.py --compare before.json after.json

Output: ``{label: {"sha256": SASS digest, "registers": n, "spills": bytes, "smem": bytes, "ptxas":
ptxas -v summary}}``; the SASS is hashed with the kernel's name line removed.  ``--match`` keeps the
labels containing a substring (the CPU test uses it for one or two variants).  Compiling uses at
most ``--jobs`` worker processes (default 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

#: Planner settings under which every problem is planned, by label: the defaults, and every switch
#: the planner offers, as fields of :class:`kermac_backend_nvrtc.tuning.NvrtcTuning`.
SETTINGS: dict[str, dict[str, object]] = {
    "default": {},
    "simt": {"tensor_cores": False},
    "mma_sync": {"wgmma": False},
    "called_epilogue": {"inline_expensive_epilogue": False},
    "ex2_poly_44": {"power_table": False, "ex2_polynomial_pairs": 44},
    "ex2_poly_64_no_ftz": {"flush_subnormals": False, "ex2_polynomial_pairs": 64},
    "no_split": {"power_table": False, "ex2_polynomial_pairs": 0},
    "no_half_powers": {"half_powers": False},
    "no_one_path": {"zero_padded_k_tail": False},
    "no_k_contiguous": {"k_contiguous_tiles": False},
    "no_k_contiguous_no_one_path": {"k_contiguous_tiles": False, "zero_padded_k_tail": False},
}
ARCHS = ("sm_80", "sm_90")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def cuobjdump_path() -> str:
    """Triton's bundled ``cuobjdump``, else the one on ``PATH`` (for any tool that reads SASS)."""
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("cuobjdump")
    if found is None:
        raise SystemExit("cuobjdump not found (install triton or the CUDA toolkit)")
    return found


def _layout_problems(dtype: torch.dtype) -> Iterator[tuple[str, object]]:
    """(name, problem) of the extra layouts: operands the common problems' contiguous aligned
    tensors do not exercise (other load modes, batch offsets, the degree-6 power table)."""
    from kermac import presets
    from kermac.hyperparams import HyperValue
    from kermac.lowering import cdist_program, grad_program
    from kermac.problem import grad_problem, pairwise_problem

    def empty(*shape: int) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device="meta")

    def hypers(program: object, **values: float) -> dict:
        base = {"p": 1.3, "bandwidth": 1.0, "regularization": 1e-3} | values
        return {n: HyperValue(n, base[n]) for n in program.hypers}

    programs = [cdist_program(p, dtype=dtype) for p in (1.0, 2.0, 1.3)] + [presets.laplace_l1.lower(regularized=True)]
    layouts = {
        "x_transposed": (empty(256, 256).t(), empty(256, 256)),
        "d250": (empty(256, 250), empty(256, 250)),
        "batch": (empty(3, 1, 256, 256), empty(1, 2, 256, 256)),
    }
    for lname, (x, z) in layouts.items():
        for program in programs:
            yield lname, pairwise_problem(program, x, z, out=None, hypers=hypers(program))
    high_p = cdist_program(3.3, dtype=dtype)
    yield "p3.3", pairwise_problem(high_p, empty(256, 256), empty(256, 256), out=None, hypers=hypers(high_p, p=3.3))
    for p in (1.0, 2.0, 1.3):
        program = grad_program(p)
        a, b, c, d = empty(256, 256).t(), empty(64, 250), empty(16, 250), empty(64, 256)
        yield "grad_odd", grad_problem(program, a[:250], b, c, d, out=None, hypers=hypers(program, p=p))
        a, b, c, d = empty(2, 256, 256), empty(64, 256), empty(5, 256), empty(2, 64, 256)
        yield "grad_batch_o5", grad_problem(program, a, b, c, d, out=None, hypers=hypers(program, p=p))


def problems() -> Iterator[tuple[str, object]]:
    """(label stem, problem) of every problem digested."""
    from kermac.variants import common_problems

    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        for i, problem in enumerate(common_problems(dtypes=(dtype,))):
            yield f"{name} {i} common {problem.program.key()}", problem
        for i, (layout, problem) in enumerate(_layout_problems(dtype)):
            yield f"{name} {i} {layout} {problem.program.key()}", problem


def _tuning(values: dict[str, object]) -> object:
    """The default NVRTC tuning with the fields ``values`` changed."""
    from kermac_backend_nvrtc.tuning import DEFAULT_TUNING

    return dataclasses.replace(DEFAULT_TUNING, **values)


def _kernel(problem: object, capability: int, tuning: object) -> tuple[str, str, str]:
    """(source, NVRTC target, kernel name) of ``problem`` planned with ``tuning`` for a device of ``capability``."""
    from kermac.problem import GradProblem
    from kermac_backend_nvrtc import plan
    from kermac_backend_nvrtc.source import kernel_source

    planner = plan.plan_grad if isinstance(problem, GradProblem) else plan.plan_pairwise
    variant = planner(problem, capability, tuning)[0]
    return kernel_source(variant)[0], variant.target(capability), variant.kernel


def jobs(match: str | None = None) -> dict[str, tuple[str, str, str]]:
    """label → (source, target, kernel name) of every digested variant."""
    out = {}
    for stem, problem in problems():
        for arch in ARCHS:
            for setting, values in SETTINGS.items():
                label = f"{arch} {stem} [{setting}]"
                if match is not None and match not in label:
                    continue
                out[label] = _kernel(problem, int(arch.removeprefix("sm_")), _tuning(values))
    return out


def _parse_ptxas(summary: str) -> dict[str, int]:
    def total(pattern: str) -> int:
        return sum(int(v) for v in re.findall(pattern, summary))

    regs = [int(v) for v in re.findall(r"Used (\d+) registers", summary)]
    return {
        "registers": max(regs, default=0),
        "spills": total(r"(\d+) bytes spill stores") + total(r"(\d+) bytes spill loads"),
        "smem": total(r"(\d+) bytes smem"),
    }


def digest_one(source: str, arch: str, name: str) -> dict[str, object]:
    """Compile ``source`` for ``arch`` and digest its SASS (runs in a worker process)."""
    from kermac_backend_nvrtc.compiler import compile_cubin

    compiled = compile_cubin(source, arch, name=name)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(compiled.cubin)
        sass = subprocess.run([cuobjdump_path(), "-sass", str(path)], check=True, capture_output=True, text=True).stdout
    sass = "\n".join(line for line in sass.splitlines() if not line.strip().startswith("Function :"))
    return {
        "sha256": hashlib.sha256(sass.encode()).hexdigest(),
        **_parse_ptxas(compiled.ptxas),
        "ptxas": compiled.ptxas,
    }


def digest(match: str | None = None, workers: int = 2) -> dict[str, dict[str, object]]:
    """label → digest of every variant (each distinct source and target compiled once)."""
    labelled = jobs(match)
    unique = sorted(set(labelled.values()))
    if workers <= 1 or len(unique) <= 1:
        results = [digest_one(*job) for job in unique]
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            results = list(pool.map(digest_one, *zip(*unique, strict=True), chunksize=4))
    by_job = dict(zip(unique, results, strict=True))
    return {label: by_job[job] for label, job in sorted(labelled.items())}


def compare(before: dict[str, dict], after: dict[str, dict]) -> dict[str, list[str]]:
    """Labels by outcome: identical, different (SASS or resources), only in ``before``, only in ``after``."""
    common = before.keys() & after.keys()
    return {
        "identical": sorted(k for k in common if before[k] == after[k]),
        "different": sorted(k for k in common if before[k] != after[k]),
        "before_only": sorted(before.keys() - after.keys()),
        "after_only": sorted(after.keys() - before.keys()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="JSON file to write the digest to")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two digest files")
    parser.add_argument("--match", help="only the labels containing this substring")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        outcome = compare(before, after)
        for label in outcome["different"]:
            print(f"different: {label}\n  before {before[label]}\n  after  {after[label]}")
        print(", ".join(f"{len(v)} {k}" for k, v in outcome.items()))
        return 0 if not (outcome["different"] or outcome["before_only"] or outcome["after_only"]) else 1
    if args.out is None:
        parser.error("give OUT.json, or --compare BEFORE AFTER")
    os.environ["KERMAC_CACHE_DIR"] = tempfile.mkdtemp(prefix="kermac-sass-digest-")
    result = digest(args.match, args.jobs)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} variants, {len({r['sha256'] for r in result.values()})} distinct kernels -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
