"""A broken wisdom store never stops a plan, a solve or a calibration (issue 9).

Each way of breaking the store is tried under each of four operations:
``core.plan``, a solve on a named backend, an auto solve and
``core.calibrate`` of one small synthetic solver. Every case must not
raise, must warn at most once (exactly once where something is wrong),
must keep the timings it measured in this process, and must leave the store
usable: a broken file set aside and a valid one written, or, where the
location cannot be used, nothing touched on disk.

The permission cases run in a subprocess that, when the tests run as root,
first gives up the capabilities that let root ignore file modes, so their
failures are real.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import core
from core.costmodel import history
from core.costmodel import store as wisdom
from core.validation import check_int

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


# -- a tiny solver on two backends, cheap to calibrate ----------------------------------

@dataclasses.dataclass(frozen=True)
class TinyProblem:
    n: int = 100

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def _total(problem):
    return {"total": np.arange(problem.n, dtype=float).sum()}


TINY = core.SolverSpec(name="faults.tiny", problem_type=TinyProblem, implementations={"numpy": _total, "spare": _total},
                       features=lambda p: {"n": float(p.n)}, size_axis="n", memory=lambda p, key: 8.0 * p.n,
                       default_problem=TinyProblem, ladder=lambda quick: [TinyProblem(n) for n in (10, 300, 3000)])


class TinyPlugin:
    @core.hookimpl
    def crossover_backends(self):
        return [core.Backend(name="spare", summary="a second CPU backend", probe=lambda: core.Availability(True),
                             simplicity=30)]

    @core.hookimpl
    def crossover_solvers(self):
        return [TINY]


def install_tiny() -> None:
    if "faults.tiny" not in core.solvers():
        core.register(TinyPlugin(), name="faults")


OPERATIONS: dict[str, Callable[[], object]] = {
    "plan": lambda: core.plan(TinyProblem(500), solver="faults.tiny", calibrate=True).backend,
    "named solve": lambda: core.solve(TinyProblem(500), backend="numpy", solver="faults.tiny").backend,
    "auto solve": lambda: core.solve(TinyProblem(500), solver="faults.tiny").backend,
    "calibrate": lambda: core.calibrate(["faults.tiny"], budget=2.0)[0].error,
}
MEASURES = {"plan", "auto solve", "calibrate"}  # the operations that calibrate, so that a model must exist after


# -- the ways a store can be broken ------------------------------------------------------

GOOD_RECORD = {"features": {"n": 1000.0}, "seconds": 0.001, "size": 1000.0, "source": "calibration", "at": 1.0}


def valid_document() -> dict:
    """A well-formed store for this machine holding one solver the faults must not take with them."""
    return {"format": wisdom.FORMAT, "host": wisdom.host_fingerprint(),
            "backends": {"numpy": {"fingerprint": wisdom.backend_fingerprint("numpy"), "start_seconds": 0.0}},
            "solvers": {"faults.kept": {"version": "0", "backends": {"numpy": {
                "calibration": [dict(GOOD_RECORD, features={"n": float(n)}, size=float(n)) for n in (10, 100, 1000)],
                "history": [], "one_off_seconds": 0.0}}}}}


def _write(cache: Path, content: str | bytes) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / "wisdom.json"
    target.write_bytes(content if isinstance(content, bytes) else content.encode())


def _with_bad_entries(cache: Path) -> None:
    document = valid_document()
    document["solvers"].update({
        "faults.wrong_version": {"version": 3, "backends": {}},
        "faults.list": ["not", "an", "entry"],
        "faults.records": {"version": "0", "backends": {
            "numpy": {"calibration": [GOOD_RECORD, {"features": {"n": "ten"}, "seconds": 1.0},
                                      {"features": {"n": 1.0}, "seconds": float("nan")},
                                      {"features": {"n": 1.0}, "seconds": -1.0}, "a string", {"seconds": 1.0}]},
            "spare": {"calibration": "not a list"}}}})
    document["backends"]["spare"] = {"fingerprint": wisdom.backend_fingerprint("spare"), "start_seconds": -2.0}
    _write(cache, json.dumps(document))


def _with_nan_costs(cache: Path) -> None:
    document = valid_document()
    document["solvers"]["faults.nan"] = {"version": "0", "backends": {"numpy": {
        "calibration": [GOOD_RECORD], "one_off_seconds": float("nan"), "one_off_observations": [float("inf")]}}}
    document["backends"]["numpy"]["start_seconds"] = float("-inf")
    _write(cache, json.dumps(document))  # json writes NaN and -Infinity, which json.loads accepts


def _missing_keys(cache: Path) -> None:
    document = valid_document()
    document["solvers"]["faults.bare"] = {"backends": {}}  # no version
    document["solvers"]["faults.kept"]["backends"]["numpy"]["calibration"].append({"features": {"n": 5.0}})
    document["solvers"]["faults.kept"]["backends"]["spare"] = {"calibration": [GOOD_RECORD]}  # no backend section
    _write(cache, json.dumps(document))


def _truncated(cache: Path) -> None:
    text = json.dumps(valid_document(), indent=1)
    _write(cache, text[: len(text) // 2])


def _other_host(cache: Path) -> None:
    document = valid_document()
    document["host"] = dict(document["host"], cpu="Some Other CPU")
    _write(cache, json.dumps(document))


def _format2(cache: Path) -> None:
    _write(cache, json.dumps({"format": 2, "key": "0123456789abcdef", "fingerprint": {"cpu": "x"}, "solvers": {},
                              "backends": {}}))


def _directory(cache: Path) -> None:
    (cache / "wisdom.json").mkdir(parents=True)
    (cache / "wisdom.json" / "inside").write_text("a user's file")


def _readonly_lock(cache: Path) -> None:
    _write(cache, json.dumps(valid_document()))
    (cache / "wisdom.json.lock").touch()
    (cache / "wisdom.json.lock").chmod(0o444)


def _lock_directory(cache: Path) -> None:
    (cache / "wisdom.json.lock").mkdir(parents=True)


def _symlinked_lock(cache: Path) -> None:
    cache.mkdir(parents=True)
    (cache.parent / "elsewhere").write_text("not a lock")
    (cache / "wisdom.json.lock").symlink_to(cache.parent / "elsewhere")


def _symlinked_file(cache: Path) -> None:
    cache.mkdir(parents=True)
    (cache.parent / "elsewhere.json").write_text(json.dumps(valid_document()))
    (cache / "wisdom.json").symlink_to(cache.parent / "elsewhere.json")


def _cache_is_a_file(cache: Path) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("a user's file, named as the cache directory")


def _under_a_file(cache: Path) -> Path:
    _cache_is_a_file(cache)
    return cache / "sub"  # the directory can never be created


# name: (how to break it, what must follow). What follows:
#   aside   - one warning; the file is renamed aside and a valid store is written in its place
#   dropped - one warning; the bad entries are gone and faults.kept survives
#   memory  - one warning; the store runs in memory and the disk is left as it was
#   fine    - no warning; nothing was wrong enough to matter
BREAKS: dict[str, tuple[Callable[[Path], Path | None], str]] = {
    "json list": (lambda c: _write(c, "[1, 2, 3]"), "aside"),
    "json string": (lambda c: _write(c, '"wisdom"'), "aside"),
    "wrong nested types": (_with_bad_entries, "dropped"),
    "NaN and negative costs": (_with_nan_costs, "dropped"),
    "missing keys": (_missing_keys, "dropped"),
    "non-UTF-8 bytes": (lambda c: _write(c, b'{"format": 3, "\xff\xfe": 1}'), "aside"),
    "truncated JSON": (_truncated, "aside"),
    "deeply nested JSON": (lambda c: _write(c, "[" * 200_000), "aside"),
    "empty file": (lambda c: _write(c, ""), "aside"),
    "another host": (_other_host, "aside"),
    "old format 2": (_format2, "aside"),
    "wisdom.json is a directory": (_directory, "aside"),
    "read-only lock file": (_readonly_lock, "fine"),
    "lock is a directory": (_lock_directory, "memory"),
    "symlinked lock": (_symlinked_lock, "memory"),
    "symlinked wisdom file": (_symlinked_file, "memory"),
    "cache dir is a regular file": (_cache_is_a_file, "memory"),
    "cache dir under a regular file": (_under_a_file, "memory"),
}


def _snapshot(base: Path) -> dict[str, bytes | None]:
    """Every path under ``base`` and its content, to show that an in-memory store touched nothing."""
    found: dict[str, bytes | None] = {}
    for path in sorted(base.rglob("*")):
        found[str(path.relative_to(base))] = path.read_bytes() if path.is_file() and not path.is_symlink() else None
    return found


def run_case(base: Path, break_it: Callable[[Path], Path | None], operation: str) -> dict:
    """Break a store under ``base``, run one operation on it, and say what happened (JSON-friendly)."""
    cache = base / "cache"
    cache = break_it(cache) or cache
    os.environ["CROSSOVER_CACHE_DIR"] = str(cache)
    history.forget()
    install_tiny()
    before = _snapshot(base)
    outcome: dict = {"error": ""}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome["answer"] = OPERATIONS[operation]()
            history.flush()  # what exit would do: write the solve's timing
        except Exception as exc:  # the point of the test: say what escaped instead of stopping here
            outcome["error"] = f"{type(exc).__name__}: {exc}"
    outcome["warnings"] = [str(w.message) for w in caught if issubclass(w.category, wisdom.WisdomWarning)]
    outcome["model"] = history.model(TINY, "numpy") is not None
    outcome["untouched"] = _snapshot(base) == before
    path = cache / "wisdom.json"
    outcome["set_aside"] = sorted(p.name for p in cache.glob("wisdom.json.*-*")) if cache.is_dir() else []
    try:
        document = json.loads(path.read_text()) if path.is_file() and not path.is_symlink() else None
    except ValueError:
        document = None
    outcome["valid_file"] = bool(document) and document.get("format") == wisdom.FORMAT
    outcome["kept"] = bool(document) and "faults.kept" in document.get("solvers", {})
    outcome["temporaries"] = [p.name for p in cache.glob(".wisdom-*")] if cache.is_dir() else []
    return outcome


def check_outcome(outcome: dict, expected: str, operation: str) -> None:
    assert outcome["error"] == "", outcome
    assert len(outcome["warnings"]) == (0 if expected == "fine" else 1), outcome["warnings"]
    assert all("\n" not in message for message in outcome["warnings"])
    if operation in MEASURES:
        assert outcome["model"], "the timings measured in this process were lost"
    assert outcome["temporaries"] == []
    if expected == "memory":
        assert outcome["untouched"], "an unusable store must be left as it was"
        assert "in memory" in outcome["warnings"][0]
    elif expected == "aside":
        assert len(outcome["set_aside"]) == 1 and outcome["valid_file"], outcome
        assert "moved to wisdom.json." in outcome["warnings"][0]
    else:
        assert outcome["valid_file"] and not outcome["set_aside"], outcome
    if expected == "dropped":
        assert outcome["kept"] and "dropped" in outcome["warnings"][0]


@pytest.fixture
def tiny(fresh_registry, tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSOVER_CACHE_DIR", str(tmp_path / "unused"))  # restored after the test
    install_tiny()
    yield tmp_path
    history.forget()


@pytest.mark.parametrize("operation", list(OPERATIONS))
@pytest.mark.parametrize("way", list(BREAKS))
def test_a_broken_store_never_stops_the_work(tiny, way, operation):
    break_it, expected = BREAKS[way]
    check_outcome(run_case(tiny, break_it, operation), expected, operation)


def test_bad_entries_are_dropped_one_by_one(tiny):
    _with_bad_entries(tiny / "cache")
    os.environ["CROSSOVER_CACHE_DIR"] = str(tiny / "cache")
    history.forget()
    with pytest.warns(wisdom.WisdomWarning, match=r"dropped 9 malformed entries \(.* and 6 more\); kept the rest"):
        data = wisdom.load()
    assert set(data["solvers"]) == {"faults.kept", "faults.records"}
    records = data["solvers"]["faults.records"]["backends"]
    assert records["numpy"]["calibration"] == [GOOD_RECORD] and "spare" not in records
    assert "start_seconds" not in data["backends"]["spare"]  # the bad start cost alone went


# -- permission faults, as a user that file modes bind -------------------------------------

PERMISSION_CASES = textwrap.dedent("""
    import json, os, sys, tempfile
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import test_store_faults as t

    results = {}
    for way in ("read-only directory", "read-only directory with a file", "uncreatable directory"):
        for operation in t.OPERATIONS:
            base = Path(tempfile.mkdtemp(dir=sys.argv[2]))
            results[f"{way} / {operation}"] = t.run_case(base, t.PERMISSION_BREAKS[way][0], operation)
    print(json.dumps(results))
