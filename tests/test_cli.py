"""The command line: tables for people, JSON for scripts, status 2 for mistakes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from core.cli import main


def run_json(capsys, *argv: str):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_backends_lists_cpu_backends_available_and_torch_with_a_reason(capsys):
    rows = {row["name"]: row for row in run_json(capsys, "backends")}
    assert rows["numpy"]["available"]
    assert rows["numba"]["available"] and rows["numba"]["details"]["threads"] >= 1
    assert rows["process"]["available"] and rows["process"]["details"]["workers"] >= 1
    if not rows["torch"]["available"]:
        assert rows["torch"]["reason"]


def test_backends_table(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "threads=" in out and "workers=" in out and "torch" in out


def test_plugins_lists_the_example(capsys):
    rows = {row["name"]: row for row in run_json(capsys, "plugins")}
    assert rows["example"]["solvers"] == ["example.random_walk"]
    assert rows["example"]["source"].startswith("entry point of crossover")


def test_run_with_params_and_save(capsys, tmp_path):
    path = tmp_path / "walk.npz"
    payload = run_json(capsys, "run", "example.random_walk", "--backend", "numpy",
                       "--param", "n_walkers=2000", "--param", "drift=1", "--param", "n_steps=10",
                       "--save", str(path))
    assert payload["backend"] == "numpy" and payload["seconds"] > 0
    assert abs(payload["outputs"]["mean"] - 10) < 5 * np.sqrt(10 / 2000)
    saved = np.load(path)
    assert saved["histogram"].sum() == 2000


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "nope.solver"], "unknown solver 'nope.solver'; registered solvers: example.random_walk"),
    (["run", "example.random_walk", "--backend", "gpu"], "unknown backend 'gpu'; registered backends: numpy"),
    (["run", "example.random_walk", "--backend", "numpy", "--param", "walkers=3"],
     "unknown parameter 'walkers' for RandomWalkProblem; valid parameters: n_walkers, n_steps"),
    (["run", "example.random_walk", "--backend", "numpy", "--param", "n_walkers=-3"],
     "n_walkers=-3 is invalid: must be an integer >= 1"),
    (["run", "example.random_walk", "--backend", "numpy", "--param", "n_walkers"],
     "--param 'n_walkers' is invalid: expected KEY=VALUE"),
    (["plan", "example.random_walk", "--param", "n_steps=0"], "n_steps=0 is invalid: must be an integer >= 1"),
    (["evaluate", "nope.solver"], "unknown solver 'nope.solver'"),
    (["calibrate", "nope.solver"], "unknown solver 'nope.solver'"),
])
def test_user_mistakes_exit_2_with_the_choices(capsys, argv, expected):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.count("\n") == 1  # one line, no traceback


def test_unavailable_backend_exits_2(capsys):
    from core import availability

    if availability("torch").available:
        pytest.skip("GPU present")
    assert main(["run", "example.random_walk", "--backend", "torch"]) == 2
    assert "backend 'torch' is unavailable here: torch" in capsys.readouterr().err


def test_demo_runs_every_available_backend(capsys):
    rows = run_json(capsys, "demo")
    ran = {row["backend"] for row in rows if "repeat_seconds" in row}
    assert {"numpy", "numba", "process"} <= ran
    assert all("error" not in row for row in rows)


def test_console_script_is_installed():
    done = subprocess.run([sys.executable, "-m", "core.cli", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("crossover ")


@pytest.fixture
def synthetic_cli(fresh_registry, empty_cache):
    from test_planning import Synthetic

    import core

    core.register(Synthetic(), name="synthetic")


def test_calibrate_plan_report_evaluate(capsys, tmp_path, synthetic_cli):
    calibration = run_json(capsys, "calibrate", "synthetic.work", "--budget", "20")
    rows = {row["backend"]: row for row in calibration[0]["backends"]}
    assert set(rows) == {"serial", "pool", "device"} and all(r["samples"] == 4 for r in rows.values())

    plan = run_json(capsys, "plan", "synthetic.work", "--param", "n=1000")
    assert plan["backend"] in rows and set(plan["predictions"]) == set(rows)

    paths = run_json(capsys, "report", "synthetic.work", "-o", str(tmp_path / "report"))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["synthetic.work.md", "synthetic.work.png"]
    assert (tmp_path / "report" / "synthetic.work.png").read_bytes()[:4] == b"\x89PNG"
    assert "| implementation | intercept s" in (tmp_path / "report" / "synthetic.work.md").read_text()

    evaluation = run_json(capsys, "evaluate", "synthetic.work")
    assert len(evaluation["rows"]) == 5  # 3 midpoints of a 4-rung ladder, then 2x and 4x its top
    assert all(row["regret"] >= 0 for row in evaluation["rows"])
    assert evaluation["median_regret"] >= 0


def test_run_auto_uses_the_plan(capsys, synthetic_cli):
    payload = run_json(capsys, "run", "synthetic.work", "--param", "n=10")
    assert payload["backend"] in {"serial", "pool", "device"}
