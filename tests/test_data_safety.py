"""Nothing a user measured is lost, and nothing waits without a word (issue 22).

- every numeric option of the core commands is range-checked in one line,
  and a refused command leaves the wisdom file as it was;
- a calibration adds to the stored samples, never replaces them with fewer;
- two calibrations at once (threads or processes) take turns, the second
  saying that it waits, and both keep their samples;
- the dask backend keeps the timings of each scheduler configuration side by
  side, so toggling ``--scheduler local`` neither loses nor re-measures them;
- a malformed plugin variable is one line, status 2, while the parser is built;
- ``core.calibrate`` in a script shows its progress on standard error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import core
from core import progress, registry
from core.backends import dask_cluster
from core.cli import USER_ERROR, main, number_option
from core.costmodel import calibrate as calibration
from core.costmodel import history
from core.costmodel import store as wisdom
from core.errors import ProblemError
from core.solver import SizeSpace
from core.validation import check_int

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


# -- two small solvers: one quick to calibrate, one slow enough to overlap with another ----------

@dataclasses.dataclass(frozen=True)
class SafeProblem:
    n: int = 1000

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def _total(problem: SafeProblem) -> dict:
    return {"total": np.arange(problem.n, dtype=np.float64).sum()}


CALLS: list[tuple[str, float, float]] = []  # (who, start, end) of every slow run in this process


def _slow(problem: SafeProblem) -> dict:
    hold = os.environ.get("SAFETY_HOLD")  # the cross-process test: the first run waits for the second to queue
    deadline = time.monotonic() + 60
    while hold and not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    time.sleep(0.01)
    who = f"{os.getpid()}-{threading.current_thread().name}"
    CALLS.append((who, began, time.monotonic()))
    if os.environ.get("SAFETY_LOG"):  # the runs of every process, for the cross-process test
        with open(os.environ["SAFETY_LOG"], "a") as log:
            log.write(f"{who} {began} {time.monotonic()}\n")
    return {"total": float(problem.n)}


def _spec(name: str, run) -> core.SolverSpec:
    return core.SolverSpec(name=name, problem_type=SafeProblem, implementations={"numpy": run},
                           features=lambda p: {"n": float(p.n)}, size_axis="n",
                           space=lambda quick: SizeSpace(ranges={"n": (1_000, 1_000_000)}),
                           memory=lambda p, key: 8.0 * p.n, default_problem=SafeProblem)


class SafetyPlugin:
    @core.hookimpl
    def crossover_solvers(self):
        return [_spec("safety.sum", _total), _spec("safety.slow", _slow)]


def install() -> None:
    if "safety.sum" not in core.solvers():
        core.register(SafetyPlugin(), name="safety")


@pytest.fixture
def solvers(fresh_registry, empty_cache):
    install()
    CALLS.clear()
    return core.solvers()


def _stored(solver: str, implementation: str = "numpy") -> list[dict]:
    history.forget()  # what the file holds, as a new process would read it
    entry = wisdom.load()["solvers"].get(solver, {"backends": {}})
    return entry["backends"].get(implementation, {}).get("calibration", [])


def _points(records: list[dict]) -> set[float]:
    return {record["features"]["n"] for record in records}


# -- 1. numeric options ------------------------------------------------------------------------

BUDGET = "must be a number of seconds > 0 (the most to spend on each solver)"
CALLS_ALLOWED = "must be a number of calls >= 1 to spread one-off costs over, or inf to ignore them"


@pytest.mark.parametrize(("argv", "message"), [
    (["calibrate", "safety.sum", "--budget", "-5"], f"--budget=-5 is invalid: {BUDGET}"),
    (["calibrate", "safety.sum", "--budget", "0"], f"--budget=0 is invalid: {BUDGET}"),
    (["calibrate", "safety.sum", "--budget=-0.0"], f"--budget=-0.0 is invalid: {BUDGET}"),
    (["calibrate", "--budget", "nan"], f"--budget=nan is invalid: {BUDGET}"),
    (["calibrate", "--budget", "inf"], f"--budget=inf is invalid: {BUDGET}"),
    (["calibrate", "--budget", "1e400"], f"--budget=1e400 is invalid: {BUDGET}"),
    (["calibrate", "--budget", "ten"], f"--budget=ten is invalid: {BUDGET}"),
    (["run", "safety.sum", "--calls", "0"], f"--calls=0 is invalid: {CALLS_ALLOWED}"),
    (["run", "safety.sum", "--calls", "-3"], f"--calls=-3 is invalid: {CALLS_ALLOWED}"),
    (["plan", "safety.sum", "--calls", "0.5"], f"--calls=0.5 is invalid: {CALLS_ALLOWED}"),
    (["plan", "safety.sum", "--calls", "nan"], f"--calls=nan is invalid: {CALLS_ALLOWED}"),
    (["plan", "safety.sum", "--calls=-inf"], f"--calls=-inf is invalid: {CALLS_ALLOWED}"),
])
def test_a_bad_number_is_one_line_status_2_and_the_stored_data_intact(solvers, empty_cache, capsys, argv, message):
    core.calibrate(["safety.sum"], budget=2.0, progress=False)
    before = (empty_cache / "wisdom.json").read_bytes()
    assert main(argv) == USER_ERROR
    assert capsys.readouterr().err == f"crossover: error: {message}\n"
    assert (empty_cache / "wisdom.json").read_bytes() == before


def test_good_numbers_pass_as_numbers():
    check = dict(minimum=1, infinite=True, allowed="x")
    assert number_option("--calls", " 3 ", **check) == 3.0 and number_option("--calls", "inf", **check) == math.inf
    assert number_option("--calls", None, **check) is None
    assert number_option("--count", "12", minimum=1, integer=True, allowed="x") == 12
    with pytest.raises(core.CrossoverError, match=r"^--count=1\.5 is invalid: whole$"):
        number_option("--count", "1.5", minimum=1, integer=True, allowed="whole")
    with pytest.raises(core.CrossoverError, match=r"^--seed=5 is invalid: at most 4$"):
        number_option("--seed", "5", minimum=0, integer=True, maximum=4, allowed="at most 4")
    with pytest.raises(core.CrossoverError, match=r"^--x='a\\nb' is invalid: y$"):  # a line break stays one line
        number_option("--x", "a\nb", minimum=0, allowed="y")


@pytest.mark.parametrize("budget", [-5, 0, math.nan, math.inf, True])
def test_the_api_refuses_a_budget_that_is_no_time(solvers, budget):
    with pytest.raises(ProblemError, match=r"^budget=.* is invalid: must be a finite number > 0$"):
        core.calibrate(["safety.sum"], budget=budget)
    assert _stored("safety.sum") == []


# -- 2. a calibration never replaces better data with less --------------------------------------

def test_a_tiny_budget_adds_to_the_stored_samples_and_removes_none(solvers, capsys):
    [full] = core.calibrate(["safety.sum"], budget=5.0, progress=False)
    rich = _stored("safety.sum")
    assert full.backends[0].stopped == "design done" and len(rich) == full.backends[0].samples >= 8
    assert main(["calibrate", "safety.sum", "--budget", "0.000001"]) == 0  # one problem each, then spent
    out = capsys.readouterr().out
    after = _stored("safety.sum")
    assert len(after) == len(rich) and _points(after) == _points(rich)
    # the one problem measured again replaced its own sample; every other sample is the stored one, unchanged
    changed = [record for record in after if record not in rich]
    assert len(changed) == 1 and changed[0]["features"] == min(rich, key=lambda r: r["features"]["n"])["features"]
    assert f"1 (+{len(rich) - 1} kept)" in out
    spec = core.solvers()["safety.sum"]
    assert len(history.samples(spec, "numpy")) == len(rich)  # and the model is fitted on all of them


def test_the_merge_rule():
    def record(n: float, seconds: float, **features: float) -> dict:
        return {"features": {"n": n, **features}, "seconds": seconds}

    stored = [record(1, 0.1), record(2, 0.2), record(3, 0.3), record(4, 0.4, m=1.0)]
    merged = wisdom.merge_calibration(stored, [record(2, 0.25), record(5, 0.5)])
    # same features: the new timing; other points: kept; other feature names: dropped (not comparable)
    assert merged == [record(1, 0.1), record(3, 0.3), record(2, 0.25), record(5, 0.5)]
    assert wisdom.merge_calibration(stored, []) == stored  # nothing measured: nothing lost
    many = [record(float(n), 1.0) for n in range(wisdom.MAX_CALIBRATION_SAMPLES + 50)]
    capped = wisdom.merge_calibration(many, [record(-1.0, 2.0)])
    assert len(capped) == wisdom.MAX_CALIBRATION_SAMPLES and capped[-1] == record(-1.0, 2.0)
    assert capped[0] == many[51]  # the oldest stored ones went first


# -- 3. concurrent calibrations take turns ---------------------------------------------------------

def _turns(calls: list[tuple[str, float, float]]) -> list[str]:
    """Who ran, in order of start, with repeats folded: ['a', 'b'] when a's runs all came before b's."""
    order: list[str] = []
    for who, _, _ in sorted(calls, key=lambda call: call[1]):
        if not order or order[-1] != who:
            order.append(who)
    return order


def test_two_threads_calibrating_take_turns_and_the_second_says_it_waits(solvers, caplog):
    spec = core.solvers()["safety.slow"]
    results = {}

    def calibrate(name: str, budget: float) -> None:
        results[name] = calibration.calibrate_solver(spec, budget=budget)

    first = threading.Thread(target=calibrate, args=("first", 1.5), name="first")
    second = threading.Thread(target=calibrate, args=("second", 0.000001), name="second")
    with caplog.at_level(logging.WARNING, logger="crossover"):
        first.start()
        deadline = time.monotonic() + 60
        while not CALLS:  # the first is measuring: the second must now wait for it
            assert time.monotonic() < deadline
            time.sleep(0.005)
        second.start()
        first.join(120)
        second.join(120)
    waits = [r.getMessage() for r in caplog.records if "another calibration is running" in r.getMessage()]
    assert waits == [f"another calibration is running (pid {os.getpid()}: safety.slow); waiting for it to finish "
                     "before calibrating safety.slow, so that neither one times the other's work (Ctrl-C to stop)"]
    assert [who.split("-", 1)[1] for who in _turns(CALLS)] == ["first", "second"]
    measured = results["first"].backends[0].samples
    assert measured >= 3 and results["second"].backends[0].samples == 1
    assert results["second"].backends[0].stored_samples == measured == len(_stored("safety.slow"))


SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import core
from test_data_safety import SafetyPlugin
core.register(SafetyPlugin(), name="safety")
[report] = core.calibrate(["safety.slow"], budget=float(sys.argv[1]), progress=False)
print(report.backends[0].samples, report.backends[0].stored_samples)
"""


