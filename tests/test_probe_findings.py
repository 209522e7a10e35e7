"""What the adversarial probe of issue 22 found in the dask backend, checkpoints and limits, kept fixed.

- a scheduler address that accepts a connection and stays silent (a bare
  socket, an HTTP server) is one error within ``CROSSOVER_DASK_TIMEOUT``,
  never a hang; one that answers with HTTP or garbage is one line saying it
  does not speak the dask protocol, never a traceback from distributed;
- a user's own ``distributed.Client`` runs maps and sweeps, and crossover
  never closes it; a sweep's points say they ran on dask;
- a ``local`` cluster from a script without a ``__main__`` guard is the
  process pool's one-line ``UnguardedMainError``;
- a checkpoint knows a ``functools.partial`` target again in another
  process, and refuses lambdas and closures, whose names are shared;
- ``CROSSOVER_MAX_SECONDS`` holds for an implementation with no model.

Each command that could hang runs in a subprocess with a timeout, so a
regression fails instead of hanging the suite.
"""

from __future__ import annotations

import functools
import os
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import checkpoint_targets as targets
import numpy as np
import pytest

import core
from core import limits
from core.checkpoint import CheckpointError, callable_identity
from core.errors import TooLongError
from core.solver import problem_from_params

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
TIMEOUT = 2  # CROSSOVER_DASK_TIMEOUT in the commands below


def run(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """A command in a fresh process; past ``timeout`` the test fails (a hang) rather than waits."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), **env}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=environment, cwd=ROOT)


# -- servers that are not dask schedulers --------------------------------------------------------


class _Quiet(socketserver.BaseRequestHandler):
    def handle(self) -> None:  # accepts, then says nothing until the client goes away
        self.request.recv(1 << 16)
        time.sleep(30)


class _Chatty(socketserver.BaseRequestHandler):
    def handle(self) -> None:  # answers at once, as a misconfigured proxy or another service might
        self.request.sendall(self.server.answer)
        self.request.recv(1 << 16)


class _Http(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(request):
    """A loopback server of the kind the test names: 'quiet', 'http', or bytes it answers with."""
    kind = request.param
    if kind == "http":
        serving = HTTPServer(("127.0.0.1", 0), _Http)
    else:
        serving = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Quiet if kind == "quiet" else _Chatty)
        serving.daemon_threads = True
        serving.answer = kind
    thread = threading.Thread(target=serving.serve_forever, daemon=True)
    thread.start()
    yield f"tcp://127.0.0.1:{serving.server_address[1]}"
    serving.shutdown()
    serving.server_close()


@pytest.mark.parametrize("server", ["quiet", "http"], indirect=True)
def test_a_silent_address_is_one_error_within_the_timeout_never_a_hang(server):
    began = time.monotonic()
    done = run([sys.executable, "-m", "core.cli", "--scheduler", server, "run", "example.random_walk",
                "--backend", "dask"], CROSSOVER_DASK_TIMEOUT=str(TIMEOUT))
    took = time.monotonic() - began
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines == [f"crossover: error: dask scheduler {server} did not answer within {TIMEOUT} s "
                     f"(CROSSOVER_DASK_TIMEOUT sets the wait): it accepted a connection but sent nothing "
                     f"(is it a dask scheduler?)"], done.stderr
    assert took < TIMEOUT + 20  # the wait, plus starting Python and loading the plugins


@pytest.mark.parametrize("server", [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", b"\xff" * 64],
                         indirect=True)
def test_an_address_that_answers_in_another_protocol_is_one_line_not_a_traceback(server):
    done = run([sys.executable, "-m", "core.cli", "--scheduler", server, "run", "example.random_walk",
                "--backend", "dask"], CROSSOVER_DASK_TIMEOUT=str(TIMEOUT))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"crossover: error: {server} does not speak the dask protocol (it answered b'")
    assert "give the address of a dask scheduler" in lines[0]


@pytest.mark.parametrize("server", ["quiet"], indirect=True)
def test_calibrate_with_a_silent_scheduler_finishes_and_blames_it(server):
    done = run([sys.executable, "-m", "core.cli", "--scheduler", server, "calibrate", "example.random_walk",
                "--budget", "2", "--json"], timeout=120, CROSSOVER_DASK_TIMEOUT=str(TIMEOUT))
    assert done.returncode == 0, done.stderr
    assert f"dask scheduler {server} did not answer within {TIMEOUT} s" in done.stdout
    assert "Traceback" not in done.stderr


# -- a user's own client, and where a sweep ran --------------------------------------------------

USERS_CLIENT = """
import functools
import distributed
import numpy as np
import core, process_tasks, sweep_targets
from core.backends import dask_cluster
from core.errors import BackendUnavailableError

if __name__ == "__main__":
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None)
    client = distributed.Client(cluster)
    dask_cluster.use_scheduler(client)
    assert dask_cluster.scheduler_address() == cluster.scheduler_address
    squares = core.tasks.map_tasks(process_tasks.square_after_sleep, [(i, 0.0) for i in range(7)], backend="dask")
    assert squares == [i * i for i in range(7)], squares
    points = core.sweep(sweep_targets.square, {"x": [1.0, 2.0, 3.0]}, backend="dask")
    assert [p.outputs["y"] for p in points] == [1.0, 4.0, 9.0]
    print("backends", sorted({p.backend for p in points}))
    dask_cluster.shutdown()
    dask_cluster.use_scheduler(None)
    print("after", client.status)
    client.close()
    try:
        dask_cluster.use_scheduler(client)
    except ValueError as exc:
        print("closed:", exc)
    cluster.close()
