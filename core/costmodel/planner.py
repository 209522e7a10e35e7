"""The Planner: all the cost model's state in one object, as FFTW's planner holds its wisdom.

It holds the stored timings (the wisdom file's content), the models fitted
from them, the one-off costs this process has paid, the calls counted, the
online loop's races (:mod:`core.costmodel.race`) and the work each solver
was seen to do. ``core.solve`` is plan -> run -> observe on the *current*
planner: the process's default one, or one a caller installs with
:func:`use` (``evaluate`` does, to start each held-out problem from the
calibration alone; tests do, instead of resetting globals).

Models are refitted on a schedule, not on every solve: a solve's sample is
visible at once to the online loop, and reaches the model once a pair's new
samples are as many as it was fitted on (at least :data:`REFIT_AFTER`).
Timings of real solves are buffered and written to the wisdom file at most
every few seconds and at exit.

One-off costs are kept where they are paid, which is a fact about this
*process*, shared by every planner in it (:class:`ProcessFacts`):

- a *backend's* start (process pool, CUDA context, cluster connection) once
  per process, whichever solver pays it;
- an *implementation's* JIT compile once per process, or, for a variant
  that compiles per shape (``SolverSpec.compile_key``), once per shape.
"""

from __future__ import annotations

import atexit
import contextvars
import copy
import functools
import math
import os
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from core.backend import Backend
from core.costmodel import store
from core.costmodel.features import feature_names, model_features
from core.costmodel.fit import CostModel, Sample, fit
from core.costmodel.race import Race
from core.solver import SolverSpec, backend_of
from core.validation import fail

HISTORY_LIMIT = 200  # solve samples kept per (solver, implementation); calibration samples are kept apart
FLUSH_INTERVAL = 5.0
ONE_OFF_KEEP = 9
COMPILED_KEYS_KEPT = 64  # compile keys remembered per implementation whose compiles a disk cache keeps (compiled_here)
WHOLE, SHAPE, CACHED = "whole", "shape", "cached"  # what a run still owes here (Planner._owed_slot)
CALLS_PER_PROCESS = "calls_per_process"  # a solver entry's [process, calls] pairs: how long loops ran before
PROCESSES_KEPT = 9  # recent processes remembered: the median follows a change of habit within a few scripts
REFIT_AFTER = 8  # new solve samples that make a pair's model refit (or a quarter of its samples, if more)
WORK_NEIGHBOURS = 5  # observed problems whose work-done ratio predicts a new problem's
WORK_KEEP = 400  # work observations kept per solver
REPEAT_WINDOW = 8  # a new work observation equal to one of the latest this many is a repeat, not added (_add_work)
PLANNING_KEPT = 8  # replanning times kept per solver (Planner.note_planning)
LOOP_RUNS_KEPT = 15  # a loop's warm runs over their models kept per implementation (Planner.loop_factor)
LOOP_RUNS_NEEDED = 3  # ... before their median is taken as the loop's conditions
LOOP_FACTOR_RANGE = (0.5, 4.0)  # ... within these bounds
LOOP_SCALE = 4.0  # a run whose model lay this factor from a problem's weighs 1/e in that problem's loop factor
LOOP_PRIOR = 1.0  # ... against one run's weight for no loop conditions at all (factor 1): runs at other scales


T = TypeVar("T")


class IdentifiabilityWarning(UserWarning):
    """A cost-model coefficient could not be determined from the samples and was dropped."""


@dataclass
class ProcessFacts:
    """What this process has paid: backends started, implementations compiled (per shape)."""

    started: set[str] = field(default_factory=set)
    paid: set[tuple[str, str, Hashable]] = field(default_factory=set)
    ran: set[tuple[str, str]] = field(default_factory=set)  # (solver, implementation) run here at any shape
    version: int = 0  # bumped when anything is paid: a cached plan's one-offs are then stale
    # plan.py's free-memory readings (when read, each backend's): a fact of the process, so a fresh
    # planner (evaluate's, one per held-out problem) does not open /proc and cgroup files again
    memory_read: tuple[float, dict[str, float | None]] = (-math.inf, {})
    # what planning a known problem again took, by solver (Planner.note_planning): a fact of the host
    planning: dict[str, list[float]] = field(default_factory=dict)
    first_planning: dict[str, list[float]] = field(default_factory=dict)  # and planning a new one
    # warm runs in loops, (model's prediction, run over it, its log), by (solver, implementation) (Planner.loop_factor)
    loop_runs: dict[tuple[str, str], list[tuple[float, float, float]]] = field(default_factory=dict)
    # the undetermined features already reported, by (solver, implementation, features): a fact of the process,
    # so evaluate's fresh planners (one a problem) do not say it again
    warned: set[tuple[str, str, tuple]] = field(default_factory=set)


def problem_key(features: Mapping[str, float]) -> tuple:
    """A problem's identity for the loop: its nominal features (two problems that cost alike are alike)."""
    return tuple(sorted(features.items()))


def numeric_fields(problem: Any) -> dict[str, float]:
    """The problem's positive numeric fields, for finding problems that converge alike.

    Private attributes are no fields: plugins cache derived values on a
    problem (``_largest``, ``_expected_bandwidth``), and counted as fields
    they changed a problem's key between its first call and its second.
    """
    fields = getattr(problem, "__dict__", {})
    kept = fields.get(_FIELDS_KEPT)
    if kept is not None:
        return dict(kept)
    held = _HELD.get()
    if held is not None and held[0] is problem:
        return dict(held[1])
    found = {}
    for name, value in fields.items():
        if name.startswith("_"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value):
            found[name] = float(value)
    params = getattr(type(problem), "__dataclass_params__", None)
    if params is not None and params.frozen and hasattr(problem, "__dict__"):  # (slots: nowhere to keep it)
        # a frozen problem's fields never change: kept on it, as plugins keep their derived values (each
        # call asked three times, 3 us each on the VM for an HJB problem)
        object.__setattr__(problem, _FIELDS_KEPT, dict(found))
    return found


_FIELDS_KEPT = "_crossover_numeric_fields"


def numeric_key(problem: Any) -> tuple:
    """The problem's numeric fields as a sorted tuple: a key for what depends on them (kept on a frozen problem,
    as :func:`numeric_fields` is: the loop's settled step and the plan's view ask for it on every call)."""
    fields = getattr(problem, "__dict__", {})
    kept = fields.get(_KEY_KEPT)
    if kept is not None:
        return kept
    held = _HELD.get()
    if held is not None and held[0] is problem:
        return held[2]
    key = tuple(sorted(numeric_fields(problem).items()))
    if _FIELDS_KEPT in fields:  # numeric_fields kept the fields on it: a frozen problem, so the key too
        object.__setattr__(problem, _KEY_KEPT, key)
    return key


_KEY_KEPT = "_crossover_numeric_key"
# a problem that is not frozen (MFG's: 24 fields) may change between calls, so nothing is kept on it; within one
# core.solve call it does not, and its fields were read three times (the settled key, the view's key and the
# expected work, then the solve's record): 5 us each on the VM, 2-3x that on the H200 host
_HELD: contextvars.ContextVar[tuple[Any, dict[str, float], tuple] | None] = contextvars.ContextVar(
    "crossover_held_fields", default=None)


