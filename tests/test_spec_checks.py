"""A broken spec or probe is refused with a message naming the plugin, the solver and the fault."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import core
from core.backend import safe_probe
from core.errors import PluginError
from core.solver import SizeSpace, check_spec
from core.validation import check_int


@dataclasses.dataclass(frozen=True)
class Job:
    n: int = 100
    label: str = "a"

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def _spec(**changes):
    base = dict(name="thirdparty.job", problem_type=Job, implementations={"numpy": lambda p: {"n": np.array(p.n)}},
                features=lambda p: {"n": float(p.n)}, size_axis="n", memory=lambda p, key: 8.0 * p.n,
                default_problem=Job, space=lambda quick: SizeSpace(ranges={"n": (10, 1e4)}))
    base.update(changes)
    return core.SolverSpec(**base)


def test_a_good_spec_passes():
    assert check_spec(_spec(), "tp").name == "thirdparty.job"
    assert check_spec(_spec(space=None, ladder=lambda quick: [Job(10), Job(100)]), "tp").ladder is not None


@pytest.mark.parametrize(("changes", "message"), [
    ({"features": lambda p: {"n": math.nan}},
     "plugin 'tp': solver 'thirdparty.job' feature 'n'=nan at the default problem is invalid: "
     "must be a finite number >= 0"),
    ({"features": lambda p: {"n": -1.0}},
     "plugin 'tp': solver 'thirdparty.job' feature 'n'=-1.0 at the default problem is invalid: "
     "must be a finite number >= 0"),
    ({"features": lambda p: [1.0]},
     "plugin 'tp': solver 'thirdparty.job' features() must return a non-empty mapping of name -> number, got list"),
    ({"space": None},
     "plugin 'tp': solver 'thirdparty.job' declares neither a size space nor a ladder: the core cannot calibrate it"),
    ({"space": None, "ladder": lambda quick: []},
     "plugin 'tp': solver 'thirdparty.job' ladder() must return a non-empty list of problems, got []"),
    ({"space": None, "ladder": lambda quick: [3, 4]},
     "plugin 'tp': solver 'thirdparty.job' ladder() holds a int, expected Job"),
    ({"space": lambda quick: {"n": (1, 10)}},
     "plugin 'tp': solver 'thirdparty.job' space() returned dict, expected core.SizeSpace"),
    ({"space": lambda quick: SizeSpace(ranges={})},
     "plugin 'tp': solver 'thirdparty.job' size space has no ranges: nothing to vary"),
    ({"space": lambda quick: SizeSpace(ranges={"m": (1, 10)})},
     "plugin 'tp': solver 'thirdparty.job' size space field 'm' is not a field of Job"),
    ({"space": lambda quick: SizeSpace(ranges={"n": (10, 1)})},
     "plugin 'tp': solver 'thirdparty.job' size space range n=(10, 1) is invalid: must be (low, high) with "
     "0 < low <= high"),
    ({"size_axis": "label"},
     "plugin 'tp': solver 'thirdparty.job' size_axis 'label' must be numeric, the default problem has 'a'"),
    ({"implementations": {"Numba-Fast": lambda p: {}}},
     "plugin 'tp': solver 'thirdparty.job' implementation key 'Numba-Fast' must be 'backend' or 'backend:variant' "
     "(lower case)"),
    ({"thread_items": {"numba:threads": lambda p: 1.0}},
     "plugin 'tp': solver 'thirdparty.job' thread_items names numba:threads, which are not its implementations"),
    ({"thread_items": {"numpy": lambda p: 1.0}},
     "plugin 'tp': solver 'thirdparty.job' thread_items needs a span_feature, the work the threads share"),
    ({"compile_cached": frozenset({"torch:fused"}), "compile_key": lambda p, key: ()},
     "plugin 'tp': solver 'thirdparty.job' compile_cached names torch:fused, which are not its implementations"),
    ({"compile_cached": "numpy", "compile_key": lambda p, key: ()},
     "plugin 'tp': solver 'thirdparty.job' compile_cached must be a set of implementation keys, got str 'numpy'"),
    ({"compile_cached": frozenset({1}), "compile_key": lambda p, key: ()},
     "plugin 'tp': solver 'thirdparty.job' compile_cached must be a set of implementation keys, got frozenset "
     "frozenset({1})"),
    ({"compile_cached": frozenset({"numpy"})},
     "plugin 'tp': solver 'thirdparty.job' compile_cached needs a compile_key, what a compile is cached by"),
    ({"implementation_features": {"numba:graph": lambda f: {"eager": 1.0}}},
     "plugin 'tp': solver 'thirdparty.job' implementation_features names numba:graph, which are not its "
     "implementations"),
    ({"implementation_features": {"numpy": lambda f: {"n": 2 * f["n"]}}},
     "plugin 'tp': solver 'thirdparty.job' implementation_features['numpy'] redefines n, which are the solver's "
     "own features"),
    ({"implementation_features": {"numpy": lambda f: {"launches": math.inf}}},
     "plugin 'tp': solver 'thirdparty.job' implementation_features['numpy']: feature 'launches'=inf at the default "
     "problem is invalid: must be a finite number >= 0"),
    ({"implementation_features": {"numpy": lambda f: {"launches": f["steps"]}}},
     "plugin 'tp': solver 'thirdparty.job': implementation_features['numpy']() raised KeyError: 'steps'"),
])
def test_a_broken_spec_is_refused_with_a_clear_message(changes, message):
    with pytest.raises(PluginError) as caught:
        check_spec(_spec(**changes), "tp")
    assert str(caught.value) == message


@pytest.mark.parametrize("answer", [True, (True, ""), None, "yes"])
def test_a_probe_must_answer_with_an_availability(answer):
    backend = core.Backend(name="odd", summary="odd", probe=lambda: answer)
    status = safe_probe(backend)
    assert not status.available
    assert status.reason == f"probe returned {type(answer).__name__}, expected core.Availability"
