"""ml.linreg and LinearRegressionGD: every implementation follows the float64 trajectory; conventions; bad input.

The independent truth is the closed form of gradient descent on a
quadratic: with Z = [X, 1] (d features and the intercept's column), S the
sample weights (all 1 without weights) and W their sum, A = Z^T S Z / W and
c = Z^T S y / W, the step is theta <- theta - 2 lr (A theta - c), so
theta_k = theta* + (I - 2 lr A)^k (theta_0 - theta*), with theta* the
(weighted) least-squares solution, and the loss at theta is a known quadratic.
"""

from __future__ import annotations

import numpy as np
import pytest

import core
from core.errors import ProblemError
from plugins.ml import LinearRegressionGD, LinRegProblem, NotFittedError, preset, preset_problem
from plugins.ml.linreg_numpy import solve_numpy

RTOL = 1e-6  # the acceptance bound: every backend's (w, b) and loss curve against the float64 reference


def closed_form(X: np.ndarray, y: np.ndarray, lr: float, epochs: int, w0, b0: float, weights=None):
    """(theta = [w_1 .. w_d, b] after ``epochs`` steps, the loss before each) from powers of the step matrix."""
    Z = np.column_stack([X.reshape(len(X), -1), np.ones(len(X))])
    S = np.ones(len(X)) if weights is None else np.asarray(weights, dtype=np.float64)
    W = S.sum()
    A = Z.T @ (S[:, None] * Z) / W
    c = Z.T @ (S * y) / W
    star = np.linalg.solve(A, c)
    step = np.eye(len(A)) - 2 * lr * A
    theta = np.append(np.broadcast_to(w0, (Z.shape[1] - 1,)), b0).astype(np.float64)
    losses = []
    for _ in range(epochs):
        losses.append(theta @ A @ theta - 2 * theta @ c + (S * y) @ y / W)
        theta = star + step @ (theta - star)
    return theta, np.array(losses)


def noisy_problem(n: int = 30_011, epochs: int = 60) -> LinRegProblem:
    rng = np.random.default_rng(7)
    X = rng.uniform(-2, 5, n)
    return LinRegProblem(X=X, y=1.5 * X - 0.25 + 0.3 * rng.standard_normal(n), learning_rate=0.05,
                         n_epochs=epochs, w0=-0.4, b0=2.0)


def assert_same_trajectory(outputs, reference) -> None:
    assert np.shape(outputs["coef"]) == np.shape(reference["coef"])
    np.testing.assert_allclose(outputs["coef"], reference["coef"], rtol=RTOL)
    np.testing.assert_allclose(float(outputs["intercept"]), float(reference["intercept"]), rtol=RTOL)
    np.testing.assert_allclose(outputs["loss_curve"], reference["loss_curve"], rtol=RTOL)
    assert int(outputs["n_iter"]) == int(reference["n_iter"]) == len(reference["loss_curve"])


def test_reference_follows_the_closed_form_of_gradient_descent():
    problem = noisy_problem()
    X, y = problem.data()
    theta, losses = closed_form(X, y, problem.learning_rate, problem.n_epochs, problem.w0, problem.b0)
    out = solve_numpy(problem)
    np.testing.assert_allclose([*out["coef"], float(out["intercept"])], theta, rtol=1e-10)
    np.testing.assert_allclose(out["loss_curve"], losses, rtol=1e-9)
    assert out["loss_curve"][-1] < 0.5 * out["loss_curve"][0]  # it descends


@pytest.mark.parametrize("backend", ["numba:threads", "numba:serial"])
def test_cpu_backends_match_the_float64_reference(backend):
    problem = noisy_problem()
    assert_same_trajectory(core.solve(problem, backend=backend, solver="ml.linreg").outputs, solve_numpy(problem))


@pytest.mark.parametrize("variant", ["eager", "compile"])
def test_torch_epoch_matches_the_reference_on_cpu(variant):
    """The torch variants' code (float32 storage, float64 sums, NaN padding, two-stage reduction), run on the CPU.

    The size is no multiple of the block, so the padding is exercised.
    """
    pytest.importorskip("torch")
    from plugins.ml.linreg_torch import MIN_BLOCK, solve_on

    problem = noisy_problem(n=3 * MIN_BLOCK + 17)
    assert_same_trajectory(solve_on(problem, "cpu", variant), solve_numpy(problem))


