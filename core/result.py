"""What a solve returns (Result) and what auto-selection decided (Plan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds for one implementation, and how far to trust the number.

    ``status`` is ``"calibrated"`` (inside the measured region),
    ``"extrapolated"`` (outside it), ``"uncalibrated"`` (no model, or fewer
    distinct samples than coefficients) or ``"measured"`` (timed on this
    very problem in this process). ``error`` is the model's relative error
    (leave-one-out), which sets the margin and the confidence of the plan.
    """

    seconds: float | None
    status: str
    one_off_seconds: float = 0.0
    error: float | None = None


@dataclass(frozen=True)
class Plan:
    """The backend chosen for one problem, and the working behind the choice."""

    solver: str
    backend: str
    reason: str
    predictions: Mapping[str, Prediction] = field(default_factory=dict)
    excluded: Mapping[str, str] = field(default_factory=dict)
    break_even: tuple = ()
    # not confident, and the problem will run again: time these candidates once on it
    measure: tuple[str, ...] = ()
    close: tuple[str, ...] = ()  # the candidates whose predictions overlap the best's within their errors
    expected_calls: float = 1.0
    confident: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "solver": self.solver,
            "backend": self.backend,
            "reason": self.reason,
            "confident": self.confident,
            "measure": list(self.measure),
            "close": list(self.close),
            "expected_calls": self.expected_calls,
            "predictions": {k: vars(v) for k, v in self.predictions.items()},
            "excluded": dict(self.excluded),
            "break_even": [dict(b) if isinstance(b, Mapping) else b for b in self.break_even],
        }


@dataclass(frozen=True)
class Result:
    """Outputs of one solve as NumPy arrays, with how and how fast it ran."""

    solver: str
    backend: str
    seconds: float
    outputs: Mapping[str, np.ndarray]
    diagnostics: Mapping[str, Any] = field(default_factory=dict)
    plan: Plan | None = None

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
