"""crossover: run each solver on the backend that is fastest for it here.

The public API lives here; see ``docs/`` for the guide.
"""

from __future__ import annotations

from core.api import BackendStatus, availability, backends, solve, solvers
from core.backend import Availability, Backend
from core.backends.dask_cluster import use_scheduler
from core.checkpoint import CheckpointError, CheckpointWarning
from core.costmodel.calibrate import calibrate
from core.costmodel.evaluate import evaluate
from core.costmodel.plan import plan
from core.costmodel.planner import Planner
from core.costmodel.planner import current as current_planner
from core.costmodel.planner import use as use_planner
from core.errors import (
    AutoSelectionError,
    BackendUnavailableError,
    CrossoverError,
    DuplicateSolverError,
    NotEnoughMemoryError,
    PluginError,
    PluginWarning,
    ProblemError,
    TaskFailedError,
    TaskTimeoutError,
    TooLongError,
    UnknownBackendError,
    UnknownSolverError,
    WorkerCrashedError,
)
from core.hookspecs import hookimpl
from core.problem import make_problem
from core.registry import register, unregister
from core.result import Plan, Prediction, Result
from core.solver import SizeSpace, SolverSpec, lazy
from core.sweep import SweepPoint, sweep

__version__ = "0.1.0"

__all__ = [
    "Availability", "AutoSelectionError", "Backend", "BackendStatus", "BackendUnavailableError",
    "CrossoverError", "DuplicateSolverError", "Plan", "PluginError", "PluginWarning", "Prediction",
    "ProblemError", "Result", "SolverSpec", "TaskFailedError", "TaskTimeoutError", "UnknownBackendError",
    "UnknownSolverError", "WorkerCrashedError", "availability", "backends", "hookimpl",
    "make_problem", "register", "solve", "solvers", "unregister", "__version__",
    "calibrate", "evaluate", "plan", "sweep", "SweepPoint", "SizeSpace", "lazy", "NotEnoughMemoryError",
    "TooLongError", "CheckpointError", "CheckpointWarning", "Planner", "current_planner", "use_planner",
    "use_scheduler",
]

