"""One broken plugin of each kind never stops the others (issue 9, "Plugins").

Each case installs a third-party plugin through a real entry point next to
the built-ins. The plugin is healthy except for one fault: at import, in a
hook, or in one of its spec's or backend's functions, which raise only
*after* registration (registration calls some of them once, and a plugin
that fails there is skipped, which is a different path). Then the
registry loads, a built-in solver plans and solves, and calibrating the
broken solver next to a built-in one calibrates the built-in and blames
the plugin by name.
"""

from __future__ import annotations

import textwrap

import pytest

import core
from core import PluginError, PluginWarning
from core.costmodel.calibrate import calibrate
from core.errors import AutoSelectionError, ProblemError
from core.registry import get_registry
from tests.test_registry import install_plugin

# a plugin with one solver and one backend, each function able to fail after its first `grace` calls
BROKEN = '''
import sys
from dataclasses import dataclass

import numpy as np

import core
from core.solver import SizeSpace
from core.validation import check_int

FAULT = "{fault}"
_calls = {{}}


def maybe_fail(where, grace=0):
    _calls[where] = _calls.get(where, 0) + 1
    if FAULT == where and _calls[where] > grace:
        if where.endswith("exit"):
            sys.exit(3)
        raise ZeroDivisionError(f"{{where}} is broken")


maybe_fail("import")
maybe_fail("import_exit")


@dataclass(frozen=True)
class CountProblem:
    n: int = 10

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def triangular(problem):
    maybe_fail("solve")
    return {{"total": np.arange(problem.n + 1).sum()}}


def features(problem):
    maybe_fail("features", grace=2)  # registration calls it twice
    maybe_fail("features_exit", grace=2)
    return {{"n": float(problem.n)}}


def space(quick):
    maybe_fail("space", grace=2)
    return SizeSpace(ranges={{"n": (10, 1000)}})


def memory(problem, implementation):
    maybe_fail("memory")
    return 8.0 * problem.n


def default_problem():
    maybe_fail("default_problem", grace=1)
    return CountProblem()


def free_memory():
    maybe_fail("free_memory")
    return 1e9


@core.hookimpl
def crossover_solvers():
    maybe_fail("hook")
    return [core.SolverSpec(name="acme.triangular", problem_type=CountProblem,
                            implementations={{"numpy": triangular, "acme": triangular}},
                            features=features, size_axis="n", space=space, memory=memory,
                            default_problem=default_problem)]


@core.hookimpl
def crossover_backends():
    return [core.Backend(name="acme", summary="a third party's device",
                         probe=lambda: core.Availability(True), free_memory=free_memory)]
'''

# faults that stop the plugin from loading at all: the registry skips it with a warning
LOAD_FAULTS = ["import", "import_exit", "hook"]
# faults in functions the core calls while planning and calibrating
RUN_FAULTS = ["features", "features_exit", "space", "memory", "default_problem", "free_memory", "solve"]


def _install(tmp_path, monkeypatch, fault: str) -> str:
    return install_plugin(tmp_path, monkeypatch, textwrap.dedent(BROKEN).format(fault=fault), entry_name="acme")


def _builtins_still_work() -> None:
    from plugins.example.problem import RandomWalkProblem

    result = core.solve(RandomWalkProblem(n_walkers=200, n_steps=5, seed=1), backend="numpy")
    assert result.outputs["histogram"].sum() == 200


@pytest.mark.parametrize("fault", LOAD_FAULTS)
def test_a_plugin_that_fails_to_load_is_skipped_by_name(tmp_path, monkeypatch, fresh_registry, fault):
    _install(tmp_path, monkeypatch, fault)
    with pytest.warns(PluginWarning, match=r"plugin 'acme'.*(ZeroDivisionError|SystemExit)"):
        solvers = core.solvers()
    assert "acme.triangular" not in solvers and "example.random_walk" in solvers
    assert get_registry().plugins["acme"].error
    _builtins_still_work()


