"""The Triton backend's per-key launchers (`kermac_backend_triton.launchers`), on the CPU.

- The key's integer and pointer facts are exactly what Triton's own specialisation sees (checked
  against the installed Triton's specialiser): equal facts bind the same compiled kernel, and
  no two calls Triton would serve from one kernel get different keys.
- Every component of the key (alignment, divisibility by 16, equality to 1, dtype, scalar or
  tensor hyperparameter, batch dimensions, 64-bit indexing, the autotuning bucket) gives a key
  of its own, and calls alternating between keys compute the right values (float64 references).
- The direct launch (`CompiledKernel[grid](*args, stream=...)`) passes exactly the arguments
  Triton bound at the first launch: here a stand-in compiled kernel runs the interpreted kernel
  with them.  Under the interpreter itself the launcher never launches directly.
- The capture guard: only a first launch consults it, and its error names the variant and what to do.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import math

import pytest
import torch

import kermac
from kermac import presets
from kermac.hyperparams import HyperValue
from kermac.problem import grad_problem, pairwise_problem

triton = pytest.importorskip("triton")
launch = pytest.importorskip("kermac_backend_triton.launch")
launchers = importlib.import_module("kermac_backend_triton.launchers")  # part of the backend: never skipped

interpreted = pytest.mark.skipif(
    not launch.interpreting(), reason="runs CPU tensors through Triton's interpreter (TRITON_INTERPRET=1)"
)


# --- the facts against Triton's own specialisation ------------------------------------------------


def _triton_specialiser():
    """Triton's per-argument specialisation: (type, attribute) of a value, from Triton's own code
    (native from Triton 3.6 on; before, the JIT's Python specialiser with the CUDA backend's extra)."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:
        native_specialize_impl = None
    if native_specialize_impl is not None:
        return lambda v, specialise: native_specialize_impl(BaseBackend, v, False, specialise, True)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import jit

    extra = make_backend(GPUTarget("cuda", 90, 32)).get_arg_specialization
    try:
        impl = jit.create_specialize_impl(extra)
    except TypeError:  # Triton 3.3: the extra is an argument of each call
        impl3 = jit.create_specialize_impl()
        return lambda v, specialise: impl3(v, extra, False, specialise, True)
    return lambda v, specialise: impl(v, False, specialise, True)


INTS = [0, 1, 2, 15, 16, 17, 32, 48, 100, 2**31 - 16, 2**31 - 1, 2**31, 2**32, 2**40 + 16, 2**63, 2**64 - 1, -16, -1]


def test_int_facts_are_exactly_tritons_specialisation() -> None:
    """Two integers have equal facts iff Triton specialises them alike (specialised or not)."""
    spec = _triton_specialiser()
    for specialise in (True, False):
        for a in INTS:
            for b in INTS:
                mine = (
                    launchers.int_facts([a], []) == launchers.int_facts([b], [])
                    if specialise
                    else launchers.int_facts([], [a]) == launchers.int_facts([], [b])
                )
                assert mine == (spec(a, specialise) == spec(b, specialise)), (a, b, specialise)


def test_pointer_facts_are_exactly_tritons_specialisation() -> None:
    base = torch.zeros(64, dtype=torch.float64)
    tensors = [
        base,
        base[1:],
        base[2:],
        base.view(torch.float32),
        base.view(torch.float32)[1:],
        base.view(torch.float32)[4:],
        base.view(torch.float16)[8:],
    ]
    spec = _triton_specialiser()
    for a in tensors:
        for b in tensors:
            same = launchers.pointer_facts([a]) == launchers.pointer_facts([b])
            assert same == (spec(a, True) == spec(b, True)), (a.dtype, a.data_ptr() % 16, b.dtype, b.data_ptr() % 16)
    assert launchers.pointer_facts([2.0, 3.5]) == (None, None)  # scalars: typed by the signature


# --- a stand-in for Triton's compiled kernel, running the interpreter ------------------------------


