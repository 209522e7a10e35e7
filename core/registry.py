"""The plugin registry: pluggy, entry points, and defensive loading.

Loading follows xarray's backend entry points: every plugin in the
``crossover.plugins`` group is tried; one that fails to import, implements
an unknown hook or returns a broken spec is skipped with a
:class:`PluginWarning` naming it, and the rest keeps working.
``CROSSOVER_PLUGINS_STRICT=1`` turns that warning into an error and
``CROSSOVER_DISABLE_PLUGIN_AUTOLOAD=1`` skips the entry points entirely
(``core.register`` still works).

Both variables take 1, true, yes, on or 0, false, no, off (any case), or
unset. Any other value is an error rather than a guess (``maybe`` is not a
safe default for either): a one-line :class:`~core.errors.ProblemError`
naming the variable, its value and what is allowed, raised before any
plugin loads; the command line prints it and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import pluggy

from core import hookspecs
from core.backend import Backend
from core.backends import builtin_backends
from core.errors import DuplicateSolverError, PluginError, PluginWarning, UnknownSolverError
from core.solver import SolverSpec, check_spec
from core.validation import env_flag

ENTRY_POINT_GROUP = "crossover.plugins"
OWN_DISTRIBUTION = "crossover-solvers"  # whose entry points are the built-in plugins


@dataclass
class PluginInfo:
    name: str
    source: str  # "entry point <dist>", "runtime" or "builtin"
    version: str = ""
    solvers: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)
    error: str = ""


@dataclass
class Registry:
    manager: pluggy.PluginManager
    solvers: dict[str, SolverSpec] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    solver_owner: dict[str, str] = field(default_factory=dict)


_registry: Registry | None = None




def strict() -> bool:
    return env_flag("CROSSOVER_PLUGINS_STRICT")


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    if _registry is None:
        _registry = _build()
    return _registry


def reset() -> None:
    """Forget every plugin; the next call rebuilds from entry points (tests use this)."""
    global _registry
    _registry = None


def _build() -> Registry:
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    registry = Registry(manager=manager)
    for backend in builtin_backends():
        registry.backends[backend.name] = backend
    registry.plugins["core"] = PluginInfo("core", "builtin", _version(OWN_DISTRIBUTION),
                                          backends=list(registry.backends))
    # both read before anything loads: a misspelt value is an error now, not only once some plugin fails
    strict()
    autoload = not env_flag("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD")
    if autoload:
        for entry_point in _load_order(entry_points(group=ENTRY_POINT_GROUP)):
            dist = entry_point.dist.name if entry_point.dist else "?"
            version = entry_point.dist.version if entry_point.dist else ""
            info = PluginInfo(entry_point.name, f"entry point of {dist}", version)
            try:
                plugin = entry_point.load()
            except (Exception, SystemExit) as exc:  # a plugin that calls sys.exit must not end the registry
                _skip(registry, info, f"failed to import ({entry_point.value}): {type(exc).__name__}: {exc}")
                continue
            try:
                _add(registry, plugin, info)
            except PluginError as exc:
                _skip(registry, info, str(exc))
    return registry


def _load_order(found: Any) -> list:
    """crossover's own plugins first, then third parties', each by name.

    Solver names are unique and the first to register one keeps it, so a
    third-party plugin that reuses a built-in solver's name is the one
    skipped (with a warning naming both), never the built-in.
    """
    return sorted(found, key=lambda e: ((e.dist.name if e.dist else "") != OWN_DISTRIBUTION, e.name))


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def _skip(registry: Registry, info: PluginInfo, reason: str) -> None:
    if strict():
        raise PluginError(f"crossover plugin {info.name!r} ({info.source}) failed to load "
                          f"(CROSSOVER_PLUGINS_STRICT is set): {reason}")
    message = f"crossover plugin {info.name!r} ({info.source}) was skipped: {reason}"
    info.error = reason
    registry.plugins[info.name] = info
    warnings.warn(message, PluginWarning, stacklevel=5)


def _add(registry: Registry, plugin: Any, info: PluginInfo) -> None:
    """Register one plugin all-or-nothing: on any fault the registry is unchanged."""
    manager = registry.manager
    if info.name in registry.plugins or manager.has_plugin(info.name):
        raise PluginError(f"a plugin named {info.name!r} is already registered")
    if manager.is_registered(plugin):
        raise PluginError(f"plugin {info.name!r} is already registered as {manager.get_name(plugin)!r}")
    try:
        manager.register(plugin, name=info.name)
        manager.check_pending()
    except Exception as exc:  # pluggy.PluginValidationError and friends
        if manager.is_registered(plugin):
            manager.unregister(plugin)
        raise PluginError(f"invalid hook implementation: {exc}") from exc
    try:
        solvers, backends = _collect(manager, plugin, info.name)
        for spec in solvers:
            owner = registry.solver_owner.get(spec.name)
            if owner is not None:
                raise DuplicateSolverError(f"solver {spec.name!r} from plugin {info.name!r} is already "
                                           f"registered by plugin {owner!r}; solver names must be unique")
        names = [s.name for s in solvers]
        if len(set(names)) != len(names):
            raise DuplicateSolverError(f"plugin {info.name!r} returns solver names more than once: {names}")
        clash = sorted(set(b.name for b in backends) & set(registry.backends))
        if clash:
            raise PluginError(f"plugin {info.name!r} redefines backend {clash[0]!r}")
    except Exception:
        manager.unregister(plugin)
        raise
    for spec in solvers:
        if spec.version == "0" and info.version:
            # the wisdom store keys timings by solver version: default it to the plugin's
            spec = dataclasses.replace(spec, version=info.version)
        registry.solvers[spec.name] = spec
        registry.solver_owner[spec.name] = info.name
    for backend in backends:
        registry.backends[backend.name] = backend
    info.solvers, info.backends = names, [b.name for b in backends]
    registry.plugins[info.name] = info


def _collect(manager: pluggy.PluginManager, plugin: Any, name: str) -> tuple[list[SolverSpec], list[Backend]]:
    """Call this plugin's hooks only, so a fault is pinned on the right plugin."""
    results: dict[str, list] = {"crossover_solvers": [], "crossover_backends": []}
    for hook_name in results:
        for impl in getattr(manager.hook, hook_name).get_hookimpls():
            if impl.plugin is not plugin:
                continue
            try:
                returned = impl.function()
            except (Exception, SystemExit) as exc:
                raise PluginError(f"hook {hook_name} raised {type(exc).__name__}: {exc}") from exc
            if returned is None:
                continue
            if not isinstance(returned, (list, tuple)):
                raise PluginError(f"hook {hook_name} of plugin {name!r} returned "
                                  f"{type(returned).__name__}, expected a list")
            results[hook_name].extend(returned)
    solvers = [check_spec(spec, name) for spec in results["crossover_solvers"]]
    backends = []
    for backend in results["crossover_backends"]:
        if not isinstance(backend, Backend):
            raise PluginError(f"plugin {name!r} returned {type(backend).__name__} from "
                              "crossover_backends, expected core.Backend")
        backends.append(backend)
    return solvers, backends


