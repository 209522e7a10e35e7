"""The float64 reference of gradient-descent linear regression: NumPy, one pass of whole-array operations per epoch.

Every other backend is checked against this trajectory (final ``(w, b)``
and every epoch's loss).
"""

from __future__ import annotations

import numpy as np

from plugins.ml.linreg_problem import LinRegProblem


def gradient_descent(X: np.ndarray, y: np.ndarray, learning_rate: float, n_epochs: int, w0: float,
                     b0: float) -> tuple[float, float, np.ndarray]:
    """(w, b, loss before each epoch's step) of full-batch gradient descent on the MSE."""
    w, b = float(w0), float(b0)
    losses = np.empty(n_epochs)
    for epoch in range(n_epochs):
        err = w * X + b - y
        losses[epoch] = np.mean(err * err)
        grad_w, grad_b = 2.0 * np.mean(err * X), 2.0 * np.mean(err)
        w, b = w - learning_rate * grad_w, b - learning_rate * grad_b
    return w, b, losses


def outputs(w: float, b: float, losses, n_epochs: int) -> dict[str, np.ndarray]:
    """The solver's outputs, the same for every implementation."""
    return {"coef": np.float64(w), "intercept": np.float64(b), "loss_curve": np.asarray(losses, dtype=np.float64),
            "n_iter": np.int64(n_epochs)}


def solve_numpy(problem: LinRegProblem) -> dict[str, np.ndarray]:
    X, y = problem.data()
    w, b, losses = gradient_descent(X, y, problem.learning_rate, problem.n_epochs, problem.w0, problem.b0)
    return outputs(w, b, losses, problem.n_epochs)
