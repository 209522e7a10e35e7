"""The mean-field-game plugin (after MFG_PDE): FP particles, HJB, fixed point, common noise.

Each piece is a solver of its own, with its own problem type, features and
calibration ladder, so the cost model chooses a backend for each.
"""

from __future__ import annotations

from core import SolverSpec, hookimpl

__version__ = "0.1.0"


@hookimpl
def crossover_solvers() -> list[SolverSpec]:
    from plugins.mfg import specs

    return specs.all_specs()
