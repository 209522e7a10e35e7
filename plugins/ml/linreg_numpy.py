"""The float64 reference of gradient-descent linear regression: NumPy, one pass of whole-array operations per epoch.

Every other backend is checked against this trajectory (final ``(w, b)``
and every epoch's loss). The loss is ``sum(s err^2) / total`` with ``s``
the sample weights (none: every weight 1) and ``total`` their sum, taken
once from :meth:`LinRegProblem.weight_total` so every backend divides by
the same number.
"""

from __future__ import annotations

import numpy as np

from plugins.ml.linreg_problem import LinRegProblem


def gradient_descent(X: np.ndarray, y: np.ndarray, learning_rate: float, n_epochs: int, w0, b0: float,
                     weights: np.ndarray | None = None,
                     total: float | None = None) -> tuple[np.ndarray, float, np.ndarray]:
    """(w, b, loss before each epoch's step) of full-batch gradient descent on the (weighted) MSE.

    ``X`` is (n, d) (a 1-D X is one feature); ``w0`` one number or d of them.
    """
    X = X.reshape(len(X), -1)
    w = np.broadcast_to(np.asarray(w0, dtype=np.float64), (X.shape[1],)).copy()
    b = float(b0)
    total = float(len(X) if weights is None else np.sum(weights)) if total is None else total
    losses = np.empty(n_epochs)
    if X.shape[1] == 1 and weights is None:  # the one-feature epoch of old: the same operations, the same time
        return _one_feature(X[:, 0], y, learning_rate, n_epochs, float(w[0]), b, total)
    for epoch in range(n_epochs):
        err = X @ w + b - y
        weighted = err if weights is None else weights * err
        losses[epoch] = np.sum(weighted * err) / total
        grad_w, grad_b = 2.0 * (weighted @ X) / total, 2.0 * np.sum(weighted) / total
        w, b = w - learning_rate * grad_w, b - learning_rate * grad_b
    return w, b, losses


def _one_feature(x: np.ndarray, y: np.ndarray, learning_rate: float, n_epochs: int, w: float, b: float,
                 total: float) -> tuple[np.ndarray, float, np.ndarray]:
    losses = np.empty(n_epochs)
    for epoch in range(n_epochs):
        err = w * x + b - y
        losses[epoch] = np.sum(err * err) / total
        grad_w, grad_b = 2.0 * np.sum(err * x) / total, 2.0 * np.sum(err) / total
        w, b = w - learning_rate * grad_w, b - learning_rate * grad_b
    return np.array([w]), b, losses


def outputs(w, b: float, losses, n_epochs: int) -> dict[str, np.ndarray]:
    """The solver's outputs, the same for every implementation: ``coef`` has one value per feature."""
    return {"coef": np.atleast_1d(np.asarray(w, dtype=np.float64)), "intercept": np.float64(b),
            "loss_curve": np.asarray(losses, dtype=np.float64), "n_iter": np.int64(n_epochs)}


def solve_numpy(problem: LinRegProblem) -> dict[str, np.ndarray]:
    X, y = problem.data()
    w, b, losses = gradient_descent(X, y, problem.learning_rate, problem.n_epochs, problem.coef0(), problem.b0,
                                    problem.sample_weight, problem.weight_total())
    return outputs(w, b, losses, problem.n_epochs)
