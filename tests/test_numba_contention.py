"""Numba under contention: crossover bounds OpenMP spinning before Numba's threading layer loads.

Spinning threads stalled a small numba solve for a whole time slice on a
busy host (:mod:`core.backends.openmp_spin` says why and what is set). The
OpenMP runtime reads its settings once, when Numba loads it, so these tests
check *when* the settings are in place, and that a user's own choice is
left alone. How much time it saves is measured by
``docs/scripts/numba_stall_probe.py``, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from core.backends import openmp_spin

# In a fresh interpreter: record the environment at the moment Numba imports its threading layer (the
# import that loads the OpenMP runtime), then start the numba backend, which runs a parallel kernel.
_ENVIRONMENT_AT_LAYER_LOAD = """
import json, os, sys

LAYERS = ("numba.np.ufunc.omppool", "numba.np.ufunc.tbbpool", "numba.np.ufunc.workqueue")
seen = {}

def hook(event, args):
    if event == "import" and args[0] in LAYERS and not seen:
        seen.update({name: os.environ.get(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")})

sys.addaudithook(hook)
import core
from core.backends import numba_threads, openmp_spin

numba_threads.start()
import numba

print(json.dumps({"layer": numba.threading_layer(), "at_load": seen, "describe": openmp_spin.describe(),
                  "backend": numba_threads.BACKEND.describe()["openmp_spin"]}))
"""


def _fresh_process(**settings: str) -> dict:
    """Run the script above with only ``settings`` among the spin variables (this process has crossover's)."""
    pytest.importorskip("numba")
    env = {name: value for name, value in os.environ.items() if name not in openmp_spin.USER_CHOICES}
    done = subprocess.run([sys.executable, "-c", _ENVIRONMENT_AT_LAYER_LOAD], capture_output=True, text=True,
                          timeout=300, env={**env, **settings})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_limits_are_in_place_when_numba_loads_its_threading_layer():
    found = _fresh_process()
    assert found["at_load"] == {"OMP_WAIT_POLICY": None, **openmp_spin.LIMITS}
    limits = " ".join(f"{name}={value}" for name, value in openmp_spin.LIMITS.items())
    assert found["describe"] == found["backend"] == f"{limits} (crossover's)"


@pytest.mark.parametrize("choice", [{"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "300000"}])
def test_a_users_own_choice_is_left_alone(choice):
    found = _fresh_process(**choice)
    expected = dict.fromkeys(openmp_spin.USER_CHOICES) | choice
    assert found["at_load"] == expected
    name, value = next(iter(choice.items()))
    assert found["describe"] == f"{name}={value} (the user's)"


@pytest.fixture
def undecided(monkeypatch):
    """openmp_spin before its first call, in an environment restored after the test."""
    monkeypatch.setattr(openmp_spin, "_state", None)
    with mock.patch.dict(os.environ):
        for name in openmp_spin.USER_CHOICES:
            os.environ.pop(name, None)
        yield


def test_the_first_call_decides_once(undecided, monkeypatch):
    monkeypatch.setattr(openmp_spin, "_numba_layer_loaded", lambda: False)  # other tests may have loaded it
    openmp_spin.limit_spinning()
    assert {name: os.environ.get(name) for name in openmp_spin.LIMITS} == openmp_spin.LIMITS
    os.environ["GOMP_SPINCOUNT"] = "5"  # changed later, by the user: not crossover's to override
    openmp_spin.limit_spinning()
    assert os.environ["GOMP_SPINCOUNT"] == "5"


def test_too_late_sets_nothing_and_says_so(undecided, monkeypatch):
    monkeypatch.setattr(openmp_spin, "_numba_layer_loaded", lambda: True)
    openmp_spin.limit_spinning()
    assert not any(name in os.environ for name in openmp_spin.USER_CHOICES)
    assert "loaded before crossover could bound its spinning" in openmp_spin.describe()
