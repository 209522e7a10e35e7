"""The online loop's rule: which implementation one call of ``core.solve`` runs on a problem it has seen.

Choosing among implementations over repeated calls is a race (a bandit
with a known horizon), so every call both answers the user and informs the
next. This module is pure arithmetic on what the loop has seen of one
problem; the :class:`~core.costmodel.planner.Planner` keeps that state.

The rule, pinned by ``tests/test_online_loop.py`` and stated in
``docs/costmodel.md``:

1. **Warm samples only.** A call that owed a one-off (a compile for this
   shape, a cache to fill: what calibration measured as a first run's
   excess) is kept apart as *cold* and never compared with warm samples,
   and so is the first call on a problem (it touches the problem's memory
   first, for every implementation after it), and a run beside a
   background warm-up (it shared the cores). Each implementation keeps
   its last :data:`WINDOW` warm samples. While it has fewer than
   :data:`SPREAD_AFTER` and another contender could still be faster (the
   step is *contested*), a run shorter than
   :data:`SHORT_RUN` is repeated within the call and the sample is the
   repeats' median (FFTW repeats short runs): single sub-millisecond calls
   mislead. Uncontested, a call runs once.
2. **An estimate is the model and the samples together.** In log time,
   the model's prediction counts with its relative error (at least
   :data:`MODEL_FLOOR`: its leave-one-out error understates a miss off
   the design), and each warm sample with the spread of the samples
   themselves (their standard deviation, at least :data:`MIN_SPREAD`, once
   there are :data:`SPREAD_AFTER`; until then :data:`SAMPLE_SPREAD`). The
   estimate is their precision-weighted mean, and its band is plus or
   minus ``OVERLAP`` of its own standard error; with no warm sample yet,
   a cold run under the model caps it (a cold run pays more, never less:
   :func:`bounded_by_its_first_run`). A sample over
   :data:`OUTLIER_RATIO` times the median of the others is set aside, and
   so is a lone sample above its model's band, until a second run
   confirms it (run at once, in the same call, when another contender's
   estimate lies below it: :func:`worth_confirming`). Runs that agree with
   each other beyond the model's band make the model's error at least
   their distance from it, and :data:`OUTLIER_RATIO` beyond the band they
   replace it. One noisy run moves a well-calibrated model's
   estimate a little; consistent runs take over.
3. **The leader** is the plan's pick until something has run warm here,
   then the lowest estimate (the plan's pick within :data:`MIN_SPREAD` of
   it); but a contender known only by its model takes the lead from the
   incumbent (what the last call that did not explore ran) only when the
   incumbent's estimate lies above that model's whole band. Each call
   that runs the leader adds a sample, so a leader that drifts up hands
   the lead to the next estimate, which then runs and is re-checked.
4. **Dropped when the data say so.** A contender whose band lies wholly
   above the leader's is out.
5. **Exploring is charged to the calls left.** A contender with fewer
   warm runs than the leader (so the leader runs first, and a cold leader
   runs again) is tried in the leader's place when the time it is
   expected to save per call, ``E[max(0, t_leader - T)]`` over its
   log-normal estimate ``T``, times the calls after this one (at most
   :data:`EXPLORE_HORIZON`), exceeds what the trial costs over the
   leader. The most promising goes first, only on calls 2, 4, 8, 16, ...
   of the problem (so the call after a trial runs the best estimate), at
   most :data:`EXPLORE_AT_MOST` times per problem. Call 2 weighs its trial
   against the plan's pick's model, since call 1 is never warm and nothing
   has a warm run yet (:func:`first_trial`); a trial is never run again to
   confirm it (a slow one hands the next call back to the leader). Call 3
   tries the contender the incumbent kept from the lead when nothing was
   tried yet, it lies below the incumbent's whole band, and its model
   extrapolates or the incumbent's own model missed: two agreeing runs,
   in the models' terms, above that model's whole band
   (:func:`challenged`, :func:`model_missed`). A contender the models place far behind is
   never tried; one as good as the leader within its error is.
6. **Siblings share the loop's conditions.** An implementation known only
   by its model, of the incumbent's backend, is estimated at its model
   times the incumbent's median warm run here over its model
   (:func:`in_the_loops_conditions`): a new problem's first calls run all
   of a backend's variants slower than calibration did, alike. Other
   backends share :data:`CROSS_SHARE` of such a miss, in log time
   (:func:`shared_part`): where every model missed alike, another
   backend's bare model looked faster than every run of the incumbent.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

WINDOW = 9  # warm samples kept per implementation and problem: recent enough to follow a drift
MIN_SPREAD = 0.02  # a sample's spread never below 2 %: the clock and the scheduler's jitter
SAMPLE_SPREAD = 0.25  # a sample's spread until there are enough to measure it
SPREAD_AFTER = 3  # warm samples needed to measure their spread
MODEL_FLOOR = 0.15  # a model's error as a prior never below 15 %
OUTLIER_RATIO = 3.0  # a warm sample this many times the others' median is set aside (as the fit's outliers)
OVERLAP = 2.0  # a band: this many standard errors either side
EXPLORE_AT_MOST = 3  # calls per problem that may run a contender other than the leader
# A sample of a shorter run repeats it until the repeats add up to this (see short_run_sample): long enough
# that the clock path (perf_counter and run_once's Python, a few microseconds) is under a tenth of it, and
# short enough that the repeats add less than a third of core.solve's own steady-state overhead (~0.1 ms on
# the VM) to a call: at 2 ms the repeats made a 25-microsecond linreg loop 49x its best implementation's.
SHORT_RUN = 3e-5
SHORT_RUN_REPEATS = 25
EXTRAPOLATED_ERROR = 0.5  # an extrapolated prediction's relative error (the plan's, core.costmodel.plan)
EXPLORE_HORIZON = 10  # calls after a trial over which its expected gain is counted (a longer loop re-checks anyway)
PAYBACK_FLOOR = 3  # ... and never more calls than the problem has run so far, nor fewer than this
# The share of a model's miss on a problem that another backend's model shares (in log time): the slope of one
# backend's log(measured / predicted) on another's, over the same problems, in 449 evaluations on record (5,731
# problems in docs/results, both machines, every solver): 0.35 across backends, 0.73 within one (rule 6 scales those
# fully).
# A miss past OUTLIER_RATIO is the implementation's own (a drift, a slow spell): the others' median share there
# was 1.1-1.2x, within their own bands
CROSS_SHARE = 0.35


@dataclass(frozen=True)
class Band:
    """An estimate of seconds per call, with the range the truth plausibly lies in."""

    centre: float
    low: float
    high: float
    samples: int  # warm samples behind it; 0: the model's guess alone

    def scaled(self, factor: float) -> Band:
        """The same estimate in other conditions: every bound times ``factor``."""
        return Band(self.centre * factor, self.low * factor, self.high * factor, self.samples)


@dataclass
class Race:
    """What the loop has seen of one problem: warm and cold samples per implementation, calls, explorations."""

    warm: dict[str, list[float]] = field(default_factory=dict)
    cold: dict[str, list[float]] = field(default_factory=dict)
    calls: int = 0
    explored: int = 0
    leader: str | None = None  # what the last call that did not explore ran: the incumbent
    settled: Settled | None = None  # what a settled call decided, reused while it holds (settled_step)

    def add(self, implementation: str, seconds: float, cold: bool) -> None:
        kept = (self.cold if cold else self.warm).setdefault(implementation, [])
        kept.append(float(seconds))
        del kept[:-WINDOW]


@dataclass(frozen=True)
class Settled:
    """A step that later calls reuse without planning again, while nothing it depended on changed.

    ``key`` is what the step depended on besides the runs (the problem's
    numeric fields, the models' epoch, the expected calls); ``ceiling`` the
    lowest estimate of any other contender then; ``at`` the call it was
    taken on; ``plan`` the plan it came from (any object: the caller's);
    ``unlearnt`` whether it was taken only because the loop had learnt
    nothing yet (:func:`learnt_nothing`); ``estimate`` the leader's own
    estimate then (its model's, for an unlearnt step); ``kin`` the lowest
    estimate then of its siblings known only by their models (its backend's
    other implementations, which follow the leader's runs:
    :func:`in_the_loops_conditions`), which ``ceiling`` leaves out.
    """

    key: tuple
    step: Step
    ceiling: float
    at: int
    plan: object
    unlearnt: bool = False  # taken because the loop had learnt nothing (learnt_nothing): see confirmed_by_its_runs
    estimate: float = math.inf
    kin: float = math.inf
    error: float = 0.0  # the leader's relative error then (its model's, for an unlearnt step)
    # an unlearnt step's view as the full step takes it (confirmed_by_its_runs): every contender's band then, its
    # model alone, and its backend (None: only the lowest estimates above are known, and the stricter test holds)
    bands: Mapping[str, Band] | None = None
    models: Mapping[str, float | None] | None = None
    families: Mapping[str, str] | None = None


REPLAN_EVERY = 16  # a settled loop plans in full at least this often (and on calls 2, 4, 8, ...)


def settles(step: Step, race: Race) -> bool:
    """Whether a step just run can be reused: it ran the leader (no trial), and the leader has enough warm runs
    that a contested call no longer repeats a short run for its sample. Between trials, only the leader's
    estimate moving past another's changes what a call runs, which :func:`settled_step` watches for."""
    return not step.explore and len(race.warm.get(step.implementation, [])) >= SPREAD_AFTER


def learnt_nothing(step: Step, race: Race) -> bool:
    """Whether a step just run can be reused because the loop still has no warm run of anything.

    A first call's run is never a warm sample (it touches the problem's
    pages first), nor is a cold one: after it the full step would decide
    from exactly what it had (the models), and choose the same. So the
    second call of a new problem reuses the first call's step, where
    planning it again cost 40-55 us more than a call naming the backend on
    the VM (a third of a 25 us HJB solve's loop). The caller checks what
    else the step depended on (:func:`settled_step`'s ``key``, and that no
    one-off the plan weighed has been paid since).
    """
    return not step.explore and not any(race.warm.values())


def confirmed_by_its_runs(settled: Settled, race: Race, call: int) -> bool:
    """Whether a step taken when the loop had learnt nothing (:func:`learnt_nothing`) still stands.

    While there is no warm run of anything, no trial can start and no
    estimate has moved, whichever call this is. Once the leader alone has
    warm runs, off the exploring calls (2, 4, 8, ...) and before any trial,
    the full step runs it again as long as its estimate (its model and its
    runs, :func:`estimate`) lies under every other contender's band, none
    of which can be tried (:func:`keeps_the_incumbent`): the others' are
    unchanged (no run of theirs, same models). Its siblings' estimates
    follow its runs (:func:`in_the_loops_conditions`), so theirs are taken
    scaled as the full step would scale them. A third call of a new HJB
    problem planned in full cost 50-60 us more than a call naming numba on
    the VM, against a 35-40 us kernel. A step recorded without its bands
    is held to the stricter test of the lowest estimates: the leader's
    estimate under every other's by more than the clock's jitter.
    """
    ran = [key for key, runs in race.warm.items() if runs]
    if not ran:
        return True
    leader = settled.step.implementation
    if ran != [leader] or race.explored or exploring_call(call):
        return False
    runs = race.warm[leader]
    if not 0 < settled.estimate < math.inf:
        return False
    own = estimate((settled.estimate, settled.error), runs)
    if settled.bands is not None and settled.models is not None and settled.families is not None:
        return keeps_the_incumbent(own, settled.bands, settled.models, settled.families, race, leader, settled.error)
    conditions = statistics.median(runs) / settled.estimate
    bound = min(settled.ceiling, settled.kin * conditions) / (1 + MIN_SPREAD)
    return own.centre < bound


def keeps_the_incumbent(own: Band, bands: Mapping[str, Band], models: Mapping[str, float | None],
                        families: Mapping[str, str], race: Race, incumbent: str, model_error: float = 0.0) -> bool:
    """Whether :func:`next_step`, off the exploring calls, runs ``incumbent`` again when only it has warm runs.

    ``own`` is its estimate from its model and those runs; ``bands`` every
    contender's model band as the step that chose it weighed them. The others
    have no runs, so next_step's lowest estimate is either the incumbent or a
    contender known only by its model, and such a contender takes the lead
    only when the incumbent's estimate lies above its whole band (rule 3;
    its siblings in the conditions the incumbent's runs met, rule 6). Nor is
    one tried (:func:`challenged`) unless it lies below the incumbent's band
    and its model extrapolates or the incumbent's own model (``model_error``
    its error) missed. Whichever implementation a full plan would
    name its pick, the step then stands: planning in full only to run the
    same implementation cost a linreg loop's third call 65 us over a call
    naming it on the VM, on a 60 us kernel (its numba variants' models tie).
    """
    # in_the_loops_conditions for this case, inline (a third call asks it; the dicts it builds cost 10 us on the VM):
    # only the incumbent has runs, so its siblings' bands are scaled by them (conditions_factor), other backends'
    # by the part of a miss they share (shared_part)
    runs, model = race.warm.get(incumbent), models.get(incumbent)
    factor = conditions_factor(runs, model, own.centre) if runs and model and model > 0 else 1.0
    family, others = families[incumbent], shared_part(factor)
    missed = model_missed((model, model_error), runs or []) if model else False
    for key, band in bands.items():
        if key == incumbent:
            continue
        scale = 1.0 if band.samples else factor if families[key] == family else others
        if not band.high * scale > own.centre:
            return False
        if band.centre * scale < own.low and (missed or relative_error(band) >= EXTRAPOLATED_ERROR):
            return False
    return True


def settled_step(race: Race, key: tuple) -> Settled | None:
    """The settled step this call may reuse, or None when it must plan in full.

    A step taken when the race had learnt nothing (no warm run of anything:
    :func:`learnt_nothing`) is reused while ``key`` holds and its leader's
    runs since confirm it (:func:`confirmed_by_its_runs`). A
    settled race reuses its last full step while everything it depended
    on is unchanged (``key``), no call may explore (calls 2, 4, 8, ... plan
    in full, and every :data:`REPLAN_EVERY`-th call), and the leader's
    latest warm run lies below every other contender's estimate then. The
    leader's estimate is a weighted mean of its runs and its model, so
    while its runs stay under that ceiling it stays the lowest estimate and
    the full step would run it again: planning in full on every call cost
    most of a steady-state solve's overhead (70 % of 0.55 ms on the H200
    host, against 2.3 ms in the kernel).
    """
    settled = race.settled
    if settled is None or settled.key != key or race.leader != settled.step.implementation:
        return None
    call = race.calls + 1
    if settled.unlearnt:
        return settled if confirmed_by_its_runs(settled, race, call) else None
    if exploring_call(call) or call - settled.at >= REPLAN_EVERY:
        return None
    runs = race.warm.get(settled.step.implementation)
    return settled if runs and runs[-1] <= min(settled.ceiling, settled.kin) else None


def short_run_sample(run: Callable[[], float]) -> float:
    """The median of repeats of a short run (each returns its seconds) until they add up to SHORT_RUN."""
    times: list[float] = []
    while sum(times) < SHORT_RUN and len(times) < SHORT_RUN_REPEATS:
        times.append(run())
    return statistics.median(times)


def sample_spread(samples: list[float]) -> float:
    """The relative spread of one warm sample: measured from the samples once there are enough."""
    if len(samples) < SPREAD_AFTER or min(samples) <= 0:
        return SAMPLE_SPREAD
    logs = [math.log(s) for s in samples]
    mean = sum(logs) / len(logs)
    # in floats: statistics.stdev's exact fractions cost a steady-state solve tens of microseconds
    return max(MIN_SPREAD, math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)))


def without_slow_outliers(samples: list[float]) -> list[float]:
    """The samples less those over :data:`OUTLIER_RATIO` times the median of the others.

    A first run on a new problem can pay what no one-off names (numba
    compiling for new argument types, a CUDA graph captured for a new shape:
    12x and 1,400x the warm time on the H200 host); one slow spell is no
    estimate either. A drift that lasts is kept: it becomes the median.
    """
    if len(samples) < 2:
        return samples
    return [s for i, s in enumerate(samples)
            if s <= OUTLIER_RATIO * statistics.median(samples[:i] + samples[i + 1:])]


def outlier_reach(error: float) -> float:
    """How far over its model's prediction a lone run must be to wait for a second: OUTLIER_RATIO beyond the band."""
    return OUTLIER_RATIO * lone_reach(error)


def lone_reach(error: float) -> float:
    """How far over its model's prediction a lone run may lie and still count: the top of the model's band."""
    return math.exp(OVERLAP * max(MODEL_FLOOR, error))


def unconfirmed(model: tuple[float, float] | None, samples: list[float]) -> bool:
    """Whether the warm samples are one run above its model's band, which :func:`estimate` sets aside."""
    return model is not None and len(samples) == 1 and samples[0] > model[0] * lone_reach(model[1])


def worth_confirming(model: tuple[float, float] | None, samples: list[float],
                     others: Mapping[str, Band]) -> bool:
    """Whether a lone run above its model's band is run again within the same call.

    Set aside, it waits for the next call to confirm it, and that call runs
    the same slow implementation again: on the H200 host a spectra fit's
    torch ran 65 ms against its model's 36 ms, and the loop kept it for its
    third call (27 % regret). Confirmed in the call that met it, the next
    call runs the best estimate. It costs one run, as the next call would
    have, and only where the run decides something: were the next run to
    agree, another contender would take the next call (:func:`takes_the_lead`).
    Where none would, the next call runs the leader again anyway, and its
    run is the confirmation. Asked only whether another estimate lay below
    the run, the VM's random-walk loops ran numba a fourth time in three
    calls and took 1.39x the calls naming it: a 2.06 ms run against its
    1.25 ms model, confirmed, would have put numba at 1.95 ms, inside
    numpy's band (its model 1.68 ms, to 49 %: up to 4.4 ms) and the pool's.
    """
    if not unconfirmed(model, samples):
        return False
    confirmed = estimate(model, [samples[0], samples[0]])  # the leader's estimate, were the next run to agree
    return any(takes_the_lead(band, confirmed) for band in others.values())


def takes_the_lead(band: Band, leader: Band) -> bool:
    """Whether a contender estimated at ``band`` takes the next call from a leader estimated at ``leader``
    (:func:`next_step`): one with runs of its own by a lower estimate; one known only by its model when the
    leader lies above its whole band (rule 3), or lies wholly above it, its model in doubt (a challenge)."""
    if band.samples:
        return band.centre < leader.centre
    return band.high < leader.centre or band.centre < leader.low


def estimate(model: tuple[float, float] | None, samples: list[float]) -> Band:
    """The precision-weighted mean, in log time, of a model's (cost, error) and warm samples."""
    # memoised: each call of core.solve estimates every contender, and only the one that ran has a new sample
    return _estimate(None if model is None else (float(model[0]), float(model[1])), tuple(samples))


@functools.lru_cache(maxsize=1024)
def _estimate(model: tuple[float, float] | None, samples: tuple[float, ...]) -> Band:
    weights, terms = 0.0, 0.0
    positive = without_slow_outliers([float(s) for s in samples if s > 0])
    if unconfirmed(model, positive):
        # a lone run above its model's band: run it again before trusting it. A second call that
        # replayed a CUDA graph for the first time, or met a busy spell, took 2-4x: trusted at once, it
        # moved the loop off the fastest implementation on its third call (linreg, FP on the H200 host)
        positive = []
    if model is not None and len(positive) >= 2 and not (
            model[0] / outlier_reach(model[1]) <= statistics.median(positive) <= model[0] * outlier_reach(model[1])):
        model = None  # runs that agree with each other and not with the model: the model missed here
    if model is not None and model[0] > 0:
        error = max(MODEL_FLOOR, model[1])
        if len(positive) >= 2 and (miss := abs(math.log(statistics.median(positive) / model[0]))) > OVERLAP * error:
            # runs that agree beyond the model's band: here the model is off by at least that much, and
            # at its own error it would outweigh three runs (a spectra fit's torch model said 36 ms, its
            # runs 65 ms, and the loop kept it as faster than a 51 ms numba:threads)
            error = miss
        weight = 1.0 / error ** 2
        weights, terms = weight, weight * math.log(model[0])
    if positive:
        weight = 1.0 / sample_spread(positive) ** 2
        weights += weight * len(positive)
        terms += weight * sum(math.log(s) for s in positive)
    if weights == 0:
        return Band(math.inf, 0.0, math.inf, 0)
    centre, error = terms / weights, 1.0 / math.sqrt(weights)
    return Band(math.exp(centre), math.exp(centre - OVERLAP * error), math.exp(centre + OVERLAP * error),
                len(positive))


def bands(guesses: Mapping[str, tuple[float, float]], race: Race) -> dict[str, Band]:
    """Each contender's estimate from its model's (cost, error) and its warm samples here."""
    return {key: estimate(guess, race.warm.get(key, [])) for key, guess in guesses.items()}


def in_the_loops_conditions(estimated: Mapping[str, Band], models: Mapping[str, float | None], race: Race,
                            family: Callable[[str], str]) -> dict[str, Band]:
    """The incumbent's siblings known only by their models, scaled to this loop's conditions.

    A family is the implementations of one backend (``numba:fused`` and
    ``numba:steps``). The incumbent's median warm run here over its model's
    prediction is how this loop runs it against the calibration (a new
    problem's cold caches, the calls between runs); a sibling known only by
    its model would run in the same conditions, so its band is scaled by
    that factor. Unscaled, a leader that ran 1.3-1.5x its model on the VM
    (FP, linreg: so did every variant there) looked slower than a sibling's
    bare model: the loop ran it again to confirm, moved to the sibling on
    call 3, and ran that again too, at 1.8-2.1x the total of calls naming
    the best. Only the incumbent's runs say it (what the calls that did not
    explore ran, lone runs set aside by :func:`estimate` included): a
    trial's run is of one contender, and a trial of linreg's numba:threads
    on the VM that met a hiccup (3.6x its model) would have scaled the
    plan's pick out of the race. Other backends share fewer of the
    conditions (a GPU's run against the CPU's) and of the models' misses:
    scaled by the part that evaluations measured them to share
    (:func:`shared_part`), and only by a miss upwards.

    Before the incumbent has a warm run, a trial of its sibling that ran
    *under* its model scales the family (the incumbent too) down to it: a
    hiccup slows a run, it never speeds one, so a run that fast is the
    conditions, not luck. Unscaled, DotGAT's torch_cpu:naive tried at 0.79x
    its model on the VM took the lead from torch_cpu:optimized, whose model
    over-predicted it as much, for a 21-30 % regret on the third call.

    An incumbent's runs under its model scale its siblings no further than
    its own estimate went (:func:`conditions_factor`).
    """
    incumbent = race.leader
    if incumbent is None:
        return dict(estimated)
    runs = race.warm.get(incumbent)
    model = models.get(incumbent)
    if runs and model and model > 0:
        own = estimated.get(incumbent)
        factor, unscaled = conditions_factor(runs, model, own.centre if own is not None else None), incumbent
    else:
        factor, unscaled = _faster_trial(incumbent, models, race, family), None
        if factor is None:
            return dict(estimated)
    scaled = dict(estimated)
    others = shared_part(factor) if unscaled is not None else 1.0  # a sibling's trial speaks for its family only
    for key, band in estimated.items():
        if key == unscaled or band.samples:
            continue  # a band with samples of its own has met this loop's conditions itself
        kin = family(key) == family(incumbent)
        if kin or others != 1.0:
            scaled[key] = band.scaled(factor if kin else others)  # a band known only by its model
    return scaled


def shared_part(factor: float) -> float:
    """What of the incumbent's runs over its model another backend's model is taken to share: CROSS_SHARE of
    the miss in log time, and only of a miss over the model.

    Taken as their models say, other backends looked faster than an
    incumbent whose runs lay 2-2.5x over its model where every model missed
    alike: a spectra fit of 2 spectra and 608 pixels ran numba:threads at
    2.3x its model on the H200 host, and torch:graph, modelled 1.5x slower,
    took the third call by rule 3 (35 % regret; on the VM the process
    backend was tried there, 79 %). A miss past :data:`OUTLIER_RATIO` is
    the incumbent's own (a drift, a slow spell), as :func:`estimate` sets
    its model aside there. A run under its model says the
    incumbent does better than expected, which makes no contender a
    better bet.
    """
    return factor ** CROSS_SHARE if 1.0 < factor <= OUTLIER_RATIO else 1.0


def conditions_factor(runs: Sequence[float], model: float, own: float | None = None) -> float:
    """How the incumbent's runs here scale its siblings known only by their models: its median run over its
    model, but never under its own estimate ``own`` (its model and runs together, :func:`estimate`).

    A run under the model moves the incumbent's estimate only part of the
    way (the model weighs in), and a sibling scaled all the way then lay
    under it with an equal model: on the VM linreg's ``numba:serial`` and
    ``numba:threads`` (one thread there at small sizes) were both modelled
    and timed at 97 us, the leader's one warm run counted as 83, its
    estimate 93, the sibling's 83, and third calls moved to the sibling,
    planning in full for it (1.29x the calls naming the best). Scaled as
    far as the incumbent's own estimate, an equal model stays equal and
    the incumbent keeps the lead. Runs over the model still scale fully: a
    slow spell slows the whole family.
    """
    return max(statistics.median(runs), own or 0.0) / model


def _faster_trial(incumbent: str, models: Mapping[str, float | None], race: Race,
                  family: Callable[[str], str]) -> float | None:
    """The lowest median over its model of the incumbent's siblings tried here, where under 1 (else None)."""
    ratios = [statistics.median(runs) / models[key] for key, runs in race.warm.items()
              if runs and key != incumbent and family(key) == family(incumbent) and (models.get(key) or 0) > 0]
    lowest = min(ratios, default=None)
    return lowest if lowest is not None and lowest < 1 else None


def relative_error(band: Band) -> float:
    """The band's standard error as a relative error (its half-width in log time over OVERLAP)."""
    return math.log(band.high / band.centre) / OVERLAP if band.centre > 0 else math.inf


def band_of(seconds: float, error: float, samples: int) -> Band:
    """A band around ``seconds`` of ``OVERLAP`` relative errors either side (a Prediction's, as a Band)."""
    reach = OVERLAP * max(error, MIN_SPREAD)
    return Band(seconds, seconds * math.exp(-reach), seconds * math.exp(reach), samples)


@dataclass(frozen=True)
class Step:
    """What one call runs, and why."""

    implementation: str
    explore: bool
    reason: str
    dropped: tuple[str, ...] = ()
    contested: bool = False  # another contender could still be faster: this run's sample matters


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def expected_gain(candidate: Band, leader: Band) -> float:
    """Seconds per call a switch to ``candidate`` is expected to save: E[max(0, t_leader - T)].

    ``T`` is log-normal with the candidate's estimate and standard error;
    the leader's estimate is taken as known (it has the more runs).
    """
    sigma = relative_error(candidate)
    if not math.isfinite(sigma) or sigma <= 0:
        return max(0.0, leader.centre - candidate.centre)
    d = (math.log(leader.centre) - math.log(candidate.centre)) / sigma
    return leader.centre * _phi(d) - candidate.centre * math.exp(sigma**2 / 2) * _phi(d - sigma)


def payback_calls(calls_left: float, calls_run: int) -> float:
    """The calls after a trial over which it must pay for itself.

    At most :data:`EXPLORE_HORIZON`, at most the calls still expected, and
    at most as many as the problem has run so far (but :data:`PAYBACK_FLOOR`
    at least): a loop of three calls cannot recover a trial priced over ten,
    while one that has run a hundred calls will likely run ten more. With
    trials on calls 2, 4, 8, ... this is the doubling trick of online
    learning: each trial risks no more than the calls already run.
    """
    return min(calls_left - 1, EXPLORE_HORIZON, max(PAYBACK_FLOOR, calls_run))


def worth_trying(candidate: Band, leader: Band, horizon: float, owed: float = 0.0) -> bool:
    """Whether one call on ``candidate`` is expected to pay: its expected gain over ``horizon`` calls after it
    (:func:`payback_calls`) against what the call costs over the leader's.

    ``owed`` is the part of the candidate's unpaid one-off that its estimate
    does not carry (the estimate spreads it over the expected calls; the
    trial pays it whole). A trial's risk is bounded by the calls already
    run, one-off included: at ``expected_calls=inf`` a third call on the
    VM tried the process pool for a spectra fit estimated at 31 ms against
    numba's 41 ms and paid the pool's first map of the solver, 0.65 s.
    """
    cost = candidate.centre + owed - leader.centre
    return horizon > 0 and expected_gain(candidate, leader) * horizon > max(0.0, cost)


def exploring_call(call: int) -> bool:
    """Calls 2, 4, 8, 16, ... of a problem may explore: trials early, then ever rarer, and the call after a
    trial always runs the best estimate."""
    return call >= 2 and call & (call - 1) == 0


def model_missed(model: tuple[float, float] | None, samples: list[float]) -> bool:
    """Whether two or more warm runs that agree put an implementation above its model's whole band.

    The band is the model's prediction and ``OVERLAP`` of its error (at
    least :data:`MODEL_FLOOR`); the runs are in the models' terms (each over
    the process's loop factor, :meth:`~core.costmodel.planner.Planner.observe`),
    so the loop's own conditions are already taken out: what is left is the
    model's miss on this problem.
    """
    if model is None or not model[0] > 0:
        return False
    positive = without_slow_outliers([float(s) for s in samples if s > 0])
    return len(positive) >= 2 and min(positive) > model[0] * math.exp(OVERLAP * max(MODEL_FLOOR, model[1]))


def challenged(challenger: str | None, incumbent: Band, finite: Mapping[str, Band], race: Race,
               missed: bool = False) -> bool:
    """Whether call 3 tries the contender that the incumbent rule kept from the lead, off the 2, 4, 8 schedule.

    Call 2 tries what the models alone make worth it (:func:`first_trial`),
    before any run of the leader's could put its model in doubt. When the contender's
    model extrapolates (its error is :data:`EXTRAPOLATED_ERROR`: off the
    calibrated region it may miss by more than any in-range error says)
    and the leader's first warm run (call 2) put its estimate so far above
    its model that the contender's model lies below the leader's whole
    band, the models' pick is in doubt, and waiting for call 4 keeps a
    slower implementation for the third call: an FP problem past the
    calibrated top on the H200 host (N=49,043) ran numba:fused at 1.6x its
    model, 41 % over torch:fused, on all three calls. In range, a leader
    slower than its model is more often the loop's conditions (a busy
    spell slows every implementation alike), and trying a contender then
    cost the third call 12-27 % (FP on the H200 host, DotGAT on the VM).

    So does one whose own model ``missed`` (:func:`model_missed`: its runs,
    confirmed and in the models' terms, lie above its model's whole band).
    The loop's conditions are taken out of those runs, so the model of the
    models' pick is what is in doubt, and the contender's, below the
    incumbent's whole band, stands. On the VM a spectra fit of 16 spectra
    ran the process pool at 45 ms on calls 2 and 3 against its model's 24,
    and kept it over numba:threads (modelled at 28 ms, 37 ms back to back),
    for 24 % regret.
    """
    return (challenger is not None and race.calls + 1 == 3 and race.explored == 0
            and (missed or relative_error(finite[challenger]) >= EXTRAPOLATED_ERROR)
            and finite[challenger].centre < incumbent.low)


def first_trial(finite: Mapping[str, Band], race: Race, first: str, calls_left: float,
                owed: Mapping[str, float], replanning: float = 0.0) -> str | None:
    """The contender call 2 tries, before anything has run warm on the problem, if one is worth it.

    Call 1 ran the plan's pick, and its run is no warm sample (it touched
    the problem first), so a trial on call 2 is weighed against the pick's
    model, as rule 5 weighs one against the leader's estimate. Its run is
    warm, so call 3 runs whichever estimate is lower: the tried contender's
    run or the pick's model. Waiting for call 4 kept a pick its models put
    within their error of a faster contender for the third call: on the
    H200 host numba:threads fitted 16 spectra in 40 ms where torch took 28
    (39 % regret), and the process backend solved a common-noise problem in
    7.1 ms where numba took 5.5 (30 %). A contender with an unpaid one-off
    is not tried here: its run would be cold and teach nothing. A first
    run under the pick's model bounds it (:func:`bounded_by_its_first_run`). The trial
    also costs two full plans (``replanning`` each: this call's and the
    next's), which a loop that tries nothing skips (:func:`confirmed_by_its_runs`):
    on the VM, trials between linreg's numba variants tied at 30 us by
    their models made calls 2 and 3 plan in full, at 0.1-0.2 ms each.
    """
    if race.calls < 1 or not exploring_call(race.calls + 1) or race.explored >= EXPLORE_AT_MOST or first not in finite:
        return None
    top = finite[first]  # capped by its first run already (next_step: bounded_by_its_first_run)
    horizon = payback_calls(calls_left, race.calls)
    worth = [key for key in finite if key != first and not owed.get(key)
             and worth_trying(finite[key], top, horizon, 2 * replanning)]
    return max(worth, key=lambda key: expected_gain(finite[key], top), default=None)


def bounded_by_its_first_run(band: Band, cold: list[float] | None) -> Band:
    """An estimate with no warm run behind it, capped by its fastest cold run where that ran under it.

    A cold run (a first call, one that paid a one-off) is no warm sample:
    it pays what later ones do not (the problem's first touch, a one-off),
    never less. So a cold run under a model bounds the warm time, as a
    trial under its model scales its family (:func:`in_the_loops_conditions`):
    on the VM a linreg fit's numba:threads, modelled at 32 ms at the top of
    the quick space, ran its first call in 20.5 ms, and call 2 tried
    numba:serial (modelled and measured at 39 ms) against the model: 1.31x
    the calls naming the best. Call 3 weighs it too (:func:`next_step`): a
    random walk's numba, modelled at 43.8 ms, ran its first call in 38.4;
    call 2 tried the pool (modelled at 40.4 ms, a run at 40), and call 3
    kept the pool over numba's bare model, 20 % slower than numba (the VM).
    """
    if not cold or not 0 < min(cold) < band.centre:
        return band
    return band.scaled(min(cold) / band.centre)


def next_step(estimated: Mapping[str, Band], race: Race, first: str, calls_left: float,
              owed: Mapping[str, float] | None = None, replanning: float = 0.0,
              missed: Collection[str] = ()) -> Step:
    """The implementation this call runs.

    ``estimated`` maps each contender to its :func:`estimate` (one-offs
    still owed spread over the expected calls), which a cold run under it
    caps where there is no warm one (:func:`bounded_by_its_first_run`); ``first`` is the plan's
    pick, which wins ties and runs when nothing can be estimated;
    ``calls_left`` is how many calls of this problem are still expected,
    this one included; ``owed`` each contender's unpaid one-off that its
    estimate does not carry (:func:`worth_trying`); ``replanning`` what one
    full plan costs: a trial makes the next call plan in full, where a
    settled loop reuses its step (:func:`settled_step`).
    """
    finite = {key: band if band.samples else bounded_by_its_first_run(band, race.cold.get(key))
              for key, band in estimated.items() if math.isfinite(band.centre) and band.centre > 0}
    if not any(band.samples for band in finite.values()):  # the models alone: their pick, margin and all
        contested = first in finite and any(band.low < finite[first].centre
                                            for key, band in finite.items() if key != first)
        tried = first_trial(finite, race, first, calls_left, owed or {}, replanning) if contested else None
        if tried is not None:
            return Step(tried, True, f"trying {tried} (its model: {finite[tried].centre:.3g} s) against {first} "
                                     f"({finite[first].centre:.3g} s, its model: its first call is no warm run)",
                        contested=True)
        return Step(first, False, f"{first}: the plan's pick, not yet run warm on this problem",
                    contested=contested)
    leader = min(finite, key=lambda key: finite[key].centre)
    if first in finite and finite[first].centre <= finite[leader].centre * (1 + MIN_SPREAD):
        leader = first  # within the clock's jitter, the plan's pick (the simpler) keeps the lead
    incumbent = race.leader if race.leader in finite else first
    challenger = None
    if incumbent in finite and leader != incumbent and finite[leader].samples == 0 \
            and finite[leader].high >= finite[incumbent].centre:
        # a contender known only by its model takes the lead only when the incumbent's estimate lies
        # above its model's whole band: the incumbent's runs carry the loop's own conditions (its
        # wall-clock path, a busy spell) that the calibrated models do not, and one such run made the
        # H200 host's FP and random-walk loops leave the fastest implementation on their third call
        leader, challenger = incumbent, leader
    top = finite[leader]
    dropped = tuple(sorted(key for key in finite if finite[key].low > top.high))
    horizon = payback_calls(calls_left, race.calls)
    worth = sorted((key for key in finite if key != leader and key not in dropped
                    and finite[key].samples < top.samples
                    and worth_trying(finite[key], top, horizon, (owed or {}).get(key, 0.0) + replanning)),
                   key=lambda key: -expected_gain(finite[key], top))
    contested = any(finite[key].low < top.centre for key in finite if key != leader and key not in dropped)
    if exploring_call(race.calls + 1):
        key = worth[0] if worth else None
    else:  # off the schedule, only the challenger itself: the one whose model the leader's run put in doubt
        key = challenger if challenger in worth and challenged(challenger, top, finite, race, leader in missed) \
            else None
    if key is not None and race.explored < EXPLORE_AT_MOST:
        return Step(key, True, f"trying {key} (estimated {finite[key].centre:.3g} s over "
                               f"{finite[key].samples} warm run(s)) against {leader} ({top.centre:.3g} s)", dropped,
                    contested=True)
    why = f"{leader}: fastest estimate on this problem, {top.centre:.3g} s ({top.samples} warm run(s) and its model)"
    if dropped:
        why += f"; slower by the data: {', '.join(dropped)}"
    return Step(leader, False, why, dropped, contested=contested)
