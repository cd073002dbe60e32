r"""Estimators with scikit-learn's conventions, built on kermac's operators and solvers (scikit-learn is not
needed; when it is installed, `clone`, pipelines and `GridSearchCV` accept them).

[`KernelRidge`][kermac.models.KernelRidge]: kernel ridge regression. `fit(X, y)` solves
`(K(X, X) + λI) α = y` with [`kermac.solvers.solve`][kermac.solvers.solve]; `predict(X')` is the fused product
`K(X', X) α` ([`kermac.kernel_product`][kermac.api.kernel_product]), never the kernel matrix.

[`RecursiveFeatureMachine`][kermac.models.RecursiveFeatureMachine]: kernel ridge on features `X L` whose
metric `M = L Lᵀ` is learned by average gradient outer products
([`kermac.predictor_gradient`][kermac.predictor.predictor_gradient]), never holding a kernel matrix or the whole
Jacobian.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

import torch

from kermac.api import kernel_product
from kermac.descriptor import KernelDescriptor
from kermac.operator import KernelOperator
from kermac.predictor import predictor_gradient
from kermac.presets import ALL as PRESETS
from kermac.solvers import DENSE_BUDGET_CPU_BYTES, Solution, solve

__all__ = ["KernelRidge", "NotFittedError", "RecursiveFeatureMachine", "Regressor"]

ArrayLike = Any
"""A torch tensor, a numpy array or anything else `torch.as_tensor` reads (numpy is not a dependency of kermac)."""

_STD_BLOCK_ENTRIES = 1 << 24  # bound on the block of K(X_fit_, X) evaluated per step of predict(return_std=True)


class Regressor:
    """scikit-learn's estimator protocol for kermac's regressors, without importing scikit-learn: parameters are
    the keywords of `__init__`, stored as given (checked by `fit`), read back by `get_params` and changed by
    `set_params`, so that scikit-learn's `clone` and model selection work."""

    _estimator_type = "regressor"  # scikit-learn before 1.6 reads this instead of __sklearn_tags__

    @classmethod
    def _param_names(cls) -> list[str]:
        return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Every `__init__` parameter by name (scikit-learn's `BaseEstimator.get_params`; with `deep`, the
        parameters of a parameter that is itself an estimator are added as `name__param`)."""
        params: dict[str, Any] = {}
        for name in self._param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                params.update((f"{name}__{k}", v) for k, v in value.get_params().items())
            params[name] = value
        return params

    def set_params(self, **params: Any) -> Regressor:
        """Set `__init__` parameters by name; returns the estimator. Unknown names raise ValueError."""
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(
                    f"set_params: invalid parameter {name!r} for estimator {type(self).__name__}; valid parameters "
                    f"are {valid}"
                )
            setattr(self, name, value)
        return self

    def __sklearn_tags__(self) -> Any:
        """scikit-learn ≥ 1.6's estimator tags (only scikit-learn calls this, so it imports scikit-learn)."""
        from sklearn.utils import RegressorTags, Tags, TargetTags

        return Tags(
            estimator_type="regressor",
            target_tags=TargetTags(required=True, multi_output=True),
            regressor_tags=RegressorTags(),
        )

    def __repr__(self) -> str:
        defaults = {k: p.default for k, p in inspect.signature(type(self).__init__).parameters.items() if k != "self"}
        changed = [
            f"{name}={value!r}" for name, value in self.get_params(deep=False).items() if value is not defaults[name]
        ]
        return f"{type(self).__name__}({', '.join(changed)})"


