"""Calibration: measure each implementation of a solver on the designed problems.

Each sample is one warm-up run and then the median of at least three timed
runs. Before its first run in this process a backend is started (pool,
CUDA context) and that start is timed as the backend's one-off; the first
warm-up of an implementation then pays its own one-off (JIT compile), and
its excess over the steady median is stored as that.

The problems come from :mod:`core.costmodel.design`, cheapest first, and
every implementation measures a problem before any measures the next. The
budget is shared max-min fairly (:func:`fair_shares`): an implementation
that needs less than an equal share to finish the design gets what it
needs, and the rest is split evenly among the others. Charged alike, the
slow ones spent the budget for all: on the 16-core H200 host the quick
calibration of mfg.common_noise ran out about two thirds through its 30
problems, numpy's 0.05-0.5 s solves having taken a third of it, and the
three contenders that run 5-15 ms solves were cut at the same point as
numpy. An implementation skips a problem that its partial model predicts
to take longer than the per-sample cap, and skips problems it does not
support or whose memory does not fit.

What a calibration keeps: it adds to the stored samples and never replaces
them with fewer (:func:`core.costmodel.store.merge_calibration`): a new
sample replaces the stored one of the same features, and stored samples at
problems it did not measure stay, so a short budget cannot undo a long
calibration. One calibration runs at a time per wisdom file
(:func:`core.costmodel.store.calibrating`): a second one, in another process
or thread, logs that it waits for the first, and then runs; measured side by
side, each would time the other's work.

Progress: :func:`calibrate` shows it by default, on standard error. On a
terminal it is a transient bar; otherwise (a script's log, a notebook, a
pipe) one line as each solver starts, a line at most every
:data:`core.progress.PROGRESS_SECONDS` while it runs, and one line with each
implementation's samples as it ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from core.backend import safe_describe
from core.costmodel import history, store
from core.costmodel.design import calibration_design
from core.costmodel.features import feature_names, model_features
from core.costmodel.fit import Sample, fit
from core.costmodel.planner import accepts_planner, current
from core.errors import CrossoverError, PluginError
from core.progress import Progress
from core.registry import get_registry, get_solver
from core.running import exclusion, implementations, probe, run_once
from core.solver import SolverSpec, backend_of
from core.validation import check_float

log = logging.getLogger("crossover")

QUICK = {"budget": 25.0, "sample_cap": 0.5, "repeats": 3}
FULL = {"budget": 600.0, "sample_cap": 30.0, "repeats": 5}

# Backends whose runtimes keep their worker threads spinning for a while after a call returns: OpenBLAS
# behind NumPy (about 2**28 cycles, ~0.1 s) and PyTorch's OpenMP pool. An implementation timed right
# after one shares its cores with the spinners: on the 16-core H200 host ml.linreg's numba:threads,
# measured after numpy, took 64 ms where its serial twin took 6.7 ms, and the model built on those
# samples chose a GPU that was 28 % slower. A quiet pause lets them park before the next backend's timing.
SPINNING_BACKENDS = frozenset({"numpy", "torch"})
QUIET_SECONDS = 0.15
_last_measured: list[str] = []  # the backend measured last in this process (a one-slot box)
_paused = [0.0]  # seconds spent in those pauses in this process: not charged to a calibration's budget


@dataclass
class BackendCalibration:
    backend: str  # the implementation key (``numba:fused``)
    samples: int = 0
    one_off_seconds: float | None = None
    start_seconds: float | None = None
    seconds_spent: float = 0.0
    stopped: str = "design done"
    skipped: int = 0
    stored_samples: int = 0  # samples the wisdom store holds for it afterwards: these and earlier ones (merged)
    # every warm-up's excess over its timed median: compiles, wherever a problem first needs one
    warm_up_excess: float = 0.0
    # the warm-ups' excesses at each new shape after its first run here (SolverSpec.compile_key): a shape's one-off
    shape_one_offs: list[tuple[float, float]] = field(default_factory=list)  # (one-off, warm run) at a new shape
    # ... and at a shape a disk cache kept compiled from an earlier process (Planner.compiled_here): a load
    cached_one_offs: list[float] = field(default_factory=list)


class CalibrationInterrupted(KeyboardInterrupt):
    """Ctrl-C during a calibration, raised after what was measured was stored.

    ``kept`` lists ``(solver, implementation, samples)`` for every
    implementation whose samples are in the wisdom store.
    """

    def __init__(self, kept: list[tuple[str, str, int]]):
        super().__init__(f"calibration interrupted; kept the timings of {len(kept)} implementations")
        self.kept = kept


@dataclass
class SolverCalibration:
    solver: str
    seconds: float = 0.0
    problems: int = 0
    backends: list[BackendCalibration] = field(default_factory=list)
    error: str = ""  # why this solver was not calibrated at all (its plugin's fault)


# sub-millisecond runs jitter by tens of percent, so short samples are repeated
# until they add up to this many seconds (at most MAX_REPEATS runs)
MIN_SAMPLE_SECONDS = 0.05
MAX_REPEATS = 25


def measure(spec: SolverSpec, implementation: str, problem: Any, repeats: int = 3) -> tuple[float, float]:
    """(warm-up seconds, median timed seconds) for one problem.

    At least ``max(3, repeats)`` timed runs; more for short runs, until they
    add up to ``MIN_SAMPLE_SECONDS``, like ``timeit``'s autorange.
    """
    warm_up, timed, _ = measure_outputs(spec, implementation, problem, repeats)
    return warm_up, statistics.median(timed)


def measure_outputs(spec: SolverSpec, implementation: str, problem: Any,
                    repeats: int = 3) -> tuple[float, list[float], dict]:
    """(warm-up seconds, every timed run's seconds, the last run's outputs) as :func:`measure` takes them."""
    _quiet_after_spinners(backend_of(implementation))
    warm_up = run_once(spec, implementation, problem)[1]
    timed: list[float] = []
    while len(timed) < max(3, repeats) or (sum(timed) < MIN_SAMPLE_SECONDS and len(timed) < MAX_REPEATS):
        outputs, seconds = run_once(spec, implementation, problem)
        timed.append(seconds)
    return warm_up, timed, outputs


def _quiet_after_spinners(backend: str) -> None:
    """Pause :data:`QUIET_SECONDS` when the last backend measured here left spinning threads behind."""
    if _last_measured and _last_measured[0] != backend and _last_measured[0] in SPINNING_BACKENDS:
        hold_the_core(QUIET_SECONDS)
        _paused[0] += QUIET_SECONDS
    _last_measured[:] = [backend]


def hold_the_core(seconds: float) -> None:
    """Wait ``seconds`` busy, not asleep.

    A process that sleeps lets its cores go idle, and on the 2-core VM a
    two-thread Numba kernel then ran 1.4-1.7x slower for the next ~50 ms
    (a spectra fit: 11-13 ms for five runs after a 0.15 s sleep, then
    7.7 ms; after a busy 0.15 s only the first run was slow, which a
    measurement's warm-up absorbs; a linreg kernel run after each of
    repeated 20 ms sleeps took 2.6x). Slept, this pause put
    ``numba:threads`` in that state for every timing that followed a NumPy
    one: the truth of ``crossover evaluate`` scored the loop's right pick
    at 30 % regret, and calibration samples came out high.
    """
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def median_seconds(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` after one warm-up call (for scripts and asv)."""
    fn()
    samples = []
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def runnable_implementations(spec: SolverSpec) -> list[str]:
    """Implementation keys whose backend is registered and available here."""
    backends = get_registry().backends
    return [key for key in implementations(spec)
            if backend_of(key) in backends and probe(backends[backend_of(key)]).available]


