"""Hyperparameters: numbers or per-batch tensors, validated and placed without a host sync.

A hyperparameter (`p`, `bandwidth`, `regularization`, or a user-named one) is given as

* a real number: a Python `int`/`float`, a numpy scalar, any `numbers.Real`
  (`bool`, numpy's `bool_` and complex numbers are refused) — range-checked at once;
* a 0-d tensor on the CPU — read as a number (reading host memory does not sync the GPU);
* a floating tensor on the inputs' device whose shape broadcasts, by torch's rules, against the
  inputs' batch dimensions — typically 1-d of length 1 or L.  The output's batch shape is the
  broadcast of the inputs' and every hyperparameter's shapes, so `p=torch.tensor([1., 1.5, 2.])`
  with 2-d inputs computes three distance matrices in one launch.

A tensor that requires grad is refused while grad mode is on (gradients with respect to
hyperparameters are not supported), whichever of the two tensor forms it has.

Tensor values cannot be range-checked without a host sync.  With `debug=True` they are checked
(and an invalid one raises); otherwise [`poison_invalid`][kermac.hyperparams.poison_invalid] replaces every invalid
value by NaN on the device — a range test and one `torch.where` per tensor hyperparameter, whose tiny results
(tensors of the hyperparameter's own shape) are the only allocations — and the programs are built
so that a NaN hyperparameter makes every entry of its batch entry NaN
([`nan_where_nan`][kermac.hyperparams.nan_where_nan]). The hyperparameters of user programs (`run_program`,
`run_grad_program`) take any value but NaN and are used as given.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from kermac import ir

__all__ = [
    "ANY_VALUE",
    "Check",
    "HyperValue",
    "check_values",
    "finite",
    "nan_where_nan",
    "nonnegative",
    "normalize_hyper",
    "poison_invalid",
    "positive",
    "positive_finite",
    "positive_up_to",
    "prepare_hypers",
    "program_hypers",
]


@dataclass(frozen=True)
class Check:
    """A range check: the expectation in words, its test on a number and the same test on a tensor.

    `valid` is never given NaN (NaN is refused before it is asked); `valid_tensor` is False
    where a value is NaN.
    """

    expected: str
    valid: Callable[[float], bool]
    valid_tensor: Callable[[torch.Tensor], torch.Tensor]

    def problem(self, v: float) -> str | None:
        """`None` if `v` passes, else what was expected."""
        if math.isnan(v):
            return "a number, not NaN"
        return None if self.valid(v) else self.expected


nonnegative = Check("a number >= 0 (inf allowed)", lambda v: v >= 0, lambda t: t >= 0)
"""p-style check: 0 ≤ v ≤ ∞."""
positive = Check("a number > 0", lambda v: v > 0, lambda t: t > 0)
"""0 < v ≤ ∞."""
positive_finite = Check("a finite number > 0", lambda v: 0 < v < math.inf, lambda t: (t > 0) & (t < math.inf))
"""0 < v < ∞."""
finite = Check("a finite number", math.isfinite, torch.isfinite)
"""−∞ < v < ∞."""


def positive_up_to(limit: float, why: str) -> Check:
    """0 < v ≤ `limit`; `why` says where the limit comes from (it is part of the error message)."""
    return Check(f"a number > 0 and <= {limit:.6g} ({why})", lambda v: 0 < v <= limit, lambda t: (t > 0) & (t <= limit))


ANY_VALUE = Check("a number, not NaN", lambda v: True, lambda t: ~torch.isnan(t))
"""Any value but NaN (the hyperparameters of user programs)."""


def nan_where_nan(expr: ir.Expr, name: str) -> ir.Expr:
    """`select(h == h, expr, NaN)` for the hyperparameter `h = Hyper(name)`: `expr` itself
    (bit for bit) wherever `h` is a number, NaN wherever `h` is NaN.

    Programs apply it to their epilogue for each hyperparameter whose NaN would not reach every
    output by itself (`pow(1, NaN) = 1`; `λ` is read on the diagonal only), so that an invalid
    tensor value, which [`poison_invalid`][kermac.hyperparams.poison_invalid] turns into NaN, shows in every entry of
    its batch entry.  A valid value that the compute type rounds to ±inf (`λ = 1e39` in float32) is a
    number, not NaN: it leaves the other entries alone.
    """
    h = ir.Hyper(name)
    return ir.select(ir.eq(h, h), expr, math.nan)


@dataclass(frozen=True, eq=False)
class HyperValue:
    """A normalised hyperparameter: exactly one of `scalar` and `tensor` is set.

    `tensor` is on the problem's device with a floating dtype; after
    `kermac.problem` normalisation it is expanded (a stride-0 view, no copy) to the
    problem's batch shape.  `given` is the caller's tensor where `tensor` is a checked copy of
    it ([`poison_invalid`][kermac.hyperparams.poison_invalid]), so that `out` is also checked against the caller's
    memory.
    """

    name: str
    scalar: float | None = None
    tensor: torch.Tensor | None = None
    given: torch.Tensor | None = None

    @property
    def is_scalar(self) -> bool:
        return self.tensor is None

    def expanded(self, batch_shape: tuple[int, ...]) -> HyperValue:
        """This value with its tensor broadcast (as a view) to `batch_shape`."""
        if self.tensor is None:
            return self
        return HyperValue(self.name, None, self.tensor.expand(batch_shape), self.given)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors behind this value: what kernels read and, if different, what the caller gave."""
        return tuple(t for t in (self.tensor, self.given) if t is not None)


