"""One task map for every parallel backend.

A solver that splits its work into independent tasks writes one task
function ``fn(task, shared, seed) -> result`` and hands it to
:func:`map_tasks` with the name of a backend: the process pool, or any
registered backend that provides a ``map`` (a Dask cluster, a third
party's). The solver never imports a backend's module, so a new parallel
backend runs every such solver unchanged. :func:`run_serially` is the
reference; every backend seeds task ``i`` with the ``i``-th child of
``SeedSequence(seed)``, as it does, so results agree bit for bit.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from core.backend import Backend
from core.backends import host_load
from core.errors import BackendUnavailableError, UnknownBackendError
from core.registry import get_registry
from core.running import probe, registered_backend
from core.seeded_tasks import (
    TIMEOUT_VARIABLE,
    ResultCallback,
    TaskFn,
    readonly_views,
    run_serially,
    task_labels,
    task_seeds,
    task_timeout,
)
from core.validation import fail

__all__ = ["ResultCallback", "TaskFn", "backend_for_map", "map_tasks", "mapping_backends", "parallelism",
           "readonly_views", "run_serially", "task_labels", "task_seeds", "task_timeout"]


def mapping_backends() -> list[str]:
    """Names of the registered backends that can map tasks, in registration order."""
    return [name for name, backend in get_registry().backends.items() if backend.map is not None]


def backend_for_map(name: str) -> Backend:
    """The backend that will run a map, or a one-line error saying why ``name`` cannot."""
    backend = registered_backend(name)
    if backend.map is None:
        raise UnknownBackendError(f"backend {name!r} cannot map tasks; backends that can: "
                                  f"{', '.join(mapping_backends()) or 'none'}")
    status = probe(backend)
    if not status.available:
        raise BackendUnavailableError(f"backend {name!r} is unavailable here: {status.reason}")
    return backend


def map_tasks(fn: TaskFn, tasks: Sequence[Any], *, shared: Mapping[str, np.ndarray] | None = None,
              seed: int | None = None, labels: Sequence[str] | None = None, backend: str = "process",
              on_result: ResultCallback | None = None, timeout: float | None = None,
              warm_up: Callable[[], object] | None = None, **options: Any) -> list[Any]:
    """Run ``fn(task, shared, seed)`` for every task on ``backend``; results in task order.

    - ``fn`` must be importable by name (a module-level function), since
      workers in other processes or machines run it.
    - ``shared`` arrays are sent once and arrive read-only.
    - With ``seed``, task ``i`` gets the ``i``-th child of
      ``SeedSequence(seed)``, exactly as :func:`run_serially` does.
    - ``labels`` name the tasks in errors (default: each task's short repr).
    - ``on_result(index, result)`` runs in the calling process as each task
      completes, in completion order: for checkpoints and progress.
    - ``timeout``: seconds one task may run (default ``CROSSOVER_TASK_TIMEOUT``,
      else no limit). A task past it raises
      :class:`~core.errors.TaskTimeoutError` and its worker is stopped. A
      backend enforces it if its ``map`` takes ``timeout`` (the process pool
      does); an explicit ``timeout`` on one that cannot is an error, the
      variable's default a warning.
    - ``warm_up``: a module-level function that loads what the tasks need in
      a worker (their compiled kernels). A backend whose ``map`` takes it
      runs it once in every worker before the first map that names it, so
      that a map of a few tasks never meets a cold worker (the process pool
      does: it cannot choose which worker takes a task); others ignore it.
    - ``options`` go to the backend's own ``map`` unchanged (``workers=`` for
      the process pool).

    A failing task raises :class:`~core.errors.TaskFailedError` and a lost
    worker :class:`~core.errors.WorkerCrashedError`; both name the task and
    keep the finished results. An unknown backend, one without a ``map``, or
    one unavailable here raises before any task runs.
    """
    if warm_up is not None and not callable(warm_up):
        raise fail("warm_up", warm_up, "must be a module-level function taking no arguments, or None")
    runner = backend_for_map(backend)
    limit = task_timeout(timeout)
    if limit is not None:
        if _takes(runner.map, "timeout"):
            options["timeout"] = limit
        elif timeout is not None:
            raise UnknownBackendError(f"timeout={timeout!r} is invalid with backend {backend!r}: its map cannot "
                                      f"stop a task; backends that can: {', '.join(_timing_backends()) or 'none'}")
        else:
            warnings.warn(f"{TIMEOUT_VARIABLE}={limit:g} is not enforced on backend {backend!r}: its map cannot "
                          f"stop a task", RuntimeWarning, stacklevel=2)
    if warm_up is not None and _takes(runner.map, "warm_up"):
        options["warm_up"] = warm_up
    try:
        return runner.map(fn, tasks, shared=shared, seed=seed, labels=labels, on_result=on_result, **options)
    finally:
        host_load.forget()  # the workers' CPU time was this map's: no reason for the next kernel to yield cores


def _takes(mapper: Any, name: str) -> bool:
    """Whether a backend's ``map`` accepts ``name`` (third parties' maps written before it existed do not)."""
    try:
        parameters = inspect.signature(mapper).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _timing_backends() -> list[str]:
    return [name for name, backend in get_registry().backends.items()
            if backend.map is not None and _takes(backend.map, "timeout")]


def parallelism(backend: str) -> int:
    """How many tasks ``backend`` runs at once (the pool's workers, the cluster's slots)."""
    runner = registered_backend(backend)
    if runner.parallelism is None:
        able = [name for name, b in get_registry().backends.items() if b.parallelism is not None]
        raise UnknownBackendError(f"backend {backend!r} does not run tasks in parallel; backends that do: "
                                  f"{', '.join(able) or 'none'}")
    return max(1, int(runner.parallelism()))
