"""The ``dask`` backend: the tasks of a map on a dask.distributed cluster.

Why each choice:

- *dask is imported on first use only*: importing ``core`` must stay fast and
  must work where dask is not installed; the probe asks whether
  ``distributed`` is installed without importing it.
- *the scheduler is the user's choice*: ``use_scheduler(address)`` (Python),
  ``--scheduler`` (CLI) or ``CROSSOVER_DASK_SCHEDULER``; or the user's own
  ``distributed.Client``, ``use_scheduler(client)``, which crossover uses
  and never closes (it is the user's). Without one the
  backend is unavailable, so auto-selection never starts a cluster nobody
  asked for. ``local`` starts a ``LocalCluster`` of worker processes, one
  thread each, bound to 127.0.0.1, so nothing off this machine can reach it.
- *the connection is the backend's one-off* (``start``): a remote
  scheduler's handshake, or a local cluster's worker start-up, is paid once
  per process, as the process pool's start is.
- *a scheduler that does not answer within a timeout*
  (``CROSSOVER_DASK_TIMEOUT``, default 10 s) is one clear error naming its
  address, never a hang; so is one that stops answering during a map. A
  ``tcp://`` address is first asked for the scheduler's greeting over a
  plain socket, because distributed's own handshake waits for it without a
  timeout (a server that accepts and stays silent, as an HTTP server does,
  hung it for ever) and decodes garbage as a frame size ("Unable to
  allocate 3.07 EiB"); whatever the protocol, the connection runs under a
  deadline of its own.
- *a ``local`` cluster's workers are spawned*, so each imports the caller's
  main script: a script without an ``if __name__ == "__main__":`` guard is
  refused with the process pool's :class:`~core.errors.UnguardedMainError`
  before any worker starts (left to start, each worker reran the script and
  printed its own traceback).
- *shared inputs are scattered once, to every worker* (broadcast), rather
  than sent with each task.
- *tasks are batched*: a dask task costs the scheduler about a millisecond
  and a network round trip, so very short tasks would time the cluster,
  not the work. See :func:`tasks_per_batch` for the rule.
- *a lost worker is Dask's to handle*: the scheduler reruns its tasks on the
  others (up to ``distributed.scheduler.allowed-failures`` times). Seeds
  travel with each task, so a rerun draws the same numbers and the results
  equal :func:`core.seeded_tasks.run_serially`'s.
- *a task's exception comes back as a value*, so that one failure keeps the
  results of the rest of its batch, and Dask does not count it against the
  worker.
- *idle workers lend their cores to the last tasks* on a ``local`` cluster,
  as in the process pool (:mod:`core.backends.core_lending`): its workers
  share this host, its memory and its cores. A remote scheduler's workers
  can reach neither, so there every task keeps one core.

Plugins never call this module: they call :func:`core.tasks.map_tasks`
with ``backend="dask"``.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import math
import os
import pickle
import queue
import re
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from importlib import metadata
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from core.backend import Availability, Backend, usable_cores
from core.backends import core_lending, host_load, pool_main
from core.errors import (
    BackendUnavailableError,
    TaskFailedError,
    UnguardedMainError,
    UnpicklableTaskError,
    WorkerCrashedError,
)
from core.seeded_tasks import ResultCallback, TaskFn, readonly_views, task_labels, task_seeds
from core.validation import check_float, env_seconds, fail

SCHEDULER_VARIABLE = "CROSSOVER_DASK_SCHEDULER"
TIMEOUT_VARIABLE = "CROSSOVER_DASK_TIMEOUT"
LOCAL = "local"
DEFAULT_TIMEOUT_SECONDS = 10.0
# a batch of tasks should keep a worker busy at least this long (see tasks_per_batch)
MIN_BATCH_SECONDS = 0.1
# every worker gets at least this many batches of what is left, so a slow batch leaves a short tail
BATCHES_PER_SLOT = 4
# how often a map looks at whether the scheduler still answers
_POLL_SECONDS = 0.2

_ADDRESS = re.compile(r"^(?:(?P<protocol>tcp|tls|ws|wss|ucx)://)?(?P<host>\[[0-9a-fA-F:]+\]|[^\s:/\[\]]+)"
                      r":(?P<port>\d{1,5})$")
_ALLOWED_ADDRESS = "must be 'local' or a scheduler address host:port (tcp://, tls://, ws://, wss:// or ucx://)"
_ALLOWED_SCHEDULER = _ALLOWED_ADDRESS.replace("must be 'local' or",
                                              "must be 'local', a connected distributed.Client, or")
# a scheduler's greeting (its handshake) is a few hundred bytes in a few frames; far more is not dask talking
_GREETING_MAX_BYTES = 2**20
_GREETING_MAX_FRAMES = 64
# what a connection may take beyond the timeout before it counts as hung (distributed's own retries end first)
_DEADLINE_GRACE_SECONDS = 2.0


class SchedulerUnreachableError(BackendUnavailableError):
    """The dask scheduler did not answer, or stopped answering during a map.

    ``scheduler`` is its address; ``partial_results`` keeps, in task order,
    the results of the map's tasks that finished before it was lost (None
    for the others).
    """

    def __init__(self, message: str, scheduler: str, partial_results: list | None = None):
        super().__init__(message)
        self.scheduler = scheduler
        self.partial_results = partial_results or []


# -- which scheduler ------------------------------------------------------------------

_chosen: str | None = None  # set by use_scheduler(); wins over the environment
_chosen_timeout: float | None = None
_chosen_workers: int | None = None
_users_client: Any = None  # a distributed.Client the user gave use_scheduler(): used, never closed


def use_scheduler(scheduler: Any, *, timeout: float | None = None, workers: int | None = None) -> None:
    """Run the ``dask`` backend on ``scheduler``: an address such as ``tcp://10.0.0.5:8786``, ``local``, or a Client.

    It overrides ``CROSSOVER_DASK_SCHEDULER``; None goes back to it. A
    connected ``distributed.Client`` is used as it is, and crossover never
    closes it (it is the caller's). ``timeout`` is how long to wait for the
    scheduler (and its first worker) to answer; ``workers`` sizes a
    ``local`` cluster (default: the usable cores). A client or cluster this
    module started for another scheduler is closed. Call it before the
    first plan or solve of the process: availability is probed once per
    process (``core.running.forget_probes()`` probes again).
    """
    global _chosen, _chosen_timeout, _chosen_workers, _users_client
    client = scheduler if _is_client(scheduler) else None
    if client is not None:
        address = _client_address(client)
    elif scheduler is None or isinstance(scheduler, str):
        address = None if scheduler is None else normalize_address("scheduler", scheduler)
    else:
        raise fail("scheduler", scheduler, _ALLOWED_SCHEDULER)
    if timeout is not None:
        timeout = check_float("timeout", timeout, minimum=0, strict_minimum=True)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise fail("workers", workers, "must be an integer >= 1 (the size of a local cluster)")
    if workers is not None and address != LOCAL:
        raise fail("workers", workers, "sizes a local cluster only (scheduler='local')")
    if (address, workers) != (_chosen, _chosen_workers) or client is not _users_client:
        shutdown()
    _chosen, _chosen_timeout, _chosen_workers, _users_client = address, timeout, workers, client


def _is_client(value: object) -> bool:
    """Whether ``value`` is a distributed.Client (asked without importing distributed: a user's has imported it)."""
    distributed = sys.modules.get("distributed")
    return distributed is not None and isinstance(value, distributed.Client)


def _client_address(client: Any) -> str:
    """The scheduler address of a user's client, or a clear error for one that is not connected."""
    address = getattr(getattr(client, "scheduler", None), "address", None)
    if client.status != "running" or not isinstance(address, str):
        raise fail("scheduler", client, f"is a distributed.Client that is {client.status}: pass a connected one")
    return address


def normalize_address(field: str, text: object, allowed: str = _ALLOWED_ADDRESS) -> str:
    """``local``, or the address with its protocol (``host:port`` means ``tcp://host:port``); else a clear error."""
    if not isinstance(text, str):
        raise fail(field, text, allowed)
    stripped = text.strip()
    if stripped.lower() == LOCAL:
        return LOCAL
    match = _ADDRESS.match(stripped)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise fail(field, text, allowed)
    return f"{match['protocol'] or 'tcp'}://{match['host']}:{int(match['port'])}"


def scheduler_address() -> str | None:
    """The scheduler the backend runs on: ``use_scheduler``'s (a client's: its scheduler's), else the variable's."""
    if _chosen is not None:
        return _chosen
    text = os.environ.get(SCHEDULER_VARIABLE, "").strip()
    return normalize_address(SCHEDULER_VARIABLE, text) if text else None


def connect_timeout() -> float:
    """Seconds to wait for the scheduler: ``use_scheduler``'s, else ``CROSSOVER_DASK_TIMEOUT``, else 10."""
    if _chosen_timeout is not None:
        return _chosen_timeout
    seconds = env_seconds(TIMEOUT_VARIABLE)
    return DEFAULT_TIMEOUT_SECONDS if seconds is None else seconds


def local_workers() -> int:
    """Workers of a ``local`` cluster: ``use_scheduler(workers=)``, else the usable cores."""
    return _chosen_workers or usable_cores()


def installed() -> bool:
    """Whether dask.distributed can be imported (asked without importing it)."""
    try:
        return importlib.util.find_spec("distributed") is not None
    except (ImportError, ValueError):
        return False


# -- the connection -------------------------------------------------------------------

_client: Any = None  # distributed.Client, once connected
_cluster: Any = None  # the LocalCluster this process started, if any
_connected_to: str | None = None  # the configured address it answers to (``local`` included)
_shown = "?"  # how errors name it: the address, or the local cluster's
_unreachable: str | None = None  # the scheduler this process last failed to reach


def _distributed():
    """The distributed module, imported now (lazily: see the module docstring), or a clear error."""
    try:
        import distributed
    except ImportError as exc:
        raise BackendUnavailableError(f"backend 'dask' needs dask.distributed, which cannot be imported ({exc}); "
                                      "install it from a clone: pip install '.[distributed]'") from None
    return distributed


def get_client() -> Any:
    """The connected client, connecting (or starting the local cluster) on first use."""
    global _client, _cluster, _connected_to, _shown, _unreachable
    address = scheduler_address()
    if address is None:
        raise BackendUnavailableError(f"backend 'dask' has no scheduler: pass --scheduler ADDRESS (or 'local'), "
                                      f"set {SCHEDULER_VARIABLE}, or call use_scheduler()")
    if _client is not None and _connected_to == address and _client.status == "running":
        return _client
    shutdown()  # a client of another scheduler, or one whose scheduler went away
    timeout = connect_timeout()
    began = time.monotonic()
    cluster = None
    if _users_client is not None:
        client = _users_client
        if client.status != "running":
            raise SchedulerUnreachableError(f"the distributed.Client given to use_scheduler() for {address} is "
                                            f"{client.status}: pass a connected one", address)
    elif address == LOCAL:
        distributed = _distributed()
        _refuse_unguarded_main()
        try:
            cluster = _start_local_cluster(distributed)
        except Exception as exc:  # a worker that cannot start, no free port: nothing to wait for
            raise BackendUnavailableError(f"backend 'dask' could not start a local cluster of "
                                          f"{local_workers()} workers: {_one_line(exc)}") from None
        try:
            client = distributed.Client(cluster, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            cluster.close()
            raise _no_answer(address, timeout, exc) from None
    else:
        distributed = _distributed()
        if address.startswith("tcp://"):
            _check_greeting(address, timeout)
        client = _connect_within(distributed, address, max(0.5, timeout - (time.monotonic() - began)), timeout)
    try:
        client.wait_for_workers(1, timeout=max(0.1, timeout - (time.monotonic() - began)))
    except (OSError, TimeoutError):
        if client is not _users_client:  # the user's client is theirs to close
            client.close()
        if cluster is not None:
            cluster.close()
        raise SchedulerUnreachableError(f"dask scheduler {address} answered but has no worker after {timeout:g} s "
                                        f"({TIMEOUT_VARIABLE} sets the wait)", address) from None
    _client, _cluster, _connected_to = client, cluster, address
    _unreachable = None
    _shown = address if cluster is None else f"{cluster.scheduler_address} (local cluster)"
    return client


def _no_answer(address: str, timeout: float, exc: BaseException | None, what: str = "") -> SchedulerUnreachableError:
    why = f": {what}" if what else f": {_one_line(exc)}" if exc is not None else ""
    return SchedulerUnreachableError(f"dask scheduler {address} did not answer within {timeout:g} s "
                                     f"({TIMEOUT_VARIABLE} sets the wait){why}", address)


def _not_dask(address: str, why: str) -> SchedulerUnreachableError:
    return SchedulerUnreachableError(f"{address} does not speak the dask protocol ({why}): give the address of a "
                                     f"dask scheduler, as `dask scheduler` prints it (Scheduler at: tcp://...)",
                                     address)


def _check_greeting(address: str, timeout: float) -> None:
    """Read a ``tcp://`` scheduler's greeting over a plain socket within ``timeout``; else a one-line error.

    A dask server sends its handshake as soon as it accepts a connection:
    a 64-bit size, then that many bytes that begin with a frame count. A
    server that sends nothing, or anything else, is not a scheduler that
    distributed could talk to, and is refused before distributed waits on
    it without a timeout or decodes its bytes as a frame size.
    """
    match = _ADDRESS.match(address)
    host, port = match["host"].strip("[]"), int(match["port"])  # normalized: it matches
    deadline = time.monotonic() + timeout
    try:
        with _connection(host, port, deadline) as connection:
            head = _read_exactly(connection, 8, deadline)
            (size,) = struct.unpack("Q", head)  # distributed's framing: native 64-bit sizes
            if not 16 <= size <= _GREETING_MAX_BYTES:
                raise _not_dask(address, f"it answered {head!r}")
            body = _read_exactly(connection, size, deadline)
            (frames,) = struct.unpack_from("Q", body)
            if not 1 <= frames <= _GREETING_MAX_FRAMES or 8 + 8 * frames > size:
                raise _not_dask(address, f"it answered {(head + body[:8])!r}")
    except TimeoutError:  # socket.timeout is TimeoutError
        raise _no_answer(address, timeout, None, "it accepted a connection but sent nothing (is it a dask "
                                                 "scheduler?)") from None
    except EOFError:
        raise _not_dask(address, "it closed the connection without a greeting") from None
    except OSError as exc:
        raise _no_answer(address, timeout, exc) from None


def _connection(host: str, port: int, deadline: float) -> socket.socket:
    """A TCP connection, tried again until the deadline, as distributed does (a scheduler may still be starting)."""
    pause = 0.05
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.01, deadline - time.monotonic()))
        except OSError:
            if time.monotonic() + pause >= deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def _read_exactly(connection: socket.socket, count: int, deadline: float) -> bytes:
    """``count`` bytes, or TimeoutError at the deadline, or EOFError where the peer closed first."""
    data = b""
    while len(data) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        connection.settimeout(left)
        piece = connection.recv(count - len(data))
        if not piece:
            raise EOFError
        data += piece
    return data


def _connect_within(distributed: Any, address: str, wait: float, timeout: float) -> Any:
    """``distributed.Client(address)`` under a deadline of its own: a handshake that hangs is an error.

    distributed bounds the TCP connection by its timeout but not the
    handshake after it; the connection therefore runs in a thread of its
    own, and one still going after the deadline is left to end there (a
    client it makes after all is closed at once).
    """
    outcome: dict[str, Any] = {}
    abandoned = threading.Event()

    def connect() -> None:
        try:
            client = distributed.Client(address, timeout=wait, set_as_default=False)
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc
            return
        outcome["client"] = client
        if abandoned.is_set():
            client.close()

    thread = threading.Thread(target=connect, name="crossover-dask-connect", daemon=True)
    thread.start()
    thread.join(wait + _DEADLINE_GRACE_SECONDS)
    if thread.is_alive():
        abandoned.set()
        raise _no_answer(address, timeout, None, "it accepted a connection but never completed the dask handshake")
    error = outcome.get("error")
    if isinstance(error, (OSError, TimeoutError)):
        raise _no_answer(address, timeout, error) from None
    if error is not None:  # a MemoryError or ValueError from decoding what it sent: no dask server
        raise _not_dask(address, _one_line(error)) from None
    return outcome["client"]


def _refuse_unguarded_main() -> None:
    """The process pool's error, before any worker starts, where spawned workers would rerun the main script."""
    import dask  # loaded with distributed by now

    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") == "fork":
        return  # forked workers do not import the main script
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is not None and not pool_main.has_main_guard(path):
        raise UnguardedMainError(f"the main script {path} has no `if __name__ == \"__main__\":` guard, so every "
                                 f"worker of the local dask cluster would rerun the whole script: put its top-level "
                                 f"code under that guard")


# Diagnostics for a dashboard the local cluster does not run: each worker's statistical profiler samples its
# stacks every 10 ms, and every server checks its event loop every 20 ms. Left on, an idle 16-worker cluster
# burned 58 % of a core of the 2-core VM (46 % in the workers, 12 % in this process, which hosts the
# scheduler and the nannies), and about 20 % with them off; 2 workers 14 % and 4 %.
#
# A worker-saturation of 1.0: the scheduler keeps a map's waiting tasks until a worker's thread is free. At
# Dask's default of 1.1, a one-thread worker holds a second task behind its running one; at the end of a
# map some workers went idle while others still held a waiting task, and no core can be lent while a task
# waits (core_lending), so the 16-worker cluster's 64-point sweep lost 5-8 % to scheduling where the
# process pool, which hands out a task only to a free worker, lost under 1 %.
_LOCAL_CLUSTER_CONFIG = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                         "distributed.scheduler.worker-saturation": 1.0}


