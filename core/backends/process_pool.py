"""The ``process`` backend: one persistent local pool of worker processes.

Why each choice:

- *forkserver* (spawn where unavailable): OpenMP, Numba's thread pool and
  CUDA are not fork-safe, so workers never fork a threaded parent.
- *one BLAS and one Numba thread per worker*: N workers times N threads each
  would oversubscribe the cores and run slower than either alone. Once no
  task waits for a worker, though, the idle workers' cores are lent to the
  tasks still running (:mod:`core.backends.core_lending`), so that a map's
  last few long tasks do not run on one core each while the rest sit idle.
- *shared memory for large inputs*: pickling a 100 MB array to every task
  costs more than most tasks do.
- *workers keep the memory their tasks free* (:mod:`core.backends.worker_memory`):
  glibc unmaps every freed block above 32 MiB, so a task's large
  temporaries were faulted in afresh at every step, in every worker at
  once (``spectra.fit`` in 64-spectrum chunks ran at half its speed on 2
  workers).
- *a start/finish marker per task in shared memory*: when a worker dies the
  executor only says "broken pool"; the markers tell which task was running.
- *results handed over as they complete* (``on_result``): a long map can
  checkpoint or show progress without waiting for its slowest task.
- *workers start without the caller's main script* (:mod:`core.backends.pool_main`):
  a script without a ``__main__`` guard would otherwise rerun in every worker.
- *workers exit when the caller does*, however it dies
  (:mod:`core.backends.pool_lifeline`), and so do the forkserver and the
  resource tracker.
- *a task timeout* (``timeout=``, default ``CROSSOVER_TASK_TIMEOUT``), and
  an interrupted map (Ctrl-C, a failing ``on_result``) lets running tasks
  finish for a short grace, then kills their workers: a hung task never
  hangs the caller, at the map or at exit. The next map starts a fresh pool.
- *exceptions that cannot be pickled* come back as their type name and
  message (:class:`~core.errors.UnpicklableTaskError`), not as a dead worker.

Plugins never call this module: they call :func:`core.tasks.map_tasks`,
which reaches :func:`map_tasks` here through the ``map`` of :data:`BACKEND`.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_sentinels
from typing import Any

import numpy as np

from core.backend import Availability, Backend, host_free_memory, usable_cores
from core.backends import core_lending, host_load, pool_lifeline, pool_main, worker_memory
from core.backends.core_lending import STARTED
from core.errors import ProblemError, TaskFailedError, TaskTimeoutError, UnpicklableTaskError, WorkerCrashedError
from core.seeded_tasks import ResultCallback, TaskFn, task_labels, task_seeds, task_timeout
from core.validation import env_flag, fail

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")

# a worker waits this long at most for its peers to check in (a start never hangs)
_START_TIMEOUT_SECONDS = 60.0
# an interrupted map, or the exit, waits this long for running tasks before it kills their workers
_GRACE_SECONDS = 1.0
# how often a map with a timeout looks at which tasks have started
_POLL_SECONDS = 0.05

_executor: ProcessPoolExecutor | None = None
_executor_workers = 0
_started: ProcessPoolExecutor | None = None  # the pool whose every worker is known to be up


def default_workers() -> int:
    """Workers to start: ``CROSSOVER_WORKERS`` if set (an integer >= 1), else the usable cores."""
    configured = os.environ.get("CROSSOVER_WORKERS", "").strip()
    if configured:
        if not (configured.isascii() and configured.isdigit()) or int(configured) < 1:
            raise fail("CROSSOVER_WORKERS", os.environ["CROSSOVER_WORKERS"], "must be an integer >= 1, or unset")
        return int(configured)
    return usable_cores()


def start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def get_executor(workers: int | None = None) -> ProcessPoolExecutor:
    """The shared pool, created on first use and rebuilt if the size changes or it broke."""
    global _executor, _executor_workers
    pool_main.refuse_pool_while_importing_main()
    workers = workers or default_workers()
    if _executor is not None and (_executor_workers != workers or _is_broken(_executor)):
        shutdown()
    if _executor is None:
        context = pool_main.pool_context(start_method())
        pin = env_flag("CROSSOVER_PIN_WORKERS")
        counter = context.Value("i", 0) if pin and hasattr(os, "sched_setaffinity") else None
        _executor = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                                        initargs=(counter, workers, pool_lifeline.caller_lifeline(context),
                                                  worker_memory.wanted()))
        _executor_workers = workers
    return _executor


def shutdown() -> None:
    """Stop the pool's workers; the next map starts a fresh pool."""
    global _executor, _started
    if _executor is not None:
        _executor.shutdown(wait=True, cancel_futures=True)
        _executor = None
    _started = None


