"""kermac's `torch.library` operations: opcheck of every sample, meta tensors, the direct path, the
program keys they carry, and the symbolic derivatives their backward uses."""

from __future__ import annotations

import random
import re

import fuzz_programs
import pytest
import torch
from helpers import BACKEND_DEVICES, require_backend
from op_samples import samples

import kermac
from kermac import ir, ops
from kermac.ir_diff import derivative
from kermac.ir_eval import evaluate
from kermac.programs import program_from_key

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _op(sample, out: bool):
    name = sample.op + ("_out" if out else "")
    return getattr(torch.ops.kermac, name).default


@pytest.mark.parametrize(("backend", "device"), BACKEND_DEVICES)
@pytest.mark.parametrize("index", range(len(samples("cpu"))), ids=[s.name for s in samples("cpu")])
def test_opcheck(backend: str, device: str, index: int) -> None:
    """Schema, fake tensors, autograd registration and AOT dispatch (static and dynamic shapes) of the
    functional operation and of its out variant."""
    require_backend(backend, device, samples("cpu")[index].op)
    dtype = torch.float64 if backend == "torch" else torch.float32
    sample = samples(device, dtype)[index]
    k = sample.operands
    inputs = tuple(t.detach().requires_grad_(sample.differentiable and i < k) for i, t in enumerate(sample.inputs))
    torch.library.opcheck(_op(sample, False), sample.op_args(inputs, backend), test_utils=OPCHECK_TESTS)
    plain = tuple(t.detach() for t in sample.inputs)
    out = torch.empty_like(sample(*plain, backend=backend))
    torch.library.opcheck(_op(sample, True), (*sample.op_args(plain, backend), out), test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("sample", samples("cpu"), ids=lambda s: s.name)
def test_meta_tensors_give_meta_results(sample) -> None:
    """Every public operation on meta tensors returns a meta result of the real result's shape,
    strides and dtype, so model code can be traced and sized without a GPU."""
    real = sample(*sample.inputs, backend="torch")
    meta = sample(*(t.to("meta") for t in sample.inputs), backend="auto")
    assert meta.is_meta and meta.shape == real.shape and meta.stride() == real.stride() and meta.dtype == real.dtype


def test_meta_tensor_hyperparameters_and_out() -> None:
    x, z = torch.empty(4, 3, device="meta"), torch.empty(6, 3, device="meta")
    bw = torch.empty(5, 1, device="meta")
    assert kermac.run_kernel("gaussian", x, z, bandwidth=bw).shape == (5, 1, 4, 6)
    out = torch.empty(6, 4, device="meta").mT
    assert kermac.cdist(x, z, 1.5, out=out) is out
    with pytest.raises(ValueError, match=r"out: expected shape \[4, 6\], got \[6, 4\]"):
        kermac.cdist(x, z, out=torch.empty(6, 4, device="meta"))


def test_validation_runs_in_the_fake_implementation() -> None:
    """A trace reports bad shapes with the eager message, before anything runs."""
    x, z = torch.empty(4, 3, device="meta"), torch.empty(6, 2, device="meta")
    with pytest.raises(ValueError, match="z: expected 3 features"):
        kermac.cdist(x, z)


def test_direct_path_only_where_nothing_observes_the_call() -> None:
    x = torch.randn(3, 2)
    assert ops.runs_directly(x, x)
    assert not ops.runs_directly(x.requires_grad_(), x)
    with torch.no_grad():
        assert ops.runs_directly(x, x)
    assert not ops.runs_directly(torch.empty(3, 2, device="meta"))
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        assert not ops.runs_directly(torch.randn(3, 2))


def test_a_dispatch_mode_sees_one_kermac_call() -> None:
    """Under a dispatch mode (here make_fx's tracer) the call is the registered operation."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(lambda x, z: kermac.run_kernel("laplace_l2", x, z, bandwidth=2.0))(
        torch.randn(4, 3), torch.randn(5, 3)
    )
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert targets == ["kermac.pairwise.default"]


def test_constant_marking_matches_torch() -> None:
    """`constant_for_compile` sets what `torch.compiler.assume_constant_result` sets (it avoids
    importing torch._dynamo at `import kermac`)."""

    def f() -> int:
        return 1

    def g() -> int:
        return 1

    torch.compiler.assume_constant_result(f)
    ops.constant_for_compile(g)
    assert {k: v for k, v in vars(f).items()} == {k: v for k, v in vars(g).items()} != {}


def test_bad_operation_arguments_are_named() -> None:
    x = torch.randn(3, 2)
    with pytest.raises(ValueError, match="program: expected the key of a pairwise program"):
        torch.ops.kermac.pairwise(x, x, "grad;(sub d b);acc", "", [], [], 0, 0, "torch", False, "t")
    with pytest.raises(ValueError, match="hyper_names: 2 names for 1 numbers"):
        torch.ops.kermac.pairwise(
            x, x, "pairwise;sum;(abs (sub x z));acc", "a,b", [1.0], [None], 0, 0, "torch", False, "t"
        )
    with pytest.raises(ValueError, match="program: expected the key of a PairwiseProgram or GradProgram"):
        program_from_key("pairwise;sum")
    with pytest.raises(NotImplementedError, match="because"):
        torch.ops.kermac.no_gradient(x, "because")


@pytest.mark.parametrize("seed", range(40))
def test_program_keys_round_trip(seed: int) -> None:
    program = fuzz_programs.generate(seed).program
    rebuilt = program_from_key(program.key())
    assert rebuilt == program and rebuilt.key() == program.key()
    assert ir.from_sexpr(str(ir.Const(-0.0))) == ir.Const(-0.0) != ir.Const(0.0)


def test_sexpr_errors_name_the_token() -> None:
    for text, what in [
        ("(add x", "missing ')'"),
        ("(add x z) z", "unexpected 'z'"),
        (")", "unexpected ')'"),
        ("", "ended"),
    ]:
        with pytest.raises(ValueError, match=re.escape(what)):
            ir.from_sexpr(text)


@pytest.mark.parametrize("seed", range(60))
def test_symbolic_derivative_matches_torch_autograd(seed: int) -> None:
    """`derivative` agrees with torch's autograd of the evaluated expression (float64, random
    expressions of every operation) wherever autograd's value is finite; the epilogues of every
    preset, special points included, are checked through the operations' gradients in
    test_autograd.py."""
    rng = random.Random(seed)
    expr = fuzz_programs._tree(rng, 4, ("acc", "diag"), ("h",))
    acc = torch.tensor([1.0, -2.5, 0.3, 7.0, 2.0, -1.0, 0.75, 3.5, 1e-3, 40.0], dtype=torch.float64).requires_grad_()
    env = {"acc": acc, "diag": torch.tensor([1.0, 0.0] * 5, dtype=torch.float64), "h": rng.choice([0.5, 2.0, -1.0])}
    value = evaluate(expr, env, like=acc).expand(acc.shape)
    if value.requires_grad:
        (expected,) = torch.autograd.grad(value.sum(), acc, allow_unused=True, materialize_grads=True)
    else:
        expected = torch.zeros_like(acc)
    slope = evaluate(derivative(expr, "acc"), {**env, "acc": acc.detach()}, like=acc).expand(acc.shape)
    finite = torch.isfinite(expected)
    torch.testing.assert_close(slope[finite], expected[finite], rtol=1e-12, atol=0, msg=lambda m: f"{expr}\n{m}")