def _start_local_cluster(distributed) -> Any:
    """A LocalCluster on loopback: worker processes of one thread each, no dashboard (nothing listens outside)."""
    # its scheduler and nannies run in this process and log every worker's start and stop at INFO, which
    # reaches any handler of the root logger (the CLI's): the cluster is an implementation detail here
    chatty = logging.getLogger("distributed")
    chatty.setLevel(max(chatty.getEffectiveLevel(), logging.ERROR))
    # the nannies pin their workers' BLAS threads by setting OMP_NUM_THREADS and the like in *this*
    # process's environment before they spawn; left there, they would change this process's own
    # configuration (and the wisdom fingerprint of the numpy backend), so they are put back
    import dask  # loaded with distributed by now (imported on first use: see the module docstring)

    # closed by us at exit, before distributed's own exit handlers (registered when it was imported, so they
    # run after this one): left to them, on a 16-core host a worker's heartbeat could meet the closed
    # scheduler and print a traceback after the caller's last line
    atexit.register(shutdown)
    before = dict(os.environ)
    workers = local_workers()
    try:
        with dask.config.set(_LOCAL_CLUSTER_CONFIG):
            return distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                # CRITICAL: at close a worker's heartbeat can meet the closed scheduler and log an ERROR with a
                # traceback after the caller's last line; what goes wrong in a task comes back as its error
                dashboard_address=None, silence_logs=logging.CRITICAL, preload=[__name__],  # dask_setup, in each worker
                # as in the process pool: Numba's pool sized for the cores a task may be lent (it is sized
                # once, at import), while each task runs on one thread (_run_batch)
                env={"NUMBA_NUM_THREADS": str(core_lending.numba_pool_size(workers)), "CROSSOVER_POOL_WORKER": "1"})
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        os.environ.update(before)