def _kill_workers() -> None:
    """Stop the pool's workers now, whatever they run (a hung or interrupted task); the next map starts afresh."""
    global _executor, _started
    executor, _executor, _started = _executor, None, None
    if executor is None:
        return
    processes = _processes_of(executor)
    for process in processes:
        process.kill()  # SIGKILL: a hung task may ignore anything milder, and it owns nothing to clean up
    executor.shutdown(wait=False, cancel_futures=True)  # the executor sees them gone and fails their futures
    _all_exited(processes, _GRACE_SECONDS)


def _shutdown_at_exit() -> None:
    """At exit: let running tasks finish for a short grace, then kill their workers (never wait for a hung one)."""
    if _executor is None:
        return
    processes = _processes_of(_executor)
    _executor.shutdown(wait=False, cancel_futures=True)
    if not _all_exited(processes, _GRACE_SECONDS):
        _kill_workers()


def _processes_of(executor: ProcessPoolExecutor) -> list:
    # the executor's own table of its workers (private; Python 3.14 adds a public kill_workers)
    return list((getattr(executor, "_processes", None) or {}).values())


def _all_exited(processes: list, seconds: float) -> bool:
    """Wait up to ``seconds`` for every process to exit; whether they all did."""
    deadline = time.monotonic() + seconds
    pending = [process.sentinel for process in processes]
    while pending and (left := deadline - time.monotonic()) > 0:
        ready = wait_for_sentinels(pending, timeout=left)  # returns as soon as any one is ready
        pending = [sentinel for sentinel in pending if sentinel not in ready]
    return not pending


def start_pool(workers: int | None = None) -> None:
    """Start the pool and return once every worker process is up and initialised.

    The executor starts workers on demand, one per task that finds none
    idle, so a first map would pay their start-up inside its own time.
    The core calls this (as the backend's ``start``) to time that one-off
    cost on its own, once per process. Each worker runs one check-in task
    that waits until all have checked in, so no worker can take two and
    every worker must have started.
    """
    global _started
    executor = get_executor(workers)
    if _started is executor:
        return
    _on_every_worker(executor, None)
    _started = executor


_warmed: tuple[ProcessPoolExecutor | None, set[str]] = (None, set())  # the pool, and the warm-ups it ran


def warm_every_worker(executor: ProcessPoolExecutor, warm_up: Callable[[], object]) -> None:
    """Run ``warm_up`` once in every worker of the pool, all at once, the first time a map names it.

    The executor gives a task to whichever worker is idle, so the maps of a
    few tasks (a two-path solve, timed over and over in calibration) keep
    meeting workers that have not yet loaded the tasks' compiled kernels,
    and a 16-worker pool took 0.45 s for a solve that takes 0.03 s warm.
    """
    global _warmed, _started
    name = f"{warm_up.__module__}.{warm_up.__qualname__}"
    if _warmed[0] is not executor:
        _warmed = (executor, set())
    if name in _warmed[1]:
        return
    _on_every_worker(executor, warm_up)
    _warmed[1].add(name)
    _started = executor