class KernelRidge(Regressor):
    r"""Kernel ridge regression: `f(x) = Σ_i α_i k(x, x_i)` with `(K + λI) α = y`, `K_ij = k(x_i, x_j)`.

    Parameters are stored as given and checked by `fit` (scikit-learn's convention, so that `clone` and
    `set_params` work); every one of them is a keyword of `__init__`, read back by
    [`get_params`][kermac.models.KernelRidge.get_params].

    Args:
        kernel: a preset name (`kermac.presets.ALL`) or a [`KernelDescriptor`][kermac.descriptor.KernelDescriptor].
        bandwidth: σ of the kernel (ignored by kernels without a bandwidth, such as `"dot_product"`).
        regularization: λ > 0 (scikit-learn's `KernelRidge(alpha=...)`); a 1-d tensor fits a batch of models.
        p: the p of `*_lp` kernels, None otherwise.
        solver: `method` of [`solve`][kermac.solvers.solve] (`"auto"`, `"cholesky"`, `"cg"`).
        tol: relative residual `solve` must reach; a fit that does not reach it warns (`RuntimeWarning`).
        backend: the kermac backend of every kernel pass.

    Attributes (after `fit`):
        X_fit_: the training inputs `[n, d]` as a tensor (kept: `predict` reads them).
        alpha_: the coefficients `[n]` or `[n, C]` (with a batch of λ: `[L, n]` / `[L, n, C]`).
        solution_: the [`Solution`][kermac.solvers.Solution] of the fit (method, iterations, residuals).
        n_features_in_: d.
    """

    def __init__(
        self,
        kernel: str | KernelDescriptor = "laplace_l2",
        bandwidth: float = 1.0,
        regularization: float | torch.Tensor = 1e-3,
        p: float | None = None,
        solver: str = "auto",
        tol: float = 1e-6,
        backend: str = "auto",
    ) -> None:
        self.kernel = kernel
        self.bandwidth = bandwidth
        self.regularization = regularization
        self.p = p
        self.solver = solver
        self.tol = tol
        self.backend = backend

    def _kernel_arguments(self) -> dict[str, Any]:
        """The kernel and the hyperparameters its descriptor reads (bandwidth only where it has one)."""
        descriptor = PRESETS.get(self.kernel) if isinstance(self.kernel, str) else self.kernel
        if not isinstance(descriptor, KernelDescriptor):
            raise ValueError(
                f"kernel: expected a preset name ({sorted(PRESETS)}) or a KernelDescriptor, got {self.kernel!r}"
            )
        arguments: dict[str, Any] = {"kernel": descriptor}
        if descriptor.needs_bandwidth:
            arguments["bandwidth"] = self.bandwidth
        if descriptor.needs_p or self.p is not None:
            arguments["p"] = self.p
        return arguments

    def fit(self, X: ArrayLike, y: ArrayLike) -> KernelRidge:
        """Fit on `X [n, d]` and `y [n]` or `[n, C]` (numpy arrays or tensors; numpy runs on the CPU, a tensor
        `X` on its device, `y` converted to `X`'s dtype and device). Returns the estimator."""
        x = _as_matrix("X", X)
        _check_training_data(x, y)
        target = _as_tensor("y", y, like=x)
        if target.dim() not in (1, 2) or target.shape[0] != x.shape[0]:
            raise ValueError(
                f"y: expected shape [{x.shape[0]}] or [{x.shape[0]}, C] (X has n = {x.shape[0]} rows), "
                f"got {list(target.shape)}"
            )
        arguments = self._kernel_arguments()
        kernel = arguments.pop("kernel")
        K = KernelOperator(kernel, x, x, regularization=self.regularization, backend=self.backend, **arguments)
        solution: Solution = solve(K, target, method=self.solver, tol=self.tol)
        if not bool(solution.converged.all()):
            warnings.warn(
                f"KernelRidge.fit: the solve did not reach tol={self.tol} (method {solution.method!r}, largest "
                f"relative residual {float(solution.residual.max())}); see solution_",
                RuntimeWarning,
                stacklevel=2,
            )
        self.X_fit_, self.alpha_, self.solution_, self.n_features_in_ = x, solution.alpha, solution, x.shape[1]
        self._vector_target = target.dim() == 1
        self._posterior_factor: torch.Tensor | None = None  # Cholesky factor of K + λI, made by return_std
        return self

    def predict(self, X: ArrayLike, return_std: bool = False) -> ArrayLike | tuple[ArrayLike, ArrayLike]:
        r"""`K(X, X_fit_) α` for `X [m, d]`: `[m]` or `[m, C]` like `y`, a numpy array for a numpy `X`, else a
        tensor on `X_fit_`'s device.

        With `return_std=True`, also the posterior standard deviation of the Gaussian process whose posterior
        mean this is (covariance `k`, noise variance λ):
        `σ(x) = (k(x, x) − k_xᵀ (K + λI)⁻¹ k_x)^{1/2}`, `k_x = K(X_fit_, x)`, as `[m]` (`[L, m]` for a batch of
        λ; the same for every output column). It needs the Cholesky factor of `K + λI`, so only a model fitted
        by the dense route (`solution_.method == "cholesky"`) provides it; the factor is computed at the first
        such call and kept (`n²` entries), then each call costs `n²·m` for the triangular solves and `n·m`
        kernel entries, in blocks of at most 2²⁴ entries of `K(X_fit_, X)`.

        Raises:
            ValueError: `return_std` on a model fitted by conjugate gradients.
        """
        _check_fitted(self, "alpha_")
        x = _as_matrix("X", X, like=self.X_fit_)
        _check_features(self, x)
        arguments = self._kernel_arguments()
        kernel = arguments.pop("kernel")
        alpha = self.alpha_[..., None] if self._vector_target else self.alpha_
        out = kernel_product(kernel, x, self.X_fit_, alpha, backend=self.backend, **arguments)
        out = out[..., 0] if self._vector_target else out
        if not return_std:
            return out.cpu().numpy() if _is_numpy(X) else out
        std = self._posterior_std(x, kernel, arguments)
        if _is_numpy(X):
            return out.cpu().numpy(), std.cpu().numpy()
        return out, std

    def _posterior_std(self, x: torch.Tensor, kernel: KernelDescriptor, arguments: dict[str, Any]) -> torch.Tensor:
        """`σ(x)` of `predict(..., return_std=True)` for `x [m, d]`: `[m]` or `[L, m]`."""
        if self.solution_.method != "cholesky":
            raise ValueError(
                "return_std: the posterior standard deviation needs the Cholesky factor of K + λI, and this model "
                f"was fitted by {self.solution_.method!r}; fit with solver='cholesky' (while K fits in memory)"
            )
        fitted = self.X_fit_
        if self._posterior_factor is None:
            K = KernelOperator(
                kernel, fitted, fitted, regularization=self.regularization, backend=self.backend, **arguments
            )
            self._posterior_factor = torch.linalg.cholesky_ex(K.to_dense())[0]  # fit already factored it once
        prior = KernelOperator(kernel, x, x, backend=self.backend, **arguments).diagonal()
        block = max(1, _STD_BLOCK_ENTRIES // max(fitted.shape[0], 1))
        variances = [prior[:0].expand(self._posterior_factor.shape[:-2] + (0,))]
        for j in range(0, x.shape[0], block):
            cross = KernelOperator(kernel, fitted, x[j : j + block], backend=self.backend, **arguments).to_dense()
            v = torch.linalg.solve_triangular(self._posterior_factor, cross, upper=False)
            variances.append(prior[j : j + block] - (v * v).sum(-2))
        return torch.cat(variances, -1).clamp_min(0).sqrt()

    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: Any = None) -> float:
        """R² of `predict(X)` against `y` (scikit-learn's `r2_score`, outputs averaged uniformly; one host read)."""
        pred = torch.as_tensor(self.predict(X), device=self.X_fit_.device)
        if pred.dim() != 2 - self._vector_target:
            raise ValueError(
                f"score: needs one fitted model (a number as regularization), got a batch of {pred.shape[0]} models"
            )
        target = _as_tensor("y", y, like=pred)
        if target.shape != pred.shape:
            raise ValueError(f"y: expected shape {list(pred.shape)} (that of predict(X)), got {list(target.shape)}")
        w = torch.ones(pred.shape[0], dtype=pred.dtype, device=pred.device)
        if sample_weight is not None:
            w = _as_tensor("sample_weight", sample_weight, like=pred).expand(pred.shape[:1])
        w = w.reshape((-1,) + (1,) * (pred.dim() - 1))
        mean = (w * target).sum(0) / w.sum()
        residual = (w * (target - pred) ** 2).sum(0)
        total = (w * (target - mean) ** 2).sum(0)
        r2 = torch.where(total > 0, 1 - residual / torch.where(total > 0, total, 1), (residual == 0).to(pred.dtype))
        return float(r2.mean())


