"""Design of experiments: which problems calibration measures, and which ones evaluation holds out.

A ladder that moves one field identifies at most two coefficients. A model
with four features needs problems that move every field that drives cost,
so the core designs them from the solver's declared :class:`~core.solver.SizeSpace`:

1. an *axis ladder*: the size axis from the bottom of its range to the top,
   every other field at the middle of its range (log scale), so that
   break-even sizes along the axis rest on measured points;
2. *corners*: everything at its smallest and everything at its largest;
3. *space-filling points*: a scrambled Halton sequence on the log scale of
   every range (and uniform over the choices), until there are at least
   three times as many distinct problems as coefficients and their feature matrix
   has full rank (or the space cannot give more);
4. in quick mode, the axis ladder carried on *beyond the top*, at
   :data:`BEYOND_TOP` times it: where users' problems and ``evaluate``'s
   held-out ones go past a quick space that is a sliver of the full one.

Problems are ordered from cheapest to dearest (by their features relative
to the design's largest), so that a backend that stops climbing at the
per-sample cap has measured the cheap end of every direction first.

Held-out problems for ``evaluate`` are seeded random points of the same
space that are not in the design, plus a few beyond the top of its size
axis, where the models extrapolate.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from core.errors import CrossoverError
from core.solver import SizeSpace, SolverSpec, try_problem

AXIS_POINTS = {True: 4, False: 6}
MIN_POINTS = {True: 10, False: 16}
# The cap must leave room for three points per coefficient of the largest model: at 16, spectra.fit's and
# mfg.common_noise's pool models (9 and 10 coefficients) got 1.6-1.8 points each, their leave-one-out error
# was 40-50 %, and on the 2-core VM the models' pick missed by 27-52 % in some runs. The calibration budget,
# not this cap, bounds the time: the design is measured cheapest first and stops where the budget does.
MAX_POINTS = {True: 32, False: 48}
# where the space cannot reach full rank (a feature it never moves), filling on past this helps no model
RANK_SEARCH_POINTS = {True: 16, False: 32}
# three problems per coefficient: with two, ml.linreg's five-coefficient numba:threads model, fitted on 10
# samples of an H100 host, mispredicted held-out problems by up to 2.4x
POINTS_PER_COEFFICIENT = 3
# The quick design's size axis is also measured at these multiples of its top, other fields at their middle.
# The quick space is a sliver of the full one (spectra.fit: 8 of 4,096 spectra) and evaluate holds out problems
# at 2x and 4x its top: there, on the models of the in-space design alone, the 2-core VM's process pool was
# predicted at 26.8 ms for 16 spectra and ran 42.3 (the loop kept it, 23 % over numba:threads), and on the
# H200 host a common-noise problem at K=32 had the pool at 10.2 ms (13.5 measured) against torch:resident's
# 14.4 (10.6), both extrapolated (55 %). Measured cheapest first, they come last: a slow implementation skips
# them at the sample cap, or when its share of the budget is spent.
BEYOND_TOP = (2.0, 4.0)


def _value(spec_default: Any, low: float, high: float, unit: float) -> float:
    """The point ``unit`` in [0, 1] of a log range, rounded like the field's default."""
    value = math.exp(math.log(low) + unit * (math.log(high) - math.log(low)))
    return int(round(value)) if isinstance(spec_default, (int, np.integer)) else value


def _params(spec: SolverSpec, space: SizeSpace, units: Mapping[str, float], picks: Mapping[str, Any]) -> dict:
    default = spec.default_problem()
    params = dict(space.fixed)
    for name, (low, high) in space.ranges.items():
        params[name] = _value(getattr(default, name), low, high, units[name])
    params.update(picks)
    return params


def _middle_picks(spec: SolverSpec, space: SizeSpace) -> dict[str, Any]:
    default = spec.default_problem()
    return {name: getattr(default, name) if getattr(default, name) in values else values[0]
            for name, values in space.choices.items()}


def _halton_params(spec: SolverSpec, space: SizeSpace, count: int, seed: int) -> list[dict]:
    names = list(space.ranges)
    choice_names = list(space.choices)
    from scipy.stats import qmc  # here, not at the top: importing scipy.stats costs the CLI ~0.4 s

    sampler = qmc.Halton(d=len(names) + len(choice_names), scramble=True, seed=seed)
    points = sampler.random(count)
    found = []
    for row in points:
        units = dict(zip(names, row[:len(names)]))
        picks = {name: space.choices[name][min(int(u * len(space.choices[name])), len(space.choices[name]) - 1)]
                 for name, u in zip(choice_names, row[len(names):])}
        found.append(_params(spec, space, units, picks))
    return found


