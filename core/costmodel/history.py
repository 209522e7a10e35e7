"""This process's view of the timing history: samples, models, one-off costs, calls.

Models are refitted lazily: a new sample only invalidates the cached fit,
and the next prediction refits (as StarPU's history-based models do).
Timings of real solves are buffered and written to the wisdom file at most
every few seconds and at exit, so a tight loop of small solves does not
spend its time rewriting JSON.

One-off costs are kept where they are paid:

- a *backend's* start (process pool, CUDA context, cluster connection) once
  per process, whichever solver pays it (``start_backend``);
- an *implementation's* JIT compile once per process, or, for a variant
  that compiles per shape (``SolverSpec.compile_key``), once per shape.
"""

from __future__ import annotations

import atexit
import os
import statistics
import threading
import time
import warnings
from collections.abc import Hashable, Mapping
from typing import Any

from core.backend import Backend
from core.costmodel import store
from core.costmodel.features import feature_names, model_features
from core.costmodel.fit import CostModel, Sample, fit
from core.solver import SolverSpec, backend_of

HISTORY_LIMIT = 200  # solve samples kept per (solver, implementation); calibration samples are kept apart
FLUSH_INTERVAL = 5.0
ONE_OFF_KEEP = 9


class IdentifiabilityWarning(UserWarning):
    """A cost-model coefficient could not be determined from the samples and was dropped."""


_lock = threading.RLock()
_stored: dict[str, Any] | None = None
_models: dict[tuple[str, str], tuple[tuple, CostModel]] = {}
_paid: set[tuple[str, str, Hashable]] = set()
_started: set[str] = set()
_calls: dict[str, int] = {}
_measured: dict[tuple[str, tuple], dict[str, float]] = {}
_warned: set[tuple[str, str, tuple]] = set()
_retaken: set[tuple[str, str]] = set()  # set-aside implementations already handed out for measuring
_pending: list[tuple[str, str, str, dict[str, Any]]] = []
_last_flush = 0.0
_disabled = False


def disable() -> None:
    """Stop reading and writing the wisdom file in this process."""
    global _disabled
    _disabled = True


def _off() -> bool:
    # pool workers run with one thread on a machine fingerprinted for the parent: their timings
    # would describe another configuration, and their fingerprint would call the parent's file stale
    return _disabled or os.environ.get("CROSSOVER_POOL_WORKER") == "1"


def stored() -> dict[str, Any]:
    global _stored
    with _lock:
        if _stored is None:
            _stored = store.empty() if _off() else store.load()
        return _stored


def forget() -> None:
    """Drop everything cached in memory (tests, or after the cache directory changed)."""
    global _stored
    with _lock:
        _stored = None
        store.forget()
        _models.clear()
        _paid.clear()
        _started.clear()
        _calls.clear()
        _measured.clear()
        _warned.clear()
        _retaken.clear()
        _pending.clear()


def _entry(spec: SolverSpec, implementation: str) -> dict[str, Any] | None:
    entry = stored()["solvers"].get(spec.name)
    if entry is None or entry.get("version") != spec.version:
        return None
    return entry["backends"].get(implementation)


def take_set_aside(spec: SolverSpec) -> list[str]:
    """Implementations of ``spec`` whose timings a configuration change set aside, to measure again.

    Each is returned once per process, so a measurement that fails is not retried on every call.
    """
    entry = stored()["solvers"].get(spec.name)
    if entry is None or entry.get("version") != spec.version:
        return []
    with _lock:
        found = [key for key, slot in entry["backends"].items()
                 if store.SET_ASIDE in slot and not slot.get("calibration") and (spec.name, key) not in _retaken]
        _retaken.update((spec.name, key) for key in found)
    return found


def samples(spec: SolverSpec, implementation: str) -> list[Sample]:
    """Calibration and solve samples, one per distinct feature vector (median of repeats).

    Collapsing repeats keeps a thousand solves at one size from outweighing
    the rest of the design in the fit.
    """
    entry = _entry(spec, implementation) or {}
    names = set(feature_names(spec, implementation))
    groups: dict[tuple, list[float]] = {}
    features: dict[tuple, Mapping[str, float]] = {}
    for record in entry.get("calibration", []) + entry.get("history", []):
        if set(record["features"]) != names:
            continue  # measured when the solver declared other features: not comparable
        key = tuple(sorted(record["features"].items()))
        groups.setdefault(key, []).append(float(record["seconds"]))
        features[key] = record["features"]
    return [Sample(features[key], statistics.median(values)) for key, values in groups.items()]


