"""Lending idle workers' cores to a map's last tasks, for every backend whose workers share this host.

A map of a few long tasks per worker ends with most workers idle while the
last tasks run on one core each. So each task is marked started and
finished in a shared-memory array of the map's task states (created by the
calling process, one ``int8`` a task: 0 waiting, :data:`STARTED`,
:data:`FINISHED`), and a running task asks :func:`cores_for_this_task`,
between its parallel kernels, how many cores it may use now
(:func:`core.backends.numba_threads.use_idle_cores` does).

Why each choice:

- *a snapshot, not a lock*: a task reads the markers when it asks; a task
  that starts or ends a moment later changes the next answer, never a
  kernel in flight, and no worker ever waits for another.
- *workers start with a Numba pool sized for the cores they may be lent*
  (:func:`numba_pool_size`) but run one thread: Numba sizes its pool once,
  when it is imported, and can only use fewer threads later, never more.
- *the switch is read in the calling process* (:func:`lendable_cores`):
  workers keep the environment they started with.
- *only where the workers share this host*: the process pool, and a dask
  ``LocalCluster`` this process started. A remote worker can reach neither
  this host's shared memory nor its idle cores.

Lending changes thread counts only, so only kernels whose answer does not
depend on the thread count may take the cores.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from core.backend import usable_cores
from core.validation import env_flag

STARTED, FINISHED = 1, 2
LEND_VARIABLE = "CROSSOVER_LEND_IDLE_CORES"

# In a worker, while a task of a lending map runs: its map's task states, its index, the cores the map may lend.
_states: np.ndarray | None = None
_index = 0
_lendable = 1


def lendable_cores(workers: int) -> int:
    """Cores a map on ``workers`` local workers may share out: theirs, or 1 with ``CROSSOVER_LEND_IDLE_CORES=0``.

    At most the cores this process may use: 8 workers on 2 cores lending 8
    would give each of a map's 2 tasks 4 threads on a core, and a 2-path
    common-noise solve took 42 ms instead of 29 on the 2-core VM. Called in
    the calling process, once per map, so that the switch takes effect at
    the next map.
    """
    return min(workers, usable_cores()) if env_flag(LEND_VARIABLE, default=True) else 1


def numba_pool_size(workers: int) -> int:
    """``NUMBA_NUM_THREADS`` for a worker of ``workers`` on this host: room for every core it may be lent."""
    return max(1, min(workers, os.cpu_count() or 1))


@contextmanager
def running_task(states: np.ndarray, index: int, lendable: int) -> Iterator[None]:
    """Worker side: run the block as task ``index`` of a lending map.

    Marks the task started, lets :func:`cores_for_this_task` answer for it,
    and afterwards sets Numba back to one thread (the cores lent to this
    task go back before the worker's next one) and marks it finished.
    """
    global _states, _index, _lendable
    states[index] = STARTED
    _states, _index, _lendable = states, index, lendable
    try:
        yield
    finally:
        _states = None
        if "numba" in sys.modules:  # only if the task loaded it: importing Numba here would cost a second
            sys.modules["numba"].set_num_threads(1)
        states[index] = FINISHED


def cores_for_this_task() -> int | None:
    """How many cores the running task of a lending map may use now; None outside one.

    One while any task of the map still waits for a worker. After that, the
    workers' cores are shared among the tasks still running: with 16 workers
    and 3 tasks left, one may use 6 and two 5. The spare cores of an uneven
    split go to the tasks that started last, which have the most work left.
    Tasks ask between their parallel kernels; the answer is a snapshot of
    the markers, not a lock.
    With ``CROSSOVER_LEND_IDLE_CORES=0`` in the calling process every task
    keeps one core (to measure what lending gains).
    """
    if _states is None:
        return None
    if np.any(_states == 0):
        return 1
    running = np.flatnonzero(_states == STARTED)
    if running.size >= _lendable:  # this task is among them, so there is at least one
        return 1
    later = int(np.count_nonzero(running > _index))  # tasks are handed out in index order
    base, spare = divmod(_lendable, running.size)
    return base + (1 if later < spare else 0)
