"""Random kermac programs and inputs for the differential fuzzer (``tests/test_fuzz.py``).

:func:`generate` turns one integer seed into one :class:`Case`: a pairwise program (inner term,
sum/max/min/logsumexp reduction, epilogue) or a gradient program (in the product form: multiply over
d and b, epilogue; or in the general form: multiply over a, b and d, an accumulate over c and the
term, any reduction, epilogue) built from :mod:`kermac.ir` — constants (0, −0, negative, subnormal,
huge, ±inf, NaN), scalar and per-batch tensor hyperparameters, comparisons, selects and every
operation — together with inputs of random shapes (0 and 1 included), dtypes (float16, bfloat16,
float32, float64), layouts (transposed, strided, broadcast batches), values (ties, ±0, NaN, ±inf,
subnormals) and an ``out`` poisoned with NaN.  Half of the programs are the shapes backends
specialise (``Σ|x − z|``, ``Σ(x − z)²``, ``Σ|x − z|^p``, the signed power of the gradient, soft
minima, ...), with random epilogues, so the fast paths are fuzzed too, and general gradient
programs that compute a product form (``Σ c·(a·g)``), which backends send to their product-form
kernels.

:func:`verify` runs a case on a backend and on the reference backend and checks every output
element against the error interval of :mod:`fuzz_bounds` (NaN positions and infinities exactly,
values within the interval); :func:`shrink` reduces a failing case (smaller sizes, simpler
expressions) while it still fails, and :meth:`Case.describe` prints the reproducer.  Replay one
case with ``python tests/fuzz_programs.py SEED [BACKEND [DEVICE]]``.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass

import fuzz_bounds as fb
import torch

import kermac
from kermac import ir, lowering, reductions
from kermac.programs import GradProgram, PairwiseProgram, is_squared_difference_sum, product_factor

__all__ = ["Case", "Failure", "generate", "shrink", "verify"]

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SIZES = (0, 1, 1, 2, 3, 4, 5, 7, 8, 13, 17, 33)
FEATURES = (0, 1, 2, 3, 4, 5, 7, 8, 16, 17, 31, 33)
#: Constants the generator draws from, besides random ones.
CONSTANTS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -0.5, 3.0, 1.0 / 3.0, 0.1, -2.5, 1e-3, 1e3)
SPECIAL_CONSTANTS = (1e-40, 1e-310, 1e30, 1e300, -1e30, math.inf, -math.inf, math.nan)
UNARY = ("neg", "abs", "sqrt", "exp", "log", "sign")
BINARY = ("add", "sub", "mul", "div", "pow", "min", "max", "lt", "le", "gt", "ge", "eq", "ne")
HYPERS = ("h0", "h1")
#: Every reduction a program may name (sum, max, min, logsumexp).
REDUCTIONS = tuple(reductions.ALL)


@dataclass
class Case:
    """One fuzz case: a program, its operands and hyperparameters, and where it came from."""

    seed: int
    program: PairwiseProgram | GradProgram
    dtype: torch.dtype
    operands: dict[str, torch.Tensor]  # x, z or a, b, c, d (views as the kernel reads them)
    hypers: dict[str, float | torch.Tensor]
    out_transposed: bool = False  # give an ``out`` whose last two dimensions are transposed
    offsets: tuple[int, int] = (0, 0)
    note: str = ""  # how the case was shrunk, if it was

    @property
    def pairwise(self) -> bool:
        return isinstance(self.program, PairwiseProgram)

    def on(self, device: str) -> Case:
        """This case with its tensors on ``device`` (views keep their strides)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            base = t.detach()
            if base.device.type == device:
                return t
            storage = torch.empty_strided(base.shape, base.stride(), dtype=base.dtype, device=device)
            storage.copy_(base)
            return storage

        hypers = {k: move(v) if isinstance(v, torch.Tensor) else v for k, v in self.hypers.items()}
        return dataclasses.replace(self, operands={k: move(v) for k, v in self.operands.items()}, hypers=hypers)

    def out_shape(self) -> tuple[int, ...]:
        shapes = [t.shape[:-2] for t in self.operands.values()]
        shapes += [v.shape for v in self.hypers.values() if isinstance(v, torch.Tensor)]
        batch = tuple(torch.broadcast_shapes(*shapes))
        ops = self.operands
        if self.pairwise:
            return batch + (ops["x"].shape[-2], ops["z"].shape[-2])
        return batch + (ops["c"].shape[-2], ops["b"].shape[-2], ops["a"].shape[-1])

    def run(self, backend: str) -> torch.Tensor:
        """The program's output on ``backend`` (into a NaN-poisoned ``out``)."""
        device = next(iter(self.operands.values())).device
        shape = self.out_shape()
        if self.out_transposed:
            out = torch.full(shape[:-2] + (shape[-1], shape[-2]), math.nan, dtype=self.dtype, device=device).mT
        else:
            out = torch.full(shape, math.nan, dtype=self.dtype, device=device)
        hypers = self.hypers or None
        if self.pairwise:
            x, z = self.operands["x"], self.operands["z"]
            m0, n0 = self.offsets
            return kermac.run_program(
                self.program, x, z, hypers=hypers, out=out, offset_m=m0, offset_n=n0, backend=backend
            )
        ops = self.operands
        return kermac.run_grad_program(
            self.program, ops["a"], ops["b"], ops["c"], ops["d"], hypers=hypers, out=out, backend=backend
        )

    def describe(self) -> str:
        """The reproducer: program, shapes, strides, dtype, hyperparameters, and the call to replay."""
        p = self.program
        if self.pairwise:
            prog = (
                f"PairwiseProgram(inner={ir.to_sexpr(p.inner)}, reduction={p.reduction}, "
                f"epilogue={ir.to_sexpr(p.epilogue)})"
            )
        elif p.general:
            prog = (
                f"GradProgram(multiply={ir.to_sexpr(p.multiply)}, epilogue={ir.to_sexpr(p.epilogue)}, "
                f"accumulate={ir.to_sexpr(p.accumulate)}, reduction={p.reduction})"
            )
        else:
            prog = f"GradProgram(multiply={ir.to_sexpr(p.multiply)}, epilogue={ir.to_sexpr(p.epilogue)})"
        note = f" ({self.note})" if self.note else ""
        lines = [f"case seed {self.seed}{note}", f"  {prog}", f"  dtype {self.dtype}"]
        for name, t in self.operands.items():
            lines.append(f"  {name}: shape {list(t.shape)} strides {list(t.stride())}")
            lines.append(f"     values {t.detach().cpu().double().flatten()[:12].tolist()}")
        for name, v in self.hypers.items():
            shown = v.tolist() if isinstance(v, torch.Tensor) else v
            lines.append(f"  hyper {name} = {shown}" + (f" ({v.dtype})" if isinstance(v, torch.Tensor) else ""))
        layout = " transposed" if self.out_transposed else ""
        lines.append(f"  out {list(self.out_shape())}{layout}, offsets {self.offsets}")
        lines.append(f"  replay: python tests/fuzz_programs.py {self.seed} <backend> <device>")
        return "\n".join(lines)