def start() -> None:
    """Connect now (the backend's one-off cost, which the core times once per process)."""
    get_client()
    host_load.forget()  # a local cluster's workers starting were this process's doing, not another's load


def shutdown() -> None:
    """Close the client and the local cluster this process started; the next map connects again.

    A client the user gave :func:`use_scheduler` is only let go: it is theirs to close.
    """
    global _client, _cluster, _connected_to
    client, cluster = _client, _cluster
    _client, _cluster, _connected_to = None, None, None
    if client is not None and client is _users_client:
        client = None
    for closable in (client, cluster):
        if closable is not None:
            try:
                closable.close()
            except Exception:  # a client whose scheduler is gone may fail to close: it is dropped anyway
                pass


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def worker_slots() -> int:
    """Tasks the cluster runs at once: the sum of its workers' threads.

    Without a scheduler, 1 (nothing runs here anyway, and planning asks for
    every backend). A ``local`` cluster not started yet answers its planned
    size without starting it; a remote scheduler is connected to, and one
    that does not answer counts as 1 slot (asked once per process: a map
    tries again, and raises the error).
    """
    global _unreachable
    try:
        address = scheduler_address()
    except ValueError:  # malformed: the probe says so, and planning must not fail here
        return 1
    if address is None or not installed():
        return 1
    if _client is None and address == LOCAL:
        return local_workers()
    if _client is None and address == _unreachable:
        return 1  # planning asks often: wait for a dead scheduler once; a map tries it again, and says so
    try:
        return max(1, sum(get_client().nthreads().values()))
    except SchedulerUnreachableError:
        _unreachable = address
        return 1


