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
    import numba
    from threadpoolctl import threadpool_info

    return [p["num_threads"] for p in threadpool_info()], numba.get_num_threads()


def cores_before_and_after(task, shared, seed):
    """(cores granted at start, Numba threads at start, cores granted after sleeping ``task`` s, threads then)."""
    from core.backends import numba_threads, process_pool

    first = process_pool.cores_for_this_task(), numba_threads.threads()
    time.sleep(task)
    return (*first, process_pool.cores_for_this_task(), numba_threads.use_idle_cores())


def pid_after_sleep(task, shared, seed):
    time.sleep(task)
    return os.getpid()


def pool_worker_flag(task, shared, seed):
    return os.environ.get("CROSSOVER_POOL_WORKER")


def weighted_draws(task, shared, seed):
    """Draws scaled by a shared array: depends on the seed, the task and the shared input."""
    import numpy as np

    return (np.random.default_rng(seed).standard_normal(task) * shared["weights"][:task]).tolist()
