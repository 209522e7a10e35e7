"""The process backend's contract: order, seeds, shared memory, crashes, streaming, start."""

from __future__ import annotations

import math
import platform

import numpy as np
import process_tasks as pt
import pytest

from core import TaskFailedError, WorkerCrashedError
from core.backend import usable_cores
from core.backends import core_lending, process_pool, worker_memory
from core.seeded_tasks import run_serially


def test_results_come_back_in_submission_order():
    # later tasks finish first, yet results follow the task list
    tasks = [(i, 0.2 - 0.04 * i) for i in range(5)]
    assert process_pool.map_tasks(pt.square_after_sleep, tasks, workers=2) == [0, 1, 4, 9, 16]


def test_same_seed_same_results_on_one_and_two_workers():
    tasks = [3, 5, 2, 7, 1, 4]
    one = process_pool.map_tasks(pt.random_draws, tasks, seed=1234, workers=1)
    two = process_pool.map_tasks(pt.random_draws, tasks, seed=1234, workers=2)
    serial = run_serially(pt.random_draws, tasks, seed=1234)
    assert one == two == serial
    # and every task got its own stream
    firsts = [draws[0] for draws in one]
    assert len(set(firsts)) == len(firsts)


def test_crashed_worker_names_the_task_keeps_results_and_pool_recovers():
    tasks = [(i, 5) for i in range(8)]
    labels = [f"item-{i}" for i in range(8)]
    with pytest.raises(WorkerCrashedError, match=r"task 5 \(item-5\)") as caught:
        process_pool.map_tasks(pt.die_on, tasks, workers=2, labels=labels)
    assert caught.value.task_index == 5
    finished = [r for r in caught.value.partial_results if r is not None]
    assert all(r == caught.value.partial_results.index(r) for r in finished)
    # the next call works on a rebuilt pool
    assert process_pool.map_tasks(pt.square_after_sleep, [(3, 0), (4, 0)], workers=2) == [9, 16]


def test_failing_task_is_named_and_other_results_kept():
    with pytest.raises(TaskFailedError, match=r"task 2 .*ValueError: bad value 2") as caught:
        process_pool.map_tasks(pt.raise_on, [(i, 2) for i in range(4)], workers=2)
    assert caught.value.partial_results == [0, 1, None, 3]
    assert not isinstance(caught.value, WorkerCrashedError)


def test_shared_inputs_arrive_read_only_through_shared_memory():
    data = np.arange(1000, dtype=np.float64) * 0.5
    results = process_pool.map_tasks(pt.read_shared, [0, 10, 999], shared={"data": data}, workers=2)
    assert [r[0] for r in results] == [0.0, 5.0, 499.5]
    assert not any(r[1] for r in results)  # writeable flag is off
    # a view on the shared-memory buffer, not an unpickled copy
    assert {r[2] for r in results} <= {"mmap", "memoryview"}


def test_workers_run_one_blas_and_one_numba_thread():
    results = process_pool.map_tasks(pt.thread_limits, [0, 1], workers=2)
    for counts, numba_threads in results:
        assert all(c == 1 for c in counts)
        assert numba_threads == 1


def test_idle_workers_cores_go_to_the_last_running_task():
    # task 1 outlives tasks 0 and 2: it starts while task 0 runs and task 2 still waits (one
    # core), and once the others are done it may use both workers' cores; task 2 starts with
    # nothing waiting but task 1 running, so it gets one core of two. Both workers are up and
    # tasks 0 and 2 last 1 s, so a loaded CI machine cannot finish them before task 1 starts.
    process_pool.start_pool(workers=2)
    results = process_pool.map_tasks(pt.cores_before_and_after, [1.0, 4.0, 1.0], workers=2)
    assert results[1] == (1, 1, 2, 2)
    assert results[2][:2] == (1, 1)
    # 3 workers, 2 long tasks left: the spare core goes to the one that started last (task 3,
    # which ends first and gets 2); task 2, alone by the time it ends, gets all 3 (on a host of
    # 3 cores or more: the workers lend no more cores than the host has)
    cores = min(3, usable_cores())
    results = process_pool.map_tasks(pt.cores_before_and_after, [0.0, 0.0, 3.0, 1.0], workers=3)
    assert [r[2] for r in results[2:]] == [cores, math.ceil(cores / 2)]
    # cores lent to a task go back before the worker's next task
    after = process_pool.map_tasks(pt.thread_limits, [0, 1], workers=2)
    assert [threads for _, threads in after] == [1, 1]
    assert core_lending.cores_for_this_task() is None  # not in a pool task


