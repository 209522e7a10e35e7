"""``LinearRegressionGD``: scikit-learn's estimator conventions over the ``ml.linreg`` solver.

The estimator holds only its parameters until ``fit``; ``fit`` validates
the data, runs the solver on the backend asked for (``"auto"``: the cost
model's choice) and stores the learned attributes, with a trailing
underscore, as scikit-learn does. scikit-learn itself is not needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from core.errors import CrossoverError
from plugins.ml.linreg_problem import LinRegProblem, as_feature_column

SOLVER = "ml.linreg"


class NotFittedError(CrossoverError, ValueError, AttributeError):
    """The estimator was used before ``fit`` (the same bases as scikit-learn's NotFittedError)."""


class LinearRegressionGD:
    """Full-batch gradient descent on the mean squared error for ``y ~ coef_ * x + intercept_``.

    Parameters: ``learning_rate`` and ``n_epochs`` (each epoch is one pass
    over the data), the starting point ``coef_init`` and
    ``intercept_init``, and ``backend``: ``"auto"`` or an implementation of
    the ``ml.linreg`` solver (``numpy``, ``numba``, ``torch``,
    ``torch:graph`` ...).

    After ``fit``: ``coef_`` (shape (1,)), ``intercept_``, ``n_iter_`` (the
    epochs run), ``loss_curve_`` (the MSE before each epoch's step) and
    ``backend_`` (the implementation that ran).
    """

    def __init__(self, learning_rate: float = 0.01, n_epochs: int = 200, coef_init: float = 0.0,
                 intercept_init: float = 0.0, backend: str = "auto"):
        self.learning_rate = learning_rate
        self.n_epochs = n_epochs
        self.coef_init = coef_init
        self.intercept_init = intercept_init
        self.backend = backend

    # -- scikit-learn's parameter protocol ------------------------------------------

    @classmethod
    def _param_names(cls) -> list[str]:
        return ["backend", "coef_init", "intercept_init", "learning_rate", "n_epochs"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> LinearRegressionGD:
        for name, value in params.items():
            if name not in self._param_names():
                raise ValueError(f"invalid parameter {name!r} for LinearRegressionGD; "
                                 f"valid parameters: {', '.join(self._param_names())}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        return f"LinearRegressionGD({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"

    # -- learning -----------------------------------------------------------------------

    def fit(self, X: Any, y: Any) -> LinearRegressionGD:
        """Run ``n_epochs`` of gradient descent from ``(coef_init, intercept_init)``; returns self."""
        import core

        if not isinstance(self.backend, str):
            raise CrossoverError(f"backend={self.backend!r} is invalid: must be 'auto' or a backend name")
        problem = LinRegProblem(X=X, y=y, learning_rate=self.learning_rate, n_epochs=self.n_epochs,
                                w0=self.coef_init, b0=self.intercept_init)
        result = core.solve(problem, backend=self.backend, solver=SOLVER)
        self.coef_ = np.array([float(result["coef"])])
        self.intercept_ = float(result["intercept"])
        self.n_iter_ = int(result["n_iter"])
        self.loss_curve_ = np.asarray(result["loss_curve"], dtype=np.float64)
        self.backend_ = result.backend
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedError("this LinearRegressionGD instance is not fitted yet: call fit(X, y) before "
                                 "predict or score")

    def predict(self, X: Any) -> np.ndarray:
        self._check_fitted()
        return self.coef_[0] * as_feature_column(X) + self.intercept_

    def score(self, X: Any, y: Any) -> float:
        """The coefficient of determination R^2 of the prediction (1 is perfect)."""
        predicted = self.predict(X)
        problem = LinRegProblem(X=X, y=y, n_epochs=1)  # the same length and finiteness checks as fit
        truth = problem.y
        residual = float(np.sum((truth - predicted) ** 2))
        total = float(np.sum((truth - truth.mean()) ** 2))
        return 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)