# -- the map -------------------------------------------------------------------------

def tasks_per_batch(task_seconds: float, remaining: int, slots: int) -> int:
    """How many tasks one dask task runs, from the first finished task's time on its worker.

    Enough for a batch to last ``MIN_BATCH_SECONDS`` (so the scheduler's cost
    per dask task stays a small share of the work), but never so many that a
    worker would get fewer than ``BATCHES_PER_SLOT`` batches of what is left
    (so an uneven batch leaves a short tail). Tasks of 100 ms or longer run
    one per dask task.
    """
    by_time = math.ceil(MIN_BATCH_SECONDS / max(task_seconds, 1e-6))
    by_share = math.ceil(remaining / (BATCHES_PER_SLOT * max(slots, 1)))
    return max(1, min(by_time, by_share))


Row = tuple[int, bool, Any, float]  # task index, succeeded, result or exception, seconds on the worker


_pinned = False  # in a worker: whether its threads have been set up for crossover's tasks


def _pin_worker_threads() -> None:
    """One BLAS and one Numba thread per task, as in the process pool, on any worker (once per process).

    A worker runs as many tasks at once as it has threads, and each task
    is a single-threaded kernel: more threads per task would oversubscribe
    the cores. A LocalCluster's workers start this way (:func:`dask_setup`);
    a worker started by hand (``dask worker``) may not, so the first batch
    it runs sees to it.
    """
    global _pinned
    # a worker's solves are parts of the caller's: the timing history must not store them as whole solves
    os.environ["CROSSOVER_POOL_WORKER"] = "1"
    if "numba" not in sys.modules:
        os.environ["NUMBA_NUM_THREADS"] = "1"  # Numba sizes its pool once, when it loads
    if not _pinned:
        threadpool_limits(1)
        _pinned = True