def model(spec: SolverSpec, implementation: str) -> CostModel | None:
    """The fitted model for the pair, or None if it was never calibrated here."""
    entry = _entry(spec, implementation)
    if not entry or not entry.get("calibration"):
        return None
    history = entry.get("history", [])
    # identity of the newest record: the history is capped, so its length alone stops changing
    signature = (len(entry["calibration"]), len(history), id(history[-1]) if history else 0, id(entry))
    with _lock:
        cached = _models.get((spec.name, implementation))
        if cached is None or cached[0] != signature:
            found = samples(spec, implementation)
            if not found:
                return None
            cached = (signature, fit(found, feature_names(spec, implementation)))
            _models[(spec.name, implementation)] = cached
            _report_undetermined(spec, implementation, cached[1])
        return cached[1]


def _report_undetermined(spec: SolverSpec, implementation: str, fitted: CostModel) -> None:
    key = (spec.name, implementation, fitted.undetermined)
    if fitted.undetermined and key not in _warned:
        _warned.add(key)
        warnings.warn(f"cost model of {spec.name} on {implementation}: the samples cannot determine "
                      f"{', '.join(repr(n) for n in fitted.undetermined)} (it moved only with other features); "
                      "dropped from the fit, and predictions off the measured span are marked extrapolated",
                      IdentifiabilityWarning, stacklevel=3)


# -- one-off costs -------------------------------------------------------------------

def _compile_key(spec: SolverSpec, implementation: str, problem: Any) -> Hashable:
    return spec.compile_key(problem, implementation) if spec.compile_key is not None else ()


def implementation_one_off(spec: SolverSpec, implementation: str, problem: Any) -> float:
    """The implementation's stored one-off (JIT) if still unpaid here for this problem's shape, else 0."""
    if (spec.name, implementation, _compile_key(spec, implementation, problem)) in _paid:
        return 0.0
    return float((_entry(spec, implementation) or {}).get("one_off_seconds", 0.0))


def backend_one_off(backend: str) -> float:
    """The backend's stored start cost if it has not started in this process, else 0."""
    if backend in _started:
        return 0.0
    return float(stored().get("backends", {}).get(backend, {}).get("start_seconds", 0.0))


def one_off(spec: SolverSpec, implementation: str, problem: Any) -> float:
    """Every one-off cost a run of ``implementation`` on ``problem`` would still pay in this process."""
    return backend_one_off(backend_of(implementation)) + implementation_one_off(spec, implementation, problem)


def is_paid(spec: SolverSpec, implementation: str, problem: Any) -> bool:
    return (spec.name, implementation, _compile_key(spec, implementation, problem)) in _paid


def mark_paid(spec: SolverSpec, implementation: str, problem: Any) -> None:
    _paid.add((spec.name, implementation, _compile_key(spec, implementation, problem)))


def is_started(backend: str) -> bool:
    return backend in _started


def start_backend(backend: Backend) -> float | None:
    """Pay the backend's one-off start in this process (once) and record what it took.

    Returns the seconds it took, or None where it had already started or
    has nothing to start.
    """
    with _lock:
        if backend.name in _started:
            return None
        _started.add(backend.name)
    if backend.start is None:
        return None
    began = time.perf_counter()
    try:
        backend.start()
    except BaseException:
        _started.discard(backend.name)  # not started: the next run tries again
        raise
    seconds = time.perf_counter() - began
    record_start(backend.name, seconds)
    return seconds


def record_start(backend: str, seconds: float) -> None:
    """Add an observed start cost of a backend (the stored one is the median of the last few)."""
    def change(data: dict[str, Any]) -> None:
        _add_observation(data.setdefault("backends", {}).setdefault(backend, {}), "start", seconds)

    if _off():
        change(stored())
        return
    _update(change)


def _add_observation(slot: dict[str, Any], what: str, seconds: float) -> None:
    """Keep the last few observations; the stored cost is their median (one cold cache does not set it)."""
    observations = slot.setdefault(f"{what}_observations", [])
    observations.append(float(seconds))
    del observations[:-ONE_OFF_KEEP]
    slot[f"{what}_seconds"] = statistics.median(observations)


