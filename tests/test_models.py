"""`kermac.models.KernelRidge`: fits against an independent float64 kernel ridge, numpy and torch in and out,
scikit-learn's parameter conventions (and, where scikit-learn is installed, `clone` and `GridSearchCV`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import kermac
from kermac.models import KernelRidge, NotFittedError, RecursiveFeatureMachine

F64 = torch.float64


def _data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    return x, np.sin(x[:, 0]) + 0.5 * np.cos(2 * x[:, 1])


def _reference_predict(x_train, y_train, x_test, bandwidth, lam):
    """Kernel ridge with the Laplace kernel written out in float64 numpy."""

    def k(a, b):
        return np.exp(-np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)) / bandwidth)

    alpha = np.linalg.solve(k(x_train, x_train) + lam * np.eye(len(x_train)), y_train)
    return k(x_test, x_train) @ alpha


def test_fits_a_smooth_function_numpy_in_numpy_out():
    x, y = _data(150)
    x_test, y_test = _data(40, seed=1)
    model = KernelRidge(bandwidth=1.5, regularization=1e-3, backend="torch").fit(x, y)
    pred = model.predict(x_test)
    assert isinstance(pred, np.ndarray) and pred.shape == (40,) and pred.dtype == np.float64
    np.testing.assert_allclose(pred, _reference_predict(x, y, x_test, 1.5, 1e-3), rtol=1e-7, atol=1e-8)
    assert model.score(x_test, y_test) > 0.95
    assert model.solution_.method == "cholesky" and bool(model.solution_.converged)
    assert model.alpha_.shape == (150,) and model.n_features_in_ == 2


def test_torch_in_torch_out_multi_output_and_cg():
    x, y = _data(60)
    xt = torch.from_numpy(x)
    yt = torch.from_numpy(np.stack([y, -2 * y], axis=1))
    model = KernelRidge(kernel="gaussian", bandwidth=0.8, regularization=1e-2, solver="cg", tol=1e-10)
    pred = model.fit(xt, yt).predict(xt[:7])
    assert isinstance(pred, torch.Tensor) and pred.shape == (7, 2) and pred.dtype == F64
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    k = np.exp(-d2 / (2 * 0.8**2))
    alpha = np.linalg.solve(k + 1e-2 * np.eye(60), yt.numpy())
    np.testing.assert_allclose(pred.numpy(), k[:7] @ alpha, rtol=1e-7, atol=1e-8)
    assert model.solution_.method == "cg" and model.solution_.preconditioner == "eigenpro"  # solve's "auto"
    assert model.score(xt, yt) == pytest.approx(
        1 - np.mean(((yt.numpy() - k @ alpha) ** 2).sum(0) / ((yt.numpy() - yt.numpy().mean(0)) ** 2).sum(0))
    )


def test_kernels_without_bandwidth_and_integer_inputs():
    x = np.arange(12).reshape(6, 2)  # integers become float64
    y = np.arange(6, dtype=np.float64)
    model = KernelRidge(kernel="dot_product", regularization=0.5).fit(x, y)
    xf = x.astype(np.float64)
    expected = xf @ xf.T @ np.linalg.solve(xf @ xf.T + 0.5 * np.eye(6), y)
    np.testing.assert_allclose(model.predict(x), expected, rtol=1e-9)


def test_a_batch_of_regularizations_fits_a_batch_of_models():
    x, y = _data(30)
    lams = torch.tensor([1e-3, 1e-1], dtype=F64)
    model = KernelRidge(regularization=lams, bandwidth=1.5).fit(x, y)
    pred = model.predict(x[:5])
    assert pred.shape == (2, 5) and model.alpha_.shape == (2, 30)
    for i, lam in enumerate(lams.tolist()):
        np.testing.assert_allclose(pred[i], _reference_predict(x, y, x[:5], 1.5, lam), rtol=1e-7, atol=1e-8)
    with pytest.raises(ValueError, match="score: needs one fitted model"):
        model.score(x, y)


def _reference_std(x_train, x_test, bandwidth, lam):
    """The Gaussian-process posterior standard deviation with the Laplace kernel, written out in float64 numpy."""

    def k(a, b):
        return np.exp(-np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)) / bandwidth)

    cross = k(x_train, x_test)
    solved = np.linalg.solve(k(x_train, x_train) + lam * np.eye(len(x_train)), cross)
    return np.sqrt(np.maximum(1 - (cross * solved).sum(0), 0))


def test_posterior_standard_deviation_matches_the_gaussian_process():
    x, y = _data(60)
    x_test, _ = _data(25, seed=1)
    model = KernelRidge(bandwidth=1.5, regularization=1e-2, solver="cholesky", backend="torch").fit(x, y)
    mean, std = model.predict(x_test, return_std=True)
    np.testing.assert_allclose(mean, model.predict(x_test), rtol=0, atol=0)
    assert isinstance(std, np.ndarray) and std.shape == (25,)
    np.testing.assert_allclose(std, _reference_std(x, x_test, 1.5, 1e-2), rtol=1e-7, atol=1e-9)
    at_data = model.predict(x[:5], return_std=True)[1]
    assert (at_data < 0.2).all() and (std >= 0).all()  # small at the data, never negative
    far = model.predict(x_test + 100.0, return_std=True)[1]
    np.testing.assert_allclose(far, 1.0, rtol=1e-12)  # the prior's k(x, x) = 1 far from every point


def test_posterior_standard_deviation_of_a_batch_blocks_and_empty_inputs(monkeypatch):
    """A batch of λ gives [L, m]; blocks of K(X_fit_, X) smaller than m change nothing; m = 0 gives [L, 0]; the
    same for every output column."""
    import kermac.models as models

    x, y = _data(40)
    x_test, _ = _data(9, seed=2)
    lams = torch.tensor([1e-2, 1.0], dtype=F64)
    model = KernelRidge(bandwidth=1.5, regularization=lams, solver="cholesky", backend="torch")
    model.fit(torch.as_tensor(x), torch.as_tensor(np.stack([y, -y], 1)))
    _, std = model.predict(torch.as_tensor(x_test), return_std=True)
    assert std.shape == (2, 9)
    for i, lam in enumerate((1e-2, 1.0)):
        np.testing.assert_allclose(std[i].numpy(), _reference_std(x, x_test, 1.5, lam), rtol=1e-7, atol=1e-9)
    monkeypatch.setattr(models, "_STD_BLOCK_ENTRIES", 40 * 2)  # two test points per block
    torch.testing.assert_close(model.predict(torch.as_tensor(x_test), return_std=True)[1], std)
    assert model.predict(torch.as_tensor(x_test[:0]), return_std=True)[1].shape == (2, 0)


def test_posterior_standard_deviation_needs_the_dense_fit():
    x, y = _data(30)
    model = KernelRidge(bandwidth=1.5, regularization=1e-1, solver="cg", backend="torch").fit(x, y)
    with pytest.raises(ValueError, match=r"return_std: .* fitted by 'cg'; fit with solver='cholesky'"):
        model.predict(x, return_std=True)


def test_get_params_set_params_and_reconstruction():
    model = KernelRidge(kernel="laplace_l1", bandwidth=2.0, regularization=0.1, tol=1e-8)
    params = model.get_params()
    assert params == {
        "kernel": "laplace_l1",
        "bandwidth": 2.0,
        "regularization": 0.1,
        "p": None,
        "solver": "auto",
        "tol": 1e-8,
        "backend": "auto",
    }
    assert model.get_params(deep=False) == params
    clone = type(model)(**params)  # what sklearn.base.clone does
    assert clone.get_params() == params and clone is not model
    assert model.set_params(bandwidth=3.0, solver="cg") is model
    assert model.bandwidth == 3.0 and model.solver == "cg"
    with pytest.raises(ValueError, match="invalid parameter 'alpha' for estimator KernelRidge"):
        model.set_params(alpha=1.0)
    assert repr(model) == "KernelRidge(kernel='laplace_l1', bandwidth=3.0, regularization=0.1, solver='cg', tol=1e-08)"
    assert repr(KernelRidge()) == "KernelRidge()"
    assert kermac.models.KernelRidge is KernelRidge and kermac.solvers.solve is not None


def test_refit_after_set_params_changes_the_model():
    x, y = _data(30)
    model = KernelRidge(regularization=1e-3).fit(x, y)
    tight = model.predict(x)
    loose = model.set_params(regularization=10.0).fit(x, y).predict(x)
    assert np.abs(tight - y).max() < np.abs(loose - y).max()


def test_bad_input():
    x, y = _data(10)
    with pytest.raises(NotFittedError, match="not fitted yet"):
        KernelRidge().predict(x)
    with pytest.raises(ValueError, match=r"X: expected a 2-d floating array .* Reshape your data"):
        KernelRidge().fit(x[:, 0], y)
    with pytest.raises(ValueError, match="X: expected finite"):
        KernelRidge().fit(np.where(np.arange(20).reshape(10, 2) == 3, np.nan, x), y)
    with pytest.raises(ValueError, match=r"y: expected shape \[10\] or \[10, C\]"):
        KernelRidge().fit(x, y[:9])
    with pytest.raises(ValueError, match="y: expected finite"):
        KernelRidge().fit(x, np.where(np.arange(10) == 2, np.inf, y))
    with pytest.raises(ValueError, match="kernel: expected a preset name"):
        KernelRidge(kernel="rbf").fit(x, y)
    with pytest.raises(ValueError, match="regularization: conjugate gradient needs λ > 0"):
        KernelRidge(regularization=0.0, solver="cg").fit(x, y)
    model = KernelRidge().fit(x, y)
    with pytest.raises(ValueError, match="X has 3 features, but KernelRidge is expecting 2 features as input"):
        model.predict(np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"y: expected shape \[10\]"):
        model.score(x, y[:, None].repeat(2, 1))


class _ArrayLike:
    """An object that is not an array but gives one (as pandas frames and scikit-learn's test doubles do)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __array__(self, dtype=None, copy=None):
        return self.values


@pytest.mark.parametrize(
    "estimator", [KernelRidge(), RecursiveFeatureMachine(iterations=1)], ids=lambda e: type(e).__name__
)
def test_scikit_learn_input_conventions(estimator):
    """The input rules scikit-learn's `check_estimator` holds estimators to, checked without scikit-learn."""
    x, y = _data(12)
    name = type(estimator).__name__
    with pytest.raises(NotFittedError, match=f"This {name} instance is not fitted yet"):
        estimator.predict(x)
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)
    with pytest.raises(ValueError, match=r"X: 0 sample\(s\) \(shape=\(0, 2\)\) while a minimum of 1 is required"):
        estimator.fit(np.ones((0, 2)), np.ones(0))
    with pytest.raises(ValueError, match=r"X: 0 feature\(s\) \(shape=\(12, 0\)\) while a minimum of 1 is required"):
        estimator.fit(np.ones((12, 0)), y)
    with pytest.raises(ValueError, match="requires y to be passed, but the target y is None"):
        estimator.fit(x, None)
    with pytest.raises(ValueError, match="X: Complex data not supported"):
        estimator.fit(x + 1j, y)
    with pytest.raises(TypeError, match="X: sparse input is not supported"):
        estimator.fit(torch.as_tensor(x).to_sparse(), y)
    with pytest.raises(TypeError, match="X: argument must be a string or a real number"):
        estimator.fit(np.array([[object()] * 2] * 12), y)
    from_objects = type(estimator)(**estimator.get_params()).fit(x.astype(object), y).predict(x)
    from_array_like = type(estimator)(**estimator.get_params()).fit(_ArrayLike(x), _ArrayLike(y)).predict(x)
    np.testing.assert_allclose(from_objects, estimator.fit(x, y).predict(x), rtol=1e-12)
    np.testing.assert_allclose(from_array_like, estimator.predict(x), rtol=1e-12)
    with pytest.raises(ValueError, match=f"X has 1 features, but {name} is expecting 2 features as input"):
        estimator.predict(x[:, :1])