"""


def test_a_users_client_runs_maps_and_sweeps_and_stays_open(tmp_path):
    script = tmp_path / "users_client.py"
    script.write_text(USERS_CLIENT)
    done = run([sys.executable, str(script)], timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "backends ['dask']" in lines  # not numba: the points ran on the cluster
    assert "after running" in lines  # neither shutdown nor a new choice closed the user's client
    closed = [line for line in lines if line.startswith("closed:")]
    assert closed and "scheduler=" in closed[0] and "pass a connected one" in closed[0]


def test_a_sweep_run_here_says_which_implementation_ran_each_point():
    grid = [{"n_walkers": 500, "n_steps": 5, "seed": 1}, {"n_walkers": 0, "n_steps": 5, "seed": 1}]
    ok, bad = core.sweep("example.random_walk", grid, backend="numpy")
    assert ok.ok and ok.backend == "numpy"
    assert not bad.ok and bad.backend is None  # refused before any backend was chosen


UNGUARDED = """
import core, process_tasks
from core.backends import dask_cluster

dask_cluster.use_scheduler("local", workers=1)
print(core.tasks.map_tasks(process_tasks.square_after_sleep, [(2, 0.0)], backend="dask"))
"""


def test_a_local_cluster_without_a_main_guard_is_the_pools_one_line_error(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    done = run([sys.executable, str(script)], timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"core.errors.UnguardedMainError: the main script {script} has no `if __name__ == "
                    f"\"__main__\":` guard, so every worker of the local dask cluster would rerun the whole "
                    f"script: put its top-level code under that guard")
    assert "Nanny" not in done.stderr and done.stderr.count("Traceback") == 1  # no worker ever started


# -- checkpoint identity -------------------------------------------------------------------------

PARTIAL_SWEEP = """
import functools, sys
import core, checkpoint_targets
calls, path = sys.argv[1], sys.argv[2]
points = core.sweep(functools.partial(checkpoint_targets.awkward, calls=calls), {{"x": [1, 2, 3]}},
                    backend="numpy", checkpoint=path)