@dataclass
class _Climb:
    """One implementation's progress through the design."""

    row: BackendCalibration
    records: list[dict[str, Any]] = field(default_factory=list)
    capped: bool = False
    done: bool = False
    charged: float = 0.0  # seconds charged to the budget: its runs, without quiet pauses and compiles
    visited: int = 0  # design problems it has measured or skipped

    def need(self, problems: int) -> float:
        """Seconds it will have been charged by the end of the design, at its pace so far (unknown: inf)."""
        return self.charged * problems / self.visited if self.visited else math.inf

    def predicted(self, spec: SolverSpec, problem: Any) -> float | None:
        names = feature_names(spec, self.row.backend)
        if len(self.records) < len(names) + 1:
            return None
        model = fit([Sample(r["features"], r["seconds"]) for r in self.records], names)
        return model.predict(model_features(spec, problem, self.row.backend))[0]


def calibrate_solver(spec: SolverSpec, *, quick: bool = True, budget: float | None = None,
                     sample_cap: float | None = None, backends: Iterable[str] | None = None,
                     progress: bool | None = False) -> SolverCalibration:
    """Measure every available implementation of one solver on its design and store the samples.

    ``budget`` and ``sample_cap`` are seconds > 0 (default: quick's or full's).
    The samples are merged into the stored ones (the module's docstring says
    how), under the calibration lock. ``progress``: False shows nothing,
    True or None shows it on standard error (a bar on a terminal, else lines).
    """
    settings = dict(QUICK if quick else FULL)
    budget = settings["budget"] if budget is None else check_float("budget", budget, minimum=0, strict_minimum=True)
    sample_cap = settings["sample_cap"] if sample_cap is None else \
        check_float("sample_cap", sample_cap, minimum=0, strict_minimum=True)
    with contextlib.ExitStack() as held:
        if history.current().persist:  # a planner in memory writes no file: no lock to share with others
            try:
                held.enter_context(store.calibrating(spec.name, log.warning))
            except KeyboardInterrupt:  # Ctrl-C while waiting for the other calibration: nothing measured here
                raise CalibrationInterrupted([]) from None
        return _calibrate_locked(spec, quick, budget, sample_cap, backends, progress, settings["repeats"])


