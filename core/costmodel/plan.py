"""Auto-selection: predict every backend, rule some out, pick one, explain why.

The decision, in the spirit of scipy's ``choose_conv_method``::

    cost(b) = predicted_seconds(b) + unpaid_one_off(b) / expected_calls
    candidates = available backends whose memory estimate fits and that have a model
    best = min(cost(b) for b in candidates)
    chosen = simplest b with cost(b) <= best * (1 + margin)

The margin exists because a 3 % predicted gain is inside the noise, while the
simpler backend (fewer processes, no device) has fewer ways to go wrong.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from core.costmodel import history as timings
from core.api import find_solver
from core.backend import safe_probe
from core.costmodel.fit import CostModel
from core.errors import AutoSelectionError, CrossoverError
from core.registry import get_registry, get_solver
from core.result import Plan, Prediction
from core.solver import SolverSpec

DEFAULT_MARGIN = 0.05


def choose(costs: Mapping[str, float], simplicity: Mapping[str, int], margin: float = DEFAULT_MARGIN) -> str:
    """The simplest backend whose cost is within ``margin`` of the cheapest."""
    if not costs:
        raise AutoSelectionError("no backend to choose from")
    best = min(costs.values())
    near = [name for name, cost in costs.items() if cost <= best * (1 + margin)]
    return min(near, key=lambda name: (simplicity.get(name, 50), costs[name]))


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def plan(problem: Any, *, solver: str | None = None, expected_calls: float = 1, margin: float = DEFAULT_MARGIN,
         calibrate: bool = False) -> Plan:
    """Decide which backend runs ``problem`` and show the working.

    With ``calibrate=True`` a solver never calibrated on this machine is
    calibrated once (quick mode) first; without it, such a plan raises.
    """
    from core.costmodel.calibrate import ensure_calibrated

    spec = get_solver(solver) if solver is not None else find_solver(problem)
    if calibrate:
        ensure_calibrated(spec)
    if not expected_calls > 0:  # also refuses NaN; inf means one-off costs are ignored
        raise AutoSelectionError(f"expected_calls={expected_calls!r} is invalid: must be > 0")
    registry = get_registry()
    features = spec.features(problem)
    predictions: dict[str, Prediction] = {}
    excluded: dict[str, str] = {}
    costs: dict[str, float] = {}
    models: dict[str, CostModel] = {}
    for name in spec.backends:
        backend = registry.backends.get(name)
        if backend is None:
            excluded[name] = "backend not registered (is its plugin installed?)"
            continue
        status = safe_probe(backend)
        model = timings.model(spec, name)
        one_off = timings.one_off(spec, name)
        if model is None:
            predictions[name] = Prediction(None, "uncalibrated", one_off)
        else:
            seconds, extrapolated = model.predict(features)
            predictions[name] = Prediction(seconds, "extrapolated" if extrapolated else "calibrated", one_off)
            models[name] = model
        if not status.available:
            excluded[name] = f"unavailable: {status.reason}"
            continue
        need, free = float(spec.memory(problem, name)), backend.free_memory()
        if free is not None and need > free:
            excluded[name] = f"not enough memory: needs {_gib(need)}, {_gib(free)} free"
            continue
        if model is None:
            excluded[name] = "uncalibrated on this machine (run `crossover calibrate`)"
            continue
        costs[name] = predictions[name].seconds + one_off / expected_calls
    if not costs:
        reasons = "; ".join(f"{b}: {why}" for b, why in excluded.items()) or "no backends"
        raise AutoSelectionError(f"no backend can run {spec.name} here ({reasons})")
    simplicity = {name: registry.backends[name].simplicity for name in costs}
    chosen = choose(costs, simplicity, margin)
    fastest = min(costs, key=costs.get)
    reason = f"lowest predicted time {costs[chosen]:.3g} s"
    if chosen != fastest:
        reason = (f"within {margin:.0%} of the fastest ({fastest}, {costs[fastest]:.3g} s) and simpler: "
                  f"{costs[chosen]:.3g} s")
    if predictions[chosen].one_off_seconds:
        reason += f", including an unpaid one-off of {predictions[chosen].one_off_seconds:.3g} s"
    runnable = {b: m for b, m in models.items() if not excluded.get(b, "").startswith("unavailable")}
    free = {b: registry.backends[b].free_memory() for b in runnable}
    return Plan(solver=spec.name, backend=chosen, reason=reason, predictions=predictions, excluded=excluded,
                break_even=tuple(break_even(spec, problem, runnable, free)))


def with_size(spec: SolverSpec, problem: Any, size: float) -> Any | None:
    """``problem`` with its primary size replaced (None if the size is not allowed)."""
    current = getattr(problem, spec.size_axis)
    value = round(float(size)) if isinstance(current, (int, np.integer)) else float(size)
    try:
        return dataclasses.replace(problem, **{spec.size_axis: value})
    except (CrossoverError, ValueError, TypeError):
        pass
    # arrays sized by the old grid (a preset's V, m0 ...) no longer fit: rebuild without them,
    # so the problem type derives them again at the new size
    scalars = {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)
               if f.init and not isinstance(getattr(problem, f.name), np.ndarray)}
    try:
        return type(problem)(**{**scalars, spec.size_axis: value})
    except (CrossoverError, ValueError, TypeError):
        return None


def size_grid(spec: SolverSpec, points: int = 80) -> np.ndarray:
    """Sizes from half the ladder's smallest to eight times its largest, log-spaced."""
    sizes = [float(getattr(p, spec.size_axis)) for p in spec.ladder(True) + spec.ladder(False)]
    return np.geomspace(max(min(sizes) / 2, 1e-12), max(sizes) * 8, points)


def curves(spec: SolverSpec, problem: Any, models: Mapping[str, CostModel], grid: np.ndarray | None = None,
           free_memory: Mapping[str, float | None] | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Predicted steady-state seconds of each backend along the primary size axis.

    Where ``free_memory`` is given, sizes whose memory estimate does not fit
    a backend are NaN for it: that backend cannot run there.
    """
    grid = size_grid(spec) if grid is None else grid
    free_memory = free_memory or {}
    rows = {name: np.full(len(grid), np.nan) for name in models}
    for i, size in enumerate(grid):
        resized = with_size(spec, problem, size)
        if resized is None:
            continue
        features = spec.features(resized)
        for name, model in models.items():
            free = free_memory.get(name)
            if free is not None and float(spec.memory(resized, name)) > free:
                continue
            rows[name][i] = model.predict(features)[0]
    return grid, rows


def _fastest(values: dict[str, float]) -> str | None:
    finite = {name: v for name, v in values.items() if not math.isnan(v)}
    return min(finite, key=finite.get) if finite else None


def break_even(spec: SolverSpec, problem: Any, models: Mapping[str, CostModel],
               free_memory: Mapping[str, float | None] | None = None) -> list[dict[str, Any]]:
    """Sizes along the primary axis where the fastest backend changes.

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
