"""What a solver is: one job, several backend implementations, and its costs.

A plugin returns :class:`SolverSpec` records from its
``crossover_solvers`` hook. The core never looks inside an implementation;
it only needs the spec's functions to describe the work.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import PluginError

# ``plugin.solver``: the prefix groups a plugin's solvers in tables and reports
SOLVER_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")

Outputs = Mapping[str, Any]
Implementation = Callable[[Any], Outputs]


@dataclass(frozen=True)
class SolverSpec:
    """Everything the core needs to run, measure and choose for one solver.

    ``implementations`` maps a backend name to ``fn(problem) -> outputs``
    (a mapping of names to arrays or numbers). ``features(problem)`` returns
    the named work measures the cost model is linear in. ``size_axis`` is the
    problem field that break-even reports are drawn against. ``ladder(quick)``
    returns calibration problems of growing size. ``memory(problem,
    backend)`` estimates peak bytes. ``default_problem()`` is what ``crossover
    demo`` runs, and ``summarize(problem, outputs)`` the one line it prints.
    ``version`` keys this solver's stored timings: change it when the
    implementations' speed changes; left at "0" it becomes the plugin's
    distribution version.
    """

    name: str
    problem_type: type
    implementations: Mapping[str, Implementation]
    features: Callable[[Any], Mapping[str, float]]
    size_axis: str
    ladder: Callable[[bool], list]
    memory: Callable[[Any, str], float]
    default_problem: Callable[[], Any]
    summarize: Callable[[Any, Outputs], str] = field(default=lambda problem, outputs: f"{len(outputs)} outputs")
    description: str = ""
    version: str = "0"
    # the keyword arguments of default_problem(), when fields derive from each other
    # (a preset's arrays from Nx): parameters then rebuild the problem instead of editing it
    default_params: Callable[[], Mapping[str, Any]] | None = None

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self.implementations)


def check_spec(spec: object, plugin_name: str) -> SolverSpec:
    """Reject a malformed spec with a message naming the plugin and the fault."""
    if not isinstance(spec, SolverSpec):
        raise PluginError(f"plugin {plugin_name!r} returned {type(spec).__name__}, expected core.SolverSpec")
    if not SOLVER_NAME.match(spec.name):
        raise PluginError(f"plugin {plugin_name!r}: solver name {spec.name!r} must look like 'plugin.solver' "
                          "(lower case, dot-separated)")
    if not dataclasses.is_dataclass(spec.problem_type):
        raise PluginError(f"plugin {plugin_name!r}: solver {spec.name!r} problem_type must be a dataclass")
    if not spec.implementations:
        raise PluginError(f"plugin {plugin_name!r}: solver {spec.name!r} has no implementations")
    for backend, fn in spec.implementations.items():
        if not callable(fn):
            raise PluginError(f"plugin {plugin_name!r}: solver {spec.name!r} implementation for "
                              f"{backend!r} is not callable")
    field_names = {f.name for f in dataclasses.fields(spec.problem_type)}
    if spec.size_axis not in field_names:
        raise PluginError(f"plugin {plugin_name!r}: solver {spec.name!r} size_axis {spec.size_axis!r} "
                          f"is not a field of {spec.problem_type.__name__}")
    return spec


def problem_from_params(spec: SolverSpec, params: Mapping[str, Any]) -> Any:
    """The solver's default problem with ``params`` changed (text converted to each field's type).

    With ``default_params`` the problem is rebuilt from them plus ``params``,
    so derived fields (arrays sized by ``Nx``, a preset's defaults) follow
    the change; otherwise the default problem's other fields are kept.
    """
    from core.problem import make_problem

    if spec.default_params is not None:
        from core.problem import convert_params

        return spec.problem_type(**{**spec.default_params(), **convert_params(spec.problem_type, params)})
    return make_problem(spec.problem_type, params, base=spec.default_problem())
