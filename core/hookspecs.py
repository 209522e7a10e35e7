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


@hookspec
def crossover_cli(subparsers) -> None:
    """Add subcommands to the ``crossover`` command line.

    ``subparsers`` is the command line's subcommand group. Add each command
    with ``parser = subparsers.add_parser(name, help=...)``, give it its
    arguments with ``parser.add_argument(...)``, and name the function that
    runs it with ``parser.set_defaults(handler=fn)``. ``fn(args)`` receives
    the parsed ``argparse.Namespace`` and returns the exit status (0 for
    success). Raise :class:`core.CrossoverError` for a user's mistake: the
    CLI prints its message on one line and exits with status 2.

    Called once per plugin each time the CLI builds its parser, so keep it
    cheap: import heavy libraries inside ``fn``. A built-in command's name,
    or one another plugin already took, cannot be used. A hook that raises
    leaves all of its plugin's commands out, with a
    :class:`core.PluginWarning` naming the plugin (an error under
    ``CROSSOVER_PLUGINS_STRICT=1``); every other command keeps working.
    """