def _calibrate_locked(spec: SolverSpec, quick: bool, budget: float, sample_cap: float,
                      backends: Iterable[str] | None, progress: bool | None, repeats: int) -> SolverCalibration:
    design = calibration_design(spec, quick)
    names = list(backends) if backends is not None else runnable_implementations(spec)
    report = SolverCalibration(spec.name, problems=len(design))
    began = time.perf_counter()
    climbs = [_Climb(BackendCalibration(name)) for name in names]
    report.backends = [climb.row for climb in climbs]
    shown = _Progress.start(progress, spec.name, len(names), len(design), budget)
    interrupted = False
    try:
        for climb in climbs:
            was_paid = history.is_paid(spec, climb.row.backend, design[0])
            climb.row.one_off_seconds = None if was_paid else 0.0  # set by the first warm-up below
            try:
                climb.row.start_seconds = history.start_backend(
                    get_registry().backends[backend_of(climb.row.backend)])
            except CrossoverError as exc:  # one backend that cannot start must not stop the others
                climb.row.stopped, climb.done = f"failed to start: {exc}", True
        first_run = {climb.row.backend: climb.row.one_off_seconds is not None for climb in climbs}
        # the budget is for samples: starting backends is their one-off, and neither the quiet pauses nor a
        # warm-up's compile are samples (charged, the pauses cost the quick calibration of spectra.fit a fifth
        # of its 25 s and design points, and a compile once spent it all on one design point)
        for problem in design:
            for climb in climbs:
                if shown is not None:
                    shown.advance()
                if climb.done:
                    continue
                share = fair_shares(budget, climbs, len(design))[climb.row.backend]
                # one granted less than its need stops before a problem that would take it past its share at its
                # pace so far (the design is cheapest first): stopped only once past it, a slow climb kept its last
                # problem's overshoot, and the cheap ones' needs, which fair_shares had granted, no longer fitted
                pace = climb.charged / climb.visited if climb.visited else 0.0
                if climb.charged > share or (share < climb.need(len(design)) and climb.charged + pace > share):
                    climb.row.stopped, climb.done = f"its share of the {budget:g} s budget spent ({share:.1f} s)", True
                    continue
                climb.visited += 1
                _measure_one(spec, problem, climb, sample_cap, repeats, first_run)
    except KeyboardInterrupt:  # Ctrl-C: store what was measured below, then stop
        interrupted = True
    finally:
        if shown is not None:
            shown.stop()
    for climb in climbs:
        climb.row.samples = len(climb.records)
        climb.row.stored_samples = _store(spec, climb)
    report.seconds = time.perf_counter() - began
    if shown is not None and not interrupted:
        shown.done(report)
    if interrupted:
        raise CalibrationInterrupted([(spec.name, c.row.backend, len(c.records)) for c in climbs if c.records])
    return report


