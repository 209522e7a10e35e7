"""Faults of the dask backend, with a real ``dask scheduler`` and two ``dask worker`` processes on loopback.

- A worker killed (SIGKILL) in the middle of a sweep: Dask reruns its tasks
  on the other worker, and every point equals a run in this process at the
  same seeds; a seeded map equals :func:`core.tasks.run_serially`.
- A task that kills every worker it runs on: once Dask stops retrying it
  (``distributed.scheduler.allowed-failures``, 0 here to keep the test
  short), one ``WorkerCrashedError`` naming it, with the finished results.
- The scheduler killed in the middle of a sweep with a checkpoint: one
  clear error naming the scheduler, within the connection timeout; the
  points finished so far are in the checkpoint, and a rerun resumes from
  them (on another backend, here) with every result equal to a plain run.

Workers run without a nanny, so a killed worker stays dead. Every process
is started on 127.0.0.1 at a free port and killed at the end of its test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import dask
import dask_targets
import numpy as np
import process_tasks as pt
import pytest

from core import tasks
from core.backends import dask_cluster
from core.errors import WorkerCrashedError
from core.running import forget_probes
from core.sweep import sweep

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
START_SECONDS = 60.0  # for the scheduler and both workers to come up on a loaded 2-core machine
POINT_SECONDS = 0.3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """A scheduler and workers as separate processes, as a user would start them."""

    def __init__(self, workers: int = 2):
        self.address = f"tcp://127.0.0.1:{free_port()}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}  # workers import the targets
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env, "cwd": ROOT}
        self.scheduler = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", self.address.rsplit(":", 1)[1], "--no-dashboard"], **quiet)
        self.workers = [subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny",
             "--no-dashboard", "--host", "127.0.0.1"], **quiet) for _ in range(workers)]

    def connect(self) -> None:
        """Point the backend here and wait until every worker has registered."""
        dask_cluster.use_scheduler(self.address, timeout=START_SECONDS)
        forget_probes()
        client = dask_cluster.get_client()
        client.wait_for_workers(len(self.workers), timeout=START_SECONDS)
        dask_cluster.use_scheduler(self.address, timeout=5)  # same address: the client is kept

    def stop(self) -> None:
        for process in [*self.workers, self.scheduler]:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


@pytest.fixture
def cluster():
    started = Cluster()
    try:
        started.connect()
        yield started
    finally:
        dask_cluster.use_scheduler(None)
        forget_probes()
        started.stop()


GRID = [{"seed": seed, "count": 5, "delay": POINT_SECONDS} for seed in range(10)]


def local_sweep() -> list:
    return sweep(dask_targets.slow_draws, [{**point, "delay": 0.0} for point in GRID], backend="numpy")


def same_draws(points, reference) -> bool:
    return all(p.ok and np.array_equal(p.outputs["draws"], r.outputs["draws"]) for p, r in zip(points, reference))


def test_a_worker_killed_mid_sweep_is_replaced_by_dask_retries(cluster):
    def kill_a_worker(index, point) -> None:
        if cluster.workers[0].poll() is None:
            cluster.workers[0].kill()  # SIGKILL while the other points run and wait

    began = time.monotonic()
    points = sweep(dask_targets.slow_draws, GRID, backend="dask", on_result=kill_a_worker)
    assert cluster.workers[0].poll() is not None  # it really died during the sweep
    assert [p.params for p in points] == GRID
    assert same_draws(points, local_sweep())
    assert time.monotonic() - began < 30
    jobs = [(4, 0.05)] * 8
    assert tasks.map_tasks(dask_targets.seeded_after_sleep, jobs, seed=5, backend="dask") == \
        tasks.run_serially(dask_targets.seeded_after_sleep, jobs, seed=5)
    # a worker started by hand, without a nanny to set its thread variables, runs tasks on one thread too
    [settings] = tasks.map_tasks(dask_targets.thread_settings, [0], backend="dask")
    assert settings["NUMBA_NUM_THREADS"] == "1" and settings["CROSSOVER_POOL_WORKER"] == "1"
    assert settings["blas_threads"] == [1]


def test_a_seeded_map_survives_a_worker_killed_mid_map(cluster):
    jobs = [(4, POINT_SECONDS)] * 8

    def kill_a_worker(index, result) -> None:
        if cluster.workers[1].poll() is None:
            cluster.workers[1].kill()

    results = tasks.map_tasks(dask_targets.seeded_after_sleep, jobs, seed=9, backend="dask", on_result=kill_a_worker)
    assert cluster.workers[1].poll() is not None
    assert results == tasks.run_serially(dask_targets.seeded_after_sleep, jobs, seed=9)


def test_the_scheduler_killed_mid_sweep_is_a_clear_error_and_the_checkpoint_resumes(cluster, tmp_path):
    path = tmp_path / "sweep.jsonl"
    seen: list[int] = []

    def kill_the_scheduler(index, point) -> None:
        seen.append(index)
        if len(seen) == 2:
            cluster.scheduler.kill()

    began = time.monotonic()
    with pytest.raises(dask_cluster.SchedulerUnreachableError) as caught:
        sweep(dask_targets.slow_draws, GRID, backend="dask", on_result=kill_the_scheduler, checkpoint=path)
    assert time.monotonic() - began < 30
    message = str(caught.value)
    assert message.startswith(f"dask scheduler {cluster.address} stopped answering during a map")
    assert "\n" not in message and caught.value.scheduler == cluster.address

    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) >= 3  # a header, then at least the two points seen before the kill
    resumed = sweep(dask_targets.slow_draws, GRID, backend="numpy", checkpoint=path)
    assert sum(p.resumed for p in resumed) >= len(seen) >= 2
    assert {i for i, p in enumerate(resumed) if p.resumed} >= set(seen)
    assert same_draws(resumed, local_sweep())


def test_a_task_that_kills_its_workers_is_named_once_dask_stops_retrying():
    # read as the local scheduler starts: no retry, and each worker holds only the task it runs (a worker that
    # dies makes every task it holds suspect, queued ones too)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0, "distributed.scheduler.worker-saturation": 1.0}):
        dask_cluster.use_scheduler("local", workers=2)
        forget_probes()
        try:
            began = time.monotonic()
            with pytest.raises(WorkerCrashedError) as caught:
                tasks.map_tasks(pt.die_on, [(i, 3) for i in range(6)], backend="dask",
                                labels=[f"t{i}" for i in range(6)])
            assert time.monotonic() - began < 60
        finally:
            dask_cluster.use_scheduler(None)
            forget_probes()
    message = str(caught.value)
    assert message.startswith("dask workers at tcp://127.0.0.1:")
    assert "(local cluster) kept dying while running task 3 (t3); Dask stopped retrying it" in message
    assert caught.value.task_index == 3 and caught.value.partial_results[3] is None
    assert all(r in (None, i) for i, r in enumerate(caught.value.partial_results))
