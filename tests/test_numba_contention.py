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


# ---- yielding busy cores (core.backends.host_load) ----

from core.backends import host_load  # noqa: E402


class FakeHost:
    """``/proc/stat`` with two CPUs in this process's affinity and one outside it, and the two clocks."""

    def __init__(self, tmp_path, monkeypatch):
        self.path = tmp_path / "stat"
        self.wall = 100.0
        self.own = 10.0
        self.busy = {0: 0, 1: 0, 7: 0}  # ticks
        monkeypatch.setattr(host_load, "_STAT", str(self.path))
        monkeypatch.setattr(host_load, "_TICK", 0.01)
        monkeypatch.setattr(host_load, "_mark", None)
        monkeypatch.setattr(host_load, "_others", 0.0)
        monkeypatch.setattr(host_load.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
        monkeypatch.setattr(host_load, "usable_cores", lambda: 2)
        monkeypatch.setattr(host_load.time, "monotonic", lambda: self.wall)
        monkeypatch.setattr(host_load.time, "process_time", lambda: self.own)
        self.write()

    def write(self) -> None:
        total = sum(self.busy.values())
        lines = [f"cpu  {total} 0 0 999 0 0 0 0 0 0"]
        # user nice system idle iowait irq softirq steal: busy ticks split over user, system, irq and steal
        lines += [f"cpu{n} {b - 3 * (b // 4)} 0 {b // 4} 999 5 {b // 4} 0 {b // 4} 0 0" for n, b in self.busy.items()]
        self.path.write_text("\n".join([*lines, "intr 1 2 3", "procs_running 1"]) + "\n")

    def advance(self, seconds: float, own: float, others: dict[int, float]) -> None:
        """``seconds`` pass; this process uses ``own`` CPU seconds on CPU 0, others use ``others`` per CPU."""
        self.wall += seconds
        self.own += own
        self.busy[0] += round(own * 100)
        for cpu, used in others.items():
            self.busy[cpu] += round(used * 100)
        self.write()


def test_a_core_kept_busy_by_another_process_is_left_to_it(tmp_path, monkeypatch):
    host = FakeHost(tmp_path, monkeypatch)
    assert host_load.idle_cores() == 2  # no window yet: an idle host, as before
    host.advance(0.5, own=0.6, others={1: 0.5, 7: 0.5})  # a competitor holds CPU 1; CPU 7 is not ours
    assert host_load.others_busy_cores() == pytest.approx(1.0)
    assert host_load.idle_cores() == 1
    host.advance(0.05, own=0.05, others={})  # within the window: the last answer stands, the file is not read
    host.path.unlink()
    assert host_load.idle_cores() == 1
    host.write()
    host.advance(0.5, own=0.9, others={1: 0.1})  # this process's own spinning threads are not the others'
    assert host_load.others_busy_cores() == pytest.approx(0.1 / 0.55)  # the window began before the 0.05 s
    assert host_load.idle_cores() == 2


def test_the_switch_and_an_unreadable_host_leave_every_core_idle(tmp_path, monkeypatch):
    host = FakeHost(tmp_path, monkeypatch)
    host_load.idle_cores()
    host.advance(1.0, own=0.0, others={0: 1.0, 1: 1.0})
    monkeypatch.setenv(host_load.SWITCH, "0")
    assert host_load.idle_cores() == 2
    monkeypatch.setenv(host_load.SWITCH, "1")
    assert host_load.idle_cores() == 1  # never fewer than one
    host.advance(1.0, own=0.0, others={0: 1.0, 1: 1.0})
    host.path.unlink()
    assert host_load.idle_cores() == 2
    monkeypatch.setenv(host_load.SWITCH, "sometimes")
    with pytest.raises(ValueError, match=host_load.SWITCH):
        host_load.idle_cores()


def test_a_kernel_that_yields_cores_gives_the_same_answer(monkeypatch):
    """The random walk runs on the idle cores only; its answer is the same bits on any thread count."""
    numba = pytest.importorskip("numba")
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs a Numba pool of two threads or more")
    from core.backends import numba_threads
    from plugins.example.numba_kernel import solve_numba
    from plugins.example.problem import RandomWalkProblem

    problem = RandomWalkProblem(n_walkers=4001, n_steps=33, seed=11)
    seen: list[int] = []
    real = numba_threads.host_load.idle_cores
    for idle in (1, 2):
        monkeypatch.setattr(numba_threads.host_load, "idle_cores", lambda idle=idle: idle)
        with numba_threads.threads_at_most(problem.n_walkers) as threads:
            seen.append(threads)
        if idle == 1:
            busy = solve_numba(problem)
        else:
            quiet = solve_numba(problem)
    monkeypatch.setattr(numba_threads.host_load, "idle_cores", real)
    assert seen == [1, 2]
    assert quiet.keys() == busy.keys()
    for name in quiet:
        assert quiet[name].tobytes() == busy[name].tobytes(), name


def test_a_map_of_this_process_is_not_taken_for_another_process(tmp_path, monkeypatch):
    """Its workers' CPU time was this process's own work: after the map, the next kernel takes every core."""
    from core import tasks
    from core.backend import Availability, Backend

    def in_line(fn, items, shared=None, seed=None, labels=None, on_result=None):
        return [fn(item, shared, seed) for item in items]

    pool = Backend(name="inline", summary="maps here", probe=lambda: Availability(True), map=in_line)
    monkeypatch.setattr(tasks, "backend_for_map", lambda name: pool)
    host = FakeHost(tmp_path, monkeypatch)
    host_load.idle_cores()
    host.advance(1.0, own=0.0, others={0: 1.0, 1: 1.0})  # the map's workers, as /proc/stat sees them
    assert host_load.idle_cores() == 1
    assert tasks.map_tasks(_square, [1, 2, 3], backend="inline") == [1, 4, 9]
    assert host_load.idle_cores() == 2


def _square(task, shared, seed):
    return task * task


@pytest.mark.parametrize(("items", "fewer", "more", "yields"), [
    (2, 1, 2, True),  # the 2-core VM beside one process: each thread's share of a core halves anyway
    (1518, 15, 16, True),  # many small items: the busiest thread gains about the yielded share
    (16, 15, 16, False),  # a block per thread: on 15 threads one runs two blocks, twice the time
    (64, 15, 16, False),  # 5 blocks for the busiest thread instead of 4
    (3, 1, 2, True),
])
def test_cores_are_yielded_only_where_the_items_divide_over_the_rest(items, fewer, more, yields):
    from core.backends import numba_threads

    assert numba_threads._divides_as_well(items, fewer, more) is yields


def test_a_kernel_of_few_blocks_keeps_its_threads(monkeypatch):
    numba = pytest.importorskip("numba")
    from core.backends import numba_threads

    pool = int(numba.get_num_threads())
    monkeypatch.setattr(numba_threads.host_load, "idle_cores", lambda: max(1, pool - 1))
    assert numba_threads.threads_for(1) == 1
    assert numba_threads.threads_for(10**6) == max(1, pool - 1)  # fine items: the busy core is left alone
    if pool >= 4:  # a block per thread: yielding a core would double the busiest thread's work
        assert numba_threads.threads_for(pool) == pool


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_window(tmp_path, monkeypatch):
    """Its CPU time starts at zero: the parent's window would read the parent's work as the others'."""
    host = FakeHost(tmp_path, monkeypatch)
    host_load.idle_cores()
    host.advance(1.0, own=0.5, others={})
    host_load.idle_cores()
    assert host_load._mark is not None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it kept the parent's window
        os.write(write, b"kept" if host_load._mark is not None else b"fresh")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"fresh"


@pytest.mark.parametrize(("others", "idle"), [(0.0, 4), (0.45, 4), (0.55, 3), (0.67, 3), (0.99, 3), (1.4, 3),
                                              (1.6, 2), (9.0, 1)])
def test_a_core_is_yielded_once_others_use_half_of_it(monkeypatch, others, idle):
    """A competitor sharing the cores with this process's threads gets only part of one: it still counts."""
    monkeypatch.setattr(host_load, "usable_cores", lambda: 4)
    monkeypatch.setattr(host_load, "others_busy_cores", lambda: others)
    monkeypatch.delenv(host_load.SWITCH, raising=False)
    assert host_load.idle_cores() == idle
