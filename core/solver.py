"""What a solver is: one job, several implementations, and what the work costs.

A plugin returns :class:`SolverSpec` records from its ``crossover_solvers``
hook. The core never looks inside an implementation; it only needs the
spec's functions to describe the work.

Implementations are keyed by a backend name, or by ``backend:variant``
(``numba:fused``, ``torch:eager``) when one device has several ways to run
the job. The part before the colon names the backend that gives the probe,
the memory and the one-off costs of a process; each key is measured and
chosen on its own, so no plugin needs a size rule to pick its variant.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import numbers
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import CrossoverError, PluginError
from core.problem import convert_params, make_problem

# ``plugin.solver``: the prefix groups a plugin's solvers in tables and reports
SOLVER_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
IMPLEMENTATION_NAME = re.compile(r"^[a-z][a-z0-9_]*(:[a-z][a-z0-9_]*)?$")

Outputs = Mapping[str, Any]
Implementation = Callable[[Any], Outputs]


def backend_of(implementation: str) -> str:
    """The backend part of an implementation key: ``numba`` for ``numba:fused``."""
    return implementation.split(":", 1)[0]


class lazy:
    """An implementation imported on its first call: ``lazy("plugins.mfg.fp.numba_kernel", "solve_numba")``.

    The one idiom every plugin uses to defer a backend's heavy imports
    (numba, torch, triton) until that backend actually runs. Keyword
    arguments are bound, so one function can serve several variants.
    """

    def __init__(self, module: str, name: str, **bound: Any):
        self.module, self.name, self.bound = module, name, bound
        self._function: Callable[..., Outputs] | None = None

    def __call__(self, problem: Any, **more: Any) -> Outputs:
        if self._function is None:
            self._function = getattr(importlib.import_module(self.module), self.name)
        return self._function(problem, **self.bound, **more)

    def __repr__(self) -> str:
        bound = "".join(f", {k}={v!r}" for k, v in self.bound.items())
        return f"lazy({self.module!r}, {self.name!r}{bound})"


@dataclass(frozen=True)
class SizeSpace:
    """The problems a solver is calibrated and evaluated on.

    ``ranges`` maps a numeric field to ``(low, high)``: sampled on a log
    scale (integers rounded). ``choices`` maps a field to the values drawn
    uniformly (presets, boundary conditions). ``fixed`` sets fields that
    stay put. Any other field keeps the default problem's value.
    """

    ranges: Mapping[str, tuple[float, float]]
    choices: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SolverSpec:
    """Everything the core needs to run, measure and choose for one solver.

    - ``implementations``: ``backend`` or ``backend:variant`` -> ``fn(problem) -> outputs``.
    - ``features(problem)``: the named work measures the cost model is linear in.
    - ``size_axis``: the numeric field that break-even reports are drawn against.
    - ``space(quick)``: the :class:`SizeSpace` the core designs calibration and
      held-out problems from; ``ladder(quick)``, a fixed list of problems,
      overrides it for calibration.
    - ``memory(problem, implementation)``: estimated peak bytes on that device.
    - ``supports(problem, implementation)``: "" or why that implementation
      cannot run this problem (a variant that lacks a feature).
    - ``parallel(problem, backend=NAME)``: one implementation for every
      parallel backend (process pool, Dask, a third party's): it splits the
      work into tasks and runs them with ``core.tasks.map_tasks(..., backend=NAME)``.
      The core offers it under the name of each registered backend that has a ``map``.
    - ``parallel_tasks(problem)``: how many independent tasks a parallel
      backend runs; the core adds the span feature from it (see
      ``core.costmodel.fit.model_features``), so plugins never read a pool's size.
    - ``span_feature``: the feature shared evenly by those tasks.
    - ``thread_items``: implementation key -> ``fn(problem)``, how many equal
      items that implementation's kernels share among its backend's threads
      (spectra parallel over spectra); its model gets the span over the
      backend's ``threads()`` in the same way. Needs ``span_feature``.
    - ``implementation_features``: implementation key -> ``fn(features)``, the
      work measures that only that implementation pays, derived from the
      solver's features (expected or done, as the model is given them):
      spectra.fit's ``torch:graph`` launches its first LM steps one kernel at
      a time and then captures one as a CUDA graph, a price per call that no
      other implementation pays and no feature of the batch can say.
    - ``work_done(problem, outputs)``: the features of the work a finished
      solve really did, where that is known only afterwards (iterations to
      converge); a real solve's history sample uses it instead of ``features``.
    - ``compile_key(problem, implementation)``: for variants that compile per
      shape, the shape; a one-off cost is then charged once per key.
    - ``compile_cached``: the implementations whose compiles at a key a disk
      cache keeps for later processes on the same machine (Triton's kernel
      cache): a key compiled here before costs a later process only what
      such first runs were measured to cost, not a compile. Needs
      ``compile_key``.
    - ``default_problem()`` is what ``crossover demo`` runs, and
      ``summarize(problem, outputs)`` the line it prints. ``version`` keys
      this solver's stored timings ("0": the plugin's distribution version).
    """

    name: str
    problem_type: type
    implementations: Mapping[str, Implementation]
    features: Callable[[Any], Mapping[str, float]]
    size_axis: str
    memory: Callable[[Any, str], float]
    default_problem: Callable[[], Any]
    ladder: Callable[[bool], list] | None = None
    space: Callable[[bool], SizeSpace] | None = None
    supports: Callable[[Any, str], str] = field(default=lambda problem, implementation: "")
    parallel: Callable[..., Outputs] | None = None
    parallel_tasks: Callable[[Any], float] | None = None
    span_feature: str | None = None
    thread_items: Mapping[str, Callable[[Any], float]] = field(default_factory=dict)
    implementation_features: Mapping[str, Callable[[Mapping[str, float]], Mapping[str, float]]] = field(
        default_factory=dict)
    compile_key: Callable[[Any, str], Hashable] | None = None
    compile_cached: frozenset[str] = frozenset()
    work_done: Callable[[Any, Outputs], Mapping[str, float]] | None = None
    summarize: Callable[[Any, Outputs], str] = field(default=lambda problem, outputs: f"{len(outputs)} outputs")
    description: str = ""
    version: str = "0"
    # the keyword arguments of default_problem(), when fields derive from each other
    # (a preset's arrays from Nx): parameters then rebuild the problem instead of editing it
    default_params: Callable[[], Mapping[str, Any]] | None = None

    @property
    def backends(self) -> tuple[str, ...]:
        """The implementation keys (``numba``, ``numba:fused`` ...), in declaration order."""
        return tuple(self.implementations)

    def implementations_on(self, backend: str) -> tuple[str, ...]:
        """The implementation keys that run on ``backend`` (itself, or its variants)."""
        return tuple(key for key in self.implementations if backend_of(key) == backend or key == backend)


def _problem_fields(spec: SolverSpec) -> set[str]:
    return {f.name for f in dataclasses.fields(spec.problem_type)}


def check_spec(spec: object, plugin_name: str) -> SolverSpec:
    """Reject a malformed spec with a message naming the plugin, the solver and the fault."""
    if not isinstance(spec, SolverSpec):
        raise PluginError(f"plugin {plugin_name!r} returned {type(spec).__name__}, expected core.SolverSpec")
    where = f"plugin {plugin_name!r}: solver {spec.name!r}"
    if not isinstance(spec.name, str) or not SOLVER_NAME.match(spec.name):
        raise PluginError(f"plugin {plugin_name!r}: solver name {spec.name!r} must look like 'plugin.solver' "
                          "(lower case, dot-separated)")
    spec = guard_spec(spec, plugin_name)  # from here on, a fault in the spec's functions names the plugin
    if not dataclasses.is_dataclass(spec.problem_type):
        raise PluginError(f"{where} problem_type must be a dataclass")
    if not spec.implementations and spec.parallel is None:
        raise PluginError(f"{where} has no implementations")
    if spec.parallel is not None and not callable(spec.parallel):
        raise PluginError(f"{where} parallel implementation is not callable")
    for key, fn in spec.implementations.items():
        if not isinstance(key, str) or not IMPLEMENTATION_NAME.match(key):
            raise PluginError(f"{where} implementation key {key!r} must be 'backend' or 'backend:variant' "
                              "(lower case)")
        if not callable(fn):
            raise PluginError(f"{where} implementation for {key!r} is not callable")
    fields = _problem_fields(spec)
    if spec.size_axis not in fields:
        raise PluginError(f"{where} size_axis {spec.size_axis!r} is not a field of {spec.problem_type.__name__}")
    if spec.ladder is None and spec.space is None:
        raise PluginError(f"{where} declares neither a size space nor a ladder: the core cannot calibrate it")
    try:
        default = spec.default_problem()
    except PluginError:
        raise
    except Exception as exc:  # the problem type's own validation rejected the plugin's default
        raise PluginError(f"{where} default_problem() raised {type(exc).__name__}: {exc}") from exc
    size = getattr(default, spec.size_axis, None)
    if isinstance(size, bool) or not isinstance(size, numbers.Real):
        raise PluginError(f"{where} size_axis {spec.size_axis!r} must be numeric, the default problem has "
                          f"{size!r}")
    features = _check_features(spec, default, where)
    if spec.space is not None:
        for quick in (True, False):
            _check_space(spec, spec.space(quick), fields, where)
    if spec.ladder is not None:
        for quick in (True, False):
            _check_ladder(spec, spec.ladder(quick), where)
    if spec.span_feature is not None and spec.span_feature not in features:
        raise PluginError(f"{where} span_feature {spec.span_feature!r} is not one of its features")
    if (spec.span_feature is None) != (spec.parallel_tasks is None):
        raise PluginError(f"{where} must declare parallel_tasks and span_feature together")
    unknown = sorted(set(spec.thread_items) - set(spec.implementations))
    if unknown:
        raise PluginError(f"{where} thread_items names {', '.join(unknown)}, which are not its implementations")
    if spec.thread_items and spec.span_feature is None:
        raise PluginError(f"{where} thread_items needs a span_feature, the work the threads share")
    if isinstance(spec.compile_cached, str) or not all(isinstance(key, str) for key in spec.compile_cached):
        # a bare string would be read letter by letter, and "in" would match any substring of it
        raise PluginError(f"{where} compile_cached must be a set of implementation keys, got "
                          f"{type(spec.compile_cached).__name__} {spec.compile_cached!r}")
    unknown = sorted(set(spec.compile_cached) - set(spec.implementations))
    if unknown:
        raise PluginError(f"{where} compile_cached names {', '.join(unknown)}, which are not its implementations")
    if spec.compile_cached and spec.compile_key is None:
        raise PluginError(f"{where} compile_cached needs a compile_key, what a compile is cached by")
    _check_implementation_features(spec, features, where)
    return spec


def _check_implementation_features(spec: SolverSpec, base: Mapping[str, float], where: str) -> None:
    """Each implementation's own features (from ``base``, the default problem's): of implementations it has, new
    names, finite numbers >= 0."""
    unknown = sorted(set(spec.implementation_features) - set(spec.implementations))
    if unknown:
        raise PluginError(f"{where} implementation_features names {', '.join(unknown)}, "
                          "which are not its implementations")
    for key, extra in spec.implementation_features.items():
        added = dict(extra(dict(base)))  # guarded (guard_spec): a fault raises a PluginError naming it
        clash = sorted(set(added) & set(base))
        if clash:
            raise PluginError(f"{where} implementation_features[{key!r}] redefines {', '.join(clash)}, "
                              "which are the solver's own features")
        _check_feature_values(added, f"{where} implementation_features[{key!r}]:")


def _check_features(spec: SolverSpec, problem: Any, where: str) -> Mapping[str, float]:
    """The solver's features of ``problem``, checked."""
    try:
        features = spec.features(problem)
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(f"{where} features() raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(features, Mapping) or not features:
        raise PluginError(f"{where} features() must return a non-empty mapping of name -> number, "
                          f"got {type(features).__name__}")
    _check_feature_values(features, where)
    return features


def _check_feature_values(features: Mapping[str, Any], where: str) -> None:
    for name, value in features.items():
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        if not isinstance(name, str) or not ok:
            raise PluginError(f"{where} feature {name!r}={value!r} at the default problem is invalid: "
                              "must be a finite number >= 0")


def _check_space(spec: SolverSpec, space: object, fields: set[str], where: str) -> None:
    if not isinstance(space, SizeSpace):
        raise PluginError(f"{where} space() returned {type(space).__name__}, expected core.SizeSpace")
    if not space.ranges:
        raise PluginError(f"{where} size space has no ranges: nothing to vary")
    for name in [*space.ranges, *space.choices, *space.fixed]:
        if name not in fields:
            raise PluginError(f"{where} size space field {name!r} is not a field of {spec.problem_type.__name__}")
    for name, bounds in space.ranges.items():
        valid = (isinstance(bounds, Sequence) and len(bounds) == 2
                 and all(isinstance(b, numbers.Real) and not isinstance(b, bool) and math.isfinite(b) for b in bounds)
                 and 0 < bounds[0] <= bounds[1])
        if not valid:
            raise PluginError(f"{where} size space range {name}={bounds!r} is invalid: must be (low, high) "
                              "with 0 < low <= high")
    for name, values in space.choices.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise PluginError(f"{where} size space choices {name}={values!r} is invalid: must be a non-empty list")


def _check_ladder(spec: SolverSpec, ladder: object, where: str) -> None:
    if not isinstance(ladder, (list, tuple)) or not ladder:
        raise PluginError(f"{where} ladder() must return a non-empty list of problems, got {ladder!r:.60}")
    for problem in ladder:
        if not isinstance(problem, spec.problem_type):
            raise PluginError(f"{where} ladder() holds a {type(problem).__name__}, expected "
                              f"{spec.problem_type.__name__}")


# the spec's own functions (not its implementations: a solve's error is the solve's) that the core calls
# while planning, calibrating and reporting; a fault in one of them is the plugin's, and says so
_GUARDED = ("features", "memory", "supports", "space", "ladder", "default_problem", "parallel_tasks",
            "compile_key", "work_done", "summarize", "default_params")


def _guarded(fn: Callable[..., Any], where: str, what: str) -> Callable[..., Any]:
    """``fn``, with any fault but the library's own errors turned into a PluginError naming the culprit.

    ``SystemExit`` is caught too: a plugin that calls ``sys.exit`` must not end
    the user's process. KeyboardInterrupt still stops everything.
    """

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CrossoverError:
            raise
        except (Exception, SystemExit) as exc:
            raise PluginError(f"{where}: {what}() raised {type(exc).__name__}: {exc}") from exc

    call.__crossover_guarded__ = True  # type: ignore[attr-defined]
    return call


def guard_spec(spec: SolverSpec, plugin_name: str) -> SolverSpec:
    """The same spec with its descriptive functions guarded (see :func:`_guarded`)."""
    where = f"plugin {plugin_name!r}: solver {spec.name!r}"
    changes: dict[str, Any] = {name: _guarded(fn, where, name) for name in _GUARDED
                               if (fn := getattr(spec, name)) is not None
                               and not getattr(fn, "__crossover_guarded__", False)}
    changes["implementation_features"] = {
        key: fn if getattr(fn, "__crossover_guarded__", False)
        else _guarded(fn, where, f"implementation_features[{key!r}]")
        for key, fn in spec.implementation_features.items()}
    return dataclasses.replace(spec, **changes)


def problem_from_params(spec: SolverSpec, params: Mapping[str, Any]) -> Any:
    """The solver's default problem with ``params`` changed (text converted to each field's type).

    With ``default_params`` the problem is rebuilt from them plus ``params``,
    so derived fields (arrays sized by ``Nx``, a preset's defaults) follow
    the change; otherwise the default problem's other fields are kept.
    """
    if spec.default_params is not None:
        return spec.problem_type(**{**spec.default_params(), **convert_params(spec.problem_type, params)})
    return make_problem(spec.problem_type, params, base=spec.default_problem())


def try_problem(spec: SolverSpec, params: Mapping[str, Any]) -> Any | None:
    """:func:`problem_from_params`, or None where those parameters make no valid problem."""
    try:
        return problem_from_params(spec, params)
    except (CrossoverError, ValueError, TypeError, OverflowError):
        return None
