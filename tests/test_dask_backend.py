"""The ``dask`` backend: configuration, clear errors, and maps on a real two-worker LocalCluster.

What is checked against an independent truth:

- every map's results equal :func:`core.tasks.run_serially`'s at the same
  seed, and solvers and sweeps give what the process pool or a run in this
  process gives;
- the cluster that ``local`` starts listens on 127.0.0.1 only;
- shared inputs are scattered once and arrive read-only; short tasks are
  batched (fewer dask tasks than tasks), long ones are not;
- on the local cluster, idle workers' cores go to the last running task
  (as on the process pool), unless switched off, and change no result;
- importing ``core`` (and listing backends, with a scheduler configured)
  never imports dask.

The faults (a worker or the scheduler killed mid-sweep) are in
``test_dask_faults.py``.
"""

from __future__ import annotations

import ast
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import dask_targets
import numpy as np
import process_tasks as pt
import psutil  # a dependency of distributed
import pytest
import sweep_targets

import core
from core import tasks
from core.backends import core_lending, dask_cluster
from core.costmodel import calibrate, history
from core.costmodel.features import ROUNDS, SPAN, model_features
from core.errors import BackendUnavailableError, ProblemError, TaskFailedError, UnpicklableTaskError
from core.running import forget_probes
from core.solver import problem_from_params
from core.sweep import sweep
from plugins.mfg.fp.layout import PARTICLES_PER_THREAD

ROOT = Path(__file__).resolve().parents[1]
SMALL_NOISE = {"preset": "lq", "K": 3, "N": 300, "Nx": 21, "Nt": 5, "max_iter": 2}


@pytest.fixture
def no_scheduler(monkeypatch):
    """No scheduler from the environment or from use_scheduler; probes forgotten before and after."""
    monkeypatch.delenv(dask_cluster.SCHEDULER_VARIABLE, raising=False)
    monkeypatch.delenv(dask_cluster.TIMEOUT_VARIABLE, raising=False)
    dask_cluster.use_scheduler(None)
    forget_probes()
    yield
    dask_cluster.use_scheduler(None)
    forget_probes()


@pytest.fixture(scope="module")
def local_cluster():
    """One two-worker LocalCluster for this module's maps (starting one costs a few seconds)."""
    dask_cluster.use_scheduler("local", workers=2)
    forget_probes()
    before = dict(os.environ)
    dask_cluster.start()
    # the nannies set thread variables here before spawning; the backend puts this process's back
    assert dict(os.environ) == before
    yield dask_cluster.get_client()
    dask_cluster.use_scheduler(None)
    forget_probes()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_importing_core_does_not_import_dask():
    code = ("import sys, core; core.backends(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'dask', 'distributed'}))")
    env = {**os.environ, dask_cluster.SCHEDULER_VARIABLE: "tcp://127.0.0.1:1"}  # configured, never connected
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_a_scheduler_dask_is_unavailable_and_says_how(no_scheduler):
    status = core.backends()["dask"]
    assert not status.available
    assert status.reason == ("no dask scheduler configured (--scheduler ADDRESS or 'local', "
                             "or CROSSOVER_DASK_SCHEDULER)")
    with pytest.raises(BackendUnavailableError, match=r"backend 'dask' is unavailable here: no dask scheduler"):
        tasks.map_tasks(pt.raise_on, [(1, 0)], backend="dask")
    assert dask_cluster.worker_slots() == 1  # planning asks every backend; nothing may connect


def test_without_dask_installed_the_probe_and_the_connection_say_so(no_scheduler, monkeypatch):
    dask_cluster.use_scheduler("local")
    monkeypatch.setattr(dask_cluster, "installed", lambda: False)
    assert dask_cluster.BACKEND.probe() == core.Availability(
        False, "dask.distributed is not installed (from a clone of crossover: pip install '.[distributed]')")
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed now raises ImportError
    with pytest.raises(BackendUnavailableError, match=r"^backend 'dask' needs dask.distributed, which cannot be "
                                                      r"imported .*pip install '\.\[distributed\]'$"):
        dask_cluster.get_client()


