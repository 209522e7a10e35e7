"""One task map for every parallel backend: a third party's backend runs the same work unchanged.

The fake backend (``tests/fake_parallel.py``) runs tasks on threads in
reverse order; with fixed seeds every result must equal the process pool's
and the serial reference's, bit for bit.
"""

from __future__ import annotations

import fake_parallel
import numpy as np
import process_tasks as pt
import pytest
import sweep_targets

import core
from core import tasks
from core.backends import process_pool, torch_gpu
from core.sweep import expand
from plugins.example.problem import RandomWalkProblem

WEIGHTS = np.linspace(0.5, 2.0, 16)


@pytest.fixture
def fake(fresh_registry):
    fake_parallel.CALLS.clear()
    return fake_parallel.register()


def test_fake_backend_gives_the_process_backends_results(fake):
    work = [3, 16, 1, 7, 5]
    runs = {backend: tasks.map_tasks(pt.weighted_draws, work, shared={"weights": WEIGHTS}, seed=99, backend=backend)
            for backend in ("fake", "process")}
    assert runs["fake"] == runs["process"] == tasks.run_serially(pt.weighted_draws, work,
                                                                  shared={"weights": WEIGHTS}, seed=99)
    assert fake_parallel.CALLS == [5]
    firsts = [draws[0] for draws in runs["fake"]]
    assert len(set(firsts)) == len(firsts)  # one stream per task


@pytest.mark.parametrize("backend", ["fake", "process"])
def test_each_result_is_streamed_once_with_its_index(fake, backend):
    seen = []
    results = tasks.map_tasks(pt.random_draws, [2, 4, 1, 3], seed=5, backend=backend,
                              on_result=lambda i, r: seen.append((i, r)))
    assert sorted(i for i, _ in seen) == [0, 1, 2, 3]
    assert all(results[i] == r for i, r in seen)


def test_backend_options_reach_the_backends_own_map(fake):
    seen = []
    results = tasks.map_tasks(pt.square_after_sleep, [(0, 1.0), (1, 0.0), (2, 0.0)], backend="process",
                              workers=2, on_result=lambda i, r: seen.append(i))
    assert results == [0, 1, 4] and seen[-1] == 0  # streamed as completed, returned in order


def test_a_failing_task_is_named_on_any_backend(fake):
    for backend in ("fake", "process"):
        with pytest.raises(core.TaskFailedError, match=r"task 2 .*bad value 2") as caught:
            tasks.map_tasks(pt.raise_on, [(i, 2) for i in range(4)], backend=backend)
        assert caught.value.partial_results == [0, 1, None, 3]


def test_names_that_cannot_map_are_clear_errors(fake):
    from core.registry import get_registry

    registered = list(get_registry().backends)  # the built-ins, the plugins' (ml's torch_cpu), then fake
    assert registered[:4] == ["numpy", "numba", "process", "torch"] and registered[-1] == "fake"
    with pytest.raises(core.UnknownBackendError) as caught:
        tasks.map_tasks(pt.random_draws, [1], backend="nope")
    assert str(caught.value) == f"unknown backend 'nope'; registered backends: {', '.join(registered)}"
    with pytest.raises(core.UnknownBackendError,
                       match=r"^backend 'numpy' cannot map tasks; backends that can: process, dask, fake$"):
        tasks.map_tasks(pt.random_draws, [1], backend="numpy")
    with pytest.raises(core.UnknownBackendError, match=r"backend 'numba' does not run tasks in parallel"):
        tasks.parallelism("numba")
    assert tasks.parallelism("fake") == fake_parallel.THREADS
    assert tasks.parallelism("process") == process_pool.default_workers()


def test_an_unavailable_mapping_backend_says_why(fresh_registry):
    class Offline:
        @core.hookimpl
        def crossover_backends(self) -> list:
            return [core.Backend(name="cluster", summary="a cluster that is not there",
                                 probe=lambda: core.Availability(False, "no scheduler at tcp://nowhere:8786"),
                                 map=fake_parallel.fake_map, parallelism=lambda: 64)]

    core.register(Offline(), name="offline")
    with pytest.raises(core.BackendUnavailableError,
                       match=r"^backend 'cluster' is unavailable here: no scheduler at tcp://nowhere:8786$"):
        tasks.map_tasks(pt.random_draws, [1], backend="cluster")


