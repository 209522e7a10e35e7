"""What the command line leaves behind and shows: saved files, strict JSON, closed pipes, Ctrl-C, the demo.

Real processes and signals where the behaviour is the process's own (a
closed pipe, SIGINT); fake solvers in a fresh registry where only the CLI's
handling is under test, so those tests take a second, not the demo's minute.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import core
import core.cli
from core.cli import dumps, main
from core.validation import check_int

TESTS = Path(__file__).parent
ROOT = TESTS.parent
CLI = [sys.executable, "-m", "core.cli"]


def no_constants(name: str):
    raise AssertionError(f"not strict JSON: {name}")


def strict_json(text: str):
    return json.loads(text, parse_constant=no_constants)


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


# -- fake solvers ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TinyProblem:
    n: int = 4

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def _non_finite(problem):
    return {"values": np.array([np.nan, np.inf, -np.inf, 1.5]), "scalar": np.array(np.nan)}


def _slow(problem):
    """Sleeps 20 ms per unit of n and leaves a line in $SLOW_MARKER per call (the test watches it)."""
    with open(os.environ["SLOW_MARKER"], "a") as marker:
        marker.write(f"{problem.n}\n")
    time.sleep(0.02 * problem.n)
    return {"n": np.array(problem.n)}


def _backend(name: str) -> core.Backend:
    return core.Backend(name=name, summary="fake", probe=lambda: core.Availability(True))


def _spec(name, implementations, **extra) -> core.SolverSpec:
    options = {"features": lambda p: {"n": float(p.n)}, "size_axis": "n",
               "ladder": lambda quick: [TinyProblem(n) for n in (1, 2, 3, 4, 5, 6, 7, 8)],
               "memory": lambda p, backend: 8.0 * p.n, "default_problem": TinyProblem}
    options.update(extra)
    return core.SolverSpec(name=name, problem_type=TinyProblem, implementations=implementations, **options)


class NonFinitePlugin:
    @core.hookimpl
    def crossover_solvers(self):
        return [_spec("fake.nonfinite", {"numpy": _non_finite},
                      summarize=lambda p, out: f"values {out['values'].tolist()}")]


class SlowPlugin:
    """Two implementations on two backends with nothing to start: calibration is only their sleeps."""

    @core.hookimpl
    def crossover_backends(self):
        return [_backend("slow_a"), _backend("slow_b")]

    @core.hookimpl
    def crossover_solvers(self):
        return [_spec("slow.work", {"slow_a": _slow, "slow_b": _slow})]


# -- --save ---------------------------------------------------------------------------

RUN = ["run", "example.random_walk", "--backend", "numpy", "--param", "n_walkers=1000", "--param", "n_steps=10"]


def test_save_bare_name_writes_npz_and_reports_that_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, "--save", "bare"]) == 0
    out = capsys.readouterr().out
    assert "outputs saved to bare.npz" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare.npz"]  # no 'bare', no temporary left
    assert np.load(tmp_path / "bare.npz")["histogram"].sum() == 1000


@pytest.mark.parametrize("trailing_slash", [True, False])
def test_save_into_a_directory_writes_a_named_file_inside(capsys, tmp_path, trailing_slash):
    folder = tmp_path / "results"
    folder.mkdir()
    payload = strict_json(_run_json(capsys, [*RUN, "--save", str(folder) + ("/" if trailing_slash else "")]))
    files = list(folder.iterdir())
    assert len(files) == 1 and re.fullmatch(r"example\.random_walk-\d{8}-\d{6}\.npz", files[0].name)
    assert payload["saved"] == str(files[0])
    assert np.load(files[0])["histogram"].sum() == 1000


def _run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("target", "expected"), [
    ("missing/out.npz", "directory '{tmp}/missing' does not exist"),
    ("missing/", "directory '{tmp}/missing' does not exist"),
    ("a_file/out.npz", "directory '{tmp}/a_file' is not a directory"),
])
def test_save_to_a_bad_path_fails_before_solving(capsys, tmp_path, monkeypatch, target, expected):
    (tmp_path / "a_file").write_text("not a directory")

    def no_solve(*args, **kwargs):
        raise AssertionError("solved although the result could not be saved")

    monkeypatch.setattr(core, "solve", no_solve)
    text = f"{tmp_path}/{target}"  # as typed: a trailing slash stays
    assert main([*RUN, "--save", text]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"crossover: error: --save '{text}'")
    assert expected.format(tmp=tmp_path) in line


def test_a_write_that_fails_after_the_solve_keeps_the_result_in_a_fallback(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "vanishing"
    folder.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "fallback"))
    (tmp_path / "fallback").mkdir()
    real_solve = core.solve

    def solve_then_lose_the_directory(*args, **kwargs):
        result = real_solve(*args, **kwargs)
        folder.rmdir()  # the directory goes away while the solve runs
        return result

    monkeypatch.setattr(core, "solve", solve_then_lose_the_directory)
    assert main([*RUN, "--save", str(folder / "out.npz")]) == 1
    captured = capsys.readouterr()
    line = one_line(captured.err)
    fallback = list((tmp_path / "fallback").iterdir())
    assert len(fallback) == 1 and fallback[0].suffix == ".npz"
    assert line == (f"crossover: error: could not write '{folder / 'out.npz'}': No such file or directory; "
                    f"the outputs were saved to {fallback[0]} instead")
    assert np.load(fallback[0])["histogram"].sum() == 1000
    assert "walkers binned" in captured.out  # the answer is still shown


# -- report -o ---------------------------------------------------------------------------

@pytest.mark.parametrize(("target", "expected"), [
    ("existing.txt", "-o '{path}' is an existing file; name a directory (it is created if missing)"),
    ("existing.txt/sub", "-o '{path}': cannot create the directory: Not a directory"),
])
def test_report_to_an_unusable_path_is_one_line_before_any_calibration(capsys, tmp_path, monkeypatch, target,
                                                                          expected):
    (tmp_path / "existing.txt").write_text("keep me")
    calibrated = []
    monkeypatch.setattr("core.costmodel.calibrate.ensure_calibrated", calibrated.append)
    path = tmp_path / target
    assert main(["report", "example.random_walk", "-o", str(path)]) == 2
    assert one_line(capsys.readouterr().err) == "crossover: error: " + expected.format(path=path)
    assert calibrated == [] and (tmp_path / "existing.txt").read_text() == "keep me"


# -- strict JSON ---------------------------------------------------------------------------

def test_dumps_writes_null_for_nan_and_infinities_everywhere():
    payload = {"a": math.nan, "b": [math.inf, -math.inf, 1.0], "c": np.array([np.nan, 2.0]), "d": np.float32("inf"),
               "e": {"f": (np.float64("nan"), 3)}, "g": np.int64(7), "h": Path("/x")}
    assert strict_json(dumps(payload)) == {"a": None, "b": [None, None, 1.0], "c": [None, 2.0], "d": None,
                                           "e": {"f": [None, 3]}, "g": 7, "h": "/x"}


def test_run_json_with_non_finite_outputs_is_strict(capsys, fresh_registry, empty_cache):
    core.register(NonFinitePlugin(), name="nonfinite")
    payload = strict_json(_run_json(capsys, ["run", "fake.nonfinite", "--backend", "numpy"]))
    assert payload["outputs"] == {"values": [None, None, None, 1.5], "scalar": None}
    assert payload["summary"] == "values [nan, inf, -inf, 1.5]"  # a string may say nan: it is valid JSON


@pytest.mark.parametrize("command", ["backends", "plugins"])
def test_every_plain_command_prints_strict_json(capsys, command):
    strict_json(_run_json(capsys, [command]))


# -- closed pipes -----------------------------------------------------------------------

def test_json_into_a_closed_pipe_exits_quietly():
    """The reader has gone before anything is written (as after `| head -1` has its line)."""
    process = subprocess.Popen([*CLI, "backends", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT)
    process.stdout.close()
    _, err = process.communicate(timeout=60)
    assert err.decode() == "" and process.returncode == core.cli.BROKEN_PIPE


def test_json_piped_to_head_prints_its_first_line_and_no_traceback():
    done = subprocess.run(f"{sys.executable} -m core.cli plugins --json | head -1", shell=True, capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert done.stdout == "[\n" and done.stderr == ""


# -- Ctrl-C ---------------------------------------------------------------------------------

CALIBRATE_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import core
from core.cli import main
from test_cli_output import SlowPlugin
core.register(SlowPlugin(), name="slow")
sys.exit(main(["calibrate", "slow.work", "--budget", "300"]))
"""