""")


def _readonly(cache: Path) -> None:
    cache.mkdir(parents=True)
    cache.chmod(0o555)


def _readonly_with_file(cache: Path) -> None:
    _write(cache, json.dumps(valid_document()))
    cache.chmod(0o555)


def _uncreatable(cache: Path) -> Path:
    cache.mkdir(parents=True)
    cache.chmod(0o555)
    return cache / "sub"


PERMISSION_BREAKS = {"read-only directory": (_readonly, "memory"),
                     "read-only directory with a file": (_readonly_with_file, "memory"),
                     "uncreatable directory": (_uncreatable, "memory")}


def _modes_bind() -> None:
    """Before exec: as root, give up the capabilities that ignore file modes, so that they bind."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, out of the bounding set
            if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_permission_faults_never_stop_the_work():
    base = Path(tempfile.mkdtemp(prefix="crossover-perm-"))
    base.chmod(0o777)
    try:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "CROSSOVER_DISABLE_PLUGIN_AUTOLOAD": "1"}
        done = subprocess.run([sys.executable, "-c", PERMISSION_CASES, str(TESTS), str(base)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300, preexec_fn=_modes_bind)
        assert done.returncode == 0, done.stderr[-3000:]
        results = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for path in base.rglob("*"):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)
    assert len(results) == 3 * len(OPERATIONS)
    for case, outcome in results.items():
        way, operation = case.split(" / ")
        check_outcome(outcome, PERMISSION_BREAKS[way][1], operation)
    # a readable file in a read-only directory is still used: its solver is there to plan with
    assert all("cannot write in" in r["warnings"][0] or "cannot create the lock" in r["warnings"][0]
               for case, r in results.items() if case.startswith("read-only directory"))