def test_check_estimator_passes():
    estimator_checks = pytest.importorskip("sklearn.utils.estimator_checks")
    for estimator in (KernelRidge(backend="torch"), RecursiveFeatureMachine(iterations=1, backend="torch")):
        failed = [r for r in estimator_checks.check_estimator(estimator, on_fail=None) if r["status"] == "failed"]
        assert not failed, [(r["check_name"], repr(r["exception"])) for r in failed]


def test_non_convergence_warns(monkeypatch):
    import kermac.models as models

    solve = models.solve
    monkeypatch.setattr(models, "solve", lambda *a, **k: solve(*a, **k, max_iter=2, preconditioner=None))
    x, y = _data(40)
    model = KernelRidge(regularization=1e-6, solver="cg", tol=1e-12, bandwidth=5.0)
    with pytest.warns(RuntimeWarning, match="did not reach tol=1e-12"):
        model.fit(x, y)
    assert not bool(model.solution_.converged) and int(model.solution_.iterations) == 2


def test_sklearn_clone_and_grid_search():
    base = pytest.importorskip("sklearn.base")
    model_selection = pytest.importorskip("sklearn.model_selection")
    model = KernelRidge(bandwidth=2.0, regularization=0.1)
    clone = base.clone(model)
    assert clone is not model and clone.get_params() == model.get_params()
    x, y = _data(60)
    search = model_selection.GridSearchCV(
        KernelRidge(), {"bandwidth": [0.5, 2.0], "regularization": [1e-3, 1.0]}, cv=3
    ).fit(x, y)
    assert search.best_params_["regularization"] == 1e-3 and math.isfinite(search.best_score_)
