"""The online loop's rule: which implementation one call of ``core.solve`` runs on a problem it has seen.

Choosing among implementations over repeated calls is a race (a bandit
with a known horizon), so every call both answers the user and informs the
next. This module is pure arithmetic on what the loop has seen of one
problem; the :class:`~core.costmodel.planner.Planner` keeps that state.

The rule, pinned by ``tests/test_online_loop.py`` and stated in
``docs/costmodel.md``:

1. **Warm samples only.** A call that owed a one-off (a compile for this
   shape, a cache to fill: what calibration measured as a first run's
   excess) is kept apart as *cold* and never compared with warm samples.
   Each implementation keeps its last :data:`WINDOW` warm samples; its
   estimate is their median.
2. **Spread from the samples.** The band of an estimate is the median
   plus or minus half the samples' range (at least :data:`MIN_SPREAD`);
   a single sample says nothing of its spread, so it gets
   :data:`ONE_SAMPLE_SPREAD`. An implementation never run warm here is
   banded by its model: cost plus or minus ``OVERLAP`` model errors.
3. **The leader** is the lowest estimate among the warm-sampled ones (the
   model's pick until something has run warm). Every call that runs the
   leader adds a sample, so a leader that drifts up loses the lead to the
   next estimate, which then runs and is re-checked.
4. **Dropped when the data say so.** A contender is out of the race while
   its band's lower end lies above the leader's upper end.
5. **Exploring** runs a contender that has not run warm here and whose
   band reaches below the leader's estimate (it could be faster),
   cheapest guess first, in place of the leader. It happens only
   while at least two more calls of this problem are expected (one to try,
   one to profit), and at most :data:`EXPLORE_AT_MOST` times per problem.
   A contender whose run came out cold is tried again, so a cold first
   call is never its only evidence.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

WINDOW = 9  # warm samples kept per implementation and problem: recent enough to follow a drift
MIN_SPREAD = 0.02  # a band never narrower than +-2 %: the clock and the scheduler's jitter
ONE_SAMPLE_SPREAD = 0.25  # a single sample's band: its spread is unknown
OVERLAP = 2.0  # a model's band: this many relative errors either side (as the plan's "close" set)
EXPLORE_AT_MOST = 3  # calls per problem that may run a contender other than the leader


@dataclass(frozen=True)
class Band:
    """An estimate of seconds per call, with the range the truth plausibly lies in."""

    centre: float
    low: float
    high: float
    samples: int  # warm samples behind it; 0: the model's guess


@dataclass
class Race:
    """What the loop has seen of one problem: warm and cold samples per implementation, calls, explorations."""

    warm: dict[str, list[float]] = field(default_factory=dict)
    cold: dict[str, list[float]] = field(default_factory=dict)
    calls: int = 0
    explored: int = 0

    def add(self, implementation: str, seconds: float, cold: bool) -> None:
        kept = (self.cold if cold else self.warm).setdefault(implementation, [])
        kept.append(float(seconds))
        del kept[:-WINDOW]


def sample_band(samples: list[float]) -> Band:
    """The band of warm samples: median +- half their range (one sample: +-ONE_SAMPLE_SPREAD)."""
    centre = statistics.median(samples)
    if len(samples) == 1:
        spread = ONE_SAMPLE_SPREAD
    else:
        spread = max(MIN_SPREAD, (max(samples) - min(samples)) / (2 * centre)) if centre > 0 else MIN_SPREAD
    return Band(centre, centre * (1 - spread), centre * (1 + spread), len(samples))


def model_band(cost: float, error: float) -> Band:
    """The band of a model's prediction: cost +- OVERLAP relative errors."""
    reach = OVERLAP * max(error, MIN_SPREAD)
    return Band(cost, cost * max(0.0, 1 - reach), cost * (1 + reach), 0)


def bands(guesses: Mapping[str, tuple[float, float]], race: Race) -> dict[str, Band]:
    """Each contender's band: from its warm samples here, else from its model's (cost, error)."""
    return {key: sample_band(race.warm[key]) if race.warm.get(key) else model_band(*guess)
            for key, guess in guesses.items()}


@dataclass(frozen=True)
class Step:
    """What one call runs, and why."""

    implementation: str
    explore: bool
    reason: str
    dropped: tuple[str, ...] = ()


def next_step(guesses: Mapping[str, tuple[float, float]], race: Race, first: str, calls_left: float) -> Step:
    """The implementation this call runs.

    ``guesses`` maps each contender to its model's (cost, relative error);
    ``first`` is the plan's pick, run while nothing has run warm here;
    ``calls_left`` is how many calls of this problem are still expected,
    this one included.
    """
    estimated = bands(guesses, race)
    sampled = [key for key in estimated if estimated[key].samples]
    if not sampled:
        return Step(first, False, f"{first}: the plan's pick, not yet run warm on this problem")
    leader = min(sampled, key=lambda key: estimated[key].centre)
    top = estimated[leader]
    dropped = tuple(sorted(key for key in estimated if estimated[key].low > top.high))
    untried = sorted((key for key in estimated
                      if not estimated[key].samples and estimated[key].low < top.centre),
                     key=lambda key: estimated[key].centre)
    if untried and calls_left >= 2 and race.explored < EXPLORE_AT_MOST:
        key = untried[0]
        return Step(key, True, f"trying {key} (predicted {estimated[key].centre:.3g} s, not yet run warm here) "
                               f"against {leader} (measured {top.centre:.3g} s)", dropped)
    why = f"{leader}: fastest measured on this problem, {top.centre:.3g} s over {top.samples} warm run(s)"
    if dropped:
        why += f"; slower by the data: {', '.join(dropped)}"
    return Step(leader, False, why, dropped)