def _stored_calibration(spec: SolverSpec, implementation: str) -> list[dict[str, Any]]:
    """The pair's stored calibration samples, read afresh where the planner writes the wisdom file.

    Afresh: another process may have calibrated since this one last read the
    file, and the merge must keep its samples too. (Calibrations never run in
    pool workers, the other case where a planner keeps no file.)
    """
    planner = history.current()
    data = store.load() if planner.persist else planner.stored()
    entry = data["solvers"].get(spec.name)
    if entry is None or entry.get("version") != spec.version:
        return []
    return list(entry["backends"].get(implementation, {}).get("calibration", []))


def _store(spec: SolverSpec, climb: _Climb) -> int:
    """Merge the climb's samples into the stored ones and write them; the number of samples stored after."""
    key = climb.row.backend
    stored = _stored_calibration(spec, key)
    if not climb.records:
        return len(stored)
    merged = store.merge_calibration(stored, climb.records)
    details = safe_describe(get_registry().backends[backend_of(key)])
    history.record_calibration(spec, key, merged, climb.row.one_off_seconds, details, climb.row.shape_one_offs,
                               climb.row.cached_one_offs)
    return len(merged)


def fair_shares(budget: float, climbs: list[_Climb], problems: int) -> dict[str, float]:
    """Each implementation's share of the budget, max-min fair over what each needs to finish the design.

    Those that stopped keep what they were charged. Of what is left, an
    implementation whose projected need (:meth:`_Climb.need`) is below an
    even split gets its need, and the others split the remainder evenly, so
    each gets at least an even share and cheap implementations finish.
    """
    left = budget - sum(climb.charged for climb in climbs if climb.done)
    running = sorted((climb for climb in climbs if not climb.done), key=lambda climb: climb.need(problems))
    shares = {climb.row.backend: climb.charged for climb in climbs if climb.done}
    for position, climb in enumerate(running):
        shares[climb.row.backend] = min(climb.need(problems), left / (len(running) - position))
        left -= shares[climb.row.backend]
    return shares


def _measure_one(spec: SolverSpec, problem: Any, climb: _Climb, sample_cap: float, repeats: int,
                 first_run: dict[str, bool]) -> None:
    key = climb.row.backend
    why = exclusion(spec, problem, key)
    if why.startswith("memory estimate failed"):  # the plugin's fault, not this size's: stop, and say why
        climb.row.stopped, climb.done = why, True
        return
    if why:
        climb.row.skipped += 1
        return
    if climb.capped:
        predicted = climb.predicted(spec, problem)
        if predicted is None or predicted > sample_cap:
            climb.row.skipped += 1
            return
    # a shape this implementation has not run at, after its first run here: the warm-up pays a shape's one-off
    new_shape = not first_run[key] and spec.compile_key is not None and not history.is_paid(spec, key, problem)
    # a calibration after another on this machine loads what that one compiled: no shape's compile to learn from
    cached = new_shape and history.compiled_here(spec, key, problem)
    began, paused_before = time.perf_counter(), _paused[0]
    try:
        warm_up, timed, outputs = measure_outputs(spec, key, problem, repeats)
        seconds = statistics.median(timed)
    except CrossoverError as exc:
        climb.row.stopped, climb.done = f"failed: {exc}", True
        return
    except (Exception, SystemExit) as exc:  # a broken implementation stops itself, not the calibration
        climb.row.stopped, climb.done = f"failed: {type(exc).__name__}: {exc}", True
        return
    finally:
        spent = time.perf_counter() - began
        climb.row.seconds_spent += spent
        climb.charged += spent - (_paused[0] - paused_before)
    excess = max(0.0, warm_up - seconds)
    climb.row.warm_up_excess += excess
    climb.charged -= excess
    if first_run[key]:
        first_run[key] = False
        climb.row.one_off_seconds = excess
    elif cached:
        climb.row.cached_one_offs.append(excess)
    elif new_shape:
        climb.row.shape_one_offs.append((excess, seconds))
    history.mark_paid(spec, key, problem)
    # the features of the work the runs really did: where convergence ends a solve early, the model learns
    # the cost of the work done, and the planner learns how much work such problems do
    climb.records.append(history.sample_record(spec, key, problem, seconds, "calibration", outputs))
    if seconds > sample_cap:
        climb.capped = True
        climb.row.stopped = f"skips problems predicted above the {sample_cap:g} s cap"


