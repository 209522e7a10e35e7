"""How long a run may be predicted to take before crossover refuses to start it.

A plan that picks a 7.5-day run, then a solve that fills the machine's
memory, is the worst first hour a user can have. So a solve whose chosen
implementation is predicted to take longer than a limit is refused before
anything starts, with the prediction and the memory estimate in the
message; a plan says the same in its reason. The limit is one hour by
default, ``max_seconds=`` per call or ``CROSSOVER_MAX_SECONDS`` per
environment; ``inf`` lifts it.

With no model for the implementation that will run (a backend named on a
machine where it was never calibrated), the rule is
:func:`unmodelled_seconds`: a problem no larger, in every work measure the
solver declares, than the largest problem of its full calibration design
runs without a prediction (calibration itself runs such sizes); a larger
one is measured first (one quick calibration of that implementation,
logged, kept in the wisdom store), then predicted; one that still cannot
be predicted is refused, since nothing then bounds it.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from core.errors import PluginError, TooLongError
from core.running import memory_need
from core.validation import fail

log = logging.getLogger("crossover")

DEFAULT_MAX_SECONDS = 3600.0
ENVIRONMENT = "CROSSOVER_MAX_SECONDS"


def max_seconds(value: float | None = None) -> float:
    """The limit: ``value`` if given, else ``CROSSOVER_MAX_SECONDS``, else one hour (checked either way)."""
    if value is not None:
        return _positive("max_seconds", value)
    text = os.environ.get(ENVIRONMENT, "").strip()
    return _positive(ENVIRONMENT, text) if text else DEFAULT_MAX_SECONDS


def _positive(field: str, value: object) -> float:
    """A number of seconds > 0, ``inf`` (no limit) allowed; text is read as a number."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        number = math.nan
    if not number > 0:  # NaN too
        raise fail(field, value, "must be a number of seconds > 0, or inf for no limit")
    return number


def duration(seconds: float) -> str:
    """Seconds as a person reads them: ``4.2 s``, ``12 min``, ``3.1 h``, ``7.5 days``."""
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def size(nbytes: float) -> str:
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes / 1024:.3g} KiB"


def too_long(solver: str, implementation: str, seconds: float | None, memory: float | None,
             limit: float) -> str:
    """Why this run is refused, or "" (no prediction, or within the limit)."""
    if seconds is None or not seconds > limit:
        return ""
    needs = f", needing about {size(memory)}" if memory else ""
    return (f"{solver} on {implementation} is predicted to take {duration(seconds)}{needs}, over the limit of "
            f"{duration(limit)}; pass max_seconds= (or set {ENVIRONMENT}, 'inf' for none) to run it anyway")


def refuse_if_too_long(solver: str, implementation: str, seconds: float | None, memory: float | None,
                       limit: float) -> None:
    """Raise :class:`TooLongError` before a run predicted above ``limit`` starts."""
    why = too_long(solver, implementation, seconds, memory, limit)
    if why:
        raise TooLongError(why)


def predicted_memory(spec: Any, problem: Any, implementation: str) -> float | None:
    """The plugin's checked memory estimate, or None where it cannot give one (the message then leaves it out)."""
    try:
        return memory_need(spec, problem, implementation)
    except PluginError:  # only decorates a message; the plan has already blamed a broken estimate
        return None


_design_tops: dict[tuple[str, str], dict[str, float]] = {}  # (solver, version) -> its full design's largest work


def design_top(spec: Any) -> dict[str, float]:
    """The largest value of each work measure (``spec.features``) over the solver's full calibration design."""
    key = (spec.name, str(getattr(spec, "version", "")))
    if key not in _design_tops:
        from core.costmodel.design import calibration_design  # the cost model sits above this module

        tops: dict[str, float] = {}
        for problem in calibration_design(spec, quick=False):
            for name, value in spec.features(problem).items():
                tops[name] = max(tops.get(name, 0.0), float(value))
        _design_tops[key] = tops
    return _design_tops[key]


DESIGN_REACH = 10.0  # how far past its full design's top a problem may go before a run with no model is measured


def beyond_design(spec: Any, problem: Any) -> list[str]:
    """The work measures in which ``problem`` is over :data:`DESIGN_REACH` times every problem of the solver's
    full calibration design.

    The limit is there to stop runs orders of magnitude beyond anything
    measured (30 billion walkers), not a default problem whose nominal
    caps (60 Picard iterations where the design stops at 10 or 20) lie a
    few times past the design's top.
    """
    tops = design_top(spec)
    return [name for name, value in spec.features(problem).items()
            if float(value) > DESIGN_REACH * tops.get(name, 0.0)]


def unmodelled_seconds(spec: Any, problem: Any, implementation: str, limit: float) -> float | None:
    """A prediction where ``implementation`` has no model yet: None (no need), a measured one, or a refusal.

    - no limit (``inf``), or a problem no larger than the solver's full
      calibration design in every work measure: None, the run goes ahead
      (calibration itself runs problems that large);
    - larger: one quick calibration of ``implementation`` (logged), then its
      model's prediction, which the caller checks against the limit;
    - still no model: :class:`TooLongError`, as nothing bounds the run.
    """
    if math.isinf(limit):
        return None
    larger = beyond_design(spec, problem)
    if not larger:
        return None
    from core.costmodel.calibrate import calibrate_solver  # the cost model sits above this module
    from core.costmodel.features import model_features
    from core.costmodel.planner import current

    log.warning("solver %s: %s has no model here and this problem is beyond its calibration design (%s): "
                "measuring it once (quick calibration) to check it against the limit of %s", spec.name,
                implementation, ", ".join(larger), duration(limit))
    calibrate_solver(spec, quick=True, backends=[implementation])
    fitted = current().model(spec, implementation)
    if fitted is None:
        raise TooLongError(f"{spec.name} on {implementation} cannot be predicted (no model, even after a quick "
                           f"calibration) and this problem is beyond its calibration design in {', '.join(larger)}; "
                           f"pass max_seconds=inf (or set {ENVIRONMENT}=inf) to run it anyway")
    return max(0.0, fitted.predict(model_features(spec, problem, implementation))[0])