def test_two_processes_calibrating_take_turns_and_keep_the_richer_samples(tmp_path, empty_cache):
    log, hold = tmp_path / "runs.log", tmp_path / "go"
    log.touch()
    script = tmp_path / "calibrate_slow.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    env = {**os.environ, "CROSSOVER_CACHE_DIR": str(empty_cache), "SAFETY_LOG": str(log),
           "CROSSOVER_DISABLE_PLUGIN_AUTOLOAD": "1"}

    def start(budget: str, name: str, **more: str) -> subprocess.Popen:
        with open(tmp_path / f"{name}.err", "w") as err, open(tmp_path / f"{name}.out", "w") as out:
            return subprocess.Popen([sys.executable, str(script), budget], cwd=ROOT, env={**env, **more}, text=True,
                                    stdout=out, stderr=err)

    def wait_for(condition, process: subprocess.Popen) -> None:
        deadline = time.monotonic() + 120
        while not condition():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)

    lock = empty_cache / "wisdom.json.calibrating"
    first = start("2.0", "first", SAFETY_HOLD=str(hold))
    wait_for(lambda: lock.exists() and lock.read_text().startswith(f"pid {first.pid}:"), first)  # it holds the lock
    second = start("0.000001", "second")
    wait_for(lambda: "waiting" in (tmp_path / "second.err").read_text(), second)  # it says so, and waits
    hold.touch()  # the first may go on
    assert (first.wait(timeout=120), second.wait(timeout=120)) == (0, 0)
    first_err, second_err = (tmp_path / "first.err").read_text(), (tmp_path / "second.err").read_text()
    assert "another calibration is running" not in first_err
    assert second_err.splitlines()[0] == (f"another calibration is running (pid {first.pid}: safety.slow); waiting "
                                          "for it to finish before calibrating safety.slow, so that neither one "
                                          "times the other's work (Ctrl-C to stop)")
    calls = [(line.split()[0], float(line.split()[1]), float(line.split()[2])) for line in log.read_text().splitlines()]
    assert [who.split("-")[0] for who in _turns(calls)] == [str(first.pid), str(second.pid)]
    # the second measured one problem; every problem the first measured still has its sample
    measured = {name: [int(n) for n in (tmp_path / f"{name}.out").read_text().split()] for name in ("first", "second")}
    assert measured["first"][0] >= 3 and measured["second"] == [1, measured["first"][0]]
    assert len(_stored("safety.slow")) == measured["first"][0]
    assert not list(empty_cache.glob(".wisdom-*"))


