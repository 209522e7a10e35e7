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
