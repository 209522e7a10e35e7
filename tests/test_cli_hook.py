"""Plugins add commands to the CLI through the ``crossover_cli`` hook, without editing core/cli.py."""

from __future__ import annotations

import json

import pytest

import core
from core.cli import FAULT, USER_ERROR, main


def _greet(args) -> int:
    print(f"hello, {args.name}")
    return 3 if args.name == "three" else 0


def _complain(args) -> int:
    raise core.ProblemError(f"name={args.name!r} is invalid: must be polite")


class Greeter:
    """A plugin whose only contribution is two commands."""

    @core.hookimpl
    def crossover_cli(self, subparsers) -> None:
        greet = subparsers.add_parser("greet", help="say hello")
        greet.add_argument("--name", default="world")
        greet.set_defaults(handler=_greet)
        complain = subparsers.add_parser("complain", help="a user mistake")
        complain.add_argument("name")
        complain.set_defaults(handler=_complain)


class Broken:
    """Adds a command, then raises: none of its commands may stay."""

    @core.hookimpl
    def crossover_cli(self, subparsers) -> None:
        subparsers.add_parser("half", help="never usable").set_defaults(handler=_greet)
        raise RuntimeError("config file missing")


class Usurper:
    @core.hookimpl
    def crossover_cli(self, subparsers) -> None:
        subparsers.add_parser("run", help="not the real run").set_defaults(handler=_greet)


class NoHandler:
    @core.hookimpl
    def crossover_cli(self, subparsers) -> None:
        subparsers.add_parser("idle", help="forgot set_defaults")


def test_a_plugin_adds_a_command(fresh_registry, capsys):
    core.register(Greeter(), name="greeter")
    assert main(["greet", "--name", "crossover"]) == 0
    assert capsys.readouterr().out == "hello, crossover\n"
    assert main(["greet", "--name", "three"]) == 3  # the handler's status is the exit status
    assert main(["complain", "rude"]) == USER_ERROR
    assert "crossover: error: name='rude' is invalid: must be polite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "greet" in capsys.readouterr().out


# the CLI prints its plugin warnings as one line on stderr: let them through to it
# (pytest's configuration turns a PluginWarning into an error)
LET_WARNINGS_THROUGH = pytest.mark.filterwarnings("always::core.errors.PluginWarning")


@LET_WARNINGS_THROUGH
def test_a_broken_hook_is_a_warning_and_the_cli_still_works(fresh_registry, capsys):
    core.register(Broken(), name="broken_cli")
    core.register(Greeter(), name="greeter")
    assert main(["backends", "--json"]) == 0
    captured = capsys.readouterr()
    assert "numpy" in [row["name"] for row in json.loads(captured.out)]
    assert captured.err == ("crossover: warning: crossover plugin 'broken_cli': its crossover_cli hook raised "
                            "RuntimeError: config file missing; its commands are left out\n")
    assert main(["greet"]) == 0
    with pytest.raises(SystemExit) as exited:
        main(["half"])  # taken back out: argparse rejects it as an unknown command
    assert exited.value.code == 2
    assert "invalid choice: 'half'" in capsys.readouterr().err


def test_a_broken_hook_is_an_error_when_strict(fresh_registry, monkeypatch, capsys):
    core.register(Broken(), name="broken_cli")
    monkeypatch.setenv("CROSSOVER_PLUGINS_STRICT", "1")
    assert main(["backends"]) == FAULT
    assert "plugin 'broken_cli'" in capsys.readouterr().err


@LET_WARNINGS_THROUGH
def test_built_in_commands_cannot_be_replaced(fresh_registry, capsys):
    core.register(Usurper(), name="usurper")
    assert main(["run", "example.random_walk", "--backend", "numpy", "--param", "n_walkers=100", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["solver"] == "example.random_walk"
    assert ("plugin 'usurper': its crossover_cli hook raised PluginError: command 'run' is a built-in command; "
            "a plugin cannot replace it") in captured.err


@LET_WARNINGS_THROUGH
def test_two_plugins_cannot_take_one_name(fresh_registry, capsys):
    core.register(Greeter(), name="greeter")
    core.register(Greeter(), name="greeter_again")
    assert main(["greet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "hello, world\n"
    assert "command 'greet' was already added by plugin 'greeter" in captured.err


def test_a_command_without_a_handler_is_named(fresh_registry, capsys):
    core.register(NoHandler(), name="no_handler")
    assert main(["idle"]) == FAULT
    assert "command 'idle' names no function to run" in capsys.readouterr().err


def test_plugin_guide_cli_example_runs_as_printed(tmp_path, monkeypatch, fresh_registry, capsys):
    from test_docs import import_block

    plugin = import_block(tmp_path, monkeypatch, "plugins.md", "hello_cli.py")
    core.register(plugin, name="docs_hello_cli")
    assert main(["hello", "--name", "plugin-author"]) == 0
    assert capsys.readouterr().out == "hello, plugin-author\n"
