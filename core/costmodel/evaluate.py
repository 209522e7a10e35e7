"""The honesty check: does auto-selection pick the fastest backend off the ladder?

At sizes the calibration never saw (between ladder points and beyond its
top) every backend is timed, and the automatic choice, made *before* the
timings and without learning from them, is scored by its regret
``t_chosen / t_best - 1``: 0 when it picked the fastest, 0.5 when the pick
took 50 % longer than the best backend would have.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from core.costmodel.calibrate import ensure_calibrated, measure
from core.costmodel.plan import plan, with_size
from core.registry import get_solver
from core.solver import SolverSpec


@dataclass
class EvaluationRow:
    size: float
    seconds: dict[str, float]
    chosen: str
    best: str
    regret: float


@dataclass
class Evaluation:
    solver: str
    rows: list[EvaluationRow] = field(default_factory=list)

    @property
    def regrets(self) -> list[float]:
        return [row.regret for row in self.rows]

    @property
    def median_regret(self) -> float:
        return statistics.median(self.regrets) if self.rows else math.nan

    @property
    def max_regret(self) -> float:
        return max(self.regrets) if self.rows else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"solver": self.solver, "median_regret": self.median_regret, "max_regret": self.max_regret,
                "rows": [vars(row) for row in self.rows]}


def held_out_problems(spec: SolverSpec, quick: bool = True) -> list[Any]:
    """Problems at the geometric midpoints of the ladder and at 2x and 4x its top."""
    ladder = sorted(spec.ladder(quick), key=lambda p: float(getattr(p, spec.size_axis)))
    sizes = [float(getattr(p, spec.size_axis)) for p in ladder]
    targets = [math.sqrt(a * b) for a, b in itertools.pairwise(sizes)] + [sizes[-1] * 2, sizes[-1] * 4]
    problems = []
    for target in targets:
        nearest = min(ladder, key=lambda p: abs(math.log(float(getattr(p, spec.size_axis)) / target)))
        resized = with_size(spec, nearest, target)
        if resized is not None:
            problems.append(resized)
    return problems


def evaluate(solver: str, quick: bool = True, repeats: int = 3) -> Evaluation:
    """Time every runnable backend at held-out sizes and score the automatic choice."""
    spec = get_solver(solver)
    ensure_calibrated(spec)
    report = Evaluation(spec.name)
    for problem in held_out_problems(spec, quick):
        # decide first, on the steady state (evaluation warms every backend up)
        decision = plan(problem, solver=spec.name, expected_calls=math.inf)
        runnable = [b for b in spec.backends if b not in decision.excluded]
        seconds = {b: measure(spec, b, problem, repeats)[1] for b in runnable}
        best = min(seconds, key=seconds.get)
        report.rows.append(EvaluationRow(size=float(getattr(problem, spec.size_axis)), seconds=seconds,
                                         chosen=decision.backend, best=best,
                                         regret=seconds[decision.backend] / seconds[best] - 1))
    return report
