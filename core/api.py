"""The public entry points: run a solver, list what is registered."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from core.backend import Availability, safe_describe, safe_probe
from core.errors import BackendUnavailableError, ProblemError, UnknownBackendError
from core.registry import get_registry, get_solver
from core.result import Plan, Result, as_arrays
from core.solver import SolverSpec


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
        availability = safe_probe(backend)
        details = safe_describe(backend) if describe and availability.available else {}
        rows[name] = BackendStatus(name, backend.summary, availability.available, availability.reason, details)
    return rows


def availability(name: str) -> Availability:
    """Whether the named backend runs here (unknown names raise)."""
    registry = get_registry()
    if name not in registry.backends:
        raise UnknownBackendError(f"unknown backend {name!r}; registered backends: {', '.join(registry.backends)}")
    return safe_probe(registry.backends[name])


def find_solver(problem: Any) -> SolverSpec:
    """The solver registered for this problem's type.

    An exact type match wins over a base class, so a problem type derived
    from another (common noise from the plain MFG) reaches its own solver.
    """
    specs = list(get_registry().solvers.values())
    for spec in specs:
        if type(problem) is spec.problem_type:
            return spec
    for spec in specs:
        if isinstance(problem, spec.problem_type):
            return spec
    raise ProblemError(f"no registered solver takes a {type(problem).__name__}; "
                       "pass solver=NAME or register the plugin that defines it")


def check_backend(spec: SolverSpec, backend: str) -> None:
    """Raise a one-line error unless ``spec`` can run on ``backend`` here."""
    registry = get_registry()
    if backend not in registry.backends:
        raise UnknownBackendError(
            f"unknown backend {backend!r}; registered backends: {', '.join(registry.backends)}")
    if backend not in spec.implementations:
        raise UnknownBackendError(
            f"solver {spec.name!r} has no {backend!r} implementation; it runs on: {', '.join(spec.backends)}")
    status = safe_probe(registry.backends[backend])
    if not status.available:
        raise BackendUnavailableError(f"backend {backend!r} is unavailable here: {status.reason}")


def run_once(spec: SolverSpec, backend: str, problem: Any) -> tuple[dict, float]:
    """Run one implementation and time it as the user pays for it.

    The time covers host-to-device transfers and waiting for the GPU, since
    outputs are moved to NumPy inside the timed region.
    """
    check_backend(spec, backend)
    started = time.perf_counter()
    outputs = as_arrays(spec.implementations[backend](problem))
    return outputs, time.perf_counter() - started


def solve(problem: Any, backend: str = "auto", *, solver: str | None = None, expected_calls: float = 1) -> Result:
    """Run ``problem`` and return its outputs with the measured wall time.

    ``backend="auto"`` follows :func:`core.plan` (calibrating once if this
    solver was never calibrated here); a backend name runs there or raises a
    one-line error saying why it cannot. ``solver`` names the solver when
    several take the same problem type; ``expected_calls`` spreads unpaid
    one-off costs (JIT, pool start) over that many calls.
    """
    from core.costmodel import history as timings
    from core.costmodel.calibrate import sample_record

    spec = get_solver(solver) if solver is not None else find_solver(problem)
    if not isinstance(problem, spec.problem_type):
        raise ProblemError(f"solver {spec.name!r} takes a {spec.problem_type.__name__}, "
                           f"got {type(problem).__name__}")
    if backend == "auto":
        from core.costmodel.plan import plan as make_plan

        plan = make_plan(problem, solver=spec.name, expected_calls=expected_calls, calibrate=True)
        backend = plan.backend
    else:
        plan = Plan(solver=spec.name, backend=backend, reason="named by the caller")
    was_paid = timings.is_paid(spec, backend)
    outputs, seconds = run_once(spec, backend, problem)
    timings.mark_paid(spec, backend)
    if was_paid:  # a first call includes the one-off cost and would bias the steady-state model
        timings.record_solve(spec, backend, sample_record(spec, problem, seconds, "solve"))
    elif (model := timings.model(spec, backend)) is not None:
        # a first call's excess over the steady-state model is this process's one-off cost,
        # when the model can be trusted at this size (an extrapolation would blame its own error)
        predicted, extrapolated = model.predict(spec.features(problem))
        if not extrapolated:
            timings.record_one_off(spec, backend, max(0.0, seconds - predicted))
    return Result(solver=spec.name, backend=backend, seconds=seconds, outputs=outputs, plan=plan,
                  diagnostics={"problem": type(problem).__name__, "first_call": not was_paid})