def test_a_local_cluster_that_cannot_start_is_one_clear_error(no_scheduler, monkeypatch):
    def refuse(distributed):
        raise RuntimeError("Worker failed to start")

    monkeypatch.setattr(dask_cluster, "_start_local_cluster", refuse)
    dask_cluster.use_scheduler("local", workers=3)
    with pytest.raises(BackendUnavailableError) as caught:
        dask_cluster.get_client()
    assert str(caught.value) == ("backend 'dask' could not start a local cluster of 3 workers: "
                                 "RuntimeError: Worker failed to start")


@pytest.mark.parametrize(("given", "address"), [
    ("local", "local"), (" LOCAL ", "local"), ("10.0.0.5:8786", "tcp://10.0.0.5:8786"),
    ("tcp://head-node:8786", "tcp://head-node:8786"), ("tls://[::1]:8786", "tls://[::1]:8786")])
def test_scheduler_addresses_are_normalised(given, address):
    assert dask_cluster.normalize_address("scheduler", given) == address


@pytest.mark.parametrize("given", ["", "head-node", "http://head-node:8786", "tcp://head-node:0",
                                   "tcp://head-node:70000", "head node:8786", 8786])
def test_a_malformed_scheduler_address_is_one_line_naming_it(given):
    with pytest.raises(ProblemError) as caught:
        dask_cluster.normalize_address("scheduler", given)
    assert str(caught.value) == (f"scheduler={given!r} is invalid: must be 'local' or a scheduler address "
                                 "host:port (tcp://, tls://, ws://, wss:// or ucx://)")


def test_malformed_variables_make_the_backend_unavailable_naming_them(no_scheduler, monkeypatch):
    monkeypatch.setenv(dask_cluster.SCHEDULER_VARIABLE, "nowhere")
    assert dask_cluster.BACKEND.probe().reason.startswith("CROSSOVER_DASK_SCHEDULER='nowhere' is invalid: ")
    monkeypatch.setenv(dask_cluster.SCHEDULER_VARIABLE, "local")
    monkeypatch.setenv(dask_cluster.TIMEOUT_VARIABLE, "soon")
    assert dask_cluster.BACKEND.probe().reason == ("CROSSOVER_DASK_TIMEOUT='soon' is invalid: must be a finite "
                                                   "number of seconds > 0, or unset")
    with pytest.raises(ProblemError, match=r"^workers=2 is invalid: sizes a local cluster only"):
        dask_cluster.use_scheduler("tcp://10.0.0.5:8786", workers=2)


def test_a_scheduler_that_does_not_answer_is_one_clear_error_within_the_timeout(no_scheduler):
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    dask_cluster.use_scheduler(address, timeout=1)
    forget_probes()
    began = time.monotonic()
    with pytest.raises(dask_cluster.SchedulerUnreachableError) as caught:
        tasks.map_tasks(pt.raise_on, [(1, 0)], backend="dask")
    assert time.monotonic() - began < 10
    assert str(caught.value).startswith(f"dask scheduler {address} did not answer within 1 s "
                                        "(CROSSOVER_DASK_TIMEOUT sets the wait): ")
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, core.CrossoverError) and caught.value.scheduler == address


def test_planning_waits_for_a_dead_scheduler_once_and_never_fails_on_it(no_scheduler):
    dask_cluster.use_scheduler(f"tcp://127.0.0.1:{free_port()}", timeout=0.5)
    assert dask_cluster.worker_slots() == 1
    began = time.monotonic()
    assert dask_cluster.worker_slots() == 1
    assert time.monotonic() - began < 0.1


