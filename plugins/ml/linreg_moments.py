"""The sufficient-statistics shortcut, as its own solver (``ml.linreg_moments``), never inside a backend.

The (weighted) MSE of ``X w + b`` depends on the data only through a few
weighted means (of x, y, x x^T, x y and y^2), so one pass computes them and
every epoch after that costs O(d^2). It is the same trajectory as
``ml.linreg`` in exact arithmetic, but it is not gradient descent over the
data: the loss comes from a quadratic form, which loses digits to
cancellation near the optimum (the float64 sums keep about 1e-13 relative
on the preset). That is why it is named for what it does.
"""

from __future__ import annotations

import numpy as np

from plugins.ml.linreg_numpy import outputs
from plugins.ml.linreg_problem import LinRegProblem


def moments(X: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None,
            total: float | None = None) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, float]:
    """(mean x (d,), mean y, mean x x^T (d, d), mean x y (d,), mean y^2), weighted by ``weights`` if given."""
    X = X.reshape(len(X), -1)
    total = float(len(X) if weights is None else np.sum(weights)) if total is None else total
    Xw = X if weights is None else X * weights[:, None]
    yw = y if weights is None else y * weights
    return (Xw.sum(axis=0) / total, float(yw.sum()) / total, (Xw.T @ X) / total, (Xw.T @ y) / total,
            float(yw @ y) / total)


def solve_moments(problem: LinRegProblem) -> dict[str, np.ndarray]:
    X, y = problem.data()
    mx, my, mxx, mxy, myy = moments(X, y, problem.sample_weight, problem.weight_total())
    w, b, lr = problem.coef0(), problem.b0, problem.learning_rate
    losses = np.empty(problem.n_epochs)
    for epoch in range(problem.n_epochs):
        # mean (x.w + b - y)^2, and half the gradients: mean err x, mean err
        losses[epoch] = w @ mxx @ w + 2 * b * (w @ mx) + b * b - 2 * (w @ mxy) - 2 * b * my + myy
        err_x, err = mxx @ w + b * mx - mxy, w @ mx + b - my
        w, b = w - lr * 2.0 * err_x, b - lr * 2.0 * err
    return outputs(w, b, losses, problem.n_epochs)
