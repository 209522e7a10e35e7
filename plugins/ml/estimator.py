"""``LinearRegressionGD``: scikit-learn's estimator conventions over the ``ml.linreg`` solver.

The estimator holds only its parameters until ``fit``; ``fit`` validates
the data, runs the solver on the backend asked for (``"auto"``: the cost
model's choice, see below) and stores the learned attributes, with a
trailing underscore, as scikit-learn does. scikit-learn itself is not
needed; where it is installed, ``sklearn.utils.estimator_checks.check_estimator``
passes (``tests/test_ml_conventions.py`` runs it; see :data:`SKIPPED_CHECKS`).
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from typing import Any

import numpy as np

from core.errors import AutoSelectionError, CrossoverError, ProblemError
from core.validation import fail
from plugins.ml.linreg_problem import LinRegProblem, as_feature_matrix

SOLVER = "ml.linreg"
# where ml.linreg was never calibrated here, backend="auto" fits on this, the float64 reference: no
# calibration on a first fit (a quick one takes up to 25 s), no JIT compile, nothing to start
UNCALIBRATED_BACKEND = "numpy"
# check_estimator's checks that may skip themselves, with why (the docstring and the test name them); every
# other check runs and passes (scikit-learn 1.9)
SKIPPED_CHECKS = {
    "check_sample_weights_pandas_series": "needs pandas",
    "check_regressor_data_not_an_array": "its pandas half needs pandas (its array-like half runs first)",
    "check_array_api_input": "needs SCIPY_ARRAY_API=1 and an array API library",
}


class NotFittedError(CrossoverError, ValueError, AttributeError):
    """The estimator was used before ``fit`` (the same bases as scikit-learn's NotFittedError)."""


class DataConversionWarning(UserWarning):
    """A column-vector y was flattened (scikit-learn's warning of the same name and meaning)."""


class UncalibratedWarning(UserWarning):
    """``backend="auto"`` ran the reference because ``ml.linreg`` has no calibration on this machine."""


class LinearRegressionGD:
    """Full-batch gradient descent on the mean squared error of ``y ~ X @ coef_ + intercept_``.

    Parameters: ``learning_rate`` and ``n_epochs`` (each epoch is one pass
    over the data), the starting point ``coef_init`` (one number for every
    coefficient, or one per feature) and ``intercept_init``, and ``backend``:
    ``"auto"`` or an implementation of the ``ml.linreg`` solver (``numpy``,
    ``numba``, ``torch``, ``torch:graph`` ...).

    ``fit(X, y, sample_weight=None)``: X of shape (n_samples, n_features)
    (a 1-D X is refused, as scikit-learn does); ``sample_weight`` weighs
    each sample's squared error (a weight of 2 counts the sample twice).

    After ``fit``: ``coef_`` (shape (n_features,)), ``intercept_``,
    ``n_features_in_``, ``n_iter_`` (the epochs run), ``loss_curve_`` (the
    loss before each epoch's step) and ``backend_`` (the implementation
    that ran).

    ``backend="auto"`` never calibrates inside ``fit`` (a quick calibration
    takes up to 25 s, too long to hide in a first fit): where ``ml.linreg``
    has models on this machine (``crossover calibrate ml.linreg``), the cost
    model's pick runs (``core.plan``); where it has none, ``fit`` runs on the
    NumPy reference and says so with an :class:`UncalibratedWarning`.

    scikit-learn's ``check_estimator`` passes: every check runs and passes,
    but for those in :data:`SKIPPED_CHECKS`, which skip themselves without
    pandas or the array API (``check_sample_weights_pandas_series``,
    ``check_regressor_data_not_an_array``'s pandas half, ``check_array_api_input``).
    ``feature_names_in_`` is not kept.
    """

    def __init__(self, learning_rate: float = 0.01, n_epochs: int = 200, coef_init: Any = 0.0,
                 intercept_init: float = 0.0, backend: str = "auto"):
        self.learning_rate = learning_rate
        self.n_epochs = n_epochs
        self.coef_init = coef_init
        self.intercept_init = intercept_init
        self.backend = backend

    # -- scikit-learn's parameter protocol ------------------------------------------

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The parameters are ``__init__``'s keyword arguments, as scikit-learn's BaseEstimator reads them."""
        parameters = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
        for parameter in parameters:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise TypeError(f"{cls.__name__}.__init__ must name its parameters, not take *{parameter.name}")
        return sorted(p.name for p in parameters)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> LinearRegressionGD:
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}; "
                                 f"valid parameters: {', '.join(valid)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.get_params().items())})"

    def __sklearn_tags__(self):
        """scikit-learn's tags (called by scikit-learn only, so it is imported here): a single-output regressor."""
        from sklearn.utils import InputTags, RegressorTags, Tags, TargetTags

        return Tags(estimator_type="regressor", target_tags=TargetTags(required=True, single_output=True),
                    input_tags=InputTags(two_d_array=True), regressor_tags=RegressorTags())

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "coef_")

    # -- learning -----------------------------------------------------------------------

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> LinearRegressionGD:
        """Run ``n_epochs`` of gradient descent from ``(coef_init, intercept_init)``; returns self."""
        import core

        if not isinstance(self.backend, str):
            raise CrossoverError(f"backend={self.backend!r} is invalid: must be 'auto' or a backend name")
        X = _features(X)
        problem = LinRegProblem(X=X, y=_target(y), learning_rate=self.learning_rate, n_epochs=self.n_epochs,
                                w0=self.coef_init, b0=self.intercept_init,
                                sample_weight=None if sample_weight is None else _numbers("sample_weight",
                                                                                         sample_weight))
        backend = self.backend if self.backend != "auto" else _auto_backend(problem)
        result = core.solve(problem, backend=backend, solver=SOLVER)
        self.coef_ = np.asarray(result["coef"], dtype=np.float64).reshape(problem.n_features)
        self.intercept_ = float(result["intercept"])
        self.n_features_in_ = problem.n_features
        self.n_iter_ = int(result["n_iter"])
        self.loss_curve_ = np.asarray(result["loss_curve"], dtype=np.float64)
        self.backend_ = result.backend
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise _not_fitted_error()(f"this {type(self).__name__} instance is not fitted yet: call fit(X, y) "
                                      "before predict or score")

    def predict(self, X: Any) -> np.ndarray:
        self._check_fitted()
        X = _features(X)
        if X.shape[1] != self.n_features_in_:
            raise fail("X", X, f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                               f"{self.n_features_in_} features as input")
        return X @ self.coef_ + self.intercept_

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """The coefficient of determination R^2 of the prediction (1 is perfect), weighted as scikit-learn's."""
        predicted = self.predict(X)
        # the same length, finiteness and weight checks as fit
        problem = LinRegProblem(X=X, y=_target(y), n_epochs=1, sample_weight=None if sample_weight is None
                                else _numbers("sample_weight", sample_weight))
        truth = problem.y
        weights = np.ones(len(truth)) if sample_weight is None else problem.sample_weight
        mean = np.average(truth, weights=weights)
        residual = float(np.sum(weights * (truth - predicted) ** 2))
        total = float(np.sum(weights * (truth - mean) ** 2))
        return 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)