def _on_every_worker(executor: ProcessPoolExecutor, job: Callable[[], object] | None) -> None:
    """One check-in task per worker, each waiting for all to check in (so no worker takes two), then ``job``."""
    count = _executor_workers
    marker = shared_memory.SharedMemory(create=True, size=count)
    try:
        states = np.ndarray((count,), np.int8, buffer=marker.buf)
        states[:] = 0
        del states  # the block cannot be closed while a view of it lives
        futures = [executor.submit(_check_in, i, marker.name, count, job) for i in range(count)]
        for future in futures:
            future.result()
    except BrokenProcessPool as exc:
        shutdown()
        raise WorkerCrashedError(f"a worker process died while the pool of {count} was starting: {exc}",
                                 -1, []) from exc
    except BaseException:  # interrupted: the check-ins must not keep the exit waiting
        _kill_workers()
        raise
    finally:
        _release([marker])
        host_load.forget()  # the workers' start and warm-up were this process's doing, not another's load


def _check_in(index: int, marker: str, count: int, job: Callable[[], object] | None = None) -> int:
    """Worker side of :func:`_on_every_worker`: mark this worker up, wait for the others, run ``job``."""
    states = np.ndarray((count,), np.int8, buffer=_attach(marker).buf)
    states[index] = STARTED
    deadline = time.monotonic() + _START_TIMEOUT_SECONDS
    while not np.all(states) and time.monotonic() < deadline:
        time.sleep(0.001)
    if job is not None:
        try:
            job()
        except Exception:  # a warm-up only saves time: a task that needs what failed here says so itself
            pass
    return os.getpid()


# concurrent.futures joins its executors' threads at exit, before atexit handlers run, and that join
# waits for every running task; the exit hook must come first, so it goes where that one is
# registered (threading's own exit hooks run in reverse order), and to atexit where that is missing.
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_shutdown_at_exit)
else:  # pragma: no cover
    atexit.register(_shutdown_at_exit)


def _is_broken(executor: ProcessPoolExecutor) -> bool:
    return bool(getattr(executor, "_broken", False))


def _init_worker(counter=None, workers: int = 1, lifeline: Connection | None = None,
                 keep_memory: bool = False) -> None:
    """Tie the worker's life to the caller's, and pin it to one BLAS and one Numba thread (see module docstring).

    With ``keep_memory`` the worker keeps the memory its tasks free
    (:mod:`core.backends.worker_memory`), so that large temporaries are
    reused rather than faulted in afresh by every task.

    Numba's pool is sized for ``workers`` threads but set to use one: a task
    may raise it later, when :func:`core.backends.core_lending.cores_for_this_task`
    says cores are idle.

    With ``CROSSOVER_PIN_WORKERS=1`` each worker is also bound to its own
    core (worker i to the i-th usable core), so the scheduler never moves a
    busy worker and its caches between cores.

    Ctrl-C in a terminal reaches the whole process group: workers ignore it,
    and the caller, which decides, stops them.
    """
    if lifeline is not None:
        pool_lifeline.hold_on(lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if keep_memory:
        worker_memory.keep_freed_memory()
    if counter is not None:
        with counter.get_lock():
            index = counter.value
            counter.value += 1
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[index % len(cores)]})
    for variable in _THREAD_VARIABLES:
        os.environ[variable] = "1"
    os.environ["NUMBA_NUM_THREADS"] = str(core_lending.numba_pool_size(workers))
    try:
        import numba  # before the limits below, so that they cover the OpenMP runtime numba loads
    except ImportError:
        pass
    else:
        numba.set_num_threads(1)
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    # a worker's solves are parts of the caller's: the timing history must not store them as whole solves
    os.environ["CROSSOVER_POOL_WORKER"] = "1"


# -- shared memory -----------------------------------------------------------

ArrayHandle = tuple[str, tuple[int, ...], str]


def _share(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, ArrayHandle], list[shared_memory.SharedMemory]]:
    handles, blocks = {}, []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        block = shared_memory.SharedMemory(create=True, size=max(array.nbytes, 1))
        blocks.append(block)
        np.ndarray(array.shape, array.dtype, buffer=block.buf)[...] = array
        handles[name] = (block.name, array.shape, array.dtype.str)
    return handles, blocks


