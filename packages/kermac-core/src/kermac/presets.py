"""Ready-made kernel descriptors for the common distances and kernels.

Use them with [`kermac.run_kernel`][kermac.run_kernel], e.g. `kermac.run_kernel(presets.laplace_l2, x, z,
bandwidth=1.5)`; change a field with `presets.laplace_l1.replace(kernel="gaussian")`.
"""

from __future__ import annotations

from kermac.descriptor import KernelDescriptor

__all__ = [
    "ALL",
    "cauchy",
    "dot_product",
    "gaussian",
    "l0_distance",
    "l1_distance",
    "l2_distance",
    "laplace_l1",
    "laplace_l2",
    "laplace_lp",
    "linf_distance",
    "lp_distance",
    "matern32",
    "matern52",
    "squared_l2_distance",
]

l0_distance = KernelDescriptor(power="nonzero")
"""Number of coordinates where x and z differ (torch.cdist with p = 0)."""
l1_distance = KernelDescriptor(power="abs")
"""Σ|x−z| (Manhattan)."""
l2_distance = KernelDescriptor(power="square", outer="sqrt")
"""√Σ(x−z)² (Euclidean), computed without the matrix-product expansion."""
squared_l2_distance = KernelDescriptor(power="square")
"""Σ(x−z)²."""
lp_distance = KernelDescriptor(power="pow", outer="root")
"""(Σ|x−z|ᵖ)^(1/p), hyperparameter `p` > 0."""
linf_distance = KernelDescriptor(power="abs", reduction="max")
"""max|x−z| (Chebyshev)."""
laplace_l1 = KernelDescriptor(power="abs", kernel="laplace")
"""exp(−‖x−z‖₁/σ)."""
laplace_l2 = KernelDescriptor(power="square", outer="sqrt", kernel="laplace")
"""exp(−‖x−z‖₂/σ)."""
laplace_lp = KernelDescriptor(power="pow", outer="root", kernel="laplace")
"""exp(−‖x−z‖_p/σ)."""
gaussian = KernelDescriptor(power="square", outer="sqrt", kernel="gaussian")
"""exp(−‖x−z‖₂²/(2σ²)), without a square root."""
matern32 = KernelDescriptor(power="square", outer="sqrt", kernel="matern32")
"""Matérn ν = 3/2 on the Euclidean distance."""
matern52 = KernelDescriptor(power="square", outer="sqrt", kernel="matern52")
"""Matérn ν = 5/2 on the Euclidean distance."""
cauchy = KernelDescriptor(power="square", outer="sqrt", kernel="cauchy")
"""1/(1+‖x−z‖₂²/σ²) (Cauchy / rational quadratic with α = 1)."""
dot_product = KernelDescriptor(inner="product", power="identity")
"""Σ x·z (linear kernel, the plain matrix product x zᵀ)."""

ALL: dict[str, KernelDescriptor] = {name: globals()[name] for name in __all__ if name != "ALL"}
"""Every preset by name."""