# -- writers killed mid-write ------------------------------------------------------------

KILLED_WRITER = textwrap.dedent("""
    import os, sys, time
    from core.costmodel import store as wisdom

    real_fsync = os.fsync

    def fsync_then_hang(descriptor):
        real_fsync(descriptor)
        print("written", flush=True)  # the temporary file is complete; os.replace has not run
        time.sleep(600)

    wisdom.os.fsync = fsync_then_hang
    wisdom.update(lambda data: data["solvers"].setdefault("faults.doomed", {"version": "0", "backends": {}}))
""")


def _kill_mid_write(cache: Path) -> int:
    env = {**os.environ, "CROSSOVER_CACHE_DIR": str(cache)}
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline().strip() == "written"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
    return writer.pid


def test_writers_killed_mid_write_leave_no_temporary_files(empty_cache):
    wisdom.update(lambda data: data["solvers"].setdefault("faults.first", {"version": "0", "backends": {}}))
    pids = [_kill_mid_write(empty_cache) for _ in range(3)]
    # each killed writer left its full temporary file; each next writer removed its dead predecessor's
    left = [p.name for p in empty_cache.glob(".wisdom-*")]
    assert len(left) == 1 and left[0].startswith(f".wisdom-{pids[-1]}-"), left
    assert set(json.loads((empty_cache / "wisdom.json").read_text())["solvers"]) == {"faults.first"}  # intact
    history.forget()
    wisdom.update(lambda data: data["solvers"].setdefault("faults.next", {"version": "0", "backends": {}}))
    assert list(empty_cache.glob(".wisdom-*")) == []
    assert set(json.loads((empty_cache / "wisdom.json").read_text())["solvers"]) == {"faults.first", "faults.next"}


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    return gone.pid