def _key(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def _rank(spec: SolverSpec, problems: list) -> int:
    rows = np.array([[1.0, *spec.features(p).values()] for p in problems], dtype=float)
    if len(rows) == 0:
        return 0
    rows = rows / np.maximum(np.abs(rows).max(axis=0), 1e-300)
    return int(np.linalg.matrix_rank(rows, tol=1e-6))


def _cost_order(spec: SolverSpec, problems: list) -> list:
    """Cheapest first: the sum of each feature relative to its largest value in the design."""
    rows = np.array([list(spec.features(p).values()) for p in problems], dtype=float)
    scale = np.maximum(rows.max(axis=0), 1e-300)
    cost = (rows / scale).sum(axis=1)
    return [problems[i] for i in np.argsort(cost, kind="stable")]


def model_coefficients(spec: SolverSpec) -> int:
    """Coefficients of the solver's largest model: its features, the intercept, a parallel backend's span and an
    implementation's own features."""
    spans = 1 if spec.span_feature is not None and (spec.parallel_tasks is not None or spec.thread_items) else 0
    base = spec.features(spec.default_problem())
    own = max((len(extra(base)) for extra in spec.implementation_features.values()), default=0)
    return len(base) + 1 + spans + own


def calibration_design(spec: SolverSpec, quick: bool = True) -> list:
    """The problems calibration measures: the ladder override, or a design from the size space."""
    if spec.ladder is not None:
        return list(spec.ladder(quick))
    space = spec.space(quick)
    half = {name: 0.5 for name in space.ranges}
    middle = _middle_picks(spec, space)
    candidates = []
    if spec.size_axis in space.ranges:
        for unit in np.linspace(0.0, 1.0, AXIS_POINTS[quick]):
            candidates.append(_params(spec, space, {**half, spec.size_axis: unit}, middle))
    candidates.append(_params(spec, space, dict.fromkeys(space.ranges, 0.0), middle))
    candidates.append(_params(spec, space, dict.fromkeys(space.ranges, 1.0), middle))
    features = len(spec.features(spec.default_problem())) + 1  # the rank the solver's own features can reach
    wanted = min(max(MIN_POINTS[quick], POINTS_PER_COEFFICIENT * model_coefficients(spec)), MAX_POINTS[quick])
    problems, seen = [], set()

    def add(candidates: Iterable[dict]) -> None:
        """Each new, valid problem of ``candidates`` into the design (duplicates and refused points skipped)."""
        for params in candidates:
            key = _key(params)
            if key in seen:
                continue
            seen.add(key)
            problem = try_problem(spec, params)
            if problem is not None:
                problems.append(problem)

    filler = iter(_halton_params(spec, space, 4 * MAX_POINTS[quick], seed=0))
    while True:
        add(candidates)
        if len(problems) >= wanted and _rank(spec, problems) >= features:
            break
        candidates = [params for params in (next(filler, None),) if params is not None]
        if not candidates or len(problems) >= max(wanted, RANK_SEARCH_POINTS[quick]):
            break
    if quick and spec.size_axis in space.ranges:  # on top of the in-space design, not in place of its points
        ladder = _params(spec, space, half, middle)
        add(_past_the_top(spec, space, ladder, factor) for factor in BEYOND_TOP)
    return _cost_order(spec, problems)


def held_out_problems(spec: SolverSpec, quick: bool = True, count: int = 12, beyond: int = 2,
                      seed: int = 2024) -> list:
    """Seeded random problems of the space that calibration never measured, and a few beyond its top."""
    design_keys = {_problem_key(p) for p in calibration_design(spec, quick)}
    if spec.space is None:
        return _beyond_ladder(spec, quick, design_keys)
    space = spec.space(quick)
    rng = np.random.default_rng(seed)
    problems = []
    for _ in range(count * 10):
        if len(problems) >= count:
            break
        units = {name: float(rng.random()) for name in space.ranges}
        picks = {name: values[int(rng.integers(len(values)))] for name, values in space.choices.items()}
        problem = try_problem(spec, _params(spec, space, units, picks))
        if problem is not None and _problem_key(problem) not in design_keys:
            problems.append(problem)
    if spec.size_axis in space.ranges:
        for factor in BEYOND_TOP[:beyond]:
            units = {name: float(rng.random()) for name in space.ranges}
            problem = try_problem(spec, _past_the_top(spec, space, _params(spec, space, units,
                                                                            _middle_picks(spec, space)), factor))
            if problem is not None:
                problems.append(problem)
    return problems


def _past_the_top(spec: SolverSpec, space: SizeSpace, params: dict, factor: float) -> dict:
    """``params`` with the size axis at ``factor`` times the top of its range (rounded like the field)."""
    top = space.ranges[spec.size_axis][1] * factor
    return {**params, spec.size_axis: int(round(top)) if isinstance(params[spec.size_axis], int) else top}


def _problem_key(problem: Any) -> tuple:
    # private attributes are values derived and kept on the problem (by plugins, by the planner), not fields
    return tuple(sorted((k, repr(v)) for k, v in vars(problem).items()
                        if not k.startswith("_") and not isinstance(v, np.ndarray)))


def _beyond_ladder(spec: SolverSpec, quick: bool, design_keys: set) -> list:
    """With a fixed ladder only: its geometric midpoints and 2x and 4x its top, along the size axis."""
    ladder = sorted(spec.ladder(quick), key=lambda p: float(getattr(p, spec.size_axis)))
    sizes = [float(getattr(p, spec.size_axis)) for p in ladder]
    targets = [math.sqrt(a * b) for a, b in itertools.pairwise(sizes)] + [sizes[-1] * 2, sizes[-1] * 4]
    problems = []
    for target in targets:
        nearest = min(ladder, key=lambda p: abs(math.log(float(getattr(p, spec.size_axis)) / target)))
        problem = with_size(spec, nearest, target)
        if problem is not None and _problem_key(problem) not in design_keys:
            problems.append(problem)
    return problems


def with_size(spec: SolverSpec, problem: Any, size: float) -> Any | None:
    """``problem`` with its primary size replaced (None if the size is not allowed)."""
    current = getattr(problem, spec.size_axis)
    value = round(float(size)) if isinstance(current, (int, np.integer)) else float(size)
    try:
        return dataclasses.replace(problem, **{spec.size_axis: value})
    except (CrossoverError, ValueError, TypeError, OverflowError):
        pass
    # arrays sized by the old grid (a preset's V, m0 ...) no longer fit: rebuild without them,
    # so the problem type derives them again at the new size
    scalars = {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)
               if f.init and not isinstance(getattr(problem, f.name), np.ndarray)}
    try:
        return type(problem)(**{**scalars, spec.size_axis: value})
    except (CrossoverError, ValueError, TypeError, OverflowError):
        return None
