"""The table of problems every backend is checked on: [`Case`][kermac.testing.Case] and
[`CASES`][kermac.testing.CASES]."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from kermac import ir, presets
from kermac.hyperparams import program_hypers
from kermac.lowering import grad_program
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem, grad_problem, pairwise_problem, product_problem
from kermac.programs import GradProgram, PairwiseProgram, swap_operands

__all__ = [
    "CASES",
    "GENERAL_SUM_GRAD",
    "HUBER_GRAD",
    "HYPER_VALUES",
    "LAYOUTS",
    "LOPSIDED_RIDGE",
    "MAX_GRAD",
    "MAX_OF_NEGATIVES",
    "MIN_GRAD",
    "MIN_OF_POSITIVES",
    "PRODUCT_CASES",
    "PRODUCT_COLUMNS",
    "SAMPLE_CASES",
    "SOFT_L1",
    "SOFT_MAX_GRAD",
    "SOFT_MIN",
    "TRANSPOSED_PRODUCT_CASE",
    "Case",
]

HYPER_VALUES: Mapping[str, float] = {"bandwidth": 1.3, "p": 1.5, "regularization": 0.1, "eps": 0.25, "gamma": 0.5}
"""The number each hyperparameter of a case takes unless the case gives it (a tensor, say)."""

_X, _Z = ir.Var("x"), ir.Var("z")
SOFT_L1 = PairwiseProgram(ir.sqrt((_X - _Z) * (_X - _Z) + ir.Hyper("eps")), "sum", ir.exp(-ir.Var("acc")))
"""A user program: Σ √((x − z)² + ε), then e^−acc."""
HUBER_GRAD = GradProgram(ir.minimum(ir.maximum(ir.Var("d") - ir.Var("b"), -1.0), 1.0), ir.Var("acc"))
"""A user gradient program: Σ c·a·clip(d − b, −1, 1)."""
_A, _B, _C, _D, _TERM, _ACC = (ir.Var(n) for n in ("a", "b", "c", "d", "term", "acc"))
GENERAL_SUM_GRAD = GradProgram(_A + (_D - _B) * (_D - _B), _ACC, _C * _TERM)
"""A gradient program in the general form whose multiply is not `a` times a factor: Σ_k c·(a + (d − b)²)."""
MAX_GRAD = GradProgram(ir.abs_(_D - _B) - _A, _ACC, _TERM * _C, "max")
"""A general gradient program reducing by a maximum: max_k c·(|d − b| − a) (−∞ for K = 0)."""
MIN_GRAD = GradProgram(_A * _B - _D, _ACC, _TERM - _C, "min")
"""A general gradient program reducing by a minimum, with an accumulation other than a product: min_k (a·b − d − c)."""
SOFT_MAX_GRAD = GradProgram(_A * (_D - _B) / ir.Hyper("gamma"), ir.Hyper("gamma") * _ACC, _C * _TERM, "logsumexp")
"""A general gradient program reducing by log-sum-exp: the soft maximum γ·log Σ_k exp(c·a·(d − b)/γ)."""
MAX_OF_NEGATIVES = PairwiseProgram(-ir.abs_(_X - _Z) - 1.0, "max", ir.Var("acc"))
"""A user program whose terms are all negative: max over k of (−|x − z| − 1).  A backend that starts
the max from 0 instead of −∞ (the identity of max) returns 0."""
MIN_OF_POSITIVES = PairwiseProgram(ir.abs_(_X - _Z) + 1.0, "min", ir.Var("acc"))
"""A user program whose terms are all positive: min over k of (|x − z| + 1).  A backend that starts
the min from 0 instead of +∞ returns 0."""
SOFT_MIN = PairwiseProgram(-ir.abs_(_X - _Z) / ir.Hyper("gamma"), "logsumexp", -ir.Hyper("gamma") * ir.Var("acc"))
"""A log-sum-exp program: the soft minimum −γ·log Σ_k exp(−|x − z|/γ) of the coordinates' distances (within
γ·log D below their minimum).  A NaN coordinate gives NaN, an infinite one no term (exp(−∞) = 0), no feature +∞
(the epilogue of the identity −∞)."""
LOPSIDED_RIDGE = PairwiseProgram(
    ir.abs_(_X - 2.0 * _Z), "sum", ir.exp(-0.25 * ir.Var("acc")) + ir.Hyper("regularization") * ir.Var("diag")
)
"""A user program that is not symmetric in x and z, with a regularised diagonal: e^(−Σ|x − 2z|/4) + λ[diag].
Its transpose is a different program ([`swap_operands`][kermac.programs.swap_operands]) and a different
diagonal where the offsets differ: what the transposed product is checked on."""


LAYOUTS = ("contiguous", "transposed", "strided")
"""The memory layouts a [`Case`][kermac.testing.Case] gives its operands."""


def _draw(shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal entries drawn in float64 on the CPU (the same on every device), then converted."""
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


