"""Faults of the process pool, with real processes and real signals.

- The caller killed (SIGTERM, SIGKILL) with an idle pool, a hung task, or a
  task that holds the GIL: no pool process is left after 5 s, and the
  shared memory of a killed map is unlinked.
- A hung task stops at the timeout (keyword or ``CROSSOVER_TASK_TIMEOUT``)
  with an error naming it and the limit; the pool works afterwards.
- Ctrl-C (SIGINT to the caller only) with a hung task exits in under 5 s.
- An exception that cannot be pickled is the task's error, not a crash;
  a worker that really dies is still a crash.
- ``CROSSOVER_WORKERS`` and ``CROSSOVER_TASK_TIMEOUT`` that cannot be read
  are one-line errors naming the variable, the value and what is allowed.
- A task function defined in the main script works where the script has a
  ``__main__`` guard and is one clear error where it has none; workers
  never rerun the main script.

Pool processes of a child caller are found by a marker in their
environment (inherited by the forkserver, the resource tracker and every
worker), read from /proc: Linux only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import process_tasks as pt
import pytest
import sweep_targets

import core
from core import tasks
from core.backends import process_pool
from core.errors import ProblemError, TaskFailedError, TaskTimeoutError, UnpicklableTaskError, WorkerCrashedError
from core.seeded_tasks import task_timeout

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and /dev/shm")

TESTS = Path(__file__).parent
ROOT = TESTS.parent
MARKER = "CROSSOVER_FAULT_TEST_MARKER"
DEADLINE = 5.0  # seconds the pool processes may take to go


def marked_processes(marker: str) -> list[int]:
    """Live processes whose environment carries ``marker`` (zombies excluded: they are gone, unreaped)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{MARKER}={marker}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry))
    return found


def gone_within(marker: str, seconds: float) -> list[int]:
    """Wait until no marked process lives; return those still alive after ``seconds`` (and kill them)."""
    deadline = time.monotonic() + seconds
    while (alive := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive:  # leave nothing behind for the next test, whatever this one says
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


def start_caller(tmp_path: Path, body: str) -> tuple[subprocess.Popen, str]:
    """Run ``body`` as a script in a marked child process; the pool's tasks come from tests/process_tasks.py."""
    marker = uuid.uuid4().hex
    script = tmp_path / "caller.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent(body))
    env = {**os.environ, MARKER: marker, "PYTHONUNBUFFERED": "1"}
    env.pop("CROSSOVER_TASK_TIMEOUT", None)
    # output to files, not pipes: orphaned workers would hold a pipe open, and reading it would hang the test
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        caller = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, stdout=out, stderr=err)
    return caller, marker


