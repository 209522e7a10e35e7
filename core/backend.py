"""What a backend is: a named execution strategy that can say if it runs here.

Backends are plain records of functions rather than a class hierarchy: a
third-party plugin supplies one by filling in a :class:`Backend`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from core.errors import PluginWarning


class Availability(NamedTuple):
    """Whether a backend can run on this machine, and if not, why not."""

    available: bool
    reason: str = ""


@dataclass(frozen=True)
class Backend:
    """An execution strategy.

    ``probe`` answers whether it runs here (cheaply, and never raising);
    ``describe`` reports device, cores, threads and memory for tables and
    the machine fingerprint. ``simplicity`` orders backends for tie-breaks:
    within the cost model's margin the backend with the lower number wins,
    because it has fewer ways to go wrong. ``free_memory`` returns the bytes
    a problem may use on the backend's device (None: unknown, never excluded).

    ``start`` pays the backend's one-off cost of a process (start the pool,
    create the CUDA context, connect to a cluster); the core times it once
    per process and charges it to whichever solver runs there first.

    A parallel backend also gives ``map``, with the signature of
    :func:`core.tasks.map_tasks` less ``backend``, and ``parallelism()``,
    how many tasks it runs at once; :func:`core.tasks.map_tasks` dispatches
    to it, so plugins never import a backend's module.
    """

    name: str
    summary: str
    probe: Callable[[], Availability]
    describe: Callable[[], dict[str, Any]] = field(default=lambda: {})
    simplicity: int = 50
    free_memory: Callable[[], float | None] = field(default=lambda: None)
    start: Callable[[], None] | None = None
    map: Callable[..., list] | None = None
    parallelism: Callable[[], int] | None = None


def safe_probe(backend: Backend) -> Availability:
    """Run a backend's probe, turning a crash in the probe into 'unavailable'."""
    try:
        result = backend.probe()
    except Exception as exc:  # a broken third-party probe must not break crossover
        return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")
    if not isinstance(result, Availability):
        # a probe that answers True, or a bare tuple, could hide a broken check: say so instead
        return Availability(False, f"probe returned {type(result).__name__}, expected core.Availability")
    return result


_free_memory_faults: set[str] = set()


def safe_free_memory(backend: Backend) -> float | None:
    """A backend's free memory, or None (unknown: nothing excluded) where asking raised or answered nonsense.

    A broken third-party ``free_memory`` is blamed by name once per process,
    and planning goes on as if that backend's memory were unknown.
    """
    try:
        free = backend.free_memory()
        if free is None:
            return None
        free = float(free)
        if free != free or free < 0:  # NaN or negative: as useless as an exception
            raise ValueError(f"returned {free!r}, expected bytes >= 0 or None")
        return free
    except (Exception, SystemExit) as exc:
        if backend.name not in _free_memory_faults:
            _free_memory_faults.add(backend.name)
            warnings.warn(f"backend {backend.name!r}: free_memory() failed ({type(exc).__name__}: {exc}); "
                          "treating its free memory as unknown", PluginWarning, stacklevel=2)
        return None


def safe_describe(backend: Backend) -> dict[str, Any]:
    """A backend's description, or the error that describing it raised."""
    try:
        return dict(backend.describe())
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def host_free_memory() -> float | None:
    """Bytes of host memory available to a new allocation (Linux ``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None