class NotFittedError(ValueError, AttributeError):
    """`predict` or `score` before `fit`. Where scikit-learn is installed the error raised is also an instance of
    `sklearn.exceptions.NotFittedError` (the class scikit-learn's tools catch)."""


@functools.cache
def _not_fitted_class() -> type[NotFittedError]:
    try:
        from sklearn.exceptions import NotFittedError as SklearnNotFittedError
    except ImportError:
        return NotFittedError
    return type("NotFittedError", (NotFittedError, SklearnNotFittedError), {"__module__": __name__})


def _check_fitted(estimator: Regressor, attribute: str) -> None:
    if not hasattr(estimator, attribute):
        raise _not_fitted_class()(
            f"This {type(estimator).__name__} instance is not fitted yet: call fit(X, y) before predict or score"
        )


def _check_features(estimator: Regressor, x: torch.Tensor) -> None:
    if x.shape[1] != estimator.n_features_in_:
        raise ValueError(
            f"X has {x.shape[1]} features, but {type(estimator).__name__} is expecting {estimator.n_features_in_} "
            "features as input (as in fit)"
        )


def _check_training_data(x: torch.Tensor, y: object) -> None:
    """scikit-learn's rules for training data: at least one sample and one feature, and a y."""
    if x.shape[0] == 0 or x.shape[1] == 0:
        what = "sample" if x.shape[0] == 0 else "feature"
        raise ValueError(f"X: 0 {what}(s) (shape=({x.shape[0]}, {x.shape[1]})) while a minimum of 1 is required.")
    if y is None:
        raise ValueError("y: this estimator requires y to be passed, but the target y is None")