def dask_setup(worker: Any) -> None:
    """A local cluster's worker at its start (Dask's preload hook), set up as the process pool sets up its workers.

    Numba is loaded now, with the pool the cluster sized for lending: loaded
    by a task, it would give that task every thread of the pool (a thread's
    default), while :func:`_run_batch` sets Numba to one thread before each
    task. Loading it here also makes it part of the cluster's start, the
    backend's one-off, rather than of the first map.
    """
    try:
        import numba  # before _pin_worker_threads, whose limits must cover the OpenMP runtime Numba loads
    except ImportError:
        pass
    else:
        numba.set_num_threads(1)  # starts the pool, loading its threading layer
    _pin_worker_threads()


Marker = tuple[str, int, int]  # a lending map's task states: shared-memory block, task count, cores it may lend


def _run_batch(fn: TaskFn, batch: list[tuple[int, Any, Any]], shared: Mapping[str, np.ndarray] | None,
               marker: Marker | None) -> list[Row]:
    """Worker side: run each task of a batch, returning its result, or its exception as a value.

    With a ``marker`` (a map on the local cluster), each task is marked
    started and finished in it, so that the map's last tasks may take the
    cores of idle workers (:mod:`core.backends.core_lending`).
    """
    _pin_worker_threads()
    if "numba" in sys.modules:  # loaded before this worker ran crossover's tasks: one thread (thread-local)
        sys.modules["numba"].set_num_threads(1)
    views = readonly_views(shared)
    block = _attach_marker(marker)
    if block is None:
        return [_run_one(fn, index, task, seed, views) for index, task, seed in batch]
    _, count, lendable = marker
    states = np.ndarray((count,), np.int8, buffer=block.buf)
    try:
        rows = []
        for index, task, seed in batch:
            with core_lending.running_task(states, index, lendable):
                rows.append(_run_one(fn, index, task, seed, views))
        return rows
    finally:
        del states  # the block closes only once no view of it is left
        block.close()


