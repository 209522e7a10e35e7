"""What a solve returns (Result) and what auto-selection decided (Plan)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds for one implementation, and how far to trust the number.

    ``status`` is ``"calibrated"`` (inside the measured region),
    ``"extrapolated"`` (outside it), ``"uncalibrated"`` (no model, or fewer
    distinct samples than coefficients) or ``"measured"`` (the model combined
    with ``samples`` warm runs of this very problem in this planner, see
    :mod:`core.costmodel.race`). ``error`` is the relative error (the
    model's leave-one-out error, or the combined estimate's standard
    error), which sets the margin and the confidence of the plan.
    """

    seconds: float | None
    status: str
    one_off_seconds: float = 0.0
    error: float | None = None
    # warm runs of this problem in this planner that the estimate combines with the model (not those it set
    # aside: a lone run above the model's band, until a second confirms it)
    samples: int = 0
    model_seconds: float | None = None  # the model's own prediction, before any run of this problem
    model_error: float | None = None  # ... and its relative error (race.model_missed weighs runs against it)


@dataclass(frozen=True)
class Plan:
    """The backend chosen for one problem, and the working behind the choice."""

    solver: str
    backend: str
    reason: str
    predictions: Mapping[str, Prediction] = field(default_factory=dict)
    excluded: Mapping[str, str] = field(default_factory=dict)
    # beyond reach of the cheapest by their models (core.costmodel.plan._beyond_reach), left out by a plan made only
    # to decide: their exclusions, trust regions and one-offs not looked up, never raced; core.plan (explain) weighs
    # every one
    beyond: tuple[str, ...] = ()
    break_even: tuple = ()
    # not confident, and the problem will run again: time these candidates once on it
    measure: tuple[str, ...] = ()
    close: tuple[str, ...] = ()  # the candidates whose predictions overlap the best's within their errors
    expected_calls: float = 1.0
    confident: bool = True
    # the work the predictions assumed, where it depends on convergence (learnt from earlier solves' work_done)
    expected_work: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "solver": self.solver,
            "backend": self.backend,
            "reason": self.reason,
            "confident": self.confident,
            "measure": list(self.measure),
            "close": list(self.close),
            "expected_calls": self.expected_calls,
            "expected_work": dict(self.expected_work),
            "predictions": {k: vars(v) for k, v in self.predictions.items()},
            "excluded": dict(self.excluded),
            "beyond": list(self.beyond),
            "break_even": [dict(b) if isinstance(b, Mapping) else b for b in self.break_even],
        }


class NonFiniteResultWarning(RuntimeWarning):
    """A solve returned outputs holding NaN or inf (listed in ``diagnostics["non_finite_outputs"]``)."""


@dataclass(frozen=True)
class Result:
    """Outputs of one solve as NumPy arrays, with how and how fast it ran.

    Every Result checks its own outputs: ``diagnostics["non_finite_outputs"]``
    lists those holding NaN or inf (empty when all are finite), and a
    :class:`NonFiniteResultWarning` says so, whichever solver and backend made
    them. A valid problem can still overflow inside a solve; that is flagged,
    never hidden.
    """

    solver: str
    backend: str
    seconds: float
    outputs: Mapping[str, np.ndarray]
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    plan: Plan | None = None
    predicted_seconds: float | None = None  # what the plan predicted for the implementation that ran

    def __post_init__(self) -> None:
        bad = non_finite_outputs(self.outputs)
        object.__setattr__(self, "diagnostics", {**self.diagnostics, "non_finite_outputs": bad})
        if bad:
            # stacklevel 4: past __post_init__, the dataclass __init__ and core.solve, to the caller's line
            warnings.warn(f"{self.solver} on {self.backend} returned NaN or inf in {', '.join(bad)}: "
                          "the problem's values may be beyond what the numerics can represent",
                          NonFiniteResultWarning, stacklevel=4)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.outputs[name]

    def save(self, path: str) -> None:
        """Write the outputs to a compressed ``.npz`` (arrays only, no pickles)."""
        np.savez_compressed(path, **{k: np.asarray(v) for k, v in self.outputs.items()})


def as_arrays(outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Normalise an implementation's outputs: every value becomes a NumPy array.

    Torch tensors are moved to the host here, once, at the end of a solve.
    """
    arrays = {}
    for name, value in outputs.items():
        if hasattr(value, "detach") and hasattr(value, "cpu"):
            value = value.detach().cpu().numpy()
        arrays[name] = np.asarray(value)
    return arrays


def non_finite_outputs(outputs: Mapping[str, Any]) -> list[str]:
    """Names of the numeric outputs holding NaN or inf, in output order."""
    bad = []
    with np.errstate(over="ignore", invalid="ignore"):
        for name, value in outputs.items():
            array = np.asarray(value)
            # a finite sum proves every element finite (NaN and inf propagate); an overflowing one checks each.
            # The sum allocates no mask as isfinite does, on every output of every steady-state solve
            if array.dtype.kind in "fc" and not np.isfinite(np.add.reduce(array, axis=None)) \
                    and not np.all(np.isfinite(array)):
                bad.append(name)
    return bad
