"""The fit: ``t = c0 + sum_i c_i * phi_i``, ``c >= 0``, for relative error, and what it can predict.

This module is pure arithmetic on samples; measuring them is
:mod:`core.costmodel.calibrate` and storing them :mod:`core.costmodel.store`.

Why these choices:

- *non-negative*: more work never takes less time, and negative
  coefficients extrapolate to negative seconds;
- *weighted by 1/t*: a 1 ms and a 10 s sample count equally, so the model
  is as good at small sizes (where start-up costs decide) as at large ones;
- *outlier rejection*: one sample taken while a neighbour hogged the CPU must
  not move a decision, so the worst sample is dropped while it is more than
  3x off the fit of the others (only where there are at least three more
  samples than coefficients, so that "the others" still pin the fit down);
- *identifiability*: a coefficient the samples cannot tell apart from the
  others (a feature that never moved, or moved in lock-step with another)
  is dropped from the fit and reported, instead of splitting its share at
  random with its twin;
- *honest error*: the error the plan's margin and confidence use is the
  leave-one-out error (each sample predicted by a fit that did not see it),
  which is what a prediction at a new problem is worth; the in-sample error
  flatters a model with as many coefficients as samples;
- *trust region*: a prediction is "extrapolated" when its features leave the
  box of the fitted rows (beyond a factor of 2) or the region they span in
  log scale, along the principal axes of the fitted rows; a direction the
  samples never moved in allows a factor of 2 at most. A model with fewer
  distinct samples than coefficients is "uncalibrated" whatever it predicts.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# a prediction whose features are beyond this factor of the fitted region is "extrapolated"
EXTRAPOLATION_FACTOR = 2.0
# a sample this many times off the others' fit is an outlier
OUTLIER_RATIO = 3.0
# singular values below this fraction of the largest are directions the samples never moved in
RANK_TOLERANCE = 1e-6
# a log-feature direction with less spread than this (log units) was never really varied
FLAT_DIRECTION = 0.05
INTERCEPT = "(intercept)"


@dataclass(frozen=True)
class Sample:
    """One measurement: the solver's features and the median seconds it took."""

    features: Mapping[str, float]
    seconds: float


def _sum_of_products(left: Sequence[float], right: Sequence[float]) -> float:
    return sum(map(operator.mul, left, right))


# a model's prediction and its trust region's projections are short dot products, done per implementation on every
# new problem's plan: math.sumprod (Python 3.12, the H200 host's) takes a third of the time of a sum over map
_dot: Callable[[Sequence[float], Sequence[float]], float] = getattr(math, "sumprod", _sum_of_products)

# every trust region laid out in this process, by its features and extent: models fitted on the same design share one
# object, so one problem's judgement of it holds for each (CostModel.outside)
_REGIONS: dict[tuple, tuple] = {}
REGIONS_KEPT = 1024


@dataclass(frozen=True)
class CostModel:
    """A fitted model for one (solver, implementation) pair on this machine."""

    feature_names: tuple[str, ...]
    intercept: float
    coefficients: tuple[float, ...]
    ranges: Mapping[str, tuple[float, float]]
    n_samples: int
    n_rejected: int
    relative_error: float  # leave-one-out root-mean-square relative error (in-sample when too few samples)
    in_sample_error: float = 0.0
    rank: int = 0
    undetermined: tuple[str, ...] = ()  # coefficients the samples could not determine (dropped)
    calibrated: bool = True  # enough distinct samples for every coefficient
    # the trust region in log1p(feature) space: centre, principal axes, and the span along each
    centre: tuple[float, ...] = ()
    axes: tuple[tuple[float, ...], ...] = ()
    span: tuple[tuple[float, float], ...] = field(default=())

    def predict(self, features: Mapping[str, float]) -> tuple[float, bool]:
        """Predicted seconds, and whether the features lie outside the fitted region."""
        return self.seconds(features), self.outside(features)

    def seconds(self, features: Mapping[str, float]) -> float:
        """Predicted seconds alone (a plan judges the region only of the implementations within its reach)."""
        return self.intercept + _dot(self.coefficients, [float(features.get(name, 0.0)) for name in self.feature_names])

    def outside(self, features: Mapping[str, float], judged: dict[tuple, bool] | None = None) -> bool:
        """Whether the features lie outside the fitted region (the trust region).

        ``judged``: one problem's judgements so far, by region and point.
        Models fitted on one design share their region (linreg's
        numba:threads and its three torch variants, on the H200 host's
        calibration), and a point judged against it is not projected again:
        each projection was 5 us of a small problem's first plan on the VM.
        """
        region = self._region
        if region is None:  # ranges over other names than the model's (a hand-made model)
            return self.extrapolated(features)
        phi = [float(features.get(name, 0.0)) for name in self.feature_names]
        if judged is None:
            return _outside(phi, *region)
        key = (id(region), *phi)  # an interned region (_region): equal regions are one object
        found = judged.get(key)
        if found is None:
            found = judged[key] = _outside(phi, *region)
        return found

    def extrapolated(self, features: Mapping[str, float]) -> bool:
        for name, (low, high) in self.ranges.items():
            value = float(features.get(name, 0.0))
            if value > high * EXTRAPOLATION_FACTOR or value < low / EXTRAPOLATION_FACTOR:
                return True
        return _off_slabs([float(features.get(n, 0.0)) for n in self.feature_names], self.centre, self._slabs)

    @functools.cached_property
    def _region(self) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...],
                               tuple[tuple[tuple[float, ...], float, float], ...]] | None:
        """The trust region laid out once for :meth:`predict`, in the order of the model's features: the box's
        bounds widened by the factor, the centre, and each principal axis with its span widened by the slack
        (None where the ranges name other features than the model's).

        A plan predicts every implementation of a problem, and a new
        problem's first call plans: the box and the slacks recomputed per
        prediction were a fifth of a small problem's first plan on the VM.
        """
        if tuple(self.ranges) != tuple(self.feature_names):
            return None
        lows = tuple(low / EXTRAPOLATION_FACTOR for low, _ in self.ranges.values())
        highs = tuple(high * EXTRAPOLATION_FACTOR for _, high in self.ranges.values())
        region = (lows, highs, self.centre, self._slabs)
        if len(_REGIONS) > REGIONS_KEPT:
            _REGIONS.clear()
        return _REGIONS.setdefault((self.feature_names, region), region)

    @functools.cached_property
    def _slabs(self) -> tuple[tuple[tuple[float, ...], float, float], ...]:
        """Each principal axis with its span widened by the slack a direction allows (log of the factor)."""
        slack = math.log(EXTRAPOLATION_FACTOR)
        return tuple((axis, low - slack, high + slack) for axis, (low, high) in zip(self.axes, self.span))

    @property
    def status(self) -> str:
        return "calibrated" if self.calibrated else "uncalibrated"


