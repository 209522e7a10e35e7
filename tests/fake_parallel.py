"""A fake parallel backend, ``fake``: a third party's task map, for tests.

It runs tasks on a thread pool, submitted in reverse order, so results
complete out of order and nothing can rely on the process pool's own ways.
It keeps the task-map contract that every parallel backend keeps: task
``i`` gets the ``i``-th child of ``SeedSequence(seed)`` (``task_seeds``),
shared arrays arrive read-only, ``on_result`` runs in the calling thread as
tasks complete, results come back in task order, and a failing task raises
``TaskFailedError`` naming it with the finished results kept.

Use it in any test (with the ``fresh_registry`` fixture, so the backend is
gone afterwards)::

    import fake_parallel

    def test_mine(fresh_registry):
        fake_parallel.register()
        core.tasks.map_tasks(fn, tasks, seed=1, backend=fake_parallel.NAME)

Every call of the fake map is logged in :data:`CALLS` (the number of tasks),
so a test can check that its work really went through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import numpy as np

import core
from core.seeded_tasks import ResultCallback, TaskFn, readonly_views, task_labels, task_seeds

NAME = "fake"
THREADS = 3
CALLS: list[int] = []


def fake_map(fn: TaskFn, tasks: Sequence[Any], *, shared: Mapping[str, np.ndarray] | None = None,
             seed: int | None = None, labels: Sequence[str] | None = None,
             on_result: ResultCallback | None = None) -> list[Any]:
    tasks = list(tasks)
    labels = task_labels(tasks, labels)
    CALLS.append(len(tasks))
    views, seeds = readonly_views(shared), task_seeds(seed, len(tasks))
    results: list[Any] = [None] * len(tasks)
    failures: dict[int, BaseException] = {}
    with ThreadPoolExecutor(THREADS) as pool:
        futures = {pool.submit(fn, tasks[i], views, seeds[i]): i for i in reversed(range(len(tasks)))}
        for future in as_completed(futures):
            i = futures[future]
            if future.exception() is not None:
                failures[i] = future.exception()
                continue
            results[i] = future.result()
            if on_result is not None:
                on_result(i, results[i])
    if failures:
        i = min(failures)
        raise core.TaskFailedError(f"task {i} ({labels[i]}) failed: {failures[i]}", i, results)
    return results


BACKEND = core.Backend(
    name=NAME,
    summary="fake parallel backend: tasks on a thread pool, in reverse order",
    probe=lambda: core.Availability(True),
    simplicity=35,
    map=fake_map,
    parallelism=lambda: THREADS,
)


class FakeParallelPlugin:
    """The plugin object: it only adds the backend."""

    @core.hookimpl
    def crossover_backends(self) -> list:
        return [BACKEND]


def register() -> str:
    """Register the fake backend in the current registry; returns its name."""
    core.register(FakeParallelPlugin(), name="fake_parallel")
    return NAME