def test_sweep_on_the_fake_backend_matches_the_process_backend(fake):
    grid = {"seed": [1, 2, 3], "count": [4, 2]}
    streamed = []
    on_fake = core.sweep(sweep_targets.seeded_draws, grid, backend="fake",
                         on_result=lambda i, point: streamed.append((i, point.params)))
    on_pool = core.sweep(sweep_targets.seeded_draws, grid, backend="process")
    assert fake_parallel.CALLS == [6]
    assert [p.params for p in on_fake] == [p.params for p in on_pool] == expand(grid)
    for a, b in zip(on_fake, on_pool):
        assert a.ok and b.ok
        np.testing.assert_array_equal(a.outputs["draws"], b.outputs["draws"])
    assert sorted(streamed, key=lambda item: item[0]) == [(i, p.params) for i, p in enumerate(on_fake)]


def test_sweep_of_a_solver_on_the_fake_backend(fake):
    grid = [{"n_walkers": 3_000, "n_steps": 12, "seed": 4}, {"n_walkers": 2_000, "n_steps": 0}]
    on_fake = core.sweep("example.random_walk", grid, backend="fake")
    on_pool = core.sweep("example.random_walk", grid, backend="process")
    assert fake_parallel.CALLS == [2]
    for points, mapped_on in ((on_fake, "fake"), (on_pool, "process")):
        assert points[0].ok and points[0].backend == mapped_on  # the backend that ran the map, not what ran inside
        assert "n_steps=0 is invalid" in points[1].error
    for name, value in on_fake[0].outputs.items():
        np.testing.assert_array_equal(value, on_pool[0].outputs[name])


def test_sweep_failures_stay_with_their_point_on_the_fake_backend(fake):
    points = core.sweep(sweep_targets.fragile, {"x": [1, 2, 3, 4]}, backend="fake")
    assert [p.outputs["y"] for p in points if p.ok] == [1, 4, 16]
    assert points[2].error == "ValueError: three is not allowed"


def test_example_parallel_implementation_runs_unchanged_on_the_fake_backend(fake):
    spec = core.solvers()["example.random_walk"]
    problem = RandomWalkProblem(n_walkers=20_000, n_steps=15, chunk=3_000, seed=11)
    on_fake = spec.parallel(problem, backend="fake")
    on_pool = spec.parallel(problem, backend="process")
    serial = spec.implementations["numpy"](problem)
    assert fake_parallel.CALLS == [len(problem.chunks())]
    for name in serial:
        np.testing.assert_array_equal(on_fake[name], on_pool[name])
        np.testing.assert_array_equal(on_fake[name], serial[name])


def test_torch_start_never_raises_without_a_gpu():
    if torch_gpu.BACKEND.probe().available:
        pytest.skip("a GPU is present: the start creates its context (covered where one runs)")
    assert torch_gpu.BACKEND.start() is None


def test_plugin_guide_thread_backend_runs_the_example_unchanged(tmp_path, monkeypatch, fresh_registry):
    from test_docs import import_block

    plugin = import_block(tmp_path, monkeypatch, "plugins.md", "thread_backend.py")
    core.register(plugin, name="docs_thread_backend")
    spec = core.solvers()["example.random_walk"]
    problem = RandomWalkProblem(n_walkers=9_000, n_steps=8, chunk=2_000, seed=3)
    on_threads, on_pool = spec.parallel(problem, backend="threads"), spec.parallel(problem, backend="process")
    for name in on_pool:
        np.testing.assert_array_equal(on_threads[name], on_pool[name])
    streamed = []
    assert tasks.map_tasks(pt.raise_on, [(0, 9), (1, 9)], backend="threads",
                           on_result=lambda i, r: streamed.append(i)) == [0, 1]
    assert sorted(streamed) == [0, 1]
    with pytest.raises(core.TaskFailedError, match=r"task 1 \(\(1, 1\)\) failed: bad value 1"):
        tasks.map_tasks(pt.raise_on, [(0, 1), (1, 1)], backend="threads")