def test_the_stage_one_block_gives_enough_blocks_within_bounds():
    pytest.importorskip("torch")
    from plugins.ml.linreg_torch import MAX_BLOCK, MIN_BLOCK, TARGET_BLOCKS, block_size, layout

    for n in (1, 1000, 3 * MIN_BLOCK + 17, 100_000, 4_000_000, 10**9):
        block = block_size(n)
        assert MIN_BLOCK <= block <= MAX_BLOCK and block & (block - 1) == 0
        blocks, same = layout(n)
        assert same == block and (blocks - 1) * block < n <= blocks * block
        # between half the target and the target (enough to fill a GPU's SMs), unless a bound holds the block
        assert blocks <= TARGET_BLOCKS or block == MAX_BLOCK
        assert blocks > TARGET_BLOCKS // 2 or block == MIN_BLOCK
    assert block_size(4_000_000) == MAX_BLOCK  # the preset: 245 blocks of 16,384


def test_numba_gives_the_same_bits_on_any_thread_count():
    import numba

    problem = noisy_problem(n=100_000, epochs=5)
    before = numba.get_num_threads()
    try:
        runs = []
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            runs.append(core.solve(problem, backend="numba:threads", solver="ml.linreg").outputs)
        runs.append(core.solve(problem, backend="numba:serial", solver="ml.linreg").outputs)
        assert numba.get_num_threads() == threads  # the serial variant gives the threads back
    finally:
        numba.set_num_threads(before)
    for run in runs[1:]:
        assert np.array_equal(run["loss_curve"], runs[0]["loss_curve"]) and np.array_equal(run["coef"], runs[0]["coef"])


_INTERPRETED_EPOCHS = """
import json, sys
import numpy as np, torch
sys.path.insert(0, "tests")
from test_ml_linreg import noisy_problem
from plugins.ml import linreg_torch, linreg_triton
problem = noisy_problem(n=int(sys.argv[1]), epochs=7)
x, y = (torch.from_numpy(a.astype(np.float32)) for a in problem.data())
state, scalars, losses, counter = linreg_torch._initial(problem, "cpu")
linreg_torch.run_epochs(linreg_triton.epoch_step(len(x), "cpu"), x, y, state, scalars, losses, counter)
out = linreg_torch._finish(problem, state, losses)
print(json.dumps({key: np.asarray(value).tolist() for key, value in out.items()}))
"""