def test_lending_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("CROSSOVER_LEND_IDLE_CORES", "0")
    results = process_pool.map_tasks(pt.cores_before_and_after, [0.0, 1.0], workers=2)
    assert results[1] == (1, 1, 1, 1)


def test_an_unreadable_lending_switch_is_named(monkeypatch):
    from core.errors import ProblemError

    monkeypatch.setenv("CROSSOVER_LEND_IDLE_CORES", "maybe")
    with pytest.raises(ProblemError, match=r"CROSSOVER_LEND_IDLE_CORES='maybe' is invalid: must be one of 1, true"):
        process_pool.map_tasks(pt.square_after_sleep, [(2, 0)], workers=1)


def test_empty_task_list():
    assert process_pool.map_tasks(pt.square_after_sleep, [], workers=1) == []


def test_results_stream_in_completion_order_and_return_in_task_order():
    # task 0 outlives tasks 1 and 2, which run one after the other on the second worker
    process_pool.start_pool(workers=2)  # both workers up, so neither waits for a process to start
    seen = []
    results = process_pool.map_tasks(pt.square_after_sleep, [(0, 1.0), (1, 0.0), (2, 0.0)], workers=2,
                                     on_result=lambda i, r: seen.append((i, r)))
    assert results == [0, 1, 4]
    assert seen == [(1, 1), (2, 4), (0, 0)]


def test_crash_and_failure_stream_only_finished_results():
    seen = []
    with pytest.raises(TaskFailedError) as caught:
        process_pool.map_tasks(pt.raise_on, [(i, 1) for i in range(3)], workers=2,
                               on_result=lambda i, r: seen.append(i))
    assert sorted(seen) == [0, 2] and caught.value.partial_results == [0, None, 2]
    seen.clear()
    with pytest.raises(WorkerCrashedError) as crashed:
        process_pool.map_tasks(pt.die_on, [(i, 2) for i in range(4)], workers=2,
                               on_result=lambda i, r: seen.append(i))
    kept = [i for i, r in enumerate(crashed.value.partial_results) if r is not None]
    assert sorted(seen) == kept and 2 not in seen


def test_a_failing_result_callback_stops_the_map_cleanly():
    def stop(index, result):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        process_pool.map_tasks(pt.square_after_sleep, [(i, 0.05) for i in range(6)], workers=2, on_result=stop)
    assert process_pool.map_tasks(pt.square_after_sleep, [(5, 0)], workers=2) == [25]  # the pool still works


def test_start_brings_every_worker_up_once():
    process_pool.shutdown()
    process_pool.start_pool(workers=2)
    executor = process_pool.get_executor(2)
    # the executor's own table of worker processes (private, but it is what "every worker is up" means)
    started = {p.pid for p in executor._processes.values()}
    assert len(started) == 2
    process_pool.start_pool(workers=2)  # already up: nothing new starts
    pids = process_pool.map_tasks(pt.pid_after_sleep, [0.3, 0.3], workers=2)
    assert set(pids) == started
    assert process_pool.BACKEND.start is process_pool.start_pool


