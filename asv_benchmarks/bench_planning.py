"""What ``backend="auto"`` adds to a solve: the plan's own time.

The plan must stay cheap next to the solve it decides: under 1 % of it, or
0.2 ms, whichever is larger. ``time_plan`` is what ``core.solve(problem)``
spends deciding (break-even sizes left out, as a solve does);
``time_plan_explained`` adds the break-even sizes that ``core.plan`` and
``crossover plan`` show; ``track_overhead_fraction`` divides the first by
a numba solve of the same problem (the fastest CPU path at this size).
"""

from __future__ import annotations

import os
import tempfile

import core
from core.costmodel import history

SOLVER = "mfg.fp_particle"


def _problem():
    from core.registry import get_solver
    from core.solver import problem_from_params

    return problem_from_params(get_solver(SOLVER), {"N": 50_000})


class AutoPlanningOverhead:
    timeout = 600

    def setup_cache(self) -> str:
        directory = tempfile.mkdtemp(prefix="crossover-asv-plan-")
        os.environ["CROSSOVER_CACHE_DIR"] = directory
        history.forget()
        core.calibrate([SOLVER], quick=True)
        return directory

    def setup(self, directory: str) -> None:
        os.environ["CROSSOVER_CACHE_DIR"] = directory
        history.forget()
        self.problem = _problem()
        core.plan(self.problem, solver=SOLVER, explain=False)  # fits and caches the models once

    def time_plan(self, directory: str) -> None:
        core.plan(self.problem, solver=SOLVER, expected_calls=1e6, explain=False)

    def time_plan_explained(self, directory: str) -> None:
        core.plan(self.problem, solver=SOLVER, expected_calls=1e6)

    def track_overhead_fraction(self, directory: str) -> float:
        from core.costmodel.calibrate import median_seconds

        planning = median_seconds(lambda: core.plan(self.problem, solver=SOLVER, expected_calls=1e6,
                                                    explain=False), repeats=50)
        solving = median_seconds(lambda: core.solve(self.problem, backend="numba", solver=SOLVER), repeats=5)
        return planning / solving

    track_overhead_fraction.unit = "plan seconds / numba solve seconds"