@pytest.mark.parametrize("n", [1, 17, 3 * 2048 + 5, 50_001])
def test_the_triton_epoch_matches_the_reference_under_the_interpreter(n):
    """The graph variant's kernels, run by Triton's CPU interpreter where triton is installed (the GPU tests
    run them compiled): partials per program, fixed-order stage two, every size's tail masked. A subprocess,
    as TRITON_INTERPRET must be set before triton is imported."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", _INTERPRETED_EPOCHS, str(n)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    outputs = json.loads(done.stdout.strip().splitlines()[-1])
    reference = solve_numpy(noisy_problem(n=n, epochs=7))
    assert_same_trajectory({k: np.asarray(v) for k, v in outputs.items()}, reference)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2047, 2049])
def test_the_gpu_graph_variant_handles_sizes_below_one_tile(n):
    problem = noisy_problem(n=n, epochs=9)
    assert_same_trajectory(core.solve(problem, backend="torch:graph", solver="ml.linreg").outputs,
                           solve_numpy(problem))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch:eager", "torch:compile", "torch:graph"])
def test_gpu_variants_match_the_float64_reference(backend):
    problem = noisy_problem(n=1_000_003, epochs=50)
    reference = solve_numpy(problem)
    first = core.solve(problem, backend=backend, solver="ml.linreg").outputs
    assert_same_trajectory(first, reference)
    again = core.solve(problem, backend=backend, solver="ml.linreg").outputs
    assert np.array_equal(first["loss_curve"], again["loss_curve"])  # deterministic reduction: same bits


def test_moments_shortcut_is_a_separate_solver_on_the_same_trajectory():
    """The shortcut is its own solver: ml.linreg never takes it (its problems go to ml.linreg by type)."""
    problem = noisy_problem()
    shortcut = core.solve(problem, backend="numpy", solver="ml.linreg_moments").outputs
    assert_same_trajectory(shortcut, solve_numpy(problem))
    assert core.solve(problem, backend="numpy").solver == "ml.linreg"


def test_preset_is_the_original_setup():
    data = preset()
    assert data["X_train"].shape == (4_000_000, 1) and data["X_test"].shape == (1_000_000, 1)
    together = np.sort(np.concatenate([data["X_train"][:, 0], data["X_test"][:, 0]]))
    np.testing.assert_allclose(together, np.arange(5_000_000) * 2e-6, rtol=0, atol=1e-9)
    np.testing.assert_allclose(data["y_train"], 0.7 * data["X_train"][:, 0] + 0.3, rtol=1e-15)
    assert (data["learning_rate"], data["n_epochs"], data["w0"], data["b0"]) == (0.01, 200, 0.83, 0.7645)


@pytest.mark.slow
def test_preset_run_numba_matches_reference_and_closed_form():
    problem = preset_problem()
    reference = solve_numpy(problem)
    assert_same_trajectory(core.solve(problem, backend="numba:threads", solver="ml.linreg").outputs, reference)
    X, y = problem.data()
    theta, _ = closed_form(X, y, 0.01, 200, 0.83, 0.7645)
    np.testing.assert_allclose([*reference["coef"], float(reference["intercept"])], theta, rtol=1e-9)


# -- the estimator ---------------------------------------------------------------------


def clone(estimator):
    """scikit-learn's clone, as its contract states it: a new unfitted estimator with equal parameters."""
    params = estimator.get_params(deep=False)
    fresh = type(estimator)(**params)
    assert fresh.get_params(deep=False) == params
    return fresh


def test_estimator_follows_scikit_learn_conventions():
    estimator = LinearRegressionGD(learning_rate=0.05, n_epochs=30, coef_init=0.1, backend="numpy")
    assert LinearRegressionGD().backend == "auto"
    params = estimator.get_params()
    assert params == {"backend": "numpy", "coef_init": 0.1, "intercept_init": 0.0, "learning_rate": 0.05,
                      "n_epochs": 30}
    assert LinearRegressionGD().set_params(**params).get_params() == params
    problem = noisy_problem(epochs=30)
    assert estimator.fit(problem.X, problem.y) is estimator
    assert estimator.n_features_in_ == 1 and estimator.coef_.shape == (1,)
    fresh = clone(estimator)
    assert not hasattr(fresh, "coef_")
    with pytest.raises(ValueError, match="invalid parameter 'alpha'"):
        estimator.set_params(alpha=1.0)
    assert "learning_rate=0.05" in repr(estimator)


def test_estimator_attributes_predict_and_score():
    problem = noisy_problem()
    X2 = problem.X  # scikit-learn's (n_samples, n_features) shape
    estimator = LinearRegressionGD(learning_rate=0.05, n_epochs=60, coef_init=-0.4, intercept_init=2.0,
                                   backend="numba").fit(X2, problem.y)
    reference = solve_numpy(problem)
    assert estimator.coef_.shape == (1,) and estimator.n_iter_ == 60
    assert estimator.backend_ in ("numba:threads", "numba:serial")  # "numba" names both variants
    np.testing.assert_allclose(estimator.coef_, reference["coef"], rtol=RTOL)
    np.testing.assert_allclose(estimator.loss_curve_, reference["loss_curve"], rtol=RTOL)
    predicted = estimator.predict(X2)
    np.testing.assert_allclose(predicted, estimator.coef_[0] * problem.X[:, 0] + estimator.intercept_, rtol=1e-15)
    r2 = 1 - np.sum((problem.y - predicted) ** 2) / np.sum((problem.y - problem.y.mean()) ** 2)
    assert estimator.score(X2, problem.y) == pytest.approx(r2, rel=1e-12)


