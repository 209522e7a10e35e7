"""Checkpoints (core/checkpoint.py) and resumed sweeps, with real files and real processes.

The truth each test holds to: an uninterrupted run's results, bit for bit,
and the points actually computed, counted by the target itself in a file
(the points may run in worker processes).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import checkpoint_targets as targets
import numpy as np
import pytest

import core
from core.checkpoint import CheckpointError, CheckpointWarning, fingerprint, open_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RUN = {"kind": "test", "items": 3}


def same(a, b) -> bool:
    """Equal to the bit, types included (NaN equals NaN; 0.0 and -0.0 differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and np.shape(a) == np.shape(b) and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def same_points(a: list[core.SweepPoint], b: list[core.SweepPoint]) -> bool:
    return len(a) == len(b) and all(same(p.params, q.params) and same(p.outputs, q.outputs) and p.error == q.error
                                    for p, q in zip(a, b))


def strict_json(line: bytes):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(line, parse_constant=refuse)


# -- the store ---------------------------------------------------------------------------------------


def test_values_round_trip_bit_exact_through_the_file(tmp_path):
    nan_payload = np.frombuffer(bytes.fromhex("7ff8000000000123"), dtype=">f8").astype("<f8")
    value = {
        "float64": np.array([0.1, 1 / 3, 5e-324, 1.7976931348623157e308, -0.0, np.nan, np.inf, -np.inf]),
        "payload": nan_payload, "big_endian": np.arange(3, dtype=">f8"), "fortran": np.asfortranarray(np.eye(3)),
        "float32": np.float32(1 / 3), "int": np.int64(-2**62), "bool": np.array([True, False]),
        "complex": np.array([1 + 2j, np.nan * 1j]), "empty": np.zeros((0, 4)), "text": np.array(["ab", "c"]),
        "py_float": 0.1 + 0.2, "py_nan": float("nan"), "py_inf": -float("inf"), "huge_int": 2**80,
        "tuple": (1, "two", None, [3.0]), "nested": {"__ndarray__": "a user's key that looks like a marker"},
    }
    with open_checkpoint(tmp_path / "c.jsonl", RUN) as store:
        store.append(value)
    lines = (tmp_path / "c.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and all(strict_json(line) is not None for line in lines)  # any JSON tool reads it
    with open_checkpoint(tmp_path / "c.jsonl", RUN) as again:
        (back,) = again.records
    assert same(back, value)
    assert back["fortran"].flags.writeable and np.array_equal(back["fortran"], np.eye(3))
    assert fingerprint(value) == fingerprint(back) and fingerprint({"x": 1.0}) != fingerprint({"x": 1})


def test_a_value_it_cannot_store_is_a_clear_error_and_writes_nothing(tmp_path):
    with open_checkpoint(tmp_path / "c.jsonl", RUN) as store:
        with pytest.raises(CheckpointError, match=r"record\['outputs'\]\['fit'\] is a object: a checkpoint holds "
                                                  r"None, bool, int, float, str, lists"):
            store.append({"outputs": {"fit": object()}})
        with pytest.raises(CheckpointError, match=r"is an array of dtype object"):
            store.append({"outputs": np.array([None, 1])})
        with pytest.raises(CheckpointError, match=r"has the key 3 \(int\)"):
            store.append({3: "x"})
    assert len((tmp_path / "c.jsonl").read_bytes().splitlines()) == 1  # the header only


def test_a_cut_off_last_line_is_dropped_with_a_warning_and_the_file_repaired(tmp_path):
    path = tmp_path / "c.jsonl"
    with open_checkpoint(path, RUN) as store:
        for i in range(3):
            store.append({"i": i, "y": np.arange(i + 1.0)})
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # a crash in the middle of the third append
    with pytest.warns(CheckpointWarning, match=r"last line was cut short .* kept the 2 complete records"):
        store = open_checkpoint(path, RUN)
    assert [r["i"] for r in store.records] == [0, 1]
    store.append({"i": 2, "y": np.arange(3.0)})  # lands on a line of its own
    store.close()
    assert path.read_bytes() == whole


@pytest.mark.parametrize("content, message", [
    (b"hello\n", r"is not a crossover checkpoint \(its first line is not a crossover-checkpoint header\); "
                r"delete it to start afresh, or give another checkpoint path"),
    (b"\x00\xff\x00", r"is not a crossover checkpoint \(no complete first line\)"),
    (b"[1, 2]\n", r"is not a crossover checkpoint"),
    (None, r"is corrupt: line 3 is not JSON \(Expecting value\); delete that line to compute its item again, "
           r"or delete the file to start afresh"),
    ("decode", r"is corrupt: line 2 does not decode"),
    ("version", r"has format version 99; this crossover reads version 1"),
])
def test_a_corrupt_file_is_one_clear_error_naming_it(tmp_path, content, message):
    path = tmp_path / "c.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        with open_checkpoint(path, RUN) as store:
            store.append({"i": 0})
            store.append({"i": 1})
        lines = path.read_bytes().splitlines(keepends=True)
        if content is None:
            lines[2] = b"not json\n"
        elif content == "decode":
            lines[1] = b'{"y": {"__ndarray__": {"dtype": "<f8", "shape": [3], "scalar": false, "data": "AA=="}}}\n'
        else:
            lines[0] = lines[0].replace(b'"version":1', b'"version":99')
        path.write_bytes(b"".join(lines))
    with pytest.raises(CheckpointError, match=message) as caught:
        open_checkpoint(path, RUN)
    assert str(path) in str(caught.value)
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)  # no json traceback


def test_another_runs_file_is_refused_naming_what_differs(tmp_path):
    path = tmp_path / "c.jsonl"
    open_checkpoint(path, {"target": "a", "items": 3, "fingerprint": fingerprint([1, 2, 3])}).close()
    with pytest.raises(CheckpointError, match=r"belongs to another run \(fingerprint differs; items: 3 there, 4 "
                                              r"here\); delete it to start afresh, or give another checkpoint path"):
        open_checkpoint(path, {"target": "a", "items": 4, "fingerprint": fingerprint([1, 2, 3, 4])})
    with pytest.raises(CheckpointError, match=r"is a directory"):
        open_checkpoint(tmp_path, RUN)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a directory root could still write")
def test_a_checkpoint_it_cannot_write_is_a_clear_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match=r"cannot be written \(Permission denied\); give a checkpoint path "
                                                  r"in a directory you can write"):
            open_checkpoint(locked / "c.jsonl", RUN)
    finally:
        locked.chmod(0o700)


