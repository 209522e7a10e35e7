"""The honesty check as a tracked number: regret of auto-selection per solver.

``core.evaluate`` times every backend at sizes that are not on the
calibration ladder and scores the automatic choice by ``t_chosen / t_best -
1``. A rising median regret means the cost model no longer describes this
machine (or a backend changed speed without the model noticing).
"""

from __future__ import annotations

import core


def _solvers() -> list[str]:
    return sorted(core.solvers())


class AutoSelectionRegret:
    """Median and maximum regret of ``core.evaluate`` (quick ladder) for each registered solver."""

    params = _solvers()
    param_names = ("solver",)
    timeout = 1800

    def setup_cache(self) -> dict[str, tuple[float, float]]:
        # one evaluation per solver serves both tracked numbers
        regrets = {}
        for name in _solvers():
            report = core.evaluate(name, quick=True)
            regrets[name] = (report.median_regret, report.max_regret)
        return regrets

    def track_median_regret(self, regrets: dict[str, tuple[float, float]], solver: str) -> float:
        return regrets[solver][0]

    track_median_regret.unit = "t_chosen/t_best - 1"

    def track_max_regret(self, regrets: dict[str, tuple[float, float]], solver: str) -> float:
        return regrets[solver][1]

    track_max_regret.unit = "t_chosen/t_best - 1"
