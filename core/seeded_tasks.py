"""Seeded batches of independent tasks: the task contract and its serial reference.

A solver that splits its work writes one task function
``fn(task, shared, seed) -> result``. Every runner of such a batch (the
serial loop below, the process pool, a third party's cluster backend) hands
task ``i`` the ``i``-th child of ``SeedSequence(seed)`` and read-only views
of the shared arrays, so every task draws the same numbers wherever it runs
and results are bit-identical across backends (unless a task's own
arithmetic depends on its thread count, as multi-threaded BLAS sums can).

This module sits below the backends and the registry, so that a backend's
mapper can use it without importing :mod:`core.tasks`, which dispatches to
the backends through the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from core.validation import check_float, env_seconds, fail

TaskFn = Callable[[Any, Mapping[str, np.ndarray], "np.random.SeedSequence | None"], Any]
# on_result(index, result): called in the calling process as each task completes
ResultCallback = Callable[[int, Any], None]


# the default of every map's ``timeout``: seconds one task may run (unset: no limit)
TIMEOUT_VARIABLE = "CROSSOVER_TASK_TIMEOUT"


def task_timeout(timeout: float | None = None) -> float | None:
    """Seconds one task of a map may run: ``timeout``, else ``CROSSOVER_TASK_TIMEOUT``, else None (no limit).

    No limit is the default because a fair task may run for hours; the
    variable sets one for every map of a process (a CI job, a service).
    """
    if timeout is not None:
        return check_float("timeout", timeout, minimum=0, strict_minimum=True)
    return env_seconds(TIMEOUT_VARIABLE)


def task_seeds(seed: int | None, n_tasks: int) -> list[np.random.SeedSequence | None]:
    """One independent SeedSequence per task (``SeedSequence.spawn``), or Nones."""
    if seed is None:
        return [None] * n_tasks
    return np.random.SeedSequence(seed).spawn(n_tasks)


def readonly_views(shared: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Read-only views of the shared inputs, as workers see them."""
    views = {}
    for name, array in (shared or {}).items():
        view = np.asarray(array).view()
        view.setflags(write=False)
        views[name] = view
    return views


def task_labels(tasks: Sequence[Any], labels: Sequence[str] | None) -> list[str]:
    """The names errors give the tasks: ``labels``, or each task's short repr."""
    if labels is None:
        return [repr(task)[:60] for task in tasks]
    labels = [str(label) for label in labels]
    if len(labels) != len(tasks):
        raise fail("labels", labels, f"must give one label per task ({len(tasks)})")
    return labels


def run_serially(fn: TaskFn, tasks: Sequence[Any], *, shared: Mapping[str, np.ndarray] | None = None,
                 seed: int | None = None, on_result: ResultCallback | None = None) -> list[Any]:
    """Run every task in this process, in order; the reference for parallel runners."""
    views = readonly_views(shared)
    results = []
    for index, (task, task_seed) in enumerate(zip(tasks, task_seeds(seed, len(tasks)))):
        results.append(fn(task, views, task_seed))
        if on_result is not None:
            on_result(index, results[-1])
    return results