# -- 4. scheduler configurations side by side --------------------------------------------------------

RECORD = {"features": {"n": 1000.0}, "seconds": 0.01, "size": 1000.0, "source": "calibration"}


@pytest.fixture
def scheduler(empty_cache, monkeypatch):
    """Set the dask scheduler configuration (as --scheduler or CROSSOVER_DASK_SCHEDULER would) for a new process."""
    dask_cluster.use_scheduler(None)

    def use(address: str | None) -> None:
        if address is None:
            monkeypatch.delenv(dask_cluster.SCHEDULER_VARIABLE, raising=False)
        else:
            monkeypatch.setenv(dask_cluster.SCHEDULER_VARIABLE, address)
        history.forget()  # a new process: its fingerprints are computed again

    yield use
    monkeypatch.delenv(dask_cluster.SCHEDULER_VARIABLE, raising=False)
    history.forget()


def _calibrate_dask(seconds: float, start: float) -> None:
    def change(data: dict) -> None:
        entry = wisdom.solver_entry(data, "safety.side", "1")
        entry["backends"]["dask"] = {"calibration": [dict(RECORD, seconds=seconds)], "history": []}
        entry["backends"]["numpy"] = {"calibration": [RECORD], "history": []}
        data["backends"].setdefault("dask", {})["start_seconds"] = start

    wisdom.update(change)


