"""The wisdom store: atomic, shared safely between processes, never trusted blindly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from core.costmodel import history as timings
from core.costmodel import store as wisdom

WRITER = textwrap.dedent("""
    import sys
    from core.costmodel import store as wisdom

    tag, count = sys.argv[1], int(sys.argv[2])
    for i in range(count):
        def change(data, i=i):
            data["solvers"][f"{tag}.s{i}"] = {"version": "1", "backends": {"numpy": {"calibration": [
                {"features": {"n": float(i)}, "seconds": 0.1, "size": float(i)}] * 50}}}
        wisdom.update(change)
""")


def test_two_processes_writing_at_once_leave_a_valid_file_with_both(empty_cache):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, tag, "40"]) for tag in ("alpha", "beta")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    data = json.loads((empty_cache / "wisdom.json").read_text())
    names = set(data["solvers"])
    assert {f"alpha.s{i}" for i in range(40)} <= names and {f"beta.s{i}" for i in range(40)} <= names
    assert not list(empty_cache.glob(".wisdom-*"))  # no temporary files left behind


def test_truncated_file_warns_sets_aside_and_recalibrates(empty_cache):
    import core
    from plugins.example.problem import RandomWalkProblem

    core.solve(RandomWalkProblem(n_walkers=100), backend="numpy")
    wisdom.update(lambda data: data["solvers"].setdefault("x.y", {"version": "1", "backends": {}}))
    path = empty_cache / "wisdom.json"
    path.write_text(path.read_text()[: len(path.read_text()) // 2])  # torn write from a crash
    timings.forget()
    with pytest.warns(wisdom.WisdomWarning, match=r"is not valid JSON \(JSONDecodeError.*calibration will run again"):
        assert wisdom.load()["solvers"] == {}
    assert list(empty_cache.glob("wisdom.json.broken-*"))
    # a plan now recalibrates instead of crashing
    plan = core.plan(RandomWalkProblem(n_walkers=2000), solver="example.random_walk", calibrate=True)
    assert plan.predictions["numpy"].status == "calibrated"


def test_file_from_another_machine_is_not_used(empty_cache):
    wisdom.update(lambda data: data["solvers"].setdefault("x.y", {"version": "1", "backends": {}}))
    path = empty_cache / "wisdom.json"
    data = json.loads(path.read_text())
    data["host"]["cpu"] = "Some Other CPU"
    path.write_text(json.dumps(data))
    timings.forget()
    with pytest.warns(wisdom.WisdomWarning, match="written on another host or software \\(cpu 'Some Other CPU' -> "):
        assert wisdom.load()["solvers"] == {}
    assert list(empty_cache.glob("wisdom.json.stale-*"))


def test_a_file_of_format_2_is_set_aside_with_a_note(empty_cache):
    empty_cache.mkdir()
    (empty_cache / "wisdom.json").write_text(json.dumps({"format": 2, "key": "k", "fingerprint": {}, "solvers": {}}))
    with pytest.warns(wisdom.WisdomWarning, match="in the old format 2") as caught:
        assert wisdom.load()["solvers"] == {}
    assert len(caught) == 1 and list(empty_cache.glob("wisdom.json.format2-*"))


def test_entry_of_another_plugin_version_is_dropped_alone(empty_cache):
    def change(data):
        wisdom.solver_entry(data, "a.b", "1.0")["backends"]["numpy"] = {"calibration": []}
        wisdom.solver_entry(data, "c.d", "2.0")["backends"]["numpy"] = {"calibration": []}

    data = wisdom.update(change)
    assert wisdom.solver_entry(data, "a.b", "1.1")["backends"] == {}
    assert wisdom.solver_entry(data, "c.d", "2.0")["backends"] != {}


def test_fingerprint_names_the_machine_and_versions():
    print_ = wisdom.fingerprint()
    assert print_["cores"] >= 1 and print_["cpu"]
    assert set(print_["versions"]) == {"crossover", "numpy", "numba", "torch"}
    assert isinstance(print_["gpus"], list)


def test_each_backend_is_keyed_by_what_its_timings_depend_on():
    assert set(wisdom.host_fingerprint()) == {"cpu", "cores", "usable_cores", "machine", "python", "crossover"}
    assert {"numba", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER"} <= set(wisdom.backend_fingerprint("numba"))
    assert {"torch", "cuda", "gpus"} <= set(wisdom.backend_fingerprint("torch"))
    assert {"workers", "start_method"} <= set(wisdom.backend_fingerprint("process"))
    assert {"numpy", "OMP_NUM_THREADS"} <= set(wisdom.backend_fingerprint("numpy"))
    assert wisdom.backend_fingerprint("a_plugins_backend") == {"gpus": wisdom.gpu_names()}


def test_the_store_is_plain_json(empty_cache):
    wisdom.update(lambda data: None)
    text = (empty_cache / "wisdom.json").read_text()
    assert json.loads(text)["format"] == wisdom.FORMAT


def test_two_calibrations_at_once_leave_a_usable_file(empty_cache):
    import os

    command = [sys.executable, "-m", "core.cli", "calibrate", "example.random_walk", "--budget", "1.5", "--json"]
    env = {**os.environ, "CROSSOVER_CACHE_DIR": str(empty_cache)}
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    for proc in procs:
        proc.stdout.close()
    timings.forget()
    stored = wisdom.load()  # parses, right fingerprint, no warning
    backends = stored["solvers"]["example.random_walk"]["backends"]
    assert backends["numpy"]["calibration"]
    import core

    spec = core.solvers()["example.random_walk"]
    assert timings.model(spec, "numpy") is not None