def test_stale_temporaries_are_removed_by_the_next_reader(empty_cache):
    wisdom.update(lambda data: None)
    dead = empty_cache / f".wisdom-{_dead_pid()}-abc123.tmp"
    live_recent = empty_cache / f".wisdom-{os.getppid()}-def456.tmp"  # our parent: alive, maybe mid-write
    live_old = empty_cache / f".wisdom-{os.getppid()}-ghi789.tmp"
    unnamed_old = empty_cache / ".wisdom-jkl012.json"  # an older version's name, without a pid
    for path in (dead, live_recent, live_old, unnamed_old):
        path.write_text("{}")
    an_hour_ago = time.time() - 3600
    for path in (live_old, unnamed_old):
        os.utime(path, (an_hour_ago, an_hour_ago))
    history.forget()
    wisdom.load()
    assert sorted(empty_cache.glob(".wisdom-*")) == [live_recent]


# -- per-backend keys --------------------------------------------------------------------

WRITE_EVERY_BACKEND = textwrap.dedent("""
    import json
    from core.costmodel import store as wisdom
    from core.costmodel import history

    record = {"features": {"n": 1.0}, "seconds": 0.5, "size": 1.0}

    def change(data):
        entry = wisdom.solver_entry(data, "faults.all", "0")
        for key in ("numpy", "numba", "numba:fused", "process", "torch", "torch:eager"):
            entry["backends"][key] = {"calibration": [record], "history": [], "one_off_seconds": 0.25}

    wisdom.update(change)
    for backend in ("numpy", "numba", "process", "torch"):
        history.record_start(backend, 0.125)
""")

