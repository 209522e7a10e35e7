"""Does numba:threads lose to numba:serial on a small spectra fit because crossover yielded cores?

Solves one 2-spectrum fit (``n_pixels=5630``, ``max_iter=1``, small grid) on
every implementation, five rounds interleaved (as ``evaluate``'s truth
does), and prints each implementation's median, every thread count the
Numba kernels were given with the others' load seen then
(:mod:`core.backends.host_load`), and how busy the host's cores were by
``/proc/stat`` field over the run against this process's own CPU time.
Run it with ``CROSSOVER_YIELD_BUSY_CORES=1`` and ``=0`` to compare:

    CROSSOVER_YIELD_BUSY_CORES=1 python docs/scripts/spectra_threads_diag.py
    CROSSOVER_YIELD_BUSY_CORES=0 python docs/scripts/spectra_threads_diag.py

Uses a private wisdom store. Linux only (reads ``/proc/stat``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

os.environ.setdefault("CROSSOVER_CACHE_DIR", tempfile.mkdtemp(prefix="crossover-threads-diag-"))

import core  # after the cache directory is chosen
from core.backends import host_load, numba_threads
from core.costmodel.calibrate import runnable_implementations
from core.registry import get_solver
from core.solver import problem_from_params

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
KEYS = ("numba:threads", "numba:serial", "torch", "process", "numpy")


def host_ticks() -> list[int]:
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("cpu "):
                return [int(value) for value in line.split()[1:9]]
    raise RuntimeError("/proc/stat has no cpu line")


def main() -> None:
    seen: set[tuple[int, int, float]] = set()
    real = numba_threads.threads_for

    def logged(items: int) -> int:
        threads = real(items)
        seen.add((items, threads, round(host_load._others, 2)))
        return threads

    numba_threads.threads_for = logged
    spec = get_solver("spectra.fit")
    problem = problem_from_params(spec, {"n_spectra": 2, "n_pixels": 5630, "max_iter": 1, "degree": 4,
                                         "grid": "small"})
    keys = [key for key in KEYS if key in runnable_implementations(spec)]
    for key in keys:  # warm
        core.solve(problem, key, solver=spec.name)
    times: dict[str, list[float]] = {key: [] for key in keys}
    ticks, wall, own = host_ticks(), time.time(), time.process_time()
    for _ in range(5):
        for key in keys:
            began = time.perf_counter()
            core.solve(problem, key, solver=spec.name)
            times[key].append(time.perf_counter() - began)
    after, span = host_ticks(), time.time() - wall
    print("CROSSOVER_YIELD_BUSY_CORES", os.environ.get(host_load.SWITCH),
          {key: round(statistics.median(values) * 1e3, 2) for key, values in times.items()}, "ms")
    print("threads_for calls (items, threads, others' cores):", sorted(seen))
    busy = {name: round((b - a) / 100 / span, 2) for name, a, b in zip(FIELDS, ticks, after)}
    print("host cores busy by field:", busy, "this process:", round((time.process_time() - own) / span, 2),
          "affinity", len(os.sched_getaffinity(0)))


if __name__ == "__main__":
    main()