def _is_numpy(value: object) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def _plain(name: str, value: object) -> object:
    """`value` in a form `torch.as_tensor` reads: refuses sparse and complex data with a sentence; an object with
    `__array__` (array-likes that are not arrays) becomes its array; a numpy object array becomes float64."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise TypeError(
                f"{name}: sparse input is not supported; pass a dense tensor (to_dense()), got {value.layout}"
            )
        kind = "complex" if value.is_complex() else None
    else:
        if type(value).__module__.startswith("scipy.sparse"):
            raise TypeError(
                f"{name}: sparse input is not supported; pass a dense array (toarray()), got {type(value).__name__}"
            )
        if not _is_numpy(value) and hasattr(value, "__array__"):
            value = value.__array__()
        kind = getattr(getattr(value, "dtype", None), "kind", None)
        if kind == "O":
            try:
                value = value.astype("float64")
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"{name}: argument must be a string or a real number in every entry of an object array ({exc})"
                ) from exc
        kind = "complex" if kind == "c" else None
    if kind == "complex":
        raise ValueError(f"{name}: Complex data not supported, got {getattr(value, 'dtype', None)}")
    return value


def _as_tensor(name: str, value: object, *, like: torch.Tensor | None) -> torch.Tensor:
    """`value` as a tensor: in `like`'s dtype and on its device, else as given (other data on the CPU)."""
    value = _plain(name, value)
    placement = {} if like is None else {"dtype": like.dtype, "device": like.device}
    try:
        return torch.as_tensor(value, **placement)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name}: expected a numpy array or a torch.Tensor, got {type(value).__name__}") from exc


def _as_matrix(name: str, value: object, *, like: torch.Tensor | None = None) -> torch.Tensor:
    """`value` as a finite `[n, d]` floating tensor (`like`'s dtype and device; else a tensor as given and other
    data on the CPU, float64 unless it is float32)."""
    x = _as_tensor(name, value, like=like)
    if like is None and not isinstance(value, torch.Tensor) and x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float64)
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(
            f"{name}: expected a 2-d floating array [n, d], got shape {list(x.shape)} of {x.dtype}. Reshape your "
            "data: X.reshape(-1, 1) if it has a single feature, X.reshape(1, -1) if it is a single sample"
        )
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: expected finite values, got a NaN or an infinity")
    return x


