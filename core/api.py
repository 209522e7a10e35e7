"""The public entry points: run a solver, plan it, list what is registered.

This is the top of the core: nothing below imports it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core import limits
from core.backend import Availability, safe_describe
from core.costmodel.calibrate import ensure_calibrated, measure_outputs
from core.costmodel.features import model_features
from core.costmodel.plan import model_prediction, plan, plan_problem, recent_free_memory
from core.costmodel.planner import accepts_planner, current, fields_held, numeric_key
from core.costmodel.race import (
    SHORT_RUN,
    SPREAD_AFTER,
    Settled,
    Step,
    band_of,
    in_the_loops_conditions,
    learnt_nothing,
    model_missed,
    next_step,
    outlier_reach,
    settled_step,
    settles,
    short_run_sample,
    unconfirmed,
    worth_confirming,
)
from core.costmodel.warmup import tier_up, using, warming
from core.errors import (
    AutoSelectionError,
    BackendUnavailableError,
    NotEnoughMemoryError,
    ProblemError,
)
from core.registry import get_registry, get_solver
from core.result import Plan, Result
from core.running import check_backend, exclusion, find_solver, probe, registered_backend, run_once
from core.solver import SolverSpec, backend_of
from core.validation import check_choice


@dataclass(frozen=True)
class BackendStatus:
    """One row of ``core.backends()``."""

    name: str
    summary: str
    available: bool
    reason: str
    details: dict[str, Any]


def solvers() -> dict[str, SolverSpec]:
    """Every registered solver, by name."""
    return dict(sorted(get_registry().solvers.items()))


def backends(describe: bool = True) -> dict[str, BackendStatus]:
    """Every registered backend with whether it runs here, why not, and what it runs on."""
    rows = {}
    for name, backend in get_registry().backends.items():
        status = probe(backend)
        details = safe_describe(backend) if describe and status.available else {}
        rows[name] = BackendStatus(name, backend.summary, status.available, status.reason, details)
    return rows


def availability(name: str) -> Availability:
    """Whether the named backend runs here (unknown names raise)."""
    return probe(registered_backend(name))


def _named(spec: SolverSpec, problem: Any, name: str, expected_calls: float | None, nominal: Mapping[str, float],
           race: Any) -> Plan:
    """A plan for a backend the caller named: its variant chosen by measurement, its memory checked, and the
    prediction its Result carries (with the expected work, as auto's: the time limit refuses by it too)."""
    keys = check_backend(spec, name)
    memory = recent_free_memory()
    reasons = {key: exclusion(spec, problem, key, memory) for key in keys}
    runnable = [key for key in keys if not reasons[key]]
    if not runnable:
        why = "; ".join(f"{key}: {reason}" for key, reason in reasons.items())
        error = NotEnoughMemoryError if all("memory" in r for r in reasons.values()) else BackendUnavailableError
        raise error(f"backend {name!r} cannot run {spec.name} on this problem: {why}")
    if len(runnable) == 1:  # nothing to choose: the model's word, from the view a known problem reuses
        prediction, work = model_prediction(spec, problem, nominal, runnable[0])
        return Plan(solver=spec.name, backend=runnable[0], reason="named by the caller",
                    predictions={runnable[0]: prediction} if prediction.seconds is not None else {},
                    expected_work=work)
    try:
        chosen = plan_problem(spec, problem, nominal, expected_calls, race, only=runnable)
    except AutoSelectionError:  # no variant calibrated yet: the first one the plugin lists, unpredicted
        return Plan(solver=spec.name, backend=runnable[0], reason="named by the caller")
    return dataclasses.replace(chosen, reason=f"named by the caller; {chosen.reason}")


PLANNING = ("estimate", "race", "measure")


def _run(spec: SolverSpec, implementation: str, problem: Any, nominal: Mapping[str, float],
         sampling: bool = False, first_touch: bool = False, model: float | None = None,
         trial: bool = False, cold_above: float = math.inf) -> tuple[dict, float, bool]:
    """Run once, paying the backend's start first, and observe the timing. Returns (outputs, seconds, cold).

    A run is *cold* when it owed a one-off: this process had not yet run the
    implementation (on this shape, for a variant that compiles per shape)
    and its calibration measured a first run's excess (a compile, a cache
    to fill). The loop and the model never compare a cold run with warm
    ones. A first run with no calibration at all is no warm sample for the
    loop either (as a first touch, below).

    ``sampling`` (the loop still gathers this implementation's first runs
    here): a warm run shorter than :data:`~core.costmodel.race.SHORT_RUN`
    is repeated until the repeats add up to it, and their median is the
    sample, as FFTW times short plans: one sub-millisecond call took 2-6x
    its back-to-back time on the H200 host, and a loop that compared such
    single calls moved off the fastest implementation.

    ``first_touch``: the first call on this problem in this planner. Its run
    pays what later runs of any implementation do not (the first touch of
    its arrays' pages, cold caches: a 116 ms linreg kernel took 353 ms on
    its first call on the VM, and the loop then left it for one 1.9x
    slower), so it is no warm sample for the loop, unless it was repeated.

    A run that overlapped a background warm-up (:func:`~core.costmodel.warmup.tier_up`)
    is kept apart as cold too: the warm-up shared its cores.

    A warm run is also one of the process's loop runs against ``model``,
    the plan's model-alone prediction for it (Planner.loop_factor).
    ``trial``: the run of a contender tried in the leader's place
    (Planner.observe). ``cold_above``: a first run of the implementation on
    this problem that takes longer is cold, as one that paid a one-off no
    calibration declared (:func:`_undeclared_one_off`).
    """
    planner = current()
    planner.start_backend(get_registry().backends[backend_of(implementation)])
    first = not planner.is_paid(spec, implementation, problem)
    shape_only = first and planner.has_run(spec, implementation)  # a new shape of an implementation run here
    cached = shape_only and planner.compiled_here(spec, implementation, problem)  # ... that a disk cache kept
    cold = first and planner.implementation_one_off(spec, implementation, problem) > 0
    overlapped = warming()  # a background warm-up (tier_up) shares the cores with this run
    # with no calibration to say what a first run owes, the loop does not take it as warm either: an
    # uncalibrated solver's first numba call compiled for 0.09 s in the demo, and as a warm sample it made
    # auto pick a slower implementation (the model's history may keep it: it has no calibration to bias)
    first_touch = first_touch or (first and planner.model(spec, implementation) is None)
    with using(implementation):
        outputs, seconds = run_once(spec, implementation, problem)
        sample = seconds
        if sampling and not cold and seconds < SHORT_RUN:  # the repeats came after the first touch
            sample, first_touch = short_run_sample(lambda: run_once(spec, implementation, problem)[1]), False
    if not cold and seconds > cold_above and not _ran_here(planner.race(spec, nominal), implementation):
        cold = True
    planner.mark_paid(spec, implementation, problem)
    # a run beside a background warm-up is no sample of this implementation's speed: in a fresh process
    # numpy's FP solve took 0.37 s while numba loaded beside it, 0.16 s alone, and as a warm sample it cost
    # a confirming run and moved the loop
    contended = overlapped or warming()
    planner.observe(spec, implementation, problem, sample, outputs, cold or contended, nominal, first_touch, model,
                    trial)
    if not (cold or contended or first_touch):
        planner.note_loop_run(spec.name, implementation, sample, model)
    if first and not contended and (fitted := planner.model(spec, implementation)) is not None:
        # a first call's excess over the steady-state model is this process's one-off cost,
        # when the model can be trusted here (an extrapolation would blame its own error)
        predicted, extrapolated = fitted.predict(model_features(spec, problem, implementation))
        if not extrapolated:
            planner.record_one_off(spec, implementation, max(0.0, seconds - predicted), shape=shape_only,
                                   run_seconds=max(0.0, predicted), cached=cached)
    return outputs, seconds, cold


def _ran_here(race: Any, implementation: str) -> bool:
    return bool(race.warm.get(implementation) or race.cold.get(implementation))


def _undeclared_one_off(step: Step, predicted: Any) -> float:
    """How long a trial's first run on this problem may take before it is taken as cold (inf: never).

    A GPU variant's first run on a new shape pays what its compile key
    does not name: a CUDA graph captured, allocator blocks, pinned buffers
    (spectra's torch:graph ran 99 ms against its model's 19 on the H200
    host, common noise's torch:resident 585 ms against 17). As a warm
    sample it was set aside, lone and above its model's band, the trial
    taught nothing, and call 3 went back to the plan's pick: 29 % and 25 %
    over the variant tried. A run :func:`~core.costmodel.race.outlier_reach`
    over its model (3x beyond the model's band) is such a one-off, not the
    variant's speed, so the trial runs again in the same call
    (:func:`solve`), warm.
    """
    if not step.explore or predicted is None or not predicted.model_seconds:
        return math.inf
    return predicted.model_seconds * outlier_reach(predicted.model_error or 0.0)


def _measure_close(spec: SolverSpec, problem: Any, decision: Plan, nominal: Mapping[str, float]) -> None:
    """``planning="measure"``: time each close candidate warm on this problem before choosing (FFTW's MEASURE)."""
    planner = current()
    race = planner.race(spec, nominal)
    for key in decision.measure:
        if race.warm.get(key):
            continue
        planner.start_backend(get_registry().backends[backend_of(key)])
        with using(key):
            _, timed, outputs = measure_outputs(spec, key, problem)
        planner.mark_paid(spec, key, problem)
        for seconds in timed:  # every timed run is a warm sample: their spread is measured, not assumed
            planner.observe(spec, key, problem, seconds, outputs, False, nominal)


def _step(spec: SolverSpec, decision: Plan, race: Any, expected_calls: float | None,
          planning: str) -> tuple[Step, dict[str, Any] | None]:
    """What this call runs: the plan's pick (``estimate``), or the online loop's next step; with the bands the
    loop weighed (None for the plan's pick), which stand while no warm run is added."""
    if planning == "estimate":
        return Step(decision.backend, False, "the plan's pick (planning='estimate')"), None
    estimated = _estimated(decision, race)
    return _next(spec, decision, race, expected_calls, estimated), estimated


def _next(spec: SolverSpec, decision: Plan, race: Any, expected_calls: float | None,
          estimated: dict[str, Any]) -> Step:
    # an unset count expects this problem to run as often again as it has so far (at least once more)
    calls_left = expected_calls - race.calls if expected_calls is not None else race.calls + 1
    if not race.calls and not any(race.warm.values()):
        # a first call runs the plan's pick (race.next_step: it never tries, and nothing has run warm to miss its
        # model), so what trials would owe, replan or have missed is not asked: a new problem's first call
        # pays its whole plan, and these were 4 us of it on the VM
        return next_step(estimated, race, decision.backend, calls_left)
    replanning = current().replanning_seconds(spec) if race.calls else 0.0
    return next_step(estimated, race, decision.backend, calls_left, _owed(decision), replanning,
                     _missed(decision, race))


def _missed(decision: Plan, race: Any) -> list[str]:
    """The contenders whose runs here lie above their model's whole band (race.model_missed)."""
    return [key for key, p in decision.predictions.items() if race.warm.get(key) and p.model_seconds
            and model_missed((p.model_seconds, p.model_error or 0.0), race.warm[key])]


def _contenders(decision: Plan, beyond: bool = False) -> dict[str, Any]:
    """The plan's predictions of the implementations that may run: not excluded, and predicted; with ``beyond``,
    those the plan left beyond reach too (plan._beyond_reach: the loop never races them, but a leader whose
    runs drift past one must be planned again)."""
    return {key: p for key, p in decision.predictions.items()
            if key not in decision.excluded and (beyond or key not in decision.beyond) and p.seconds is not None}


def _owed(decision: Plan) -> dict[str, float]:
    """Each contender's unpaid one-off less the share its estimate carries (:func:`_estimated`): what a trial
    of it pays on top of its estimate."""
    return {key: p.one_off_seconds * (1 - 1 / decision.expected_calls) for key, p in _contenders(decision).items()
            if p.one_off_seconds}


def _estimated(decision: Plan, race: Any = None) -> dict[str, Any]:
    """Each contender's band as the loop weighs it: its one-off still owed spread over the expected calls, and
    (with the ``race``) in this loop's conditions (race.in_the_loops_conditions)."""
    bands = {key: band_of(p.seconds + p.one_off_seconds / decision.expected_calls, p.error or 0.0, p.samples)
             for key, p in _contenders(decision).items()}
    return bands if race is None else _in_conditions(bands, decision, race)


def _in_conditions(bands: dict[str, Any], decision: Plan, race: Any) -> dict[str, Any]:
    if race.leader is None:  # no call has run a leader here yet: no conditions to scale by (a new problem's plan)
        return dict(bands)
    models = {key: p.model_seconds for key, p in decision.predictions.items()}
    return in_the_loops_conditions(bands, models, race, backend_of)


def _settled(spec: SolverSpec, problem: Any, race: Any, key: tuple) -> Settled | None:
    """The settled step this call reuses (race.settled_step), if the leader can still run this problem here."""
    settled = settled_step(race, key)
    if settled is None or exclusion(spec, problem, settled.step.implementation, recent_free_memory()):
        return None  # the full plan says why it cannot (the data, or the memory free now)
    return settled


def _no_one_off_left(decision: Plan) -> bool:
    """Whether the plan weighed no unpaid one-off (or spread them over endless calls): paying one since, or
    another call made, then changes nothing it decided."""
    return decision.expected_calls == math.inf or not any(p.one_off_seconds for p in decision.predictions.values())


def _settling(key: tuple, step: Step, decision: Plan, race: Any, unlearnt: bool,
              estimated: dict[str, Any] | None = None) -> Settled:
    """The step later calls may reuse: with the lowest estimate of any other contender (the ceiling its
    leader's runs must stay under, its siblings' apart: race.Settled) and the leader's own, as :func:`_step`
    weighs them (one-offs spread, in the loop's conditions as this call's run left them). An unlearnt step keeps
    every contender's band, its model and its backend instead (race.keeps_the_incumbent)."""
    estimated = _estimated(decision, race) if estimated is None else estimated
    if decision.beyond:  # what the plan left beyond reach still bounds how far the leader's runs may drift
        estimated = {**estimated, **{key: band_of(decision.predictions[key].seconds,
                                                  decision.predictions[key].error or 0.0, 0)
                                     for key in decision.beyond}}
    used = step.implementation
    own = estimated[used].centre if used in estimated else math.inf
    error = (decision.predictions[used].error or 0.0) if used in decision.predictions else 0.0
    if unlearnt:
        return Settled(key, step, math.inf, race.calls, decision, True, own, math.inf, error, dict(estimated),
                       {name: p.model_seconds for name, p in decision.predictions.items()},
                       {name: backend_of(name) for name in estimated})
    others = {name: band for name, band in estimated.items() if name != used}

    def lowest(keys: Any) -> float:
        return min((others[name].centre for name in keys), default=math.inf)

    kin = [name for name, band in others.items() if backend_of(name) == backend_of(used) and not band.samples]
    return Settled(key, step, lowest(set(others) - set(kin)), race.calls, decision, unlearnt, own, lowest(kin), error)


def _worth_confirming(decision: Plan, race: Any, used: str) -> bool:
    """Whether this call's run, the first warm one of ``used`` here, is run again now (race.worth_confirming)."""
    model = decision.predictions.get(used)
    if model is None or model.seconds is None or model.samples:  # the plan already held runs: no model alone
        return False
    if len(race.warm.get(used, [])) != 1:  # no lone warm run to confirm (a first call's is no warm run)
        return False
    if not unconfirmed((model.seconds, model.error or 0.0), race.warm[used]):
        return False  # a run within its model's band: nothing to confirm, and the others' bands are not built
    others = {key: band_of(p.seconds, p.error or 0.0, p.samples) for key, p in _contenders(decision, True).items()
              if key != used}
    # siblings in the conditions this run met: a sibling's bare model below a run slowed by the loop's
    # conditions decides nothing (race.in_the_loops_conditions)
    others = _in_conditions(others, decision, race)
    return worth_confirming((model.seconds, model.error or 0.0), race.warm.get(used, []), others)


@accepts_planner
def solve(problem: Any, backend: str = "auto", *, solver: str | None = None,
          expected_calls: float | None = None, max_seconds: float | None = None,
          planning: str = "race") -> Result:
    """Run ``problem`` and return its outputs with the measured wall time.

    ``backend="auto"`` follows :func:`core.plan` (calibrating once if this
    solver was never calibrated here); a backend name (``numba``) or an
    implementation key (``numba:fused``) runs there or raises a one-line
    error saying why it cannot. ``solver`` names the solver when several
    take the same problem type; ``expected_calls`` spreads unpaid one-off
    costs (JIT, pool start) over that many calls (default: learnt from the
    calls this process makes, see :mod:`core.costmodel.plan`). A run
    predicted to take longer than ``max_seconds`` (default: one hour, or
    ``CROSSOVER_MAX_SECONDS``; ``inf`` for none) is refused before it starts,
    with :class:`~core.errors.TooLongError` giving the prediction.

    ``planning`` is how hard to look, as FFTW's planner flags: ``"race"``
    (the default) runs the online loop of :mod:`core.costmodel.race`, which
    tries close contenders through the calls themselves and keeps the one
    that measured fastest; ``"estimate"`` runs the models' pick and never
    explores; ``"measure"`` first times every close candidate warm on this
    problem (a few runs each), then races. ``planner=`` runs the call on that
    :class:`~core.costmodel.planner.Planner` instead of the current one.
    """
    limit = limits.max_seconds(max_seconds)
    planning = check_choice("planning", planning, PLANNING)
    spec = get_solver(solver) if solver is not None else find_solver(problem)
    if not isinstance(problem, spec.problem_type):
        raise ProblemError(f"solver {spec.name!r} takes a {spec.problem_type.__name__}, "
                           f"got {type(problem).__name__}")
    with fields_held(problem):  # read once in this call, not at each of the loop's keys and records
        return _solve(spec, problem, backend, expected_calls, limit, planning)


def _solve(spec: SolverSpec, problem: Any, backend: str, expected_calls: float | None, limit: float,
           planning: str) -> Result:
    """:func:`solve` on a checked problem of a found solver: plan (or reuse a settled step), run, observe."""
    planner = current()
    planner.count_call(spec)
    nominal = spec.features(problem)
    race = planner.race(spec, nominal)
    racing = backend == "auto" and planning == "race"  # the loop whose settled steps later calls may reuse
    settled_key = (numeric_key(problem), planner.epoch, expected_calls)
    settled = _settled(spec, problem, race, settled_key) if racing else None
    if settled is not None:  # nothing left to decide on this problem: the settled step again, unplanned
        decision, step = settled.plan, settled.step
    else:
        began, fits = time.perf_counter(), planner.fits
        if backend == "auto":
            ensure_calibrated(spec)
            decision = plan_problem(spec, problem, nominal, expected_calls, race)
            tier_up(spec, decision)
        else:
            decision = _named(spec, problem, backend, expected_calls, nominal, race)
        if planning == "measure" and decision.measure:
            _measure_close(spec, problem, decision, nominal)
            only = None if backend == "auto" else list(decision.predictions)
            decision = plan(problem, solver=spec.name, expected_calls=expected_calls, explain=False, only=only)
        step, estimated = _step(spec, decision, race, expected_calls, planning)
        # a known problem planned again (its view was cached), or a new one (call 1 builds it), unless it fitted
        # a model (a planner's first plan: milliseconds that no later plan pays)
        if racing and (race.calls or planner.fits == fits):
            planner.note_planning(spec, time.perf_counter() - began, known=race.calls > 0)
    used = step.implementation
    _refuse_if_too_long(spec, problem, decision, used, limit)
    first_touch = race.calls == 0
    learnt = any(race.warm.values())  # before this call's run: what a reused step had seen
    race.calls += 1
    race.explored += step.explore
    if not step.explore:
        race.leader = used
    # a sample worth repeating a short run for: the loop is still deciding, and has few runs of this one
    sampling = planning != "estimate" and step.contested and len(race.warm.get(used, [])) < SPREAD_AFTER
    predicted = decision.predictions.get(used)
    model = predicted.model_seconds if predicted is not None else None
    outputs, seconds, cold = _run(spec, used, problem, nominal, sampling, first_touch, model, step.explore,
                                  _undeclared_one_off(step, predicted))
    confirmed, again = None, "confirm"
    if step.explore and cold and not first_touch and not (predicted and predicted.one_off_seconds):
        # a trial whose first run paid a one-off nothing declared: a warm run is what it is for
        confirmed = _run(spec, used, problem, nominal, sampling, model=model, trial=True)[1]
        again = "time it warm after"
    # a trial that ran warm is not run again: one that ran slow hands the next call back to the leader anyway
    if planning != "estimate" and not cold and not step.explore and _worth_confirming(decision, race, used):
        # its outputs are the same: the timing is what counts
        confirmed = _run(spec, used, problem, nominal, sampling, model=model)[1]
    if racing and settled is None:
        settling = settles(step, race) and not cold and confirmed is None
        # nothing learnt, and the next call would not try anything either (race.first_trial); with no warm run
        # added, this call's bands stand
        unlearnt = (not settling and learnt_nothing(step, race) and _no_one_off_left(decision)
                    and not (step.contested and _next(spec, decision, race, expected_calls, estimated).explore))
        race.settled = (_settling(settled_key, step, decision, race, unlearnt, estimated if unlearnt else None)
                        if settling or unlearnt else None)
    return Result(solver=spec.name, backend=used, seconds=seconds, outputs=outputs, plan=decision,
                  diagnostics={"problem": type(problem).__name__, "first_call": cold,
                               "step": step.reason + (f"; ran again to {again} its {seconds:.3g} s: {confirmed:.3g} s"
                                                      if confirmed is not None else "")
                               + (f" ({'as' if settled.unlearnt else 'settled on'} call {settled.at}"
                                  f"{_since(settled, learnt)}: not planned again)" if settled else ""),
                               "explored": step.explore},
                  predicted_seconds=None if predicted is None else predicted.seconds)


def _since(settled: Settled, learnt: bool) -> str:
    """What a reused step's reason adds: why the loop did not plan again (race.settled_step)."""
    if not settled.unlearnt:
        return ""
    return ": its runs since lie under every other estimate" if learnt else ": nothing learnt since"


def _refuse_if_too_long(spec: SolverSpec, problem: Any, decision: Plan, key: str, limit: float) -> None:
    """Nothing starts that the models predict to run past the limit (the plan's prediction: a named backend's
    plan carries its own too, see :func:`_named`)."""
    prediction = decision.predictions.get(key)
    predicted = prediction.seconds if prediction is not None else None
    if predicted is None:  # no model for the implementation that will run: limits decides how to bound it
        predicted = limits.unmodelled_seconds(spec, problem, key, limit)
    if predicted is not None:
        limits.refuse_if_too_long(spec.name, key, predicted, limits.predicted_memory(spec, problem, key), limit)