def _attach_marker(marker: Marker | None) -> shared_memory.SharedMemory | None:
    """The map's task states; None without lending, or once the map was interrupted and released them."""
    if marker is None:
        return None
    try:
        return shared_memory.SharedMemory(name=marker[0])
    except FileNotFoundError:  # a batch Dask could not cancel, still starting after its map ended
        return None


def _run_one(fn: TaskFn, index: int, task: Any, seed: Any, views: Mapping[str, np.ndarray]) -> Row:
    began = time.perf_counter()
    try:
        return index, True, fn(task, views, seed), time.perf_counter() - began
    except Exception as exc:
        return index, False, _sendable(exc), time.perf_counter() - began


def _sendable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling back to the caller; else a stand-in with its type, message and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        remote = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            message = str(exc)
        except Exception:
            message = "(its message could not be formatted)"
        return UnpicklableTaskError(f"{type(exc).__name__}: {message}", remote)


def map_tasks(fn: TaskFn, tasks: Sequence[Any], *, shared: Mapping[str, np.ndarray] | None = None,
              seed: int | None = None, labels: Sequence[str] | None = None,
              on_result: ResultCallback | None = None) -> list[Any]:
    """Run ``fn(task, shared, seed)`` for every task on the cluster; results in task order.

    The contract of :func:`core.tasks.map_tasks`: ``fn`` importable by the
    workers, ``shared`` arrays sent once (scattered to every worker) and
    read-only there, task ``i`` seeded with the ``i``-th child of
    ``SeedSequence(seed)``, ``on_result(index, result)`` called here in
    completion order. A failing task raises :class:`TaskFailedError`; a task
    whose workers kept dying :class:`WorkerCrashedError`; a scheduler that
    stops answering :class:`SchedulerUnreachableError`. Each names what it
    blames and keeps the finished results.
    """
    tasks = list(tasks)
    labels = task_labels(tasks, labels)
    if not tasks:
        return []
    seeds = task_seeds(seed, len(tasks))
    client = get_client()
    address = _shown
    places = _slot_places(client)
    slots = max(1, len(places))
    results: list[Any] = [None] * len(tasks)
    failures: dict[int, BaseException] = {}
    submitted: dict[Any, list[int]] = {}
    block, marker = _lending_marker(len(tasks), slots)
    try:
        shared_future = _scatter(client, shared, address, results)
        _collect(client, fn, tasks, seeds, labels, shared_future, marker, places, address, results, failures,
                 on_result, submitted)
    except BaseException:  # interrupted, or on_result raised: the cluster must not keep running this map
        _cancel(client, list(submitted))
        raise
    finally:
        if block is not None:
            block.close()
            block.unlink()
    if failures:
        i = min(failures)  # the first failing task in the caller's order, whatever finished first
        error = failures[i]
        text = str(error) if isinstance(error, UnpicklableTaskError) else f"{type(error).__name__}: {error}"
        raise TaskFailedError(f"task {i} ({labels[i]}) failed on the dask cluster at {address}: {text}",
                              i, results) from error
    return results