def _release(blocks: list[shared_memory.SharedMemory]) -> None:
    for block in blocks:
        try:
            block.close()
            block.unlink()
        except (FileNotFoundError, BufferError):
            pass


# A worker keeps its attachments open: a result may still hold a view of the
# buffer while it is being pickled back, and closing it then would fail.
_attached: dict[str, shared_memory.SharedMemory] = {}


def _attach(handle_name: str) -> shared_memory.SharedMemory:
    if handle_name not in _attached:
        if len(_attached) >= 16:
            for stale in list(_attached)[:8]:
                try:
                    _attached.pop(stale).close()
                except BufferError:
                    pass
        _attached[handle_name] = shared_memory.SharedMemory(name=handle_name)
    return _attached[handle_name]


def _views(handles: Mapping[str, ArrayHandle]) -> dict[str, np.ndarray]:
    views = {}
    for name, (block_name, shape, dtype) in handles.items():
        view = np.ndarray(shape, np.dtype(dtype), buffer=_attach(block_name).buf)
        view.setflags(write=False)
        views[name] = view
    return views


def _run_task(payload: bytes, main: pool_main.MainRef | None, index: int, handles: Mapping[str, ArrayHandle],
              marker: str, count: int, lendable: int) -> Any:
    """Worker side of a map: unpickle task ``index`` (see :func:`_pack`), run it, mark it started and finished."""
    states = np.ndarray((count,), np.int8, buffer=_attach(marker).buf)
    with core_lending.running_task(states, index, lendable):
        try:
            fn, task, seed = pool_main.loads_task(payload, main)
            return fn(task, _views(handles), seed)
        except Exception as exc:
            stand_in = _unsendable(exc)
            if stand_in is None:
                raise
            raise stand_in from None


def _unsendable(exc: Exception) -> UnpicklableTaskError | None:
    """None if ``exc`` survives the trip to the caller; else a stand-in with its type name and message.

    The executor would pickle the exception to send it back, and one that
    fails to pickle or unpickle (a required ``__init__`` argument, a lock
    in an attribute) would break the pool and read as a worker crash.
    """
    try:
        pickle.loads(pickle.dumps(exc))
        return None
    except Exception:
        try:
            message = str(exc)
        except Exception:
            message = "(its message could not be formatted)"
        remote = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return UnpicklableTaskError(f"{type(exc).__name__}: {message}", remote)


# -- the map -----------------------------------------------------------------

