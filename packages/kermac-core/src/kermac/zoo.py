r"""Ready kernels written with [`kermac.dsl`][kermac.dsl]: mm-kermac's zoo and the kernels users of kernel
machines ask for.

Each is a [`Kernel`][kermac.dsl.Kernel] (or [`GradKernel`][kermac.dsl.GradKernel]) whose program is a few
lambdas below: call it with the inputs and its hyperparameters by keyword (`NormLp()(x, z, p_inner=1.3,
p_outer=1 / 1.3)`), each a number or a tensor of one value per batch entry.  A constructor's arguments are
hyperparameters bound to the kernel ([`Kernel.bind`][kermac.dsl.Kernel.bind]): every value runs the same
compiled kernel.  With t = x − z (x[ℓ, m, k], z[ℓ, n, k]) and D features:

| kernel | out[ℓ, m, n] | hyperparameters | same kernel as the preset |
|---|---|---|---|
| `Gemm()` | Σ x·z | | `dot_product` |
| `NormL1()` | Σ \|t\| | | `l1_distance` |
| `NormL2()` | √(Σ t²) | | `l2_distance` |
| `NormLp(epsilon=0)` | s = (Σ \|t\|^p_inner)^p_outer, 0 where s < ε | `p_inner`, `p_outer` | |
| `Gaussian()` | exp(−Σ t² / (2σ²)) | `bandwidth` | `gaussian` |
| `LaplaceL1()` | exp(−Σ \|t\| / σ) | `bandwidth` | `laplace_l1` |
| `LaplaceL2()` | exp(−√(Σ t²) / σ) | `bandwidth` | `laplace_l2` |
| `Polynomial()` | (γ Σ x·z + c₀)^degree | `gamma`, `coef0`, `degree` | |
| `Sigmoid()` | tanh(γ Σ x·z + c₀) | `gamma`, `coef0` | |
| `LpqLaplace()` | exp(−(Σ \|t\|^p)^(q/p) / σ^q) | `p`, `q`, `bandwidth` | |
| `SumPowerLaplace(const_mix=0, power=2)` | ((1 − c)/D · Σ exp(−\|t\|^q / σ^q) + c)^power | `bandwidth`, `exponent` | |
| `Mahalanobis(kernel)` | `kernel` on x·s and z·s | `scale` s (one per feature) and `kernel`'s | |

`Polynomial` and `Sigmoid` are scikit-learn's `polynomial_kernel` and `sigmoid_kernel`; `LpqLaplace` and
`SumPowerLaplace` are the kernels of the same names in Recursive Feature Machine forks (xRFM).  The
"same kernel" column: the program's normal form ([`canonical_key`][kermac.dsl.canonical_key]) is the preset's,
so it runs the preset's kernel at the preset's speed.

The gradient zoo, mm-kermac's, with the shapes of [`cdist_grad`][kermac.api.cdist_grad] and t = d − b
(d[ℓ, n, m], b[ℓ, n, k]): `out[ℓ, o, n, m] = Σ_k c[ℓ, o, k]·a[ℓ, k, m]·φ(t)` with

| kernel | φ(t) | hyperparameters | same kernel as |
|---|---|---|---|
| `NormL1Grad()` | sgn t | | `cdist_grad(p=1)` |
| `NormL2Grad()` | t | | `cdist_grad(p=2)` |
| `NormLpGrad(epsilon=0)` | sgn t · max(\|t\|, ε)^p_power_grad | `p_power_grad` = p − 1 | `cdist_grad(p)` (ε = 0) |

A tie t = 0 contributes 0 (sgn 0 = 0, as in `cdist_grad`).  An ε > 0 keeps the power finite for
p_power_grad < 0 and is part of the program (each ε compiles once).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kermac.dsl import GradKernel, HyperInput, Kernel, exp, gradient_program, maximum, program, sign, sqrt, tanh, where

__all__ = [
    "Gaussian",
    "Gemm",
    "LaplaceL1",
    "LaplaceL2",
    "LpqLaplace",
    "Mahalanobis",
    "NormL1",
    "NormL1Grad",
    "NormL2",
    "NormL2Grad",
    "NormLp",
    "NormLpGrad",
    "Polynomial",
    "Sigmoid",
    "SumPowerLaplace",
]


class _Zoo(Kernel):
    """A zoo kernel: its program traced from `_define`, its constructor's arguments bound."""

    __slots__ = ()

    def __init__(self, **bound: HyperInput) -> None:
        traced = self._define()
        super().__init__(traced.program, traced.parameters, bound)

    @staticmethod
    def _define() -> Kernel:
        raise NotImplementedError


