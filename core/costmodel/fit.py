"""The cost model: ``t = c0 + sum_i c_i * phi_i``, ``c >= 0``, fitted for relative error.

This module is pure arithmetic on samples; measuring them is
:mod:`core.costmodel.calibrate` and storing them is :mod:`core.costmodel.store`.

Why these choices:

- *non-negative*: more work never takes less time, and negative
  coefficients extrapolate to negative seconds;
- *weighted by 1/t*: a 1 ms and a 10 s sample count equally, so the model
  is as good at small sizes (where start-up costs decide) as at large ones;
- *outlier rejection*: one sample taken while a neighbour hogged the CPU must
  not move a decision, so the worst sample is dropped while it is more than
  3x off the fit of the others (only where there are at least three more
  samples than coefficients, so that "the others" still pin the fit down).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# a prediction whose features are beyond this factor of the fitted range is "extrapolated"
EXTRAPOLATION_FACTOR = 2.0
# a sample this many times off the others' fit is an outlier
OUTLIER_RATIO = 3.0


@dataclass(frozen=True)
class Sample:
    """One measurement: the solver's features and the median seconds it took."""

    features: Mapping[str, float]
    seconds: float


@dataclass(frozen=True)
class CostModel:
    """A fitted model for one (solver, backend) pair on this machine."""

    feature_names: tuple[str, ...]
    intercept: float
    coefficients: tuple[float, ...]
    ranges: Mapping[str, tuple[float, float]]
    n_samples: int
    n_rejected: int
    relative_error: float  # root-mean-square relative residual of the kept samples

    def predict(self, features: Mapping[str, float]) -> tuple[float, bool]:
        """Predicted seconds, and whether the features lie far outside the fitted range."""
        phi = [float(features.get(name, 0.0)) for name in self.feature_names]
        seconds = self.intercept + sum(c * x for c, x in zip(self.coefficients, phi))
        return seconds, self.extrapolated(features)

    def extrapolated(self, features: Mapping[str, float]) -> bool:
        for name, (low, high) in self.ranges.items():
            value = float(features.get(name, 0.0))
            if value > high * EXTRAPOLATION_FACTOR or value < low / EXTRAPOLATION_FACTOR:
                return True
        return False


def _solve(samples: Sequence[Sample], names: Sequence[str]) -> np.ndarray:
    """Weighted NNLS: minimise sum(((X c - t) / t)^2) with c >= 0."""
    from scipy.optimize import nnls  # imported on first fit: a plain solve should not pay for scipy

    seconds = np.array([s.seconds for s in samples])
    design = np.array([[1.0, *(float(s.features.get(n, 0.0)) for n in names)] for s in samples])
    weighted = design / seconds[:, None]
    # columns scaled to unit maximum so NNLS is well conditioned across 1 .. 1e10 feature values
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    coefficients, _ = nnls(weighted / scale, np.ones(len(samples)))
    return coefficients / scale


def _log_residuals(samples: Sequence[Sample], names: Sequence[str], c: np.ndarray) -> np.ndarray:
    predicted = np.array([c[0] + sum(ci * float(s.features.get(n, 0.0)) for ci, n in zip(c[1:], names))
                          for s in samples])
    observed = np.array([s.seconds for s in samples])
    return np.log(np.maximum(observed, 1e-12) / np.maximum(predicted, 1e-12))


def fit(samples: Sequence[Sample]) -> CostModel:
    """Fit a model to at least one sample with positive, finite seconds."""
    samples = [s for s in samples if math.isfinite(s.seconds) and s.seconds > 0]
    if not samples:
        raise ValueError("cannot fit a cost model without samples")
    names = tuple(sorted({name for s in samples for name in s.features}))
    kept = list(samples)
    coefficients = _solve(kept, names)
    # drop the worst sample while it is an outlier, never more than a quarter of them, and only
    # when the others still over-determine the fit: with as many samples as coefficients any
    # sample looks wild to a fit made without it
    droppable = len(samples) // 4 if len(samples) >= len(names) + 3 else 0
    for _ in range(droppable):
        residuals = _log_residuals(kept, names, coefficients)
        worst = int(np.argmax(np.abs(residuals)))
        trial = kept[:worst] + kept[worst + 1:]
        trial_coefficients = _solve(trial, names)
        # judge the suspect against a fit that did not see it
        if abs(_log_residuals([kept[worst]], names, trial_coefficients)[0]) < math.log(OUTLIER_RATIO):
            break
        kept, coefficients = trial, trial_coefficients
    relative = np.expm1(_log_residuals(kept, names, coefficients))
    ranges = {n: (min(float(s.features.get(n, 0.0)) for s in kept), max(float(s.features.get(n, 0.0)) for s in kept))
              for n in names}
    return CostModel(feature_names=names, intercept=float(coefficients[0]),
                     coefficients=tuple(float(c) for c in coefficients[1:]), ranges=ranges,
                     n_samples=len(kept), n_rejected=len(samples) - len(kept),
                     relative_error=float(np.sqrt(np.mean(relative**2))))