@dataclass(frozen=True)
class Case:
    """One problem of the suite: `op` (`"pairwise"` or `"grad"`) of `program` on random operands of
    `shapes` (`x, z` or `a, b, c, d`).

    `hypers` gives a hyperparameter a number, or nested lists of numbers: a tensor (in the operands'
    dtype) broadcast against the batch; the others take [`HYPER_VALUES`][kermac.testing.HYPER_VALUES].
    `layout` is `"transposed"` (every operand, and `out`, a transposed view) or `"strided"`
    (every operand every other column of a wider tensor).  `special` puts NaN, +inf and −inf
    among the first two operands' entries.  `offsets` are the pairwise `offset_m, offset_n`.
    """

    name: str
    op: str
    program: PairwiseProgram | GradProgram
    shapes: tuple[tuple[int, ...], ...]
    hypers: Mapping[str, float | list] = field(default_factory=dict)
    layout: str = "contiguous"
    special: bool = False
    offsets: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        if self.op not in ("pairwise", "grad"):
            raise ValueError(f"op: expected 'pairwise' or 'grad', got {self.op!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {self.layout!r}")

    def inputs(self, device: str | torch.device, dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], dict]:
        """The operands and hyperparameters on `device` in `dtype`, the same on every call."""
        gen = torch.Generator().manual_seed(zlib.crc32(self.name.encode()))
        operands = tuple(self._operand(shape, gen, device, dtype) for shape in self.shapes)
        if self.special:
            first, second = operands[0], operands[1]
            first[..., 0, 0], first[..., -1, -1], second[..., -1, 0] = torch.nan, -torch.inf, torch.inf
        hypers = {
            name: self._hyper(self.hypers.get(name, HYPER_VALUES.get(name)), device, dtype)
            for name in self.program.hypers
        }
        return operands, hypers

    def _operand(
        self, shape: tuple[int, ...], gen: torch.Generator, device: str | torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        *batch, rows, cols = shape
        if self.layout == "transposed":
            return _draw((*batch, cols, rows), gen, device, dtype).mT
        if self.layout == "strided":
            return _draw((*batch, rows, 2 * cols), gen, device, dtype)[..., ::2]
        return _draw(shape, gen, device, dtype)

    @staticmethod
    def _hyper(value: float | list, device: str | torch.device, dtype: torch.dtype) -> float | torch.Tensor:
        return torch.tensor(value, dtype=dtype, device=device) if isinstance(value, list) else value

    def out(self, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
        """An output of `shape` for this case: transposed where the operands are."""
        if self.layout != "transposed" or len(shape) < 2:
            return torch.empty(shape, dtype=like.dtype, device=like.device)
        return torch.empty((*shape[:-2], shape[-1], shape[-2]), dtype=like.dtype, device=like.device).mT

    @property
    def terms(self) -> int:
        """How many inner terms the case computes: batch · M · N · D (gradients batch · O · N · M · K),
        a measure of its cost where kernels are interpreted."""
        rows, cols = self.shapes[0][-2:]  # M, D of x; K, M of a
        batch = torch.broadcast_shapes(*(shape[:-2] for shape in self.shapes)).numel()
        if self.op == "pairwise":
            return batch * rows * self.shapes[1][-2] * cols
        return batch * self.shapes[2][-2] * self.shapes[1][-2] * cols * rows

    def vector(
        self, operands: tuple[torch.Tensor, ...], columns: int, transpose: bool, device: str | torch.device
    ) -> torch.Tensor:
        """The `v` of a product of this pairwise case: `[..., N, columns]` (`[..., M, columns]` with
        `transpose`: the `u` of `Kᵀ @ u`), the same on every call, in the operands' dtype.

        With one column it has no batch dimensions (broadcast against the batch); with more, those of
        `z` (of `x` with `transpose`), so it broadcasts against the other operand where the case's batch
        does.  It takes the case's `layout` (a transposed or strided view); `special` puts a NaN with
        every payload bit set in its first entry where there are several columns (the other columns still
        check the values)."""
        x, z = operands
        rows_of = x if transpose else z
        batch = rows_of.shape[:-2] if columns > 1 else ()
        gen = torch.Generator().manual_seed(zlib.crc32(f"{self.name}/v{columns}{'T' * transpose}".encode()))
        v = self._operand((*batch, rows_of.shape[-2], columns), gen, device, x.dtype)
        if self.special and columns > 1 and v.numel():
            # the NaN that CUDA arithmetic produces (every payload bit set), not Python's quiet NaN: a backend
            # that rounds it with an integer carry (as a TF32 split may) turns it into -0
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[v.element_size()]
            v.view(bits)[..., 0, 0] = torch.iinfo(bits).max
        return v

    def product_problem(
        self,
        operands: tuple[torch.Tensor, ...],
        hypers: dict,
        v: torch.Tensor,
        out: torch.Tensor | None,
        transpose: bool = False,
    ) -> ProductProblem:
        """The product problem kermac hands a backend for `K @ v` of this pairwise case (`Kᵀ @ v` with
        `transpose`: the product of the program with its operands swapped, on `(z, x)`, the offsets
        exchanged); `out` None: kermac's own output."""
        x, z = operands
        program, (m, n) = self.program, self.offsets
        if transpose:
            program, x, z, m, n = swap_operands(program), z, x, n, m
        hv = program_hypers(program.hypers, hypers, x.device, False)
        return product_problem(program, x, z, v, out=out, hypers=hv, offset_m=m, offset_n=n)

    def problem(
        self, operands: tuple[torch.Tensor, ...], hypers: dict, out: torch.Tensor | None
    ) -> PairwiseProblem | GradProblem:
        """The problem kermac builds for this case on `operands` and `hypers` (from
        [`inputs`][kermac.testing.Case.inputs]) and hands to a backend; `out` None: kermac's own output."""
        hv = program_hypers(self.program.hypers, hypers, operands[0].device, False)
        if self.op == "pairwise":
            m, n = self.offsets
            return pairwise_problem(self.program, *operands, out=out, hypers=hv, offset_m=m, offset_n=n)
        return grad_problem(self.program, *operands, out=out, hypers=hv)


_ODD = ((37, 19), (29, 19))  # no size is a multiple of a tile or of a vector width
_GRAD_ODD = ((37, 29), (19, 37), (3, 37), (19, 29))  # a [K, M], b [N, K], c [O, K], d [N, M]: K 37, M 29, N 19, O 3
_L1, _L2 = presets.l1_distance.lower(), presets.l2_distance.lower()
_GAUSSIAN, _LP = presets.gaussian.lower(), presets.lp_distance.lower()
_G1, _G2, _GP = grad_program(1.0), grad_program(2.0), grad_program(1.5)


def _grad_shapes(k: int, m: int, n: int, o: int, batch: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    return ((*batch, k, m), (*batch, n, k), (*batch, o, k), (*batch, n, m))


# Larger in M, N and D (K, M, N and O for gradients) than any tile of the built-in backends (128 rows or
# columns of out, 64 of k, 64 of o), and a multiple of none: a backend must loop over blocks in every
# dimension, and handle a partial last block in each.
_MULTI_BLOCK = ((150, 70), (270, 70))
_GRAD_MULTI_BLOCK = _grad_shapes(70, 150, 135, 70)

CASES: tuple[Case, ...] = (
    *(Case(name, "pairwise", preset.lower(), _ODD) for name, preset in presets.ALL.items()),
    Case("matern52_ridge_diagonal", "pairwise", presets.matern52.lower(regularized=True), _ODD, offsets=(0, 3)),
    Case("user_soft_l1", "pairwise", SOFT_L1, ((37, 5), (29, 5))),  # e^-acc of 19 features underflows float16
    Case("user_max_of_negatives", "pairwise", MAX_OF_NEGATIVES, _ODD),
    Case("user_min_of_positives", "pairwise", MIN_OF_POSITIVES, _ODD),
    Case("user_lopsided_ridge", "pairwise", LOPSIDED_RIDGE, ((37, 5), (29, 5)), offsets=(0, 3)),
    # Few features: an interpreted backend folds a log-sum-exp chunk term by term (kermac_backend_triton.generated).
    Case("user_soft_min", "pairwise", SOFT_MIN, ((37, 7), (29, 7))),
    Case("user_soft_min_nan_inf", "pairwise", SOFT_MIN, ((37, 7), (29, 7)), special=True),
    Case("user_soft_min_d0", "pairwise", SOFT_MIN, ((7, 0), (9, 0))),
    Case("user_soft_min_d1", "pairwise", SOFT_MIN, ((7, 1), (9, 1))),
    Case(
        "user_soft_min_batched_gamma",
        "pairwise",
        SOFT_MIN,
        ((3, 1, 7, 5), (2, 9, 5)),
        {"gamma": [[0.25], [1.0], [4.0]]},
        layout="transposed",
    ),
    Case("l1_multi_tile", "pairwise", _L1, ((133, 21), (67, 21))),
    Case("l2_multi_tile", "pairwise", _L2, ((133, 21), (67, 21))),
    Case("l1_multi_block", "pairwise", _L1, _MULTI_BLOCK),
    Case("l2_multi_block", "pairwise", _L2, _MULTI_BLOCK),
    Case("gaussian_long_n", "pairwise", _GAUSSIAN, ((9, 3), (150, 3))),  # N beyond the tiles, few terms
    Case("l1_m0", "pairwise", _L1, ((0, 5), (9, 5))),
    Case("l1_n0", "pairwise", _L1, ((7, 5), (0, 5))),
    Case("gaussian_d0", "pairwise", _GAUSSIAN, ((7, 0), (9, 0))),
    Case("l1_batch0", "pairwise", _L1, ((0, 7, 5), (9, 5))),
    Case("gaussian_all_size1", "pairwise", _GAUSSIAN, ((1, 1), (1, 1))),
    Case("l2_m1_n1", "pairwise", _L2, ((1, 19), (29, 19))),
    Case("l1_transposed", "pairwise", _L1, _ODD, layout="transposed"),
    Case("l2_transposed", "pairwise", _L2, _ODD, layout="transposed"),
    Case("l2_strided", "pairwise", _L2, _ODD, layout="strided"),
    Case("l2_broadcast_batch", "pairwise", _L2, ((7, 19), (2, 9, 19))),
    Case("l1_broadcast_batch_2d", "pairwise", _L1, ((3, 1, 7, 5), (4, 9, 5))),
    Case("gaussian_batched_bandwidth", "pairwise", _GAUSSIAN, ((2, 7, 5), (9, 5)), {"bandwidth": [0.7, 1.9]}),
    Case("lp_batched_p", "pairwise", _LP, ((3, 1, 7, 5), (4, 9, 5)), {"p": [[1.5], [3.0], [0.8]]}),
    Case(
        "matern52_batched_ridge",
        "pairwise",
        presets.matern52.lower(regularized=True),
        ((3, 1, 7, 5), (4, 9, 5)),
        {"regularization": [[0.1], [0.5], [2.0]], "bandwidth": [0.7, 1.3, 1.9, 2.5]},
        offsets=(2, 0),
    ),
    *(
        Case(f"{name}_nan_inf", "pairwise", presets.ALL[name].lower(), _ODD, special=True)
        for name in ("l1_distance", "l2_distance", "linf_distance", "gaussian", "dot_product")
    ),
    Case("grad_p1", "grad", _G1, _GRAD_ODD),
    Case("grad_p2", "grad", _G2, _GRAD_ODD),
    Case("grad_p1.5", "grad", _GP, _GRAD_ODD),
    Case("grad_user_huber", "grad", HUBER_GRAD, _GRAD_ODD),
    Case("grad_p2_multi_tile", "grad", _G2, _grad_shapes(133, 67, 21, 2)),
    Case("grad_p2_multi_block", "grad", _G2, _GRAD_MULTI_BLOCK),
    Case("grad_p2_k0", "grad", _G2, _grad_shapes(0, 29, 19, 3)),
    Case("grad_p2_m0", "grad", _G2, _grad_shapes(37, 0, 19, 3)),
    Case("grad_p2_batch0", "grad", _G2, _grad_shapes(37, 29, 19, 3, (0,))),
    Case("grad_p2_all_size1", "grad", _G2, _grad_shapes(1, 1, 1, 1)),
    Case("grad_p2_transposed", "grad", _G2, _GRAD_ODD, layout="transposed"),
    Case("grad_p1_strided", "grad", _G1, _GRAD_ODD, layout="strided"),
    Case("grad_p2_broadcast_batch", "grad", _G2, ((2, 37, 29), *_GRAD_ODD[1:])),
    Case("grad_batched_p", "grad", _GP, _grad_shapes(37, 29, 19, 3, (2,)), {"p": [1.5, 3.0]}),
    Case("grad_p2_nan_inf", "grad", _G2, _GRAD_ODD, special=True),
    Case("grad_p1_nan_inf", "grad", _G1, _GRAD_ODD, special=True),
    Case("grad_user_general_sum", "grad", GENERAL_SUM_GRAD, _GRAD_ODD),
    Case("grad_user_max", "grad", MAX_GRAD, _GRAD_ODD),
    Case("grad_user_max_nan_inf", "grad", MAX_GRAD, _GRAD_ODD, special=True),
    Case("grad_user_max_multi_block", "grad", MAX_GRAD, _GRAD_MULTI_BLOCK),
    Case("grad_user_min_k0", "grad", MIN_GRAD, _grad_shapes(0, 29, 19, 3)),
    Case("grad_user_min_transposed", "grad", MIN_GRAD, _GRAD_ODD, layout="transposed"),
    Case(
        "grad_user_soft_max_batched_gamma",
        "grad",
        SOFT_MAX_GRAD,
        _grad_shapes(37, 29, 19, 3, (2,)),
        {"gamma": [0.5, 2.0]},
    ),
    Case("grad_user_soft_max_nan_inf", "grad", SOFT_MAX_GRAD, _GRAD_ODD, special=True),
)
"""The problems every backend is checked on (each also in each dtype the suite is given)."""

SAMPLE_CASES: tuple[Case, Case] = (CASES[0], next(c for c in CASES if c.op == "grad"))
"""A pairwise and a gradient case: the sample problems the hooks are checked on (the pairwise one also
as a product)."""

PRODUCT_COLUMNS: tuple[int, ...] = (1, 5)
"""The numbers of columns of `v` every product case is checked with (one, and an odd number > 1)."""

_PRODUCTS = (
    "l1_distance",
    "gaussian",
    "laplace_l1",
    "matern52_ridge_diagonal",
    "user_soft_l1",
    "user_max_of_negatives",
    "user_lopsided_ridge",
    "user_soft_min_batched_gamma",
    "l1_multi_tile",
    "l2_multi_tile",
    "l2_multi_block",
    "gaussian_long_n",
    "l1_n0",
    "gaussian_d0",
    "gaussian_all_size1",
    "l2_m1_n1",
    "l2_transposed",
    "l2_strided",
    "l2_broadcast_batch",
    "l1_broadcast_batch_2d",
    "matern52_batched_ridge",
    "l1_distance_nan_inf",
    "gaussian_nan_inf",
)
_BY_NAME = {c.name: c for c in CASES}
PRODUCT_CASES: tuple[Case, ...] = tuple(_BY_NAME[name] for name in _PRODUCTS)
"""The pairwise cases whose kernel is also checked as a product `K @ v` (each with `v` of every
[`PRODUCT_COLUMNS`][kermac.testing.PRODUCT_COLUMNS]): a representative subset of the pairwise cases --
distances, kernel functions, user programs (a max reduction, a log-sum-exp one, an asymmetric one), regularised
diagonals with offsets, N longer than the tiles of 64 and 128 (also with few rows and features, cheap where kernels are
interpreted), sizes beyond a tile in every dimension, size-0 and size-1 dimensions, views, broadcast
batches, batched hyperparameters, NaN and ±inf (and NaN in `v`)."""

TRANSPOSED_PRODUCT_CASE: Case = _BY_NAME["user_lopsided_ridge"]
"""The case whose transposed product `Kᵀ @ u` is checked: an asymmetric program with offsets, so a backend
that ran the program unswapped, or kept the offsets, gives other values."""