def _outside(phi: list[float], lows: tuple[float, ...], highs: tuple[float, ...], centre: tuple[float, ...],
             slabs: tuple[tuple[tuple[float, ...], float, float], ...]) -> bool:
    """Whether the model's features ``phi`` leave its trust region (:attr:`CostModel._region`'s parts).

    In plain Python: a handful of features, where NumPy's per-call cost was
    most of a plan's (and map over operator, at half a generator's cost).
    """
    if any(map(operator.gt, phi, highs)) or any(map(operator.lt, phi, lows)):
        return True
    return _off_slabs(phi, centre, slabs)


def _off_slabs(phi: list[float], centre: tuple[float, ...],
               slabs: tuple[tuple[tuple[float, ...], float, float], ...]) -> bool:
    """Whether ``phi`` leaves a slab of the trust region (:attr:`CostModel._slabs`), in log1p scale about ``centre``."""
    if not slabs:
        return False
    point = [math.log1p(value if value > 0.0 else 0.0) - c for value, c in zip(phi, centre)]
    for axis, low, high in slabs:
        coordinate = _dot(axis, point)
        if coordinate < low or coordinate > high:
            return True
    return False


def _design(samples: Sequence[Sample], names: Sequence[str]) -> np.ndarray:
    return np.array([[1.0, *(float(s.features.get(n, 0.0)) for n in names)] for s in samples])


def identified_columns(design: np.ndarray, seconds: np.ndarray) -> list[int]:
    """Columns of the (1/t weighted) design that add rank, intercept first, in order.

    A column that does not raise the rank is a combination of the kept ones:
    the samples cannot say how much time belongs to it.
    """
    weighted = design / seconds[:, None]
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    weighted = weighted / scale
    kept: list[int] = []
    for column in range(design.shape[1]):
        trial = weighted[:, [*kept, column]]
        singular = np.linalg.svd(trial, compute_uv=False)
        if singular[-1] > RANK_TOLERANCE * singular[0]:
            kept.append(column)
    return kept


