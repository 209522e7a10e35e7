"""Parameter sweeps: one solver (or function) over a grid of parameter sets.

``grid`` is either a mapping of field -> values (the Cartesian product is
swept) or an explicit list of parameter dicts. Results come back in input
order, and ``on_result(index, point)`` sees each point as it finishes. A
point that fails is recorded with its error and the rest carry on: an
exception inside a point is caught where it happens, and a worker that dies
takes only its own point with it (the others are rerun on the rebuilt pool),
as does a point that runs past the ``timeout``.

With ``checkpoint=PATH`` each finished point is appended to a JSON-lines
file (:mod:`core.checkpoint`) as it streams in, so it survives a crash, a
kill or Ctrl-C; a rerun with the same target, grid and checkpoint rebuilds
the points that succeeded from the file, computes only the rest (points
that failed are retried: their error may have been a lost worker or a
timeout), and says how many it skipped.

Points are spread over a parallel backend with :func:`core.tasks.map_tasks`
only, so any backend with a ``map`` (the process pool, a cluster) runs a
sweep unchanged.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.api import solve
from core.checkpoint import Checkpoint, CheckpointError, callable_identity, fingerprint, open_checkpoint
from core.errors import CrossoverError, TaskFailedError, TaskTimeoutError, WorkerCrashedError
from core.registry import get_registry, get_solver
from core.running import registered_backend
from core.solver import SolverSpec, backend_of, problem_from_params
from core.tasks import backend_for_map, map_tasks, parallelism, task_timeout

Target = str | Callable[..., Any]
# (outputs, error, seconds, backend used): what a point's task returns, picklable
Row = tuple[dict[str, Any] | None, str | None, float, str | None]
PointCallback = Callable[[int, "SweepPoint"], None]

log = logging.getLogger("crossover")


@dataclass
class SweepPoint:
    """One parameter set of a sweep and what became of it.

    ``backend`` is where the point ran: the backend whose task map ran it
    (``"process"``, ``"dask"``, ...) for a mapped sweep, else the
    implementation ``core.solve`` chose here (``"numba:threads"``), or None
    for a function called here or a point that failed before any backend
    was chosen.
    """

    params: dict[str, Any]
    outputs: dict[str, Any] | None
    error: str | None
    seconds: float
    backend: str | None
    resumed: bool = field(default=False, compare=False)  # rebuilt from an earlier run's checkpoint, not computed now

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


def _run_point(target: Target, params: dict[str, Any], backend: str) -> tuple[Any, str | None]:
    """Outputs of one point: a solver run through core.solve, or a plain function call."""
    if callable(target):
        return target(**params), None
    spec = get_solver(target)
    result = solve(problem_from_params(spec, params), backend=backend, solver=spec.name)
    return dict(result.outputs), result.backend


def _point_task(task: tuple, shared: Mapping[str, Any], seed: Any) -> Row:
    """Run one point (in this process or a worker), turning any exception into a recorded error."""
    target, params, backend = task
    started = time.perf_counter()
    try:
        outputs, used = _run_point(target, params, backend)
        return outputs, None, time.perf_counter() - started, used
    except Exception as exc:  # recorded for this point; the sweep goes on
        return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started, None


def _task_backend(target: Target) -> str:
    """Where a point runs inside a parallel task: numba (any variant) if the solver has it, else numpy.

    Inside a task the parallel backend is already the parallelism, so a
    point takes the fastest single-process backend, never auto (which might
    calibrate in every worker).
    """
    if callable(target):
        return "numpy"
    return "numba" if get_solver(target).implementations_on("numba") else "numpy"


def _checked_target(target: object) -> Target:
    if isinstance(target, SolverSpec):
        target = target.name
    if isinstance(target, str):
        get_solver(target)  # an unknown name is one clear error, not one per point
        return target
    if not callable(target):
        raise CrossoverError(f"target={target!r} is invalid: must be a solver name, a SolverSpec or a function")
    return target


def _mapping_backend(backend: str, n_points: int, workers: int | None, timeout: float | None) -> str | None:
    """The backend the points are mapped on, or None to run them here one after another.

    Only a point in another process can be stopped, so an explicit
    ``timeout`` maps even one point, on one worker, and refuses a backend
    that would run the points here.
    """
    backends = get_registry().backends
    if backend == "auto":
        if n_points < 2 and timeout is None:
            return None
        try:
            backend_for_map("process")
        except CrossoverError:  # no pool here: the points run in this process
            if timeout is not None:
                raise
            return None
        return "process" if timeout is not None or (workers or parallelism("process")) > 1 else None
    registered_backend(backend)  # an unknown name is one clear error
    if backends[backend_of(backend)].map is not None and ":" not in backend:
        return backend
    if timeout is not None:
        raise CrossoverError(f"timeout={timeout!r} is invalid with backend {backend!r}: its points run in this "
                             f"process, where a point cannot be stopped; use backend='auto' or 'process'")
    return None


def _run_here(target: Target, points: list[dict[str, Any]], backend: str,
              report: Callable[[int, Row], None]) -> list[Row]:
    rows = []
    for i, params in enumerate(points):
        rows.append(_point_task((target, params, backend), {}, None))
        report(i, rows[-1])
    return rows


def _run_mapped(target: Target, points: list[dict[str, Any]], backend: str, options: dict[str, Any],
                report: Callable[[int, Row], None]) -> list[Row]:
    """Map the points on ``backend``; a task the map loses is recorded and the rest run again."""
    inner = _task_backend(target)
    rows: list[Row | None] = [None] * len(points)
    pending = list(range(len(points)))
    while pending:
        batch = pending

        def finished(index: int, row: Row, batch: list[int] = batch) -> None:
            row = (*row[:3], backend)  # the task ran on the map's backend, whatever ran inside it
            rows[batch[index]] = row
            report(batch[index], row)

        tasks = [(target, points[i], inner) for i in batch]
        labels = [repr(points[i])[:60] for i in batch]
        try:
            map_tasks(_point_task, tasks, labels=labels, backend=backend, on_result=finished, **options)
        except TaskFailedError as lost:  # a dead or stopped worker, or a result that could not come back
            why = ("timed out" if isinstance(lost, TaskTimeoutError) else
                   "worker process died" if isinstance(lost, WorkerCrashedError) else "task failed")
            # index -1: the worker died before any task started; blame the first so the loop moves on
            finished(max(lost.task_index, 0), (None, f"{why}: {lost}", 0.0, inner))
        pending = [i for i in batch if rows[i] is None]
    return rows


def sweep(target: str | SolverSpec | Callable[..., Any], grid, backend: str = "auto", *,
          workers: int | None = None, on_result: PointCallback | None = None,
          timeout: float | None = None, checkpoint: str | os.PathLike | None = None) -> list[SweepPoint]:
    """Run ``target`` at every point of ``grid``; results in input order.

    - A backend with a task map (``"process"``, or a third party's) spreads
      the points over its workers with :func:`core.tasks.map_tasks`; each
      point then runs on numba (or numpy, if the solver has no numba
      implementation) inside its task.
    - Any other backend runs the points one after another in this process,
      each through ``core.solve(problem, backend)``.
    - ``"auto"`` maps on the process pool when there are at least two points
      and it has at least two workers, and otherwise runs here with auto.

    ``workers`` sizes the process pool (process backend only).
    ``on_result(index, point)`` is called in this process as each point
    finishes, in completion order, for checkpoints and progress.
    ``timeout``: seconds one point may run (default ``CROSSOVER_TASK_TIMEOUT``
    for mapped points, else no limit); a point past it is recorded as timed
    out, its worker is stopped, and the other points go on.
    ``checkpoint``: a JSON-lines file that each finished point is appended
    to. Run again with the same file, and the points that succeeded are not
    computed again: they come back with ``resumed=True`` (and ``on_result``
    sees them first, in index order), one warning line on the ``crossover``
    logger says how many were skipped, and failed points are retried. A
    file written for another target or grid is refused with a
    :class:`~core.checkpoint.CheckpointError`. The backend is not part of a
    run's identity: a sweep stopped on one backend may resume on another.
    A function target is named as :func:`~core.checkpoint.callable_identity`
    names it: a ``functools.partial`` resumes in any process, while a lambda
    or a function defined inside another is refused (its name is shared).
    """
    target = _checked_target(target)
    points = expand(grid)
    if timeout is not None:
        timeout = task_timeout(timeout)
    store = None if checkpoint is None else open_checkpoint(checkpoint, _run_identity(target, points))
    try:
        done = {} if store is None else _resumed_points(store, points)
        return _sweep_rest(target, points, done, backend, workers, on_result, timeout, store)
    finally:
        if store is not None:
            store.close()


def _sweep_rest(target: Target, points: list[dict[str, Any]], done: dict[int, SweepPoint], backend: str,
                workers: int | None, on_result: PointCallback | None, timeout: float | None,
                store: Checkpoint | None) -> list[SweepPoint]:
    """Run the points not in ``done``, appending each to ``store`` as it finishes."""
    todo = [i for i in range(len(points)) if i not in done]
    mapped_on = _mapping_backend(backend, len(todo), workers, timeout)
    if workers is not None and mapped_on not in (None, "process"):
        raise CrossoverError(f"workers={workers!r} is invalid with backend {backend!r}: it sizes the process pool only")
    if on_result is not None:
        for index in sorted(done):
            on_result(index, done[index])
    finished = dict(done)

    def report(position: int, row: Row) -> None:
        index = todo[position]
        finished[index] = _as_point(points[index], row)
        if store is not None:
            _store(store, index, finished[index])
        if on_result is not None:
            on_result(index, finished[index])

    if todo:
        mine = [points[i] for i in todo]
        if mapped_on is None:
            _run_here(target, mine, backend, report)
        else:
            options: dict[str, Any] = {} if workers is None else {"workers": workers}
            if timeout is not None:
                options["timeout"] = timeout
            _run_mapped(target, mine, mapped_on, options, report)
    return [finished[i] for i in range(len(points))]


# -- checkpoints ----------------------------------------------------------------------------------


def _target_name(target: Target) -> str:
    """The target as a checkpoint names it: a solver's name, or a function's identity (the same in every process)."""
    return target if isinstance(target, str) else callable_identity(target, "target")


def _run_identity(target: Target, points: list[dict[str, Any]]) -> dict[str, Any]:
    """What makes two sweeps the same run: the target (and a solver's version) and every point, in order."""
    run: dict[str, Any] = {"kind": "sweep", "target": _target_name(target), "points": len(points)}
    if isinstance(target, str):
        run["solver_version"] = get_solver(target).version
    run["grid"] = fingerprint(points, "grid")
    return run


def _record(index: int, point: SweepPoint) -> dict[str, Any]:
    return {"index": index, "params": point.params, "outputs": point.outputs, "error": point.error,
            "seconds": point.seconds, "backend": point.backend}


def _store(store: Checkpoint, index: int, point: SweepPoint) -> None:
    try:
        store.append(_record(index, point))
    except CheckpointError as exc:  # say which point, and the way out
        raise CheckpointError(f"checkpoint {store.path}: point {index} {repr(point.params)[:80]} cannot be stored: "
                              f"{exc}; return storable outputs, or sweep without checkpoint=") from None


def _resumed_points(store: Checkpoint, points: list[dict[str, Any]]) -> dict[int, SweepPoint]:
    """The points the checkpoint holds a success for (a failure alone means: run it again)."""
    done: dict[int, SweepPoint] = {}
    failed: set[int] = set()
    for number, record in enumerate(store.records, start=1):
        index = _checked_record(store, number, record, len(points))
        if record["error"] is not None:
            failed.add(index)
        elif index not in done:
            done[index] = SweepPoint(params=points[index], outputs=record["outputs"], error=None,
                                     seconds=float(record["seconds"]), backend=record["backend"], resumed=True)
    if store.records:
        retried = len(failed - set(done))
        log.warning("sweep: checkpoint %s: %d of %d points already done, skipped%s", store.path, len(done),
                    len(points), f"; {retried} that failed run again" if retried else "")
    return done


def _checked_record(store: Checkpoint, number: int, record: Any, n_points: int) -> int:
    """The point index of a record, or a clear error for one this module did not write."""
    fields = ("index", "outputs", "error", "seconds", "backend")
    if not isinstance(record, dict) or any(field not in record for field in fields):
        raise CheckpointError(f"checkpoint {store.path} is corrupt: record {number} lacks one of {', '.join(fields)}; "
                              f"delete it to start afresh")
    index = record["index"]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_points:
        raise CheckpointError(f"checkpoint {store.path} is corrupt: record {number} has index={index!r}; "
                              f"allowed: 0 to {n_points - 1}; delete it to start afresh")
    if not isinstance(record["error"], (str, type(None))) or not isinstance(record["seconds"], (int, float)):
        raise CheckpointError(f"checkpoint {store.path} is corrupt: record {number} has error={record['error']!r}, "
                              f"seconds={record['seconds']!r}; allowed: text or null, a number; "
                              f"delete it to start afresh")
    return index


def _as_point(params: dict[str, Any], row: Row) -> SweepPoint:
    outputs, error, seconds, backend = row
    return SweepPoint(params=params, outputs=outputs, error=error, seconds=seconds, backend=backend)