class _Compiled(triton.compiler.CompiledKernel):
    """Launched as Triton's JIT launches a compiled kernel, `[grid](*bound_args, stream=...)`;
    runs the interpreted kernel with exactly those (positional) arguments."""

    def __init__(self, kernel: object, log: list) -> None:
        self.module = None  # nothing loaded (CompiledKernel.__del__ reads it)
        self.kernel, self.log = kernel, log

    def __getitem__(self, grid: tuple[int, int, int]):
        def run(*args: object, stream: int) -> None:
            self.log.append(("direct", grid))
            self.kernel[grid](*args)

        return run


class _Jit:
    """Wraps an interpreted kernel as Triton's JIT behaves: `[grid](*args, **kwargs)` calls `grid`
    with the bound arguments (the caller's objects, in parameter order), launches, and returns
    the compiled kernel."""

    def __init__(self, kernel: object, log: list) -> None:
        self.kernel, self.log = kernel, log

    def __getitem__(self, grid):
        def run(*args: object, **kwargs: object) -> _Compiled:
            names = self.kernel.arg_names
            bound = {name: args[i] if i < len(args) else kwargs[name] for i, name in enumerate(names)}
            self.log.append(("jit", bound))
            self.kernel[grid(bound)](*args, **kwargs)
            return _Compiled(self.kernel, self.log)

        return run


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty launcher caches (restored afterwards)."""
    monkeypatch.setattr(launch, "_families", {})


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch, fresh: None) -> list:
    """Launches as on a GPU with a Triton that has the direct launch: returns the log of launches."""
    log: list = []
    real = launch._kernel
    monkeypatch.setattr(launch, "_kernel", lambda spec, autotune, debug: _Jit(real(spec, autotune, debug), log))
    monkeypatch.setattr(launchers, "direct_allowed", lambda device_index: True)
    monkeypatch.setattr(launchers, "_stream_source", lambda: lambda device_index: 0)
    return log


def _ref(x: torch.Tensor, z: torch.Tensor, p: float) -> torch.Tensor:
    return torch.cdist(x.double(), z.double(), p=p)


def _laplace(x: torch.Tensor, z: torch.Tensor, bandwidth: torch.Tensor | float) -> torch.Tensor:
    bw = torch.as_tensor(bandwidth, dtype=torch.float64)
    return torch.exp(-_ref(x, z, 2.0) / bw.reshape(bw.shape + (1, 1)))


def _check(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    tol = 1e-12 if out.dtype == torch.float64 else 2e-5
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol, msg=what)


def _cases(g: torch.Generator) -> dict[str, tuple]:
    """(program, x, z, out, hypers, reference) per key component, each differing from "base" in one."""

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype)

    l1 = presets.l1_distance.lower()
    lap = presets.laplace_l2.lower()
    x, z = r(21, 5), r(16, 5)
    shifted = r(22 * 5 + 1)[1 : 1 + 21 * 5].view(21, 5)  # 4 bytes past a 16-byte boundary
    xt = r(5, 21).t()  # unit stride along rows: the stride-1 facts change
    x17, z17 = r(21, 17), r(16, 17)
    bw = torch.tensor([0.5, 2.0, 1.5])
    xb, zb = r(3, 21, 17), r(3, 16, 17)
    cases = {
        "base": (l1, x, z, torch.empty(21, 16), {}, _ref(x, z, 1.0)),
        "misaligned x": (l1, shifted, z, torch.empty(21, 16), {}, _ref(shifted, z, 1.0)),
        "misaligned out": (l1, x, z, torch.empty(21 * 16 + 1)[1:].view(21, 16), {}, _ref(x, z, 1.0)),
        "N not a multiple of 16": (l1, x, z[:15], torch.empty(21, 15), {}, _ref(x, z[:15], 1.0)),
        "N = 1": (l1, x, z[:1], torch.empty(21, 1), {}, _ref(x, z[:1], 1.0)),
        "transposed x": (l1, xt, z, torch.empty(21, 16), {}, _ref(xt, z, 1.0)),
        "float64": (l1, x.double(), z.double(), torch.empty(21, 16, dtype=torch.float64), {}, _ref(x, z, 1.0)),
        "other bucket": (l1, r(70, 5), z, None, {}, None),
        "scalar bandwidth": (lap, x17, z17, torch.empty(21, 16), {"bandwidth": 1.5}, _laplace(x17, z17, 1.5)),
        "batched bandwidth": (lap, xb, zb, torch.empty(3, 21, 16), {"bandwidth": bw}, _laplace(xb, zb, bw)),
        "float64 bandwidth": (
            lap,
            xb,
            zb,
            torch.empty(3, 21, 16),
            {"bandwidth": bw.double()},
            _laplace(xb, zb, bw),
        ),
    }
    prog, x70, z70, _, hypers, _ = cases["other bucket"]
    cases["other bucket"] = (prog, x70, z70, torch.empty(70, 16), hypers, _ref(x70, z70, 1.0))
    return cases


def _problem(case: tuple):
    program, x, z, out, hypers, _ = case
    values = {k: _hyper(k, v) for k, v in hypers.items()}
    return pairwise_problem(program, x, z, out=out, hypers=values)


def _hyper(name: str, value: object) -> HyperValue:
    if isinstance(value, torch.Tensor):
        return HyperValue(name, None, value)
    return HyperValue(name, float(value))


def _run(case: tuple) -> torch.Tensor:
    problem = _problem(case)
    problem.out.fill_(math.nan)
    launch.run_pairwise(problem)
    return problem.out


@interpreted
def test_each_key_component_has_its_own_launcher_and_computes_right(direct: list) -> None:
    """Each case differs from another in one key component: its first call compiles (a JIT
    launch), every later call launches directly; alternating calls stay right."""
    g = torch.Generator().manual_seed(3)
    cases = _cases(g)
    for name, case in cases.items():
        before = sum(kind == "jit" for kind, _ in direct)
        _check(_run(case), case[-1], f"{name}: first call")
        assert sum(kind == "jit" for kind, _ in direct) == before + 1, f"{name} reused another key's launcher"
    jit_launches = sum(kind == "jit" for kind, _ in direct)
    for _ in range(2):
        for name, case in cases.items():
            program, x, z, out, hypers, _ = case
            x.copy_(torch.randn(x.shape, generator=g))  # new values, same layout
            ref = (
                _laplace(x, z, hypers["bandwidth"]) if "bandwidth" in hypers else _ref(x, z, 1.0)
            )  # every case but the Laplace ones is cdist p = 1
            _check(_run((program, x, z, out, hypers, ref)), ref, f"{name}: a later call")
    assert sum(kind == "jit" for kind, _ in direct) == jit_launches  # all later calls launched directly
    assert sum(kind == "direct" for kind, _ in direct) == 2 * len(cases)


@interpreted
def test_the_direct_launch_passes_what_triton_bound(direct: list) -> None:
    """The compiled kernel gets the per-call arguments, then the autotuning key and the
    meta-parameters of the first launch, in the kernel's parameter order."""
    g = torch.Generator().manual_seed(5)
    x, z = torch.randn(9, 4, generator=g), torch.randn(7, 4, generator=g)
    out = torch.empty(9, 7)
    problem = pairwise_problem(presets.l1_distance.lower(), x, z, out=out, hypers={})
    launch.run_pairwise(problem)
    ((_, bound),) = [entry for entry in direct if entry[0] == "jit"]
    (family,) = launch._families.values()
    (launcher,) = family.launchers.values()
    names = list(bound)
    head = len(names) - len(launcher.tail)
    assert names[head] == "KEY" and launcher.tail == tuple(bound[n] for n in names[head:])
    assert all(a is b for a, b in zip(bound.values(), (x, z, out), strict=False))  # the caller's tensors
    x2 = torch.randn(9, 4, generator=g)
    launch.run_pairwise(pairwise_problem(presets.l1_distance.lower(), x2, z, out=out, hypers={}))
    _check(out, _ref(x2, z, 1.0), "direct launch")
    assert direct[-1][0] == "direct"