@accepts_planner
def calibrate(solvers: Iterable[str] | None = None, *, quick: bool = True, budget: float | None = None,
              progress: bool | None = None) -> list[SolverCalibration]:
    """Calibrate the named solvers (all registered ones by default) on every available implementation.

    ``budget``: seconds per solver, > 0 (default 25 quick, 600 full).
    ``progress``: None or True shows it on standard error (a bar on a
    terminal, else a few plain lines), False shows nothing. The samples are
    added to the stored ones, never replacing them with fewer.
    """
    if budget is not None:
        budget = check_float("budget", budget, minimum=0, strict_minimum=True)
    names = list(solvers) if solvers is not None else sorted(get_registry().solvers)
    specs = [get_solver(name) for name in names]  # an unknown name is the caller's mistake: before any work
    reports: list[SolverCalibration] = []
    for spec in specs:
        try:
            reports.append(_calibrate_or_blame(spec, quick=quick, budget=budget, progress=progress))
        except CalibrationInterrupted as exc:  # the solvers calibrated before it are kept too
            exc.kept[:0] = [(r.solver, row.backend, row.samples) for r in reports for row in r.backends if row.samples]
            raise
    return reports


def _calibrate_or_blame(spec: SolverSpec, **options: Any) -> SolverCalibration:
    """One solver's calibration; a fault in its plugin is reported on its row and the others go on."""
    try:
        return calibrate_solver(spec, **options)
    except PluginError as exc:
        owner = get_registry().solver_owner.get(spec.name, "?")
        log.warning("calibration of %s (plugin %r) failed and was skipped: %s", spec.name, owner, exc)
        return SolverCalibration(spec.name, error=str(exc))


def ensure_calibrated(spec: SolverSpec) -> None:
    """Run one quick calibration for a solver never calibrated on this machine, and say so.

    Checked once per state of the planner's timings (its epoch: a
    calibration, a reload of the wisdom file that set timings aside, a
    refit): every auto plan asks, and asking anew cost 7-14 us a call.
    """
    planner = current()
    if planner.calibration_checked.get(spec.name) == planner.epoch:
        return
    if any(history.model(spec, key) is not None for key in implementations(spec)):
        again = [key for key in history.take_set_aside(spec) if key in runnable_implementations(spec)]
        if again:  # a configuration change set these aside (wisdom store): measure them alone
            log.warning("solver %s: measuring %s again (quick), their configuration changed", spec.name,
                        ", ".join(again))
            calibrate_solver(spec, quick=True, backends=again)
    else:
        # the budget is the timed runs': backend starts, compiles and generated data come on top (spectra.fit's
        # quick calibration took 34 s on the VM), and "at most" the budget said otherwise
        log.warning("solver %s has never been calibrated on this machine: running one quick calibration "
                    "(%g s of timed runs, plus backend starts and compiles; "
                    "`crossover calibrate` does it ahead of time)", spec.name, QUICK["budget"])
        calibrate_solver(spec, quick=True)
    planner.calibration_checked[spec.name] = planner.epoch


class _Progress(Progress):
    """A calibration's progress (:class:`core.progress.Progress`), and its closing line."""

    @classmethod
    def start(cls, enabled: bool | None, solver: str, implementations: int, problems: int,
              budget: float) -> _Progress | None:
        if enabled is False:
            return None
        shown = cls(f"calibrating {solver}", implementations * problems, "measurements")
        shown.solver = solver
        if shown.bar is None:
            shown.say(f"calibrating {solver}: {implementations} implementation{'s' * (implementations != 1)} on "
                      f"{problems} designed problems, {budget:g} s of timed runs")
        return shown

    def done(self, report: SolverCalibration) -> None:
        if self.bar is not None:
            return  # the table that follows says it all
        rows = ", ".join(f"{row.backend} {row.samples}" + (f" (+{row.stored_samples - row.samples} kept)"
                                                           if row.stored_samples > row.samples else "")
                         for row in report.backends) or "no implementation runs here"
        self.say(f"calibrated {self.solver} in {report.seconds:.1f} s; samples: {rows}")
