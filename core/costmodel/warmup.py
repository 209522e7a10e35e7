"""Tiering up: pay a faster implementation's one-off in the background while the slower one runs.

A process that calls a solver again and again should end up on the
implementation that is fastest once warm, without making any one call pay
its whole one-off (numba's import and cache load, a CUDA context, a pool
start). So, as a JIT compiles a hot function on a background thread, from
the second call of a solver in a process on: when the plan chose ``X`` but
an implementation ``Y`` would be faster once warm and its one-off is still
unpaid, ``Y`` is warmed on a background thread (its backend started and
``Y`` run once on the cheapest problem of the calibration design that it
supports). While that runs, calls keep going to ``X``; once it is done,
``Y``'s one-off is paid and the plan moves to it by itself.

Safety: a per-backend lock serialises the warm-up and crossover's own runs
on the same backend (Numba's default thread pool must not be entered from
two threads at once), so ``X`` and ``Y`` never share a backend here. A
variant that compiles per shape is never warmed on another shape. At exit
the process waits for a warm-up still running (a compiler interrupted at
shutdown can crash). ``CROSSOVER_TIER_UP=0`` turns this off.
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from core.costmodel import history
from core.costmodel.design import calibration_design
from core.registry import get_registry
from core.result import Plan
from core.running import exclusion, run_once
from core.solver import SolverSpec, backend_of
from core.validation import env_flag

log = logging.getLogger("crossover")

EXIT_WAIT_SECONDS = 30.0

_backend_locks: dict[str, threading.RLock] = {}
_locks_guard = threading.Lock()
_warming: dict[tuple[str, str], threading.Thread] = {}


def backend_lock(backend: str) -> threading.RLock:
    with _locks_guard:
        return _backend_locks.setdefault(backend, threading.RLock())


@contextmanager
def using(implementation: str) -> Iterator[None]:
    """Hold the implementation's backend while running it (waits for a warm-up there)."""
    with backend_lock(backend_of(implementation)):
        yield


def worth_warming(spec: SolverSpec, decision: Plan) -> list[str]:
    """Implementations faster than the chosen one once warm, whose one-off is unpaid (best first)."""
    chosen = decision.predictions[decision.backend]
    if chosen.seconds is None:
        return []
    found = []
    for key, prediction in decision.predictions.items():
        if (key in decision.excluded or prediction.seconds is None or prediction.one_off_seconds <= 0
                or prediction.status not in ("calibrated", "measured")
                or backend_of(key) == backend_of(decision.backend)):
            continue
        margin = (chosen.error or 0.0) + (prediction.error or 0.0)
        if prediction.seconds * (1 + margin) < chosen.seconds and not _compiles_per_shape(spec, key):
            found.append(key)
    return sorted(found, key=lambda k: decision.predictions[k].seconds)


def _compiles_per_shape(spec: SolverSpec, implementation: str) -> bool:
    """Whether the implementation compiles per shape (a key other than ``()`` where it would be warmed): a
    warm-up at another shape would not pay this problem's one-off. A solver's other implementations (its CPU
    ones, where only the GPU variants declare keys) are warmed as ever."""
    if spec.compile_key is None:
        return False
    problem = _first_supported(spec, implementation)
    return problem is None or spec.compile_key(problem, implementation) != ()


def _first_supported(spec: SolverSpec, implementation: str) -> Any | None:
    """The quick design's first problem the implementation can run here, found once per spec and process.

    Building common noise's design took 55 ms a time on the VM (0.9 s the
    first), and a plan that weighs warm-ups asks for it per candidate; the
    one H200 loop call that moved to a candidate on call 3 spent 185 ms
    outside its 7.8 ms kernel (docs/results/gpu-2026-11-28f/m-).
    """
    kept = _designs.get(id(spec))
    if kept is None or kept[0] is not spec:  # keyed by the spec object, which the entry keeps alive
        kept = _designs[id(spec)] = (spec, calibration_design(spec, quick=True), {})
    found = kept[2]
    if implementation not in found:
        found[implementation] = next((p for p in kept[1] if not exclusion(spec, p, implementation)), None)
    return found[implementation]


# each registered spec's quick design and each implementation's first problem in it, built once a process
_designs: dict[int, tuple[SolverSpec, list, dict[str, Any]]] = {}


def _warm(spec: SolverSpec, implementation: str, problem: Any) -> None:
    try:
        with using(implementation):
            history.start_backend(get_registry().backends[backend_of(implementation)])
            run_once(spec, implementation, problem)
        history.mark_paid(spec, implementation, problem)
        log.info("warmed %s for %s in the background", implementation, spec.name)
    except Exception as exc:  # a failed warm-up only means no tier-up; the foreground is unaffected
        log.warning("background warm-up of %s for %s failed: %s: %s", implementation, spec.name,
                    type(exc).__name__, exc)


def tier_up(spec: SolverSpec, decision: Plan) -> str | None:
    """Start warming the best implementation worth it, from a solver's second call on; returns its key."""
    if history.calls(spec) < 2 or not env_flag("CROSSOVER_TIER_UP", default=True):
        return None
    for key in worth_warming(spec, decision)[:1]:
        if (spec.name, key) in _warming:
            return None
        problem = _first_supported(spec, key)
        if problem is None:
            return None
        # in a copy of this context, so the warm-up is paid on the caller's planner, not the default one
        thread = threading.Thread(target=contextvars.copy_context().run, args=(_warm, spec, key, problem),
                                  daemon=True, name=f"crossover-warm-{key}")
        _warming[(spec.name, key)] = thread
        thread.start()
        return key
    return None


def warming() -> bool:
    """Whether a background warm-up is running in this process now."""
    return any(thread.is_alive() for thread in list(_warming.values()))


def wait(timeout: float | None = None) -> None:
    """Wait for background warm-ups (tests, and the process's exit)."""
    for thread in list(_warming.values()):
        thread.join(timeout)


atexit.register(wait, EXIT_WAIT_SECONDS)