def test_ctrl_c_during_calibrate_keeps_what_was_measured(tmp_path, fresh_registry, empty_cache, monkeypatch):
    marker = tmp_path / "calls"
    marker.touch()
    monkeypatch.setenv("SLOW_MARKER", str(marker))
    monkeypatch.setenv("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", "1")
    script = tmp_path / "calibrate_slow.py"
    script.write_text(CALIBRATE_SCRIPT.format(tests=str(TESTS)))
    # a runner started in the background may ignore SIGINT, and children inherit that: restore the default
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # each sample is a warm-up and at least 3 timed calls, and the two take turns: after 9 calls both
    # have measured n=1, and the second sample of slow_a (n=2) is under way
    deadline = time.monotonic() + 120
    while len(marker.read_text().splitlines()) < 9:
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = process.communicate(timeout=30)
    assert time.monotonic() - sent < 5
    assert process.returncode == core.cli.INTERRUPTED and out == ""
    line = one_line(err)
    found = re.fullmatch(r"crossover: interrupted: kept the timings of (\d) implementations already measured: "
                         r"slow\.work slow_a \((\d) samples?\), slow\.work slow_b \((\d) samples?\)", line)
    assert found, line
    kept = {"slow_a": int(found[2]), "slow_b": int(found[3])}
    assert found[1] == "2" and kept["slow_a"] >= 1 and kept["slow_b"] >= 1

    from core.costmodel import history

    core.register(SlowPlugin(), name="slow")
    history.forget()  # read what the killed process left in the store
    spec = core.solvers()["slow.work"]
    assert {key: len(history.samples(spec, key)) for key in kept} == kept
    assert sorted(s.features["n"] for s in history.samples(spec, "slow_a")) == [float(n) for n in
                                                                               range(1, kept["slow_a"] + 1)]


