"""The linear-regression problem: full-batch gradient descent on the mean squared error.

One feature, ``y ~ w x + b``. Every epoch is one pass over the training
data at the current ``(w, b)``: it gives the loss there and both gradients,
and then the step ``(w, b) -= learning_rate * gradient``. So
``loss_curve[e]`` is the loss before epoch ``e``'s step, and the returned
``(w, b)`` are after the last step.

A problem either carries the user's data (``X`` and ``y``) or describes
synthetic data like the original comparison's preset: ``n_samples``
evenly spaced points on [0, 10), ``y = 0.7 x + 0.3`` plus optional
Gaussian noise. Synthetic data are made on first use and cached, so a
calibration design of many sizes holds no arrays.
"""

from __future__ import annotations

import functools
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


@dataclass(frozen=True)
class LinRegProblem:
    """Gradient descent for ``y ~ w x + b``: ``n_epochs`` full passes at ``learning_rate`` from ``(w0, b0)``."""

    n_samples: int = 200_000
    n_epochs: int = 200
    learning_rate: float = 0.01
    w0: float = PRESET["w0"]
    b0: float = PRESET["b0"]
    noise: float = 0.0
    seed: int | None = 0
    X: np.ndarray | None = None
    y: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_epochs", check_int("n_epochs", self.n_epochs, minimum=1))
        object.__setattr__(self, "learning_rate",
                           check_float("learning_rate", self.learning_rate, minimum=0, strict_minimum=True))
        object.__setattr__(self, "w0", check_float("w0", self.w0))
        object.__setattr__(self, "b0", check_float("b0", self.b0))
        object.__setattr__(self, "noise", check_float("noise", self.noise, minimum=0))
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
        if (self.X is None) != (self.y is None):
            raise fail("X" if self.X is None else "y", None, "X and y must be given together")
        if self.X is None:
            object.__setattr__(self, "n_samples", check_int("n_samples", self.n_samples, minimum=1))
            return
        X, y = as_feature_column(self.X), check_array("y", self.y)
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
        if y.ndim != 1:
            raise fail("y", self.y, f"must be one target per sample (1-D), got shape {y.shape}")
        if len(y) != len(X):
            raise fail("y", self.y, f"must have one value per sample of X: X has {len(X)} samples, y has {len(y)}")
        if len(X) < 1:
            raise fail("X", self.X, "must hold at least one sample")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "n_samples", len(X))

    def data(self) -> tuple[np.ndarray, np.ndarray]:
        """The training data as read-only float64 arrays (X as one column, flattened)."""
        if self.X is not None:
            return self.X, self.y
        return synthetic_data(self.n_samples, self.noise, self.seed)


def as_feature_column(X: Any) -> np.ndarray:
    """X as a finite 1-D float64 array: 1-D, or 2-D with exactly one feature column."""
    array = check_array("X", X)
    if array.ndim == 2:
        if array.shape[1] != 1:
            raise fail("X", X, f"must have one feature column (LinearRegressionGD fits y ~ w x + b), "
                               f"got {array.shape[1]} columns")
        array = array.reshape(-1)
    if array.ndim != 1:
        raise fail("X", X, f"must be 1-D or a single column (n_samples, 1), got shape {array.shape}")
    array.setflags(write=False)
    return array


@functools.lru_cache(maxsize=2)
def synthetic_data(n_samples: int, noise: float, seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``n_samples`` evenly spaced points on [0, 10), ``y = 0.7 x + 0.3 + noise * N(0, 1)``."""
    X = np.arange(n_samples, dtype=np.float64) * (10.0 / n_samples)
    y = TRUE_SLOPE * X + TRUE_INTERCEPT
    if noise > 0:
        y = y + noise * np.random.default_rng(seed).standard_normal(n_samples)
    X.setflags(write=False)
    y.setflags(write=False)
    return X, y


def preset(noise: float = 0.0, seed: int | None = 0) -> dict[str, Any]:
    """The original comparison: X = arange(0, 10, 2e-6) (5M points), y = 0.7 X + 0.3 (+ noise), an 80/20 split.

    The split is a seeded shuffle (4M training, 1M test points); training
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
    return {"X_train": X[train], "y_train": y[train], "X_test": X[test], "y_test": y[test], **PRESET}


def preset_problem(noise: float = 0.0, seed: int | None = 0) -> LinRegProblem:
    """The preset's training run as a solver problem (4M points, 200 epochs)."""
    data = preset(noise, seed)
    return LinRegProblem(X=data["X_train"], y=data["y_train"], learning_rate=data["learning_rate"],
                         n_epochs=data["n_epochs"], w0=data["w0"], b0=data["b0"])