def finish(caller: subprocess.Popen, tmp_path: Path, seconds: float = 120) -> tuple[str, str]:
    """Wait for the caller to exit (kill it after ``seconds``); its stdout and stderr."""
    try:
        caller.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        caller.kill()
        caller.wait()
    return (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()


def wait_for_file(path: Path, caller: subprocess.Popen, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if caller.poll() is not None:
            raise AssertionError(f"the caller exited early: {(path.parent / 'stderr').read_text()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


IDLE = """
    from core.backends import process_pool
    process_pool.start_pool(workers=1)
    open("ready", "w").close()
    import time
    time.sleep(600)
"""

BUSY = """
    from core.backends import process_pool
    import numpy as np
    import process_tasks as pt
    process_pool.map_tasks(pt.{task}, ["started", 0], shared={{"data": np.ones(1000)}}, workers=1)
"""


@pytest.mark.parametrize("pool, kill", [
    ("idle", signal.SIGTERM),
    ("idle", signal.SIGKILL),
    ("hung task", signal.SIGKILL),  # the worker's main thread is busy; its shared memory must go too
    ("task holding the GIL", signal.SIGKILL),  # no Python thread of the worker can run
])
def test_caller_death_leaves_no_pool_process(tmp_path, pool, kill):
    task = {"hung task": "report_blocks_then_hang", "task holding the GIL": "hold_the_gil"}.get(pool)
    caller, marker = start_caller(tmp_path, IDLE if task is None else BUSY.format(task=task))
    wait_for_file(tmp_path / ("ready" if task is None else "started"), caller)
    # the caller, the forkserver, the resource tracker and the worker (one, to spare the CI's cores)
    assert len(marked_processes(marker)) >= 4
    blocks = (tmp_path / "started").read_text().split() if task == "report_blocks_then_hang" else []
    assert len(blocks) == (2 if task == "report_blocks_then_hang" else 0)  # the map's marker and its input
    assert all(Path("/dev/shm", name).exists() for name in blocks)
    caller.send_signal(kill)
    caller.wait()
    assert gone_within(marker, DEADLINE) == []
    # the resource tracker unlinks what the dead caller left registered (the map's inputs and markers)
    assert not any(Path("/dev/shm", name).exists() for name in blocks)


def test_ctrl_c_with_a_hung_task_exits_quickly(tmp_path):
    caller, marker = start_caller(tmp_path, """
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even if this test runs with SIGINT ignored
        from core.backends import process_pool
        import process_tasks as pt
        process_pool.map_tasks(pt.hang_on, [(0, 1, None), (1, 1, "started")], workers=1)
    """)
    wait_for_file(tmp_path / "started", caller)
    interrupted = time.monotonic()
    caller.send_signal(signal.SIGINT)  # the caller only, not its process group
    _, stderr = finish(caller, tmp_path, seconds=30)
    assert time.monotonic() - interrupted < DEADLINE
    assert caller.returncode != 0 and "KeyboardInterrupt" in stderr
    assert gone_within(marker, DEADLINE) == []


@pytest.mark.parametrize("how", ["keyword", "variable"])
def test_hung_task_times_out_keeps_results_and_pool_recovers(monkeypatch, how):
    process_pool.start_pool(workers=2)
    workers = set(process_pool.get_executor(2)._processes)
    if how == "variable":
        monkeypatch.setenv("CROSSOVER_TASK_TIMEOUT", "2")
    started = time.monotonic()
    with pytest.raises(TaskTimeoutError, match=r"^task 2 \(\(2, 2, None\)\) did not finish within the timeout of "
                                               r"2 s .*its worker was stopped and 3 finished results were kept$"
                       ) as caught:
        tasks.map_tasks(pt.hang_on, [(i, 2, None) for i in range(4)], workers=2,
                        timeout=2.0 if how == "keyword" else None)
    assert time.monotonic() - started >= 2.0  # a task never gets less than its limit
    assert caught.value.timeout == 2.0 and caught.value.task_index == 2
    assert caught.value.partial_results == [0, 1, None, 3]
    assert isinstance(caught.value, TaskFailedError)  # scripts that catch the general error still do
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)  # the hung worker (and its peer) are gone
    assert tasks.map_tasks(pt.square_after_sleep, [(3, 0), (4, 0)], workers=2) == [9, 16]


def test_a_sweep_records_the_hung_point_and_finishes_the_others():
    points = core.sweep(sweep_targets.stuck_at, [{"x": x, "stuck": 2} for x in range(4)], workers=2, timeout=2)
    assert [p.outputs["y"] if p.ok else None for p in points] == [0, 1, None, 9]
    assert points[2].error.startswith("timed out: task ") and "timeout of 2 s" in points[2].error


def test_a_timeout_is_refused_where_it_cannot_be_enforced(fresh_registry):
    import fake_parallel

    fake_parallel.register()
    with pytest.raises(core.UnknownBackendError, match=r"^timeout=1 is invalid with backend 'fake': its map cannot "
                                                       r"stop a task; backends that can: process$"):
        tasks.map_tasks(pt.square_after_sleep, [(1, 0)], backend="fake", timeout=1)
    with pytest.raises(core.CrossoverError, match=r"^timeout=1.0 is invalid with backend 'numpy': its points run"):
        core.sweep(sweep_targets.square, {"x": [1, 2]}, backend="numpy", timeout=1)


def test_the_variables_default_is_a_warning_where_it_cannot_be_enforced(fresh_registry, monkeypatch):
    import fake_parallel

    fake_parallel.register()
    monkeypatch.setenv("CROSSOVER_TASK_TIMEOUT", "5")
    with pytest.warns(RuntimeWarning, match=r"^CROSSOVER_TASK_TIMEOUT=5 is not enforced on backend 'fake': its map "
                                            r"cannot stop a task$"):
        assert tasks.map_tasks(pt.square_after_sleep, [(1, 0), (2, 0)], backend="fake") == [1, 4]


@pytest.mark.parametrize("value", ["abc", "0", "-3", "nan", "inf", "1s"])
def test_unreadable_timeout_variable_is_one_clear_line(monkeypatch, value):
    monkeypatch.setenv("CROSSOVER_TASK_TIMEOUT", value)
    expected = f"CROSSOVER_TASK_TIMEOUT={value!r} is invalid: must be a finite number of seconds > 0, or unset"
    for call in (task_timeout, lambda: tasks.map_tasks(pt.square_after_sleep, [(1, 0)], workers=1)):
        with pytest.raises(ProblemError) as caught:
            call()
        assert str(caught.value) == expected


@pytest.mark.parametrize("value", [0, -1, float("nan"), "abc", True])
def test_unreadable_timeout_keyword_is_one_clear_line(value):
    with pytest.raises(ProblemError, match=r"^timeout=.* is invalid: must be a finite number > 0$"):
        tasks.map_tasks(pt.square_after_sleep, [(1, 0)], workers=1, timeout=value)


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5", "2e3", "1 2"])
def test_unreadable_worker_count_is_one_clear_line(monkeypatch, value):
    monkeypatch.setenv("CROSSOVER_WORKERS", value)
    expected = f"CROSSOVER_WORKERS={value!r} is invalid: must be an integer >= 1, or unset"
    for call in (process_pool.default_workers, lambda: tasks.parallelism("process")):
        with pytest.raises(ProblemError) as caught:
            call()
        assert str(caught.value) == expected
    assert process_pool.BACKEND.probe() == (False, expected)  # plan and run give the reason


def test_an_unreadable_worker_count_is_one_line_from_the_command_line(tmp_path):
    env = {**os.environ, "CROSSOVER_WORKERS": "abc", "CROSSOVER_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "core.cli", "run", "example.random_walk", "--param",
                          "n_walkers=1000", "--backend", "process"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert run.stderr.strip() == ("crossover: error: backend 'process' is unavailable here: "
                                  "CROSSOVER_WORKERS='abc' is invalid: must be an integer >= 1, or unset")
    assert process_pool.BACKEND.probe().available  # this process's variable is fine


def test_readable_worker_counts(monkeypatch):
    monkeypatch.setenv("CROSSOVER_WORKERS", " 3 ")
    assert process_pool.default_workers() == 3
    monkeypatch.setenv("CROSSOVER_WORKERS", "")
    assert process_pool.default_workers() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("kind, text", [("init", "NeedsTwoArguments: code 7: the detail"),
                                        ("lock", "ValueError: holds a lock")])
def test_an_exception_that_cannot_be_pickled_is_the_tasks_error(kind, text):
    with pytest.raises(TaskFailedError) as caught:
        process_pool.map_tasks(pt.raise_unpicklable, [(i, 1, kind) for i in range(3)], workers=2)
    assert str(caught.value) == (f"task 1 ((1, 1, {kind!r})) failed: {text} "
                                 f"(the exception could not be pickled, so it came back as text)")
    assert not isinstance(caught.value, WorkerCrashedError)
    assert caught.value.partial_results == [0, None, 2]
    assert isinstance(caught.value.__cause__, UnpicklableTaskError)
    assert "in raise_unpicklable" in caught.value.__cause__.remote_traceback
    assert process_pool.map_tasks(pt.square_after_sleep, [(5, 0)], workers=2) == [25]  # no pool was broken


def test_a_worker_that_really_dies_is_still_a_crash():
    with pytest.raises(WorkerCrashedError, match=r"task 1 \(\(1, 1\)\)") as caught:
        process_pool.map_tasks(pt.die_on, [(i, 1) for i in range(3)], workers=2)
    assert caught.value.task_index == 1


GUARDED = """
    from dataclasses import dataclass

    from core.backends import process_pool

    print("top level ran")


    @dataclass
    class Job:
        value: int


    def double(task, shared, seed):
        return 2 * task.value


    if __name__ == "__main__":
        print(process_pool.map_tasks(double, [Job(1), Job(2), Job(3)], workers=2))
"""

UNGUARDED = """
    from core.backends import process_pool
    import process_tasks as pt

    print("top level ran")
    print(process_pool.map_tasks(pt.square_after_sleep, [(2, 0), (3, 0)], workers=2))


    def double(task, shared, seed):
        return 2 * task


    process_pool.map_tasks(double, [1, 2], workers=2)
"""


def test_main_script_functions_and_the_guard(tmp_path):
    """Workers import a guarded script only for its functions and never rerun an unguarded one."""
    guarded, _ = start_caller(tmp_path, GUARDED)
    out, err = finish(guarded, tmp_path)
    assert guarded.returncode == 0, f"exit status {guarded.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    # printed once per worker that imported the script, never by the workers' start itself
    assert out.splitlines()[-1] == "[2, 4, 6]" and 2 <= out.count("top level ran") <= 3
    unguarded, _ = start_caller(tmp_path, UNGUARDED)
    out, err = finish(unguarded, tmp_path)
    assert out.splitlines() == ["top level ran", "[4, 9]"]  # the script ran once: in the caller
    assert "bootstrapping phase" not in err
    last = err.strip().splitlines()[-1]
    assert last == (f"core.errors.UnguardedMainError: double is defined in the main script "
                    f"{tmp_path / 'caller.py'}, which has no `if __name__ == \"__main__\":` guard, so every pool "
                    f"worker would rerun the whole script: put its top-level code under that guard, or define "
                    f"double in an importable module")


def test_a_map_outside_the_guard_is_named_not_nested(tmp_path):
    """A guarded script whose map sits outside the guard: a worker importing it must not start a pool of its own."""
    caller, _ = start_caller(tmp_path, """
        from core.backends import process_pool


        def double(task, shared, seed):
            return 2 * task


        if __name__ == "__main__":
            print("guarded part")

        process_pool.map_tasks(double, [1], workers=1)
    """)
    _, err = finish(caller, tmp_path)
    assert err.strip().splitlines()[-1] == (
        f"core.errors.TaskFailedError: task 0 (1) failed: UnguardedMainError: a pool worker importing the main "
        f"script {tmp_path / 'caller.py'} reached a map or pool start outside its `if __name__ == \"__main__\":` "
        f"guard: put the script's top-level code under the guard")


@pytest.mark.parametrize("source, guarded", [
    ('if __name__ == "__main__":\n    main()\n', True),
    ("if '__main__' == __name__:\n    main()\n", True),
    ("import os\nprint(os.getcwd())\n", False),
    ('def main():\n    if __name__ == "__main__":\n        pass\n', False),  # not at the top level
    ('if __name__ != "__main__":\n    pass\n', False),
    ('if __name__ == "main":\n    pass\n', False),
])
def test_the_guard_is_read_from_the_scripts_top_level(tmp_path, source, guarded):
    from core.backends.pool_main import has_main_guard

    script = tmp_path / "script.py"
    script.write_text(source)
    assert has_main_guard(str(script)) is guarded