class RecursiveFeatureMachine(Regressor):
    r"""Recursive Feature Machine: kernel ridge on learned features, `f(x) = Σ_i α_i k(x L, x_i L)` with
    `M = L Lᵀ` the average gradient outer product (AGOP) of the previous predictor.

    `fit(X, y)` starts from `M = I` (`[D, D]`) and repeats `iterations` times:

    1. `L = M^{1/2}`, the symmetric positive semi-definite square root: `M = V diag(w) Vᵀ` by `torch.linalg.eigh`
       and `L = V diag(√max(w, 0)) Vᵀ`; an AGOP is positive semi-definite, so negative eigenvalues are rounding
       error and are clamped to 0 (the features lose those directions instead of becoming complex);
    2. fit a [`KernelRidge`][kermac.models.KernelRidge] on `X L` (`y [n]` or `[n, C]`);
    3. `M ← G = (1/n) Σ_m J_mᵀ J_m` with `J_m = ∂f/∂x (x_m) = J'_m Lᵀ` (`[C, D]`), where
       `J' = predictor_gradient(kernel, X L, X L, α)` is the gradient with respect to the features (so with the
       Euclidean kernels the predictor uses the Mahalanobis distance `‖x − z‖_M`). `J` is computed in blocks of
       `batch_rows` rows, each added into `G` and dropped, so it is never held whole.

    After the last update the final ridge `ridge_` is fitted on `X L`; `predict(X)` is that ridge on `X L`.

    The default `batch_rows` gives each block a quarter of the free memory of the CUDA device
    (`torch.cuda.mem_get_info`, read once per fit) or of
    [`DENSE_BUDGET_CPU_BYTES`][kermac.solvers.DENSE_BUDGET_CPU_BYTES] on the CPU, counting `4·C·(D + 1)` elements
    per row (the gradient product's `C + C·D` columns, `J'`, `J` and slack).

    Args:
        kernel: a preset name or a [`KernelDescriptor`][kermac.descriptor.KernelDescriptor] that takes no `p`.
        bandwidth: σ of the kernel.
        regularization: λ > 0 of every ridge (one number).
        iterations: AGOP updates of `M` (≥ 0; 0 is a plain kernel ridge).
        solver: `method` of [`solve`][kermac.solvers.solve].
        tol: relative residual of every solve (an unconverged one warns, as in `KernelRidge`).
        backend: the kermac backend of every kernel pass.
        batch_rows: rows of `J` per block (None: the rule above).

    Attributes (after `fit`):
        M_: the learned feature matrix `[D, D]` (the AGOP of the last update; `I` when `iterations = 0`).
        sqrt_M_: its square root `L` `[D, D]`, the features being `X L`.
        ridge_: the final `KernelRidge`, fitted on `X L`.
        history_: training R² of each ridge fitted (`iterations + 1` floats, the last one `ridge_`'s; one host
            read per ridge).
        n_features_in_: D.

    The host is consulted once per iteration beyond the solves: `torch.linalg.eigh` checks its result and the
    training R² is read. `fit` refuses `X` without rows when `iterations > 0` (the AGOP is an average over them).
    """

    def __init__(
        self,
        kernel: str | KernelDescriptor = "laplace_l2",
        bandwidth: float = 10.0,
        regularization: float = 1e-3,
        iterations: int = 5,
        solver: str = "auto",
        tol: float = 1e-6,
        backend: str = "auto",
        batch_rows: int | None = None,
    ) -> None:
        self.kernel = kernel
        self.bandwidth = bandwidth
        self.regularization = regularization
        self.iterations = iterations
        self.solver = solver
        self.tol = tol
        self.backend = backend
        self.batch_rows = batch_rows

    def _ridge(self) -> KernelRidge:
        return KernelRidge(
            kernel=self.kernel,
            bandwidth=self.bandwidth,
            regularization=self.regularization,
            solver=self.solver,
            tol=self.tol,
            backend=self.backend,
        )

    def _check_params(self) -> None:
        descriptor = self._ridge()._kernel_arguments()["kernel"]
        if descriptor.needs_p:
            raise ValueError(
                f"kernel: RecursiveFeatureMachine needs a kernel without p (it has no p parameter), got "
                f"{self.kernel!r}, which needs p"
            )
        if isinstance(self.regularization, torch.Tensor) and self.regularization.dim() > 0:
            raise ValueError(
                f"regularization: expected one number (one model), got a tensor of shape "
                f"{list(self.regularization.shape)}"
            )
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or self.iterations < 0:
            raise ValueError(f"iterations: expected an int ≥ 0, got {self.iterations!r}")
        rows = self.batch_rows
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            raise ValueError(f"batch_rows: expected None or an int ≥ 1, got {rows!r}")

    def fit(self, X: ArrayLike, y: ArrayLike) -> RecursiveFeatureMachine:
        """Fit on `X [n, D]` and `y [n]` or `[n, C]` (numpy arrays or tensors, as `KernelRidge.fit`). Returns the
        estimator."""
        self._check_params()
        x = _as_matrix("X", X)
        _check_training_data(x, y)
        target = _as_tensor("y", y, like=x)
        if target.dim() not in (1, 2) or target.shape[0] != x.shape[0]:
            raise ValueError(
                f"y: expected shape [{x.shape[0]}] or [{x.shape[0]}, C] (X has n = {x.shape[0]} rows), "
                f"got {list(target.shape)}"
            )
        M = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
        outputs = 1 if target.dim() == 1 else target.shape[1]
        rows = self.batch_rows or (_agop_rows(outputs, x.shape[1], x.dtype, x.device) if self.iterations else 1)
        history: list[float] = []
        for _ in range(self.iterations):
            L = _psd_sqrt(M)
            ridge = self._ridge().fit(x @ L, target)
            history.append(ridge.score(ridge.X_fit_, target))
            M = self._agop(ridge, L, rows)
        L = _psd_sqrt(M)
        self.ridge_ = self._ridge().fit(x @ L, target)
        history.append(self.ridge_.score(self.ridge_.X_fit_, target))
        self.M_, self.sqrt_M_, self.history_, self.n_features_in_ = M, L, history, x.shape[1]
        return self

    def _agop(self, ridge: KernelRidge, L: torch.Tensor, rows: int) -> torch.Tensor:
        """`(1/n) Σ_m J_mᵀ J_m` of `ridge`'s predictor as a function of `x` (features `x L`), `rows` rows a block."""
        features, alpha = ridge.X_fit_, ridge.alpha_
        n, d = features.shape
        arguments = ridge._kernel_arguments()
        kernel = arguments.pop("kernel")
        G = torch.zeros(d, d, dtype=features.dtype, device=features.device)
        for start in range(0, n, rows):
            block = predictor_gradient(
                kernel, features[start : start + rows], features, alpha, backend=self.backend, **arguments
            )
            J = block.flatten(0, -2) @ L.T  # the rows of every J_m, [rows·C, D]
            G.addmm_(J.T, J)
        return G.div_(n)

    def _features(self, X: ArrayLike) -> torch.Tensor:
        _check_fitted(self, "ridge_")
        x = _as_matrix("X", X, like=self.sqrt_M_)
        _check_features(self, x)
        return x @ self.sqrt_M_

    def predict(self, X: ArrayLike) -> ArrayLike:
        """The final ridge at `X L` for `X [m, D]`: `[m]` or `[m, C]` like `y`, a numpy array for a numpy `X`, else
        a tensor on the training device."""
        features = self._features(X)
        out = self.ridge_.predict(features)
        return out.cpu().numpy() if _is_numpy(X) else out

    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: Any = None) -> float:
        """R² of `predict(X)` against `y`, as [`KernelRidge.score`][kermac.models.KernelRidge.score]."""
        features = self._features(X)
        return self.ridge_.score(features, y, sample_weight)


def _psd_sqrt(M: torch.Tensor) -> torch.Tensor:
    """The symmetric square root of a positive semi-definite `M [D, D]`, negative eigenvalues clamped to 0."""
    w, V = torch.linalg.eigh(M)
    return (V * w.clamp(min=0).sqrt()) @ V.T


def _agop_rows(outputs: int, d: int, dtype: torch.dtype, device: torch.device) -> int:
    """Rows per AGOP block: a quarter of the free CUDA memory or of `DENSE_BUDGET_CPU_BYTES`, `4·C·(D + 1)`
    elements a row."""
    budget = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else DENSE_BUDGET_CPU_BYTES
    per_row = 4 * outputs * (d + 1) * torch.empty((), dtype=dtype).element_size()
    return max(1, budget // (4 * per_row))
