"""The user's main script and the process pool's workers.

multiprocessing's ``forkserver`` and ``spawn`` start methods make every
child import the caller's main script again (as ``__mp_main__``), and the
forkserver preloads it too, so that functions defined there can be
unpickled. A script without an ``if __name__ == "__main__":`` guard then
reruns all its top-level code in every child: the README's snippet, saved
as a script, calibrated again inside a child that was still starting, which
may not start processes, and the process backend stayed uncalibrated.

crossover's task functions live in importable modules, so the pool's
workers start without the main script:

- they are processes of their own class (:func:`pool_context`), whose
  name marks them, and the preparation data sent to a marked process
  leaves the main script out (:func:`_preparation_data`); the forkserver
  preloads this package instead of ``__main__``;
- each task travels as bytes pickled here (:func:`dumps_task`), which also
  tells whether it refers to anything defined in ``__main__`` (the task
  function, or a task's class);
- only then, and only for a script with the guard, does a worker import
  the main script, once, before it unpickles such a task
  (:func:`loads_task`); a script without the guard gets a one-line error
  before anything runs (:func:`main_reference`).

Other users of multiprocessing in the same process keep the standard
behaviour: only processes marked as crossover's are changed.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import runpy
import sys
import types
from multiprocessing import context as mp_context
from multiprocessing import process, spawn
from multiprocessing.reduction import ForkingPickler
from typing import Any

from core.errors import UnguardedMainError

WORKER_NAME = "crossover-pool-worker"
PRELOAD = ["core.backends.process_pool"]

# how a worker finds the caller's main script: ("path", file) or ("module", name for ``python -m``)
MainRef = tuple[str, str]


# -- starting workers without the main script ---------------------------------

class SpawnWorker(mp_context.SpawnProcess):
    """A pool worker started with ``spawn``; its name marks it as crossover's."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.name = f"{WORKER_NAME}-{self.name}"


class SpawnPoolContext(mp_context.SpawnContext):
    Process = SpawnWorker


if hasattr(mp_context, "ForkServerProcess"):  # POSIX only
    class ForkServerWorker(mp_context.ForkServerProcess):
        """A pool worker started by the forkserver; its name marks it as crossover's."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.name = f"{WORKER_NAME}-{self.name}"

    class ForkServerPoolContext(mp_context.ForkServerContext):
        Process = ForkServerWorker


_standard_preparation_data = spawn.get_preparation_data


def _preparation_data(name: str) -> dict[str, Any]:
    """What a new child imports before it runs: for crossover's workers, everything but the main script."""
    data = _standard_preparation_data(name)
    if str(name).startswith(WORKER_NAME):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


def pool_context(method: str) -> mp_context.BaseContext:
    """A multiprocessing context whose processes start without the caller's main script."""
    # The start methods read spawn.get_preparation_data when they launch a child; the
    # wrapper changes only children named as crossover's workers.
    spawn.get_preparation_data = _preparation_data
    if method == "forkserver":
        context = ForkServerPoolContext()
        # only takes effect when the forkserver starts; workers fork with this package loaded
        context.set_forkserver_preload(PRELOAD)
        return context
    return SpawnPoolContext()


# -- tasks that refer to the main script --------------------------------------

class _TaskPickler(ForkingPickler):
    """Pickles a task and notes every function or class it refers to in ``__main__``."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.from_main: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.from_main.add(obj.__qualname__)
        return NotImplemented  # pickled as usual


def dumps_task(obj: Any) -> tuple[bytes, set[str]]:
    """``obj`` pickled, and the names it uses from ``__main__`` (a worker must import the script for them)."""
    buffer = io.BytesIO()
    pickler = _TaskPickler(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.from_main


def main_reference(names: set[str]) -> MainRef:
    """How a worker imports the main script for ``names``, or a one-line error if it cannot safely."""
    main = sys.modules["__main__"]
    what = ", ".join(sorted(names))
    path = getattr(main, "__file__", None)
    if path is None:
        raise UnguardedMainError(f"{what} is defined in the __main__ of an interactive session or `python -c`, "
                                 f"which pool workers cannot import: define it in an importable module")
    if not has_main_guard(path):
        raise UnguardedMainError(f"{what} is defined in the main script {path}, which has no "
                                 f"`if __name__ == \"__main__\":` guard, so every pool worker would rerun the "
                                 f"whole script: put its top-level code under that guard, or define {what} in "
                                 f"an importable module")
    module = getattr(getattr(main, "__spec__", None), "name", None)
    if module and not module.endswith("__main__"):  # ``python -m package.module``: relative imports need the name
        return ("module", module)
    return ("path", os.path.abspath(path))


def has_main_guard(path: str) -> bool:
    """Whether the script has a top-level ``if __name__ == "__main__":`` (an unreadable one is trusted)."""
    try:
        tree = ast.parse(open(path, "rb").read())
    except (OSError, SyntaxError, ValueError):
        return True  # cannot tell: keep multiprocessing's own behaviour rather than refuse
    return any(isinstance(node, ast.If) and _tests_main_name(node.test) for node in tree.body)


def _tests_main_name(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = {side.id for side in sides if isinstance(side, ast.Name)}
    values = {side.value for side in sides if isinstance(side, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


# -- in a worker ---------------------------------------------------------------

_main_loaded: MainRef | None = None


def loads_task(payload: bytes, main: MainRef | None) -> Any:
    """Unpickle a task in a worker, importing the main script first where the task needs it."""
    if main is not None:
        _load_main(main)
    return pickle.loads(payload)


def _load_main(main: MainRef) -> None:
    """Import the caller's main script as ``__mp_main__``, as multiprocessing would, once per worker.

    While it runs, the worker counts as starting (multiprocessing's own
    flag), and :func:`refuse_pool_while_importing_main` stops a pool from
    starting: a map at the script's top level, outside its guard, would
    otherwise start pools within pools.
    """
    global _main_loaded, _importing_main
    if _main_loaded == main:
        return
    kind, where = main
    this = process.current_process()
    _importing_main, this._inheriting = where, True
    try:
        if kind == "path":
            spawn.import_main_path(where)
        else:
            module = types.ModuleType("__mp_main__")
            module.__dict__.update(runpy.run_module(where, run_name="__mp_main__", alter_sys=True))
            sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    finally:
        _importing_main = None
        del this._inheriting
    _main_loaded = main


_importing_main: str | None = None


def refuse_pool_while_importing_main() -> None:
    """One clear error where a worker, importing the main script, reaches a map outside the script's guard."""
    if _importing_main is not None:
        raise UnguardedMainError(f"a pool worker importing the main script {_importing_main} reached a map or pool "
                                 f"start outside its `if __name__ == \"__main__\":` guard: put the script's "
                                 f"top-level code under the guard")
