"""Task functions for the process-backend tests; workers import them by name."""

from __future__ import annotations

import os
import time


def square_after_sleep(task, shared, seed):
    value, delay = task
    time.sleep(delay)
    return value * value


def die_on(task, shared, seed):
    value, fatal = task
    if value == fatal:
        os._exit(3)  # kill the worker outright: no exception, no cleanup
    time.sleep(0.05)
    return value


def raise_on(task, shared, seed):
    value, bad = task
    if value == bad:
        raise ValueError(f"bad value {value}")
    return value


def random_draws(task, shared, seed):
    import numpy as np

    return np.random.default_rng(seed).standard_normal(task).tolist()


def read_shared(task, shared, seed):
    array = shared["data"]
    return float(array[task]), array.flags.writeable, type(array.base).__name__, os.getpid()


def thread_limits(task, shared, seed):
    from threadpoolctl import threadpool_info

    return [p["num_threads"] for p in threadpool_info()], os.environ.get("NUMBA_NUM_THREADS")