def _loaded_quietly() -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = wisdom.load()
        wisdom.update(lambda data: None)  # a write under this configuration
    assert [str(w.message) for w in caught if issubclass(w.category, wisdom.WisdomWarning)] == []
    return data


def test_toggling_the_scheduler_keeps_each_configurations_timings(scheduler, empty_cache):
    spec = _spec("safety.side", _total)
    spec = dataclasses.replace(spec, version="1", implementations={"numpy": _total, "dask": _total})
    scheduler("local")
    _calibrate_dask(seconds=0.5, start=2.0)
    scheduler(None)  # --scheduler dropped: dask cannot run, and its local timings are kept aside, not lost
    data = _loaded_quietly()
    assert set(data["solvers"]["safety.side"]["backends"]["dask"]) == {wisdom.SET_ASIDE}
    assert data["solvers"]["safety.side"]["backends"]["numpy"]["calibration"] == [RECORD]
    saved = json.loads((empty_cache / "wisdom.json").read_text())[wisdom.CONFIGURATIONS]["dask"]
    assert [kept["fingerprint"]["scheduler"] for kept in saved] == ["local"]
    scheduler("tcp://10.0.0.5:8786")  # a remote cluster, measured on its own
    _calibrate_dask(seconds=0.05, start=0.3)
    for _ in range(2):  # back and forth: each configuration gets its own timings back, nothing re-measured
        for address, seconds, start in (("local", 0.5, 2.0), ("tcp://10.0.0.5:8786", 0.05, 0.3)):
            scheduler(address)
            data = _loaded_quietly()
            assert data["solvers"]["safety.side"]["backends"]["dask"]["calibration"] == [dict(RECORD, seconds=seconds)]
            assert data["backends"]["dask"]["start_seconds"] == start
            assert data["backends"]["dask"]["fingerprint"]["scheduler"] == address
            assert history.take_set_aside(spec) == []  # auto-selection has nothing to measure again
            assert history.entry(spec, "dask")["calibration"] == [dict(RECORD, seconds=seconds)]
            assert data["solvers"]["safety.side"]["backends"]["numpy"]["calibration"] == [RECORD]