print([p.resumed for p in points])
"""


def test_a_partial_target_resumes_in_another_process(tmp_path):
    calls, path, script = tmp_path / "calls", tmp_path / "sweep.jsonl", tmp_path / "partial_sweep.py"
    script.write_text(PARTIAL_SWEEP.format())
    first = run([sys.executable, str(script), str(calls), str(path)])
    again = run([sys.executable, str(script), str(calls), str(path)])
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert first.stdout.split() == ["[False,", "False,", "False]"]
    assert again.stdout.split() == ["[True,", "True,", "True]"]
    assert targets.calls_of(str(calls)) == [1, 2, 3]  # the second process computed nothing
    assert "0x" not in path.read_text().splitlines()[0]  # no memory address in the run's identity


def test_partials_of_other_arguments_are_other_runs(tmp_path):
    path = tmp_path / "sweep.jsonl"
    core.sweep(functools.partial(targets.awkward, calls=str(tmp_path / "a")), {"x": [1]}, backend="numpy",
               checkpoint=path)
    with pytest.raises(CheckpointError, match="belongs to another run"):
        core.sweep(functools.partial(targets.awkward, calls=str(tmp_path / "b")), {"x": [1]}, backend="numpy",
                   checkpoint=path)


def _factory(k: int):
    def scaled(x: int) -> dict:
        return {"y": x * k}
    return scaled


def test_lambdas_and_closures_are_refused_so_none_resumes_from_anothers_results(tmp_path):
    path = tmp_path / "sweep.jsonl"
    with pytest.raises(CheckpointError, match=r"target=<function .*<lambda>.* cannot be checkpointed: every lambda "
                                              r"is named <lambda>"):
        core.sweep(lambda x: {"y": x}, {"x": [1, 2]}, backend="numpy", checkpoint=path)
    with pytest.raises(CheckpointError, match=r"_factory\.<locals>\.scaled is defined inside a function"):
        core.sweep(_factory(2), {"x": [1, 2]}, backend="numpy", checkpoint=path)
    assert not path.exists()  # refused before a file was made
    # without a checkpoint they run as before
    assert [p.outputs["y"] for p in core.sweep(_factory(3), {"x": [1, 2]}, backend="numpy")] == [3, 6]


class _Scaler:
    def __init__(self, k: float):
        self.k = k

    def __call__(self, x: float) -> dict:
        return {"y": x * self.k}

    def apply(self, x: float) -> dict:
        return {"y": x * self.k}


def test_callable_identity_names_only_what_a_name_finds():
    assert callable_identity(targets.awkward) == "checkpoint_targets:awkward"
    assert callable_identity(np.linspace) == "numpy:linspace"
    assert callable_identity(_Scaler) == f"{__name__}:_Scaler"
    one = callable_identity(functools.partial(targets.awkward, calls="a"))
    assert one == callable_identity(functools.partial(targets.awkward, calls="a"))
    assert one != callable_identity(functools.partial(targets.awkward, calls="b"))
    for unnamed in (_Scaler(2.0), _Scaler(2.0).apply, [].append):  # two instances would share any name
        with pytest.raises(CheckpointError, match="cannot be checkpointed"):
            callable_identity(unnamed)
    with pytest.raises(CheckpointError, match=r"functools.partial arguments\[1\]\['calls'\] is a object"):
        callable_identity(functools.partial(targets.awkward, calls=object()))


# -- limits without a model ----------------------------------------------------------------------


def test_a_problem_within_the_calibration_design_runs_without_a_model(empty_cache):
    spec = core.solvers()["example.random_walk"]
    small = problem_from_params(spec, {"n_walkers": 1_000, "n_steps": 10})
    assert limits.beyond_design(spec, small) == []
    assert limits.unmodelled_seconds(spec, small, "numpy", 3600.0) is None
    huge = problem_from_params(spec, {"n_walkers": 30_000_000_000, "n_steps": 100})
    assert limits.unmodelled_seconds(spec, huge, "numpy", float("inf")) is None  # no limit: nothing measured
    assert core.current_planner().model(spec, "numpy") is None


def test_a_huge_problem_with_no_model_is_measured_then_refused(empty_cache, caplog):
    spec = core.solvers()["example.random_walk"]
    huge = problem_from_params(spec, {"n_walkers": 30_000_000_000, "n_steps": 100})
    assert "walkers" in limits.beyond_design(spec, huge)
    predicted = limits.unmodelled_seconds(spec, huge, "numpy", 3600.0)
    assert "has no model here and this problem is beyond its calibration design" in caplog.text
    # independent truth: the time of one real run, scaled by the walker-steps (the walk is linear in them)
    probe = problem_from_params(spec, {"n_walkers": 1_000_000, "n_steps": 100})
    core.solve(probe, backend="numpy")  # warm
    seconds = min(core.solve(probe, backend="numpy").seconds for _ in range(3))
    truth = seconds * 30_000
    assert truth / 3 < predicted < truth * 3, (predicted, truth)
    assert predicted > 3600.0
    with pytest.raises(TooLongError, match="predicted to take"):
        limits.refuse_if_too_long(spec.name, "numpy", predicted, None, 3600.0)


def test_a_huge_problem_that_still_cannot_be_predicted_is_refused(empty_cache, monkeypatch):
    from core.costmodel import calibrate

    monkeypatch.setattr(calibrate, "calibrate_solver", lambda *args, **kwargs: None)  # measures nothing
    spec = core.solvers()["example.random_walk"]
    huge = problem_from_params(spec, {"n_walkers": 30_000_000_000, "n_steps": 100})
    with pytest.raises(TooLongError, match=r"example.random_walk on numpy cannot be predicted \(no model, even "
                                           r"after a quick calibration\) and this problem is beyond its calibration "
                                           r"design in walker_steps, walkers"):
        limits.unmodelled_seconds(spec, huge, "numpy", 3600.0)


def test_a_scheduler_that_is_neither_an_address_nor_a_client_is_one_clear_error():
    from core.backends import dask_cluster

    with pytest.raises(ValueError, match=r"^scheduler=42 is invalid: must be 'local', a connected distributed.Client, "
                                         r"or a scheduler address host:port"):
        dask_cluster.use_scheduler(42)


def test_solve_refuses_a_huge_run_on_a_backend_with_no_model(empty_cache):
    spec = core.solvers()["example.random_walk"]
    huge = problem_from_params(spec, {"n_walkers": 30_000_000_000, "n_steps": 100})
    with pytest.raises(TooLongError, match="over the limit of 1 h"):
        core.solve(huge, backend="numpy")


@pytest.mark.parametrize("name", sorted(core.solvers()))
def test_every_default_problem_lies_within_its_full_calibration_design(name):
    # a named backend without a model is only measured first for problems beyond the design: never the default
    spec = core.solvers()[name]
    assert limits.beyond_design(spec, spec.default_problem()) == []