def map_tasks(fn: TaskFn, tasks: Sequence[Any], *, shared: Mapping[str, np.ndarray] | None = None,
              seed: int | None = None, labels: Sequence[str] | None = None,
              on_result: ResultCallback | None = None, workers: int | None = None,
              timeout: float | None = None, warm_up: Callable[[], object] | None = None) -> list[Any]:
    """Run ``fn(task, shared, seed)`` for every task on the pool; results in task order.

    ``fn`` must be importable (a module-level function; one defined in the
    main script works where the script has an ``if __name__ == "__main__":``
    guard). ``shared`` arrays travel once through shared memory and arrive
    read-only. With ``seed``, task ``i`` gets the ``i``-th child of
    ``SeedSequence(seed)``, exactly as :func:`core.tasks.run_serially` does.
    ``on_result(index, result)`` runs here, in the calling process, as each
    task completes (completion order). ``timeout`` is the seconds one task
    may run (default ``CROSSOVER_TASK_TIMEOUT``, else no limit).

    A failing task raises :class:`TaskFailedError`, a worker that dies
    :class:`WorkerCrashedError`, a task past the timeout
    :class:`TaskTimeoutError` (its worker is killed); all name the task and
    keep the results of every task that finished. ``workers`` overrides the
    pool's size (tests; otherwise :func:`default_workers`).
    """
    tasks = list(tasks)
    labels = task_labels(tasks, labels)
    limit = task_timeout(timeout)
    seeds = task_seeds(seed, len(tasks))
    payloads, main = _pack(fn, tasks, seeds, labels)
    handles, blocks = _share(shared or {})
    marker = shared_memory.SharedMemory(create=True, size=max(len(tasks), 1))
    states = np.ndarray((len(tasks),), np.int8, buffer=marker.buf)
    states[:] = 0
    try:
        executor = get_executor(workers)
        if warm_up is not None:
            warm_every_worker(executor, warm_up)
        lendable = core_lending.lendable_cores(_executor_workers)
        futures = {executor.submit(_run_task, payload, main, i, handles, marker.name, len(tasks), lendable): i
                   for i, payload in enumerate(payloads)}
        results, crashed, failures, overdue = _collect(futures, states, on_result, limit)
        if overdue is not None:
            del states
            _kill_workers()
            kept = sum(r is not None for r in results)
            raise TaskTimeoutError(
                f"task {overdue} ({labels[overdue]}) did not finish within the timeout of {limit:g} s "
                f"(timeout= or CROSSOVER_TASK_TIMEOUT); its worker was stopped and {kept} finished results "
                f"were kept", overdue, results, limit)
        if crashed:
            suspects = [i for i in range(len(tasks)) if states[i] == STARTED]
            del states
            shutdown()  # the broken pool is useless; the next map builds a new one
            raise _crash_error(payloads, main, labels, suspects, handles, marker.name, results, workers,
                               on_result, limit)
        if failures:
            i = min(failures)  # the first failing task in the caller's order, whatever finished first
            error = failures[i]
            raise TaskFailedError(f"task {i} ({labels[i]}) failed: {_failure_text(error)}", i, results) from error
        return results
    finally:
        _release([*blocks, marker])


def _pack(fn: TaskFn, tasks: list, seeds: list, labels: list[str]) -> tuple[list[bytes], pool_main.MainRef | None]:
    """Each task pickled here with its function and seed, and where workers find the main script if it needs it.

    Pickled here, not by the executor, so that a task that cannot travel is
    one clear error naming it before anything runs, and so that a worker
    can import the main script before it unpickles a task that needs it.
    """
    payloads, from_main = [], set()
    for i, (task, task_seed) in enumerate(zip(tasks, seeds)):
        try:
            payload, names = pool_main.dumps_task((fn, task, task_seed))
        except Exception as exc:
            raise TaskFailedError(f"task {i} ({labels[i]}) cannot be sent to a worker process: "
                                  f"{type(exc).__name__}: {exc}", i, [None] * len(tasks)) from exc
        payloads.append(payload)
        from_main |= names
    return payloads, (pool_main.main_reference(from_main) if from_main else None)


def _failure_text(error: BaseException) -> str:
    if isinstance(error, UnpicklableTaskError):
        return f"{error} (the exception could not be pickled, so it came back as text)"
    return f"{type(error).__name__}: {error}"


def _collect(futures: dict[Future, int], states: np.ndarray, on_result: ResultCallback | None,
             limit: float | None) -> tuple[list[Any], bool, dict[int, BaseException], int | None]:
    """Results in task order as they complete, whether the pool broke, failed tasks' errors, a task past the timeout.

    With a timeout, a task's clock starts when this process first sees its
    start marker (so a task never gets less than the limit), and collecting
    stops at the first task past it. If ``on_result`` raises, or the caller
    is interrupted, the tasks not yet started are cancelled, the running
    ones get a short grace, and then their workers are killed, before the
    error goes on: a hung task cannot hold up Ctrl-C.
    """
    results: list[Any] = [None] * len(states)
    crashed, failures, overdue = False, {}, None
    # each future reports here as it completes: one pass over the futures, not one per completion
    finished: queue.SimpleQueue[Future] = queue.SimpleQueue()
    for future in futures:
        future.add_done_callback(finished.put)
    running_since: dict[int, float] = {}
    remaining, next_check = len(futures), time.monotonic()
    try:
        while remaining and overdue is None:
            try:
                future = finished.get(timeout=None if limit is None else _POLL_SECONDS)
            except queue.Empty:
                future = None
            if future is not None:
                remaining -= 1
                crashed |= _take(future, futures, results, failures, on_result)
            if limit is not None and not crashed and time.monotonic() >= next_check:
                next_check = time.monotonic() + _POLL_SECONDS
                overdue = _overdue(states, running_since, limit)
        while overdue is not None and not finished.empty():  # results already back are kept, not lost
            _take(finished.get(), futures, results, failures, on_result)
    except BaseException:
        _stop(futures)
        raise
    return results, crashed, failures, overdue


