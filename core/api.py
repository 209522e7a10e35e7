"""The public entry points: run a solver, plan it, list what is registered.

This is the top of the core: nothing below imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core import limits
from core.backend import Availability, safe_describe
from core.costmodel import history
from core.costmodel.features import model_features
from core.costmodel.plan import plan
from core.costmodel.warmup import tier_up, using
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


def _named(spec: SolverSpec, problem: Any, name: str, expected_calls: float | None) -> Plan:
    """A plan for a backend the caller named: its variant chosen by measurement, its memory checked."""
    keys = check_backend(spec, name)
    reasons = {key: exclusion(spec, problem, key) for key in keys}
    runnable = [key for key in keys if not reasons[key]]
    if not runnable:
        why = "; ".join(f"{key}: {reason}" for key, reason in reasons.items())
        error = NotEnoughMemoryError if all("memory" in r for r in reasons.values()) else BackendUnavailableError
        raise error(f"backend {name!r} cannot run {spec.name} on this problem: {why}")
    if len(runnable) > 1:
        try:
            chosen = plan(problem, solver=spec.name, expected_calls=expected_calls, explain=False, only=runnable)
            return Plan(solver=spec.name, backend=chosen.backend, reason=f"named by the caller; {chosen.reason}",
                        predictions=chosen.predictions, excluded=chosen.excluded)
        except AutoSelectionError:  # no variant calibrated yet: the first one the plugin lists
            pass
    return Plan(solver=spec.name, backend=runnable[0], reason="named by the caller")


def _run(spec: SolverSpec, implementation: str, problem: Any) -> tuple[dict, float, bool]:
    """Run once, paying the backend's start first; learn from the timing. Returns (outputs, seconds, first)."""
    history.start_backend(get_registry().backends[backend_of(implementation)])
    was_paid = history.is_paid(spec, implementation, problem)
    owed = history.implementation_one_off(spec, implementation, problem)
    with using(implementation):
        outputs, seconds = run_once(spec, implementation, problem)
    history.mark_paid(spec, implementation, problem)
    if was_paid or owed == 0.0:  # a first call that owes a one-off would bias the steady-state model
        history.record_solve(spec, implementation,
                             history.sample_record(spec, implementation, problem, seconds, "solve", outputs))
    if not was_paid and (fitted := history.model(spec, implementation)) is not None:
        # a first call's excess over the steady-state model is this process's one-off cost,
        # when the model can be trusted here (an extrapolation would blame its own error)
        predicted, extrapolated = fitted.predict(model_features(spec, problem, implementation))
        if not extrapolated:
            history.record_one_off(spec, implementation, max(0.0, seconds - predicted))
    return outputs, seconds, not was_paid


def _measure(spec: SolverSpec, problem: Any, decision: Plan) -> tuple[str, dict, float, Plan]:
    """Time each close candidate once on this problem; keep the fastest answer and remember the times."""
    timed: dict[str, tuple[dict, float]] = {}
    for key in decision.measure:
        outputs, seconds, _ = _run(spec, key, problem)
        timed[key] = (outputs, seconds)
    fastest = min(timed, key=lambda k: timed[k][1])
    history.remember(spec, spec.features(problem), {k: s for k, (_, s) in timed.items()})
    times = ", ".join(f"{k} {s:.3g} s" for k, (_, s) in sorted(timed.items(), key=lambda kv: kv[1][1]))
    measured = Plan(solver=decision.solver, backend=fastest, reason=f"{decision.reason}; measured: {times}",
                    predictions=decision.predictions, excluded=decision.excluded, measure=decision.measure,
                    expected_calls=decision.expected_calls, confident=True)
    return fastest, timed[fastest][0], timed[fastest][1], measured


def solve(problem: Any, backend: str = "auto", *, solver: str | None = None,
          expected_calls: float | None = None, max_seconds: float | None = None) -> Result:
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
    """
    limit = limits.max_seconds(max_seconds)
    spec = get_solver(solver) if solver is not None else find_solver(problem)
    if not isinstance(problem, spec.problem_type):
        raise ProblemError(f"solver {spec.name!r} takes a {spec.problem_type.__name__}, "
                           f"got {type(problem).__name__}")
    history.count_call(spec)
    if backend == "auto":
        decision = plan(problem, solver=spec.name, expected_calls=expected_calls, calibrate=True, explain=False)
        tier_up(spec, decision)
    else:
        decision = _named(spec, problem, backend, expected_calls)
    _refuse_if_too_long(spec, problem, decision, limit)
    if decision.measure:
        used, outputs, seconds, decision = _measure(spec, problem, decision)
        first = False
    else:
        used = decision.backend
        outputs, seconds, first = _run(spec, used, problem)
    return Result(solver=spec.name, backend=used, seconds=seconds, outputs=outputs, plan=decision,
                  diagnostics={"problem": type(problem).__name__, "first_call": first})


def _refuse_if_too_long(spec: SolverSpec, problem: Any, decision: Plan, limit: float) -> None:
    """Nothing starts that the models predict to run past the limit (the fastest candidate, if measuring)."""
    keys = decision.measure or (decision.backend,)
    predicted = {key: _predicted_seconds(spec, problem, key, decision) for key in keys}
    known = {key: s for key, s in predicted.items() if s is not None}
    if len(known) == len(keys):
        key = min(known, key=known.__getitem__)
        limits.refuse_if_too_long(spec.name, key, known[key], limits.predicted_memory(spec, problem, key), limit)


def _predicted_seconds(spec: SolverSpec, problem: Any, key: str, decision: Plan) -> float | None:
    if key in decision.predictions and decision.predictions[key].seconds is not None:
        return decision.predictions[key].seconds
    fitted = history.model(spec, key)  # a named backend's plan may carry no predictions
    return None if fitted is None else max(0.0, fitted.predict(model_features(spec, problem, key))[0])
