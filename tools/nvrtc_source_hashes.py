"""SHA-256 of every NVRTC kernel source the planner can generate for the common variants, to show
that a refactor of the templates or the code generator changes no kernel (no GPU needed).

Covers ``kermac precompile``'s common problems for sm_80 and sm_90, each pairwise one also on the
SIMT kernel and with its epilogue inlined or not, and every fractional-p toggle (ex2 polynomial with
and without flushing, the power table).  Variants a kernel refuses are recorded with their error.

    python tools/nvrtc_source_hashes.py before.json      # on the old tree
    python tools/nvrtc_source_hashes.py after.json       # on the new tree
    cmp before.json after.json
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile

os.environ.setdefault("KERMAC_CACHE_DIR", tempfile.mkdtemp(prefix="kermac-source-hashes-"))

from kermac.problem import GradProblem
from kermac.variants import common_problems
from kermac_backend_nvrtc import plan
from kermac_backend_nvrtc.codegen import arch_capability, grad_source, pairwise_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING


def _hash(build) -> str:
    try:
        source, params = build()
    except ValueError as exc:
        return f"error: {exc}"
    return hashlib.sha256((source + repr([(p.name, p.ctype) for p in params])).encode()).hexdigest()


def source_hashes() -> dict[str, str]:
    hashes: dict[str, str] = {}
    for arch in ("sm_80", "sm_90"):
        capability = arch_capability(arch)
        for i, problem in enumerate(common_problems()):
            key = f"{arch} {i} {problem.program.key()}"
            if isinstance(problem, GradProblem):
                v = plan.plan_grad(problem, capability, DEFAULT_TUNING)[0]
                hashes[key] = _hash(lambda v=v: grad_source(v))
                continue
            v = plan.plan_pairwise(problem, capability, DEFAULT_TUNING)[0]
            hashes[key] = _hash(lambda v=v: pairwise_source(v))
            for inline in (False, True):
                simt = dataclasses.replace(v, tensor_cores=False, wgmma=False, inline_epilogue=inline)
                hashes[f"{key} simt inline={inline}"] = _hash(lambda s=simt: pairwise_source(s))
            for pairs, ftz, degree in ((44, True, 0), (64, False, 0), (38, True, 5), (32, True, 6)):
                split = dataclasses.replace(
                    v, tensor_cores=False, wgmma=False, poly_pairs=pairs, ftz=ftz, pow_degree=degree
                )
                hashes[f"{key} split {pairs} ftz={ftz} degree={degree}"] = _hash(lambda s=split: pairwise_source(s))
    return hashes


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/nvrtc_source_hashes.py OUT.json")
    hashes = source_hashes()
    with open(sys.argv[1], "w") as f:
        json.dump(hashes, f, indent=0, sort_keys=True)
    refused = sum(v.startswith("error") for v in hashes.values())
    print(f"{len(hashes)} sources hashed ({refused} variants refused) -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