def test_auto_backend_chooses_once_calibrated(empty_cache):
    problem = noisy_problem(epochs=20)
    core.calibrate(["ml.linreg"], budget=2.0, progress=False)  # a short calibration: this test checks the wiring
    estimator = LinearRegressionGD(learning_rate=0.05, n_epochs=20, coef_init=-0.4, intercept_init=2.0)
    estimator.fit(problem.X, problem.y)
    assert estimator.backend_ in core.solvers()["ml.linreg"].backends
    np.testing.assert_allclose(estimator.loss_curve_, solve_numpy(problem)["loss_curve"], rtol=RTOL)


# -- bad input ---------------------------------------------------------------------------


def column(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1, 1)


@pytest.mark.parametrize(("X", "y", "message"), [
    (column(np.arange(5.0)), np.arange(4.0), r"y=.* must have one value per sample of X: X has 5 samples, y has 4"),
    (column([0.0, np.nan, 2.0]), np.arange(3.0), r"X=.* must be finite, found 1 NaN"),
    (column(np.arange(3.0)), np.array([0.0, 1.0, np.inf]), r"y=.* must be finite, found 1 NaN or inf"),
    (np.ones((4, 2, 1)), np.arange(4.0), r"X=.* must be 2-D \(n_samples, n_features\), got shape \(4, 2, 1\)"),
    (np.arange(3.0), np.arange(3.0), r"X=.* must be 2-D .* got shape \(3,\)\. Reshape your data with X.reshape"),
    (np.zeros((0, 1)), np.zeros(0), r"X=.* found 0 sample\(s\) \(shape=\(0, 1\)\) while a minimum of 1"),
    (np.zeros((3, 0)), np.zeros(3), r"X=.* found 0 feature\(s\) \(shape=\(3, 0\)\) while a minimum of 1"),
])
def test_bad_data_is_refused_with_the_field_named(X, y, message):
    with pytest.raises(ProblemError, match=message):
        LinearRegressionGD(backend="numpy").fit(X, y)


@pytest.mark.parametrize(("params", "message"), [
    ({"learning_rate": 0.0}, r"learning_rate=0.0 is invalid: must be a finite number > 0"),
    ({"learning_rate": -0.1}, r"learning_rate=-0.1 is invalid: must be a finite number > 0"),
    ({"n_epochs": 0}, r"n_epochs=0 is invalid: must be an integer >= 1"),
    ({"n_epochs": -5}, r"n_epochs=-5 is invalid: must be an integer >= 1"),
    ({"coef_init": float("nan")}, r"w0=nan is invalid: must be a finite number"),
])
def test_bad_hyperparameters_are_refused(params, message):
    with pytest.raises(ProblemError, match=message):
        LinearRegressionGD(backend="numpy", **params).fit(column(np.arange(3.0)), np.arange(3.0))


def test_predict_before_fit_is_a_not_fitted_error():
    estimator = LinearRegressionGD()
    X = column(np.arange(3.0))
    for call in (lambda: estimator.predict(X), lambda: estimator.score(X, np.arange(3.0))):
        with pytest.raises(NotFittedError, match="not fitted yet: call fit"):
            call()
    assert issubclass(NotFittedError, ValueError) and issubclass(NotFittedError, AttributeError)


def test_cli_runs_the_solver(capsys):
    from core.cli import main

    assert main(["run", "ml.linreg", "--backend", "numba", "--param", "n_samples=10000",
                 "--param", "n_epochs=20"]) == 0
    out = capsys.readouterr().out
    assert "10,000 samples x 20 epochs" in out and "MSE" in out


def test_the_threaded_variant_runs_no_more_threads_than_blocks():
    """A thread without a block only adds to every epoch's fork and join, so small problems run on fewer."""
    import numba

    from core.backends.numba_threads import threads_at_most
    from plugins.ml.linreg_numba import BLOCK

    before = numba.get_num_threads()
    most = numba.config.NUMBA_NUM_THREADS
    for items in (1, 2, 3 * most):
        with threads_at_most(items) as used:
            assert used == numba.get_num_threads() == min(items, most)
        assert numba.get_num_threads() == before
    problem = noisy_problem(n=BLOCK + 1, epochs=3)  # two blocks: at most two threads, the same trajectory
    assert_same_trajectory(core.solve(problem, backend="numba:threads", solver="ml.linreg").outputs,
                           solve_numpy(problem))
    assert numba.get_num_threads() == before
