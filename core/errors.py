"""The exceptions crossover raises for user mistakes and faults.

Every user-facing error derives from :class:`CrossoverError`, so scripts can
catch one type; each also derives from the builtin it most resembles
(``ValueError`` for bad input, ``RuntimeError`` for a fault) so code written
against plain Python idioms keeps working.
"""

from __future__ import annotations


class CrossoverError(Exception):
    """Base class of every error crossover raises on purpose."""


class ProblemError(CrossoverError, ValueError):
    """A problem field has a value that is not allowed."""


class UnknownSolverError(CrossoverError, KeyError):
    """No registered solver has that name."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class UnknownBackendError(CrossoverError, ValueError):
    """No registered backend has that name, or the solver has no implementation for it."""


class BackendUnavailableError(CrossoverError, RuntimeError):
    """The backend exists but cannot run on this machine (the message says why)."""


class AutoSelectionError(CrossoverError, RuntimeError):
    """``backend="auto"`` could not pick a backend."""


class PluginError(CrossoverError, RuntimeError):
    """A plugin failed to load or supplied a broken spec."""


class DuplicateSolverError(PluginError):
    """Two plugins registered solvers with the same name."""


class TaskFailedError(CrossoverError, RuntimeError):
    """A task of a parallel map failed; ``partial_results`` keeps what finished.

    ``partial_results[i]`` is the result of task ``i`` or ``None`` where the
    task did not finish, so nothing already computed is lost.
    """

    def __init__(self, message: str, task_index: int, partial_results: list | None = None):
        super().__init__(message)
        self.task_index = task_index
        self.partial_results = partial_results or []


class WorkerCrashedError(TaskFailedError):
    """A worker process died (segfault, ``os._exit``, out of memory) while running a task."""


class TaskTimeoutError(TaskFailedError):
    """A task of a parallel map ran longer than the map's ``timeout``; its worker was stopped.

    ``timeout`` is the limit in seconds; ``partial_results`` keeps what finished.
    """

    def __init__(self, message: str, task_index: int, partial_results: list | None = None,
                 timeout: float | None = None):
        super().__init__(message, task_index, partial_results)
        self.timeout = timeout


class UnpicklableTaskError(CrossoverError, RuntimeError):
    """Stands in for a task's exception that could not be sent back from its worker process.

    ``str()`` is the original's ``"TypeName: message"``; ``remote_traceback``
    is its traceback as text, formatted in the worker.
    """

    def __init__(self, text: str, remote_traceback: str = ""):
        super().__init__(text, remote_traceback)
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return str(self.args[0])


class UnguardedMainError(CrossoverError, RuntimeError):
    """A task needs the main script, which pool workers cannot import safely (no ``__main__`` guard)."""


class PluginWarning(UserWarning):
    """A plugin was skipped; the rest of crossover keeps working."""


class TooLongError(CrossoverError, RuntimeError):
    """A run is predicted to take longer than the caller's limit (``max_seconds``); nothing was started."""


class NotEnoughMemoryError(CrossoverError, MemoryError):
    """The problem's memory estimate does not fit the backend's device (the message gives both)."""
