"""The wisdom store: this machine's measurements, as one JSON file.

- Location: ``CROSSOVER_CACHE_DIR`` or the platform cache directory.
- Keyed in two parts. The *host* part (CPU model and cores, architecture,
  Python, crossover's version) must match or the whole file is set aside.
  Each *backend* keeps its own fingerprint (numba: its version,
  ``NUMBA_NUM_THREADS`` and threading layer; torch: its version, CUDA and
  the GPU names; ...) next to its timings, so a change that concerns one
  backend sets aside that backend's timings only, and the warning names the
  fields that changed. Each solver's entry also carries its plugin's
  version, and an entry from another plugin version is dropped on its own.
- A broken store never stops a plan, a solve or a calibration: a file that
  cannot be read or parsed is renamed aside, a malformed entry is dropped on
  its own, and a location that cannot be used (a file where the directory
  should be, no permission, a symlinked lock or file) makes the store run in
  memory for the rest of the process. Each is one warning of one line.
- Writes are atomic (temporary file, fsync, ``os.replace``) under an
  exclusive lock, and every write re-reads the file first, so two processes
  calibrating at once both keep their samples. Temporary files carry their
  writer's pid; the next reader or writer removes those a dead writer left.
- One calibration at a time: :func:`calibrating` holds a second lock file
  (``wisdom.json.calibrating``) for a whole calibration, so a second one,
  in another process or thread, says that it waits and waits, rather than
  measuring on cores the first one is timing on and racing it to the file.
- A calibration adds to the stored samples, never replaces them with fewer:
  :func:`merge_calibration` is the rule.
- Configurations side by side: a backend whose configuration is chosen per
  command (``dask``: the scheduler, through ``--scheduler``) keeps the timings
  of its last :data:`MAX_CONFIGURATIONS` configurations under
  ``"configurations"``. A change of configuration puts the current timings
  there and takes back those of the new configuration if it was measured
  before, so toggling ``--scheduler local`` neither loses a calibration nor
  measures again. Other backends' configurations change rarely (a new numba,
  another thread count), and their old timings are set aside as below.
- JSON only: a cache must never be able to execute code when read.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import json
import math
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import platformdirs

from core.backend import usable_cores
from core.backends import dask_cluster

FORMAT = 3  # 3: a host fingerprint plus one fingerprint per backend (2: one fingerprint for everything)
FILENAME = "wisdom.json"
TEMP_PREFIX = ".wisdom-"  # a temporary file is .wisdom-<pid>-<random>.tmp
STALE_TEMP_SECONDS = 600.0  # a temporary file this old is abandoned even if its pid now names a live process
LOCK_TIMEOUT = 30.0  # a lock held longer than this belongs to a hung process: go on without the file
MAX_LISTED = 3  # faults named in one warning line
SET_ASIDE = "set_aside"  # an implementation entry holding only this key: its timings were set aside, measure again
CONFIGURATIONS = "configurations"  # the document's key for the timings of other configurations, per backend
SIDE_BY_SIDE = frozenset({"dask"})  # backends whose configuration is a per-command choice: kept per configuration
MAX_CONFIGURATIONS = 4  # other configurations kept per backend; the one left longest ago goes first
# samples one implementation's calibration keeps: every designed problem of a full calibration (at most 48) and a
# quick one (at most 32) measured twice over, with room; beyond it, the oldest stored samples go first
MAX_CALIBRATION_SAMPLES = 160
CALIBRATION_LOCK_SUFFIX = ".calibrating"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OPEN_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


class WisdomWarning(UserWarning):
    """The wisdom store was (partly) unusable; what was set aside is named, and crossover went on."""


def cache_dir() -> Path:
    configured = os.environ.get("CROSSOVER_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_cache_dir("crossover"))


def wisdom_path() -> Path:
    return cache_dir() / FILENAME


# -- fingerprints --------------------------------------------------------------------

def cpu_model() -> str:
    """The CPU's model name (Linux), else what ``platform`` says: for fingerprints and benchmark headers."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def _env(*names: str) -> dict[str, str]:
    return {name: os.environ.get(name, "default") for name in names}