@pytest.mark.parametrize("fault", RUN_FAULTS)
def test_a_fault_at_run_time_blames_the_plugin_and_the_rest_goes_on(tmp_path, monkeypatch, fresh_registry,
                                                                     empty_cache, fault):
    _install(tmp_path, monkeypatch, fault)
    assert "acme.triangular" in core.solvers()  # registration itself went fine
    with pytest.warns(PluginWarning) if fault == "free_memory" else _no_warning():
        reports = calibrate(["acme.triangular", "example.random_walk"], budget=1.0)
    broken, builtin = reports
    # the built-in next to it was calibrated in full
    assert builtin.error == "" and any(row.samples > 0 for row in builtin.backends)
    # the broken one says what broke and whose it is, on its row or on the implementation that failed
    said = broken.error + " ".join(row.stopped for row in broken.backends)
    if fault in ("free_memory",):  # unknown free memory is no fault of planning: calibrated as usual
        assert all(row.samples > 0 for row in broken.backends), said
    elif fault == "solve":  # an implementation's own error: it stops itself and says what it raised
        assert all(row.samples == 0 and "ZeroDivisionError: solve is broken" in row.stopped
                   for row in broken.backends), said
    else:
        assert "plugin 'acme'" in said and "acme.triangular" in said, said
    _builtins_still_work()


@pytest.mark.parametrize("fault", ["features", "features_exit", "memory"])
def test_planning_a_broken_solver_gives_one_clear_error(tmp_path, monkeypatch, fresh_registry, empty_cache, fault):
    _install(tmp_path, monkeypatch, "none")
    spec = core.solvers()["acme.triangular"]
    calibrate(["acme.triangular"], budget=1.0)
    module = __import__(spec.problem_type.__module__)
    module.FAULT = fault
    with pytest.raises((PluginError, AutoSelectionError)) as caught:
        core.plan(spec.problem_type(n=50))
    message = str(caught.value)
    assert "acme" in message and ("ZeroDivisionError" in message or "SystemExit" in message), message
    assert "\n" not in message


def test_a_built_in_keeps_its_solver_name_against_a_third_party_listed_first(tmp_path, monkeypatch,
                                                                               fresh_registry):
    from tests.test_registry import THIRD_PARTY

    source = THIRD_PARTY.replace("{prefix}", "example").replace(".triangular", ".random_walk")
    install_plugin(tmp_path, monkeypatch, source, entry_name="aaa_first")  # sorts before "example"
    with pytest.warns(PluginWarning, match=r"'aaa_first'.*'example.random_walk'.*already registered"):
        specs = core.solvers()
    assert specs["example.random_walk"].problem_type.__module__ == "plugins.example.problem"
    assert get_registry().solver_owner["example.random_walk"] == "example"


@pytest.mark.parametrize("value", ["maybe", "2", "yes please"])
def test_a_misspelt_strict_flag_is_an_error_even_when_no_plugin_fails(monkeypatch, fresh_registry, value):
    monkeypatch.setenv("CROSSOVER_PLUGINS_STRICT", value)
    with pytest.raises(ProblemError, match=rf"CROSSOVER_PLUGINS_STRICT={value!r} is invalid"):
        core.solvers()


def _no_warning():
    import contextlib

    return contextlib.nullcontext()


def test_crossover_calibrate_names_the_broken_solver_and_calibrates_the_rest(tmp_path, monkeypatch, fresh_registry,
                                                                             empty_cache, capsys):
    import json

    from core.cli import main

    _install(tmp_path, monkeypatch, "space")
    assert main(["calibrate", "acme.triangular", "example.random_walk", "--budget", "1", "--json"]) == 1
    rows = {row["solver"]: row for row in json.loads(capsys.readouterr().out)}
    assert "plugin 'acme'" in rows["acme.triangular"]["error"] and "space() raised" in rows["acme.triangular"]["error"]
    assert rows["example.random_walk"]["error"] == ""
    assert any(b["samples"] > 0 for b in rows["example.random_walk"]["backends"])
