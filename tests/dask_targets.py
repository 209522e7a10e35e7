"""Functions the dask tests run on real workers, which import them by name (``tests`` is on their path)."""

from __future__ import annotations

import time

import numpy as np


def slow_draws(seed: int, count: int, delay: float) -> dict:
    """A sweep point that lasts ``delay`` seconds and is deterministic in its parameters."""
    time.sleep(delay)
    return {"draws": np.random.default_rng(seed).standard_normal(count)}


def seeded_after_sleep(task: tuple[int, float], shared, seed) -> list[float]:
    """A map task whose numbers come only from its seed (the i-th child of the map's SeedSequence)."""
    count, delay = task
    time.sleep(delay)
    return np.random.default_rng(seed).standard_normal(count).tolist()


class Unpicklable(Exception):
    def __init__(self, value: int, lock: object):  # two required arguments: pickle cannot rebuild it
        super().__init__(f"unpicklable {value}")
        self.lock = lock


def raise_unpicklable(task: int, shared, seed) -> int:
    if task == 1:
        import threading

        raise Unpicklable(task, threading.Lock())
    return task


def thread_settings(task: int, shared, seed) -> dict:
    """The thread variables a worker runs with."""
    import os

    from threadpoolctl import threadpool_info

    found = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS",
                                                     "CROSSOVER_POOL_WORKER")}
    return {**found, "blas_threads": sorted({pool["num_threads"] for pool in threadpool_info()})}


def path_when_alone(task: tuple, shared, seed) -> tuple[np.ndarray, int]:
    """A common-noise path (its Numba kernels take any cores lent to it): its M, and the threads they ran on.

    With ``wait``, the path starts only once it may use more than one core
    (the map's other tasks finished), or after 30 s.
    """
    from core.backends import core_lending
    from plugins.mfg.common_noise import path_task

    problem, wait = task
    deadline = time.monotonic() + 30
    while wait and core_lending.cores_for_this_task() == 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    out = path_task((problem, "numba"), shared, seed)
    return out["M"], out["threads"]