READ_BACK = textwrap.dedent("""
    import json, warnings
    from core.costmodel import history
    from core.costmodel import store as wisdom

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = history.stored()
        history.record_start("numpy", 0.125)  # a write: what is on disk now follows this configuration
    entry = data["solvers"].get("faults.all", {"backends": {}})
    print(json.dumps({"implementations": sorted(k for k, slot in entry["backends"].items() if "calibration" in slot),
                      "set_aside": sorted(k for k, slot in entry["backends"].items() if "set_aside" in slot),
                      "starts": sorted(b for b, s in data["backends"].items() if "start_seconds" in s),
                      "warnings": [str(w.message) for w in caught if issubclass(w.category, wisdom.WisdomWarning)]}))
""")


def _in_process_with(cache: Path, script: str, **env: str) -> dict:
    environment = {**os.environ, "CROSSOVER_CACHE_DIR": str(cache), **env}
    environment.pop("NUMBA_NUM_THREADS", None)
    environment.update(env)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def test_changing_numba_threads_keeps_the_other_backends_timings(tmp_path):
    cache = tmp_path / "cache"
    _in_process_with(cache, WRITE_EVERY_BACKEND, NUMBA_NUM_THREADS="1")
    changed = _in_process_with(cache, READ_BACK, NUMBA_NUM_THREADS="2")
    assert changed["implementations"] == ["numpy", "process", "torch", "torch:eager"]
    assert changed["set_aside"] == ["numba", "numba:fused"]  # marked, so that auto-selection measures them again
    assert changed["starts"] == ["numpy", "process", "torch"]
    assert len(changed["warnings"]) == 1
    message = changed["warnings"][0]
    assert "NUMBA_NUM_THREADS '1' -> '2'" in message and "set aside the timings of numba " in message
    assert "kept those of numpy, process, torch" in message
    # back to one thread: numba's timings are gone (they were set aside), the rest still kept; no timing was
    # lost this time (only the marks), so nothing to warn about
    again = _in_process_with(cache, READ_BACK, NUMBA_NUM_THREADS="1")
    assert again == dict(changed, warnings=[])


def test_installing_torch_sets_aside_only_torch(empty_cache):
    def change(data):
        entry = wisdom.solver_entry(data, "faults.all", "0")
        for key in ("numpy", "numba:fused", "torch:eager"):
            entry["backends"][key] = {"calibration": [GOOD_RECORD]}

    wisdom.update(change)
    document = json.loads((empty_cache / "wisdom.json").read_text())
    document["backends"]["torch"]["fingerprint"]["torch"] = "absent"
    (empty_cache / "wisdom.json").write_text(json.dumps(document))
    history.forget()
    with pytest.warns(wisdom.WisdomWarning, match=r"torch: torch 'absent' -> .*set aside the timings of torch "
                                                  r"\(measured again .*\), kept those of numba, numpy"):
        data = wisdom.load()
    assert data["solvers"]["faults.all"]["backends"]["torch:eager"] == {"set_aside": "torch 'absent' -> "
                                                                          f"'{wisdom.backend_fingerprint('torch')['torch']}'"}
    assert all("calibration" in data["solvers"]["faults.all"]["backends"][key] for key in ("numba:fused", "numpy"))


