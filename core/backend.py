"""What a backend is: a named execution strategy that can say if it runs here.

Backends are plain records of functions rather than a class hierarchy: a
third-party plugin supplies one by filling in a :class:`Backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


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
    because it has fewer ways to go wrong.
    """

    name: str
    summary: str
    probe: Callable[[], Availability]
    describe: Callable[[], dict[str, Any]] = field(default=lambda: {})
    simplicity: int = 50


def safe_probe(backend: Backend) -> Availability:
    """Run a backend's probe, turning a crash in the probe into 'unavailable'."""
    try:
        result = backend.probe()
    except Exception as exc:  # a broken third-party probe must not break crossover
        return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")
    if not isinstance(result, Availability):
        available, reason = (bool(result), "") if not isinstance(result, tuple) else result
        result = Availability(bool(available), str(reason))
    return result


def safe_describe(backend: Backend) -> dict[str, Any]:
    """A backend's description, or the error that describing it raised."""
    try:
        return dict(backend.describe())
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