def _take(future: Future, futures: dict[Future, int], results: list, failures: dict[int, BaseException],
          on_result: ResultCallback | None) -> bool:
    """Record a finished task's result or error (streaming a result to ``on_result``); whether the pool broke."""
    i = futures[future]
    error = future.exception()
    if isinstance(error, BrokenProcessPool):
        return True
    if error is not None:
        failures[i] = error
        return False
    results[i] = future.result()
    if on_result is not None:
        on_result(i, results[i])
    return False


def _overdue(states: np.ndarray, running_since: dict[int, float], limit: float) -> int | None:
    """The first running task past ``limit``, timed from when this process first saw it running."""
    now = time.monotonic()
    for i in np.flatnonzero(states == STARTED).tolist():
        if now - running_since.setdefault(i, now) > limit:
            return i
    return None


def _stop(futures: dict[Future, int]) -> None:
    """Cancel the tasks not started; kill the workers of those still running after a short grace."""
    for future in futures:
        future.cancel()
    running = set(futures)
    try:
        running = wait(futures, timeout=_GRACE_SECONDS).not_done
    finally:  # a second Ctrl-C during the grace still kills them
        if running:
            _kill_workers()


def _crash_error(payloads: list[bytes], main: pool_main.MainRef | None, labels: list[str], suspects: list[int],
                 handles: Mapping[str, ArrayHandle], marker: str, results: list, workers: int | None,
                 on_result: ResultCallback | None, limit: float | None) -> WorkerCrashedError:
    """Name the task whose worker died, rerunning suspects alone when several were running."""
    culprits = list(suspects)
    if len(suspects) > 1:
        culprits = []
        for i in suspects:
            try:
                future = get_executor(workers).submit(_run_task, payloads[i], main, i, handles, marker,
                                                      len(payloads), 1)
                results[i] = future.result(timeout=limit)
            except BrokenProcessPool:
                culprits.append(i)
                shutdown()
                continue
            except FutureTimeout:  # hung rather than crashed: not the crash we are naming
                _kill_workers()
                continue
            except Exception:
                continue  # an ordinary failure is not the crash we are naming
            if on_result is not None:
                on_result(i, results[i])
        culprits = culprits or suspects
    if not culprits:
        return WorkerCrashedError("a worker process died before any task started", -1, results)
    first = culprits[0]
    who = ", ".join(f"task {i} ({labels[i]})" for i in culprits)
    return WorkerCrashedError(
        f"a worker process died while running {who}; the pool was rebuilt and "
        f"{sum(r is not None for r in results)} finished results were kept", first, results)


# -- the backend record -------------------------------------------------------

def _probe() -> Availability:
    try:
        import threadpoolctl  # noqa: F401  (needed to pin worker threads)
    except ImportError:
        return Availability(False, "threadpoolctl is not installed")
    try:
        default_workers()
    except ProblemError as exc:  # plan and run then say why, rather than "uncalibrated"
        return Availability(False, str(exc))
    return Availability(True)


def _describe() -> dict[str, Any]:
    return {"device": "cpu", "workers": default_workers(), "start_method": start_method(),
            "threads_per_worker": 1, "cores": os.cpu_count()}


BACKEND = Backend(
    name="process",
    summary="persistent local process pool for batches of independent tasks",
    probe=_probe,
    describe=_describe,
    simplicity=30,
    free_memory=host_free_memory,
    start=start_pool,
    map=map_tasks,
    parallelism=default_workers,
)