@pytest.mark.parametrize(("argv", "expected"), [
    (["demo"], "crossover: interrupted: the demo stopped during demo.bad_solve on numpy; 0 runs finished, "
               "nothing else to keep"),
    (["run", "demo.good", "--backend", "numpy"], "crossover: interrupted: run stopped; it had nothing to keep"),
])
def test_ctrl_c_elsewhere_is_one_line_and_status_130(capsys, demo_registry, monkeypatch, argv, expected):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(core, "solve", interrupted)
    assert main(argv) == core.cli.INTERRUPTED
    assert one_line(capsys.readouterr().err.splitlines(keepends=True)[-1]) == expected


# -- the demo -----------------------------------------------------------------------------

BROKEN = {"default": False}


class DemoPlugin:
    """A good solver with a long answer, one whose default problem raises, one whose solve raises."""

    @core.hookimpl
    def crossover_solvers(self):
        long_answer = "word " * 60

        def broken_default():
            if BROKEN["default"]:  # registration checks the default problem: it breaks later
                raise RuntimeError("no default today")
            return TinyProblem()

        def broken_solve(problem):
            raise ZeroDivisionError("broken kernel")

        return [_spec("demo.good", {"numpy": lambda p: {"n": np.array(p.n)}},
                      summarize=lambda p, out: f"n={int(out['n'])}; {long_answer}"),
                _spec("demo.no_default", {"numpy": lambda p: {"n": np.array(p.n)}}, default_problem=broken_default),
                _spec("demo.bad_solve", {"numpy": broken_solve})]


@pytest.fixture
def demo_registry(fresh_registry, empty_cache, monkeypatch):
    monkeypatch.setenv("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", "1")  # the fakes only: a second, not a minute
    core.register(DemoPlugin(), name="demo_fakes")
    monkeypatch.setitem(BROKEN, "default", True)


