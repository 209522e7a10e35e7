"""Parameter sweeps: one solver (or function) over a grid of parameter sets.

``grid`` is either a mapping of field -> values (the Cartesian product is
swept) or an explicit list of parameter dicts. Results come back in input
order. A point that fails is recorded with its error and the rest carry on:
an exception inside a point is caught where it happens, and a worker that
dies takes only its own point with it (the others are rerun on the rebuilt
pool).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import CrossoverError, WorkerCrashedError
from core.solver import SolverSpec


@dataclass
class SweepPoint:
    """One parameter set of a sweep and what became of it."""

    params: dict[str, Any]
    outputs: dict[str, Any] | None
    error: str | None
    seconds: float
    backend: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def expand(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The parameter sets of a grid, in order (the last field varies fastest)."""
    if isinstance(grid, Mapping):
        names = list(grid)
        for name in names:
            if isinstance(grid[name], (str, bytes)) or not isinstance(grid[name], Sequence):
                raise CrossoverError(f"grid[{name!r}]={grid[name]!r} is invalid: must be a list of values")
        return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]
    return [dict(point) for point in grid]


def _run_point(target: str | Callable[..., Any], params: dict[str, Any], backend: str) -> tuple[Any, str | None]:
    """Outputs of one point: a solver run through core.solve, or a plain function call."""
    if callable(target):
        return target(**params), None
    import core
    from core.registry import get_solver
    from core.solver import problem_from_params

    spec = get_solver(target)
    problem = problem_from_params(spec, params)
    result = core.solve(problem, backend=backend, solver=spec.name)
    return dict(result.outputs), result.backend


def _point_task(task: tuple, shared: Mapping[str, Any], seed: Any) -> tuple:
    """Worker side: run one point, turning any exception into a recorded error."""
    target, params, backend = task
    started = time.perf_counter()
    try:
        outputs, used = _run_point(target, params, backend)
        return outputs, None, time.perf_counter() - started, used
    except Exception as exc:  # recorded for this point; the sweep goes on
        return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started, backend


def _worker_backend(target: str | Callable[..., Any]) -> str:
    """Inside a pool worker (one thread each) the fastest single-process backend."""
    if callable(target):
        return "numpy"
    from core.registry import get_solver

    spec = get_solver(target)
    return "numba" if "numba" in spec.implementations else "numpy"


def sweep(target: str | SolverSpec | Callable[..., Any], grid, backend: str = "auto", *,
          workers: int | None = None) -> list[SweepPoint]:
    """Run ``target`` at every point of ``grid``; results in input order.

    ``backend="process"`` spreads the points over the process pool (each
    point then runs on numba, or numpy, inside its worker); any other
    backend runs the points one after another in this process, each through
    ``core.solve(problem, backend)``. ``"auto"`` uses the pool when there are
    at least two points and two workers.
    """
    from core.backends.process_pool import default_workers, map_tasks

    if isinstance(target, SolverSpec):
        target = target.name
    if isinstance(target, str):
        from core.registry import get_solver

        get_solver(target)  # an unknown name is one clear error, not one per point
    elif not callable(target):
        raise CrossoverError(f"target={target!r} is invalid: must be a solver name, a SolverSpec or a function")
    if backend not in ("auto", "process"):
        from core.api import availability

        availability(backend)  # raises for an unknown backend name
    points = expand(grid)
    parallel = backend == "process" or (backend == "auto" and len(points) > 1
                                         and (workers or default_workers()) > 1)
    if not parallel:
        rows = [_point_task((target, params, backend), {}, None) for params in points]
    else:
        inner = _worker_backend(target)
        rows: list[Any] = [None] * len(points)
        pending = list(range(len(points)))
        while pending:
            tasks = [(target, points[i], inner) for i in pending]
            labels = [repr(points[i])[:60] for i in pending]
            try:
                for i, row in zip(pending, map_tasks(_point_task, tasks, workers=workers, labels=labels)):
                    rows[i] = row
                pending = []
            except WorkerCrashedError as crash:
                for i, row in zip(pending, crash.partial_results):
                    rows[i] = row
                dead = pending[crash.task_index] if crash.task_index >= 0 else pending[0]
                rows[dead] = (None, f"worker process died: {crash}", 0.0, inner)
                pending = [i for i in pending if rows[i] is None]
    return [SweepPoint(params=points[i], outputs=row[0], error=row[1], seconds=row[2], backend=row[3])
            for i, row in enumerate(rows)]
