"""What a backend is: a named execution strategy that can say if it runs here.

Backends are plain records of functions rather than a class hierarchy: a
third-party plugin supplies one by filling in a :class:`Backend`.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from core.errors import PluginWarning


class Availability(NamedTuple):
    """Whether a backend can run on this machine, and if not, why not."""

    available: bool
    reason: str = ""


@dataclass(frozen=True)
class Backend:
    """An execution strategy.

    ``probe`` answers whether it runs here (cheaply, and never raising);
    ``describe`` reports device, cores, threads and memory for tables and
    the machine fingerprint. ``simplicity`` orders backends for tie-breaks:
    within the cost model's margin the backend with the lower number wins,
    because it has fewer ways to go wrong. ``free_memory`` returns the bytes
    a problem may use on the backend's device (None: unknown, never excluded).

    ``start`` pays the backend's one-off cost of a process (start the pool,
    create the CUDA context, connect to a cluster); the core times it once
    per process and charges it to whichever solver runs there first.

    A parallel backend also gives ``map``, with the signature of
    :func:`core.tasks.map_tasks` less ``backend``, and ``parallelism()``,
    how many tasks it runs at once; :func:`core.tasks.map_tasks` dispatches
    to it, so plugins never import a backend's module.

    A backend whose kernels run on a thread pool in this process gives
    ``threads()``, the pool's size: the span of an implementation whose
    kernels share items among those threads comes from it.
    """

    name: str
    summary: str
    probe: Callable[[], Availability]
    describe: Callable[[], dict[str, Any]] = field(default=lambda: {})
    simplicity: int = 50
    free_memory: Callable[[], float | None] = field(default=lambda: None)
    start: Callable[[], None] | None = None
    map: Callable[..., list] | None = None
    parallelism: Callable[[], int] | None = None
    threads: Callable[[], int] | None = None


def safe_probe(backend: Backend) -> Availability:
    """Run a backend's probe, turning a crash in the probe into 'unavailable'."""
    try:
        result = backend.probe()
    except Exception as exc:  # a broken third-party probe must not break crossover
        return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")
    if not isinstance(result, Availability):
        # a probe that answers True, or a bare tuple, could hide a broken check: say so instead
        return Availability(False, f"probe returned {type(result).__name__}, expected core.Availability")
    return result


_free_memory_faults: set[str] = set()


def safe_free_memory(backend: Backend) -> float | None:
    """A backend's free memory, or None (unknown: nothing excluded) where asking raised or answered nonsense.

    A broken third-party ``free_memory`` is blamed by name once per process,
    and planning goes on as if that backend's memory were unknown.
    """
    try:
        free = backend.free_memory()
        if free is None:
            return None
        free = float(free)
        if free != free or free < 0:  # NaN or negative: as useless as an exception
            raise ValueError(f"returned {free!r}, expected bytes >= 0 or None")
        return free
    except (Exception, SystemExit) as exc:
        if backend.name not in _free_memory_faults:
            _free_memory_faults.add(backend.name)
            warnings.warn(f"backend {backend.name!r}: free_memory() failed ({type(exc).__name__}: {exc}); "
                          "treating its free memory as unknown", PluginWarning, stacklevel=2)
        return None


def safe_describe(backend: Backend) -> dict[str, Any]:
    """A backend's description, or the error that describing it raised."""
    try:
        return dict(backend.describe())
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else all of the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


DEFAULT_CACHE_BYTES = 32 * 2**20  # a server's last-level cache, where the host does not say