@pytest.mark.parametrize("columns", [None, "100", "200"])
def test_demo_table_fits_100_columns_and_a_broken_plugin_is_named(capsys, demo_registry, monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert main(["demo"]) == 1  # two solvers failed
    captured = capsys.readouterr()
    widths = [len(line) for line in captured.out.splitlines()]
    assert max(widths) <= 100, captured.out
    flat = re.sub(r"[│\s]+", " ", captured.out)  # the table's wrapped cells as one text
    assert "n=4; word word" in flat and "demo.good" in flat
    assert "ZeroDivisionError: broken kernel" in flat
    blamed = [line for line in captured.err.splitlines() if "plugin 'demo_fakes'" in line]
    assert len(blamed) == 2, captured.err
    default, solve = sorted(blamed, key=lambda line: "demo.bad_solve" in line)
    assert "demo.no_default" in default and "RuntimeError: no default today" in default
    assert "demo.bad_solve" in solve and "ZeroDivisionError: broken kernel" in solve


def test_demo_json_lists_every_solver_with_its_fault(capsys, demo_registry):
    assert main(["demo", "--json"]) == 1
    payload = strict_json(capsys.readouterr().out)
    rows = {row["solver"]: row for row in payload if row["backend"] != "auto"}
    auto = {row["solver"]: row for row in payload if row["backend"] == "auto"}
    assert rows["demo.good"]["summary"].startswith("n=4")
    assert auto["demo.good"]["chose"] == "numpy" and "demo.no_default" not in auto  # no problem: nothing to plan
    assert "no backend can run demo.bad_solve" in auto["demo.bad_solve"]["unavailable"]
    assert "RuntimeError: no default today" in rows["demo.no_default"]["error"]
    assert "demo_fakes" in rows["demo.bad_solve"]["error"]
    assert "ZeroDivisionError: broken kernel" in rows["demo.bad_solve"]["error"]


class _Clock:
    """A stderr that remembers when each line was written."""

    def __init__(self):
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.lines += [(time.monotonic(), line) for line in text.splitlines() if line]
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_demo_shows_progress_at_once_and_before_each_run(demo_registry, monkeypatch, capsys):
    clock = _Clock()
    monkeypatch.setattr(sys, "stderr", clock)
    real_solve, solves = core.solve, []

    def slow_solve(*args, **kwargs):
        solves.append((time.monotonic(), len(clock.lines)))
        time.sleep(1.5)  # a solve that takes longer than the progress may wait
        return real_solve(*args, **kwargs)

    monkeypatch.setattr(core, "solve", slow_solve)
    began = time.monotonic()
    main(["demo"])
    first_at, first = clock.lines[0]
    assert first.startswith("crossover demo: 3 solvers") and first_at - began < 1.0
    assert solves and solves[0][1] >= 2  # the first line and "demo.good on numpy ..." came before the first solve
    said = [line for _, line in clock.lines]
    assert "crossover demo: demo.good on numpy ..." in said and "crossover demo: demo.bad_solve on numpy ..." in said


DEMO_SCRIPT = """
import sys
import core
import plugins.example
from core.cli import main
core.register(plugins.example, name="example")
sys.exit(main(["demo"]))
"""


def test_demo_subprocess_speaks_before_it_solves(tmp_path):
    """A real demo process (the example plugin alone): its first line arrives long before its table."""
    script = tmp_path / "demo_example.py"
    script.write_text(DEMO_SCRIPT)
    env = {**os.environ, "CROSSOVER_CACHE_DIR": str(tmp_path), "CROSSOVER_DISABLE_PLUGIN_AUTOLOAD": "1"}
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, env=env)
    first = process.stderr.readline()
    first_at = time.monotonic() - began
    # the rest through the same stream objects: communicate() reads the pipes' descriptors, and would lose
    # lines that readline() has already buffered (they arrive in one chunk when the demo starts quickly)
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.append(process.stdout.read()))
    reader.start()
    rest = process.stderr.read()
    reader.join(timeout=300)
    process.wait(timeout=300)
    out = printed[0]
    total = time.monotonic() - began
    assert first.startswith("crossover demo: 1 solver,")
    # Python's imports come first (about 1 s on an idle 2-core VM, several when it is shared); then
    # the first line, long before the solves end (the in-process test above holds it to 1 s)
    assert first_at < total / 2, (first_at, total)
    assert max(len(line) for line in out.splitlines()) <= 100
    assert process.returncode == 0, rest
    assert "example.random_walk on numpy ..." in rest and "example.random_walk" in out


