"""This process's view of the timing history: samples, models, unpaid one-off costs.

Models are refitted lazily: a new sample only invalidates the cached fit,
and the next prediction refits (as StarPU's history-based models do).
Timings of real solves are buffered and written to the wisdom file at most
every few seconds and at exit, so a tight loop of small solves does not
spend its time rewriting JSON.
"""

from __future__ import annotations

import atexit
import statistics
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

from core.costmodel import store as wisdom
from core.costmodel.fit import CostModel, Sample, fit
from core.solver import SolverSpec

HISTORY_LIMIT = 200  # solve samples kept per (solver, backend); calibration samples are kept apart
FLUSH_INTERVAL = 5.0

_lock = threading.RLock()
_stored: dict[str, Any] | None = None
_models: dict[tuple[str, str], tuple[tuple, CostModel]] = {}
_paid: set[tuple[str, str]] = set()
_pending: list[tuple[str, str, str, dict[str, Any]]] = []
_last_flush = 0.0
_disabled = False


def disable() -> None:
    """Stop reading and writing the wisdom file in this process.

    Pool workers call this: they run with one thread on a machine
    fingerprinted for the parent, so their timings would describe another
    configuration, and their fingerprint would call the parent's file stale.
    """
    global _disabled
    _disabled = True


def stored() -> dict[str, Any]:
    global _stored
    with _lock:
        if _stored is None:
            _stored = {"solvers": {}} if _disabled else wisdom.load()
        return _stored


def forget() -> None:
    """Drop everything cached in memory (tests, or after the cache directory changed)."""
    global _stored
    with _lock:
        _stored = None
        _models.clear()
        _paid.clear()
        _pending.clear()


def _backend_entry(spec: SolverSpec, backend: str) -> dict[str, Any] | None:
    entry = stored()["solvers"].get(spec.name)
    if entry is None or entry.get("version") != spec.version:
        return None
    return entry["backends"].get(backend)


def samples(spec: SolverSpec, backend: str) -> list[Sample]:
    """Calibration and solve samples, one per distinct feature vector (median of repeats).

    Collapsing repeats keeps a thousand solves at one size from outweighing
    the rest of the ladder in the fit.
    """
    entry = _backend_entry(spec, backend) or {}
    groups: dict[tuple, list[float]] = {}
    features: dict[tuple, Mapping[str, float]] = {}
    names = feature_names(spec)
    for record in entry.get("calibration", []) + entry.get("history", []):
        if set(record["features"]) != names:
            continue  # measured when the solver declared other features: not comparable
        key = tuple(sorted(record["features"].items()))
        groups.setdefault(key, []).append(float(record["seconds"]))
        features[key] = record["features"]
    return [Sample(features[key], statistics.median(values)) for key, values in groups.items()]


def feature_names(spec: SolverSpec) -> set[str]:
    return set(spec.features(spec.default_problem()))


def model(spec: SolverSpec, backend: str) -> CostModel | None:
    """The fitted model for the pair, or None if it was never calibrated here."""
    entry = _backend_entry(spec, backend)
    if not entry or not entry.get("calibration"):
        return None
    if not any(set(r["features"]) == feature_names(spec) for r in entry["calibration"]):
        return None
    history = entry.get("history", [])
    # identity of the newest record: the history is capped, so its length alone stops changing
    signature = (len(entry["calibration"]), len(history), id(history[-1]) if history else 0)
    with _lock:
        cached = _models.get((spec.name, backend))
        if cached is None or cached[0] != signature:
            cached = (signature, fit(samples(spec, backend)))
            _models[(spec.name, backend)] = cached
        return cached[1]


def one_off(spec: SolverSpec, backend: str) -> float:
    """The measured one-off cost (JIT, pool start, CUDA context) if unpaid in this process, else 0."""
    if (spec.name, backend) in _paid:
        return 0.0
    entry = _backend_entry(spec, backend) or {}
    return float(entry.get("one_off_seconds", 0.0))


def is_paid(spec: SolverSpec, backend: str) -> bool:
    return (spec.name, backend) in _paid


def mark_paid(spec: SolverSpec, backend: str) -> None:
    _paid.add((spec.name, backend))


def record_calibration(spec: SolverSpec, backend: str, records: list[dict[str, Any]], one_off_seconds: float | None,
                       details: Mapping[str, Any]) -> None:
    """Replace the pair's calibration samples (and one-off cost, when measured) on disk now."""
    global _stored
    if _disabled:
        return

    def change(data: dict[str, Any]) -> None:
        entry = wisdom.solver_entry(data, spec.name, spec.version)
        slot = entry["backends"].setdefault(backend, {})
        slot["calibration"] = records
        slot["calibrated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        slot["details"] = dict(details)
        slot.setdefault("history", [])
        if one_off_seconds is not None:
            _add_one_off(slot, one_off_seconds)
        # never measured (the pair had already run in the calibrating process): unknown, charged as 0
        slot.setdefault("one_off_seconds", 0.0)

    with _lock:
        flush()
        _stored = wisdom.update(change)


ONE_OFF_KEEP = 9


def _add_one_off(slot: dict[str, Any], seconds: float) -> None:
    observations = slot.setdefault("one_off_observations", [])
    observations.append(float(seconds))
    del observations[:-ONE_OFF_KEEP]
    slot["one_off_seconds"] = statistics.median(observations)


def record_one_off(spec: SolverSpec, backend: str, seconds: float) -> None:
    """Add an observed one-off cost (a first call's excess over the model) for a calibrated pair.

    The stored one-off is the median of the last few observations, so one
    cold disk cache or one warm page cache does not set it for good.
    """
    global _stored
    if _disabled:
        return

    def change(data: dict[str, Any]) -> None:
        entry = data["solvers"].get(spec.name)
        if entry is not None and entry.get("version") == spec.version and backend in entry["backends"]:
            _add_one_off(entry["backends"][backend], seconds)

    with _lock:
        try:
            _stored = wisdom.update(change)
        except OSError as exc:
            warnings.warn(f"could not write the wisdom file: {exc}", wisdom.WisdomWarning, stacklevel=2)


def record_solve(spec: SolverSpec, backend: str, record: dict[str, Any]) -> None:
    """Add a real solve's timing; the model refits on its next use."""
    with _lock:
        _pending.append((spec.name, spec.version, backend, record))
        entry = _backend_entry(spec, backend)
        if entry is not None:  # visible to this process's models at once
            entry.setdefault("history", []).append(record)
            del entry["history"][:-HISTORY_LIMIT]
        if time.monotonic() - _last_flush > FLUSH_INTERVAL:
            flush()


def flush() -> None:
    """Write buffered solve timings to the wisdom file."""
    global _stored, _last_flush
    with _lock:
        _last_flush = time.monotonic()
        if not _pending or _disabled:
            _pending.clear()
            return
        batch = list(_pending)
        _pending.clear()

        def change(data: dict[str, Any]) -> None:
            for name, version, backend, record in batch:
                entry = data["solvers"].get(name)
                if entry is None or entry.get("version") != version or backend not in entry["backends"]:
                    continue  # only calibrated pairs keep a history
                history = entry["backends"][backend].setdefault("history", [])
                history.append(record)
                del history[:-HISTORY_LIMIT]

        try:
            _stored = wisdom.update(change)
        except OSError as exc:  # a read-only cache must not break a solve
            warnings.warn(f"could not write the wisdom file: {exc}", wisdom.WisdomWarning, stacklevel=2)


atexit.register(flush)
