"""NVRTC backend without a GPU: the plan memo's key and the launch's argument buffer.

A repeated call skips planning when its ``plan.plan_key`` equals an earlier call's and only
refreshes ``plan.pointer_args``; that is right only if equal keys always mean equal plans (but for
those addresses) and every pointer parameter of the kernel is among them.  The argument buffer
must place each value where the kernel's C parameter list expects it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from kermac import ir, presets
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program, grad_program
from kermac.problem import GradProblem, grad_problem, pairwise_problem
from kermac.programs import PairwiseProgram

pytest.importorskip("cuda.core")
from kermac_backend_nvrtc import launcher, plan
from kermac_backend_nvrtc.source import Param, kernel_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING, NvrtcTuning

DEVICE, CAPABILITY = 0, 90


def _view(*shape: int, offset: int = 0, dtype: torch.dtype = torch.float32, transpose: bool = False) -> torch.Tensor:
    """A fresh tensor of ``shape`` whose first element lies ``offset`` elements past a 256-byte
    boundary (optionally the transpose of a row-major one)."""
    inner = shape[:-2] + (shape[-1], shape[-2]) if transpose else shape
    n = 1
    for s in inner:
        n *= s
    size = torch.empty((), dtype=dtype).element_size()
    storage = torch.randn(n + offset + 256, dtype=torch.float64).to(dtype)
    start = -storage.data_ptr() % 256 // size + offset
    t = storage[start : start + n].view(inner)
    return t.transpose(-1, -2) if transpose else t


def _hypers(**values: float | torch.Tensor) -> dict[str, HyperValue]:
    return {k: HyperValue(k, v) if isinstance(v, float) else HyperValue(k, None, v) for k, v in values.items()}


def _pairwise_cases(offset: int) -> list:
    """Pairwise problems whose every tensor starts ``offset`` elements into its storage."""
    v = lambda *s, **kw: _view(*s, offset=offset, **kw)  # noqa: E731
    m, n, d = 37, 29, 16
    cases = []
    for p in (1.0, 2.0, 1.3, 1.5, 0.5):
        program = cdist_program(p)
        hy = _hypers(p=p) if "p" in program.hypers else {}
        cases.append((program, v(m, d), v(n, d), v(m, n), hy))
    for dtype in (torch.float64, torch.float16):
        cases.append((cdist_program(1.0), v(m, d, dtype=dtype), v(n, d, dtype=dtype), v(m, n, dtype=dtype), {}))
    cases.append((cdist_program(1.0), v(m, d, transpose=True), v(n, d, transpose=True), v(m, n, transpose=True), {}))
    cases.append((cdist_program(2.0), v(2, 1, m, d), v(3, n, d), v(2, 3, m, n), {}))
    cases.append((cdist_program(None), v(3, m, d), v(n, d), v(3, m, n), _hypers(p=v(3).abs_().add_(1))))
    laplace = presets.laplace_l2.lower(regularized=True)
    cases.append((laplace, v(m, 24), v(n, 24), v(2, m, n), _hypers(bandwidth=v(2).abs_().add_(1), regularization=0.5)))
    cases.append((laplace, v(m, 24), v(n, 24), v(m, n), _hypers(bandwidth=2.0, regularization=-0.0)))
    cases.append((laplace, v(m, 24), v(n, 24), v(m, n), _hypers(bandwidth=2.0, regularization=0.0)))
    problems = [pairwise_problem(prog, x, z, out=out, hypers=hy, offset_m=1) for prog, x, z, out, hy in cases]
    for shift in (0, 5):  # the regularised diagonal elsewhere
        hy = _hypers(bandwidth=2.0, regularization=0.5)
        problems.append(pairwise_problem(laplace, v(m, 24), v(n, 24), out=v(m, n), hypers=hy, offset_n=shift))
    return problems


def _grad_cases(offset: int) -> list:
    v = lambda *s, **kw: _view(*s, offset=offset, **kw)  # noqa: E731
    k, m, n = 21, 19, 11
    cases = []
    for power, o in ((1.0, 3), (1.0, 16), (2.0, 8), (1.5, 16), (1.3, 2)):
        program = grad_program(power)
        hy = _hypers(p=power) if "p" in program.hypers else {}
        cases.append(grad_problem(program, v(k, m), v(n, k), v(o, k), v(n, m), out=v(o, n, m), hypers=hy))
    a_t = v(k, m, transpose=True)
    cases.append(grad_problem(grad_program(2.0), a_t, v(n, k), v(9, k), v(n, m), out=v(9, n, m), hypers={}))
    cases.append(
        grad_problem(
            grad_program(None), v(2, 1, k, m), v(n, k), v(3, 5, k), v(1, n, m), out=v(2, 3, 5, n, m),
            hypers=_hypers(p=v(2, 1).abs_().add_(1)),
        )
    )  # fmt: skip
    return cases


def _plan(problem, tuning: NvrtcTuning = DEFAULT_TUNING) -> tuple:
    if isinstance(problem, GradProblem):
        return plan.plan_grad(problem, CAPABILITY, tuning)
    return plan.plan_pairwise(problem, CAPABILITY, tuning)


def _key(problem, device: int = DEVICE, tuning: NvrtcTuning = DEFAULT_TUNING) -> tuple:
    return plan.plan_key(problem, device, tuning)


def _without_pointers(problem, planned: tuple) -> tuple:
    variant, launch = planned
    pointers = plan.pointer_args(problem)
    return variant, dataclasses.replace(launch, args={k: v for k, v in launch.args.items() if k not in pointers})


def _source_params(problem, variant) -> list[Param]:
    return kernel_source(variant)[1]


OFFSETS = (0, 1, 2, 4, 64, 65)  # elements; 64 float32 (256 bytes) from 0 must plan alike


def _all_problems() -> list:
    return [pr for off in OFFSETS for pr in _pairwise_cases(off) + _grad_cases(off)]


def test_equal_keys_mean_equal_plans_but_for_the_pointers() -> None:
    groups: dict[tuple, list] = {}
    for problem in _all_problems():
        groups.setdefault(_key(problem), []).append(problem)
    assert len(groups) < len(_all_problems())  # some problems do share a plan
    for members in groups.values():
        first = _without_pointers(members[0], _plan(members[0]))
        for other in members[1:]:
            assert _without_pointers(other, _plan(other)) == first


def test_addresses_256_bytes_apart_share_a_key() -> None:
    for a, b in zip(_pairwise_cases(0) + _grad_cases(0), _pairwise_cases(64) + _grad_cases(64), strict=True):
        if a.dtype == torch.float32:
            assert _key(a) == _key(b)


def test_pointer_args_are_every_pointer_parameter() -> None:
    """A memo hit refreshes exactly the kernel's pointer parameters, with the planner's values."""
    for problem in _pairwise_cases(1) + _grad_cases(1):
        variant, launch = _plan(problem)
        pointers = plan.pointer_args(problem)
        assert {p.name for p in _source_params(problem, variant) if p.ctype.endswith("*")} == set(pointers)
        assert {k: launch.args[k] for k in pointers} == pointers


def _changed(field: dataclasses.Field) -> object:
    """A valid value of tuning ``field`` other than its default."""
    default = getattr(DEFAULT_TUNING, field.name)
    return not default if isinstance(default, bool) else default - 1


@pytest.mark.parametrize("field", dataclasses.fields(NvrtcTuning), ids=lambda f: f.name)
def test_key_holds_the_tuning(field: dataclasses.Field) -> None:
    """Every tuning field is in the key: backends of different tuning never share a plan."""
    problem = _pairwise_cases(0)[2]  # cdist p = 1.3
    tuning = dataclasses.replace(DEFAULT_TUNING, **{field.name: _changed(field)})
    assert _key(problem, tuning=tuning) != _key(problem)
    assert _key(problem, tuning=NvrtcTuning(**{field.name: _changed(field)})) == _key(problem, tuning=tuning)


def test_equal_keys_mean_equal_plans_under_other_tuning() -> None:
    """With every field changed at once, equal keys still mean equal plans."""
    tuning = NvrtcTuning(**{f.name: _changed(f) for f in dataclasses.fields(NvrtcTuning)})
    groups: dict[tuple, list] = {}
    for problem in _all_problems():
        groups.setdefault(_key(problem, tuning=tuning), []).append(problem)
    for members in groups.values():
        first = _without_pointers(members[0], _plan(members[0], tuning))
        for other in members[1:]:
            assert _without_pointers(other, _plan(other, tuning)) == first


def test_key_tells_devices_and_signed_zeros_apart() -> None:
    cases = _pairwise_cases(0)
    assert _key(cases[0], 0) != _key(cases[0], 1)
    minus_zero, plus_zero = cases[-4], cases[-3]  # regularization -0.0 and 0.0: the kernel adds it as given
    assert _key(minus_zero) != _key(plus_zero)


def _natural_offsets(params: list[Param], compute: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter under the C rule: each at the next multiple of its size."""
    sizes = {"int": 4, "long long": 8, "km_t": 4 if compute == "float" else 8}
    out, offset = [], 0
    for p in params:
        size = 8 if p.ctype.endswith("*") else sizes[p.ctype]
        offset = -(-offset // size) * size
        out.append((offset, size))
        offset += size
    return out


@pytest.mark.parametrize("compute", ["float", "double"])
def test_argument_buffer_places_each_value_at_its_c_offset(compute: str) -> None:
    types = ["const float*", "int", "long long", "km_t", "float*", "int", "km_t", "long long"]
    for order in itertools.islice(itertools.permutations(types), 0, 400, 7):
        params = [Param(f"p{i}", t) for i, t in enumerate(order)]
        layout = launcher.argument_layout(params, compute)
        values = [1.5 + i if p.ctype == "km_t" else 1000 + i for i, p in enumerate(params)]
        data = layout.pack(*values)
        for (offset, size), p, value in zip(_natural_offsets(params, compute), params, values, strict=True):
            raw = data[offset : offset + size]
            if p.ctype == "km_t":
                got = torch.frombuffer(bytearray(raw), dtype=torch.float32 if size == 4 else torch.float64).item()
            else:
                got = int.from_bytes(raw, "little", signed=True)
            assert got == value, (order, p)


def test_argument_buffer_of_every_generated_kernel() -> None:
    for problem in _pairwise_cases(0) + _grad_cases(0):
        variant, launch = _plan(problem)
        params = _source_params(problem, variant)
        compute = variant.compute
        layout = launcher.argument_layout(params, compute)
        values = {**launch.args, "zbase": 0}
        assert set(values) >= {p.name for p in params}
        last_offset, last_size = _natural_offsets(params, compute)[-1]
        assert layout.size == last_offset + last_size
        layout.pack(*[values[p.name] for p in params])  # every value fits its C type


def test_unknown_parameter_type_is_refused() -> None:
    with pytest.raises(AssertionError, match="unsigned"):
        launcher.argument_layout([Param("n", "unsigned")], "float")


def test_user_programs_key_by_value() -> None:
    """Equal user programs built separately share a key; a different one does not."""
    x, z, out = _view(5, 3), _view(4, 3), _view(5, 4)

    def problem(inner: ir.Expr):
        program = PairwiseProgram(inner=inner, reduction="sum", epilogue=ir.Var("acc"))
        return pairwise_problem(program, x, z, out=out, hypers={})

    t = ir.Var("x") - ir.Var("z")
    assert _key(problem(abs(t))) == _key(problem(abs(t)))
    assert _key(problem(abs(t))) != _key(problem(t * t))


def test_scalar_hyperparameters_are_passed_as_the_compute_type_rounds_them() -> None:
    """A number past float's range is +-inf in a float32 kernel (struct.pack('f') raised OverflowError
    for 1e300), and it is not taken for a finite exponent >= 1 (the split-power fast path)."""
    program = PairwiseProgram(abs(ir.Var("x") - ir.Var("z")) * ir.Hyper("h"), "sum", ir.Var("acc"))
    x, z = torch.empty(5, 3, device="meta"), torch.empty(4, 3, device="meta")
    for value, expected in ((1e300, math.inf), (-1e300, -math.inf), (1e-50, 0.0), (0.1, 0.10000000149011612)):
        problem = pairwise_problem(program, x, z, out=None, hypers={"h": HyperValue("h", value)})
        _, launch = _plan(problem)
        assert launch.args["hv_h"] == expected, value
        problem64 = pairwise_problem(program, x.double(), z.double(), out=None, hypers={"h": HyperValue("h", value)})
        assert _plan(problem64)[1].args["hv_h"] == value
