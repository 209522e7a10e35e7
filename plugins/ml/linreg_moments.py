"""The sufficient-statistics shortcut, as its own solver (``ml.linreg_moments``), never inside a backend.

The MSE of ``w x + b`` depends on the data only through five sums
(n, sum x, sum y, sum x^2, sum x y, and sum y^2 for the loss), so one pass
computes them and every epoch after that costs O(1). It is the same
trajectory as ``ml.linreg`` in exact arithmetic, but it is not gradient
descent over the data: the loss comes from a quadratic form, which loses
digits to cancellation near the optimum (the float64 sums keep about
1e-13 relative on the preset). That is why it is named for what it does.
"""

from __future__ import annotations

import numpy as np

from plugins.ml.linreg_numpy import outputs
from plugins.ml.linreg_problem import LinRegProblem


def moments(X: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    """(mean x, mean y, mean x^2, mean x y, mean y^2) in one float64 pass each."""
    n = len(X)
    return (float(X.sum()) / n, float(y.sum()) / n, float(X @ X) / n, float(X @ y) / n, float(y @ y) / n)


def solve_moments(problem: LinRegProblem) -> dict[str, np.ndarray]:
    mx, my, mxx, mxy, myy = moments(*problem.data())
    w, b, lr = problem.w0, problem.b0, problem.learning_rate
    losses = np.empty(problem.n_epochs)
    for epoch in range(problem.n_epochs):
        # mean (w x + b - y)^2, and half the gradients: mean err x, mean err
        losses[epoch] = w * w * mxx + 2 * w * b * mx + b * b - 2 * w * mxy - 2 * b * my + myy
        err_x, err = w * mxx + b * mx - mxy, w * mx + b - my
        w, b = w - lr * 2.0 * err_x, b - lr * 2.0 * err
    return outputs(w, b, losses, problem.n_epochs)
