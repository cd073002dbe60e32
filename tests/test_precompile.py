"""``kermac precompile`` and the common problems it compiles (a recording fake backend: no compiler needed)."""

from __future__ import annotations

import pytest
import torch

from kermac import presets, registry
from kermac.backend import Availability, Backend
from kermac.cli import main
from kermac.lowering import cdist_program, grad_program
from kermac.problem import GradProblem
from kermac.variants import common_problems


class Recorder(Backend):
    name = "recorder"
    priority = -1

    def __init__(self) -> None:
        self.calls: list[tuple[list, object]] = []

    def availability(self) -> Availability:
        return Availability.no("records precompile calls only")

    def check_pairwise(self, problem):
        return "records only"

    def pairwise(self, problem):
        raise AssertionError

    def check_grad(self, problem):
        return "records only"

    def grad(self, problem):
        raise AssertionError

    def precompile(self, problems, *, archs=None):
        self.calls.append((problems, archs))
        return [p.program.key() for p in problems]


def test_common_problems_cover_the_api_without_a_gpu() -> None:
    problems = common_problems("meta", [torch.float32, torch.bfloat16])
    keys = {p.program.key() for p in problems}
    for p in (0.0, 1.0, 2.0, 1.3, float("inf"), None):
        assert cdist_program(p, dtype=torch.float32).key() in keys
    assert all(d.lower(regularized=r).key() in keys for d in presets.ALL.values() for r in (False, True))
    assert all(grad_program(p).key() in keys for p in (1.0, 2.0, 1.3))
    assert {p.dtype for p in problems} == {torch.float32, torch.bfloat16}
    assert all(p.device.type == "meta" for p in problems)
    assert sum(isinstance(p, GradProblem) for p in problems) == 6
    # The number p is one no backend specialises (not a multiple of 1/2), so its kernel serves every p.
    scalar_ps = {q.hypers["p"].scalar for q in problems if "p" in q.hypers and q.hypers["p"].tensor is None}
    assert scalar_ps == {1.3}


def test_cli_precompile_calls_each_compiling_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    rec = Recorder()
    monkeypatch.setattr(
        registry, "registered_backends", lambda: {"recorder": rec, "torch": registry.get_backend("torch")}
    )
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU defaults")
    assert main(["precompile", "--dtype", "float16"]) == 0
    ((problems, archs),) = rec.calls  # the reference backend compiles nothing and is not asked
    assert archs == ["sm_80", "sm_90"] and {p.dtype for p in problems} == {torch.float16}
    out = capsys.readouterr().out
    assert f"recorder: {len(problems)} variant(s)" in out
    assert main(["precompile", "--backends", "recorder", "--arch", "sm_86"]) == 0
    assert rec.calls[-1][1] == ["sm_86"]
    assert main(["precompile", "--backends", "nope"]) == 2


def test_precompile_help_describes_the_command(capsys) -> None:
    assert main(["precompile", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Compile the kernels of the common problems" in out and "JIT cache ahead of time" in out