def test_a_new_configuration_is_measured_and_at_most_four_are_kept(scheduler, empty_cache):
    addresses = [f"tcp://10.0.0.{i}:8786" for i in range(1, 7)]
    for i, address in enumerate(addresses):
        scheduler(address)
        if i:
            data = _loaded_quietly()  # never measured here: marked to measure again, the others kept aside
            assert set(data["solvers"]["safety.side"]["backends"]["dask"]) == {wisdom.SET_ASIDE}
        _calibrate_dask(seconds=float(i + 1), start=0.1)
    saved = json.loads((empty_cache / "wisdom.json").read_text())[wisdom.CONFIGURATIONS]["dask"]
    assert [kept["fingerprint"]["scheduler"] for kept in saved] == addresses[-2:-6:-1]  # most recent first
    scheduler(addresses[2])
    assert _loaded_quietly()["solvers"]["safety.side"]["backends"]["dask"]["calibration"][0]["seconds"] == 3.0
    scheduler(addresses[0])  # the one left longest ago was dropped
    assert set(_loaded_quietly()["solvers"]["safety.side"]["backends"]["dask"]) == {wisdom.SET_ASIDE}


def test_a_malformed_configurations_entry_is_dropped_alone(scheduler, empty_cache):
    scheduler("local")
    _calibrate_dask(seconds=0.5, start=2.0)
    document = json.loads((empty_cache / "wisdom.json").read_text())
    document[wisdom.CONFIGURATIONS] = {"dask": [{"fingerprint": {}, "backend": {}, "solvers": {"x": 3}}, "junk"]}
    (empty_cache / "wisdom.json").write_text(json.dumps(document))
    history.forget()
    with pytest.warns(wisdom.WisdomWarning, match=r"dropped 2 malformed entries .*kept the rest"):
        data = wisdom.load()
    assert data[wisdom.CONFIGURATIONS] == {"dask": [{"fingerprint": {}, "backend": {}, "solvers": {}}]}
    assert data["solvers"]["safety.side"]["backends"]["dask"]["calibration"] == [dict(RECORD, seconds=0.5)]


# -- 5. malformed plugin variables while the parser is built ------------------------------------------

@pytest.mark.parametrize(("variable", "value"), [("CROSSOVER_PLUGINS_STRICT", "maybe"),
                                                 ("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", "2")])
def test_a_malformed_plugin_variable_is_one_line_and_status_2(fresh_registry, monkeypatch, capsys, variable, value):
    monkeypatch.setenv(variable, value)
    registry.reset()
    assert main(["backends"]) == USER_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"crossover: error: {variable}={value!r} is invalid: must be one of 1, true, yes, on, "
                            "0, false, no, off, or unset\n")


def test_the_same_from_a_shell(tmp_path):
    env = {**os.environ, "CROSSOVER_PLUGINS_STRICT": "maybe", "CROSSOVER_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "core.cli", "plugins"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == USER_ERROR and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "CROSSOVER_PLUGINS_STRICT='maybe' is invalid" in done.stderr


# -- 6. progress in a script ------------------------------------------------------------------------------

def test_calibrate_in_a_script_shows_progress_on_stderr(solvers, capsys, monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_SECONDS", 0.2)  # the slow solver's runs take about 1 s in all
    [report] = core.calibrate(["safety.slow"], budget=1.0)
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0] == (f"crossover: calibrating safety.slow: 1 implementation on {report.problems} designed "
                        "problems, 1 s of timed runs")
    during = [line for line in lines[1:-1] if line.startswith("crossover: calibrating safety.slow: ")]
    assert during and all(line.endswith(" s") and f"/{report.problems} measurements" in line for line in during)
    samples = report.backends[0].samples
    assert lines[-1].startswith("crossover: calibrated safety.slow in ") and lines[-1].endswith(f"numpy {samples}")


def test_progress_false_is_silent_and_a_rerun_names_what_it_kept(solvers, capsys):
    core.calibrate(["safety.sum"], budget=5.0, progress=False)
    assert capsys.readouterr().err == ""
    kept = len(_stored("safety.sum")) - 1
    core.calibrate(["safety.sum"], budget=0.000001)
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"samples: numpy 1 (+{kept} kept)")