@pytest.mark.parametrize(("seconds", "remaining", "slots", "size"), [
    (0.001, 1000, 2, 100),  # by time: 100 tasks of 1 ms make a 100 ms batch
    (0.001, 62, 2, 8),  # by share: each of 2 slots still gets 4 batches
    (0.01, 300, 16, 5),
    (0.5, 100, 2, 1),  # long tasks run one per dask task
    (0.0, 3, 16, 1)])
def test_batches_last_about_100_ms_but_every_slot_gets_several(seconds, remaining, slots, size):
    assert dask_cluster.tasks_per_batch(seconds, remaining, slots) == size


def test_describing_a_local_cluster_does_not_start_it(no_scheduler):
    dask_cluster.use_scheduler("local", workers=3)
    assert dask_cluster.BACKEND.describe() == {"device": "cluster", "scheduler": "local",
                                               "distributed": dask_cluster._version("distributed"),
                                               "workers": 3, "threads": 3, "started": False}
    assert dask_cluster.worker_slots() == 3
    assert dask_cluster._client is None


# -- on a real LocalCluster ----------------------------------------------------------

def test_the_local_cluster_listens_on_loopback_only(local_cluster):
    info = local_cluster.scheduler_info()
    assert info["address"].startswith("tcp://127.0.0.1:")
    assert len(info["workers"]) == 2
    assert all(address.startswith("tcp://127.0.0.1:") for address in info["workers"])
    assert all(worker["nthreads"] == 1 for worker in info["workers"].values())
    assert core.backends()["dask"].available and tasks.parallelism("dask") == 2
    # every socket the cluster listens on (scheduler, its HTTP server, nannies, workers) is on loopback
    me = psutil.Process()
    listening = [c.laddr for p in [me, *me.children(recursive=True)]
                 for c in (p.net_connections if hasattr(p, "net_connections") else p.connections)(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 5
    assert {address.ip for address in listening} == {"127.0.0.1"}


def test_local_workers_run_one_blas_and_one_numba_thread_and_keep_no_history(local_cluster):
    settings = tasks.map_tasks(dask_targets.thread_settings, [0, 1], backend="dask")
    # Numba's pool is sized for the cores a task may be lent (as in the process pool), but a task runs one
    pool = str(core_lending.numba_pool_size(2))
    assert settings == [{"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": pool,
                         "CROSSOVER_POOL_WORKER": "1", "blas_threads": [1]}] * 2
    assert [numba for _, numba in tasks.map_tasks(pt.thread_limits, [0, 1], backend="dask")] == [1, 1]


def test_idle_workers_cores_go_to_the_last_running_task_on_the_local_cluster(local_cluster):
    # as on the process pool: task 1 outlives tasks 0 and 2 (which run one after the other on the
    # other worker); it starts while task 2 still waits (one core), and once the others are done it
    # may use both workers' cores. Tasks 0 and 2 last 1 s, so a loaded machine cannot finish them
    # before task 1 starts.
    local_cluster.wait_for_workers(2, timeout=60)
    results = tasks.map_tasks(pt.cores_before_and_after, [1.0, 4.0, 1.0], backend="dask")
    assert results[1] == (1, 1, 2, 2)
    assert results[2][:2] == (1, 1)
    # cores lent to a task go back before the worker's next task
    assert [numba for _, numba in tasks.map_tasks(pt.thread_limits, [0, 1], backend="dask")] == [1, 1]
    assert core_lending.cores_for_this_task() is None  # not in a task


def test_lending_on_the_local_cluster_can_be_switched_off(local_cluster, monkeypatch):
    monkeypatch.setenv("CROSSOVER_LEND_IDLE_CORES", "0")  # read here, in the calling process, at each map
    results = tasks.map_tasks(pt.cores_before_and_after, [0.0, 1.0], backend="dask")
    assert results[1] == (1, 1, 1, 1)


def test_lent_cores_change_no_result(local_cluster, monkeypatch):
    # a path of the common-noise solver, whose particle kernel takes lent cores, started once the
    # other task is done (so on both workers' cores), equals the same path on one core and here;
    # it has particles enough for two threads (a smaller one keeps one: see the next test)
    problem = problem_from_params(core.solvers()["mfg.common_noise"],
                                  {**SMALL_NOISE, "N": 2 * PARTICLES_PER_THREAD})
    lent = tasks.map_tasks(dask_targets.path_when_alone, [(problem, False), (problem, True)], seed=5,
                           backend="dask")
    monkeypatch.setenv("CROSSOVER_LEND_IDLE_CORES", "0")
    kept = tasks.map_tasks(dask_targets.path_when_alone, [(problem, False), (problem, False)], seed=5,
                           backend="dask")
    here = tasks.run_serially(dask_targets.path_when_alone, [(problem, False)] * 2, seed=5)
    assert [threads for _, threads in lent] == [1, core_lending.numba_pool_size(2)]
    assert [threads for _, threads in kept] == [1, 1]
    for (on, _), (off, _), (serial, _) in zip(lent, kept, here):
        assert np.array_equal(on, off) and np.array_equal(on, serial)


def test_a_path_too_small_to_pay_for_a_lent_thread_keeps_one(local_cluster):
    # waking a lent thread costs more than a few thousand particles' kernels gain (docs/mfg.md)
    problem = problem_from_params(core.solvers()["mfg.common_noise"], SMALL_NOISE)
    assert problem.N < PARTICLES_PER_THREAD
    lent = tasks.map_tasks(dask_targets.path_when_alone, [(problem, False), (problem, True)], seed=5,
                           backend="dask")
    assert [threads for _, threads in lent] == [1, 1]


def test_seeded_results_equal_the_serial_reference_and_stream_once(local_cluster):
    jobs = [(3, 0.0)] * 9 + [(2, 0.05)] * 3
    seen: list[int] = []
    results = tasks.map_tasks(dask_targets.seeded_after_sleep, jobs, seed=11, backend="dask",
                              on_result=lambda i, result: seen.append(i))
    assert results == tasks.run_serially(dask_targets.seeded_after_sleep, jobs, seed=11)
    assert sorted(seen) == list(range(len(jobs)))
    assert tasks.map_tasks(pt.raise_on, [], backend="dask") == []


def test_shared_inputs_are_scattered_once_and_arrive_read_only(local_cluster, monkeypatch):
    calls = []
    scatter = local_cluster.scatter
    monkeypatch.setattr(local_cluster, "scatter", lambda *a, **k: calls.append(k) or scatter(*a, **k))
    data = np.arange(10.0)
    out = tasks.map_tasks(pt.read_shared, list(range(10)), shared={"data": data}, backend="dask")
    assert [value for value, *_ in out] == list(data)
    assert not any(writeable for _, writeable, *_ in out)
    assert len(calls) == 1 and calls[0]["broadcast"] is True


def test_short_tasks_are_batched_and_long_ones_are_not(local_cluster, monkeypatch):
    submitted = []
    submit = local_cluster.submit
    monkeypatch.setattr(local_cluster, "submit", lambda fn, *a, **k: submitted.append(len(a[1])) or
                        submit(fn, *a, **k))
    short = [(i, 0.001) for i in range(400)]
    assert tasks.map_tasks(pt.square_after_sleep, short, backend="dask") == [i * i for i in range(400)]
    assert sum(submitted) == 400 and len(submitted) < 400 / 10
    submitted.clear()
    long = [(i, 0.12) for i in range(6)]
    assert tasks.map_tasks(pt.square_after_sleep, long, backend="dask") == [i * i for i in range(6)]
    assert submitted == [1] * 6


def test_small_maps_go_to_the_same_workers(local_cluster):
    # a worker loads a solver's kernels at its first task: a map of one task must reuse the warm worker
    # rather than reach a cold one at every solve
    local_cluster.wait_for_workers(2, timeout=60)
    pids = {pid for _ in range(6) for pid in tasks.map_tasks(pt.pid_after_sleep, [0.0], backend="dask")}
    assert len(pids) == 1


def test_a_failing_task_is_named_and_the_others_kept(local_cluster):
    with pytest.raises(TaskFailedError) as caught:
        tasks.map_tasks(pt.raise_on, [(i, 3) for i in range(6)], backend="dask", labels=[f"t{i}" for i in range(6)])
    assert str(caught.value).startswith("task 3 (t3) failed on the dask cluster at tcp://127.0.0.1:")
    assert str(caught.value).endswith("(local cluster): ValueError: bad value 3")
    assert caught.value.task_index == 3
    assert caught.value.partial_results == [0, 1, 2, None, 4, 5]


def test_an_exception_that_cannot_be_pickled_comes_back_as_text(local_cluster):
    with pytest.raises(TaskFailedError) as caught:
        tasks.map_tasks(dask_targets.raise_unpicklable, [0, 1, 2], backend="dask")
    assert isinstance(caught.value.__cause__, UnpicklableTaskError)
    assert str(caught.value).endswith(": Unpicklable: unpicklable 1")
    assert caught.value.partial_results == [0, None, 2]


def test_a_failing_result_callback_cancels_the_rest_and_the_next_map_runs(local_cluster):
    def stop(index, result) -> None:
        raise KeyboardInterrupt  # as Ctrl-C would, inside the loop that takes results

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        tasks.map_tasks(pt.square_after_sleep, [(i, 0.2) for i in range(20)], backend="dask", on_result=stop)
    assert time.monotonic() - began < 2  # the other 19 tasks (2 s of work on 2 workers) were not waited for
    # nothing left running: a task already on a worker when the rest were cancelled finishes its 0.2 s first
    # (dask does not interrupt a running task), and the scheduler hears of it a moment later
    deadline = time.monotonic() + 1.0
    while [key for key, state in local_cluster.processing().items() if state] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [key for key, state in local_cluster.processing().items() if state]
    assert tasks.map_tasks(pt.square_after_sleep, [(3, 0.0)], backend="dask") == [9]


def test_a_sweep_on_dask_equals_one_run_here(local_cluster):
    grid = {"seed": [1, 2, 3], "count": [4, 5]}
    here = sweep(sweep_targets.seeded_draws, grid, backend="numpy")
    there = sweep(sweep_targets.seeded_draws, grid, backend="dask")
    assert [p.params for p in there] == [p.params for p in here]
    for mine, theirs in zip(there, here):
        assert mine.ok and np.array_equal(mine.outputs["draws"], theirs.outputs["draws"])


def test_solvers_run_on_dask_unchanged_and_agree_with_the_process_pool(local_cluster, empty_cache):
    walk = problem_from_params(core.solvers()["example.random_walk"],
                               {"n_walkers": 20_000, "n_steps": 20, "chunk": 4_000, "seed": 3})
    on_dask, on_pool = core.solve(walk, backend="dask"), core.solve(walk, backend="process")
    assert on_dask.backend == "dask"
    for name, value in on_pool.outputs.items():
        if not name.endswith(("seconds", "threads")):  # timings and cores lent differ; results must not
            assert np.array_equal(on_dask.outputs[name], value), name
    noise = problem_from_params(core.solvers()["mfg.common_noise"], SMALL_NOISE)
    on_dask, on_pool = core.solve(noise, backend="dask"), core.solve(noise, backend="process")
    for name, value in on_pool.outputs.items():
        if not name.endswith(("seconds", "threads")):  # timings and cores lent differ; results must not
            assert np.array_equal(on_dask.outputs[name], value), name


def test_the_model_of_a_cluster_has_span_and_rounds_from_its_workers(local_cluster):
    spec = core.solvers()["mfg.common_noise"]
    problem = problem_from_params(spec, {**SMALL_NOISE, "K": 5})
    features = model_features(spec, problem, "dask")
    assert features[ROUNDS] == math.ceil(5 / 2)
    assert features[SPAN] == pytest.approx(features[spec.span_feature] * 3 / 5)
    assert ROUNDS not in model_features(spec, problem, "process")  # the pool's models are unchanged


def test_with_a_scheduler_dask_joins_auto_selection_and_its_connection_is_a_one_off(local_cluster, empty_cache):
    spec = core.solvers()["example.random_walk"]
    report = calibrate.calibrate_solver(spec, quick=True, budget=6, backends=["dask", "numpy"])
    dask_row = next(row for row in report.backends if row.backend == "dask")
    assert dask_row.samples >= 2, dask_row
    # the connection is timed as the backend's start (here almost free: the fixture had connected)
    assert dask_row.start_seconds is not None
    assert history.stored()["backends"]["dask"]["start_observations"] == [dask_row.start_seconds]
    problem = problem_from_params(spec, {"n_walkers": 50_000, "n_steps": 20})
    decision = core.plan(problem)
    assert "dask" in decision.predictions and "dask" not in decision.excluded
    assert history.model(spec, "dask") is not None and ROUNDS in history.model(spec, "dask").feature_names


def test_the_cli_takes_a_scheduler_before_or_after_the_command(tmp_path):
    env = {**os.environ, "CROSSOVER_CACHE_DIR": str(tmp_path)}  # its timings must not reach other tests' store
    env.pop(dask_cluster.SCHEDULER_VARIABLE, None)
    run = [sys.executable, "-m", "core.cli"]
    solve = ["run", "example.random_walk", "--backend", "dask", "--param", "n_walkers=5000", "--param",
             "n_steps=10", "--json"]
    done = subprocess.run([*run, "--scheduler", "local", *solve], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["backend"] == "dask"
    refused = subprocess.run([*run, *solve[:-1], "--scheduler", "no-port"], capture_output=True, text=True,
                             cwd=ROOT, env=env, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("crossover: error: scheduler='no-port' is invalid: must be 'local' or a "
                                      "scheduler address host:port (tcp://, tls://, ws://, wss:// or ucx://)")
    missing = subprocess.run([*run, *solve], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert missing.returncode == 2
    assert "backend 'dask' is unavailable here: no dask scheduler configured" in missing.stderr


# -- security basics -------------------------------------------------------------------

UNPICKLING_LOADERS = {("pickle", "load"), ("pickle", "Unpickler"), ("cloudpickle", "load"), ("dill", "load"),
                      ("joblib", "load"), ("torch", "load"), ("shelve", "open"), ("pd", "read_pickle"),
                      ("pandas", "read_pickle")}


def unpickling_calls(source: str, where: str) -> list[str]:
    """Calls in Python source that could unpickle a file: the loaders above, and np.load(allow_pickle=True)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)):
            continue
        owner, name = node.func.value.id, node.func.attr
        allows = any(k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                     for k in node.keywords)
        if (owner, name) in UNPICKLING_LOADERS or (owner in ("np", "numpy") and name == "load" and allows):
            found.append(f"{where}:{node.lineno}: {owner}.{name}")
    return found


def test_nothing_reads_a_pickle_from_disk():
    sources = [p for folder in ("core", "plugins", "docs/scripts") for p in (ROOT / folder).rglob("*.py")]
    assert len(sources) > 50
    calls = [call for path in sources
             for call in unpickling_calls(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert calls == []
    # the scan finds what it looks for
    planted = "import pickle\nwith open('f', 'rb') as f:\n    pickle.load(f)\nnp.load('a.npy', allow_pickle=True)\n"
    assert sorted(unpickling_calls(planted, "planted.py")) == ["planted.py:3: pickle.load", "planted.py:4: np.load"]