def normalize_hyper(name: str, value: object, *, device: torch.device, check: Check) -> HyperValue:
    """Validate one hyperparameter; see the module documentation for what is accepted."""
    if type(value) is float:  # the common case, without the abstract-base-class checks below
        return HyperValue(name, _checked(name, value, check))
    if isinstance(value, torch.Tensor):
        return _normalize_tensor(name, value, device, check)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's bool_ is no Real either
        raise TypeError(f"{name}: expected a real number or a floating tensor, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float's range
        v = math.inf if value > 0 else -math.inf
    return HyperValue(name, _checked(name, v, check))


def _normalize_tensor(name: str, value: torch.Tensor, device: torch.device, check: Check) -> HyperValue:
    if not value.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {value.dtype}")
    if value.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name}: gradients with respect to hyperparameters are not supported; pass {name}.detach()")
    if value.dim() == 0 and value.device.type == "cpu":
        return HyperValue(name, _checked(name, float(value.item()), check))
    if value.device != device:
        raise ValueError(
            f"{name}: expected a tensor on {device} (the inputs' device) or a 0-d CPU tensor, "
            f"got a tensor on {value.device}"
        )
    return HyperValue(name, None, value)


def check_values(hv: HyperValue, check: Check) -> None:
    """Range-check a tensor hyperparameter's values (synchronises the host; debug mode only).

    Meta tensors hold no values: nothing to check."""
    if hv.tensor is None or hv.tensor.device.type == "meta":
        return
    if hv.tensor.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{hv.name}: debug=True checks tensor hyperparameters on the host, which a CUDA graph capture "
            "forbids; capture without debug (invalid values then give NaN)"
        )
    for v in hv.tensor.detach().reshape(-1).tolist():
        _checked(hv.name, v, check)


def poison_invalid(hv: HyperValue, check: Check) -> HyperValue:
    """`hv` with every tensor value that fails `check` replaced by NaN, without a host sync.

    A few element-wise operations on the device (the range test and one `torch.where`); their
    results, of the hyperparameter's own shape (not the batch's), are the only allocations.
    Numbers pass through (they were checked at once)."""
    t = hv.tensor
    if t is None:
        return hv
    return HyperValue(hv.name, None, torch.where(check.valid_tensor(t), t, math.nan), t)


def prepare_hypers(
    specs: Mapping[str, tuple[object, Check]], device: torch.device, debug: bool, *, poison: bool = True
) -> dict[str, HyperValue]:
    """Every `name → (value, check)` of `specs` normalised ([`normalize_hyper`][kermac.hyperparams.normalize_hyper]).
    Tensor values are range-checked with `debug` (a host sync); otherwise, with `poison`, an invalid value
    becomes NaN on the device ([`poison_invalid`][kermac.hyperparams.poison_invalid])."""
    out = {}
    for name, (value, check) in specs.items():
        hv = normalize_hyper(name, value, device=device, check=check)
        if debug:
            check_values(hv, check)
        elif poison:
            hv = poison_invalid(hv, check)
        out[name] = hv
    return out


def _checked(name: str, v: float, check: Check) -> float:
    problem = check.problem(v)
    if problem is not None:
        raise ValueError(f"{name}: expected {problem}, got {v!r}")
    return v


def program_hypers(
    names: tuple[str, ...], given: Mapping[str, object] | None, device: torch.device, debug: bool
) -> dict[str, HyperValue]:
    """The hyperparameters `given` to a user program whose names are `names`: exactly those names
    (`ValueError` listing the missing and unknown ones), any value but NaN, used as given."""
    given = dict(given or {})
    missing = [n for n in names if n not in given]
    extra = [n for n in given if n not in names]
    if missing or extra:
        raise ValueError(
            f"hypers: expected exactly the program's hyperparameters {list(names)}; missing {missing}, unknown {extra}"
        )
    return prepare_hypers({n: (v, ANY_VALUE) for n, v in given.items()}, device, debug, poison=False)
