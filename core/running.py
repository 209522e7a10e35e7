"""Running one implementation: find the solver, check the backend, time what the user pays.

These sit below the public API and the cost model, which both use them;
nothing here knows about predictions or plans.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from core.backend import Availability, Backend, safe_free_memory, safe_probe
from core.errors import BackendUnavailableError, PluginError, ProblemError, UnknownBackendError
from core.registry import get_registry
from core.result import as_arrays
from core.solver import Implementation, SolverSpec, backend_of


def find_solver(problem: Any) -> SolverSpec:
    """The solver registered for this problem's type.

    An exact type match wins over a base class, so a problem type derived
    from another (common noise from the plain MFG) reaches its own solver.
    """
    specs = list(get_registry().solvers.values())
    for spec in specs:
        if type(problem) is spec.problem_type:
            return spec
    for spec in specs:
        if isinstance(problem, spec.problem_type):
            return spec
    raise ProblemError(f"no registered solver takes a {type(problem).__name__}; "
                       "pass solver=NAME or register the plugin that defines it")


_PROBED: dict[int, tuple[Backend, Availability]] = {}  # by the backend object's identity


def probe(backend: Backend) -> Availability:
    """A backend's availability, probed once per process (probes may import torch: seconds).

    Kept by the object's identity: a frozen dataclass hashes every field on
    each lookup, and a plan asks once per implementation."""
    found = _PROBED.get(id(backend))
    if found is None or found[0] is not backend:
        found = _PROBED[id(backend)] = (backend, safe_probe(backend))
    return found[1]


def forget_probes() -> None:
    """Probe again on next use (tests that fake a device, or a GPU that appeared)."""
    _PROBED.clear()


def implementations(spec: SolverSpec) -> dict[str, Implementation]:
    """Every implementation key of ``spec``: its own, plus its ``parallel`` one under each mapping backend.

    Resolved against the registry at each call, so a parallel backend
    registered later (a Dask cluster, a third party's) runs the solver unchanged.
    """
    found = dict(spec.implementations)
    if spec.parallel is not None:
        for name, backend in get_registry().backends.items():
            if backend.map is not None and name not in found:
                found[name] = functools.partial(spec.parallel, backend=name)
    return found


def registered_backend(name: str) -> Backend:
    """The backend that ``name`` (or ``name:variant``) names, or the one-line error listing the registered ones."""
    backends = get_registry().backends
    if backend_of(name) not in backends:
        raise UnknownBackendError(f"unknown backend {name!r}; registered backends: {', '.join(backends)}")
    return backends[backend_of(name)]


def check_backend(spec: SolverSpec, name: str) -> tuple[str, ...]:
    """The implementation keys that ``name`` (a backend or ``backend:variant``) selects, or a one-line error."""
    backend = registered_backend(name)
    known = implementations(spec)
    keys = (name,) if name in known else tuple(k for k in known if ":" not in name and backend_of(k) == name)
    if not keys:
        raise UnknownBackendError(
            f"solver {spec.name!r} has no {name!r} implementation; it runs on: {', '.join(known)}")
    status = probe(backend)
    if not status.available:
        raise BackendUnavailableError(f"backend {backend.name!r} is unavailable here: {status.reason}")
    return keys


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def memory_need(spec: SolverSpec, problem: Any, implementation: str) -> float:
    """The plugin's estimate of peak bytes, checked: a non-number or a negative estimate is the plugin's fault."""
    need = spec.memory(problem, implementation)
    try:
        need = float(need)
    except (TypeError, ValueError, OverflowError):
        raise PluginError(f"solver {spec.name!r}: memory() returned {need!r:.60}, expected bytes") from None
    if need != need or need < 0:
        raise PluginError(f"solver {spec.name!r}: memory() returned {need!r}, expected bytes >= 0")
    return need


AGED_READING_SECONDS = 30.0  # how old a free-memory reading may be for a problem it dwarfs
DWARFED_SHARE = 1 / 16  # ... a problem needing at most this share of what it found free
_READINGS: dict[Any, tuple[float, float | None]] = {}  # by the backend's free_memory function: (when, bytes)


def read_free_memory(backend: Backend) -> float | None:
    """The backend's free memory read now (:func:`~core.backend.safe_free_memory`), kept for
    :func:`roomy_reading`."""
    free = safe_free_memory(backend)
    _READINGS[backend.free_memory] = (time.monotonic(), free)
    return free


def roomy_reading(backend: Backend, need: float) -> float | None:
    """A reading of the backend's free memory at most :data:`AGED_READING_SECONDS` old that ``need`` is at most
    :data:`DWARFED_SHARE` of, else None (read it again).

    Reading the host's free memory opens six /proc and cgroup files: 77 us
    on the VM, half a small HJB problem's first-call overhead in a process
    that solves a new problem every few seconds (a reading is otherwise
    reused for a second). A problem that needs a sliver of what was free
    moments ago fits now, unless the host is about to run out anyway; one
    that needs more reads the memory afresh.
    """
    at, free = _READINGS.get(backend.free_memory, (-math.inf, None))
    if free is None or time.monotonic() - at > AGED_READING_SECONDS or need > free * DWARFED_SHARE:
        return None
    return free


def exclusion(spec: SolverSpec, problem: Any, implementation: str,
              free_memory: dict[str, float | None] | None = None) -> str:
    """Why ``implementation`` cannot run ``problem`` here, or "" (availability, support, memory).

    ``free_memory`` caches each backend's free memory by name, so that a plan
    over many implementations reads each memory once.
    """
    backend = get_registry().backends.get(backend_of(implementation))
    if backend is None:
        return "backend not registered (is its plugin installed?)"
    status = probe(backend)
    if not status.available:
        return f"unavailable: {status.reason}"
    unsupported = spec.supports(problem, implementation)
    if unsupported:
        return f"unsupported: {unsupported}"
    try:
        need = memory_need(spec, problem, implementation)
    except PluginError as exc:  # the plugin's fault: this implementation is out, the others go on
        return f"memory estimate failed: {exc}"
    if free_memory is not None and backend.name in free_memory:
        free = free_memory[backend.name]
    elif (aged := roomy_reading(backend, need)) is not None:
        free = aged
    elif free_memory is None:
        free = read_free_memory(backend)
    else:
        # backends that share a memory (numpy, numba and the pool: the host's) read it once
        shared = next((name for name, other in get_registry().backends.items()
                       if name in free_memory and other.free_memory is backend.free_memory), None)
        free = free_memory[backend.name] = free_memory[shared] if shared else read_free_memory(backend)
    if free is not None and need > free:
        return f"not enough memory: needs {_gib(need)}, {_gib(free)} free"
    return ""


def run_once(spec: SolverSpec, implementation: str, problem: Any) -> tuple[dict, float]:
    """Run one implementation and time it as the user pays for it.

    The time covers host-to-device transfers and waiting for the GPU, since
    outputs are moved to NumPy inside the timed region.
    """
    started = time.perf_counter()
    outputs = as_arrays(implementations(spec)[implementation](problem))
    return outputs, time.perf_counter() - started
