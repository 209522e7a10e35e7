"""Auto-selection: predict every implementation, rule some out, pick one, explain why.

The decision, in the spirit of scipy's ``choose_conv_method``::

    cost(i)   = predicted_seconds(i) + unpaid_one_off(i) / expected_calls
    error(i)  = the model's leave-one-out relative error (at least 2 %; 50 % when extrapolated)
    best      = min(cost(i) for i in candidates)
    margin(i) = clip(hypot(error(best), error(i)), 2 %, 10 %)   (to 25 % where i bets less one-off)
    chosen    = of i with cost(i) <= cost(best) * (1 + margin(i)): simplest, least at_stake(i), cheapest

Candidates are the implementations whose backend is available, that support
the problem, whose memory estimate fits and that have a model. The margin
exists because a gain inside the models' own error is noise, while the
simpler backend (fewer processes, no device) has fewer ways to go wrong; it
follows the measured error but is capped, so that the simpler choice never
costs more than 10 % by the models' own account. Between equally simple
ones, the smaller one-off at stake wins (:func:`choose`); and one that
puts less one-off at stake than the cheapest, by more than one of its
calls, is within up to 25 % where the models' combined error says so
(:func:`_bets_less`): a one-off paid on a gain inside their error is lost
if the gain was not there.

**When in doubt, measure.** The plan is *not confident* when a runner-up's
cost is within twice the combined error of the best (their error bands
overlap), or when the chosen prediction is extrapolated or uncalibrated.
Those runners-up are the plan's ``close`` set: ``core.solve`` races them
through the calls themselves (:mod:`core.costmodel.race`), and a plan for a
problem that has run warm here predicts it from those runs (status
``measured``, error from their spread). ``measure`` lists the close
candidates whose one-offs are paid, for ``planning="measure"``.

**What is beyond reach is not weighed.** A plan made only to decide
(``core.solve``'s: ``explain=False``) leaves out an implementation its
model puts slower than the cheapest candidate by more than any margin and
two errors either way (:func:`_beyond_reach`, ``Plan.beyond``): it could be
neither chosen nor close nor tried, so its trust region, exclusions and
one-offs are not looked up. Its error is taken as an extrapolation's; one
within that reach is judged, and left out too if its judged error still
puts it beyond (then only its exclusions and one-offs go unread).

**Expected work.** Where a solver's work depends on convergence, the
features are the work similar problems were seen to do
(:meth:`~core.costmodel.planner.Planner.expected_work`), and the plan shows
them in ``expected_work``.

**Expected calls learn from the process, and from those before it.** Left
unset, ``expected_calls`` is the median number of calls of this solver
that recent earlier processes made (stored with the timings;
:meth:`~core.costmodel.planner.Planner.past_calls`), or 1 before any, and
never fewer than the calls this process has made so far. So a one-off cost
(JIT, pool start) is paid at once where scripts habitually call the solver
many times, and otherwise once the calls made so far would have paid for
it, as a JIT tiers a function up once it has been called often enough. A
caller who knows better passes ``expected_calls``; the larger of it and
the calls made so far counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core import limits
from core.costmodel.calibrate import ensure_calibrated
from core.costmodel.design import with_size
from core.costmodel.features import model_features
from core.costmodel.fit import CostModel
from core.costmodel.planner import accepts_planner, current, numeric_key, problem_key
from core.costmodel.race import EXTRAPOLATED_ERROR, estimate, relative_error
from core.errors import AutoSelectionError
from core.registry import get_registry, get_solver
from core.result import Plan, Prediction
from core.running import exclusion, find_solver, implementations, memory_need
from core.solver import SolverSpec, backend_of
from core.validation import check_float

MIN_ERROR = 0.02
# EXTRAPOLATED_ERROR (0.5) is the online loop's too: a contender extrapolating may be tried on call 3
MIN_MARGIN, MAX_MARGIN = 0.02, 0.10
AT_STAKE_MARGIN = 0.25  # ... for a candidate that bets less one-off than the cheapest (_bets_less)
OVERLAP = 2.0  # error bands: this many relative errors either side
MEASURE_AT_MOST = 3
VIEW_SECONDS = 1.0  # a cached view of the models is reused this long (the free memory it read ages)
VIEWS_KEPT = 256


def choose(costs: Mapping[str, float], simplicity: Mapping[str, int],
           margin: float | Mapping[str, float] = 0.05, owed: Mapping[str, float] | None = None) -> str:
    """The simplest implementation whose cost is within its margin of the cheapest; among equally simple ones,
    the one with the least one-off at stake (``owed``: the most its run may still pay), then the cheapest.

    Within the margin the models cannot tell the costs apart, so what
    decides is what a wrong pick would cost: a one-off still to pay is lost
    if the other was faster after all. ``costs`` spread one-offs over the
    expected calls, so at ``expected_calls=inf`` they weigh nothing there: on
    the H200 host linreg's torch:compile was modelled 2.4 % under
    torch:graph on 7.7M samples, and its first call at that size paid 337
    ms for a 6.4 ms run, where torch:graph's capture took 3 ms (and it ran
    faster: 5.4 ms).
    """
    if not costs:
        raise AutoSelectionError("no backend to choose from")
    best = min(costs.values())
    margins = margin if isinstance(margin, Mapping) else dict.fromkeys(costs, margin)
    near = [name for name, cost in costs.items() if cost <= best * (1 + margins[name])]
    owed = owed or {}
    return min(near, key=lambda name: (simplicity.get(name, 50), owed.get(name, 0.0), costs[name]))


UNRECORDED_CALLS = 4.0
"""The calls a process is expected to make of a solver when no earlier process's count is recorded.

