"""The linear-regression problem: full-batch gradient descent on the (weighted) mean squared error.

``d`` features, ``y ~ X w + b`` with ``w`` of shape (d,). Every epoch is
one pass over the training data at the current ``(w, b)``: it gives the
loss there and every gradient, and then the step
``(w, b) -= learning_rate * gradient``. So ``loss_curve[e]`` is the loss
before epoch ``e``'s step, and the returned ``(w, b)`` are after the last
step. With ``sample_weight`` the loss is ``sum(s err^2) / sum(s)``: a
weight of 2 counts as the sample twice, a weight of 0 as no sample.

A problem either carries the user's data (``X`` and ``y``) or describes
synthetic data like the original comparison's preset: ``n_samples``
evenly spaced points on [0, 10) in the first feature (further features
drawn uniformly on [0, 10)), ``y = 0.7 (x_1 + ... + x_d) + 0.3`` plus
optional Gaussian noise. Synthetic data are made on first use and cached,
so a calibration design of many sizes holds no arrays.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.errors import ProblemError
from core.validation import check_array, check_float, check_int, check_seed, fail

# the original comparison's setup (see preset())
PRESET_POINTS = 5_000_000
PRESET_STEP = 2e-6
TRUE_SLOPE, TRUE_INTERCEPT = 0.7, 0.3
PRESET = {"learning_rate": 0.01, "n_epochs": 200, "w0": 0.83, "b0": 0.7645}
NUMBA_BLOCK = 16_384  # samples per block of the numba pass: a block's partial sums stay in registers
FLOAT32_MAX = float(np.finfo(np.float32).max)
# a bound on |N(0, 1)| over any number of draws a machine can make: P(|Z| > 40) is about 1e-350
NORMAL_BOUND = 40.0


@dataclass(frozen=True)
class LinRegProblem:
    """Gradient descent for ``y ~ X w + b``: ``n_epochs`` full passes at ``learning_rate`` from ``(w0, b0)``.

    ``w0`` is one number (every coefficient starts there) or one per feature.
    """

    n_samples: int = 200_000
    n_epochs: int = 200
    learning_rate: float = 0.01
    w0: float | np.ndarray = PRESET["w0"]
    b0: float = PRESET["b0"]
    noise: float = 0.0
    seed: int | None = 0
    X: np.ndarray | None = None
    y: np.ndarray | None = None
    n_features: int = 1
    sample_weight: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_epochs", check_int("n_epochs", self.n_epochs, minimum=1))
        object.__setattr__(self, "learning_rate",
                           check_float("learning_rate", self.learning_rate, minimum=0, strict_minimum=True))
        object.__setattr__(self, "b0", check_float("b0", self.b0))
        object.__setattr__(self, "noise", check_float("noise", self.noise, minimum=0))
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
        if (self.X is None) != (self.y is None):
            raise fail("X" if self.X is None else "y", None, "X and y must be given together")
        if self.X is None:
            object.__setattr__(self, "n_samples", check_int("n_samples", self.n_samples, minimum=1))
            object.__setattr__(self, "n_features", check_int("n_features", self.n_features, minimum=1))
            if self.sample_weight is not None:
                raise fail("sample_weight", self.sample_weight, "needs the data it weighs: give X and y too")
        else:
            self._set_data()
        object.__setattr__(self, "w0", _initial_coef(self.w0, self.n_features))

    def _set_data(self) -> None:
        X, y = as_feature_matrix(self.X), check_array("y", self.y)
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
        if y.ndim != 1:
            raise fail("y", self.y, f"must be one target per sample (1-D), got shape {y.shape}")
        if len(y) != len(X):
            raise fail("y", self.y, f"must have one value per sample of X: X has {len(X)} samples, y has {len(y)}")
        if len(X) < 1:
            raise fail("X", self.X, "must hold at least one sample")
        y.setflags(write=False)
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "n_samples", X.shape[0])
        object.__setattr__(self, "n_features", X.shape[1])
        if self.sample_weight is not None:
            object.__setattr__(self, "sample_weight", check_weights(self.sample_weight, len(X)))

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        """The training data as read-only float64 arrays: X of shape (n_samples, n_features), y of (n_samples,)."""
        if self.X is not None:
            return self.X, self.y
        return synthetic_data(self.n_samples, self.noise, self.seed, self.n_features)

    def coef0(self) -> np.ndarray:
        """The starting coefficients, one per feature (float64)."""
        return np.broadcast_to(np.asarray(self.w0, dtype=np.float64), (self.n_features,)).copy()

    @property
    def weighted(self) -> bool:
        return self.sample_weight is not None

    def weight_total(self) -> float:
        """The loss's denominator, computed once so that every backend divides by the same float64."""
        return float(self.n_samples) if self.sample_weight is None else float(np.sum(self.sample_weight))

    def largest_magnitude(self) -> float:
        """The largest |value| in X, y and the weights (for synthetic data, a bound that cannot be exceeded)."""
        return _largest_magnitude(self)


def _largest_magnitude(problem: LinRegProblem) -> float:
    if problem.X is None:  # never built here: a plan over many synthetic sizes must not make their data
        return 10.0 * TRUE_SLOPE * problem.n_features + TRUE_INTERCEPT + NORMAL_BOUND * problem.noise
    cached = problem.__dict__.get("_largest")
    if cached is None:  # once per problem: exclusion runs at every plan, and a max over the data is O(n)
        arrays = [problem.X, problem.y] + ([problem.sample_weight] if problem.weighted else [])
        cached = max(float(np.max(np.abs(a))) for a in arrays)
        object.__setattr__(problem, "_largest", cached)
    return cached


