"""What ptxas made of an NVRTC kernel's main loop, from its SASS (no GPU needed).

For one of ``kermac precompile``'s common variants (``--match``: a substring of its label, e.g.
``"(abs (sub x z))"``), for ``cdist`` with a given p (``--cdist-p``) or for a kernel preset
(``--preset laplace_l1``; bandwidth 1, p 1.5 where it takes one), the kernel is generated,
compiled for ``--arch`` and disassembled with ``cuobjdump`` (Triton's bundled copy, else the one on
``PATH``).  The main loop is the backward branch's body with the most arithmetic (FADD, FFMA, FMUL,
MUFU; an HMMA or HGMMA counts 16) — for the p = 2 family on ``mma.sync`` that can be the unrolled
exact recomputation of the guard rather than the tensor-core loop.  Printed: ptxas's resource
line, the loop's length and instruction mix, where in the loop (0 = top, 1 = bottom) the global
loads, shared stores and barriers sit, how many instructions separate each shared load from
the first use of its registers, and how many of its fp32 instructions read two operands from one
register bank (a TMA-fed p = 1 prototype that ran slower had 1.5–2.5 times the production loop's
count: docs/dev/simt-pairwise-loops.md).

Why: the k loops are sensitive to where ptxas places the next tile's global loads.  A loop whose
loads were sunk to their shared stores after the math no longer overlaps them with it (the one-path
SIMT loop lost that way once: docs/dev/simt-pairwise-loops.md), and an instruction count alone
does not show it.

    python tools/nvrtc_sass_report.py --cdist-p 1 --d 1024 [--arch sm_90]
    python tools/nvrtc_sass_report.py --preset laplace_l1 --d 128
    python tools/nvrtc_sass_report.py --match "(mul (sub x z) (sub x z));(sqrt acc)" --arch sm_80
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

os.environ.setdefault("KERMAC_CACHE_DIR", tempfile.mkdtemp(prefix="kermac-sass-report-"))

_ARITH = ("FADD", "FFMA", "FMUL", "MUFU", "HMMA", "HGMMA")
_PLACED = ("LDG", "LDGSTS", "STS", "BAR")


@dataclass(frozen=True)
class LoopReport:
    """The main loop of a kernel: its instructions (``op`` without predicate, full text)."""

    ops: tuple[str, ...]
    texts: tuple[str, ...]

    def mix(self) -> collections.Counter:
        return collections.Counter(op.split(".")[0] for op in self.ops)

    def positions(self, prefixes: tuple[str, ...] = _PLACED) -> list[tuple[float, str]]:
        """(position in the loop, instruction) of every instruction whose opcode is in ``prefixes``."""
        n = len(self.ops)
        return [
            (i / n, t)
            for i, (op, t) in enumerate(zip(self.ops, self.texts, strict=True))
            if op.split(".")[0] in prefixes
        ]

    def lds_distances(self) -> list[int]:
        """Instructions from each shared load to the first instruction reading one of its registers."""
        out = []
        for i, (op, text) in enumerate(zip(self.ops, self.texts, strict=True)):
            if op.split(".")[0] != "LDS":
                continue
            m = re.search(r"LDS\S*\s+R(\d+)", text)
            if not m:
                continue
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            dst = set(range(int(m.group(1)), int(m.group(1)) + width))
            for j in range(i + 1, len(self.texts)):
                if _reads(self.texts[j]) & dst:
                    out.append(j - i)
                    break
        return out

    def bank_conflicts(self) -> tuple[int, int]:
        """(fp32 arithmetic instructions of the loop (FADD, FFMA, FMUL) that read two or more
        registers, how many of them read two of those from the register file's same bank — equal
        register numbers modulo 2).  A source the previous instruction marked ``.reuse`` in the same
        operand slot comes from the reuse cache, not the register file, and does not count.  Each
        such pair costs the instruction an extra cycle to read its operands."""
        arithmetic = conflicts = 0
        cached: set[tuple[int, int]] = set()  # (operand slot, register) in the reuse cache
        for op, text in zip(self.ops, self.texts, strict=True):
            operands = _unpredicated(text).split(None, 1)[1:]
            sources = operands[0].split(",")[1:] if operands else []
            regs = [(slot, int(r), ".reuse" in o) for slot, o in enumerate(sources) for r in re.findall(r"\bR(\d+)", o)]
            if op.split(".")[0] in ("FADD", "FFMA", "FMUL") and len(regs) >= 2:
                banks = [r % 2 for slot, r, _ in regs if (slot, r) not in cached]
                arithmetic += 1
                conflicts += len(banks) != len(set(banks))
            cached = {(slot, r) for slot, r, reuse in regs if reuse}
        return arithmetic, conflicts


def _reads(text: str) -> set[int]:
    """Registers an instruction reads: every R operand but the first (its destination), and the
    first too for stores."""
    parts = _unpredicated(text).split(None, 1)
    if len(parts) < 2:
        return set()
    operands = parts[1].split(",")
    read = operands if parts[0].startswith(("ST", "RED", "ATOM")) else operands[1:]
    return {int(r) for o in read for r in re.findall(r"\bR(\d+)", o)}


def parse_sass(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every instruction of a ``cuobjdump -sass`` listing."""
    return [
        (int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;/]*?)\s*;", sass)
    ]


