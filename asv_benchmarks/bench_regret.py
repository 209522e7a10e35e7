"""The honesty check as tracked numbers: what ``core.solve``'s loop runs, per solver.

``core.evaluate`` runs the real loop (three plain ``core.solve`` calls on a
fresh planner that holds only the calibration) on held-out problems the
calibration never measured, then times every implementation warm. Tracked:
the regret of what the third call ran (``t_used / t_best - 1``, median and
maximum), the loop's worst total over that of three calls naming the best
implementation, and the
models' pick alone. A rising number means the loop or the cost model no
longer describes this machine.
"""

from __future__ import annotations

import core

SCORES = ("median_final_regret", "max_final_regret", "max_loop_ratio", "median_regret", "max_regret")


def _solvers() -> list[str]:
    return sorted(core.solvers())


class AutoSelectionRegret:
    """``core.evaluate`` (quick space) for each registered solver."""

    params = _solvers()
    param_names = ("solver",)
    timeout = 3600

    def setup_cache(self) -> dict[str, dict[str, float]]:
        # one evaluation per solver serves every tracked number
        scores = {}
        for name in _solvers():
            report = core.evaluate(name, quick=True)
            scores[name] = {score: getattr(report, score) for score in SCORES}
        return scores

    def track_third_call_median_regret(self, scores: dict[str, dict[str, float]], solver: str) -> float:
        return scores[solver]["median_final_regret"]

    track_third_call_median_regret.unit = "t_used/t_best - 1"

    def track_third_call_max_regret(self, scores: dict[str, dict[str, float]], solver: str) -> float:
        return scores[solver]["max_final_regret"]

    track_third_call_max_regret.unit = "t_used/t_best - 1"

    def track_loop_total_ratio(self, scores: dict[str, dict[str, float]], solver: str) -> float:
        return scores[solver]["max_loop_ratio"]

    track_loop_total_ratio.unit = "three calls / three calls naming the best"

    def track_model_pick_max_regret(self, scores: dict[str, dict[str, float]], solver: str) -> float:
        return scores[solver]["max_regret"]

    track_model_pick_max_regret.unit = "t_chosen/t_best - 1"