With 1, the first process after a calibration ran numpy for FP at N=50,000
(0.18 s a call) until the calls made had paid numba's one-off (0.35 s),
and its eight calls took 1.55-2.1x numba's total (the 2-competitive
rent-or-buy). With 4, an implementation owing a one-off is taken from the
first call where four calls would pay for it: a loop gets it at once, and
a script that calls once pays at most 4x that call in its first process
only (later ones expect what earlier ones made)."""


def effective_calls(spec: SolverSpec, expected_calls: float | None) -> float:
    """The calls one-off costs are spread over: the caller's count, else what earlier processes made
    (:data:`UNRECORDED_CALLS` before any); never fewer than the calls made so far."""
    if expected_calls is not None and not expected_calls > 0:  # also refuses NaN; inf ignores one-offs
        raise AutoSelectionError(f"expected_calls={expected_calls!r} is invalid: must be > 0")
    planner = current()
    prior = expected_calls if expected_calls is not None else (planner.past_calls(spec) or UNRECORDED_CALLS)
    return max(float(prior), float(planner.calls(spec)))


@dataclass
class _Candidate:
    prediction: Prediction
    cost: float
    error: float
    simplicity: int
    at_stake: float = 0.0  # the largest one-off its run here may pay (Planner.one_off_at_stake)


def _judged(fitted: CostModel | None, features: Mapping[str, float], seconds: float,
            regions: dict[tuple, bool] | None = None) -> Prediction:
    """What the implementation's model alone predicts (no one-off, no runs of this problem), its trust region
    judged (``regions``: the problem's judgements so far, CostModel.outside): ``seconds`` is its prediction at
    ``features``."""
    if fitted is None:
        return Prediction(None, "uncalibrated")
    status = "extrapolated" if fitted.outside(features, regions) else fitted.status
    error = max(MIN_ERROR, fitted.relative_error)
    if status != "calibrated":
        error = max(error, EXTRAPOLATED_ERROR)
    return Prediction(seconds, status, 0.0, error, 0, seconds, error)


def _unjudged(fitted: CostModel, seconds: float) -> Prediction:
    """A prediction beyond the plan's reach (``Plan.beyond``): the model's word, its trust region not judged."""
    error = max(MIN_ERROR, fitted.relative_error)
    return Prediction(seconds, "beyond", 0.0, error, 0, seconds, error)


def _with_runs(model: Prediction, warm: Sequence[float], one_off: float) -> Prediction:
    """The model's prediction with this process's unpaid one-off, and with warm runs of this problem if any."""
    if not warm:  # the model's own where nothing is owed (a Prediction is immutable): each costs a plan 1-2 us
        return model if one_off == model.one_off_seconds else Prediction(
            model.seconds, model.status, one_off, model.error, model.samples, model.seconds, model.error)
    # the model and the runs together (core.costmodel.race)
    guess = (max(model.seconds, 1e-12), model.error) if model.seconds is not None else None
    band = estimate(guess, list(warm))
    if not band.samples and model.seconds is not None:  # the runs set aside (race.estimate): the model's alone
        return Prediction(model.seconds, model.status, one_off, model.error, 0, model.seconds, model.error)
    return Prediction(band.centre, "measured", one_off, relative_error(band), band.samples, model.seconds,
                      model.error)


@dataclass(frozen=True)
class _View:
    """What the models say of one problem: cached, since it changes only when a model or the memory does."""

    base: Mapping[str, float]  # the expected work
    seconds: Mapping[str, float | None]  # each implementation's model's prediction (None: no model)
    features: Mapping[str, Mapping[str, float]]  # ... at these features
    models: Mapping[str, CostModel]
    free_memory: dict[str, float | None]  # each backend's, read once per view
    at: float
    judged: dict[str, Prediction] = field(default_factory=dict)  # the predictions, their regions judged once
    regions: dict[tuple, bool] = field(default_factory=dict)  # ... by region and point (CostModel.outside)

    def prediction(self, key: str) -> Prediction:
        """The model's alone, its trust region judged (each costs a new problem's plan 3-4 us on the VM)."""
        found = self.judged.get(key)
        if found is None:
            found = self.judged[key] = _judged(self.models.get(key), self.features.get(key, {}),
                                               self.seconds[key] or 0.0, self.regions)
        return found

    @property
    def predictions(self) -> dict[str, Prediction]:
        return {key: self.prediction(key) for key in self.seconds}


def recent_free_memory() -> dict[str, float | None]:
    """Each backend's free memory as read at most :data:`VIEW_SECONDS` ago, filled as backends are asked about.

    For :func:`core.running.exclusion`'s ``free_memory``: each reading
    opens /proc and cgroup files (7 opens, a sixth of a steady-state
    solve's overhead on the H200 host when read per call). The readings
    are the process's, shared by its planners.
    """
    process = current().process
    at, readings = process.memory_read
    if time.monotonic() - at >= VIEW_SECONDS:  # as old as a view may be, no older
        readings = {}
        process.memory_read = (time.monotonic(), readings)
    return readings


def _view(spec: SolverSpec, problem: Any, nominal: Mapping[str, float], only: Sequence[str] | None) -> _View:
    """The models' view of ``problem``, reused while no model changed and the free memory is recent.

    Building it reads the free memory, the solver's memory estimates and
    every model: most of a small solve's overhead when done per call. Its
    key is the problem's features and numeric fields (the expected work
    depends on tolerances and caps too); what excludes an implementation
    can depend on the data themselves (their magnitude, for float32
    variants), so exclusions are not part of it (:func:`_exclusions`).
    """
    planner = current()
    key = (spec.name, problem_key(nominal), numeric_key(problem),
           tuple(only) if only is not None else None, planner.epoch)
    cached = planner.views.get(key)
    if cached is not None and time.monotonic() - cached.at < VIEW_SECONDS:
        return cached
    base = planner.expected_work(spec, problem, nominal)
    free_memory = recent_free_memory()
    seconds, features, models = {}, {}, {}
    for name, fitted in _roster(spec, only):
        if fitted is None:
            seconds[name] = None
            continue
        features[name] = model_features(spec, problem, name, base)
        seconds[name], models[name] = max(fitted.seconds(features[name]), 0.0), fitted
    view = _View(base, seconds, features, models, free_memory, time.monotonic())
    if len(planner.views) > VIEWS_KEPT:
        planner.views.clear()
    planner.views[key] = view
    return view


def _roster(spec: SolverSpec, only: Sequence[str] | None) -> tuple[tuple[str, CostModel | None], ...]:
    """The implementations a plan weighs (of ``only``, where given) and their models, in the plugin's order: the
    same for every problem until a model or a calibration changes (the planner's epoch), the stored timings are
    read again (a flush merges the file: each model then checks its entry) or a backend registers.

    Looking each model up per problem (its entry in the store, its
    signature, whether a refit is due) cost a new problem's view 1.1 us an
    implementation on the VM, a tenth of a small problem's first plan; a
    refit that falls due bumps the epoch, so the next view looks again.
    """
    planner = current()
    stored = planner.stored()
    key = ("roster", spec.name, tuple(only) if only is not None else None, planner.epoch,
           tuple(get_registry().backends))
    found = planner.views.get(key)
    if found is None or found[0] is not stored:
        found = planner.views[key] = (stored, tuple((name, planner.model(spec, name)) for name in implementations(spec)
                                                    if only is None or name in only))
    return found[1]


def model_prediction(spec: SolverSpec, problem: Any, nominal: Mapping[str, float],
                     key: str) -> tuple[Prediction, dict[str, float]]:
    """What the implementation's model alone predicts for ``problem`` (no one-off, no runs of it), and the
    expected work it assumed where that differs from the nominal, from the view a known problem's calls
    reuse: the prediction a call naming a backend with a single variant carries (it needs no plan)."""
    view = _view(spec, problem, nominal, (key,))
    return view.prediction(key), {name: value for name, value in view.base.items() if value != nominal.get(name)}


@accepts_planner
def plan(problem: Any, *, solver: str | None = None, expected_calls: float | None = None,
         margin: float | None = None, calibrate: bool = False, explain: bool = True,
         only: Sequence[str] | None = None) -> Plan:
    """Decide which implementation runs ``problem`` and show the working.

    With ``calibrate=True`` a solver never calibrated on this machine is
    calibrated once (quick mode) first; without it, such a plan raises.
    ``explain`` adds the break-even sizes (a few ms: left out when solving).
    ``only`` restricts the choice to these implementation keys (a named
    backend with several variants). ``margin`` fixes the margin instead of
    deriving it from the models' errors.
    """
    spec = get_solver(solver) if solver is not None else find_solver(problem)
    if margin is not None:
        margin = check_float("margin", margin, minimum=0)
    if calibrate:
        ensure_calibrated(spec)
    nominal = spec.features(problem)
    return plan_problem(spec, problem, nominal, expected_calls, current().known_race(spec, nominal), margin=margin,
                        explain=explain, only=only)


def plan_problem(spec: SolverSpec, problem: Any, nominal: Mapping[str, float], expected_calls: float | None,
                 race: Any, *, margin: float | None = None, explain: bool = False,
                 only: Sequence[str] | None = None) -> Plan:
    """:func:`plan` of a solver already found (and calibrated), with the problem's features and its loop's
    ``race`` (None before any) known: what ``core.solve`` asks on a new problem's first call, where
    finding them again was 3-5 us of a 40 us kernel's overhead on the VM."""
    calls = effective_calls(spec, expected_calls)
    planner = current()
    view = _view(spec, problem, nominal, only)
    backends = get_registry().backends
    predictions: dict[str, Prediction] = {}
    excluded: dict[str, str] = {}
    candidates: dict[str, _Candidate] = {}
    beyond: list[str] = []
    reaching = margin is None and not explain  # a plan that only decides may leave out what is beyond reach
    cheapest, widest = math.inf, 0.0  # of the candidates weighed so far: the lowest cost, the largest error
    # the cheapest models first, those with runs here before them (runs can take one under its model), so that
    # one beyond reach of the cheapest so far is known before anything else about it is looked up
    ran = {key for key in view.seconds if _ran_here(race, key)}
    for key in sorted(view.seconds, key=lambda k: (k not in ran, view.seconds[k] or 0.0)):
        seconds = view.seconds[key]
        unraced = reaching and seconds is not None and key not in ran
        if unraced and _beyond_reach(seconds, max(view.models[key].relative_error, EXTRAPOLATED_ERROR),
                                     cheapest, widest):
            predictions[key] = _unjudged(view.models[key], seconds)
            beyond.append(key)
            continue
        model = view.prediction(key)
        if unraced and _beyond_reach(seconds, model.error or 0.0, cheapest, widest):
            # beyond reach by its own error once judged (a model good to a few per cent, at twice the cheapest):
            # its exclusions and one-offs are not looked up either, each some microseconds of every new
            # problem's first call, and tens after a large problem's run has left the caches cold
            predictions[key] = model
            beyond.append(key)
            continue
        why = exclusion(spec, problem, key, view.free_memory)
        if why:  # it cannot run: its model's word stands, with no one-off or runs of it to weigh
            predictions[key], excluded[key] = model, why
            continue
        one_off, at_stake = planner.one_offs(spec, key, problem, model.seconds)
        prediction = predictions[key] = _with_runs(model, race.warm.get(key, []) if race else [], one_off)
        if prediction.seconds is None:  # no model, and no warm run of this problem either
            excluded[key] = "uncalibrated on this machine (run `crossover calibrate`)"
            continue
        candidates[key] = _Candidate(prediction, prediction.seconds + one_off / calls, prediction.error,
                                     backends[backend_of(key)].simplicity,
                                     at_stake)
        cheapest, widest = min(cheapest, candidates[key].cost), max(widest, candidates[key].error or 0.0)
    predictions = {key: predictions[key] for key in view.seconds}  # in the plugin's order, as listed
    candidates = {key: candidates[key] for key in view.seconds if key in candidates}
    if not candidates:
        reasons = "; ".join(f"{b}: {why}" for b, why in excluded.items()) or "no backends"
        raise AutoSelectionError(f"no backend can run {spec.name} here ({reasons})")
    chosen, reason, confident, to_measure, close = _decide(candidates, calls, margin)
    thresholds = ()
    if explain:
        runnable = {k: m for k, m in view.models.items()
                    if not excluded.get(k, "").startswith(("unavailable", "unsupp"))}
        free = {k: view.free_memory.get(backend_of(k)) for k in runnable}
        thresholds = tuple(break_even(spec, problem, runnable, free))
    seconds, limit = predictions[chosen].seconds, limits.max_seconds()
    # the memory only decorates a warning: estimated where there is one (a plan per new problem)
    warning = limits.too_long(spec.name, chosen, seconds, limits.predicted_memory(spec, problem, chosen), limit) \
        if seconds is not None and seconds > limit else ""
    if warning:  # say it in the plan too, so `crossover plan` warns before `crossover run` refuses
        reason = f"{reason}; WARNING: {warning}"
    return Plan(solver=spec.name, backend=chosen, reason=reason, predictions=predictions, excluded=excluded,
                beyond=tuple(beyond), break_even=thresholds, measure=to_measure, close=close, expected_calls=calls,
                confident=confident,
                expected_work={name: value for name, value in view.base.items() if value != nominal.get(name)})


def _ran_here(race: Any, key: str) -> bool:
    return race is not None and bool(race.warm.get(key) or race.cold.get(key))


def _beyond_reach(seconds: float, error: float, cheapest: float, widest: float) -> bool:
    """Whether an implementation that has not run here, predicted at ``seconds`` to within ``error``, lies beyond
    every use a plan or its loop has for it: slower than the ``cheapest`` cost of the candidates weighed so far
    by more than any margin, and by more than the two errors either way that make a candidate close or let the
    loop try it. Its ``error`` is an extrapolation's where its trust region is not yet judged, else its
    prediction's; the other is the ``widest`` of any candidate weighed (the cheapest's, whichever it turns out
    to be).

    Such an implementation's exclusions, one-offs and stakes are not
    looked up (nor its trust region, where the extrapolation's error
    already puts it beyond), nor is it raced (``Plan.beyond``): a new
    problem's first call pays for every candidate it weighs, and on the
    H200 host linreg's small problems (numba at 0.06 ms, torch:graph 5x
    that, eager and compile 40-100x, numpy 3x) paid 0.47-0.58 ms over
    their kernels on call 1, against 0.15 for a first call naming numba.
    """
    spread = math.hypot(error, widest)
    return seconds > cheapest * max(1 + AT_STAKE_MARGIN, math.exp(OVERLAP * spread))


def _margins(candidates: Mapping[str, _Candidate], best: str, margin: float | None) -> dict[str, float]:
    """Each candidate's margin over the cheapest: their combined error, at least :data:`MIN_MARGIN`, at most
    :data:`MAX_MARGIN`, or :data:`AT_STAKE_MARGIN` for one that bets less one-off (:func:`_bets_less`)."""
    if margin is not None:
        return dict.fromkeys(candidates, margin)
    top = candidates[best]
    return {k: min(AT_STAKE_MARGIN if _bets_less(c, top) else MAX_MARGIN,
                   max(MIN_MARGIN, math.hypot(top.error, c.error))) for k, c in candidates.items()}


def _bets_less(candidate: _Candidate, cheapest: _Candidate) -> bool:
    """Whether ``candidate`` puts less one-off at stake than the cheapest, by more than one of its calls.

    Such a one-off is lost if the models' gain was their error: on the
    H200 host linreg's ``torch:compile`` was modelled 11.5 % under
    ``torch:graph`` at 16M samples, each to 24 and 36 %, and the first
    call compiled for the new size (0.53 s on a 14 ms solve); graph then
    ran 12 % faster (a 14.7x loop, 14 % regret). At 32M, 23 % under, 5 %
    slower. Within the models' combined error, up to
    :data:`AT_STAKE_MARGIN`, it is a candidate (:func:`choose` orders
    them: simplest, then the smaller bet, then the cheaper).
    """
    return cheapest.at_stake - candidate.at_stake > cheapest.cost


def _decide(candidates: Mapping[str, _Candidate], calls: float,
            margin: float | None) -> tuple[str, str, bool, tuple[str, ...], tuple[str, ...]]:
    costs = {k: c.cost for k, c in candidates.items()}
    best = min(costs, key=costs.get)
    margins = _margins(candidates, best, margin)
    chosen = choose(costs, {k: c.simplicity for k, c in candidates.items()}, margins,
                    {k: c.at_stake for k, c in candidates.items()})
    reason = f"lowest predicted time {costs[chosen]:.3g} s"
    if chosen != best:
        why = "simpler" if candidates[chosen].simplicity < candidates[best].simplicity else "owes less one-off"
        reason = (f"within {margins[chosen]:.0%} of the fastest ({best}, {costs[best]:.3g} s) and {why}: "
                  f"{costs[chosen]:.3g} s")
    one_off = candidates[chosen].prediction.one_off_seconds
    if one_off:
        reason += f", including an unpaid one-off of {one_off:.3g} s spread over {calls:g} call(s)"
    top = candidates[best]
    close = sorted((k for k, c in candidates.items()
                    if c.cost <= top.cost * (1 + OVERLAP * math.hypot(top.error, c.error))), key=costs.get)
    doubtful = candidates[chosen].prediction.status in ("extrapolated", "uncalibrated")
    unmeasured = [k for k in close if candidates[k].prediction.status != "measured"]
    confident = not unmeasured or (len(close) == 1 and not doubtful)
    to_measure: tuple[str, ...] = ()
    if not confident:
        why = "an extrapolated prediction" if doubtful else f"{', '.join(close)} overlap within their errors"
        ready = [k for k in close if candidates[k].prediction.one_off_seconds == 0.0]
        if calls >= 2 and len(ready) >= 2:
            to_measure = tuple(ready[:MEASURE_AT_MOST])
        reason += f"; not confident ({why})"
    return chosen, reason, confident, to_measure, tuple(close)


# -- break-even along the size axis ---------------------------------------------------

def size_grid(spec: SolverSpec, points: int = 80) -> np.ndarray:
    """Sizes from half the calibrated range's bottom to eight times its top, log-spaced."""
    if spec.space is not None and spec.size_axis in spec.space(True).ranges:
        low = min(spec.space(True).ranges[spec.size_axis][0], spec.space(False).ranges[spec.size_axis][0])
        high = max(spec.space(True).ranges[spec.size_axis][1], spec.space(False).ranges[spec.size_axis][1])
    else:
        sizes = [float(getattr(p, spec.size_axis)) for p in spec.ladder(True) + spec.ladder(False)]
        low, high = min(sizes), max(sizes)
    return np.geomspace(max(low / 2, 1e-12), high * 8, points)


def curves(spec: SolverSpec, problem: Any, models: Mapping[str, CostModel], grid: np.ndarray | None = None,
           free_memory: Mapping[str, float | None] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Predicted steady-state seconds of each implementation along the primary size axis.

    Where ``free_memory`` is given, sizes whose memory estimate does not fit
    an implementation are NaN for it: it cannot run there.
    """
    grid = size_grid(spec) if grid is None else grid
    free_memory = free_memory or {}
    rows = {name: np.full(len(grid), np.nan) for name in models}
    for i, size in enumerate(grid):
        resized = with_size(spec, problem, size)
        if resized is None:
            continue
        base = spec.features(resized)
        for name, fitted in models.items():
            free = free_memory.get(name)
            if free is not None and memory_need(spec, resized, name) > free:
                continue
            if spec.supports(resized, name):
                continue
            rows[name][i] = fitted.predict(model_features(spec, resized, name, base))[0]
    return grid, rows


def _fastest(values: dict[str, float]) -> str | None:
    finite = {name: v for name, v in values.items() if not math.isnan(v)}
    return min(finite, key=finite.get) if finite else None


def break_even(spec: SolverSpec, problem: Any, models: Mapping[str, CostModel],
               free_memory: Mapping[str, float | None] | None = None) -> list[dict[str, Any]]:
    """Sizes along the primary axis where the fastest implementation changes.

    Memory limits are applied at each size, so a GPU that cannot hold this
    problem still shows where it wins on smaller ones. The size is refined by
    bisection in log space between grid points, to about 1e-6 relative,
    far below the models' own error.
    """
    if len(models) < 2:
        return []
    grid, rows = curves(spec, problem, models, free_memory=free_memory)
    winners = [_fastest({n: rows[n][i] for n in rows}) for i in range(len(grid))]
    found = []
    for i in range(len(grid) - 1):
        below, above = winners[i], winners[i + 1]
        if below is None or above is None or below == above:
            continue
        pair = {below: models[below], above: models[above]}
        low, high = math.log(grid[i]), math.log(grid[i + 1])
        for _ in range(30):
            middle = (low + high) / 2
            _, point = curves(spec, problem, pair, np.array([math.exp(middle)]), free_memory)
            if _fastest({n: point[n][0] for n in point}) == below:
                low = middle
            else:
                high = middle
        found.append({"axis": spec.size_axis, "size": float(math.exp((low + high) / 2)), "below": below,
                      "above": above})
    return found
