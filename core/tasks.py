"""Batches of independent tasks: seeding and the serial reference runner.

A solver that splits its work into tasks writes one task function
``fn(task, shared, seed) -> result`` and hands it either to
:func:`run_serially` (the NumPy reference) or to the process backend's
:func:`~core.backends.process_pool.map_tasks`. Both derive the per-task
random streams the same way, so every task draws the same numbers whatever
the number of workers (results are bit-identical unless a task's own
arithmetic depends on its thread count, as multi-threaded BLAS sums can).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

TaskFn = Callable[[Any, Mapping[str, np.ndarray], "np.random.SeedSequence | None"], Any]


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


def run_serially(fn: TaskFn, tasks: Sequence[Any], *, shared: Mapping[str, np.ndarray] | None = None,
                 seed: int | None = None) -> list[Any]:
    """Run every task in this process, in order; the reference for parallel runners."""
    views = readonly_views(shared)
    return [fn(task, views, s) for task, s in zip(tasks, task_seeds(seed, len(tasks)))]