def test_a_file_in_place_of_its_directory_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match=r"c.jsonl cannot be written \(.*\); give a checkpoint path"):
        open_checkpoint(tmp_path / "file" / "c.jsonl", RUN)


# -- resumed sweeps ----------------------------------------------------------------------------------


def test_a_rerun_skips_every_finished_point_and_gives_identical_results(tmp_path, caplog):
    calls, path = str(tmp_path / "calls"), tmp_path / "sweep.jsonl"
    grid = {"x": [0, 1, 2, 3, 4], "calls": [calls]}
    first = core.sweep(targets.awkward, grid, backend="numpy", checkpoint=path)
    assert sorted(targets.calls_of(calls)) == [0, 1, 2, 3, 4] and not any(p.resumed for p in first)
    seen = []
    with caplog.at_level(logging.WARNING, logger="crossover"):
        again = core.sweep(targets.awkward, grid, backend="numpy", checkpoint=path,
                           on_result=lambda i, p: seen.append((i, p.resumed)))
    assert sorted(targets.calls_of(calls)) == [0, 1, 2, 3, 4]  # nothing computed twice
    assert same_points(again, first) and all(p.resumed for p in again)
    assert [p.seconds for p in again] == [p.seconds for p in first]
    assert seen == [(i, True) for i in range(5)]
    assert f"sweep: checkpoint {path}: 5 of 5 points already done, skipped" in caplog.text