@interpreted
def test_a_64_bit_indexing_call_has_its_own_launcher(direct: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """64-bit indexing is part of the key: a call that needs it never reuses the 32-bit kernel."""
    g = torch.Generator().manual_seed(7)
    x, z = torch.randn(9, 4, generator=g), torch.randn(7, 4, generator=g)
    out = torch.empty(9, 7)
    specs = []
    real = launch._kernel
    monkeypatch.setattr(launch, "_kernel", lambda spec, a, d: specs.append(spec) or real(spec, a, d))
    launch.run_pairwise(pairwise_problem(presets.l1_distance.lower(), x, z, out=out, hypers={}))
    monkeypatch.setattr(launch, "_needs_int64", lambda tensors, programs: True)
    launch.run_pairwise(pairwise_problem(presets.l1_distance.lower(), x, z, out=out, hypers={}))
    assert [s.int64 for s in specs] == [False, True]
    _check(out, _ref(x, z, 1.0), "64-bit indices")


@interpreted
def test_gradient_launchers(direct: list) -> None:
    """The gradient contraction: a new key compiles, the same key launches directly, both right;
    BO (from O) is part of the key (O = 16 and 17 share a bucket, not a BO)."""
    g = torch.Generator().manual_seed(11)
    program = kermac.GradProgram(kermac.ir.sign(kermac.ir.Var("d") - kermac.ir.Var("b")), kermac.ir.Var("acc"))

    def ref(a, b, c, d):
        a, b, c, d = (t.double() for t in (a, b, c, d))
        return torch.einsum("ok,km,nmk->onm", c, a, torch.sign(d[:, :, None] - b[:, None, :]))

    for o in (16, 17, 16):
        k, m, n = 6, 5, 4
        a, b = torch.randn(k, m, generator=g), torch.randn(n, k, generator=g)
        c, d = torch.randn(o, k, generator=g), torch.randn(n, m, generator=g)
        problem = grad_problem(program, a, b, c, d, out=None, hypers={})
        launch.run_grad(problem)
        _check(problem.out, ref(a, b, c, d), f"O={o}")
    kinds = [kind for kind, _ in direct]
    assert kinds == ["jit", "jit", "direct"]


@interpreted
def test_the_interpreter_never_launches_directly(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real interpreter path: the launcher keeps no compiled kernel, later calls launch through
    `kernel[grid]` without looking the kernel up again, and stay right."""
    g = torch.Generator().manual_seed(13)
    x, z = torch.randn(9, 4, generator=g), torch.randn(7, 4, generator=g)
    out = torch.empty(9, 7)
    launch.run_pairwise(pairwise_problem(presets.l1_distance.lower(), x, z, out=out, hypers={}))
    (family,) = launch._families.values()
    (launcher,) = family.launchers.values()
    assert launcher.compiled is None and not launchers.direct_allowed(-1)

    def no_lookup(*args: object) -> None:
        raise AssertionError("a key seen before looked its kernel up again")

    monkeypatch.setattr(launch, "_kernel", no_lookup)
    x2 = torch.randn(9, 4, generator=g)
    launch.run_pairwise(pairwise_problem(presets.l1_distance.lower(), x2, z, out=out, hypers={}))
    _check(out, _ref(x2, z, 1.0), "second call")


# --- the capture guard -------------------------------------------------------------------------


def test_the_capture_guard_names_the_variant_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError) as info:
        launchers.check_not_capturing(0, lambda: "THE VARIANT")
    message = str(info.value)
    assert "THE VARIANT" in message and "capturing" in message and "autotun" in message
    assert "once before capturing" in message
    launchers.check_not_capturing(-1, lambda: "CPU")  # CPU tensors are never captured
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    launchers.check_not_capturing(0, lambda: "not capturing")


@interpreted
def test_only_a_first_launch_consults_the_capture_guard(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused first launch compiles nothing and keeps no launcher; once it ran, the key's calls
    never ask again (the check costs a call into CUDA)."""
    asked: list[str] = []

    def capturing(device_index: int, variant) -> None:
        asked.append(variant())
        raise RuntimeError("capturing")

    monkeypatch.setattr(launch, "check_not_capturing", capturing)
    x, z = torch.randn(9, 4), torch.randn(7, 4)
    out = torch.empty(9, 7)
    program = presets.l1_distance.lower()
    with pytest.raises(RuntimeError, match="capturing"):
        launch.run_pairwise(pairwise_problem(program, x, z, out=out, hypers={}))
    assert len(asked) == 1 and program.key() in asked[0] and "simt kernel" in asked[0]
    assert all(not f.launchers for f in launch._families.values())
    monkeypatch.setattr(launch, "check_not_capturing", lambda device_index, variant: asked.append("ok"))
    launch.run_pairwise(pairwise_problem(program, x, z, out=out, hypers={}))
    launch.run_pairwise(pairwise_problem(program, x, z, out=out, hypers={}))
    assert asked[1:] == ["ok"]
    _check(out, _ref(x, z, 1.0), "after the capture")


# --- the grid-size check's early return -----------------------------------------------------------


def test_the_grid_size_check_agrees_with_the_smallest_tiles() -> None:
    """Where every output could take a program of its own the check returns early; elsewhere it
    counts the smallest tiles.  Either way the verdict is the tile count's (stride-0 operands:
    no memory behind the large sizes)."""
    from kermac.problem import GradProblem, PairwiseProblem

    configs = launch.configs
    limit = 2**31 - 1

    def tiles_pairwise(batch: int, m: int, n: int) -> int:
        return batch * min(
            -(-m // (c["MI"] * c["MT"])) * -(-n // (c["NI"] * c["NT"])) for c, _, _ in configs.PAIRWISE_SPACE
        )

    def tiles_grad(batch: int, m: int, n: int, o: int, general: bool) -> int:
        space = configs.GENERAL_GRAD_SPACE if general else configs.GRAD_SPACE
        pairs = min(-(-n // c["BN"]) * -(-m // c["BM"]) for c, *_ in space)
        return batch * -(-o // (configs.general_grad_block_o if general else configs.grad_block_o)(o)) * pairs

    one = torch.zeros(1, 1)
    for batch, m, n in [
        (1, 3, 5),
        (1, 2**16, 2**15),
        (2**14, 2**9, 2**9),
        (2**20, 2**12, 2**12),
        (2**25, 2**8, 2**8),
        (2**25, 2**12, 2**12),
    ]:
        x = one.expand(batch, m, 1)
        z = one.expand(batch, n, 1)
        problem = PairwiseProblem(presets.l1_distance.lower(), x, z, one, {}, 0, 0, (batch,))
        verdict = launch.grid_size_problem(problem)
        assert (verdict is None) == (tiles_pairwise(batch, m, n) <= limit), (batch, m, n, verdict)
    product = kermac.GradProgram(kermac.ir.Var("d") - kermac.ir.Var("b"), kermac.ir.Var("acc"))
    general = kermac.GradProgram(kermac.ir.Var("d") - kermac.ir.Var("a"), kermac.ir.Var("acc"), kermac.ir.Var("term"))
    # (2**14, 2**12, 2**12, 64): one o tile of the product form's kernel fits the limit, four of the general one do not
    sizes = [(1, 5, 3, 2), (2**10, 2**12, 2**8, 17), (2**16, 2**12, 2**12, 64), (2**14, 2**12, 2**12, 64)]
    for (batch, m, n, o), program in itertools.product(sizes, (product, general)):
        a = one.expand(batch, 1, m)
        b = one.expand(batch, n, 1)
        c = one.expand(batch, o, 1)
        d = one.expand(batch, n, m)
        problem = GradProblem(program, a, b, c, d, one, {}, (batch,))
        verdict = launch.grid_size_problem(problem)
        expected = tiles_grad(batch, m, n, o, program is general) <= limit
        assert (verdict is None) == expected, (batch, m, n, o, program.key(), verdict)