def main_loop(instructions: list[tuple[int, str]]) -> LoopReport:
    """The body of the backward branch with the most arithmetic (tensor-core instructions count 16)."""
    best: tuple[int, list[tuple[int, str]]] | None = None
    for address, text in instructions:
        m = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= address:
            continue
        start = int(m.group(1), 16)
        body = [(a, t) for a, t in instructions if start <= a <= address]
        # A tensor-core instruction stands for many FMAs: the mma loop outranks the guard's SIMT recompute.
        score = sum(
            (16 if op in ("HMMA", "HGMMA") else 1) * (op in _ARITH) for op in (_op(t).split(".")[0] for _, t in body)
        )
        if best is None or score > best[0]:
            best = (score, body)
    if best is None:
        raise ValueError("no loop (backward branch) in this kernel")
    return LoopReport(tuple(_op(t) for _, t in best[1]), tuple(t for _, t in best[1]))


def _unpredicated(text: str) -> str:
    """An instruction without its guard predicate (``@!P0 FADD ...`` -> ``FADD ...``)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text)


def _op(text: str) -> str:
    return _unpredicated(text).split()[0]


def cuobjdump() -> str:
    """Path of a ``cuobjdump`` (Triton's bundled one first)."""
    try:
        import triton

        bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(bundled):
            return bundled
    except ImportError:
        pass
    found = shutil.which("cuobjdump")
    if found is None:
        raise FileNotFoundError("cuobjdump: neither Triton's bundled copy nor one on PATH")
    return found


def kernel_sass(source: str, arch: str, name: str) -> tuple[str, str]:
    """(ptxas resource line, SASS listing) of ``source`` compiled for ``arch``."""
    from kermac_backend_nvrtc.compiler import compile_cubin

    built = compile_cubin(source, arch, name=name)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(built.cubin)
        f.flush()
        sass = subprocess.run([cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return built.ptxas, sass


def planned(
    arch: str,
    *,
    match: str | None = None,
    cdist_p: float | None = None,
    preset: str | None = None,
    d: int = 1024,
    tuning: object = None,
) -> tuple[str, str, str]:
    """(source, kernel name, label) of the chosen problem (one of ``match``, ``cdist_p``,
    ``preset``), planned for ``arch`` with ``tuning`` (an ``NvrtcTuning``; by default the defaults)."""
    import torch

    from kermac import presets
    from kermac.hyperparams import HyperValue
    from kermac.lowering import cdist_program
    from kermac.problem import GradProblem, pairwise_problem
    from kermac.variants import common_problems
    from kermac_backend_nvrtc.plan import plan_grad, plan_pairwise
    from kermac_backend_nvrtc.source import kernel_source
    from kermac_backend_nvrtc.tuning import DEFAULT_TUNING
    from kermac_backend_nvrtc.variants import arch_capability

    tuning = DEFAULT_TUNING if tuning is None else tuning
    cap = arch_capability(arch)
    if cdist_p is not None or preset is not None:
        if preset is not None:
            if preset not in presets.ALL:
                raise SystemExit(f"--preset: expected one of {', '.join(presets.ALL)}, got {preset!r}")
            program, label = presets.ALL[preset].lower(), f"{preset} D={d}"
            values = {"p": 1.5, "bandwidth": 1.0}
        else:
            program, label, values = cdist_program(cdist_p), f"cdist p={cdist_p} D={d}", {"p": cdist_p}
        x = torch.empty(64, d, device="meta")
        hypers = {n: HyperValue(n, values[n]) for n in program.hypers}
        variant = plan_pairwise(pairwise_problem(program, x, x, out=None, hypers=hypers), cap, tuning)[0]
        return kernel_source(variant)[0], variant.kernel, label
    for problem in common_problems():
        grad = isinstance(problem, GradProblem)
        label = f"{'grad' if grad else 'pairwise'} {problem.program.key()}"
        if match in label:
            variant = (plan_grad if grad else plan_pairwise)(problem, cap, tuning)[0]
            return kernel_source(variant)[0], variant.kernel, label
    raise SystemExit(f"--match: no common variant's label contains {match!r}")


def report(loop: LoopReport) -> str:
    """The printed summary of a main loop."""
    mix = loop.mix()
    lines = [f"main loop: {len(loop.ops)} instructions; " + ", ".join(f"{k} {v}" for k, v in mix.most_common(12))]
    lines += [f"  {pos:4.2f}  {text}" for pos, text in loop.positions()]
    dist = loop.lds_distances()
    if dist:
        lines.append(
            f"shared load → first use: min {min(dist)}, median {statistics.median(dist)}, "
            f"under 16: {sum(x < 16 for x in dist)} of {len(dist)} (instructions)"
        )
    arithmetic, conflicts = loop.bank_conflicts()
    if arithmetic:
        lines.append(
            f"register bank conflicts: {conflicts} of {arithmetic} fp32 instructions read two sources of "
            f"one bank (equal register parity, both from the register file)"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--match", help="substring of a common variant's label (as kermac precompile lists them)")
    which.add_argument("--cdist-p", type=float, help="the cdist program of this p")
    which.add_argument("--preset", help="a run_kernel preset, e.g. laplace_l1")
    ap.add_argument("--d", type=int, default=1024, help="features of a --cdist-p or --preset problem (default 1024)")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    source, name, label = planned(args.arch, match=args.match, cdist_p=args.cdist_p, preset=args.preset, d=args.d)
    ptxas, sass = kernel_sass(source, args.arch, name)
    print(f"{label} ({args.arch})\nptxas: {ptxas}")
    print(report(main_loop(parse_sass(sass))))


if __name__ == "__main__":
    sys.exit(main())