@functools.cache
def last_level_cache_bytes(cpu_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> float:
    """The largest data cache of this host's first CPU (Linux sysfs), in bytes, or 32 MiB where unknown.

    For work declarations whose cost changes once the data no longer fit:
    a pass over 123 MB of regression samples ran 3x slower per byte than the
    in-cache passes a model was fitted on (the 2-core VM, L3 32 MiB).
    """
    sizes = []
    for index in sorted(os.listdir(cpu_dir)) if os.path.isdir(cpu_dir) else []:
        size = _read_text(os.path.join(cpu_dir, index, "size"))
        kind = _read_text(os.path.join(cpu_dir, index, "type"))
        if size and kind in ("Data", "Unified") and size[:-1].isdigit() and size[-1] in "KMG":
            sizes.append(int(size[:-1]) * 1024 ** ("KMG".index(size[-1]) + 1))
    return float(max(sizes)) if sizes else float(DEFAULT_CACHE_BYTES)


def _read_text(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return ""


def host_free_memory() -> float | None:
    """Bytes of host memory a new allocation may use: the tightest of every limit that applies.

    The kernel's ``MemAvailable``, the room left under ``ulimit -v`` (the
    address-space limit less what this process has mapped) and the room left
    under each cgroup memory limit of this process (v1 or v2, its own group
    and every parent). A container or a batch job usually sets one of the
    last two, and the machine's free memory then overstates what a solve can
    have before it is killed. None when none of them can be read.
    """
    known = [room for room in (_mem_available(), address_space_room(), cgroup_room()) if room is not None]
    return min(known) if known else None


def _mem_available() -> float | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def address_space_room() -> float | None:
    """Bytes left under ``ulimit -v`` (RLIMIT_AS) for this process; None when unlimited or unknown."""
    try:
        import resource  # Unix only
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    return max(0.0, float(soft) - (_mapped_bytes() or 0.0))


def _mapped_bytes() -> float | None:
    """This process's virtual size, which RLIMIT_AS counts (the first field of /proc/self/statm, in pages)."""
    try:
        with open("/proc/self/statm") as statm:
            return float(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# cgroup v1 writes "no limit" as 2**63 - 1 rounded down to a page; any larger limit is no limit either
_NO_CGROUP_LIMIT = 2**60


def cgroup_room(proc_cgroup: str = "/proc/self/cgroup", mount: str = "/sys/fs/cgroup") -> float | None:
    """Bytes left under this process's cgroup memory limits (the smallest over its group and parents).

    v2 reads ``memory.max`` and ``memory.current``; v1 ``memory.limit_in_bytes``
    and ``memory.usage_in_bytes``. Usage counts the page cache, which the
    kernel reclaims before it kills anyone, so the inactive file pages are
    not counted as used. None when no limit is set or none can be read.
    """
    try:
        with open(proc_cgroup) as groups:
            lines = groups.read().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # the v2 unified hierarchy
            files, base = ("memory.max", "memory.current", "inactive_file"), mount
        elif "memory" in controllers.split(","):
            files, base = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"), \
                os.path.join(mount, "memory")
        else:
            continue
        for directory in _group_and_parents(base, path):
            room = _room_in(directory, *files)
            if room is not None:
                rooms.append(room)
    return min(rooms) if rooms else None


def _group_and_parents(base: str, path: str) -> list[str]:
    """``base/path`` and each parent up to ``base``: a limit on any of them applies to this process."""
    parts = [p for p in path.strip("/").split("/") if p]
    return [os.path.join(base, *parts[:depth]) for depth in range(len(parts), -1, -1)]


def _room_in(directory: str, limit_file: str, usage_file: str, inactive_key: str) -> float | None:
    limit = _read_number(os.path.join(directory, limit_file))
    if limit is None or limit >= _NO_CGROUP_LIMIT:
        return None
    usage = _read_number(os.path.join(directory, usage_file)) or 0.0
    inactive = _stat_value(os.path.join(directory, "memory.stat"), inactive_key) or 0.0
    return max(0.0, limit - max(0.0, usage - inactive))


def _read_number(path: str) -> float | None:
    """The number in a cgroup file; None for "max" (v2's no limit), a missing file or junk."""
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    try:
        return float(int(text))
    except ValueError:
        return None


def _stat_value(path: str, key: str) -> float | None:
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == key:
                    return float(int(value))
    except (OSError, ValueError):
        return None
    return None
