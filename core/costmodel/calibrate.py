"""Calibration: walk each solver's ladder on each backend and time it.

Each sample is one warm-up run and then the median of at least three timed
runs. The first warm-up of a (solver, backend) pair in this process also
pays the one-off cost (JIT compile, pool start, CUDA context); its excess
over the steady median is stored as that pair's one-off cost. A backend
stops climbing once a sample exceeds the per-sample cap, and the whole
calibration stops at its budget.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from core.costmodel import history as timings
from core.api import run_once
from core.backend import safe_describe, safe_probe
from core.errors import CrossoverError
from core.registry import get_registry, get_solver
from core.solver import SolverSpec

log = logging.getLogger("crossover")

QUICK = {"budget": 50.0, "sample_cap": 2.0, "repeats": 3}
FULL = {"budget": 600.0, "sample_cap": 30.0, "repeats": 5}


@dataclass
class BackendCalibration:
    backend: str
    samples: int = 0
    one_off_seconds: float | None = None
    seconds_spent: float = 0.0
    stopped: str = "ladder done"


@dataclass
class SolverCalibration:
    solver: str
    seconds: float = 0.0
    backends: list[BackendCalibration] = field(default_factory=list)


# sub-millisecond runs jitter by tens of percent, so short samples are repeated
# until they add up to this many seconds (at most MAX_REPEATS runs)
MIN_SAMPLE_SECONDS = 0.05
MAX_REPEATS = 25


def measure(spec: SolverSpec, backend: str, problem: Any, repeats: int = 3) -> tuple[float, float]:
    """(warm-up seconds, median timed seconds) for one problem.

    At least ``max(3, repeats)`` timed runs; more for short runs, until they
    add up to ``MIN_SAMPLE_SECONDS``, like ``timeit``'s autorange.
    """
    warm_up = run_once(spec, backend, problem)[1]
    timed: list[float] = []
    while len(timed) < max(3, repeats) or (sum(timed) < MIN_SAMPLE_SECONDS and len(timed) < MAX_REPEATS):
        timed.append(run_once(spec, backend, problem)[1])
    return warm_up, statistics.median(timed)


def median_seconds(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` after one warm-up call (for scripts and asv)."""
    fn()
    samples = []
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def sample_record(spec: SolverSpec, problem: Any, seconds: float, source: str) -> dict[str, Any]:
    return {"features": {k: float(v) for k, v in spec.features(problem).items()},
            "size": float(getattr(problem, spec.size_axis)), "seconds": float(seconds), "source": source,
            "at": time.time()}


def calibration_backends(spec: SolverSpec) -> list[str]:
    registry = get_registry()
    return [b for b in spec.backends if b in registry.backends and safe_probe(registry.backends[b]).available]


def calibrate_solver(spec: SolverSpec, *, quick: bool = True, budget: float | None = None,
                     sample_cap: float | None = None, backends: Iterable[str] | None = None,
                     progress: bool = False) -> SolverCalibration:
    """Measure every available backend of one solver and store the samples."""
    settings = dict(QUICK if quick else FULL)
    budget = settings["budget"] if budget is None else budget
    sample_cap = settings["sample_cap"] if sample_cap is None else sample_cap
    ladder = spec.ladder(quick)
    names = list(backends) if backends is not None else calibration_backends(spec)
    report = SolverCalibration(spec.name)
    started = time.perf_counter()
    bar, task = _progress(progress, f"calibrating {spec.name}", len(names) * len(ladder))
    try:
        for backend in names:
            row = BackendCalibration(backend)
            report.backends.append(row)
            was_paid = timings.is_paid(spec, backend)
            records: list[dict[str, Any]] = []
            backend_started = time.perf_counter()
            for step, problem in enumerate(ladder):
                if time.perf_counter() - started > budget:
                    row.stopped = f"budget of {budget:g} s spent"
                    break
                try:
                    warm_up, seconds = measure(spec, backend, problem, settings["repeats"])
                except CrossoverError as exc:
                    row.stopped = f"failed: {exc}"
                    break
                timings.mark_paid(spec, backend)
                if step == 0 and not was_paid:
                    row.one_off_seconds = max(0.0, warm_up - seconds)
                records.append(sample_record(spec, problem, seconds, "calibration"))
                if bar is not None:
                    bar.advance(task)
                if seconds > sample_cap:
                    row.stopped = f"sample took {seconds:.2f} s > cap {sample_cap:g} s"
                    break
            row.samples = len(records)
            row.seconds_spent = time.perf_counter() - backend_started
            if records:
                details = safe_describe(get_registry().backends[backend])
                timings.record_calibration(spec, backend, records, row.one_off_seconds, details)
    finally:
        if bar is not None:
            bar.stop()
    report.seconds = time.perf_counter() - started
    return report


def calibrate(solvers: Iterable[str] | None = None, *, quick: bool = True, budget: float | None = None,
              progress: bool = False) -> list[SolverCalibration]:
    """Calibrate the named solvers (all registered ones by default) on every available backend."""
    names = list(solvers) if solvers is not None else sorted(get_registry().solvers)
    return [calibrate_solver(get_solver(name), quick=quick, budget=budget, progress=progress) for name in names]


def ensure_calibrated(spec: SolverSpec) -> None:
    """Run one quick calibration for a solver never calibrated on this machine, and say so."""
    if any(timings.model(spec, b) is not None for b in spec.backends):
        return
    log.warning("solver %s has never been calibrated on this machine: running one quick calibration "
                "(at most %g s; `crossover calibrate` does it ahead of time)", spec.name, QUICK["budget"])
    calibrate_solver(spec, quick=True)


def _progress(enabled: bool, label: str, total: int):
    if not enabled:
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # on stderr, so that tables and --json on stdout stay clean
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), transient=True, console=Console(stderr=True))
    bar.start()
    return bar, bar.add_task(label, total=total)
