"""`kermac.models.RecursiveFeatureMachine`: the learned feature matrix against an RFM written out in float64 numpy
(dense kernel, `np.linalg.solve`, the analytic gradient), recovery of a planted direction, the AGOP in row blocks,
scikit-learn's parameter conventions, bad input, the example script, and a GPU run at N = 20,000."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kermac.models import KernelRidge, NotFittedError, RecursiveFeatureMachine

ROOT = Path(__file__).resolve().parents[1]


def _planted(n: int, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x ~ N(0, I_d), y = sin(3⟨x, u⟩) + 0.01·noise for a fixed unit vector u (the same for every seed)."""
    u = np.random.default_rng(1234).standard_normal(d)
    u /= np.linalg.norm(u)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    return x, np.sin(3 * x @ u) + 0.01 * rng.standard_normal(n), u


def _reference_rfm(x, y, bandwidth, lam, iterations):
    """RFM with the Laplace-L2 kernel exp(−‖xL − zL‖/σ), written out in float64 numpy: returns M, L and α."""
    n, d = x.shape
    M = np.eye(d)
    for step in range(iterations + 1):
        w, V = np.linalg.eigh(M)
        L = V @ np.diag(np.sqrt(np.clip(w, 0, None))) @ V.T
        f = x @ L
        diff = f[:, None, :] - f[None, :, :]
        dist = np.sqrt((diff**2).sum(-1))
        k = np.exp(-dist / bandwidth)
        alpha = np.linalg.solve(k + lam * np.eye(n), y)
        if step == iterations:
            return M, L, alpha
        a = alpha.reshape(n, -1)
        # ∂k(f_m, f_n)/∂f_m = −k/σ · (f_m − f_n)/‖f_m − f_n‖, 0 where f_m = f_n
        scale = np.where(dist > 0, -k / (bandwidth * np.where(dist > 0, dist, 1)), 0.0)
        J_features = np.einsum("mn,mnj,nc->mcj", scale, diff, a)
        J = J_features @ L.T
        M = np.einsum("mcd,mce->de", J, J) / n


def test_feature_matrix_and_predictions_match_a_float64_reference():
    x, y, _ = _planted(60, d=5)
    y2 = np.stack([y, np.cos(x[:, 0])], axis=1)
    x_test, _, _ = _planted(9, d=5, seed=1)
    for target in (y, y2):
        model = RecursiveFeatureMachine(bandwidth=3.0, regularization=1e-2, iterations=2, backend="torch")
        model.fit(x, target)
        M, L, alpha = _reference_rfm(x, target, 3.0, 1e-2, 2)
        np.testing.assert_allclose(model.M_.numpy(), M, rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(model.sqrt_M_.numpy(), L, rtol=1e-7, atol=1e-10)
        f, ft = x @ L, x_test @ L
        k_test = np.exp(-np.sqrt(((ft[:, None, :] - f[None, :, :]) ** 2).sum(-1)) / 3.0)
        np.testing.assert_allclose(model.predict(x_test), k_test @ alpha, rtol=1e-7, atol=1e-9)
        assert len(model.history_) == 3 and all(0.9 < r <= 1 for r in model.history_)


def test_recovers_a_planted_direction_and_beats_kernel_ridge():
    x, y, u = _planted(400)
    x_test, y_test, _ = _planted(200, seed=1)
    model = RecursiveFeatureMachine(iterations=3, backend="torch").fit(x, y)
    top = np.linalg.eigh(model.M_.numpy())[1][:, -1]
    assert abs(top @ u) > 0.9
    ridge = KernelRidge(bandwidth=10.0, regularization=1e-3, backend="torch").fit(x, y)
    rfm_r2, ridge_r2 = model.score(x_test, y_test), ridge.score(x_test, y_test)
    assert rfm_r2 > 0.9 and rfm_r2 > ridge_r2 + 0.3


def test_agop_in_row_blocks_equals_one_block():
    x, y, _ = _planted(50, d=6)
    y2 = np.stack([y, x[:, 1] ** 2], axis=1)
    whole = RecursiveFeatureMachine(iterations=2, bandwidth=4.0, backend="torch").fit(x, y2)
    blocks = RecursiveFeatureMachine(iterations=2, bandwidth=4.0, backend="torch", batch_rows=7).fit(x, y2)
    torch.testing.assert_close(blocks.M_, whole.M_, rtol=1e-10, atol=1e-14)
    assert blocks.predict(x).shape == (50, 2)


def test_agop_blocks_follow_batch_rows(monkeypatch):
    import kermac.models as models

    seen: list[int] = []
    gradient = models.predictor_gradient

    def spy(kernel, x, *args, **kwargs):
        seen.append(x.shape[0])
        return gradient(kernel, x, *args, **kwargs)

    monkeypatch.setattr(models, "predictor_gradient", spy)
    x, y, _ = _planted(30, d=3)
    RecursiveFeatureMachine(iterations=1, backend="torch", batch_rows=7).fit(x, y)
    assert seen == [7, 7, 7, 7, 2]
    seen.clear()
    RecursiveFeatureMachine(iterations=1, backend="torch").fit(x, y)
    assert seen == [30]  # the CPU budget holds 30 rows in one block
    assert models._agop_rows(1, 3, torch.float64, torch.device("cpu")) == models.DENSE_BUDGET_CPU_BYTES // (
        4 * 4 * 4 * 8
    )
    rules: list[tuple] = []
    rule = models._agop_rows
    monkeypatch.setattr(models, "_agop_rows", lambda *args: rules.append(args) or rule(*args))
    RecursiveFeatureMachine(iterations=3, backend="torch").fit(x, np.stack([y, y], 1))
    assert rules == [(2, 3, torch.float64, torch.device("cpu"))]  # the memory is read once per fit