@lru_cache(maxsize=1)
def gpu_names() -> list[str]:
    """The host's GPU names, read without importing torch (which costs seconds in a fresh process)."""
    names = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        with contextlib.suppress(OSError):
            names += [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                      if line.startswith("Model:")]
    if names:
        return names
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=3)
            if listed.returncode == 0:
                return [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return ["Apple MPS"]
    return []


def _torch_build() -> dict[str, str]:
    """torch's CUDA/HIP build, read from ``torch/version.py`` as text: importing torch costs seconds."""
    build = {"cuda": "none", "hip": "none"}
    try:
        spec = find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return build
        source = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
        for node in ast.parse(source).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and target.id in build and getattr(node, "value", None) is not None:
                build[target.id] = str(ast.literal_eval(node.value) or "none")
    except (OSError, SyntaxError, ValueError, TypeError, ImportError):
        pass
    return build


def _process_workers() -> int | str:
    from core.backends.process_pool import default_workers

    try:
        return default_workers()
    except Exception:  # a malformed CROSSOVER_WORKERS is reported where the pool starts, not here
        return f"CROSSOVER_WORKERS={os.environ.get('CROSSOVER_WORKERS')!r}"


def _dask_print() -> dict[str, Any]:
    """The scheduler (its address, or a local cluster's size) and dask's version; never connects.

    A remote cluster's worker count is not here: it enters the model as the
    span and rounds features, so a resized cluster is predicted, not forgotten.
    """
    try:
        address = dask_cluster.scheduler_address()
    except Exception:  # a malformed CROSSOVER_DASK_SCHEDULER is reported where the backend is probed
        address = f"{dask_cluster.SCHEDULER_VARIABLE}={os.environ.get(dask_cluster.SCHEDULER_VARIABLE)!r}"
    local = {"workers": dask_cluster.local_workers()} if address == dask_cluster.LOCAL else {}
    return {"scheduler": address, **local, "distributed": _version("distributed"), "numpy": _version("numpy"),
            "numba": _version("numba")}


def _process_start_method() -> str:
    from core.backends.process_pool import start_method

    return start_method()


# what each built-in backend's timings depend on beyond the host; a plugin's backend gets _generic_print
_BACKEND_PRINTS: dict[str, Callable[[], dict[str, Any]]] = {
    "numpy": lambda: {"numpy": _version("numpy"), "scipy": _version("scipy"),
                      **_env("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
    # how long OpenMP's idle threads spin (core/backends/openmp_spin.py) changes small kernels' times too, and
    # so does yielding busy cores (core/backends/host_load.py)
    "numba": lambda: {"numba": _version("numba"), **_env("NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER",
                                                          "GOMP_SPINCOUNT", "OMP_WAIT_POLICY",
                                                          "CROSSOVER_YIELD_BUSY_CORES")},
    # workers run numpy and numba kernels with one thread each: the parent's thread settings do not matter
    "process": lambda: {"workers": _process_workers(), "start_method": _process_start_method(),
                        "numpy": _version("numpy"), "numba": _version("numba")},
    "dask": _dask_print,
    "torch": lambda: {"torch": _version("torch"), **_torch_build(), "gpus": gpu_names(),
                      **_env("CUDA_VISIBLE_DEVICES")},
}


def _generic_print() -> dict[str, Any]:
    # a plugin's backend may run on a GPU; what else it depends on only its plugin knows (its version keys solvers)
    return {"gpus": gpu_names()}


@lru_cache(maxsize=1)
def _host_text() -> str:
    return json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "usable_cores": usable_cores(),
                       "machine": platform.machine(), "python": platform.python_version(),
                       "crossover": _version("crossover-solvers")})  # the key stays: stored fingerprints use it


@cache
def _backend_text(backend: str) -> str:
    return json.dumps(_BACKEND_PRINTS.get(backend, _generic_print)())


# the fingerprints are cached as JSON text and returned as fresh objects: a document that holds one may be
# changed in place, and the cache must not change with it; JSON also compares equal to what a file gives back
def host_fingerprint() -> dict[str, Any]:
    """What must match for any stored timing to be valid here."""
    return json.loads(_host_text())


def backend_fingerprint(backend: str) -> dict[str, Any]:
    """What must match, beyond the host, for one backend's stored timings (computed on first need)."""
    return json.loads(_backend_text(backend))


def fingerprint() -> dict[str, Any]:
    """The host and the versions, for people (tables, reports); the keys are the two parts above."""
    return {**host_fingerprint(), "gpus": list(gpu_names()),
            "versions": {"crossover": _version("crossover-solvers"),
                         **{dist: _version(dist) for dist in ("numpy", "numba", "torch")}}}


def empty() -> dict[str, Any]:
    return {"format": FORMAT, "host": host_fingerprint(), "backends": {}, "solvers": {}}


def _backend_of(implementation: str) -> str:
    return implementation.split(":", 1)[0]


# -- this process's state ------------------------------------------------------------

@dataclass
class _State:
    path: Path
    memory: dict[str, Any] | None = None  # the last good document read or written (this process's timings)
    in_memory: bool = False  # the location is unusable: never touch the disk again in this process


_state: _State | None = None
_warned: set[str] = set()


def _current() -> _State:
    global _state
    path = wisdom_path()
    if _state is None or _state.path != path:
        _state = _State(path)
    return _state


def forget() -> None:
    """Drop this process's copy and what it warned about (tests, or a new cache directory)."""
    global _state
    _state = None
    _warned.clear()
    _backend_text.cache_clear()  # a test may have changed NUMBA_NUM_THREADS or CROSSOVER_WORKERS


def _outside_core() -> int:
    """The stack level of the first caller outside crossover's core, so that a warning points at the user's call."""
    core = str(Path(__file__).resolve().parents[1])
    frame, level = sys._getframe(2), 2  # _warn's caller, which is stacklevel 2 of the warn in _warn
    while frame is not None and frame.f_code.co_filename.startswith(core):
        frame, level = frame.f_back, level + 1
    return level


def _warn(message: str) -> None:
    message = " ".join(message.splitlines())  # names read from a file may hold line breaks: one line still
    if message not in _warned:  # one line per fault, however often the file is re-read
        _warned.add(message)
        warnings.warn(message, WisdomWarning, stacklevel=_outside_core())


class _Unusable(Exception):
    """The location cannot be used; the store goes on in memory."""


class _Broken(Exception):
    """The file cannot be used as a whole; it is set aside. ``kind`` names the set-aside copy."""

    def __init__(self, kind: str, why: str):
        super().__init__(why)
        self.kind = kind


def _go_in_memory(state: _State, why: str) -> dict[str, Any]:
    state.in_memory = True
    _warn(f"wisdom store unusable: {why}; timings are kept in memory for this process only")
    if state.memory is None:
        state.memory = empty()
    return state.memory


# -- reading -------------------------------------------------------------------------

def _is_symlink(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _kind_of(mode: int) -> str:
    return "a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"


def _read_text(path: Path) -> str | None:
    """The file's text, None if there is none; never follows a symlink and never blocks on a FIFO."""
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or _is_symlink(path):
            raise _Unusable(f"{path} is a symbolic link (refused: it could point anywhere)") from None
        if exc.errno == errno.ENOTDIR:  # the cache directory is a file: nothing to read, writes will say so
            return None
        raise _Broken("broken", f"cannot be read ({exc.strerror})") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise _Broken("broken", f"is {_kind_of(mode)}")
    with os.fdopen(descriptor, "rb") as handle:
        raw = handle.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Broken("broken", f"is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None


def _parse(text: str) -> dict[str, Any]:
    """The document, checked as a whole: JSON, a wisdom document, this format and this host."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _Broken("broken", f"is not valid JSON ({type(exc).__name__}: {str(exc)[:60]})") from None
    if not isinstance(data, dict):
        raise _Broken("broken", f"holds a JSON {type(data).__name__}, not a wisdom document")
    if data.get("format") == 2:
        raise _Broken("format2", "is in the old format 2 (one fingerprint for every backend), "
                                 "which cannot say which timings are still valid")
    if data.get("format") != FORMAT:
        raise _Broken("broken", f"has format {str(data.get('format'))[:20]!r}, not {FORMAT}")
    host = data.get("host")
    if not isinstance(host, dict):
        raise _Broken("broken", "has no host fingerprint")
    changed = _changes(host, host_fingerprint())
    if changed:
        raise _Broken("stale", f"was written on another host or software ({changed})")
    return data


def _changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The fields that differ, with old and new values: ``NUMBA_NUM_THREADS '2' -> '1'``."""
    keys = [key for key in sorted(set(old) | set(new), key=str) if old.get(key) != new.get(key)]
    return ", ".join(f"{key} {str(old.get(key, '(none)'))[:40]!r} -> {str(new.get(key, '(none)'))[:40]!r}"
                     for key in keys)


# -- checking entry by entry ---------------------------------------------------------

def _is_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _record_fault(record: Any) -> str:
    if not isinstance(record, dict):
        return f"is a {type(record).__name__}"
    features = record.get("features")
    if not isinstance(features, dict) or not all(_is_time(v) for v in features.values()):
        return "has features that are not finite numbers >= 0"  # what check_spec asks of a solver's features
    if not _is_time(record.get("seconds")):
        return f"has seconds={str(record.get('seconds'))[:20]}"
    for key in ("size", "at"):  # "at" keys the process's shared fits (planner._fit): a list there raised
        if key in record and not _is_number(record[key]):
            return f"has {key}={str(record[key])[:20]}"
    for key in ("nominal", "fields"):  # what the expected-work model reads (planner._work_observation)
        if key in record and not (isinstance(record[key], dict) and all(_is_number(v) for v in record[key].values())):
            return f"has {key} that are not numbers"
    return ""


def _observed_fault(slot: dict[str, Any], what: str) -> str:
    """A stored one-off (``one_off``, ``shape_one_off``, ``start``) and its observations: finite and >= 0, or
    absent."""
    if f"{what}_seconds" in slot and not _is_time(slot[f"{what}_seconds"]):
        return f"has {what}_seconds={str(slot[f'{what}_seconds'])[:20]}"
    observations = slot.get(f"{what}_observations", [])
    if not isinstance(observations, list) or not all(_is_time(v) for v in observations):
        return f"has {what}_observations that are not times"
    return ""


def _slot_fault(slot: Any) -> str:
    if not isinstance(slot, dict):
        return f"is a {type(slot).__name__}"
    for key in ("calibration", "history"):
        if not isinstance(slot.get(key, []), list):
            return f"has a {key} that is not a list"
    if not isinstance(slot.get("details", {}), dict):
        return "has details that are not a mapping"
    pairs = slot.get("shape_one_off_pairs", [])
    if not isinstance(pairs, list) or not all(isinstance(pair, list) and len(pair) == 2 and all(map(_is_time, pair))
                                              for pair in pairs):
        return "has shape_one_off_pairs that are not pairs of times"
    return (_observed_fault(slot, "one_off") or _observed_fault(slot, "shape_one_off")
            or _observed_fault(slot, "cached_one_off"))


def _clean_records(slot: dict[str, Any], where: str, dropped: list[str]) -> None:
    for key in ("calibration", "history"):
        if key in slot:
            kept = []
            for index, record in enumerate(slot[key]):
                fault = _record_fault(record)
                if fault:
                    dropped.append(f"{where}.{key}[{index}] {fault}")
                else:
                    kept.append(record)
            slot[key] = kept


def _clean_solver(name: str, entry: Any, dropped: list[str]) -> bool:
    """Drop the solver's malformed implementation entries and samples; False if the entry is unusable."""
    if not isinstance(entry, dict) or not isinstance(entry.get("version"), str) or \
            not isinstance(entry.get("backends"), dict):
        dropped.append(f"solver {name!r} (not an entry with a version and backends)")
        return False
    for implementation, slot in list(entry["backends"].items()):
        where = f"{name!r} on {implementation!r}"  # repr: a key read from the file may hold a newline
        fault = _slot_fault(slot)
        if fault:
            dropped.append(f"{where} {fault}")
            del entry["backends"][implementation]
        else:
            _clean_records(slot, where, dropped)
            _clean_compiled_keys(slot, where, dropped)
    return True


def _clean_compiled_keys(slot: dict[str, Any], where: str, dropped: list[str]) -> None:
    """Drop a malformed list of the shapes this machine compiled (Planner.compiled_here) alone: without it a
    cached compile is charged as a new one, and the pair's timings are kept."""
    keys = slot.get("compiled_keys", [])
    if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys):
        dropped.append(f"{where} compiled_keys (not a list of strings)")
        del slot["compiled_keys"]


def _clean_backend(name: str, section: Any, dropped: list[str]) -> bool:
    if not isinstance(section, dict) or not isinstance(section.get("fingerprint"), dict):
        dropped.append(f"backend {name!r} (no fingerprint)")
        return False
    fault = _observed_fault(section, "start")
    if fault:
        dropped.append(f"backend {name!r} start cost ({fault})")
        for key in ("start_seconds", "start_observations"):
            section.pop(key, None)
    return True


def _clean_configuration(backend: str, item: Any, dropped: list[str]) -> bool:
    """One kept configuration of ``backend``: its fingerprint, backend section and solver entries."""
    where = f"{CONFIGURATIONS}[{backend!r}]"
    if not isinstance(item, dict) or not all(isinstance(item.get(key), dict)
                                             for key in ("fingerprint", "backend", "solvers")):
        dropped.append(f"{where} entry (not a fingerprint with a backend and solvers)")
        return False
    if _observed_fault(item["backend"], "start"):
        dropped.append(f"{where} start cost ({_observed_fault(item['backend'], 'start')})")
        item["backend"] = {}
    for name, entry in list(item["solvers"].items()):
        if not _clean_solver(name, entry, dropped):
            del item["solvers"][name]
    return True


def _clean_configurations(data: dict[str, Any], dropped: list[str]) -> None:
    shelf = data.get(CONFIGURATIONS)
    if shelf is None:
        return
    if not isinstance(shelf, dict):
        dropped.append(f"{CONFIGURATIONS!r} (not a mapping)")
        del data[CONFIGURATIONS]
        return
    for backend, kept in list(shelf.items()):
        if not isinstance(kept, list):
            dropped.append(f"{CONFIGURATIONS}[{backend!r}] (not a list)")
            del shelf[backend]
            continue
        shelf[backend] = [item for item in kept if _clean_configuration(backend, item, dropped)]


def _clean(data: dict[str, Any], path: Path) -> None:
    """Keep every well-formed entry and drop the others, naming them in one warning."""
    dropped: list[str] = []
    for key, check in (("solvers", _clean_solver), ("backends", _clean_backend)):
        if not isinstance(data.get(key), dict):
            dropped.append(f"{key!r} (not a mapping)")
            data[key] = {}
        for name, value in list(data[key].items()):
            if not check(name, value, dropped):
                del data[key][name]
    _clean_configurations(data, dropped)
    # timings of a backend without a fingerprint cannot be checked against this machine
    unchecked = _implementations(data, lambda backend: backend not in data["backends"])
    for solver, implementation in unchecked:
        dropped.append(f"{solver!r} on {implementation!r} (its backend has no fingerprint)")
        del data["solvers"][solver]["backends"][implementation]
    if dropped:
        more = f" and {len(dropped) - MAX_LISTED} more" if len(dropped) > MAX_LISTED else ""
        _warn(f"wisdom file {path}: dropped {len(dropped)} malformed entries ({'; '.join(dropped[:MAX_LISTED])}"
              f"{more}); kept the rest")


def _implementations(data: dict[str, Any], which: Callable[[str], bool]) -> list[tuple[str, str]]:
    return [(solver, implementation) for solver, entry in data["solvers"].items()
            for implementation in entry["backends"] if which(_backend_of(implementation))]


def _has_timings(data: dict[str, Any], backend: str) -> bool:
    slots = [data["solvers"][solver]["backends"][key] for solver, key in _implementations(data, backend.__eq__)]
    return "start_seconds" in data["backends"][backend] or any(set(slot) != {SET_ASIDE} for slot in slots)


def _shelve(data: dict[str, Any], backend: str) -> dict[str, Any] | None:
    """The file's timings of ``backend`` under its stored fingerprint, as one kept configuration (None: none)."""
    section = data["backends"][backend]
    solvers: dict[str, Any] = {}
    for solver, implementation in _implementations(data, backend.__eq__):
        entry = data["solvers"][solver]
        slot = entry["backends"][implementation]
        if set(slot) != {SET_ASIDE}:  # a marker holds no timings
            solvers.setdefault(solver, {"version": entry["version"], "backends": {}})["backends"][implementation] = slot
    timed = {key: value for key, value in section.items() if key != "fingerprint"}
    if not solvers and "start_seconds" not in timed:
        return None
    return {"fingerprint": section["fingerprint"], "backend": timed, "solvers": solvers}


def _restore(data: dict[str, Any], backend: str, kept: dict[str, Any]) -> None:
    """Make a kept configuration of ``backend`` the current one (solver entries of another version are skipped)."""
    for solver, implementation in _implementations(data, backend.__eq__):
        del data["solvers"][solver]["backends"][implementation]
    for solver, shelved in kept["solvers"].items():
        entry = data["solvers"].setdefault(solver, {"version": shelved["version"], "backends": {}})
        if entry["version"] == shelved["version"]:
            entry["backends"].update(shelved["backends"])
    data["backends"][backend] = {**kept["backend"], "fingerprint": kept["fingerprint"]}


def _swap_configurations(data: dict[str, Any], stale: set[str]) -> set[str]:
    """Keep the stale timings of side-by-side backends, and take back those of this configuration; return those.

    The kept configurations of a backend are most recent first; the list is
    cut at :data:`MAX_CONFIGURATIONS`.
    """
    restored: set[str] = set()
    for backend in sorted(stale & SIDE_BY_SIDE):
        shelf = data.setdefault(CONFIGURATIONS, {})
        now = backend_fingerprint(backend)
        current = _shelve(data, backend)
        kept = shelf.get(backend, [])
        match = next((item for item in kept if item["fingerprint"] == now), None)
        replaced = None if current is None else current["fingerprint"]
        kept = [item for item in kept if item is not match and item["fingerprint"] != replaced]
        shelf[backend] = ([current] if current is not None else []) + kept
        del shelf[backend][MAX_CONFIGURATIONS:]
        if match is not None:
            _restore(data, backend, match)
            restored.add(backend)
    return restored


def _drop_stale_backends(data: dict[str, Any], path: Path) -> set[str]:
    """Set aside the timings of each backend whose fingerprint changed, naming the fields; return those backends.

    Each implementation entry of such a backend is replaced by a marker saying why, so that the next
    auto-selection, in this process or a later one, knows to measure it again (an empty entry would
    look like one never calibrated). A side-by-side backend's timings are kept as another configuration
    instead (nothing lost: no warning), and those of this configuration, when it was measured before,
    come back (:func:`_swap_configurations`).
    """
    changes = {name: _changes(section["fingerprint"], backend_fingerprint(name))
               for name, section in data["backends"].items()}
    stale = {name for name, change in changes.items() if change}
    stale -= _swap_configurations(data, stale)
    # only markers, or timings kept as another configuration: nothing to warn about
    lost = sorted(name for name in stale - SIDE_BY_SIDE if _has_timings(data, name))
    for solver, implementation in _implementations(data, stale.__contains__):
        slot = data["solvers"][solver]["backends"][implementation]
        reason = slot.get(SET_ASIDE) if set(slot) == {SET_ASIDE} else changes[_backend_of(implementation)]
        data["solvers"][solver]["backends"][implementation] = {SET_ASIDE: reason}
    for name in stale:
        del data["backends"][name]
    if lost:
        kept = ", ".join(sorted(data["backends"])) or "none"
        what = "; ".join(f"{name}: {changes[name]}" for name in lost)
        _warn(f"wisdom file {path}: the configuration changed ({what}); set aside the timings of {', '.join(lost)} "
              f"(measured again by the next auto-selection or `crossover calibrate`), kept those of {kept}")
    return stale


def _carry_over(data: dict[str, Any], memory: dict[str, Any] | None, backends: Callable[[str], bool]) -> None:
    """Put this process's own timings of ``backends`` back: a broken or foreign file must not lose them."""
    if memory is None:
        return
    for name, section in memory["backends"].items():
        if backends(name):
            data["backends"][name] = section
    for solver, entry in memory["solvers"].items():
        target = data["solvers"].setdefault(solver, {"version": entry["version"], "backends": {}})
        if target["version"] != entry["version"]:
            continue  # the file holds another plugin version's entry: the newer write decides
        for implementation, slot in entry["backends"].items():
            if backends(_backend_of(implementation)):
                target["backends"][implementation] = slot


def _set_aside(path: Path, broken: _Broken) -> None:
    target = path.with_name(f"{path.name}.{broken.kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    try:
        os.replace(path, target)
    except OSError as exc:
        raise _Unusable(f"{path} {broken} and could not be moved aside ({exc.strerror})") from None
    _warn(f"wisdom file {path} {broken}; moved to {target.name}; going on without it (calibration will run again)")


def _read(state: _State) -> dict[str, Any]:
    """The stored wisdom, checked; what is unusable is set aside, and this process's own timings kept."""
    path = state.path
    try:
        text = _read_text(path)
        data = None if text is None else _parse(text)
    except _Broken as broken:
        _set_aside(path, broken)
        data = None
    if data is None:  # no usable file (yet, or any more): start from this process's own timings, if any
        data = empty()
        _carry_over(data, state.memory, lambda backend: True)
        return data
    _clean(data, path)
    stale = _drop_stale_backends(data, path)
    _carry_over(data, state.memory, stale.__contains__)
    return data


# -- the lock and temporary files ----------------------------------------------------

def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def _open_lock(path: Path) -> int | None:
    """The lock file, opened read-only (``flock`` needs no more, so a read-only lock file still works).

    None where it cannot be created (a read-only directory): the file can still be read, unlocked,
    because writers replace it whole.
    """
    lock = _lock_path(path)
    if _is_symlink(lock):  # also where there is no O_NOFOLLOW to refuse it at open
        raise _Unusable(f"lock file {lock} is a symbolic link (refused: it could point anywhere)")
    try:
        descriptor = os.open(lock, _OPEN_FLAGS | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP or _is_symlink(lock):
            raise _Unusable(f"lock file {lock} is a symbolic link (refused: it could point anywhere)") from None
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and not os.path.lexists(lock):
            return None
        raise _Unusable(f"cannot open the lock file {lock} ({exc.strerror})") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise _Unusable(f"lock file {lock} is {_kind_of(mode)}")
    return descriptor


def _flock(descriptor: int, lock: Path) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; os.replace still keeps the file whole
        return
    deadline = time.monotonic() + LOCK_TIMEOUT
    pause = 0.001
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise _Unusable(f"lock file {lock} was held by another process for over {LOCK_TIMEOUT:.0f} s") \
                    from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        except OSError as exc:  # e.g. a file system without locks
            raise _Unusable(f"cannot lock {lock} ({exc.strerror})") from None


@contextlib.contextmanager
def _locked(path: Path, required: bool) -> Iterator[None]:
    """Hold the store's exclusive lock; without ``required``, go on unlocked where there can be none."""
    descriptor = _open_lock(path)
    if descriptor is None:
        if required:
            raise _Unusable(f"cannot create the lock file {_lock_path(path)} (permission denied)")
        yield
        return
    try:
        _flock(descriptor, _lock_path(path))
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _writer_gone(name: str, age: float) -> bool:
    """Whether the temporary file ``.wisdom-<pid>-...`` was left by a writer that no longer runs."""
    if age > STALE_TEMP_SECONDS:
        return True
    try:
        pid = int(name[len(TEMP_PREFIX):].split("-", 1)[0])
    except ValueError:
        return False  # not named by this version: only its age can tell
    if pid == os.getpid() or os.name == "nt":  # on Windows os.kill(pid, 0) would end that process: age only
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive under another user
        return False
    return False


def _sweep_temporaries(directory: Path) -> None:
    """Remove the temporary files of writers killed mid-write (each is a full copy of the store)."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if not entry.name.startswith(TEMP_PREFIX) or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if _writer_gone(entry.name, now - entry.stat(follow_symlinks=False).st_mtime):
                    os.unlink(entry.path)


# -- loading and writing -------------------------------------------------------------

def load() -> dict[str, Any]:
    """Read the wisdom for this machine; never raises for a bad file or an unusable location."""
    state = _current()
    if state.in_memory:
        return state.memory
    try:
        if not os.path.isdir(state.path.parent):
            state.memory = empty()  # nothing stored yet; a file in the directory's place is reported on write
            return state.memory
        if _is_symlink(state.path):  # before the lock is created: a refused store touches nothing
            raise _Unusable(f"{state.path} is a symbolic link (refused: it could point anywhere)")
        if not os.path.lexists(state.path):  # nothing to read: no lock file is created just to look
            state.memory = _read(state)
            return state.memory
        with _locked(state.path, required=False):
            _sweep_temporaries(state.path.parent)  # under the lock, no writer is between write and replace
            state.memory = _read(state)
    except _Unusable as exc:
        return _go_in_memory(state, str(exc))
    return state.memory


def _json_value(value: Any) -> Any:
    """A value json cannot write (a numpy scalar in a backend's description): its Python value or text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable (where directories can be opened: not on Windows)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _write(path: Path, data: dict[str, Any]) -> None:
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{TEMP_PREFIX}{os.getpid()}-",
                                                 suffix=".tmp")
    except OSError as exc:
        raise _Unusable(f"cannot write in {path.parent} ({exc.strerror})") from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True, default=_json_value)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        _sync_directory(path.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError):
            raise _Unusable(f"cannot write {path} ({exc.strerror or exc})") from None
        raise


def _stamp(data: dict[str, Any]) -> None:
    """Key every backend that now has timings with this process's fingerprint of it."""
    data["format"], data["host"] = FORMAT, host_fingerprint()
    used = set(data["backends"]) | {_backend_of(key) for entry in data["solvers"].values() for key in entry["backends"]}
    for name in used:
        data["backends"].setdefault(name, {})["fingerprint"] = backend_fingerprint(name)


def _update_on_disk(state: _State, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    path = state.path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = "is not a directory" if isinstance(exc, FileExistsError) else f"cannot be created ({exc.strerror})"
        raise _Unusable(f"cache directory {path.parent} {what}") from None
    if _is_symlink(path):
        raise _Unusable(f"{path} is a symbolic link (refused: it could point anywhere)")
    with _locked(path, required=True):
        _sweep_temporaries(path.parent)
        data = _read(state)
        change(data)
        _stamp(data)
        _write(path, data)
    return data


def update(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``change`` to the freshest stored wisdom and write it back atomically.

    Never raises for the store's own faults: where the disk cannot be used,
    the change is applied to this process's copy in memory.
    """
    state = _current()
    if not state.in_memory:
        try:
            state.memory = _update_on_disk(state, change)
            return state.memory
        except _Unusable as exc:
            _go_in_memory(state, str(exc))
    change(state.memory)
    _stamp(state.memory)
    return state.memory


def solver_entry(data: dict[str, Any], solver: str, solver_version: str) -> dict[str, Any]:
    """The solver's entry, reset when it was written by another version of its plugin."""
    entry = data["solvers"].get(solver)
    if entry is None or entry.get("version") != solver_version:
        entry = {"version": solver_version, "backends": {}}
        data["solvers"][solver] = entry
    return entry


# -- calibrations: what they keep, and one at a time --------------------------------

def _feature_key(record: dict[str, Any]) -> tuple:
    return tuple(sorted(record["features"].items()))


def merge_calibration(stored: list[dict[str, Any]], measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples an implementation keeps after a calibration measured ``measured``: never fewer than it had.

    The rule: a calibration adds to what is stored. A new sample replaces a
    stored one of the same features (the same work, timed again: the newer
    timing wins); stored samples at features the calibration did not measure
    stay (a ``--budget 1`` run that measured one problem leaves the other 14
    of an earlier run in place). Stored samples with other feature names are
    dropped: the solver now declares other features and they cannot be
    compared. Beyond :data:`MAX_CALIBRATION_SAMPLES` the oldest stored
    samples go first; the new ones are always kept. To start afresh, delete
    the wisdom file.
    """
    if not measured:
        return list(stored)
    names = set(measured[0]["features"])
    remeasured = {_feature_key(record) for record in measured}
    kept = [record for record in stored
            if set(record["features"]) == names and _feature_key(record) not in remeasured]
    room = max(0, MAX_CALIBRATION_SAMPLES - len(measured))
    return (kept[len(kept) - room:] if room else []) + list(measured)


_held = threading.local()  # how deep this thread is in calibrations: a nested one must not wait for itself


def _calibration_lock_path(path: Path) -> Path:
    return path.with_name(path.name + CALIBRATION_LOCK_SUFFIX)


def _open_calibration_lock(path: Path) -> int | None:
    """The calibration lock file, opened for writing its holder's name; None where it cannot be (no lock then).

    Made only where the store itself can write: a location the store will
    find unusable (its own lock a directory, the cache directory a file) is
    left untouched, and the store says why at its first write.
    """
    lock = _calibration_lock_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # where the calibration's samples go anyway
        probe = _open_lock(path)
    except (OSError, _Unusable):
        return None
    if probe is None or _is_symlink(lock):
        return None
    os.close(probe)
    try:
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return None
    return descriptor


def _holder(descriptor: int) -> str:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return os.pread(descriptor, 200, 0).decode("utf-8").strip() or "another process"
    return "another process"


@contextlib.contextmanager
def calibrating(what: str, waiting: Callable[[str], None]) -> Iterator[None]:
    """Hold the calibration lock while calibrating ``what``; if another calibration holds it, say so and wait.

    ``waiting`` gets one line naming the other calibration (its pid and what
    it calibrates) before the wait. The lock is ``fcntl.flock`` on
    ``wisdom.json.calibrating``: the system releases it when its holder ends,
    however it ends, so a killed calibration never blocks the next. Ctrl-C
    stops the wait. Where the store cannot lock (no ``fcntl``, a location
    that cannot be used), calibrations go on unlocked: writes still merge.
    """
    load()  # first: a location found unusable now is left untouched, with no lock file made in it
    state = _current()
    depth = getattr(_held, "depth", 0)
    try:
        import fcntl
    except ImportError:  # Windows
        fcntl = None
    descriptor = None if (depth or state.in_memory or fcntl is None) else _open_calibration_lock(state.path)
    try:
        if descriptor is not None:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                waiting(f"another calibration is running ({_holder(descriptor)}); waiting for it to finish before "
                        f"calibrating {what}, so that neither one times the other's work (Ctrl-C to stop)")
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            except OSError:  # a file system without locks
                os.close(descriptor)
                descriptor = None
        if descriptor is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, f"pid {os.getpid()}: {what}".encode(), 0)
        _held.depth = depth + 1
        yield
    finally:
        _held.depth = depth
        if descriptor is not None:
            os.close(descriptor)  # closing releases the lock
