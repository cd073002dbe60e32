"""NVRTC backend without a GPU: the plan memo's key and the launch's argument buffer.

A repeated call skips planning when its ``plan.call_key`` equals an earlier call's and only
refreshes the addresses (``plan.pointer_args``); that is right only if equal keys always mean
equal plans (but for those addresses), each component of the key tells apart problems that plan
differently, and every pointer parameter of the kernel is among the addresses.  The argument
buffer must place each value where the kernel's C parameter list expects it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from kermac import ir, presets, testing
from kermac.hyperparams import HyperValue
from kermac.lowering import cdist_program, grad_program
from kermac.problem import GradProblem, grad_problem, pairwise_problem
from kermac.programs import GradProgram, PairwiseProgram

pytest.importorskip("cuda.core")
from kermac_backend_nvrtc import launcher, plan
from kermac_backend_nvrtc.source import Param, kernel_source
from kermac_backend_nvrtc.tuning import DEFAULT_TUNING, NvrtcTuning

CAPABILITY = 90


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
    # gradient programs in the general form (the SIMT kernel only, whatever O)
    for program, o in ((testing.MAX_GRAD, 3), (testing.MIN_GRAD, 16), (testing.GENERAL_SUM_GRAD, 8)):
        cases.append(grad_problem(program, v(k, m), v(n, k), v(o, k), v(n, m), out=v(o, n, m), hypers={}))
    cases.append(
        grad_problem(
            testing.SOFT_MAX_GRAD, v(2, k, m), v(n, k), v(16, k), v(n, m), out=v(2, 16, n, m),
            hypers=_hypers(gamma=v(2).abs_().add_(1)),
        )
    )  # fmt: skip
    return cases


def _plan(problem, tuning: NvrtcTuning = DEFAULT_TUNING) -> tuple:
    if isinstance(problem, GradProblem):
        return plan.plan_grad(problem, CAPABILITY, tuning)
    return plan.plan_pairwise(problem, CAPABILITY, tuning)


def _key(problem) -> tuple:
    return plan.call_key(problem)[0]


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
        assert plan.call_key(problem)[1] == tuple(pointers.values())  # the addresses a memo hit packs


def _changed(field: dataclasses.Field) -> object:
    """A valid value of tuning ``field`` other than its default."""
    default = getattr(DEFAULT_TUNING, field.name)
    return not default if isinstance(default, bool) else default - 1


def test_equal_keys_mean_equal_plans_under_other_tuning() -> None:
    """With every field changed at once, equal keys still mean equal plans (the key holds no
    tuning: each backend keeps its own memo, of its one tuning)."""
    tuning = NvrtcTuning(**{f.name: _changed(f) for f in dataclasses.fields(NvrtcTuning)})
    groups: dict[tuple, list] = {}
    for problem in _all_problems():
        groups.setdefault(_key(problem), []).append(problem)
    for members in groups.values():
        first = _without_pointers(members[0], _plan(members[0], tuning))
        for other in members[1:]:
            assert _without_pointers(other, _plan(other, tuning)) == first


def _strided(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, dtype: torch.dtype) -> torch.Tensor:
    """A view of ``shape`` and ``strides`` whose first element lies ``offset`` elements past a 256-byte boundary."""
    size = torch.empty((), dtype=dtype).element_size()
    span = sum((n - 1) * st for n, st in zip(shape, strides, strict=True)) + 1
    storage = torch.randn(span + offset + 256, dtype=torch.float64).to(dtype)
    return storage.as_strided(shape, strides, -storage.data_ptr() % 256 // size + offset)


class _OnDevice:
    """``t`` as if it lived on CUDA device ``index`` (all ``call_key`` reads of it but the device are ``t``'s)."""

    def __init__(self, t: torch.Tensor, index: int) -> None:
        self._t, self._index = t, index

    def get_device(self) -> int:
        return self._index

    def __getattr__(self, name: str) -> object:
        return getattr(self._t, name)


def _pairwise_variant(c: str | None) -> object:
    """One pairwise problem, or the same with only key component ``c`` changed."""
    dtype = torch.float64 if c == "dtype" else torch.float32
    program = presets.laplace_l1 if c == "program" else presets.laplace_l2
    m, n, d = (38 if c == "x.shape" else 37), (30 if c == "z.shape" else 29), 16

    def operand(name: str, rows: int, cols: int) -> torch.Tensor:
        row = 72 if c == f"{name}.stride" else 64
        return _strided((rows, cols), (row, 1), int(c == f"{name}.align"), dtype)

    offsets = {"offset_m": int(c == "offset_m"), "offset_n": int(c == "offset_n")}
    hypers = _hypers(bandwidth=3.0 if c == "hypers" else 2.0, regularization=0.5)
    x, z, out = operand("x", m, d), operand("z", n, d), operand("out", m, n)
    problem = pairwise_problem(program.lower(regularized=True), x, z, out=out, hypers=hypers, **offsets)
    return dataclasses.replace(problem, x=_OnDevice(problem.x, 1)) if c == "device" else problem


def _grad_variant(c: str | None, *, o: int = 3, sign: bool = False, features: int = 24) -> object:
    """One gradient problem (of ``o`` outputs and ``features`` rows of b and d; ``sign``: p = 1), or the same
    with only key component ``c`` changed."""
    dtype = torch.float64 if c == "dtype" else torch.float32
    k, m, n = 32, (41 if c == "a.shape" else 40), features + (c == "b.shape")
    o += c == "c.shape"

    def operand(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        row = 56 if c == f"{name}.stride" else 48
        strides = (row * 128, row, 1) if len(shape) == 3 else (row, 1)  # room for up to 128 rows n
        return _strided(shape, strides, int(c == f"{name}.align"), dtype)

    shapes = {"a": (k, m), "b": (n, k), "c": (o, k), "d": (n, m), "out": (o, n, m)}
    a, b, cc, d, out = (operand(name, shape) for name, shape in shapes.items())
    if sign:
        program, hypers = grad_program(1.0), {}
    else:
        program, hypers = grad_program(None), _hypers(p=1.75 if c == "hypers" else 1.5)
        if c == "program":  # the same multiply without the NaN guard of the epilogue
            program = GradProgram(multiply=program.multiply, epilogue=ir.Var("acc"))
    problem = grad_problem(program, a, b, cc, d, out=out, hypers=hypers)
    return dataclasses.replace(problem, a=_OnDevice(problem.a, 1)) if c == "device" else problem


# Which alignments planning reads depends on the kernel: a's and b's on the SIMT one (O = 3), c's on
# the tensor-core one (O = 16), out's on the sign product (p = 1, sm_90, from 96 features); d's on none
# today (it is in the key in case a planner comes to read it).
_GRAD_SETUP = {"c.align": {"o": 16}, "out.align": {"o": 16, "sign": True, "features": 96}}
_UNREAD = ("device", "d.align")  # planning on the CPU reads no device; a kernel is loaded per device


PAIRWISE_KEY = ["program", "dtype", "device", "x.shape", "x.stride", "x.align", "z.shape", "z.stride", "z.align",
                "out.stride", "out.align", "offset_m", "offset_n", "hypers"]  # fmt: skip
GRAD_KEY = ["program", "dtype", "device", "a.shape", "a.stride", "a.align", "b.shape", "b.stride", "b.align",
            "c.shape", "c.stride", "c.align", "d.stride", "d.align", "out.stride", "out.align", "hypers"]  # fmt: skip


@pytest.mark.parametrize(
    ("build", "component"),
    [(_pairwise_variant, c) for c in PAIRWISE_KEY] + [(_grad_variant, c) for c in GRAD_KEY],
    ids=[f"pairwise-{c}" for c in PAIRWISE_KEY] + [f"grad-{c}" for c in GRAD_KEY],
)
def test_each_key_component_tells_problems_apart(build, component: str) -> None:
    """Two problems that differ in one thing planning reads differ in the key in that component
    only, and plan differently: no key component can be dropped."""
    setup = _GRAD_SETUP.get(component, {}) if build is _grad_variant else {}
    base, other = build(None, **setup), build(component, **setup)
    names = PAIRWISE_KEY if build is _pairwise_variant else GRAD_KEY
    differ = [names[i] for i, (u, v) in enumerate(zip(_key(base), _key(other), strict=True)) if u != v]
    assert differ == [component]
    if component not in _UNREAD:
        assert _without_pointers(base, _plan(base)) != _without_pointers(other, _plan(other))


def test_key_tells_signed_zeros_apart() -> None:
    """-0.0 == 0.0, but a kernel adds the regularisation as given (the sign of a zero entry)."""
    cases = _pairwise_cases(0)
    minus_zero, plus_zero = cases[-4], cases[-3]
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