def test_a_warm_up_runs_once_in_every_worker_before_the_first_map_that_names_it():
    process_pool.shutdown()
    first = process_pool.map_tasks(pt.pid_and_warm_ups, [0.0], workers=2, warm_up=pt.warm_up_counter)
    assert first[0][1] == 1
    # whichever worker takes them, every task finds it warmed once: not the one worker the first map used
    later = process_pool.map_tasks(pt.pid_and_warm_ups, [0.2, 0.2, 0.0, 0.0], workers=2, warm_up=pt.warm_up_counter)
    executor = process_pool.get_executor(2)
    assert {pid for pid, _ in later} == {p.pid for p in executor._processes.values()}
    assert {count for _, count in later} == {1}
    # the core passes it through to a backend whose map takes it
    from core import tasks

    again = tasks.map_tasks(pt.pid_and_warm_ups, [0.0, 0.0], backend="process", workers=2, warm_up=pt.warm_up_counter)
    assert {count for _, count in again} == {1}


def test_workers_are_marked_as_pool_workers():
    import os

    assert process_pool.map_tasks(pt.pool_worker_flag, [0, 1], workers=2) == ["1", "1"]
    assert os.environ.get("CROSSOVER_POOL_WORKER") is None


def test_backend_record_offers_the_map_and_its_parallelism(monkeypatch):
    assert process_pool.BACKEND.map is process_pool.map_tasks
    monkeypatch.setenv("CROSSOVER_WORKERS", "3")
    assert process_pool.BACKEND.parallelism() == 3


def readme_taste() -> str:
    """The README's "A taste of the API" snippet, as printed."""
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## A taste of the API", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_readme_taste_runs_as_a_script_and_calibrates_every_backend(tmp_path, empty_cache):
    """Saved as a plain script (no ``__main__`` guard) and run: no traceback, every available backend calibrated.

    Its pool workers must not rerun the script (they used to, and calibrating
    again inside a starting worker failed, leaving the process backend
    uncalibrated). It takes 20-60 s, as printed.
    """
    import os
    import subprocess
    import sys

    import core
    from core.solver import backend_of
    from plugins.example.problem import RandomWalkProblem

    script = tmp_path / "taste.py"
    script.write_text(readme_taste())
    assert "__main__" not in script.read_text()  # the case that used to fail
    env = {**os.environ, "CROSSOVER_CACHE_DIR": str(empty_cache)}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr and "bootstrapping" not in run.stderr
    # read back the store the script wrote: every backend that runs here has a model, the pool's included
    plan = core.plan(RandomWalkProblem(n_walkers=1_000_000, n_steps=100, seed=1))
    available = {name for name, status in core.backends(describe=False).items() if status.available}
    expected = {backend_of(key) for key in plan.predictions} & available  # the solver's candidates that run here
    assert "process" in expected
    modelled = {backend_of(key) for key, p in plan.predictions.items() if p.status != "uncalibrated"}
    assert expected <= modelled, {key: p.status for key, p in plan.predictions.items()}


def test_a_warm_up_that_is_not_a_function_is_named_before_any_task_runs():
    from core import ProblemError, tasks

    with pytest.raises(ProblemError, match=r"warm_up=.*is invalid: must be a module-level function"):
        tasks.map_tasks(pt.pid_and_warm_ups, [0.0], backend="process", workers=2, warm_up="numba")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the workers' malloc settings are glibc's")
def test_workers_reuse_the_memory_a_task_frees(monkeypatch):
    # glibc unmaps a freed block above 32 MiB, so the next one of that size was faulted in afresh: a
    # spectra chunk of 64 spectra did that every model evaluation. A worker keeps it (worker_memory).
    size = 64 * 2**20
    process_pool.shutdown()
    try:
        for first, second in process_pool.map_tasks(pt.faults_of_two_arrays, [size, size], workers=2):
            assert second * 10 <= max(first, 1), (first, second)  # the second array reuses the first's pages
        process_pool.shutdown()  # the switch is read when the pool starts
        monkeypatch.setenv(worker_memory.SWITCH, "0")
        for first, second in process_pool.map_tasks(pt.faults_of_two_arrays, [size, size], workers=2):
            assert second * 2 >= first > 0, (first, second)  # glibc's default: mapped and faulted in again
    finally:
        process_pool.shutdown()