def _slot_places(client: Any) -> list[str]:
    """The cluster's worker threads in a fixed order, each as its worker's address (one of n threads: n times)."""
    return [address for address, threads in sorted(client.nthreads().items()) for _ in range(threads)]


def _lending_marker(count: int, slots: int) -> tuple[shared_memory.SharedMemory | None, Marker | None]:
    """A map's task states (all waiting) where its workers can reach them, and how they find them; or no lending.

    Only on the local cluster: the workers of a remote scheduler run on
    other hosts, which can reach neither this host's shared memory nor its
    idle cores, so there every task keeps one core.
    """
    if _cluster is None:
        return None, None
    lendable = core_lending.lendable_cores(slots)  # before the block exists: an unreadable switch leaks nothing
    block = shared_memory.SharedMemory(create=True, size=count)  # a new block is zeros: every task waiting
    return block, (block.name, count, lendable)


def _scatter(client: Any, shared: Mapping[str, np.ndarray] | None, address: str, results: list) -> Any:
    """The shared arrays on every worker, as one future (None without any)."""
    if not shared:
        return None
    arrays = {name: np.asarray(array) for name, array in shared.items()}
    try:
        [future] = client.scatter([arrays], broadcast=True, hash=False)
    except (OSError, TimeoutError) as exc:
        raise _lost(address, results, exc) from None
    return future


def _collect(client: Any, fn: TaskFn, tasks: list, seeds: list, labels: list[str], shared_future: Any,
             marker: Marker | None, places: list[str], address: str, results: list,
             failures: dict[int, BaseException], on_result: ResultCallback | None,
             submitted: dict[Any, list[int]]) -> None:
    """Submit one task per slot, size the remaining batches from the first to finish, and take results."""
    slots = max(1, len(places))
    pending = list(range(len(tasks)))
    # each future reports here as it finishes (in a thread of the client): waiting needs no default client
    finished: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def submit(indices: list[int], place: str | None = None) -> None:
        batch = [(i, tasks[i], seeds[i]) for i in indices]
        # a preference, not a rule: the task of a worker that is gone goes to another, and Dask may steal it
        where = {} if place is None else {"workers": [place], "allow_other_workers": True}
        future = client.submit(_run_batch, fn, batch, shared_future, marker, pure=False, **where)
        submitted[future] = indices
        future.add_done_callback(finished.put)

    # The first round, one task a slot, goes to the slots in the same order at every map, so a map of
    # a few tasks reuses the workers that earlier maps warmed: a worker loads a solver's kernels at its
    # first task (0.5-0.7 s for mfg.common_noise's on the 2-core VM), and a small map sent wherever the
    # scheduler liked reached a cold worker in 7 of the first 12 solves on an 8-worker cluster.
    for i, place in zip(pending[:slots], places or [None]):
        submit([i], place)
    remaining, pending = min(slots, len(pending)), pending[slots:]
    while remaining:
        future = _next_finished(client, finished, address, results)
        if future.status in ("lost", "pending"):
            # it finished, but its result went with a worker that died before we read it (a map that kills
            # a worker from on_result met this in CI): Dask computes it again, and it reports here again
            future.add_done_callback(finished.put)
            continue
        remaining -= 1
        rows = _rows_of(future, submitted[future], labels, address, results)
        for index, ok, value, _ in rows:
            if ok:
                results[index] = value
                if on_result is not None:
                    on_result(index, value)
            else:
                failures[index] = value
        if pending:
            size = tasks_per_batch(min(row[3] for row in rows), len(pending), slots)
            for start in range(0, len(pending), size):
                submit(pending[start:start + size])
                remaining += 1
            pending = []