def _initial_coef(w0: Any, n_features: int) -> Any:
    """``w0`` as a float, or as a read-only float64 array of one value per feature."""
    try:
        scalar = isinstance(w0, (numbers.Real, np.floating, np.integer)) or np.ndim(w0) == 0
    except ValueError:  # a ragged nested list has no ndim
        raise fail("w0", w0, "must be one number or one per feature") from None
    if scalar:
        return check_float("w0", w0)
    coef = check_array("w0", w0)
    if coef.shape != (n_features,):
        raise fail("w0", w0, f"must be one number or one per feature: shape ({n_features},), got {coef.shape}")
    return coef


def check_weights(sample_weight: Any, n_samples: int) -> np.ndarray:
    """Sample weights: finite, >= 0, one per sample, not all zero (the loss divides by their sum)."""
    weights = check_array("sample_weight", sample_weight, nonnegative=True)
    if weights.shape != (n_samples,):
        raise fail("sample_weight", sample_weight, f"must have one weight per sample: shape ({n_samples},), "
                                                   f"got {weights.shape}")
    total = float(np.sum(weights))
    if total == 0:
        raise fail("sample_weight", sample_weight, "must not be all zero (the loss divides by their sum)")
    if not total < np.inf:
        raise fail("sample_weight", sample_weight, f"must have a finite sum, got {total!r}")
    return weights


def as_feature_matrix(X: Any, *, allow_1d: bool = True) -> np.ndarray:
    """X as a finite, C-ordered, read-only float64 array of shape (n_samples, n_features).

    A 1-D X is one feature (``allow_1d``); scikit-learn's convention, where a 1-D X is refused, is the estimator's.
    """
    array = check_array("X", X)
    if array.ndim == 1 and allow_1d:
        array = array.reshape(-1, 1)
    if array.ndim != 2:
        hint = "" if allow_1d else ". Reshape your data with X.reshape(-1, 1) if it is one feature"
        raise fail("X", X, f"must be 2-D (n_samples, n_features), got shape {array.shape}{hint}")
    if array.shape[1] < 1:
        raise fail("X", X, f"found 0 feature(s) (shape={array.shape}) while a minimum of 1 is required: "
                           "X has no feature column")
    array = np.ascontiguousarray(array)
    array.setflags(write=False)
    return array


@functools.lru_cache(maxsize=2)
def synthetic_data(n_samples: int, noise: float, seed: int | None,
                   n_features: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """First feature evenly spaced on [0, 10), the others uniform on [0, 10); ``y = 0.7 sum(x) + 0.3 + noise N(0, 1)``.

    One feature gives the preset's data exactly (the noise's draws included).
    """
    first = np.arange(n_samples, dtype=np.float64) * (10.0 / n_samples)
    X = np.empty((n_samples, n_features))
    X[:, 0] = first
    if n_features > 1:  # their own stream, so that the noise's draws do not depend on the number of features
        features = np.random.default_rng(None if seed is None else [seed, 1])
        X[:, 1:] = features.uniform(0.0, 10.0, (n_samples, n_features - 1))
    y = TRUE_SLOPE * (first if n_features == 1 else X.sum(axis=1)) + TRUE_INTERCEPT
    if noise > 0:
        y = y + noise * np.random.default_rng(seed).standard_normal(n_samples)
    X.setflags(write=False)
    y.setflags(write=False)
    return X, y


def preset(noise: float = 0.0, seed: int | None = 0) -> dict[str, Any]:
    """The original comparison: X = arange(0, 10, 2e-6) (5M points), y = 0.7 X + 0.3 (+ noise), an 80/20 split.

    X comes as one column, shape (n, 1). The split is a seeded shuffle (4M training, 1M test points); training
    runs 200 epochs at learning rate 0.01 from w = 0.83, b = 0.7645.
    Returns the four arrays and those settings.
    """
    noise = check_float("noise", noise, minimum=0)
    X = np.arange(0.0, 10.0, PRESET_STEP)
    if len(X) != PRESET_POINTS:  # arange's length with a float step is rounding-sensitive: say so if it moves
        raise ProblemError(f"preset: arange(0, 10, {PRESET_STEP}) gave {len(X)} points, expected {PRESET_POINTS}")
    rng = np.random.default_rng(seed)
    y = TRUE_SLOPE * X + TRUE_INTERCEPT
    if noise > 0:
        y = y + noise * rng.standard_normal(len(X))
    order = rng.permutation(len(X))
    cut = int(0.8 * len(X))
    train, test = order[:cut], order[cut:]
    # X as one column, scikit-learn's (n_samples, n_features): the estimator takes it as it is
    return {"X_train": X[train, None], "y_train": y[train], "X_test": X[test, None], "y_test": y[test], **PRESET}


def preset_problem(noise: float = 0.0, seed: int | None = 0) -> LinRegProblem:
    """The preset's training run as a solver problem (4M points, 200 epochs)."""
    data = preset(noise, seed)
    return LinRegProblem(X=data["X_train"], y=data["y_train"], learning_rate=data["learning_rate"],
                         n_epochs=data["n_epochs"], w0=data["w0"], b0=data["b0"])