def test_fingerprint_does_not_import_torch(tmp_path):
    script = ("import sys; from core.costmodel import store; store.backend_fingerprint('torch'); store.fingerprint(); "
              "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


@pytest.mark.parametrize("fault", ["torn", "deleted"])
def test_timings_of_this_process_survive_a_file_broken_under_it(empty_cache, fresh_registry, fault):
    install_tiny()
    core.calibrate(["faults.tiny"], budget=2.0)
    path = empty_cache / "wisdom.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if fault == "torn":
            path.write_text("{ torn")  # another program broke the file after we wrote it
        else:
            path.unlink()
        history.record_start("numpy", 0.5)  # the next write re-reads the file and must keep our calibration
    messages = [str(w.message) for w in caught if issubclass(w.category, wisdom.WisdomWarning)]
    assert len(messages) == (1 if fault == "torn" else 0) and all("is not valid JSON" in m for m in messages)
    written = json.loads(path.read_text())
    assert {"numpy", "spare"} <= set(written["solvers"]["faults.tiny"]["backends"])
    assert history.model(TINY, "numpy") is not None


def test_timings_of_this_process_survive_another_configurations_write(empty_cache, monkeypatch):
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)

    def change(data):
        entry = wisdom.solver_entry(data, "faults.all", "0")
        for key in ("numpy", "numba:fused"):
            entry["backends"][key] = {"calibration": [GOOD_RECORD]}

    wisdom.update(change)
    # a process with another NUMBA_NUM_THREADS rewrote numba's part since
    document = json.loads((empty_cache / "wisdom.json").read_text())
    document["backends"]["numba"]["fingerprint"]["NUMBA_NUM_THREADS"] = "7"
    document["solvers"]["faults.all"]["backends"]["numba:fused"]["calibration"] = [dict(GOOD_RECORD, seconds=9.0)]
    (empty_cache / "wisdom.json").write_text(json.dumps(document))
    with pytest.warns(wisdom.WisdomWarning, match="NUMBA_NUM_THREADS '7' -> 'default'"):
        history.record_start("numpy", 0.5)
    written = json.loads((empty_cache / "wisdom.json").read_text())
    assert written["solvers"]["faults.all"]["backends"]["numba:fused"]["calibration"] == [GOOD_RECORD]  # ours
    assert written["backends"]["numba"]["fingerprint"] == wisdom.backend_fingerprint("numba")


# -- any shape: random values anywhere in a valid document ---------------------------------

KEPT = dataclasses.replace(TINY, name="faults.kept", implementations={"numpy": _total})
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


def _replace_somewhere(document: dict, draw) -> str:
    """Replace one value at a random depth of ``document`` with a random JSON value; return where."""
    node, where = document, "document"
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            node, where = child, f"{where}[{key!r}]"
            continue
        node[key] = draw(JSON_VALUES)
        return f"{where}[{key!r}]"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_malformed_value_anywhere_is_dropped_or_set_aside(data, fresh_registry, tmp_path_factory):
    document = valid_document()
    document["backends"]["spare"] = {"fingerprint": wisdom.backend_fingerprint("spare"), "start_observations": [0.1]}
    document["solvers"]["faults.kept"]["backends"]["spare"] = json.loads(json.dumps(  # a copy: it gets mutated
        {"calibration": [GOOD_RECORD], "history": [GOOD_RECORD]}))
    where = _replace_somewhere(document, data.draw)
    cache = tmp_path_factory.mktemp("fuzz")
    (cache / "wisdom.json").write_text(json.dumps(document))
    os.environ["CROSSOVER_CACHE_DIR"] = str(cache)
    history.forget()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = history.stored()
        for implementation in ("numpy", "spare"):
            history.samples(KEPT, implementation)
            history.model(KEPT, implementation)  # what plan and solve use: must work on what was kept
            history.backend_one_off(implementation)
        history.record_start("numpy", 0.25)  # and the store still takes writes
    assert len([w for w in caught if issubclass(w.category, wisdom.WisdomWarning)]) <= 1, where
    assert loaded["format"] == wisdom.FORMAT
    for entry in loaded["solvers"].values():
        for slot in entry["backends"].values():
            for record in slot.get("calibration", []) + slot.get("history", []):
                assert record["seconds"] >= 0 and all(v >= 0 for v in record["features"].values()), where
    assert json.loads((cache / "wisdom.json").read_text())["format"] == wisdom.FORMAT