# ---- programs -----------------------------------------------------------------------------------


def _constant(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.08:
        return rng.choice(SPECIAL_CONSTANTS)
    if r < 0.6:
        return rng.choice(CONSTANTS)
    return round(rng.gauss(0.0, 2.0), 3)


def _tree(rng: random.Random, depth: int, variables: tuple[str, ...], hypers: tuple[str, ...]) -> ir.Expr:
    """A random expression; leaves are variables, constants and hyperparameters."""
    if depth == 0 or rng.random() < 0.25:
        r = rng.random()
        if variables and r < 0.55:
            return ir.Var(rng.choice(variables))
        if hypers and r < 0.7:
            return ir.Hyper(rng.choice(hypers))
        return ir.Const(_constant(rng))
    r = rng.random()
    if r < 0.3:
        op = rng.choice(UNARY)
        arg = _tree(rng, depth - 1, variables, hypers)
        if op in ("sqrt", "log") and rng.random() < 0.7:
            arg = abs(arg)  # mostly in the domain: NaN everywhere would test little
        return ir.Call(op, (arg,))
    if r < 0.9:
        op = rng.choice(BINARY)
        a, b = (_tree(rng, depth - 1, variables, hypers) for _ in range(2))
        if op == "pow":
            a = abs(a) if rng.random() < 0.6 else a
            b = ir.Const(rng.choice((2.0, 3.0, 0.5, 1.5, -1.0, 0.0))) if rng.random() < 0.6 else b
        return ir.Call(op, (a, b))
    return ir.select(*(_tree(rng, depth - 1, variables, hypers) for _ in range(3)))


def _leaf_or(rng: random.Random, expr: ir.Expr, hypers: tuple[str, ...]) -> ir.Expr:
    """``expr`` or, sometimes, ``expr`` combined with a random small term."""
    if rng.random() < 0.6:
        return expr
    other = _tree(rng, 1, (), hypers)
    return ir.Call(rng.choice(("add", "mul", "max", "min")), (expr, other))


def _pairwise_program(rng: random.Random, hypers: tuple[str, ...]) -> PairwiseProgram:
    x, z = ir.Var("x"), ir.Var("z")
    t = x - z
    if rng.random() < 0.5:  # the shapes backends specialise
        p = ir.Hyper(hypers[0]) if hypers and rng.random() < 0.4 else ir.Const(rng.choice((1.3, 1.5, 2.5, 3.0, 0.7)))
        inner = rng.choice(
            (
                abs(t),
                t * t,
                ir.pow(abs(t), p),
                ir.ne(t, 0.0),
                x * z,
                ir.select(ir.eq(t, t), abs(t), 0.0),
                ir.maximum(ir.pow(abs(t), p), 1e-30 * ir.ne(t, 0.0)),
            )
        )
    else:
        inner = _tree(rng, rng.choice((1, 2, 3)), ("x", "z"), hypers)
    reduction = rng.choice(("sum", *REDUCTIONS))  # the sum twice as often: its fast paths
    acc, diag = ir.Var("acc"), ir.Var("diag")
    if reduction == "logsumexp" and rng.random() < 0.4:  # a soft minimum: −γ·logsumexp(−τ/γ)
        gamma = ir.Hyper(hypers[-1]) if hypers else ir.Const(rng.choice((0.1, 0.7, 2.0)))
        inner = -(rng.choice((abs(t), t * t, inner)) / gamma)
        epilogue = _leaf_or(rng, -gamma * acc, hypers)
    elif rng.random() < 0.5:
        h = ir.Hyper(hypers[-1]) if hypers else ir.Const(1.5)
        epilogue = rng.choice(
            (
                acc,
                ir.sqrt(acc),
                ir.pow(acc, 1.0 / 1.5),
                ir.exp(-(acc / h)),
                acc + ir.select(diag, h, 0.0),
                ir.maximum(acc, 0.0),
                ir.exp(-(acc / (2.0 * (h * h)))),
            )
        )
        epilogue = _leaf_or(rng, epilogue, hypers)
    else:
        epilogue = _tree(rng, rng.choice((1, 2, 3)), ("acc", "acc", "diag"), hypers)
    return PairwiseProgram(inner=inner, reduction=reduction, epilogue=epilogue)


def _grad_program(rng: random.Random, hypers: tuple[str, ...]) -> GradProgram:
    """A gradient program: in the product form 40% of the time, else in the general form."""
    if rng.random() < 0.4:
        return GradProgram(multiply=_factor(rng, hypers), epilogue=_grad_epilogue(rng, hypers))
    return _general_grad_program(rng, hypers)


def _factor(rng: random.Random, hypers: tuple[str, ...]) -> ir.Expr:
    """A multiply of the product form, over d and b: half of the time a shape backends specialise."""
    t = ir.Var("d") - ir.Var("b")
    if rng.random() < 0.5:
        e = ir.Hyper(hypers[0]) - 1.0 if hypers and rng.random() < 0.5 else ir.Const(rng.choice((0.5, 1.5, -0.3, 2.0)))
        return rng.choice(
            (t, ir.sign(t), ir.select(ir.ne(t, 0.0), ir.sign(t) * ir.pow(abs(t), e), 0.0), ir.exp(-abs(t)), t * t)
        )
    return _tree(rng, rng.choice((1, 2, 3)), ("d", "b"), hypers)


def _grad_epilogue(rng: random.Random, hypers: tuple[str, ...]) -> ir.Expr:
    acc = ir.Var("acc")
    return _leaf_or(rng, acc, hypers) if rng.random() < 0.6 else _tree(rng, 2, ("acc",), hypers)


def _general_grad_program(rng: random.Random, hypers: tuple[str, ...]) -> GradProgram:
    """A gradient program in the general form: ``REDUCE_k accumulate(c, multiply(a, b, d))``.

    Some compute a product form (a sum of ``c·term`` with ``term = a·g(d, b)``, either order), which
    backends run on their product-form kernels; the others mix a fixed or random multiply over a, b and
    d, an accumulation (the product, a difference, a sum, an exponential weight, a maximum, or random)
    and any reduction."""
    a, b, c, d, term = (ir.Var(name) for name in ("a", "b", "c", "d", "term"))
    if rng.random() < 0.15:
        g = _factor(rng, hypers)
        multiply, accumulate = rng.choice(((a * g, c * term), (g * a, term * c), (a * g, term * c)))
        return GradProgram(multiply, _grad_epilogue(rng, hypers), accumulate, "sum")
    t = d - b
    h = ir.Hyper(hypers[0]) if hypers else ir.Const(rng.choice((0.5, 1.5)))
    if rng.random() < 0.5:
        shapes = (a * t, abs(t) - a, a * t / h, a + t * t, ir.exp(-abs(t) / h) * a, a * b - d)
        multiply = rng.choice((*shapes, ir.select(ir.gt(a, 0.0), t, -t)))
    else:
        multiply = _tree(rng, rng.choice((1, 2, 3)), ("a", "b", "d"), hypers)
    if rng.random() < 0.7:
        accumulate = rng.choice((c * term, term * c, term - c, c + term, ir.exp(c) * term, ir.maximum(c, term)))
    else:
        accumulate = _tree(rng, rng.choice((1, 2)), ("c", "term"), hypers)
    reduction = rng.choice(REDUCTIONS)
    acc = ir.Var("acc")
    if reduction == "logsumexp" and rng.random() < 0.4:  # a soft maximum γ·logsumexp(τ/γ) or minimum
        sign = rng.choice((1.0, -1.0))
        multiply, epilogue = sign * multiply / h, sign * h * acc
    else:
        epilogue = _grad_epilogue(rng, hypers)
    return GradProgram(multiply, epilogue, accumulate, reduction)


# ---- inputs ---------------------------------------------------------------------------------------


def _values(rng: random.Random, gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random values: normal at a random scale, sometimes on a coarse grid (exact ties and zeros),
    sometimes with special values sprinkled in."""
    scale = 10.0 ** rng.uniform(-2.0, 2.0)
    v = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if rng.random() < 0.35:
        v = torch.round(v / scale * 2.0) / 2.0
    if rng.random() < 0.25 and v.numel():
        # A subnormal of the dtype; bfloat16 gets its smallest normal instead: Triton's CPU interpreter
        # converts bfloat16 subnormals to and from float32 wrongly (compiled code does not).
        tiny = torch.finfo(dtype).smallest_normal * (1.0 if dtype == torch.bfloat16 else 0.25)
        specials = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, tiny, 1e30, -tiny], dtype=torch.float64)
        count = rng.randint(1, max(1, v.numel() // 8))
        where = torch.randint(0, v.numel(), (count,), generator=gen)
        pick = torch.randint(0, len(specials), (count,), generator=gen)
        v.view(-1)[where] = specials[pick]
    return v.to(dtype)


def _layout(rng: random.Random, gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` with a random layout: contiguous, transposed or strided."""
    r = rng.random()
    if r < 0.2 and len(shape) >= 2:  # transposed
        return _values(rng, gen, shape[:-2] + (shape[-1], shape[-2]), dtype).mT
    if r < 0.35 and shape and shape[-1] > 0:  # every other element of the last dimension
        return _values(rng, gen, shape[:-1] + (2 * shape[-1],), dtype)[..., ::2]
    return _values(rng, gen, shape, dtype)


def _batches(rng: random.Random, count: int) -> list[tuple[int, ...]]:
    """Batch shapes of ``count`` operands that broadcast together (often none)."""
    r = rng.random()
    if r < 0.55:
        return [()] * count
    if r < 0.8:
        b = (rng.choice((1, 2, 3)),)
        return [b if rng.random() < 0.7 else () for _ in range(count)]
    full = (rng.choice((1, 2)), rng.choice((2, 3)))
    return [tuple(s if rng.random() < 0.6 else 1 for s in full) for _ in range(count)]


def _hyper_values(
    rng: random.Random, gen: torch.Generator, names: tuple[str, ...], batch: tuple[int, ...], dtype: torch.dtype
) -> dict[str, float | torch.Tensor]:
    out: dict[str, float | torch.Tensor] = {}
    for name in names:
        if rng.random() < 0.3 and batch:  # one value per batch entry (broadcasting)
            shape = tuple(s if rng.random() < 0.7 else 1 for s in batch)
            hdtype = rng.choice((dtype, torch.float32, torch.float64))
            v = torch.rand(shape, generator=gen, dtype=torch.float64) * 3.0 + 0.2
            out[name] = v.to(hdtype)
        elif rng.random() < 0.3 and not batch:
            out[name] = (torch.rand((rng.choice((1, 2)),), generator=gen, dtype=torch.float64) * 3.0 + 0.2).to(dtype)
        else:
            r = rng.random()
            special = (0.0, -1.0, 1e-40, 1e30, 1e300, math.inf)  # 1e300: past float32's range
            out[name] = rng.choice(special) if r < 0.1 else round(rng.uniform(0.2, 3.0), 3)
    return out


#: p of the cdist programs the fuzzer runs (``None``: a tensor p): the special ones, the plain,
#: guarded and L∞ ranges of docs/formulas.md ("Large p").
CDIST_PS = (0.0, 1.0, 2.0, 0.5, 1.3, 3.0, 5.0, 50.0, math.inf, 1e308, None)


def _cdist_case_program(rng: random.Random, dtype: torch.dtype) -> tuple[PairwiseProgram, float | None]:
    p = rng.choice(CDIST_PS)
    return lowering.cdist_program(p, skip_epilogue=rng.random() < 0.2, dtype=dtype), p


def generate(seed: int) -> Case:
    """The fuzz case of ``seed`` (deterministic)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice(DTYPES)
    hypers = HYPERS[: rng.choice((0, 1, 1, 2))]
    cdist_p: float | None = math.nan  # not a cdist program
    kind = rng.random()
    if kind < 0.15:
        program, cdist_p = _cdist_case_program(rng, dtype)
    elif kind < 0.6:
        program = _pairwise_program(rng, hypers)
    elif kind < 0.7:
        cdist_p = rng.choice((1.0, 2.0, 1.5, 0.5, None))
        program = lowering.grad_program(cdist_p)
    else:
        program = _grad_program(rng, hypers)
    if isinstance(program, PairwiseProgram):
        m, n, d = rng.choice(SIZES), rng.choice(SIZES), rng.choice(FEATURES)
        bx, bz = _batches(rng, 2)
        operands = {"x": _layout(rng, gen, bx + (m, d), dtype), "z": _layout(rng, gen, bz + (n, d), dtype)}
        offsets = (rng.choice((0, 0, 1, 3)), rng.choice((0, 0, 2)))
    else:
        m, n, o, k = rng.choice(SIZES), rng.choice(SIZES[:9]), rng.choice((1, 1, 2, 3, 5, 16, 17)), rng.choice(FEATURES)
        ba, bb, bc, bd = _batches(rng, 4)
        operands = {
            "a": _layout(rng, gen, ba + (k, m), dtype),
            "b": _layout(rng, gen, bb + (n, k), dtype),
            "c": _layout(rng, gen, bc + (o, k), dtype),
            "d": _layout(rng, gen, bd + (n, m), dtype),
        }
        offsets = (0, 0)
    shapes = [t.shape[:-2] for t in operands.values()]
    batch = tuple(torch.broadcast_shapes(*shapes))
    values = _hyper_values(rng, gen, program.hypers, batch, dtype)
    if "p" in program.hypers:  # cdist's (or cdist_grad's) p: the number it stands for, or positive ones per entry
        if cdist_p is None:
            shape = batch if batch else (rng.choice((1, 2)),)
            values["p"] = (torch.rand(shape, generator=gen, dtype=torch.float64) * 8.0 + 0.3).to(dtype)
        else:
            values["p"] = cdist_p
    return Case(seed, program, dtype, operands, values, out_transposed=rng.random() < 0.15, offsets=offsets)


# ---- checking -------------------------------------------------------------------------------------


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


#: Smallest magnitude that rounds to ±inf in TF32 (round to nearest): (2 − 2⁻¹¹)·2¹²⁷.
TF32_OVERFLOW = (2 - 2.0**-11) * 2.0**127


def bounds(
    case: Case, compute: torch.dtype, flush: bool, truncating_output: bool = False, tf32_split: bool = False
) -> fb.Interval:
    """Error interval of every output element of ``case`` computed in ``compute``.

    ``flush``: subnormal results may flush to zero (GPU float32 code).  ``truncating_output``: the
    conversion to a narrower output type may truncate instead of rounding to nearest (one whole
    unit in the last place) and lose subnormal results: Triton's CPU interpreter (3.x) converts
    float32 to bfloat16 that way, where compiled code rounds to nearest.  ``tf32_split``: the
    product-form gradient's products are 3×TF32 (the float32 product-form gradient kernels of the Triton
    and NVRTC backends; the general-form kernels evaluate the multiply and the accumulation as written).
    """
    prec = fb.Precision.of(compute, flush=flush)
    shape = case.out_shape()
    batch = shape[:-3] if not case.pairwise else shape[:-2]

    def hyper(value: float | torch.Tensor, trailing: int) -> fb.Interval:
        if isinstance(value, torch.Tensor):
            v = value.detach().cpu().to(compute).double()
            v = v.reshape(v.shape + (1,) * trailing)
        else:
            v = torch.tensor(value, dtype=torch.float64).to(compute).double()
        return fb.point(v)

    ops = {k: v.detach().cpu().double() for k, v in case.operands.items()}
    program = case.program
    if case.pairwise:
        x = ops["x"].expand(batch + ops["x"].shape[-2:])
        z = ops["z"].expand(batch + ops["z"].shape[-2:])
        env = {"x": fb.point(x[..., :, None, :]), "z": fb.point(z[..., None, :, :])}
        env |= {name: hyper(v, 3) for name, v in case.hypers.items()}
        terms = fb.evaluate(program.inner, env, prec)
        full = batch + (x.shape[-2], z.shape[-2], x.shape[-1])
        terms = fb.Interval(*(t.expand(full) for t in dataclasses.astuple(terms)))
        sq = compute == torch.float32 and is_squared_difference_sum(program)
        acc = fb.reduce_terms(terms, program.reduction, prec, extra_rel=2.0**-14 if sq else 0.0)
        rows = torch.arange(x.shape[-2]) + case.offsets[0]
        cols = torch.arange(z.shape[-2]) + case.offsets[1]
        diag = (rows[:, None] == cols[None, :]).double()
        env = {"acc": acc, "diag": fb.point(diag)} | {name: hyper(v, 2) for name, v in case.hypers.items()}
        value = fb.evaluate(program.epilogue, env, prec)
    else:
        a, b, c, d = (ops[name].expand(batch + ops[name].shape[-2:]) for name in ("a", "b", "c", "d"))
        hypers = {name: hyper(v, 3) for name, v in case.hypers.items()}  # against [B, N, M, K] and [B, O, N, M]
        # A program with a product factor runs a backend's product-form kernels (the reference backend's
        # general loop where it is written in the general form): its result may be either's.
        factor = product_factor(program)
        acc = None if factor is None else _product_form_acc(factor, a, b, c, d, hypers, prec, tf32_split)
        if program.general:
            hypers4 = {name: hyper(v, 4) for name, v in case.hypers.items()}  # against [B, O, N, M, K]
            general = _general_form_acc(program, a, b, c, d, hypers, hypers4, prec)
            acc = general if acc is None else fb.hull(acc, general)
        value = fb.evaluate(program.epilogue, {"acc": acc} | hypers, prec)
    value = fb.Interval(*(t.expand(shape) for t in dataclasses.astuple(value)))
    if case.dtype != compute:
        out = fb.Precision.of(case.dtype)
        if truncating_output:
            out = dataclasses.replace(out, u=2 * out.u, eta=torch.finfo(case.dtype).smallest_normal)
        value = fb.widen_output(value, out)
    return value


def _expand(iv: fb.Interval, shape: tuple[int, ...]) -> fb.Interval:
    return fb.Interval(*(t.expand(shape) for t in dataclasses.astuple(iv)))


def _product_form_acc(
    factor: ir.Expr,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    hypers: dict[str, fb.Interval],
    prec: fb.Precision,
    tf32_split: bool,
) -> fb.Interval:
    """``Σ_k c·(a·factor(d, b))`` ([B, O, N, M]), the products as the product-form kernels round them."""
    env = {"d": fb.point(d[..., :, :, None]), "b": fb.point(b[..., :, None, :])} | hypers
    mult = fb.evaluate(factor, env, prec)  # [B, N, M, K]
    w = fb.mul(fb.point(a.mT[..., None, :, :]), mult, prec)  # [B, N, M, K]
    w = fb.Interval(*(t[..., None, :, :, :] for t in dataclasses.astuple(w)))  # [B, 1, N, M, K]
    terms = fb.mul(fb.point(c[..., :, None, None, :]), w, prec)  # [B, O, N, M, K]
    if tf32_split:
        # 3×TF32: a factor beyond TF32's range (or infinite) splits into inf and inf − inf = NaN, and a
        # term that overflows has partial products that overflow with either sign, so the entry may be
        # NaN where the exact sum is ±inf (docs/formulas.md: "a factor or term that is infinite").
        big = (w.hi >= TF32_OVERFLOW) | (w.lo <= -TF32_OVERFLOW)
        big = big | (c[..., :, None, None, :].abs() >= TF32_OVERFLOW)
        big = big | (terms.hi == math.inf) | (terms.lo == -math.inf)
        terms = dataclasses.replace(terms, may=terms.may | big)
    terms = _expand(terms, c.shape[:-1] + (b.shape[-2], a.shape[-1], a.shape[-2]))
    return fb.reduce_terms(terms, "sum", prec, extra_rel=2.0**-19 if prec.dtype == torch.float32 else 0.0)


def _general_form_acc(
    program: GradProgram,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor,
    hypers: dict[str, fb.Interval],
    hypers4: dict[str, fb.Interval],
    prec: fb.Precision,
) -> fb.Interval:
    """``REDUCE_k accumulate(c, multiply(a, b, d))`` ([B, O, N, M]): the multiply once per (n, m, k), the
    accumulation per (o, n, m, k), then the program's reduction (the general kernels use no tensor cores)."""
    n, (k, m) = b.shape[-2], a.shape[-2:]
    env = {"a": fb.point(a.mT[..., None, :, :]), "b": fb.point(b[..., :, None, :]), "d": fb.point(d[..., :, :, None])}
    term = _expand(fb.evaluate(program.multiply, env | hypers, prec), a.shape[:-2] + (n, m, k))
    term = fb.Interval(*(t[..., None, :, :, :] for t in dataclasses.astuple(term)))  # [B, 1, N, M, K]
    env = {"c": fb.point(c[..., :, None, None, :]), "term": term} | hypers4
    terms = _expand(fb.evaluate(program.accumulate, env, prec), c.shape[:-1] + (n, m, k))  # [B, O, N, M, K]
    return fb.reduce_terms(terms, program.reduction, prec)


@dataclass
class Failure:
    """What went wrong with a case on a backend: an exception, or elements outside their interval."""

    case: Case
    backend: str
    message: str

    def __str__(self) -> str:
        return f"[{self.backend}] {self.message}\n{self.case.describe()}"


def verify(case: Case, backend: str, device: str = "cpu", *, reference: bool = True) -> Failure | None:
    """Run ``case`` on ``backend`` and check it; ``None`` if every element is within its interval.

    With ``reference``, the reference backend is checked too: in the case's dtype against the
    same interval, and in float64 (inputs converted exactly) against the float64 interval.
    """
    moved = case.on(device)
    compute = _compute_dtype(case.dtype)
    flush = device == "cuda" and compute == torch.float32
    split = compute == torch.float32 and backend in ("triton", "nvrtc")
    iv = bounds(case, compute, flush, truncating_output=backend == "triton" and device == "cpu", tf32_split=split)
    runs: list[tuple[str, Case, fb.Interval]] = [(backend, moved, iv)]
    if reference:
        runs.append(("torch", case, bounds(case, compute, False)))
        wide = dataclasses.replace(
            case,
            dtype=torch.float64,
            operands={k: v.double() for k, v in case.operands.items()},
            hypers={k: v.double() if isinstance(v, torch.Tensor) else v for k, v in case.hypers.items()},
        )
        runs.append(("torch", wide, bounds(wide, torch.float64, False)))
    for name, c, bound in runs:
        try:
            got = c.run(name)
        except Exception as exc:  # a crash is a finding too
            return Failure(case, name, f"{type(exc).__name__}: {exc}".strip()[:2000])
        bad = fb.check(got, bound)
        if bad.any():
            idx = bad.nonzero()[0].tolist()
            g = got.detach().cpu().double()[tuple(idx)].item()
            lo, hi = bound.lo[tuple(idx)].item(), bound.hi[tuple(idx)].item()
            may, must = bool(bound.may[tuple(idx)]), bool(bound.must[tuple(idx)])
            where = "NaN required" if must else f"[{lo!r}, {hi!r}]{' or NaN' if may else ''}"
            msg = f"{int(bad.sum())} of {bad.numel()} elements wrong ({c.dtype}); first at {idx}: got {g!r}, "
            msg += f"expected {where}"
            return Failure(case, name, msg)
    return None


# ---- shrinking ------------------------------------------------------------------------------------


def _replace(expr: ir.Expr, target: ir.Expr, new: ir.Expr) -> ir.Expr:
    if expr is target:
        return new
    if isinstance(expr, ir.Call):
        return ir.Call(expr.op, tuple(_replace(a, target, new) for a in expr.args))
    return expr


def _program_variants(program: PairwiseProgram | GradProgram) -> list[PairwiseProgram | GradProgram]:
    """Simpler programs: each sub-expression replaced by one of its arguments or a constant."""
    out = []
    for f in dataclasses.fields(program):
        expr = getattr(program, f.name)
        if not isinstance(expr, ir.Expr):
            continue
        for node in ir.walk(expr):
            if not isinstance(node, ir.Call):
                continue
            for new in (*node.args, ir.Const(1.0), ir.Const(0.0)):
                try:
                    out.append(dataclasses.replace(program, **{f.name: _replace(expr, node, new)}))
                except (TypeError, ValueError):
                    pass
    return out


def _size_variants(case: Case) -> list[Case]:
    """The case with one dimension of its operands cut to its first element, half or all but one."""
    out = []
    for name, t in case.operands.items():
        for dim in range(t.dim()):
            n = t.shape[dim]
            for size in sorted({1, n // 2, n - 1}):
                if 0 < size < n:
                    out.append(_cut(case, name, dim, size))
    return [c for c in out if c is not None]


def _cut(case: Case, name: str, dim: int, size: int) -> Case | None:
    """Cut dimension ``dim`` of operand ``name`` (and of the operands sharing that size) to ``size``."""
    t = case.operands[name]
    full = t.shape[dim]
    ops = dict(case.operands)
    shared = _shared_dims(case, name, dim)
    for other, odim in shared:
        o = ops[other]
        if o.shape[odim] != full:
            return None
        ops[other] = o.narrow(odim, 0, size)
    return dataclasses.replace(case, operands=ops, note="shrunk")


def _shared_dims(case: Case, name: str, dim: int) -> list[tuple[str, int]]:
    """Operand dimensions that must keep the size of ``name``'s dimension ``dim``."""
    t = case.operands[name]
    rel = dim - t.dim()
    if case.pairwise:
        groups = [[("x", -1), ("z", -1)], [("x", -2)], [("z", -2)]]
    else:
        groups = [[("a", -2), ("b", -1), ("c", -1)], [("a", -1), ("d", -1)], [("b", -2), ("d", -2)], [("c", -2)]]
    for g in groups:
        if (name, rel) in g:
            return [(n, case.operands[n].dim() + r) for n, r in g]
    return [(name, dim)]  # a batch dimension: cut just this operand's (it broadcasts or must match)


def shrink(case: Case, still_fails: Callable[[Case], bool], budget: int = 80) -> Case:
    """A smaller case for which ``still_fails`` holds, trying at most ``budget`` candidates."""
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        candidates = _size_variants(case) + [
            dataclasses.replace(case, program=p, note="shrunk") for p in _program_variants(case.program)
        ]
        for cand in candidates:
            if tries >= budget:
                break
            tries += 1
            try:
                cand.hypers = {k: v for k, v in cand.hypers.items() if k in cand.program.hypers}
                cand.out_shape()
            except RuntimeError:
                continue
            if still_fails(cand):
                case, improved = cand, True
                break
    return case


def main(argv: list[str]) -> int:
    """``python tests/fuzz_programs.py SEED [BACKEND [DEVICE]]``: replay and check one case."""
    seed = int(argv[1])
    backend = argv[2] if len(argv) > 2 else "triton"
    device = argv[3] if len(argv) > 3 else ("cuda" if torch.cuda.is_available() else "cpu")
    case = generate(seed)
    print(case.describe())
    failure = verify(case, backend, device)
    print("ok" if failure is None else str(failure))
    return 0 if failure is None else 1


if __name__ == "__main__":
    import os

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main(sys.argv))