# -- stable one-line summaries -----------------------------------------------------------

ESTIMATE = re.compile(r"(-?\d+(?:\.\d+)?) ± (\d+(?:\.\d+)?)")


def _estimates(summary: str) -> tuple[str, list[tuple[float, float, float]]]:
    """The summary with each 'value ± error' replaced by a mark, and (value, error, printed unit) of each."""
    found = []
    for match in ESTIMATE.finditer(summary):
        decimals = len(match[2].partition(".")[2])
        found.append((float(match[1]), float(match[2]), 10.0 ** -decimals))
    return ESTIMATE.sub("<estimate>", summary), found


def agree(first: str, second: str) -> None:
    """Same words, and each estimate within 5 combined standard errors (plus rounding) of the other's."""
    text_a, values_a = _estimates(first)
    text_b, values_b = _estimates(second)
    assert text_a == text_b, (first, second)
    assert values_a, first
    for (a, error_a, unit), (b, error_b, _) in zip(values_a, values_b):
        # each printed error is rounded to its unit: at most half a unit below the true one
        bound = 5 * math.hypot(error_a + unit / 2, error_b + unit / 2) + unit
        assert abs(a - b) <= bound, (first, second)


# (solver, parameters, two implementations whose random streams differ)
PAIRS = [
    ("example.random_walk", {}, ("numpy", "numba")),
    ("mfg.fp_particle", {}, ("numpy", "numba:fused")),
    ("mfg.fixed_point", {"N": 20_000}, ("numpy", "numba")),
    ("mfg.common_noise", {"K": 4, "N": 2000}, ("numpy", "numba")),
]


@pytest.mark.parametrize(("solver", "params", "backends"), PAIRS, ids=[p[0] for p in PAIRS])
def test_summaries_of_two_backends_agree_within_their_printed_errors(solver, params, backends):
    spec = core.solvers()[solver]
    problem = dataclasses.replace(spec.default_problem(), **params) if params else spec.default_problem()
    summaries = [spec.summarize(problem, core.solve(problem, backend=b, solver=solver).outputs) for b in backends]
    agree(*summaries)
    assert "peaks at" not in summaries[0]


def test_random_walk_summary_covers_the_exact_answer():
    spec = core.solvers()["example.random_walk"]
    problem = spec.default_problem()
    _, [(mean, mean_error, _), (variance, variance_error, _)] = _estimates(
        spec.summarize(problem, core.solve(problem, backend="numpy").outputs))
    assert abs(mean - problem.exact_mean) <= 5 * mean_error + 0.01
    assert abs(variance - problem.exact_variance) <= 5 * variance_error + 0.1


def test_hjb_summary_is_deterministic_across_backends():
    spec = core.solvers()["mfg.hjb_fdm"]
    problem = spec.default_problem()
    first, second = (spec.summarize(problem, core.solve(problem, backend=b).outputs) for b in ("numpy", "numba"))
    assert first == second


def test_summary_of_a_density_reads_its_moments():
    """The FP summary's mean and std are the particles' (checked on a made-up output)."""
    from plugins.mfg.specs import fp_summary

    problem = core.solvers()["mfg.fp_particle"].default_problem()
    outputs = {"mass": np.ones(problem.Nt + 1), "moments": np.array([[0.5, 0.01]] * (problem.Nt + 1))}
    std_error = 0.1 / math.sqrt(problem.N)
    assert fp_summary(problem, outputs) == (
        f"N={problem.N:,} particles, {problem.Nt} steps: mass 1 (within 1e-9); at T: "
        f"mean 0.5000 ± {std_error:.4f}, std 0.1000 ± {std_error / math.sqrt(2):.4f}")
