"""Hyperparameters: numbers or per-batch tensors, validated and placed without a host sync.

A hyperparameter (``p``, ``bandwidth``, ``regularization``, or a user-named one) is given as

* a Python ``int``/``float`` (``bool`` is refused) — range-checked at once;
* a 0-d tensor on the CPU — read as a number (reading host memory does not sync the GPU);
* a floating tensor on the inputs' device whose shape broadcasts, by torch's rules, against the
  inputs' batch dimensions — typically 1-d of length 1 or L.  The output's batch shape is the
  broadcast of the inputs' and every hyperparameter's shapes, so ``p=torch.tensor([1., 1.5, 2.])``
  with 2-d inputs computes three distance matrices in one launch.

Tensor values are not range-checked (that would need a host sync) unless ``debug=True``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "Check",
    "HyperValue",
    "check_values",
    "finite",
    "nonnegative",
    "normalize_hyper",
    "positive",
    "positive_finite",
]

#: A range check: ``None`` if the value is fine, else the expectation in words.
Check = Callable[[float], "str | None"]


def nonnegative(v: float) -> str | None:
    """p-style check: 0 ≤ v ≤ ∞."""
    return None if v >= 0 else "a number >= 0 (inf allowed)"


def positive(v: float) -> str | None:
    """0 < v ≤ ∞."""
    return None if v > 0 else "a number > 0"


def positive_finite(v: float) -> str | None:
    """0 < v < ∞."""
    return None if 0 < v < math.inf else "a finite number > 0"


def finite(v: float) -> str | None:
    """−∞ < v < ∞."""
    return None if math.isfinite(v) else "a finite number"


@dataclass(frozen=True, eq=False)
class HyperValue:
    """A normalised hyperparameter: exactly one of ``scalar`` and ``tensor`` is set.

    ``tensor`` is on the problem's device with a floating dtype; after
    :func:`kermac.problem` normalisation it is expanded (a stride-0 view, no copy) to the
    problem's batch shape.
    """

    name: str
    scalar: float | None = None
    tensor: torch.Tensor | None = None

    @property
    def is_scalar(self) -> bool:
        return self.tensor is None

    def expanded(self, batch_shape: tuple[int, ...]) -> HyperValue:
        """This value with its tensor broadcast (as a view) to ``batch_shape``."""
        if self.tensor is None:
            return self
        return HyperValue(self.name, None, self.tensor.expand(batch_shape))


def normalize_hyper(name: str, value: object, *, device: torch.device, check: Check) -> HyperValue:
    """Validate one hyperparameter; see the module documentation for what is accepted."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a number or a floating tensor, got bool")
    if isinstance(value, (int, float)):
        return HyperValue(name, _checked(name, float(value), check))
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a number or a floating tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {value.dtype}")
    if value.dim() == 0 and value.device.type == "cpu":
        return HyperValue(name, _checked(name, float(value.item()), check))
    if value.device != device:
        raise ValueError(
            f"{name}: expected a tensor on {device} (the inputs' device) or a 0-d CPU tensor, "
            f"got a tensor on {value.device}"
        )
    if value.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name}: gradients with respect to hyperparameters are not supported; pass {name}.detach()")
    return HyperValue(name, None, value)


def check_values(hv: HyperValue, check: Check) -> None:
    """Range-check a tensor hyperparameter's values (synchronises the host; debug mode only)."""
    if hv.tensor is None:
        return
    for v in hv.tensor.detach().reshape(-1).tolist():
        _checked(hv.name, v, check)


def _checked(name: str, v: float, check: Check) -> float:
    problem = "a number, not NaN" if math.isnan(v) else check(v)
    if problem is not None:
        raise ValueError(f"{name}: expected {problem}, got {v!r}")
    return v
