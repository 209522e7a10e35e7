"""Pool processes end when the process that started the pool ends, however it ends.

A caller killed by SIGTERM, SIGKILL or the OOM killer runs no cleanup, and
left behind, before this module, its workers (each blocked reading a task
queue whose write end the workers themselves hold), the forkserver (which
lives while any of its children hold its "alive" pipe) and the resource
tracker (which lives while anyone holds its pipe). So:

- *the lifeline*: a pipe whose write end only the caller holds (it is not
  inheritable, and only its read end is sent to workers). Each worker
  blocks reading it in a daemon thread; end of file means the caller is
  gone, and the worker exits at once. This works for every start method
  and platform, while the worker's main thread runs a task or waits for one.
- *the forkserver*: a worker closes its copy of the forkserver's "alive"
  pipe, which it never uses (a worker that starts a pool starts its own
  forkserver), so the forkserver sees the caller's death by itself and exits.
- *tasks that hold the GIL* (a Numba loop, a C call) keep the lifeline's
  thread from running. On Linux a forkserver's worker also asks the kernel
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to kill it when its parent, the
  forkserver, exits; that needs no Python code in the worker at all.
- *the resource tracker* exits once the caller and every worker have closed
  its pipe, and then unlinks the shared-memory blocks the caller left
  registered: a killed map's inputs and markers do not stay in /dev/shm.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

_PR_SET_PDEATHSIG = 1
# exit status of a worker whose caller is gone (the caller is not there to read it)
ORPHAN_EXIT_CODE = 86

_lifeline: tuple[int, Connection, Connection] | None = None  # (owner pid, read end, write end)


def caller_lifeline(context: BaseContext) -> Connection:
    """The read end of this process's lifeline, for workers; the write end stays here until the process ends."""
    global _lifeline
    if _lifeline is None or _lifeline[0] != os.getpid():  # a forked child gets a lifeline of its own
        _lifeline = (os.getpid(), *context.Pipe(duplex=False))
    return _lifeline[1]


def hold_on(lifeline: Connection) -> None:
    """In a new worker: exit when the caller exits (see the module docstring)."""
    server = _forkserver_of_this_worker()
    if server is not None:
        _die_with_parent()  # before the alive pipe is closed: until then the forkserver cannot exit
        _leave(server)
    # the thread holds the connection: it must not be collected, which would close it
    threading.Thread(target=_exit_when_cut, args=(lifeline,), name="crossover-lifeline", daemon=True).start()


def _exit_when_cut(lifeline: Connection) -> None:
    """Block until the caller's end of the lifeline closes (nothing is ever sent), then exit."""
    try:
        while True:
            lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(ORPHAN_EXIT_CODE)


def _forkserver_of_this_worker() -> object | None:
    """multiprocessing's forkserver record, if a forkserver started this worker."""
    try:
        from multiprocessing import forkserver
    except ImportError:  # Windows
        return None
    server = getattr(forkserver, "_forkserver", None)
    if getattr(server, "_forkserver_alive_fd", None) is None or getattr(server, "_forkserver_pid", None) is not None:
        return None  # not a forkserver's child (a process that started a forkserver holds the fd too)
    return server


def _leave(server: object) -> None:
    """Close this worker's copy of the forkserver's alive pipe, so that the caller's death ends the forkserver."""
    try:
        os.close(server._forkserver_alive_fd)
    except OSError:
        pass
    server._forkserver_alive_fd = None  # a pool started in this worker starts its own forkserver


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL when the parent exits; elsewhere the lifeline thread alone serves."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # this process's own symbols, libc's among them
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
