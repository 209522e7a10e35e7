"""The plugin contract: the hooks a crossover plugin may implement.

A plugin is any module or object with functions decorated by
``core.hookimpl``. Register it through the ``crossover.plugins`` entry-point
group, or at run time with ``core.register(plugin)``.
"""

from __future__ import annotations

import pluggy

PROJECT = "crossover"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def crossover_solvers() -> list:
    """Return the :class:`core.SolverSpec` records this plugin provides.

    Each name must be unique across all plugins (``"plugin.solver"``); a
    duplicate is rejected. Called once when the registry is built, so it
    should be cheap: import heavy libraries inside the implementations.
    """


@hookspec
def crossover_backends() -> list:
    """Return extra :class:`core.Backend` records this plugin provides.

    A backend's ``probe`` must be cheap and must not raise; solvers opt in
    to it by listing an implementation under the backend's name.
    """