@functools.cache
def _also_sklearns(ours: type) -> type:
    import sklearn.exceptions

    return type(ours.__name__, (ours, getattr(sklearn.exceptions, ours.__name__)), {"__module__": __name__})


def _not_fitted_error() -> type:
    """Ours, which is also scikit-learn's NotFittedError where scikit-learn is in use (imported) in this process.

    scikit-learn is not needed, so it is not imported for this: a caller who
    catches its NotFittedError (or filters its DataConversionWarning) has imported it already.
    """
    return _also_sklearns(NotFittedError) if "sklearn" in sys.modules else NotFittedError


def _data_conversion_warning() -> type:
    return _also_sklearns(DataConversionWarning) if "sklearn" in sys.modules else DataConversionWarning


def _auto_backend(problem: LinRegProblem) -> str:
    """The cost model's pick where it has models here, else the reference (with a warning); never a calibration.

    The pick is then run as a named backend: ``core.solve(backend="auto")``
    calibrates a solver it finds uncalibrated, which a fit must not do.
    """
    import core

    try:
        return core.plan(problem, solver=SOLVER, explain=False).backend  # no calibrate=True
    except AutoSelectionError:
        warnings.warn(f"LinearRegressionGD: {SOLVER} is not calibrated on this machine, so backend='auto' fits "
                      f"on {UNCALIBRATED_BACKEND!r} (no calibration inside fit); run `crossover calibrate "
                      f"{SOLVER}` once (about 25 s) to let auto choose the fastest backend",
                      UncalibratedWarning, stacklevel=3)
        return UNCALIBRATED_BACKEND


def _numbers(field: str, value: Any) -> np.ndarray:
    """``value`` as an array; an object-dtype array of numbers as float64 (scikit-learn's convention)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):  # ragged lists: check_array says so with the field named
        return value
    if array.dtype.kind == "c":
        raise fail(field, value, "must hold real numbers: Complex data not supported")
    if array.dtype != object:
        return array
    try:
        return array.astype(np.float64)
    except (TypeError, ValueError) as exc:  # a dict or a word among the numbers: the same type, the field named
        raise type(exc)(str(fail(field, value, f"must hold only numbers ({exc})"))) from None


def _features(X: Any) -> np.ndarray:
    """X of shape (n_samples, n_features), checked as scikit-learn's check_array does (a 1-D X is refused)."""
    X = as_feature_matrix(_numbers("X", X), allow_1d=False)
    if len(X) < 1:
        raise fail("X", X, f"found 0 sample(s) (shape={X.shape}) while a minimum of 1 is required")
    return X


def _target(y: Any) -> Any:
    """y as given, but a column vector is flattened with scikit-learn's DataConversionWarning."""
    if y is None:
        raise ProblemError("y=None is invalid: LinearRegressionGD requires y to be passed, but the target y is None")
    y = _numbers("y", y)
    if isinstance(y, np.ndarray) and y.ndim == 2 and y.shape[1] == 1:
        warnings.warn("A column-vector y was passed when a 1d array was expected: it is flattened to shape "
                      f"({np.shape(y)[0]},)", _data_conversion_warning(), stacklevel=3)
        return np.reshape(y, -1)
    return y