# -- calls made in this process ------------------------------------------------------

def count_call(spec: SolverSpec) -> int:
    """Count one more solve of ``spec`` in this process; returns how many there have been."""
    with _lock:
        _calls[spec.name] = _calls.get(spec.name, 0) + 1
        return _calls[spec.name]


def calls(spec: SolverSpec) -> int:
    return _calls.get(spec.name, 0)


def remember(spec: SolverSpec, features: Mapping[str, float], seconds: Mapping[str, float]) -> None:
    """Keep what measuring the close candidates on one problem found (``plan`` reuses it)."""
    key = (spec.name, tuple(sorted(features.items())))
    _measured.setdefault(key, {}).update(seconds)


def remembered(spec: SolverSpec, features: Mapping[str, float]) -> dict[str, float]:
    return _measured.get((spec.name, tuple(sorted(features.items()))), {})


# -- writing -------------------------------------------------------------------------

def _update(change) -> None:
    global _stored
    if _off():
        return
    with _lock:
        # never raises for the store's faults: where the disk is unusable the change lands in memory
        _stored = store.update(change)


def record_calibration(spec: SolverSpec, implementation: str, records: list[dict[str, Any]],
                       one_off_seconds: float | None, details: Mapping[str, Any]) -> None:
    """Replace the pair's calibration samples (and one-off cost, when measured) on disk now."""
    def change(data: dict[str, Any]) -> None:
        entry = store.solver_entry(data, spec.name, spec.version)
        slot = entry["backends"].setdefault(implementation, {})
        slot.pop(store.SET_ASIDE, None)  # measured again under this configuration
        slot["calibration"] = records
        slot["calibrated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        slot["details"] = dict(details)
        slot.setdefault("history", [])
        if one_off_seconds is not None:
            _add_observation(slot, "one_off", one_off_seconds)
        # never measured (the pair had already run in the calibrating process): unknown, charged as 0
        slot.setdefault("one_off_seconds", 0.0)

    with _lock:
        flush()
        if _off():  # a worker or a disabled store still keeps the models for this process
            change(stored())
            return
        _update(change)


def record_one_off(spec: SolverSpec, implementation: str, seconds: float) -> None:
    """Add an observed one-off cost (a first call's excess over the model) for a calibrated pair."""
    def change(data: dict[str, Any]) -> None:
        entry = data["solvers"].get(spec.name)
        if entry is not None and entry.get("version") == spec.version and implementation in entry["backends"]:
            _add_observation(entry["backends"][implementation], "one_off", seconds)

    _update(change)


def sample_record(spec: SolverSpec, implementation: str, problem: Any, seconds: float,
                  source: str, outputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One timing as stored; with a solve's ``outputs``, the features of the work it really did."""
    done = spec.work_done(problem, outputs) if outputs is not None and spec.work_done is not None else None
    return {"features": model_features(spec, problem, implementation, done),
            "size": float(getattr(problem, spec.size_axis)), "seconds": float(seconds), "source": source,
            "at": time.time()}


def record_solve(spec: SolverSpec, implementation: str, record: dict[str, Any]) -> None:
    """Add a real solve's timing; the model refits on its next use."""
    with _lock:
        _pending.append((spec.name, spec.version, implementation, record))
        entry = _entry(spec, implementation)
        if entry is not None:  # visible to this process's models at once
            entry.setdefault("history", []).append(record)
            del entry["history"][:-HISTORY_LIMIT]
        if time.monotonic() - _last_flush > FLUSH_INTERVAL:
            flush()


def flush() -> None:
    """Write buffered solve timings to the wisdom file."""
    global _last_flush
    with _lock:
        _last_flush = time.monotonic()
        if not _pending or _off():
            _pending.clear()
            return
        batch = list(_pending)
        _pending.clear()

        def change(data: dict[str, Any]) -> None:
            for name, version, implementation, record in batch:
                entry = data["solvers"].get(name)
                if entry is None or entry.get("version") != version or implementation not in entry["backends"]:
                    continue  # only calibrated pairs keep a history
                history = entry["backends"][implementation].setdefault("history", [])
                if any(kept is record for kept in history):
                    continue  # already in this process's copy (record_solve), which the store kept
                history.append(record)
                del history[:-HISTORY_LIMIT]

        _update(change)


atexit.register(flush)
