"""Plugin discovery through real entry points, and defensive loading."""

from __future__ import annotations

import textwrap
import types
import uuid

import pytest

import core
from core import PluginError, PluginWarning
from core.registry import get_registry

THIRD_PARTY = '''
from dataclasses import dataclass

import numpy as np

import core
from core.validation import check_int


@dataclass(frozen=True)
class CountProblem:
    n: int = 10

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def triangular(problem):
    return {"total": np.arange(problem.n + 1).sum()}


@core.hookimpl
def crossover_solvers():
    return [core.SolverSpec(
        name="{prefix}.triangular",
        problem_type=CountProblem,
        implementations={"numpy": triangular},
        features=lambda p: {"n": p.n},
        size_axis="n",
        ladder=lambda quick: [CountProblem(n) for n in (10, 100)],
        memory=lambda p, b: 8.0 * p.n,
        default_problem=CountProblem,
    )]
'''


def install_plugin(tmp_path, monkeypatch, source: str, entry_name: str | None = None) -> str:
    """Install a module through a real dist-info on a temporary sys.path entry; return its name."""
    module = f"thirdparty_{uuid.uuid4().hex[:8]}"
    entry_name = entry_name or module
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    dist_info = tmp_path / f"{module}-1.2.3.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.2.3\n")
    (dist_info / "entry_points.txt").write_text(f"[crossover.plugins]\n{entry_name} = {module}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def test_third_party_plugin_is_discovered_and_runs(tmp_path, monkeypatch, fresh_registry):
    module = install_plugin(tmp_path, monkeypatch, THIRD_PARTY.replace("{prefix}", "acme"))
    assert "acme.triangular" in core.solvers()
    info = get_registry().plugins[module]
    assert info.version == "1.2.3" and info.solvers == ["acme.triangular"]
    spec = core.solvers()["acme.triangular"]
    result = core.solve(spec.problem_type(n=100), backend="numpy")
    assert int(result["total"]) == 100 * 101 // 2
    # built-ins are still there
    assert "example.random_walk" in core.solvers()


def test_plugin_that_fails_to_import_warns_and_builtins_still_work(tmp_path, monkeypatch, fresh_registry):
    module = install_plugin(tmp_path, monkeypatch, "raise ImportError('needs libfoo 3')\n")
    with pytest.warns(PluginWarning, match=rf"plugin '{module}'.*failed to import.*needs libfoo 3"):
        names = core.solvers()
    assert "example.random_walk" in names
    result = core.solve(core.solvers()["example.random_walk"].problem_type(n_walkers=100), backend="numpy")
    assert result.outputs["histogram"].sum() == 100
    assert get_registry().plugins[module].error


def test_strict_mode_raises(tmp_path, monkeypatch, fresh_registry):
    module = install_plugin(tmp_path, monkeypatch, "raise ImportError('needs libfoo 3')\n")
    monkeypatch.setenv("CROSSOVER_PLUGINS_STRICT", "1")
    with pytest.raises(PluginError, match=rf"plugin '{module}'.*needs libfoo 3"):
        core.solvers()


def test_broken_spec_is_skipped_with_a_warning(tmp_path, monkeypatch, fresh_registry):
    source = THIRD_PARTY.replace("{prefix}", "acme").replace('size_axis="n"', 'size_axis="nope"')
    module = install_plugin(tmp_path, monkeypatch, source)
    with pytest.warns(PluginWarning, match=rf"'{module}'.*size_axis 'nope'"):
        assert "acme.triangular" not in core.solvers()


def test_hookimpl_without_hookspec_is_caught(tmp_path, monkeypatch, fresh_registry):
    source = "import core\n\n@core.hookimpl\ndef crossover_solverz():\n    return []\n"
    module = install_plugin(tmp_path, monkeypatch, source)
    with pytest.warns(PluginWarning, match=rf"'{module}'.*crossover_solverz"):
        core.solvers()


def test_autoload_can_be_turned_off_and_register_still_works(tmp_path, monkeypatch, fresh_registry):
    install_plugin(tmp_path, monkeypatch, THIRD_PARTY.replace("{prefix}", "acme"))
    monkeypatch.setenv("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert core.solvers() == {}
    assert set(core.backends(describe=False)) >= {"numpy", "numba", "process", "torch"}
    import plugins.example

    core.register(plugins.example, name="example")
    assert list(core.solvers()) == ["example.random_walk"]


def test_duplicate_solver_names_are_rejected(tmp_path, monkeypatch, fresh_registry):
    import importlib

    module = install_plugin(tmp_path, monkeypatch, THIRD_PARTY.replace("{prefix}", "acme"))
    core.solvers()
    clone = importlib.import_module(module)
    with pytest.raises(PluginError, match=r"solver 'acme.triangular' .* already registered by plugin"):
        core.register(types.SimpleNamespace(crossover_solvers=clone.crossover_solvers), name="clone")
    # the registry is unchanged: the original still runs and no half-registered plugin remains
    assert "clone" not in get_registry().plugins
    assert get_registry().solver_owner["acme.triangular"] == module


def test_duplicate_solver_from_entry_points_is_skipped(tmp_path, monkeypatch, fresh_registry):
    source = THIRD_PARTY.replace("{prefix}", "example").replace(".triangular", ".random_walk")
    module = install_plugin(tmp_path, monkeypatch, source, entry_name="zzz_clash")
    with pytest.warns(PluginWarning, match=r"'zzz_clash'.*'example.random_walk'.*already registered"):
        specs = core.solvers()
    assert specs["example.random_walk"].problem_type.__module__ == "plugins.example.problem"
    assert module not in get_registry().plugins


def test_plugin_returning_garbage_is_rejected(fresh_registry):
    class Garbage:
        @core.hookimpl
        def crossover_solvers(self):
            return ["not a spec"]

    with pytest.raises(PluginError, match=r"plugin 'garbage' returned str, expected core.SolverSpec"):
        core.register(Garbage(), name="garbage")


def test_third_party_backend(fresh_registry):
    class Extra:
        @core.hookimpl
        def crossover_backends(self):
            return [core.Backend(name="fpga", summary="imaginary", probe=lambda: core.Availability(False, "no card"))]

    core.register(Extra(), name="extra")
    status = core.backends()["fpga"]
    assert not status.available and status.reason == "no card"
    core.unregister("extra")
    assert "fpga" not in core.backends()


def test_registering_the_same_plugin_twice_leaves_the_first_intact(fresh_registry):
    import plugins.example

    core.solvers()
    with pytest.raises(PluginError, match=r"plugin 'again' is already registered as 'example'"):
        core.register(plugins.example, name="again")
    assert get_registry().manager.is_registered(plugins.example)
    assert "example.random_walk" in core.solvers()


def test_core_backends_cannot_be_unregistered(fresh_registry):
    with pytest.raises(PluginError, match="cannot be unregistered"):
        core.unregister("core")
    assert "numpy" in core.backends(describe=False)