def test_zero_iterations_is_kernel_ridge():
    x, y, _ = _planted(40, d=3)
    model = RecursiveFeatureMachine(iterations=0, bandwidth=2.0, regularization=1e-2, backend="torch").fit(x, y)
    ridge = KernelRidge(bandwidth=2.0, regularization=1e-2, backend="torch").fit(x, y)
    torch.testing.assert_close(model.M_, torch.eye(3, dtype=torch.float64))
    np.testing.assert_allclose(model.predict(x[:5]), ridge.predict(x[:5]), rtol=1e-12)
    assert isinstance(model.ridge_, KernelRidge) and len(model.history_) == 1


def test_small_sizes():
    x, y, _ = _planted(5, d=1)
    model = RecursiveFeatureMachine(iterations=2, bandwidth=2.0, backend="torch").fit(x, y)
    M, L, alpha = _reference_rfm(x, y, 2.0, 1e-3, 2)
    np.testing.assert_allclose(model.M_.numpy(), M, rtol=1e-8)
    f = x @ L
    np.testing.assert_allclose(model.predict(x), np.exp(-np.abs(f - f.T) / 2.0) @ alpha, rtol=1e-7, atol=1e-9)
    # one point: the predictor's gradient at its only centre is 0 (torch.cdist's subgradient), so M = 0
    one = RecursiveFeatureMachine(iterations=1, backend="torch").fit(x[:1], y[:1])
    assert not one.M_.any() and one.predict(x[:2]).shape == (2,)
    with pytest.raises(ValueError, match=r"X: 0 feature\(s\) \(shape=\(4, 0\)\) while a minimum of 1 is required"):
        RecursiveFeatureMachine(iterations=1, backend="torch").fit(np.ones((4, 0)), y[:4])
    with pytest.raises(ValueError, match=r"X: 0 sample\(s\) \(shape=\(0, 3\)\) while a minimum of 1 is required"):
        RecursiveFeatureMachine().fit(np.ones((0, 3)), np.ones(0))


def test_numpy_in_numpy_out_torch_in_torch_out():
    x, y, _ = _planted(40, d=4)
    model = RecursiveFeatureMachine(iterations=1, backend="torch").fit(x, y)
    pred = model.predict(x[:6])
    assert isinstance(pred, np.ndarray) and pred.shape == (6,) and pred.dtype == np.float64
    assert model.n_features_in_ == 4 and model.M_.shape == (4, 4)
    xt, yt = torch.from_numpy(x).float(), torch.from_numpy(y).float()
    model32 = RecursiveFeatureMachine(iterations=1, backend="torch").fit(xt, yt)
    out = model32.predict(xt[:6])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (6,)
    np.testing.assert_allclose(out.numpy(), pred, rtol=1e-3, atol=1e-4)
    assert isinstance(model32.score(xt, yt), float)


def test_get_params_set_params_and_reconstruction():
    model = RecursiveFeatureMachine(bandwidth=5.0, iterations=2, batch_rows=64)
    params = model.get_params()
    assert params == {
        "kernel": "laplace_l2",
        "bandwidth": 5.0,
        "regularization": 1e-3,
        "iterations": 2,
        "solver": "auto",
        "tol": 1e-6,
        "backend": "auto",
        "batch_rows": 64,
    }
    clone = type(model)(**params)  # what sklearn.base.clone does
    assert clone.get_params() == params and clone is not model
    assert model.set_params(kernel="gaussian", iterations=1) is model
    assert model.kernel == "gaussian" and model.iterations == 1
    with pytest.raises(ValueError, match="invalid parameter 'p' for estimator RecursiveFeatureMachine"):
        model.set_params(p=1.0)
    assert repr(model) == ("RecursiveFeatureMachine(kernel='gaussian', bandwidth=5.0, iterations=1, batch_rows=64)")
    assert repr(RecursiveFeatureMachine()) == "RecursiveFeatureMachine()"