@contextmanager
def fields_held(problem: Any) -> Iterator[None]:
    """Within the block, :func:`numeric_fields` and :func:`numeric_key` of ``problem`` are read once."""
    if _FIELDS_KEPT in getattr(problem, "__dict__", {}):  # a frozen problem keeps them on itself already
        yield
        return
    found = numeric_fields(problem)
    token = _HELD.set((problem, found, tuple(sorted(found.items()))))
    try:
        yield
    finally:
        _HELD.reset(token)


class Planner:
    """The cost model's state, and the three verbs on it: plan, observe, calibrate.

    ``persist=False`` keeps everything in memory (no wisdom file read or
    written). A new planner starts from the wisdom file with nothing
    measured in this process; :meth:`from_calibration` copies another
    planner's calibration only.
    """

    def __init__(self, *, persist: bool = True, process: ProcessFacts | None = None):
        self.persist = persist
        self.process = process if process is not None else ProcessFacts()
        self._lock = threading.RLock()
        self._stored: dict[str, Any] | None = None
        self._models: dict[tuple[str, str], tuple[tuple, int, CostModel]] = {}
        self._fresh: dict[tuple[str, str], int] = {}  # solve samples since the pair's model was fitted
        self._calls: dict[str, int] = {}
        self._versions: dict[str, str] = {}  # each solver called here: its plugin's version, for its stored entry
        self._calls_written: dict[str, int] = {}
        self._tag = f"{os.getpid()}-{time.time_ns()}"  # this planner's process, among those the store remembers
        self._races: dict[tuple[str, tuple], Race] = {}
        self._work: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {}
        # the last log-field table made for each solver and field names (_work_table)
        self._work_tables: dict[tuple[str, tuple[str, ...]], _LogTable] = {}
        self._retaken: set[tuple[str, str]] = set()
        self._pending: list[tuple[str, str, str, dict[str, Any]]] = []
        self._last_flush = 0.0
        self.epoch = 0  # bumped when a model or a calibration changes: cached views (plan.py) are then stale
        self.fits = 0  # models fitted (or refitted) here: a plan that fitted one is no measure of planning
        self.views: dict[tuple, Any] = {}  # plan.py's cached views of the models, by problem and epoch, and rosters
        self.calibration_checked: dict[str, int] = {}  # calibrate.ensure_calibrated's, by solver: the epoch

    @classmethod
    def from_calibration(cls, other: Planner) -> Planner:
        """A planner holding only ``other``'s calibration samples and one-offs, sharing this process's facts.

        Nothing it learns is written to disk: it is for asking "what would a
        user who only calibrated get?" (``evaluate``).
        """
        data = copy.deepcopy(other.stored())
        for entry in data.get("solvers", {}).values():
            entry.pop(CALLS_PER_PROCESS, None)
            for slot in entry.get("backends", {}).values():
                slot["history"] = []
        fresh = cls(persist=False, process=other.process)
        fresh._stored = data
        return fresh

    # -- the stored timings ------------------------------------------------------------

    def _off(self) -> bool:
        # pool workers run with one thread on a machine fingerprinted for the parent: their timings
        # would describe another configuration, and their fingerprint would call the parent's file stale
        return not self.persist or os.environ.get("CROSSOVER_POOL_WORKER") == "1"

    def stored(self) -> dict[str, Any]:
        with self._lock:
            if self._stored is None:
                self._stored = store.empty() if self._off() else store.load()
            return self._stored

    def forget(self) -> None:
        """Drop everything this planner holds in memory (it reads the wisdom file again on next use)."""
        with self._lock:
            if self.persist:
                store.forget()
            self._stored = None
            self._models.clear()
            self._fresh.clear()
            self._calls.clear()
            self._races.clear()
            self._work.clear()
            self._work_tables.clear()
            self.views.clear()
            self.process.warned.clear()
            self._retaken.clear()
            self._pending.clear()
            self.process.started.clear()
            self.process.paid.clear()
            self.process.ran.clear()
            self.process.memory_read = (-math.inf, {})
            self.process.loop_runs.clear()  # runs over the models forgotten here
            self.epoch += 1

    def export(self) -> dict[str, Any]:
        """The stored timings as plain JSON-able data (what the wisdom file holds)."""
        self.flush()
        return copy.deepcopy(self.stored())

    def import_(self, data: Mapping[str, Any]) -> None:
        """Replace the stored timings with ``data`` (from :meth:`export`), in memory and, if persisting, on disk.

        Checked before anything is replaced: what this planner holds is never
        swapped for something that is not an export.
        """
        solvers = data.get("solvers") if isinstance(data, Mapping) else None
        if not isinstance(solvers, Mapping) or not all(isinstance(entry, Mapping) for entry in solvers.values()):
            raise fail("data", data, "must be what Planner.export() returned: a mapping whose 'solvers' maps "
                                     "each solver to its entry")
        copied = copy.deepcopy(dict(data))

        def change(current: dict[str, Any]) -> None:
            current.clear()
            current.update(copied)

        with self._lock:
            self._stored = copied if self._off() else store.update(change)
            self._models.clear()
            self._work.clear()
            self._work_tables.clear()
            self.epoch += 1

    def entry(self, spec: SolverSpec, implementation: str) -> dict[str, Any] | None:
        entry = self.stored()["solvers"].get(spec.name)
        if entry is None or entry.get("version") != spec.version:
            return None
        return entry["backends"].get(implementation)

    def take_set_aside(self, spec: SolverSpec) -> list[str]:
        """Implementations of ``spec`` whose timings a configuration change set aside, to measure again.

        Each is returned once, so a measurement that fails is not retried on every call.
        """
        entry = self.stored()["solvers"].get(spec.name)
        if entry is None or entry.get("version") != spec.version:
            return []
        with self._lock:
            found = [key for key, slot in entry["backends"].items() if store.SET_ASIDE in slot
                     and not slot.get("calibration") and (spec.name, key) not in self._retaken]
            self._retaken.update((spec.name, key) for key in found)
        return found

    # -- models ------------------------------------------------------------------------

    def samples(self, spec: SolverSpec, implementation: str) -> list[Sample]:
        """Calibration and solve samples, one per distinct feature vector (median of repeats).

        Collapsing repeats keeps a thousand solves at one size from outweighing
        the rest of the design in the fit.
        """
        entry = self.entry(spec, implementation) or {}
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

    def model(self, spec: SolverSpec, implementation: str) -> CostModel | None:
        """The fitted model for the pair, or None if it was never calibrated here.

        Refitted when its calibration changed, or once the new solve samples
        are as many as those it was fitted on (at least :data:`REFIT_AFTER`):
        a refit per solve made planning most of a small solve's cost, and a
        loop's repeated problem adds no new point to the fit anyway (the
        online loop follows it from its own samples).
        """
        entry = self.entry(spec, implementation)
        if not entry or not entry.get("calibration"):
            return None
        signature = (id(entry), id(entry["calibration"]), len(entry["calibration"]))
        pair = (spec.name, implementation)
        with self._lock:
            cached = self._models.get(pair)
            fresh = self._fresh.get(pair, 0)
            if cached is None or cached[0] != signature or fresh >= max(REFIT_AFTER, cached[1]):
                fitted = self._fit(spec, implementation, entry)
                self.fits += 1
                if fitted is None:
                    return None
                records = len(entry["calibration"]) + len(entry.get("history", []))
                cached = (signature, records, fitted)
                if pair in self._models:
                    # a refit: views built on the old model are stale. A first fit replaces none (bumped
                    # then, it made a new planner build each view twice: a small solve's second call
                    # paid 0.39 ms of overhead instead of 0.12 on the VM)
                    self.epoch += 1
                self._models[pair] = cached
                self._fresh[pair] = 0
                self._report_undetermined(spec, implementation, cached[2])
            return cached[2]

    def _fit(self, spec: SolverSpec, implementation: str, entry: Mapping[str, Any]) -> CostModel | None:
        """The pair's fit on its samples (None with none), shared by this process's planners.

        With no solve history the fit is one of the calibration alone, found
        by the records' times (a fresh planner from the same calibration,
        one per held-out problem in ``evaluate``, asks again): collapsing
        the samples just to key :func:`fit_once` was a third of a fresh
        planner's first plan.
        """
        def on_samples() -> CostModel | None:
            found = self.samples(spec, implementation)
            return fit_once(found, feature_names(spec, implementation)) if found else None

        if entry.get("history"):
            return on_samples()
        key = (spec.name, implementation, feature_names(spec, implementation),
               tuple((record.get("at"), record["seconds"]) for record in entry["calibration"]))
        return _shared(_CALIBRATION_FITS, key, on_samples)

    def _report_undetermined(self, spec: SolverSpec, implementation: str, fitted: CostModel) -> None:
        # a feature that was 0 in every sample (a cache spill no calibrated problem reached: the H200 host's
        # 300 MiB cache) lent no time to the others, and where a problem moves it the prediction is marked
        # extrapolated anyway: no news. Said once per fit, it filled an H200 evaluation's log with 84 warnings
        moved = tuple(name for name in fitted.undetermined if fitted.ranges.get(name) != (0.0, 0.0))
        key = (spec.name, implementation, moved)
        if moved and key not in self.process.warned:
            self.process.warned.add(key)
            warnings.warn(f"cost model of {spec.name} on {implementation}: the samples cannot determine "
                          f"{', '.join(repr(n) for n in moved)} (it moved only with other features); "
                          "dropped from the fit, and predictions off the measured span are marked extrapolated",
                          IdentifiabilityWarning, stacklevel=4)

    # -- expected work -----------------------------------------------------------------

    def _work_seen(self, spec: SolverSpec) -> list[tuple[dict[str, float], dict[str, float]]]:
        """(problem's numeric fields, done / nominal ratio per feature) for every sample that recorded both."""
        with self._lock:
            seen = self._work.get(spec.name)
            if seen is None:
                records = []
                entry = self.stored()["solvers"].get(spec.name)
                if entry is not None and entry.get("version") == spec.version:
                    records = [record for slot in entry["backends"].values()
                               for record in slot.get("calibration", []) + slot.get("history", [])
                               if "nominal" in record and "fields" in record]
                # shared by this process's planners over the same records (evaluate's fresh planner per
                # problem rebuilt it, and _nearest_work's table, on every first call: 0.1 ms on the VM)
                key = (spec.name, tuple((record.get("at"), record["seconds"]) for record in records))
                seen = _shared(_WORK_SEEN, key, lambda: _distinct([_work_observation(r) for r in records])[-WORK_KEEP:])
                self._work[spec.name] = seen
            return seen

    def expected_work(self, spec: SolverSpec, problem: Any, nominal: Mapping[str, float]) -> dict[str, float]:
        """The features a solve of ``problem`` is expected to do: nominal, scaled by what similar problems did.

        Work that depends on convergence (Picard or LM iterations, steps)
        is known only after a solve (``SolverSpec.work_done``). Each feature's
        done-over-nominal ratio is the median over the :data:`WORK_NEIGHBOURS`
        observed problems nearest in log space of their numeric fields
        (sizes, tolerances, caps), so a tighter tolerance expects more work.
        """
        if spec.work_done is None:
            return dict(nominal)
        seen = self._work_seen(spec)
        if not seen:
            return dict(nominal)
        here = numeric_fields(problem)
        nearest = [seen[i] for i in self._nearest_work(spec, seen, here)]
        expected = {}
        for name, value in nominal.items():
            ratios = [ratios[name] for _, ratios in nearest if name in ratios]
            expected[name] = value * _median(ratios) if ratios else value
        return expected

    def _nearest_work(self, spec: SolverSpec, seen: list, here: Mapping[str, float]) -> list[int]:
        """Indices of the :data:`WORK_NEIGHBOURS` observations nearest ``here``, ties in order.

        The distance: the squared differences of the log fields they share,
        plus one per field of ``here`` the observation lacks (infinite when
        they share none).

        In numpy over a table of the observations' log fields, grown as
        observations are added (:meth:`_work_table`): sorting them in Python
        took 90-210 us a plan on the VM, a third of a first call's overhead
        on a small problem.
        """
        names = tuple(here)
        table = self._work_table(spec.name, seen, names)
        logs = [math.log(here[n]) for n in names]
        # sum(mask * (log there - log here)^2) + missing, expanded: the table's layout (_log_row) leaves one
        # matrix-vector product per plan (6 us over 400 observations on the VM, where the differences,
        # squares and sum took 19), its last column (the observation's own share) weighed 1
        distance = table @ np.array([-2.0 * x for x in logs] + [x * x for x in logs] + [1.0])
        # the expansion rounds otherwise than the differences: equal distances (equal fields) stay equal
        return np.argsort(distance.round(9), kind="stable")[:WORK_NEIGHBOURS].tolist()

    def _work_table(self, solver: str, seen: list, names: tuple[str, ...]) -> np.ndarray:
        """The log-field table of ``seen`` (:func:`_log_table`), grown from this planner's last one where it can be.

        Grown as a plan asks for it, not as a solve adds an observation: a
        loop that settles plans nothing more, and growing the table on each
        of its solves cost 5-6 us a call on the VM that no plan then read.
        Made afresh, a long-lived planner's first call on each new problem
        rebuilt it over up to :data:`WORK_KEEP` observations, and its
        overhead grew from 0.29 ms to 0.77 ms over 200 small HJB problems;
        grown by a copy, 28 us of a first call's (:class:`_LogTable`).
        """
        earlier = self._work_tables.get((solver, names))
        if earlier is not None and earlier.seen is seen:
            return earlier.rows()
        if earlier is None or not earlier.grow(seen, names):
            # made afresh: shared by this process's planners over the same observations (evaluate's fresh planner
            # per problem), until one grows its copy. A list of observations is never changed in place (_add_work
            # makes a new one), so it is its table's key; the entry holds the list, so its id is not reused
            # while the table is kept
            table = _shared(_WORK_TABLES, (id(seen), names), lambda: (seen, _log_table(seen, names)))[1]
            self._work_tables[(solver, names)] = _LogTable(seen, table)
            return table
        return earlier.rows()

    def _add_work(self, spec: SolverSpec, record: Mapping[str, Any]) -> None:
        """Add a solve's work observation (the next plan grows its log table by it: :meth:`_work_table`)."""
        if "nominal" not in record or "fields" not in record:
            return
        seen = self._work_seen(spec)  # a new list: the old one may be shared (_work_seen)
        observation = _work_observation(record)
        # a loop's calls of one problem did the same work: one observation of it, not one per call. Three copies
        # of each problem made a long-lived planner's table three times the size with nothing more in it, and the
        # nearest "five" problems often two; its first call on a new small HJB problem spent 64-68 us on the
        # expected work, 50-57 with one per problem (the VM; a fresh planner's: 25)
        if observation not in seen[-REPEAT_WINDOW:]:
            self._work[spec.name] = [*seen, observation][-WORK_KEEP:]

    # -- one-off costs -----------------------------------------------------------------

    def _paid_key(self, spec: SolverSpec, implementation: str, problem: Any) -> tuple[str, str, Hashable]:
        shape = spec.compile_key(problem, implementation) if spec.compile_key is not None else ()
        return spec.name, implementation, shape

    def implementation_one_off(self, spec: SolverSpec, implementation: str, problem: Any,
                               run_seconds: float | None = None) -> float:
        """The implementation's stored one-off if still unpaid here for this problem's shape, else 0.

        Its first run in the process pays the whole one-off (a JIT, a
        compile); a run at a new shape after that pays the one-off of a
        shape (:meth:`_shape_one_off`, where calibration or earlier solves
        measured it; else the whole one-off: :meth:`_owed_slot`).
        torch.compile's linreg epoch took 18.7 s to compile in a process and
        15-90 ms at each new size after it (H200 host): charged the first
        per size, a contender was never worth a trial; charged nothing, a
        trial on a 7 ms problem paid 338 ms unforeseen.
        """
        return self._owed_one_off(spec, implementation, problem, self._owed_slot(spec, implementation, problem),
                                  run_seconds)

    def _owed_one_off(self, spec: SolverSpec, implementation: str, problem: Any,
                      owed: tuple[dict[str, Any], str] | None, run_seconds: float | None) -> float:
        if owed is None:
            return 0.0
        slot, kind = owed
        if kind == SHAPE:
            return self._shape_one_off(spec, implementation, problem, slot, run_seconds)
        return float(slot.get("cached_one_off_seconds" if kind == CACHED else "one_off_seconds", 0.0))

    def _owed_slot(self, spec: SolverSpec, implementation: str, problem: Any) -> tuple[dict[str, Any], str] | None:
        """The implementation's stored slot where a run on ``problem`` still owes a one-off here (None where this
        shape is paid), and what it owes: :data:`WHOLE` (its first run here), :data:`SHAPE` (a new shape after it
        ran at another) or :data:`CACHED` (a new shape here that a disk cache keeps compiled from an earlier
        process: :meth:`compiled_here`). A store from before shapes were measured apart owes the whole one-off
        at each shape."""
        key = self._paid_key(spec, implementation, problem)
        if key in self.process.paid:
            return None
        slot = self.entry(spec, implementation) or {}
        if not (self.has_run(spec, implementation) and "shape_one_off_seconds" in slot):
            return slot, WHOLE
        return slot, CACHED if _compiled_in(slot, spec, implementation, key[2]) else SHAPE

    def compiled_here(self, spec: SolverSpec, implementation: str, problem: Any) -> bool:
        """Whether a run of ``implementation`` on ``problem`` meets a compile that a disk cache keeps from an
        earlier process on this machine (``SolverSpec.compile_cached``), its shape not yet paid here.

        Triton keeps every kernel it compiles on disk, so a later process
        loads it: on the H200 host a common-noise problem's first call on
        ``torch:hjb_fused`` took 7.8 ms at a key calibration had compiled,
        its warm runs 7.5, where the planner charged the 0.8-2.2 s of a
        compile, and the plan ran the process pool, 20 % slower, on all
        three calls; spectra's Triton variants were not tried on 2-spectrum
        fits they ran 22-32 % faster.
        """
        owed = self._owed_slot(spec, implementation, problem)
        return owed is not None and owed[1] == CACHED

    def _shape_one_off(self, spec: SolverSpec, implementation: str, problem: Any, slot: Mapping[str, Any],
                       run_seconds: float | None = None) -> float:
        """A new shape's one-off: the line through the stored (one-off, warm run) pairs at the problem's run
        (``run_seconds``, the plan's model prediction; else its model's at the nominal features), where the
        pairs span sizes (:func:`shape_one_off_line`); else their median.

        What a new shape costs can grow with it: in one process on the H200
        host torch.compile's linreg epoch paid 18 ms at 2M samples, 53 at
        7.7M and 91 at 16M, where torch:graph's capture cost 3-4 ms at any
        size, and a median of small shapes charges a large one too little.
        """
        pairs = slot.get("shape_one_off_pairs")
        line = shape_one_off_line(pairs) if pairs else None
        if line is not None and run_seconds is None and (fitted := self.model(spec, implementation)) is not None:
            run_seconds = fitted.predict(model_features(spec, problem, implementation))[0]
        if line is None or run_seconds is None:
            return float(slot["shape_one_off_seconds"])
        return line[0] + line[1] * max(0.0, run_seconds)

    def one_off_at_stake(self, spec: SolverSpec, implementation: str, problem: Any) -> float:
        """The most a run of ``implementation`` on ``problem`` may still pay here: its backend's start, and its
        whole one-off, or once it has run, the largest shape's one-off seen (0 where this shape is paid).

        What a near-tie weighs (plan.choose): the planner charges a new
        shape the line through what shapes cost (:meth:`_shape_one_off`),
        which is right on the whole and can miss one shape by far. On the
        H200 host torch.compile's linreg epoch paid 0-2 ms at most new
        sizes in calibration, 398 ms at one (a recompile for dynamic
        shapes) and 351 ms at 7.7M samples in another process, where
        torch:graph's captures never took over 15 ms.
        """
        return _at_stake(self.backend_one_off(backend_of(implementation)),
                         self._owed_slot(spec, implementation, problem))

    def one_offs(self, spec: SolverSpec, implementation: str, problem: Any,
                 run_seconds: float | None = None) -> tuple[float, float]:
        """What a run of ``implementation`` on ``problem`` would still pay here (:meth:`one_off`), and the most it
        may pay (:meth:`one_off_at_stake`; 0 where it owes nothing), from one look at the store and the paid shapes:
        a plan asks both of every candidate, and each look was 1.5 us of a small problem's first plan on the VM."""
        backend = self.backend_one_off(backend_of(implementation))
        owed = self._owed_slot(spec, implementation, problem)
        due = backend + self._owed_one_off(spec, implementation, problem, owed, run_seconds)
        return due, (_at_stake(backend, owed) if due else 0.0)

    def has_run(self, spec: SolverSpec, implementation: str) -> bool:
        """Whether the implementation has run in this process, at any shape (its whole one-off is paid)."""
        return (spec.name, implementation) in self.process.ran

    def backend_one_off(self, backend: str) -> float:
        """The backend's stored start cost if it has not started in this process, else 0."""
        if backend in self.process.started:
            return 0.0
        return float(self.stored().get("backends", {}).get(backend, {}).get("start_seconds", 0.0))

    def one_off(self, spec: SolverSpec, implementation: str, problem: Any, run_seconds: float | None = None) -> float:
        """Every one-off cost a run of ``implementation`` on ``problem`` would still pay in this process
        (``run_seconds``: its model's prediction there, which a new shape's one-off may grow with)."""
        return self.backend_one_off(backend_of(implementation)) + self.implementation_one_off(spec, implementation,
                                                                                               problem, run_seconds)

    def is_paid(self, spec: SolverSpec, implementation: str, problem: Any) -> bool:
        return self._paid_key(spec, implementation, problem) in self.process.paid

    def mark_paid(self, spec: SolverSpec, implementation: str, problem: Any) -> None:
        key = self._paid_key(spec, implementation, problem)
        if key not in self.process.paid:
            self.process.paid.add(key)
            self.process.ran.add((spec.name, implementation))
            self.process.version += 1
            if implementation in spec.compile_cached:
                self._note_compiled(spec, implementation, key[2])

    def _note_compiled(self, spec: SolverSpec, implementation: str, shape: Hashable) -> None:
        """Remember in the store that this machine compiled ``shape`` (:meth:`compiled_here`); a pair not yet
        stored gets it from :meth:`record_calibration`, which adds the shapes its calibration paid."""
        def change(data: dict[str, Any]) -> None:
            entry = data["solvers"].get(spec.name)
            if entry is not None and entry.get("version") == spec.version and implementation in entry["backends"]:
                _add_compiled(entry["backends"][implementation], [shape])

        if not _compiled_in(self.entry(spec, implementation) or {}, spec, implementation, shape):
            self._change(change)

    def start_backend(self, backend: Backend) -> float | None:
        """Pay the backend's one-off start in this process (once) and record what it took.

        Returns the seconds it took, or None where it had already started or
        has nothing to start.
        """
        with self._lock:
            if backend.name in self.process.started:
                return None
            self.process.started.add(backend.name)
            self.process.version += 1
        if backend.start is None:
            return None
        began = time.perf_counter()
        try:
            backend.start()
        except BaseException:
            self.process.started.discard(backend.name)  # not started: the next run tries again
            raise
        seconds = time.perf_counter() - began
        self.record_start(backend.name, seconds)
        return seconds

    def record_start(self, backend: str, seconds: float) -> None:
        """Add an observed start cost of a backend (the stored one is the median of the last few)."""
        self._change(lambda data: _add_observation(data.setdefault("backends", {}).setdefault(backend, {}),
                                                   "start", seconds))

    def record_one_off(self, spec: SolverSpec, implementation: str, seconds: float, shape: bool = False,
                       run_seconds: float | None = None, cached: bool = False) -> None:
        """Add an observed one-off cost (a first call's excess over the model) for a calibrated pair: the whole
        one-off, or with ``shape`` that of a new shape after the implementation had run at another (with
        ``run_seconds``, the warm run it came with: :meth:`_shape_one_off`); with ``cached`` too, of a shape
        a disk cache kept compiled (:meth:`compiled_here`), which new shapes' compiles do not learn from."""
        def change(data: dict[str, Any]) -> None:
            entry = data["solvers"].get(spec.name)
            if entry is not None and entry.get("version") == spec.version and implementation in entry["backends"]:
                slot = entry["backends"][implementation]
                if cached:  # a shape's load, which a new shape's compile does not learn from
                    _add_observation(slot, "cached_one_off", seconds)
                    return
                _add_observation(slot, "shape_one_off" if shape else "one_off", seconds)
                if shape and run_seconds is not None:
                    _add_shape_pair(slot, seconds, run_seconds)

        self._change(change)

    # -- calls and the online loop -----------------------------------------------------

    def count_call(self, spec: SolverSpec) -> int:
        """Count one more solve of ``spec``; returns how many there have been."""
        with self._lock:
            self._calls[spec.name] = self._calls.get(spec.name, 0) + 1
            self._versions[spec.name] = spec.version
            return self._calls[spec.name]

    def calls(self, spec: SolverSpec) -> int:
        return self._calls.get(spec.name, 0)

    def note_planning(self, spec: SolverSpec, seconds: float, known: bool = True) -> None:
        """What planning a problem of ``spec`` took (the plan and the step): a ``known`` one again (its plan from
        a cached view), or a new one (its view built)."""
        with self._lock:
            kept = (self.process.planning if known else self.process.first_planning).setdefault(spec.name, [])
            kept.append(seconds)
            del kept[:-PLANNING_KEPT]

    def note_loop_run(self, solver: str, implementation: str, seconds: float, model: float | None) -> None:
        """A warm run in a loop, against its model's prediction for that problem (:meth:`loop_factor`)."""
        if model is None or not model > 0 or not seconds > 0:
            return
        with self._lock:
            kept = self.process.loop_runs.setdefault((solver, implementation), [])
            kept.append((model, seconds / model, math.log(model)))  # the log for scale_weighted_factor
            del kept[:-LOOP_RUNS_KEPT]

    def loop_factor(self, solver: str, implementation: str, model: float | None = None) -> float:
        """How much slower than its model an implementation runs in this process's loops (1 until known).

        The models are fitted on back-to-back runs (calibration); a loop's
        calls run between plans and the user's own code, which leave its
        caches cold and its threads asleep. On the H200 host linreg's
        numba:serial ran its loops' warm calls at 1.9-2.7x its model,
        torch:graph at 1.3-1.7x, and the truth's back-to-back runs within
        10 % of both; on the VM spectra's numba:threads ran at 1.3-2.2x,
        numba:serial at 1.0x. Compared with another's bare model, a leader's
        run then looked slow: the loop ran it again to confirm a run that was
        no outlier, and moved to the contender on its third call (the
        models' pick, numba:threads, 0.20 ms; torch:graph, captured for the
        new size at 2.9 ms, then 0.22 ms). The median of the latest warm runs
        in loops over their models, per implementation, converts a loop's
        runs into the models' terms (:meth:`observe`), so implementations
        compare as the back-to-back runs that judge them; predictions and
        results stay as measured.

        An implementation not yet run warm in a loop takes its family's (its
        backend's other implementations'), as a loop scales a leader's
        siblings by its runs (:func:`~core.costmodel.race.in_the_loops_conditions`):
        with the leader's factor known and a sibling's taken as 1, the
        sibling looked faster than every run of the leader and a settled
        loop planned in full on every call.

        The conditions are costs of a call more than of its work (threads to
        wake, a wall-clock path, caches to refill), so they weigh less the
        longer the run: ``model`` (the problem's model prediction) weighs each
        kept run by how near its own model lay (:func:`scale_weighted_factor`),
        against no conditions at all. On the H200 host linreg's torch:graph
        ran its sub-millisecond loops at 1.5-2.6x the back-to-back time, its
        19 ms ones at 0.95-1.0x: taken at 1.5x there, a 19 ms run counted as
        12.7, under numba:threads' model, and the loop kept torch:graph for
        its third call, 48 % slower than numba:threads.
        """
        kept = self.process.loop_runs.get((solver, implementation))
        if not kept or len(kept) < LOOP_RUNS_NEEDED:
            family = backend_of(implementation)
            kept = [run for (name, key), runs in list(self.process.loop_runs.items())
                    if name == solver and len(runs) >= LOOP_RUNS_NEEDED and backend_of(key) == family
                    for run in runs]
            if not kept:
                return 1.0
        low, high = LOOP_FACTOR_RANGE
        factor = (_median([ratio for _, ratio, _ in kept]) if model is None or not model > 0
                  else scale_weighted_factor(kept, model))
        return min(high, max(low, factor))

    def replanning_seconds(self, spec: SolverSpec) -> float:
        """What a trial's replans cost: the median of the latest times to plan a known problem again; before
        any, of those to plan a new one (0 before either).

        A loop that settles never plans a known problem again, so a process
        whose loops had all settled priced a trial's replans at nothing:
        on the VM a linreg loop tried numba:threads, tied with numba:serial
        by their models at 29 us, and its calls 2 and 3 planned in full at
        0.24 and 0.14 ms (1.8x the calls naming the best). A new problem's
        plan builds the view a replan reuses, so it overstates a replan:
        the trials it lets through are surely worth it.
        """
        kept = self.process.planning.get(spec.name) or self.process.first_planning.get(spec.name)
        return _median(kept) if kept else 0.0

    def past_calls(self, spec: SolverSpec) -> float | None:
        """The median number of calls of ``spec`` that earlier processes made (None before any was seen).

        The prior on how long this process's loop will be: a user whose
        scripts solve a problem eight times pays numba's one-off (0.4 s on
        the VM, against numpy's 0.18 s per call at FP N=50,000) on the
        first call of the next script, not after two numpy calls have
        shown that the calls go on (2.2x the best fixed backend's total).
        """
        entry = self.stored().get("solvers", {}).get(spec.name)
        if not isinstance(entry, dict) or entry.get("version") != spec.version:
            return None
        counts = [count for tag, count in _process_calls(entry) if tag != self._tag]
        return float(statistics.median(counts)) if counts else None

    def race(self, spec: SolverSpec, nominal: Mapping[str, float]) -> Race:
        """The online loop's state for this problem (created empty on first use)."""
        key = (spec.name, problem_key(nominal))
        with self._lock:
            found = self._races.get(key)
            if found is None:
                found = self._races[key] = Race()
            return found

    def known_race(self, spec: SolverSpec, nominal: Mapping[str, float]) -> Race | None:
        return self._races.get((spec.name, problem_key(nominal)))

    def observe(self, spec: SolverSpec, implementation: str, problem: Any, seconds: float,
                outputs: Mapping[str, Any] | None, cold: bool, nominal: Mapping[str, float] | None = None,
                first_touch: bool = False, model: float | None = None, trial: bool = False) -> None:
        """Learn from one solve: the loop's estimate for this problem, and (if warm) the model's history.

        ``first_touch``: the first run on this problem in this planner, which
        paid what later runs do not (its arrays' first pages, cold caches): the
        model's history keeps it, the loop's estimate does not. ``model``: the
        plan's model-alone prediction for the run (its loop factor's scale).

        ``trial``: a contender's run in the leader's place, which must win in
        the loop's own conditions: its loop factor counts only where under 1.
        A factor learnt on other problems holds the model's misses there as
        well as the loop's conditions, and on the VM the process pool's, 3,
        made a 133 ms trial count as 43 ms, under numba:threads' 60 ms model
        (44.7 ms back to back, the pool 58): the third call ran the pool, 30 %
        slower. The leader's own runs are converted in full (rule 7: it is
        what the loop keeps running, and a contender's bare model must not
        outrun its every run).
        """
        nominal = spec.features(problem) if nominal is None else nominal
        # in the models' terms: a run over this process's loop factor (loop_factor), so that runs and models
        # of different implementations compare as the back-to-back runs that calibrated them
        factor = self.loop_factor(spec.name, implementation, model)
        self.race(spec, nominal).add(implementation, seconds / (min(1.0, factor) if trial else factor),
                                     cold or first_touch)
        if not cold:  # a call that paid a one-off would bias the steady-state model
            self.record_solve(spec, implementation,
                              sample_record(spec, implementation, problem, seconds, "solve", outputs, nominal))

    # -- writing -----------------------------------------------------------------------

    def _change(self, change) -> None:
        with self._lock:
            if self._off():
                change(self.stored())
                return
            # never raises for the store's faults: where the disk is unusable the change lands in memory
            self._stored = store.update(change)

    def record_calibration(self, spec: SolverSpec, implementation: str, records: list[dict[str, Any]],
                           one_off_seconds: float | None, details: Mapping[str, Any],
                           shape_one_offs: Sequence[tuple[float, float]] = (),
                           cached_one_offs: Sequence[float] = ()) -> None:
        """Store the pair's calibration samples, merged by :func:`~core.costmodel.store.merge_calibration`
        (and its one-off cost, when measured) now."""
        def change(data: dict[str, Any]) -> None:
            entry = store.solver_entry(data, spec.name, spec.version)
            slot = entry["backends"].setdefault(implementation, {})
            slot.pop(store.SET_ASIDE, None)  # measured again under this configuration
            # merged with what the file holds as it is written (idempotent on records merged already),
            # so a calibration another process stored meanwhile is kept too
            slot["calibration"] = store.merge_calibration(slot.get("calibration", []), records)
            slot["calibrated_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            slot["details"] = dict(details)
            slot.setdefault("history", [])
            if one_off_seconds is not None:
                _add_observation(slot, "one_off", one_off_seconds)
            # the warm-ups at shapes after the first, each with its warm run (Planner.implementation_one_off)
            for seconds, run_seconds in shape_one_offs:
                _add_observation(slot, "shape_one_off", seconds)
                _add_shape_pair(slot, seconds, run_seconds)
            for seconds in cached_one_offs:  # shapes an earlier calibration compiled, loaded (compiled_here)
                _add_observation(slot, "cached_one_off", seconds)
            if implementation in spec.compile_cached:  # the shapes this calibration compiled: later processes load them
                _add_compiled(slot, compiled)
            # never measured (the pair had already run in the calibrating process): unknown, charged as 0
            slot.setdefault("one_off_seconds", 0.0)

        compiled = [key[2] for key in self.process.paid if key[:2] == (spec.name, implementation)]
        with self._lock:
            self.flush()
            self._change(change)
            self._work.pop(spec.name, None)
            self.epoch += 1

    def record_solve(self, spec: SolverSpec, implementation: str, record: dict[str, Any]) -> None:
        """Add a real solve's timing; the model refits on its schedule."""
        with self._lock:
            if not self._off():
                self._pending.append((spec.name, spec.version, implementation, record))
            entry = self.entry(spec, implementation)
            if entry is not None:  # visible to this process's models at their next refit
                entry.setdefault("history", []).append(record)
                del entry["history"][:-HISTORY_LIMIT]
                pair = (spec.name, implementation)
                self._fresh[pair] = self._fresh.get(pair, 0) + 1
                cached = self._models.get(pair)
                if cached is not None and self._fresh[pair] >= max(REFIT_AFTER, cached[1]):
                    self.epoch += 1  # due for a refit: the next plan builds its view again, and refits
            self._add_work(spec, record)
            if time.monotonic() - self._last_flush > FLUSH_INTERVAL:
                self.flush()

    def flush(self) -> None:
        """Write buffered solve timings to the wisdom file."""
        with self._lock:
            self._last_flush = time.monotonic()
            counted = {name: count for name, count in self._calls.items() if self._calls_written.get(name) != count}
            if not (self._pending or counted) or self._off():
                self._pending.clear()
                return
            batch = list(self._pending)
            self._pending.clear()
            self._calls_written.update(counted)
            versions, tag = dict(self._versions), self._tag

            def change(data: dict[str, Any]) -> None:
                for name, count in counted.items():
                    entry = data["solvers"].get(name)
                    if entry is not None and entry.get("version") == versions.get(name):
                        kept = [[t, c] for t, c in _process_calls(entry) if t != tag] + [[tag, count]]
                        entry[CALLS_PER_PROCESS] = kept[-PROCESSES_KEPT:]
                for name, version, implementation, record in batch:
                    entry = data["solvers"].get(name)
                    if entry is None or entry.get("version") != version or implementation not in entry["backends"]:
                        continue  # only calibrated pairs keep a history
                    history = entry["backends"][implementation].setdefault("history", [])
                    if any(kept is record for kept in history):
                        continue  # already in this process's copy (record_solve), which the store kept
                    history.append(record)
                    del history[:-HISTORY_LIMIT]

            self._stored = store.update(change)


def sample_record(spec: SolverSpec, implementation: str, problem: Any, seconds: float, source: str,
                  outputs: Mapping[str, Any] | None = None,
                  nominal: Mapping[str, float] | None = None) -> dict[str, Any]:
    """One timing as stored: the features of the work done (from ``outputs``), the nominal ones, the fields."""
    nominal = dict(spec.features(problem) if nominal is None else nominal)
    done = spec.work_done(problem, outputs) if outputs is not None and spec.work_done is not None else None
    record = {"features": model_features(spec, problem, implementation, done or nominal),
              "size": float(getattr(problem, spec.size_axis)), "seconds": float(seconds), "source": source,
              "at": time.time()}
    if done is not None:  # what the expected-work model learns from
        record["nominal"] = {name: float(value) for name, value in nominal.items()}
        record["fields"] = numeric_fields(problem)
    return record


def _work_observation(record: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """A solve record's (numeric fields, done / nominal ratio per feature), for the expected-work model."""
    return record["fields"], _ratios(record["nominal"], record["features"])


def _distinct(observations: list) -> list:
    """The observations less exact repeats, in order of their first: a calibration times each problem on every
    implementation, and each one's record of the same work is the same observation (as a loop's repeated calls
    are, which :meth:`Planner._add_work` does not add)."""
    found = {}
    for fields, ratios in observations:
        # sorted: the stored records' keys are sorted, the latest calibration's in memory are not
        found.setdefault((tuple(sorted(fields.items())), tuple(sorted(ratios.items()))), (fields, ratios))
    return list(found.values())


def _ratios(nominal: Mapping[str, float], done: Mapping[str, float]) -> dict[str, float]:
    return {name: float(done[name]) / float(value) for name, value in nominal.items()
            if name in done and float(value) > 0}


_FITS: dict[tuple, CostModel] = {}  # fits by their samples' content, shared by this process's planners
_CALIBRATION_FITS: dict[tuple, CostModel | None] = {}  # fits of a calibration alone, by its records' times
_WORK_SEEN: dict[tuple, list] = {}  # work observations, by their records' times (Planner._work_seen)
_WORK_TABLES: dict[tuple, tuple] = {}  # their log-field tables, by list and field names (Planner._nearest_work)


def _log_table(seen: list, names: tuple[str, ...]) -> np.ndarray:
    """The observations' log fields for :meth:`Planner._nearest_work`, one row each (:func:`_log_row`), in
    column order (a plan reads its columns)."""
    rows = [_log_row(fields, names) for fields, _ in seen]
    return np.asfortranarray(np.array(rows, dtype=float).reshape(len(seen), 2 * len(names) + 1))


class _LogTable:
    """A planner's log-field table of a list of observations (:func:`_log_table`), grown in place.

    Rows are written after the last in a buffer with room for
    :data:`WORK_KEEP` more, and the table is a view of its last
    ``len(seen)``: copied whole on
    each growth (and its old copies kept), a long-lived planner's first call
    on a new small HJB problem spent 28-100 us growing it on the VM. A table
    shared with other planners (:data:`_WORK_TABLES`) is copied into a
    buffer of this planner's own before its first growth.
    """

    def __init__(self, seen: list, table: np.ndarray):
        self.seen, self.buffer, self.stop = seen, table, len(table)
        self.own: np.ndarray | None = None  # the buffer this planner made (None while the table is a shared one)

    def rows(self) -> np.ndarray:
        return self.buffer[self.stop - len(self.seen):self.stop]

    def grow(self, seen: list, names: tuple[str, ...]) -> bool:
        """Grow to the observations ``seen``; False where they do not continue this table's (observations are
        only appended, the oldest dropped past :data:`WORK_KEEP`)."""
        if not self.seen or not seen:
            return False
        last = self.seen[-1]
        at = next((i for i in range(len(seen) - 1, -1, -1) if seen[i] is last), None)
        if at is None or at + 1 > len(self.seen):
            return False
        new = [_log_row(fields, names) for fields, _ in seen[at + 1:]]
        if self.stop + len(new) > len(self.buffer) or self.buffer is not self.own:
            # into a buffer of this planner's own, with room for WORK_KEEP more rows: a copy per WORK_KEEP rows
            kept = self.buffer[self.stop - (at + 1):self.stop]  # the rows of seen[:at + 1]
            buffer = np.empty((len(kept) + len(new) + WORK_KEEP, kept.shape[1]))
            buffer[:len(kept)] = kept
            self.buffer, self.own, self.stop = buffer, buffer, len(kept)
        self.buffer[self.stop:self.stop + len(new)] = new
        self.stop += len(new)
        self.seen = seen
        return True


def _log_row(fields: Mapping[str, float], names: tuple[str, ...]) -> list[float]:
    """One observation's row: its log fields (0 where missing), a 1/0 mask of those present, and its share of
    the distance that is not the plan's (the squares of its present log fields, plus one per missing field;
    infinite with none present).

    Laid out once, as the row is added, rather than derived from NaNs on
    every plan (a sixth of a small problem's first plan on the VM).
    """
    logs = [math.log(fields[n]) if fields.get(n, 0) > 0 else None for n in names]
    present = [0.0 if value is None else 1.0 for value in logs]
    missing = len(names) - sum(present)
    own = math.inf if missing == len(names) else missing + sum(value * value for value in logs if value is not None)
    return [value or 0.0 for value in logs] + present + [own]


def scale_weighted_factor(runs: list[tuple[float, float, float]], model: float) -> float:
    """The weighted median of the runs' factors (``(model, run over model, log model)``, model > 0) for a problem
    modelled at ``model`` seconds: a run weighs ``exp(-(ln(its model / model) / ln LOOP_SCALE) ** 2)``, and a factor
    of 1 weighs :data:`LOOP_PRIOR`, so runs near the problem's scale decide it and runs far off leave it at 1.

    Each run keeps its model's log (:meth:`Planner.note_loop_run`): every first call of a new problem weighs up to
    three implementations' worth of runs, and a log per run was a third of it."""
    inverse, here = 1.0 / math.log(LOOP_SCALE), math.log(model)
    weighted = [(1.0, LOOP_PRIOR)] + [(ratio, math.exp(-((seen - here) * inverse) ** 2)) for _, ratio, seen in runs]
    weighted.sort()
    half, total = sum(weight for _, weight in weighted) / 2, 0.0
    for ratio, weight in weighted:
        total += weight
        if total >= half:
            return ratio
    return weighted[-1][0]


def _median(values: list[float]) -> float:
    """The median of a short non-empty list (statistics.median's value, at a third of its cost)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

_MISSING = object()
FITS_KEPT = 256
_FITS_LOCK = threading.Lock()


def _at_stake(backend: float, owed: tuple[Mapping[str, Any], str] | None) -> float:
    """:meth:`Planner.one_off_at_stake` from the backend's unpaid start and the slot still owed (Planner._owed_slot)."""
    if owed is None:
        return backend
    slot, kind = owed
    if kind == WHOLE:
        return backend + float(slot.get("one_off_seconds", 0.0))
    if kind == CACHED:  # what such loads were seen to cost (none seen: a load, nothing to speak of)
        return backend + max(slot.get("cached_one_off_observations", []), default=0.0)
    seen = [float(pair[0]) for pair in slot.get("shape_one_off_pairs", [])]
    return backend + max(seen + list(slot.get("shape_one_off_observations", [])),
                         default=float(slot["shape_one_off_seconds"]))


def _shared(cache: dict[tuple, T], key: tuple, make: Callable[[], T]) -> T:
    """``cache[key]``, made once by ``make`` and kept among the latest :data:`FITS_KEPT` of this process."""
    found = cache.get(key, _MISSING)
    if found is _MISSING:
        found = make()
        with _FITS_LOCK:
            cache[key] = found
            while len(cache) > FITS_KEPT:
                del cache[next(iter(cache))]
    return found


def fit_once(samples: list[Sample], names: Sequence[str]) -> CostModel:
    """``fit(samples, names)``, computed once per distinct content in this process.

    A fit is a pure function of its samples, and its leave-one-out error
    refits once per sample: a fresh planner's first plan of a solver took
    8.5 ms of fitting on the VM (random walk, 4 implementations), which a
    fresh planner over the same calibration (``evaluate``'s, a test's, a
    user's second planner) need not pay again.
    """
    key = (tuple(names), tuple((tuple(sorted(s.features.items())), s.seconds) for s in samples))
    return _shared(_FITS, key, lambda: fit(samples, names))


def _process_calls(entry: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The well-formed (process, calls) pairs of a solver's stored entry (a hand-edited file may hold others)."""
    found = entry.get(CALLS_PER_PROCESS)
    if not isinstance(found, list):
        return []
    return [(pair[0], pair[1]) for pair in found if isinstance(pair, list) and len(pair) == 2
            and isinstance(pair[0], str) and isinstance(pair[1], int) and pair[1] > 0]


SHAPE_PAIRS_KEEP = 24  # (one-off, warm run) pairs of new shapes kept per implementation: the line's points
SHAPE_SPREAD = 4.0  # ... whose warm runs must span this factor before a line through them is trusted


def _compiled_in(slot: Mapping[str, Any], spec: SolverSpec, implementation: str, shape: Hashable) -> bool:
    """Whether the store says this machine compiled ``shape`` of an implementation whose compiles a disk cache
    keeps (``SolverSpec.compile_cached``)."""
    return implementation in spec.compile_cached and repr(shape) in slot.get("compiled_keys", ())


def _add_compiled(slot: dict[str, Any], shapes: Sequence[Hashable]) -> None:
    """Remember compiled shapes (their repr: a key of ints, strings and flags, as JSON keeps it), the latest
    :data:`COMPILED_KEYS_KEPT`."""
    kept = slot.setdefault("compiled_keys", [])
    for text in map(repr, shapes):
        if text not in kept:
            kept.append(text)
    del kept[:-COMPILED_KEYS_KEPT]


def _add_shape_pair(slot: dict[str, Any], seconds: float, run_seconds: float) -> None:
    """Keep a new shape's one-off with the warm run at that shape (the points of :func:`shape_one_off_line`)."""
    pairs = slot.setdefault("shape_one_off_pairs", [])
    pairs.append([float(seconds), float(run_seconds)])
    del pairs[:-SHAPE_PAIRS_KEEP]


_LINES: dict[tuple, tuple[float, float] | None] = {}  # by the pairs' values


def shape_one_off_line(pairs: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """``(a, b)``, both >= 0: a new shape's one-off as ``a + b * warm_run``, by Theil-Sen (the median of the
    pairwise slopes, then the median intercept), or None where fewer than three runs span
    :data:`SHAPE_SPREAD`.

    The medians let a few one-offs that met a busy machine (the H200
    host's compile at 7.7M: 63 ms in one process, 351 in another) move
    the line no more than their share.
    """
    # by value, not by the list's identity: evaluate's planners (one per problem) each hold a deep copy of the
    # calibration, and keyed by identity every first call refitted the lines of linreg's two GPU variants that
    # compile per size, 0.1 ms of Theil-Sen each on the H200 host (a third of a small problem's first plan)
    key = tuple(map(tuple, pairs))
    if key in _LINES:
        return _LINES[key]
    points = [(float(run), float(one_off)) for one_off, run in pairs if run > 0]
    line = None
    runs = [run for run, _ in points]
    if len(points) >= 3 and max(runs) >= SHAPE_SPREAD * min(runs):
        slopes = [(b[1] - a[1]) / (b[0] - a[0]) for i, a in enumerate(points) for b in points[i + 1:] if b[0] != a[0]]
        slope = max(0.0, statistics.median(slopes))
        line = (max(0.0, statistics.median(one_off - slope * run for run, one_off in points)), slope)
    if len(_LINES) > 256:
        _LINES.clear()
    _LINES[key] = line
    return line


def _add_observation(slot: dict[str, Any], what: str, seconds: float) -> None:
    """Keep the last few observations; the stored cost is their median (one cold cache does not set it)."""
    observations = slot.setdefault(f"{what}_observations", [])
    observations.append(float(seconds))
    del observations[:-ONE_OFF_KEEP]
    slot[f"{what}_seconds"] = statistics.median(observations)


# -- the current planner ------------------------------------------------------------------

DEFAULT = Planner()
_current: contextvars.ContextVar[Planner] = contextvars.ContextVar("crossover_planner", default=DEFAULT)


def current() -> Planner:
    """The planner ``core.solve`` and ``core.plan`` use here: the default one, or one installed by :func:`use`."""
    return _current.get()


@contextmanager
def use(planner: Planner) -> Iterator[Planner]:
    """Make ``planner`` the current one inside the block (this thread and its context only)."""
    token = _current.set(planner)
    try:
        yield planner
    finally:
        _current.reset(token)


def accepts_planner(function: Callable[..., T]) -> Callable[..., T]:
    """Give a public verb (``solve``, ``plan``, ``calibrate``) a ``planner=`` argument: run it on that planner."""
    @functools.wraps(function)
    def on_planner(*args: Any, planner: Planner | None = None, **kwargs: Any) -> T:
        if planner is None:
            return function(*args, **kwargs)
        if not isinstance(planner, Planner):
            raise fail("planner", planner, "must be a core.Planner, or None for the current one")
        with use(planner):
            return function(*args, **kwargs)

    return on_planner


atexit.register(lambda: DEFAULT.flush())
