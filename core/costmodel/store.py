"""The wisdom store: this machine's measurements, as one JSON file.

- Location: ``CROSSOVER_CACHE_DIR`` or the platform cache directory.
- Keyed by a machine fingerprint (CPU model and cores, GPU names, versions of
  crossover, numpy, numba and torch). A file written on another machine or
  software stack is set aside, never silently reused: its timings would be
  wrong here. Each solver's entry also carries its plugin's version, and an
  entry from another plugin version is dropped on its own, so upgrading one
  plugin does not throw away every other solver's calibration.
- Writes are atomic (temporary file plus ``os.replace``) under an exclusive
  lock, and every write re-reads the file first, so two processes
  calibrating at once both keep their samples.
- JSON only: a cache must never be able to execute code when read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import platformdirs

from core.backends.process_pool import default_workers
from core.backends.torch_gpu import gpu_names

FORMAT = 2  # 2: implementation keys (backend:variant) and backend start costs
FILENAME = "wisdom.json"


class WisdomWarning(UserWarning):
    """The wisdom file was unusable and was set aside; calibration will run again."""


def cache_dir() -> Path:
    configured = os.environ.get("CROSSOVER_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(platformdirs.user_cache_dir("crossover"))


def wisdom_path() -> Path:
    return cache_dir() / FILENAME


def _cpu_model() -> str:
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


@lru_cache(maxsize=1)
def fingerprint() -> dict[str, Any]:
    """What must match for stored timings to be valid here."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "gpus": gpu_names(),
        "python": platform.python_version(),
        "versions": {dist: _version(dist) for dist in ("crossover", "numpy", "numba", "torch")},
        # timings of the parallel backends depend on these as much as on the CPU
        "process_workers": default_workers(),
        "numba_threads": os.environ.get("NUMBA_NUM_THREADS", "default"),
    }


def fingerprint_key(print_: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(print_, sort_keys=True).encode()).hexdigest()[:16]


def empty() -> dict[str, Any]:
    current = fingerprint()
    return {"format": FORMAT, "key": fingerprint_key(current), "fingerprint": current, "solvers": {}, "backends": {}}


def _set_aside(path: Path, why: str) -> None:
    target = path.with_name(f"{path.name}.{why.split()[0]}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    try:
        os.replace(path, target)
        where = f"moved to {target}"
    except OSError as exc:
        where = f"could not be moved ({exc})"
    warnings.warn(f"wisdom file {path} is {why}; {where}; calibration will run again", WisdomWarning,
                  stacklevel=4)


def _read(path: Path) -> dict[str, Any]:
    """The stored wisdom, or an empty store after setting an unusable file aside."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return empty()
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("solvers"), dict):
            raise ValueError("not a wisdom document")
    except ValueError as exc:
        _set_aside(path, f"corrupt ({type(exc).__name__}: {str(exc)[:80]})")
        return empty()
    if data.get("format") != FORMAT or data.get("key") != fingerprint_key(fingerprint()):
        _set_aside(path, "stale (written for another machine or software versions)")
        return empty()
    return data


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+") as lock:
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
        except ImportError:  # Windows: no flock; os.replace still keeps the file whole
            pass
        yield


def load() -> dict[str, Any]:
    """Read the wisdom for this machine (never raises for a bad file)."""
    path = wisdom_path()
    if not path.exists():
        return empty()
    with _locked(path):
        return _read(path)


def update(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``change`` to the freshest stored wisdom and write it back atomically."""
    path = wisdom_path()
    with _locked(path):
        data = _read(path)
        change(data)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".wisdom-", suffix=".json")
        try:
            with os.fdopen(descriptor, "w") as handle:
                json.dump(data, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
    return data


def solver_entry(data: dict[str, Any], solver: str, solver_version: str) -> dict[str, Any]:
    """The solver's entry, reset when it was written by another version of its plugin."""
    entry = data["solvers"].get(solver)
    if entry is None or entry.get("version") != solver_version:
        entry = {"version": solver_version, "backends": {}}
        data["solvers"][solver] = entry
    return entry
