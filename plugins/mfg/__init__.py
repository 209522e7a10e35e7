"""The mean-field-game plugin (after MFG_PDE): FP particles, HJB, fixed point, common noise.

Each piece is a solver of its own, with its own problem type, features and
size space, so the cost model chooses an implementation for each.
"""

from __future__ import annotations

from core import SolverSpec, hookimpl
from plugins.mfg import specs

__version__ = "0.1.0"


@hookimpl
def crossover_solvers() -> list[SolverSpec]:
    return specs.all_specs()