class Gemm(_Zoo):
    """Σ_k x·z: the matrix product x zᵀ (mm-kermac's `Gemm`; the preset `dot_product`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(lambda x, z: x * z)


class NormL1(_Zoo):
    """Σ_k |x − z| (mm-kermac's `NormL1`; the preset `l1_distance`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(lambda x, z: abs(x - z))


class NormL2(_Zoo):
    """√(Σ_k (x − z)²) (mm-kermac's `NormL2`; the preset `l2_distance`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(lambda x, z: (x - z) ** 2, epilogue=lambda acc: sqrt(acc))


class NormLp(_Zoo):
    """s = (Σ_k |x − z|^p_inner)^p_outer, 0 where s < `epsilon` (mm-kermac's `NormLp`).

    Args:
        epsilon: outputs below it are 0 (a number or one per batch entry).
    """

    __slots__ = ()

    def __init__(self, epsilon: HyperInput = 0.0) -> None:
        super().__init__(epsilon=epsilon)

    @staticmethod
    def _define() -> Kernel:
        return program(
            lambda x, z, p_inner: abs(x - z) ** p_inner,
            epilogue=lambda acc, p_outer, epsilon: where(epsilon > acc**p_outer, 0.0, acc**p_outer),
        )


class Gaussian(_Zoo):
    """exp(−Σ_k (x − z)² / (2σ²)), σ = `bandwidth` (the preset `gaussian`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(
            lambda x, z: (x - z) ** 2, epilogue=lambda acc, bandwidth: exp(-(acc / (2 * (bandwidth * bandwidth))))
        )


class LaplaceL1(_Zoo):
    """exp(−Σ_k |x − z| / σ), σ = `bandwidth` (the preset `laplace_l1`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(lambda x, z: abs(x - z), epilogue=lambda acc, bandwidth: exp(-(acc / bandwidth)))


class LaplaceL2(_Zoo):
    """exp(−√(Σ_k (x − z)²) / σ), σ = `bandwidth` (the preset `laplace_l2`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(lambda x, z: (x - z) ** 2, epilogue=lambda acc, bandwidth: exp(-(sqrt(acc) / bandwidth)))


class Polynomial(_Zoo):
    """(γ·Σ_k x·z + c₀)^degree with `gamma`, `coef0`, `degree` (scikit-learn's `polynomial_kernel`; a
    negative base gives NaN for a non-integer degree, as IEEE `pow`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(lambda x, z: x * z, epilogue=lambda acc, gamma, coef0, degree: (gamma * acc + coef0) ** degree)


class Sigmoid(_Zoo):
    """tanh(γ·Σ_k x·z + c₀) with `gamma`, `coef0` (scikit-learn's `sigmoid_kernel`; tanh as
    [`kermac.dsl.tanh`][kermac.dsl.tanh] computes it)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(lambda x, z: x * z, epilogue=lambda acc, gamma, coef0: tanh(gamma * acc + coef0))


class LpqLaplace(_Zoo):
    """exp(−‖x − z‖_p^q / σ^q) = exp(−(Σ_k |x − z|^p)^(q/p) / σ^q) with `p`, `q`, σ = `bandwidth` (xRFM's
    `LpqLaplaceKernel`)."""

    __slots__ = ()

    @staticmethod
    def _define() -> Kernel:
        return program(
            lambda x, z, p: abs(x - z) ** p,
            epilogue=lambda acc, p, q, bandwidth: exp(-(acc ** (q / p)) / bandwidth**q),
        )


class SumPowerLaplace(_Zoo):
    """((1 − c)/D · Σ_k exp(−|x − z|^q / σ^q) + c)^power with q = `exponent`, σ = `bandwidth`, c = `const_mix`
    and D the number of features (xRFM's `SumPowerLaplaceKernel`): a fractional power of a mean of
    per-feature Laplace kernels.

    Args:
        const_mix: c in [0, 1), the constant mixed in (a number or one per batch entry).
        power: the outer power.

    The call passes D (the inputs' last dimension) as the hyperparameter `features`.
    """

    __slots__ = ()

    def __init__(self, const_mix: HyperInput = 0.0, power: HyperInput = 2.0) -> None:
        super().__init__(const_mix=const_mix, power=power)

    @staticmethod
    def _define() -> Kernel:
        return program(
            lambda x, z, exponent, bandwidth: exp(-(abs(x - z) ** exponent) / bandwidth**exponent),
            epilogue=lambda acc, const_mix, features, power: ((1 - const_mix) * acc / features + const_mix) ** power,
        )

    def __call__(self, x: torch.Tensor, z: torch.Tensor, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
        """As [`Kernel`][kermac.dsl.Kernel], with `features` = `x.shape[-1]`."""
        return super().__call__(x, z, features=float(x.shape[-1]), **kwargs)

    def product(self, x: torch.Tensor, z: torch.Tensor, v: torch.Tensor, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
        """As [`Kernel.product`][kermac.dsl.Kernel.product], with `features` = `x.shape[-1]`."""
        return super().product(x, z, v, features=float(x.shape[-1]), **kwargs)

    def operator(self, x: torch.Tensor, z: torch.Tensor, **kwargs: object) -> object:  # type: ignore[override]
        """As [`Kernel.operator`][kermac.dsl.Kernel.operator], with `features` = `x.shape[-1]`."""
        return super().operator(x, z, features=float(x.shape[-1]), **kwargs)


class Mahalanobis(Kernel):
    """A kernel of `x − z` on features scaled by `scale` s: `kernel(x·s, z·s)`, so that Σ_k (x − z)² becomes
    (x − z)ᵀ diag(s²) (x − z), the Mahalanobis distance of a diagonal metric (an RFM's diagonal M is s²).

    Args:
        kernel: the kernel of the scaled inputs (default [`LaplaceL2`][kermac.zoo.LaplaceL2]); its
            hyperparameters are given in the call beside `scale`.

    The call takes `scale`, a tensor of `D` values (or `[..., D]` broadcasting against the inputs), and
    computes `x·s` and `z·s` first: two temporaries of the inputs' shapes, the only allocations beside the
    output.  The program is `kernel`'s, so a preset kernel keeps its fast path.
    """

    __slots__ = ()

    def __init__(self, kernel: Kernel | None = None) -> None:
        kernel = LaplaceL2() if kernel is None else kernel
        if not isinstance(kernel, Kernel):
            raise TypeError(f"kernel: expected a kermac.dsl.Kernel (e.g. a zoo kernel), got {type(kernel).__name__}")
        super().__init__(kernel.program, kernel.parameters, kernel.bound)

    @staticmethod
    def _scaled(x: torch.Tensor, z: torch.Tensor, scale: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"scale: expected a tensor of one value per feature, got {type(scale).__name__}")
        if scale.dtype != x.dtype or scale.device != x.device:
            raise ValueError(
                f"scale: expected a tensor of x's dtype and device ({x.dtype}, {x.device}), "
                f"got ({scale.dtype}, {scale.device})"
            )
        if scale.dim() == 0 or scale.shape[-1] not in (1, x.shape[-1]):
            raise ValueError(
                f"scale: expected shape [..., {x.shape[-1]}] (one value per feature of x), got {list(scale.shape)}"
            )
        return x * scale, z * scale

    def __call__(self, x: torch.Tensor, z: torch.Tensor, *, scale: torch.Tensor, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
        """The kernel matrix of `x·scale` and `z·scale` (the other arguments as
        [`Kernel`][kermac.dsl.Kernel])."""
        return super().__call__(*self._scaled(x, z, scale), **kwargs)

    def product(  # type: ignore[override]
        self, x: torch.Tensor, z: torch.Tensor, v: torch.Tensor, *, scale: torch.Tensor, **kwargs: object
    ) -> torch.Tensor:
        """`K @ v` for the kernel of `x·scale` and `z·scale` (as [`Kernel.product`][kermac.dsl.Kernel.product])."""
        return super().product(*self._scaled(x, z, scale), v, **kwargs)

    def operator(self, x: torch.Tensor, z: torch.Tensor, *, scale: torch.Tensor, **kwargs: object) -> object:  # type: ignore[override]
        """The operator of `x·scale` and `z·scale` (as [`Kernel.operator`][kermac.dsl.Kernel.operator])."""
        return super().operator(*self._scaled(x, z, scale), **kwargs)


# -- the gradient zoo -----------------------------------------------------------------------------


class _GradZoo(GradKernel):
    __slots__ = ()

    def __init__(self, traced: GradKernel, bound: Mapping[str, HyperInput] | None = None) -> None:
        super().__init__(traced.program, traced.parameters, bound)


class NormL1Grad(_GradZoo):
    """Σ_k c·a·sgn(d − b) (mm-kermac's gradient `NormL1`; `cdist_grad` with p = 1)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(gradient_program(lambda a, b, d: a * sign(d - b)))


class NormL2Grad(_GradZoo):
    """Σ_k c·a·(d − b) (mm-kermac's gradient `NormL2`; `cdist_grad` with p = 2)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(gradient_program(lambda a, b, d: a * (d - b)))


class NormLpGrad(_GradZoo):
    """Σ_k c·a·sgn(t)·max(|t|, ε)^p_power_grad, t = d − b, 0 where t = 0 (mm-kermac's gradient `NormLp`;
    `p_power_grad` = p − 1).

    Args:
        epsilon: ε ≥ 0, a number: the floor of |t| (ε = 0: none, and the program takes `cdist_grad`'s
            signed-power fast path).
    """

    __slots__ = ()

    def __init__(self, epsilon: float = 0.0) -> None:
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
            raise ValueError(f"epsilon: expected a number >= 0, got {epsilon!r}")
        if epsilon == 0:
            traced = gradient_program(
                lambda a, b, d, p_power_grad: a * where(d - b != 0, sign(d - b) * abs(d - b) ** p_power_grad, 0.0)
            )
            super().__init__(traced)
        else:
            traced = gradient_program(
                lambda a, b, d, p_power_grad, epsilon: (
                    a * where(d - b != 0, sign(d - b) * maximum(abs(d - b), epsilon) ** p_power_grad, 0.0)
                )
            )
            super().__init__(traced, {"epsilon": float(epsilon)})
