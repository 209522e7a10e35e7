"""How many of this process's cores other work keeps busy, so that thread-pool kernels leave those cores alone.

A Numba kernel split over every core stalls when another process holds
one of them: the region's threads meet at a barrier, and the thread whose
core is taken waits for a scheduler time slice before it can arrive. On the
2-core VM, beside one CPU-bound process, a 1,518-walker random walk took
1.5-1.9x its quiet time on two threads (with crossover's short OpenMP spin,
:mod:`core.backends.openmp_spin`) and 1.0x on one thread, whose quiet time
is only 1.1-1.2x the two threads'. So a kernel whose answer does not depend
on the thread count runs on the cores the others leave idle
(:func:`core.backends.numba_threads.use_idle_cores`).

Why each choice:

- *CPU time, not a count of runnable tasks*: ``/proc/loadavg``'s runnable
  count includes this process's own threads while they spin after a
  region, and in a container it counts the whole host. Here the busy time
  of the CPUs this process may run on (``/proc/stat``, per CPU, in the
  affinity mask) less this process's own CPU time (``time.process_time``) is what
  the others used; children, such as a process pool's workers, count as
  others, since they compete for the same cores. Steal time counts as
  busy: a neighbour on a shared host took it.
- *a window of at least* :data:`WINDOW` *seconds*: the kernel's counters
  advance in 10 ms ticks, so a shorter window is noise. Reading the file
  costs tens of microseconds, so it is read at most once a window; calls in
  between reuse the last answer. The first call of a process has no
  window yet and assumes an idle host (what it did before).
- *whole cores*: a core is yielded once others use half of it
  (:data:`YIELD_AT`). A CPU-bound competitor that shares the cores with
  this process's threads gets only part of one (two thirds on the 2-core
  VM beside two numba threads), and it must still be seen: at three
  quarters, one probe run of the VM kept both threads and took 1.6x.
- *off with* ``CROSSOVER_YIELD_BUSY_CORES=0``: to measure what it gains,
  or where a host's counters mislead (a VM whose steal time is not about
  contention). Off, and off Linux, every core counts as idle.
"""

from __future__ import annotations

import os
import time

from core.backend import usable_cores
from core.validation import env_flag

SWITCH = "CROSSOVER_YIELD_BUSY_CORES"
WINDOW = 0.1  # seconds: ten of the kernel's 10 ms ticks
YIELD_AT = 0.5  # of a core the others use before it is left to them
_STAT = "/proc/stat"
_TICK = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

_mark: tuple[float, float, float] | None = None  # at the window's start: wall, our CPUs' busy, own CPU seconds
_others = 0.0  # cores the others kept busy over the last full window


def _busy_seconds(cpus: set[int]) -> float | None:
    """Seconds the CPUs in ``cpus`` spent busy since boot (``/proc/stat``), or None where unreadable."""
    try:
        with open(_STAT) as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if not name[3:].isdigit() or int(name[3:]) not in cpus or len(fields) < 8:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[:8])
        busy += user + nice + system + irq + softirq + steal
    return busy * _TICK


def others_busy_cores() -> float:
    """Cores of this process's affinity that other processes kept busy over the last window (0 where unknown)."""
    global _mark, _others
    now = time.monotonic()
    if _mark is not None and now - _mark[0] < WINDOW:
        return _others
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # no affinity call (macOS, Windows): no /proc/stat either
        return 0.0
    busy = _busy_seconds(cpus)
    if busy is None:
        return 0.0
    own = time.process_time()  # every thread of this process, user and system
    if _mark is not None:
        wall, busy_before, own_before = _mark
        _others = max(0.0, ((busy - busy_before) - (own - own_before)) / (now - wall))
    _mark = (now, busy, own)
    return _others


def forget() -> None:
    """Start a new window, with the others idle: after this process's own map, whose workers were the others."""
    global _mark, _others
    _mark, _others = None, 0.0


if hasattr(os, "register_at_fork"):  # a forked child's own CPU time starts at zero: the parent's window is not its
    os.register_at_fork(after_in_child=forget)


def enabled() -> bool:
    """Whether kernels yield busy cores here (``CROSSOVER_YIELD_BUSY_CORES``, on unless set off)."""
    return env_flag(SWITCH, default=True)


def idle_cores() -> int:
    """How many of the cores this process may run on the others leave idle now: at least 1; all with the switch off."""
    usable = usable_cores()
    if not enabled():
        return usable
    return max(1, min(usable, usable - int(others_busy_cores() + 1 - YIELD_AT)))
