"""`crossover demo` shows the product: per solver what auto chose and why, its time against each fixed
implementation, and the one-offs paid in this process, truthfully, in at most 100 columns.

Fake solvers whose costs are sleeps (so their true times are known), on a backend whose start is a sleep
and an implementation whose first call is slower by a sleep (a JIT compile's shape), each test on a planner
of its own, so "paid in this process" starts from nothing. Every test takes seconds, not the demo's minute.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time

import numpy as np
import pytest
from test_cli_output import _Clock

import core
from core.cli import _print_demo, main
from core.costmodel.planner import Planner, use
from core.running import implementations
from core.validation import check_int

START_SLEEP = 0.3  # the fake backend's start
COMPILE_SLEEP = 0.3  # the extra on fake:quick's first call in a process
SECONDS = {"numpy": 0.06, "fake:quick": 0.01, "fake:optimized_compiled": 0.08}  # steady time per call
LONG_KEY = "fake:optimized_compiled"  # as long as the real "torch:optimized_compiled"


@dataclasses.dataclass(frozen=True)
class SleepProblem:
    n: int = 1

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


class SleepPlugin:
    """One solver, three implementations on numpy and on a backend with a start; fake:quick "compiles" once."""

    def __init__(self, first_call_extra: float = COMPILE_SLEEP):
        self.compiled = False
        self.started = 0
        self.first_call_extra = first_call_extra

    def _start(self) -> None:
        self.started += 1
        time.sleep(START_SLEEP)

    def _sleeper(self, key: str):
        def solve(problem):
            if key == "fake:quick" and not self.compiled:
                self.compiled = True
                time.sleep(self.first_call_extra)
            time.sleep(SECONDS[key])
            return {"n": np.array(problem.n)}
        return solve

    @core.hookimpl
    def crossover_backends(self):
        return [core.Backend(name="fake", summary="fake", probe=lambda: core.Availability(True), start=self._start)]

    @core.hookimpl
    def crossover_solvers(self):
        return [core.SolverSpec(
            name="sleep.work", problem_type=SleepProblem,
            implementations={key: self._sleeper(key) for key in SECONDS},
            features=lambda p: {"n": float(p.n)}, size_axis="n",
            ladder=lambda quick: [SleepProblem(n) for n in (1, 2, 3, 4)],
            memory=lambda p, backend: 8.0, default_problem=SleepProblem,
            summarize=lambda p, out: f"n={int(out['n'])}, slept as asked")]


@pytest.fixture
def sleeper(fresh_registry, empty_cache, monkeypatch):
    """The sleep plugin alone, and a planner of this test's own: nothing paid yet in "this process"."""
    monkeypatch.setenv("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugin = SleepPlugin()
    core.register(plugin, name="sleepers")
    with use(Planner(persist=False)):
        yield plugin


def _demo(capsys, monkeypatch, columns: str = "100") -> str:
    monkeypatch.setenv("COLUMNS", columns)
    assert main(["demo"]) == 0
    return capsys.readouterr().out


def _line(out: str, start: str) -> str:
    """The logical line that begins with ``start`` (the console wraps it: rejoined at the wraps)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(start):
            rest = []
            for following in lines[i + 1:]:
                if not following.strip() or following.startswith(("auto chose", "one-offs", "┏", "│", "└")):
                    break
                rest.append(following)
            return " ".join([line.rstrip(), *(part.strip() for part in rest)])
    raise AssertionError(f"no line starting {start!r} in:\n{out}")


def _row(out: str, key: str) -> list[str]:
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if line.startswith("│") and cells[0] == key:
            return cells
    raise AssertionError(f"no row for {key!r} in:\n{out}")


def _percent(text: str, label: str) -> float:
    match = re.search(rf"(-?\d+)% against {re.escape(label)}", text)
    assert match, (label, text)
    return float(match[1]) / 100


def test_auto_line_names_the_fastest_and_its_saving_against_the_slowest_and_numpy(sleeper, capsys, monkeypatch):
    out = _demo(capsys, monkeypatch)
    auto = _line(out, "auto chose ")
    assert auto.startswith("auto chose fake:quick: lowest predicted time"), auto
    assert "(1 warm run here alone, not calibrated on this machine)" in auto  # the first call is cold
    # the true savings from the sleeps: 1 - 0.01/0.08 = 88 % against the slowest, 1 - 0.01/0.06 = 83 % against
    # numpy; sleeps overshoot by a few ms on a loaded machine, which moves them by a few percent at most
    assert f"against {LONG_KEY} (the slowest)" in auto
    assert abs(_percent(auto, f"{LONG_KEY} (the slowest)") - (1 - 0.01 / 0.08)) < 0.08
    assert abs(_percent(auto, "numpy") - (1 - 0.01 / 0.06)) < 0.1
    assert "slower than" not in auto  # it chose the fastest here
    per_call = {key: float(_row(out, key)[1]) for key in SECONDS}
    for key, seconds in SECONDS.items():
        assert seconds <= per_call[key] < seconds + 0.05, per_call


def test_one_offs_paid_are_listed_with_their_seconds_and_none_on_a_second_run(sleeper, capsys, monkeypatch):
    first = _demo(capsys, monkeypatch)
    paid = _line(first, "one-offs")
    start = re.search(r"fake start (\d+\.\d+) s \(with (\S+)\)", paid)
    assert start and START_SLEEP - 0.01 <= float(start[1]) < START_SLEEP + 0.2, paid
    assert start[2] in ("fake:quick", LONG_KEY)  # the first of the backend's implementations to run
    compiled = re.search(r"fake:quick first run \+(\d+\.\d+) s", paid)
    assert compiled and COMPILE_SLEEP - 0.01 <= float(compiled[1]) < COMPILE_SLEEP + 0.2, paid
    assert "numpy first run" not in paid and f"{LONG_KEY} first run" not in paid  # nothing of theirs to pay
    assert sleeper.started == 1
    # the first call's wait holds what it paid: quick's start (if it started the backend) and its compile
    quick_first = _row(first, "fake:quick")[2]
    assert quick_first.endswith("*") and float(quick_first.rstrip("*")) >= COMPILE_SLEEP + SECONDS["fake:quick"]
    assert all(_row(first, key)[2].endswith("*") for key in SECONDS)

    second = _demo(capsys, monkeypatch)  # the same process: everything was paid by the first demo
    assert _line(second, "one-offs") == "one-offs: none left to pay (paid earlier in this process: fake start)"
    assert sleeper.started == 1
    for key, seconds in SECONDS.items():
        first_call = _row(second, key)[2]
        assert not first_call.endswith("*") and float(first_call) < seconds + 0.05, (key, first_call)


def test_json_gives_every_saving_and_the_one_offs(sleeper, capsys):
    assert main(["demo", "--json"]) == 0
    import json

    payload = json.loads(capsys.readouterr().out)
    auto = next(row for row in payload if row["backend"] == "auto")
    assert auto["chose"] == "fake:quick" and auto["confident"] in (True, False)
    assert set(auto["saving"]) == {"numpy", LONG_KEY}  # against each other implementation that ran
    for key, saving in auto["saving"].items():
        assert abs(saving - (1 - SECONDS["fake:quick"] / SECONDS[key])) < 0.1
    rows = {row["backend"]: row for row in payload if row["backend"] != "auto"}
    assert rows["fake:quick"]["first_run_excess_seconds"] >= COMPILE_SLEEP - 0.01
    assert all(row["paid_here"] for row in rows.values())
    started = [row for row in rows.values() if row["backend_start"] == "here"]
    assert len(started) == 1 and started[0]["start_seconds"] >= START_SLEEP - 0.01


@pytest.mark.parametrize("columns", ["80", "100", "200"])
def test_every_implementation_key_is_whole_and_each_solver_has_its_auto_line(sleeper, capsys, monkeypatch,
                                                                           columns):
    out = _demo(capsys, monkeypatch, columns)
    assert max(len(line) for line in out.splitlines()) <= min(int(columns), 100)
    assert "…" not in out
    for key in SECONDS:
        assert _row(out, key)[0] == key
    assert sum(line.startswith("auto chose ") for line in out.splitlines()) == 1
    assert sum(line.startswith("one-offs") for line in out.splitlines()) == 1


def _fake_sections() -> list[list[dict]]:
    """Every real solver's every implementation key as a row that ran, for the renderer alone."""
    sections = []
    for name, spec in sorted(core.solvers().items()):
        rows = [{"solver": name, "backend": key, "first_call_seconds": 1.25, "first_seconds": 1.0,
                 "repeat_seconds": 0.5, "paid_here": True, "backend_start": None, "start_seconds": 0.0,
                 "first_run": "here", "first_run_excess_seconds": 0.5, "summary": "an answer " * 12}
                for key in implementations(spec)]
        rows.append({"solver": name, "backend": "auto", "chose": rows[0]["backend"], "reason": "lowest predicted",
                     "confident": True, "basis": "its calibrated model", "seconds": 0.5, "saving": {}})
        sections.append(rows)
    return sections


@pytest.mark.parametrize("columns", ["80", "100"])
def test_the_real_keys_are_never_cut_at_80_or_100_columns(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    sections = _fake_sections()
    _print_demo(sections)
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= int(columns)
    shown = {cells[0] for cells in (line.strip("│").split("│") for line in out.splitlines() if line.startswith("│"))}
    keys = {row["backend"] for rows in sections for row in rows if row["backend"] != "auto"}
    assert "torch:optimized_compiled" in keys and "numba:threads" in keys
    assert keys <= {cell.strip() for cell in shown}
    assert sum(line.startswith("auto chose ") for line in out.splitlines()) == len(sections)



def test_a_wait_over_two_seconds_says_how_long_so_far(fresh_registry, empty_cache, monkeypatch, capsys):
    monkeypatch.setenv("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", "1")
    core.register(SleepPlugin(first_call_extra=2.7), name="sleepers")  # a first call as slow as a compile
    clock = _Clock()
    monkeypatch.setattr(sys, "stderr", clock)
    with use(Planner(persist=False)):
        assert main(["demo"]) == 0
    said = {line: at for at, line in clock.lines}
    began = said["crossover demo: sleep.work on fake:quick ..."]
    waits = [(at, line) for at, line in clock.lines if "so far" in line]
    assert len(waits) == 1, waits  # every other wait is shorter than 2 s
    at, line = waits[0]
    assert line == ("crossover demo: sleep.work on fake:quick: 2 s so far, its first call in this process, "
                    "which pays any one-off due (a JIT compile, a pool start)")
    assert 1.9 <= at - began < 2.6


def test_the_demo_of_a_default_problem_is_not_bounded_by_a_quick_calibration(sleeper, capsys, monkeypatch):
    """The default problems run as they are: no model is built first to check them against a time limit."""
    from core import limits
    from core.costmodel import calibrate

    def no_calibration(*args, **kwargs):
        raise AssertionError("the demo calibrated to bound a default problem")

    monkeypatch.setattr(calibrate, "calibrate_solver", no_calibration)
    monkeypatch.setattr(limits, "beyond_design", lambda spec, problem: ["n"])  # as if larger than the design
    out = _demo(capsys, monkeypatch)  # status 0: no pair failed
    assert "failed" not in out and _line(out, "auto chose ").startswith("auto chose fake:quick")
