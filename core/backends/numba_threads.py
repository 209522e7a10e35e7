"""The ``numba`` backend: JIT-compiled CPU kernels on Numba's thread pool.

Kernels are written in the plugins with :func:`jit` so that every plugin
gets the same compilation options: an on-disk cache (compiling costs seconds
and is the backend's one-off cost) and ``parallel=True`` only where asked,
because a tiny problem runs faster serially than the thread pool starts.

Importing this module bounds how long idle OpenMP threads spin
(:mod:`core.backends.openmp_spin`): spinning threads stalled small kernels
for a whole time slice whenever anything else wanted the cores.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from core.backend import Availability, Backend, host_free_memory, usable_cores
from core.backends import host_load, openmp_spin
from core.backends.core_lending import cores_for_this_task

# here, at import: every process of crossover's (the caller, a pool or dask worker) imports this module
# before any Numba kernel runs, and the OpenMP runtime reads the settings once, when Numba loads it
openmp_spin.limit_spinning()


def jit(parallel: bool = False, **options: Any) -> Callable:
    """``numba.njit`` with crossover's defaults (cached, fastmath off for reproducibility)."""
    import numba

    return numba.njit(cache=True, parallel=parallel, **options)


def threads() -> int:
    import numba

    return int(numba.get_num_threads())


def pool_size() -> int:
    """The size of Numba's thread pool, as Numba will choose it, without importing Numba (for features).

    ``NUMBA_NUM_THREADS`` when set (a bad value falls back to the default, Numba itself will report it),
    else the cores this process may run on.
    """
    value = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, usable_cores())


def use_idle_cores() -> int:
    """Before a parallel kernel: the thread count it may use now, taking idle workers' cores and leaving busy ones.

    Inside a task of a local map (a process-pool task, or one on a dask
    cluster this process started) Numba is set to the number of cores
    :func:`core.backends.core_lending.cores_for_this_task` grants (one while
    other tasks still wait), and that is returned. Elsewhere nothing is set,
    and the answer is Numba's thread count less the cores other processes
    keep busy (:func:`core.backends.host_load.idle_cores`): beside one
    CPU-bound process a two-thread kernel on the 2-core VM waited out time
    slices at its barriers. Only for kernels whose result does not depend
    on the thread count (private partial sums, per-item random streams):
    it changes their speed, never their answer. A kernel that knows its
    parallel items asks :func:`threads_for` instead.
    """
    import numba

    lent = _take_lent_cores()
    return lent if lent is not None else min(int(numba.get_num_threads()), host_load.idle_cores())


def _take_lent_cores() -> int | None:
    """Inside a task of a local map: set Numba to the cores lent to it now, and return that count; else None."""
    cores = cores_for_this_task()
    if cores is None:
        return None
    import numba

    numba.set_num_threads(min(cores, numba.config.NUMBA_NUM_THREADS))
    return int(numba.get_num_threads())


def threads_for(work_items: int) -> int:
    """The threads a kernel of ``work_items`` parallel items runs on now: at most one an item, and the idle
    cores (:func:`use_idle_cores`) where its items divide over them about as well as over all of Numba's threads.

    A kernel split into as many blocks as threads (``ml.linreg``'s 16 on
    the 16-core H200 host) would take twice as long on 15: one thread then
    runs two blocks. Such a kernel keeps its threads beside light load
    (a pool's workers spinning down after a map used 0.9 of a core there),
    where a single competitor cost nothing measurable (1.0-1.1x); a kernel
    of many small items (1,518 walkers) loses only the yielded share.
    """
    items = max(1, int(work_items))
    lent = _take_lent_cores()
    if lent is not None:
        return min(items, lent)
    import numba

    threads = min(items, int(numba.get_num_threads()))
    idle = host_load.idle_cores()
    return idle if idle < threads and _divides_as_well(items, idle, threads) else threads


def _divides_as_well(items: int, fewer: int, more: int) -> bool:
    """Whether the busiest of ``fewer`` threads has at most its share of the work on ``more`` (5 % slack)."""
    return math.ceil(items / fewer) <= math.ceil(items / more) * more / fewer * 1.05


@contextmanager
def threads_at_most(work_items: int) -> Iterator[int]:
    """Run the block's kernels on :func:`threads_for` ``work_items`` threads (the kernel's parallel items);
    yields the thread count, and restores the old one after.

    A thread without an item still joins every parallel region's fork and
    join: on a 16-core host a 1-block pass paid ~20 us a region for 15 idle
    threads, more than its work. A lent thread has also slept while its
    worker was idle, and waking it costs more than a small kernel gains: on
    the 2-core VM a 366-particle common-noise path took 10.6 ms on two lent
    threads and 5.8 ms on one, and on the 16-core H200 host a 2-path map
    took 30 ms where one in-process solve took 11 ms. Only for kernels whose
    answer does not depend on the thread count.
    """
    import numba

    before = int(numba.get_num_threads())
    threads = threads_for(work_items)
    if threads == before == int(numba.get_num_threads()):  # (lending may have set it) setting costs a
        # microsecond a call, twice, and most calls keep the count
        yield threads
        return
    try:
        numba.set_num_threads(threads)
        yield threads
    finally:
        numba.set_num_threads(before)


_BLAS: Any = None  # a threadpoolctl controller, made once: listing the loaded libraries costs milliseconds


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block's BLAS calls (a NumPy matrix product) on one thread, beside Numba's kernels.

    OpenBLAS's threads spin for a while after every call, waiting for the
    next: on the 16-core host, a 16-thread product before an 8-thread Numba
    kernel left that kernel sharing its cores with 15 spinning threads, and
    a fit of 8 spectra took 80 ms instead of 17. A Numba path keeps its
    parallelism in Numba, where the thread count is set on purpose.
    """
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    with _BLAS.limit(limits=1, user_api="blas"):
        yield


def start() -> None:
    """The backend's one-off in a process: import Numba and start its thread pool.

    Both are paid once per process whichever kernel runs first, so they are
    the backend's start, not any one implementation's JIT: without this,
    the first variant measured would carry them and its siblings would look
    free to start.
    """
    from core.backends import numba_warmup

    numba_warmup.spin_up_threads()


def _probe() -> Availability:
    if importlib.util.find_spec("numba") is None:
        return Availability(False, "numba is not installed (pip install numba)")
    return Availability(True)


def _describe() -> dict[str, Any]:
    import numba

    info: dict[str, Any] = {"device": "cpu", "numba": numba.__version__, "threads": threads(),
                            "openmp_spin": openmp_spin.describe(),
                            "yield_busy_cores": host_load.enabled()}
    try:
        info["threading_layer"] = numba.threading_layer()
    except ValueError:  # only known after the first parallel kernel ran
        info["threading_layer"] = "not yet chosen"
    return info


BACKEND = Backend(
    name="numba",
    summary="Numba JIT kernels on CPU threads",
    probe=_probe,
    describe=_describe,
    simplicity=10,
    free_memory=host_free_memory,
    start=start,
    threads=pool_size,
)
