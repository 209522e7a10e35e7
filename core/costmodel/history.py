"""The current planner's timing history, as functions (``core.costmodel.history.model(spec, key)``).

Each function asks :func:`core.costmodel.planner.current`, so code below the
public API (calibration, reports, background warm-ups) works on whichever
planner the caller installed. The state itself lives in the
:class:`~core.costmodel.planner.Planner`.
"""

from __future__ import annotations

from typing import Any

from core.costmodel.planner import (
    HISTORY_LIMIT,
    IdentifiabilityWarning,
    Planner,
    current,
    sample_record,
)

__all__ = ["HISTORY_LIMIT", "IdentifiabilityWarning", "Planner", "current", "sample_record"]


def disable() -> None:
    """Stop reading and writing the wisdom file in the current planner (scripts that measure only)."""
    current().persist = False


def forget() -> None:
    """Drop everything the current planner holds in memory (tests, or after the cache directory changed)."""
    current().forget()


def __getattr__(name: str) -> Any:
    # stored, model, samples, one_off, is_paid, mark_paid, start_backend, record_calibration, ...:
    # the current planner's method of that name
    method = getattr(Planner, name, None)
    if method is None or name.startswith("_"):
        raise AttributeError(f"module 'core.costmodel.history' has no attribute {name!r}")
    return getattr(current(), name)