def _next_finished(client: Any, finished: queue.SimpleQueue, address: str, results: list) -> Any:
    """The next future to finish; a scheduler that stops answering is an error, not a hang."""
    lost_since = None
    while True:
        try:
            return finished.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            pass
        if client.status == "running":
            lost_since = None
            continue
        # the client tries to reconnect by itself for a while; past the timeout the scheduler is gone
        lost_since = lost_since or time.monotonic()
        if client.status in ("closed", "closing") or time.monotonic() - lost_since > connect_timeout():
            raise _lost(address, results, None)


def _rows_of(future: Any, indices: list[int], labels: list[str], address: str, results: list) -> list[Row]:
    """A finished dask task's rows; a lost batch is an error naming its first task."""
    if future.status == "finished":
        try:
            return future.result()
        except OSError as exc:  # distributed's CommClosedError: the scheduler went away while sending it
            raise _lost(address, results, exc) from None
    first = indices[0]
    who = f"task {first} ({labels[first]})" + (f" and {len(indices) - 1} more in its batch" if len(indices) > 1
                                                else "")
    if future.status == "cancelled" or type(future.exception()).__name__ == "FutureCancelledError":
        raise _lost(address, results, None)
    error = future.exception()
    kept = sum(r is not None for r in results)
    if type(error).__name__ == "KilledWorker":
        raise WorkerCrashedError(f"dask workers at {address} kept dying while running {who}; Dask stopped "
                                 f"retrying it (distributed.scheduler.allowed-failures) and {kept} finished "
                                 f"results were kept", first, results) from error
    raise TaskFailedError(f"{who} could not run on the dask cluster at {address}: {_one_line(error)}; "
                          f"{kept} finished results were kept", first, results) from error


def _lost(address: str, results: list, cause: BaseException | None) -> SchedulerUnreachableError:
    """The error for a scheduler that stopped answering; the client is dropped so the next map reconnects."""
    # the client logs its failed reconnections as errors with tracebacks: this error says it in one line
    logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
    shutdown()
    kept = sum(r is not None for r in results)
    why = f" ({_one_line(cause)})" if cause is not None else ""
    return SchedulerUnreachableError(f"dask scheduler {address} stopped answering during a map{why}; "
                                     f"{kept} finished results were kept", address, results)


def _cancel(client: Any, futures: list) -> None:
    if futures and client.status == "running":
        try:
            client.cancel(futures)
        except Exception:  # cancelling is a courtesy to the cluster; the original error matters more
            pass


# -- the backend record -------------------------------------------------------------

def _probe() -> Availability:
    if not installed():
        return Availability(False, "dask.distributed is not installed "
                                   "(from a clone of crossover: pip install '.[distributed]')")
    try:
        address = scheduler_address()
        connect_timeout()
    except ValueError as exc:  # a malformed variable: plan and run then say why, rather than "uncalibrated"
        return Availability(False, str(exc))
    if address is None:
        return Availability(False, f"no dask scheduler configured (--scheduler ADDRESS or 'local', "
                                   f"or {SCHEDULER_VARIABLE})")
    return Availability(True)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _describe() -> dict[str, Any]:
    """What the backend runs on; the workers only once connected (describing never starts a cluster)."""
    address = scheduler_address()
    details: dict[str, Any] = {"device": "cluster", "scheduler": address, "distributed": _version("distributed")}
    if _client is not None:
        workers = _client.scheduler_info().get("workers", {})
        details.update(workers=len(workers), threads=sum(w.get("nthreads", 0) for w in workers.values()))
    elif address == LOCAL:
        details.update(workers=local_workers(), threads=local_workers(), started=False)
    return details


def _free_memory() -> float | None:
    """The smallest worker's memory limit, once connected (a task runs on one worker); else unknown."""
    if _client is None:
        return None
    limits = [w.get("memory_limit") for w in _client.scheduler_info().get("workers", {}).values()]
    limits = [float(limit) for limit in limits if limit]
    return min(limits) if limits else None


BACKEND = Backend(
    name="dask",
    summary="a dask.distributed cluster (--scheduler ADDRESS, or local) for batches of independent tasks",
    probe=_probe,
    describe=_describe,
    simplicity=50,  # the most moving parts: a scheduler, workers, a network
    free_memory=_free_memory,
    start=start,
    map=map_tasks,
    parallelism=worker_slots,
)