def nnls(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``argmin |A x - b|`` over ``x >= 0``, by Lawson and Hanson's active-set method.

    In NumPy, not ``scipy.optimize.nnls``: importing scipy.optimize cost a
    fresh process's first ``core.solve`` 0.4 s on the 2-core VM, and the
    systems here have a handful of columns.
    """
    rows, columns = matrix.shape
    solution = np.zeros(columns)
    passive = np.zeros(columns, dtype=bool)
    tolerance = 10 * np.finfo(float).eps * np.abs(matrix).sum(axis=0).max(initial=0.0) * max(rows, columns)
    for _ in range(3 * columns + 10):  # each column enters at most a few times; a guard, never reached
        gradient = matrix.T @ (target - matrix @ solution)
        candidates = ~passive & (gradient > tolerance)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            trial = np.zeros(columns)
            trial[passive] = np.linalg.lstsq(matrix[:, passive], target, rcond=None)[0]
            if (trial[passive] > tolerance).all():
                solution = trial
                break
            # step back toward the last feasible point until a coefficient reaches zero, and free it
            blocking = passive & (trial <= tolerance)
            step = np.min(solution[blocking] / (solution[blocking] - trial[blocking]))
            solution = solution + step * (trial - solution)
            passive &= solution > tolerance
            solution[~passive] = 0.0
    return solution


def _solve(design: np.ndarray, seconds: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """Weighted NNLS on the kept columns: minimise sum(((X c - t) / t)^2), c >= 0; zeros elsewhere."""
    weighted = design[:, columns] / seconds[:, None]
    # columns scaled to unit maximum so NNLS is well conditioned across 1 .. 1e10 feature values
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    solution = nnls(weighted / scale, np.ones(len(seconds)))
    coefficients = np.zeros(design.shape[1])
    coefficients[list(columns)] = solution / scale
    return coefficients


def _log_residuals(design: np.ndarray, seconds: np.ndarray, c: np.ndarray) -> np.ndarray:
    predicted = design @ c
    return np.log(np.maximum(seconds, 1e-12) / np.maximum(predicted, 1e-12))


def _leave_one_out_error(design: np.ndarray, seconds: np.ndarray, columns: Sequence[int]) -> float | None:
    """RMS relative error of each sample predicted by a fit without it (None: too few samples)."""
    n = len(seconds)
    if n < len(columns) + 2:
        return None
    errors = []
    for i in range(n):
        keep = np.arange(n) != i
        c = _solve(design[keep], seconds[keep], columns)
        errors.append(math.expm1(abs(_log_residuals(design[i:i + 1], seconds[i:i + 1], c)[0])))
    return float(np.sqrt(np.mean(np.square(errors))))


def _trust_region(rows: np.ndarray) -> tuple[tuple, tuple, tuple]:
    """Centre, principal axes and the fitted rows' extent along each, in log1p(feature) space."""
    logs = np.log1p(np.maximum(rows, 0.0))
    centre = logs.mean(axis=0)
    centred = logs - centre
    if len(rows) > 1:
        _, singular, axes = np.linalg.svd(centred, full_matrices=True)
    else:
        singular, axes = np.zeros(0), np.eye(rows.shape[1])
    spread = np.zeros(rows.shape[1])
    spread[:len(singular)] = singular / math.sqrt(max(len(rows), 1))
    span = []
    for axis, width in zip(axes, spread):
        coordinates = centred @ axis
        if width < FLAT_DIRECTION:  # never varied: only the slack around the centre is trusted
            span.append((0.0, 0.0))
        else:
            span.append((float(coordinates.min()), float(coordinates.max())))
    return tuple(float(v) for v in centre), tuple(tuple(float(v) for v in a) for a in axes), tuple(span)


def fit(samples: Sequence[Sample], names: Sequence[str] | None = None) -> CostModel:
    """Fit a model to at least one sample with positive, finite seconds.

    ``names`` fixes the feature order (default: every feature seen, sorted).
    """
    samples = [s for s in samples if math.isfinite(s.seconds) and s.seconds > 0]
    if not samples:
        raise ValueError("cannot fit a cost model without samples")
    names = tuple(names) if names is not None else tuple(sorted({name for s in samples for name in s.features}))
    design = _design(samples, names)
    seconds = np.array([s.seconds for s in samples])
    columns = identified_columns(design, seconds)
    coefficients = _solve(design, seconds, columns)
    kept = np.arange(len(samples))
    # drop the worst sample while it is an outlier, never more than a quarter of them, and only
    # when the others still over-determine the fit: with as many samples as coefficients any
    # sample looks wild to a fit made without it
    droppable = len(samples) // 4 if len(samples) >= len(names) + 4 else 0
    for _ in range(droppable):
        residuals = _log_residuals(design[kept], seconds[kept], coefficients)
        worst = int(np.argmax(np.abs(residuals)))
        trial = np.delete(kept, worst)
        trial_coefficients = _solve(design[trial], seconds[trial], columns)
        # judge the suspect against a fit that did not see it
        suspect = kept[worst:worst + 1]
        if abs(_log_residuals(design[suspect], seconds[suspect], trial_coefficients)[0]) < math.log(OUTLIER_RATIO):
            break
        kept, coefficients = trial, trial_coefficients
    in_sample = float(np.sqrt(np.mean(np.expm1(_log_residuals(design[kept], seconds[kept], coefficients)) ** 2)))
    loo = _leave_one_out_error(design[kept], seconds[kept], columns)
    rows = design[kept][:, 1:]
    distinct = len({tuple(row) for row in rows})
    ranges = {n: (float(rows[:, i].min()), float(rows[:, i].max())) for i, n in enumerate(names)}
    centre, axes, span = _trust_region(rows)
    all_names = (INTERCEPT, *names)
    return CostModel(feature_names=names, intercept=float(coefficients[0]),
                     coefficients=tuple(float(c) for c in coefficients[1:]), ranges=ranges,
                     n_samples=len(kept), n_rejected=len(samples) - len(kept),
                     relative_error=in_sample if loo is None else loo, in_sample_error=in_sample,
                     rank=len(columns),
                     undetermined=tuple(all_names[i] for i in range(len(all_names)) if i not in columns),
                     calibrated=distinct >= len(names) + 1, centre=centre, axes=axes, span=span)