def test_a_sweep_on_the_process_pool_resumes_from_its_checkpoint(tmp_path):
    calls, path = str(tmp_path / "calls"), tmp_path / "sweep.jsonl"
    grid = [{"x": x, "calls": calls} for x in range(6)]
    reference = core.sweep(targets.awkward, grid, backend="numpy")
    first = core.sweep(targets.awkward, grid, backend="process", workers=2, checkpoint=path)
    lines = path.read_bytes().splitlines()
    kept = lines[:1 + 3]  # the header and the first three points to finish: as if killed then
    path.write_bytes(b"\n".join(kept) + b"\n")
    done = {strict_json(line)["index"] for line in kept[1:]}
    before = len(targets.calls_of(calls))
    again = core.sweep(targets.awkward, grid, backend="process", workers=2, checkpoint=path)
    assert sorted(targets.calls_of(calls)[before:]) == sorted(set(range(6)) - done)
    assert same_points(first, reference) and same_points(again, reference)
    assert [p.resumed for p in again] == [i in done for i in range(6)]


def test_failed_points_are_retried_and_succeeded_ones_skipped(tmp_path, caplog):
    calls, fixed, path = str(tmp_path / "calls"), str(tmp_path / "fixed"), tmp_path / "sweep.jsonl"
    grid = {"x": [1, 2, 3], "calls": [calls], "fixed": [fixed]}
    first = core.sweep(targets.fails_until, grid, backend="numpy", checkpoint=path)
    assert [p.ok for p in first] == [True, False, True] and first[1].error == "ValueError: two fails until fixed"
    Path(fixed).touch()
    with caplog.at_level(logging.WARNING, logger="crossover"):
        again = core.sweep(targets.fails_until, grid, backend="numpy", checkpoint=path)
    assert targets.calls_of(calls) == [1, 2, 3, 2]
    assert all(p.ok for p in again) and [p.resumed for p in again] == [True, False, True]
    assert "2 of 3 points already done, skipped; 1 that failed run again" in caplog.text
    third = core.sweep(targets.fails_until, grid, backend="numpy", checkpoint=path)
    assert all(p.resumed for p in third) and targets.calls_of(calls) == [1, 2, 3, 2]


def test_a_different_grid_or_target_is_refused(tmp_path):
    calls, path = str(tmp_path / "calls"), tmp_path / "sweep.jsonl"
    core.sweep(targets.awkward, {"x": [1, 2, 3], "calls": [calls]}, backend="numpy", checkpoint=path)
    with pytest.raises(CheckpointError, match=r"belongs to another run \(grid differs; points: 3 there, 4 here\)"):
        core.sweep(targets.awkward, {"x": [1, 2, 3, 4], "calls": [calls]}, backend="numpy", checkpoint=path)
    with pytest.raises(CheckpointError, match=r"\(grid differs\)"):
        core.sweep(targets.awkward, {"x": [1, 2, 4], "calls": [calls]}, backend="numpy", checkpoint=path)
    with pytest.raises(CheckpointError, match=r"\(target: 'checkpoint_targets:awkward' there, "
                                              r"'checkpoint_targets:slow' here\)"):
        core.sweep(targets.slow, {"x": [1, 2, 3], "calls": [calls]}, backend="numpy", checkpoint=path)
    assert sorted(targets.calls_of(calls)) == [1, 2, 3]


def test_a_cut_off_line_costs_only_its_own_point(tmp_path):
    calls, path = str(tmp_path / "calls"), tmp_path / "sweep.jsonl"
    grid = {"x": [0, 1, 2, 3], "calls": [calls]}
    first = core.sweep(targets.awkward, grid, backend="numpy", checkpoint=path)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.warns(CheckpointWarning, match="kept the 3 complete records") as caught:
        again = core.sweep(targets.awkward, grid, backend="numpy", checkpoint=path)
    assert caught[0].filename == __file__  # the warning points at the user's call, not into core
    assert targets.calls_of(calls) == [0, 1, 2, 3, 3]
    assert same_points(again, first)