def test_sklearn_clone_and_cross_validation():
    base = pytest.importorskip("sklearn.base")
    model_selection = pytest.importorskip("sklearn.model_selection")
    model = RecursiveFeatureMachine(iterations=1, backend="torch")
    assert base.clone(model).get_params() == model.get_params()
    x, y, _ = _planted(60, d=3)
    scores = model_selection.cross_val_score(model, x, y, cv=2)
    assert np.isfinite(scores).all()


def test_bad_input():
    x, y, _ = _planted(12, d=3)
    with pytest.raises(NotFittedError, match="not fitted yet"):
        RecursiveFeatureMachine().predict(x)
    with pytest.raises(ValueError, match="X: expected finite"):
        RecursiveFeatureMachine().fit(np.where(np.arange(36).reshape(12, 3) == 5, np.nan, x), y)
    with pytest.raises(ValueError, match=r"y: expected shape \[12\] or \[12, C\] \(X has n = 12 rows\), got \[11\]"):
        RecursiveFeatureMachine().fit(x, y[:11])
    with pytest.raises(ValueError, match="y: expected finite"):
        RecursiveFeatureMachine().fit(x, np.where(np.arange(12) == 4, np.nan, y))
    with pytest.raises(ValueError, match="iterations: expected an int ≥ 0, got -1"):
        RecursiveFeatureMachine(iterations=-1).fit(x, y)
    with pytest.raises(ValueError, match="batch_rows: expected None or an int ≥ 1, got 0"):
        RecursiveFeatureMachine(batch_rows=0).fit(x, y)
    with pytest.raises(ValueError, match=r"regularization: expected one number \(one model\), got a tensor"):
        RecursiveFeatureMachine(regularization=torch.tensor([1e-3, 1e-2])).fit(x, y)
    with pytest.raises(ValueError, match="kernel: expected a preset name"):
        RecursiveFeatureMachine(kernel="rbf").fit(x, y)
    model = RecursiveFeatureMachine(iterations=1, backend="torch").fit(x, y)
    with pytest.raises(
        ValueError, match="X has 4 features, but RecursiveFeatureMachine is expecting 3 features as input"
    ):
        model.predict(np.ones((2, 4)))


@pytest.mark.parametrize(("kernel", "why"), [("laplace_lp", "needs p")])
def test_an_unsupported_kernel_is_refused_before_any_solve(kernel, why, monkeypatch):
    import kermac.models as models

    def no_solve(*args, **kwargs):
        raise AssertionError("solved before refusing the kernel")

    monkeypatch.setattr(models, "solve", no_solve)
    x, y, _ = _planted(10, d=2)
    with pytest.raises(ValueError, match=rf"kernel: .* got '{kernel}', which {why}"):
        RecursiveFeatureMachine(kernel=kernel).fit(x, y)


def test_the_synthetic_example_runs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rfm_synthetic.py"), "--device", "cpu", "-n", "300", "--plain-torch"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    cos = float(next(line for line in lines if line.startswith("|cos(")).split("=")[1])
    assert cos > 0.9
    assert "test R²: RFM" in result.stdout and "kernel ridge" in result.stdout
    # the plain-torch RFM of the example (dense cdist, solve, einsum AGOP) learns the same M
    assert float(lines[-1].rsplit("=", 1)[1]) < 1e-6


def test_the_digits_example_runs():
    pytest.importorskip("sklearn.datasets")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rfm_digits.py"), "--device", "cpu", "--train", "300"]
        + ["--iterations", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("test accuracy:"))
    rfm_accuracy = float(line.split("RFM ")[1].split(",")[0])
    assert rfm_accuracy > 0.9


@pytest.mark.gpu
def test_cuda_float32_at_n_20000_d_32():
    # sin(⟨x, u⟩): in 32 dimensions the frequency 3 of the CPU test needs more points than 20,000 to be found
    generator = torch.Generator().manual_seed(0)
    u = torch.randn(32, generator=generator)
    u /= u.norm()
    x = torch.randn(22000, 32, generator=generator)
    y = torch.sin(x @ u) + 0.01 * torch.randn(22000, generator=generator)
    x, y, u = x.cuda(), y.cuda(), u.cuda()
    train, test = slice(0, 20000), slice(20000, None)
    model = RecursiveFeatureMachine(iterations=3, regularization=1e-2, tol=1e-4).fit(x[train], y[train])
    top = torch.linalg.eigh(model.M_.double())[1][:, -1]
    assert abs(float(top.float() @ u)) > 0.99
    assert model.M_.device.type == "cuda" and model.predict(x[test]).device.type == "cuda"
    ridge = KernelRidge(bandwidth=10.0, regularization=1e-2, tol=1e-4).fit(x[train], y[train])
    rfm_r2, ridge_r2 = model.score(x[test], y[test]), ridge.score(x[test], y[test])
    assert rfm_r2 > 0.99 and rfm_r2 > ridge_r2