def test_auto_selection_measures_again_only_what_was_set_aside(empty_cache, fresh_registry, caplog):
    install_tiny()
    core.calibrate(["faults.tiny"], budget=2.0)
    path = empty_cache / "wisdom.json"
    document = json.loads(path.read_text())
    numpy_before = document["solvers"]["faults.tiny"]["backends"]["numpy"]["calibration"]
    document["backends"]["spare"]["fingerprint"]["gpus"] = ["A GPU since removed"]
    path.write_text(json.dumps(document))
    history.forget()
    now = re.escape(repr(str(wisdom.gpu_names())))  # '[]' here, "['NVIDIA H200']" on a GPU host
    with pytest.warns(wisdom.WisdomWarning, match=r"gpus \"\['A GPU since removed'\]\" -> " + now
                      + r".*set aside the timings of spare"):
        core.solve(TinyProblem(500), solver="faults.tiny")
    assert "measuring spare again" in caplog.text
    assert history.model(TINY, "spare") is not None
    after = json.loads(path.read_text())["solvers"]["faults.tiny"]["backends"]
    assert after["numpy"]["calibration"] == numpy_before  # kept, not measured again
    assert "set_aside" not in after["spare"] and after["spare"]["calibration"]
    history.forget()
    core.solve(TinyProblem(500), solver="faults.tiny")  # a later process: nothing left to measure again
    assert caplog.text.count("measuring spare again") == 1


@pytest.mark.parametrize("fault", [{"at": []}, {"at": "today"}, {"nominal": {"n": "x"}}, {"fields": [1.0]}])
def test_a_record_whose_time_stamp_or_work_fields_are_malformed_is_dropped(fault, fresh_registry, empty_cache):
    """A calibration record with "at": [] (what the fuzz test above drew once) made the model's fit raise
    "unhashable type: 'list'" on every plan: such a record is dropped as the store is read, and the rest fit."""
    document = valid_document()
    document["solvers"]["faults.kept"]["backends"]["numpy"]["calibration"][0].update(fault)
    empty_cache.mkdir(parents=True, exist_ok=True)
    (empty_cache / "wisdom.json").write_text(json.dumps(document))
    history.forget()
    with pytest.warns(wisdom.WisdomWarning, match="calibration\\[0\\] has"):
        assert len(history.stored()["solvers"]["faults.kept"]["backends"]["numpy"]["calibration"]) == 2
    assert history.model(KEPT, "numpy") is not None


@pytest.mark.parametrize("keys", [{"a": 1}, ["(3,)", 3], "(3,)"])
def test_a_malformed_list_of_compiled_shapes_is_dropped_alone(keys, fresh_registry, empty_cache):
    """The shapes this machine compiled (Planner.compiled_here) are a list of strings: anything else is dropped
    as the store is read, and says so, and the pair's timings stay (a cached compile is charged as a new one)."""
    document = valid_document()
    document["solvers"]["faults.kept"]["backends"]["numpy"]["compiled_keys"] = keys
    empty_cache.mkdir(parents=True, exist_ok=True)
    (empty_cache / "wisdom.json").write_text(json.dumps(document))
    history.forget()
    with pytest.warns(wisdom.WisdomWarning, match="compiled_keys"):
        slot = history.stored()["solvers"]["faults.kept"]["backends"]["numpy"]
    assert "compiled_keys" not in slot and len(slot["calibration"]) == 3
    assert history.model(KEPT, "numpy") is not None


@pytest.mark.parametrize("fault", [{"shape_one_off_seconds": -1.0}, {"shape_one_off_seconds": "fast"},
                                   {"shape_one_off_observations": [0.1, float("nan")]},
                                   {"cached_one_off_observations": [-0.1]},
                                   {"shape_one_off_pairs": [[0.1, 0.01], [0.2]]},
                                   {"shape_one_off_pairs": [[0.1, -0.01]]}, {"shape_one_off_pairs": {"a": 1}}])
def test_a_malformed_shape_one_off_drops_its_slot(fault, fresh_registry, empty_cache):
    """A shape's one-off is stored as the whole one-off is (a median of observations): one that is not a time
    drops its slot as the store is read, and says so; the rest stays."""
    document = valid_document()
    document["solvers"]["faults.kept"]["backends"]["numpy"].update(fault)
    empty_cache.mkdir(parents=True, exist_ok=True)
    (empty_cache / "wisdom.json").write_text(json.dumps(document))
    history.forget()
    with pytest.warns(wisdom.WisdomWarning, match="(shape|cached)_one_off"):
        assert "numpy" not in history.stored()["solvers"]["faults.kept"]["backends"]