def test_ctrl_c_in_a_sweep_keeps_what_finished_and_the_rerun_matches_an_uninterrupted_run(tmp_path):
    calls, flag, path = str(tmp_path / "calls"), str(tmp_path / "flag"), tmp_path / "sweep.jsonl"
    grid = {"x": list(range(6)), "calls": [calls], "flag": [flag]}
    with pytest.raises(KeyboardInterrupt):
        core.sweep(targets.interrupted_at, grid, backend="numpy", checkpoint=path)
    assert [strict_json(line)["index"] for line in path.read_bytes().splitlines()[1:]] == [0, 1, 2]
    resumed = core.sweep(targets.interrupted_at, grid, backend="numpy", checkpoint=path)
    assert targets.calls_of(calls) == [0, 1, 2, 3, 3, 4, 5]
    uninterrupted = core.sweep(targets.interrupted_at, grid, backend="numpy")
    assert same_points(resumed, uninterrupted) and [p.resumed for p in resumed] == [True] * 3 + [False] * 3


def test_a_killed_sweep_resumes_without_recomputing_what_it_wrote(tmp_path):
    """SIGKILL of the process running a sweep on the pool: what reached the file is kept, the rest reruns."""
    calls, path = str(tmp_path / "calls"), tmp_path / "sweep.jsonl"
    grid = [{"x": x, "calls": calls} for x in range(8)]
    script = textwrap.dedent(f"""
        import core, checkpoint_targets
        core.sweep(checkpoint_targets.slow, {grid!r}, backend="process", workers=2, checkpoint={str(path)!r})
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not path.exists() or len(path.read_bytes().splitlines()) < 1 + 3:  # header and three points
            assert child.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline, "no three points in the checkpoint after 120 s"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    done = {strict_json(line)["index"] for line in path.read_bytes().splitlines()[1:]}
    assert 3 <= len(done) < 8
    # the orphaned workers exit when they see their caller gone (pool_lifeline), but one may have begun the
    # next queued point first: its call is logged once the log has been still for a while, not after `before`
    # (one CI run counted point 5 twice)
    before, still_since, deadline = len(targets.calls_of(calls)), time.monotonic(), time.monotonic() + 10
    while time.monotonic() - still_since < 0.5 and time.monotonic() < deadline:
        time.sleep(0.05)
        if len(targets.calls_of(calls)) != before:
            before, still_since = len(targets.calls_of(calls)), time.monotonic()
    resumed = core.sweep(targets.slow, grid, backend="numpy", checkpoint=path)
    assert sorted(targets.calls_of(calls)[before:]) == sorted(set(range(8)) - done)
    uninterrupted = core.sweep(targets.slow, grid, backend="numpy")
    assert same_points(resumed, uninterrupted)


def test_a_solver_sweep_resumes_with_its_outputs_intact(tmp_path):
    path = tmp_path / "sweep.jsonl"
    grid = [{"preset": "lq", "N": 2_000, "Nt": 10}, {"preset": "lq", "N": 2_000, "Nt": 0}]
    first = core.sweep("mfg.fixed_point", grid, backend="numba", checkpoint=path)
    header = strict_json(path.read_bytes().splitlines()[0])
    assert header["run"]["target"] == "mfg.fixed_point" and "solver_version" in header["run"]
    again = core.sweep("mfg.fixed_point", grid, backend="numba", checkpoint=path)
    assert [p.resumed for p in again] == [True, False]  # the invalid point is tried again
    assert same(again[0].outputs, first[0].outputs) and "Nt=0 is invalid" in again[1].error


def test_outputs_or_a_grid_it_cannot_store_are_one_clear_error(tmp_path):
    import fractions

    path = tmp_path / "sweep.jsonl"
    with pytest.raises(CheckpointError, match=r"point 0 \{'numerator': 1\} cannot be stored: record\['outputs'\] "
                                              r"is a Fraction: a checkpoint holds None, bool, int, float, str, .*; "
                                              r"return storable outputs, or sweep without checkpoint="):
        core.sweep(fractions.Fraction, {"numerator": [1, 2]}, backend="numpy", checkpoint=path)
    with pytest.raises(CheckpointError, match=r"grid\[0\]\['numerator'\] is a Fraction"):
        core.sweep(fractions.Fraction, [{"numerator": fractions.Fraction(1)}], backend="numpy",
                   checkpoint=tmp_path / "other.jsonl")
    assert not (tmp_path / "other.jsonl").exists()