def register(plugin: Any, name: str | None = None) -> PluginInfo:
    """Register a plugin at run time; a fault raises :class:`PluginError` and changes nothing."""
    registry = get_registry()
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    info = PluginInfo(name, "runtime", str(getattr(plugin, "__version__", "")))
    _add(registry, plugin, info)
    return info


def unregister(name: str) -> None:
    """Remove a plugin with its solvers and backends (core's built-ins cannot be removed)."""
    registry = get_registry()
    if name == "core":
        raise PluginError("the built-in backends of 'core' cannot be unregistered")
    info = registry.plugins.pop(name, None)
    if info is None:
        raise PluginError(f"no plugin named {name!r}; registered: {', '.join(registry.plugins)}")
    for solver in info.solvers:
        registry.solvers.pop(solver, None)
        registry.solver_owner.pop(solver, None)
    for backend in info.backends:
        registry.backends.pop(backend, None)
    plugin = registry.manager.get_plugin(name)
    if plugin is not None:
        registry.manager.unregister(plugin)


def get_solver(name: str) -> SolverSpec:
    registry = get_registry()
    try:
        return registry.solvers[name]
    except KeyError:
        known = ", ".join(sorted(registry.solvers)) or "none (is a plugin installed?)"
        raise UnknownSolverError(f"unknown solver {name!r}; registered solvers: {known}") from None
