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
    from core.backends import core_lending, numba_threads

    first = core_lending.cores_for_this_task(), numba_threads.threads()
    time.sleep(task)
    return (*first, core_lending.cores_for_this_task(), numba_threads.use_idle_cores())


def pid_after_sleep(task, shared, seed):
    time.sleep(task)
    return os.getpid()


def pool_worker_flag(task, shared, seed):
    return os.environ.get("CROSSOVER_POOL_WORKER")


def weighted_draws(task, shared, seed):
    """Draws scaled by a shared array: depends on the seed, the task and the shared input."""
    import numpy as np

    return (np.random.default_rng(seed).standard_normal(task) * shared["weights"][:task]).tolist()


def hang_on(task, shared, seed):
    """Return ``value`` at once, except when it equals ``hang``: that task never returns.

    ``started``, if given, is a file created when the hanging task starts, so
    that a test in another process knows it is running.
    """
    value, hang, started = task
    if value == hang:
        if started:
            open(started, "w").close()
        while True:
            time.sleep(1)
    return value


def hold_the_gil(task, shared, seed):
    """Create the file ``task``, then sleep an hour inside a C call that keeps the GIL.

    No other thread of the worker (its lifeline watcher included) can run.
    """
    import ctypes

    open(task, "w").close()
    ctypes.PyDLL(None).sleep(3600)  # PyDLL: the call does not release the GIL


def report_blocks_then_hang(task, shared, seed):
    """Write the names of the shared-memory blocks this task sees (atomically) to the file ``task``; then hang."""
    from core.backends import process_pool

    with open(task + ".part", "w") as names:
        names.write("\n".join(process_pool._attached))
    os.replace(task + ".part", task)
    while True:
        time.sleep(1)


class NeedsTwoArguments(Exception):
    """Pickles, but cannot be unpickled: unpickling calls it with one argument."""

    def __init__(self, code, detail):
        super().__init__(f"code {code}: {detail}")


def raise_unpicklable(task, shared, seed):
    """Task ``bad`` raises an exception that cannot make the trip back (``kind``: why not)."""
    import threading

    value, bad, kind = task
    if value == bad:
        if kind == "init":
            raise NeedsTwoArguments(7, "the detail")
        error = ValueError("holds a lock")
        error.lock = threading.Lock()  # locks cannot be pickled
        raise error
    return value


WARM_UPS = 0  # in a worker: how many times warm_up_counter ran there


def warm_up_counter():
    global WARM_UPS
    WARM_UPS += 1
    time.sleep(0.05)


def pid_and_warm_ups(task, shared, seed):
    time.sleep(task)
    return os.getpid(), WARM_UPS


def faults_of_two_arrays(task, shared, seed):
    """Minor page faults of filling an array of ``task`` bytes, freeing it, and filling a second one."""
    import resource

    import numpy as np

    faults = []
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        array = np.ones(task // 8)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del array
    return faults
