"""Benchmarks of the example solver (``example.random_walk``) on each CPU backend.

Every benchmark goes through ``core.solve``, so it measures what a user pays:
the backend's dispatch, the kernel and the conversion of the outputs. A
backend that cannot run on the benchmarking machine is skipped (asv reports
it as n/a) by raising ``NotImplementedError`` from ``setup``.
"""

from __future__ import annotations

import time

import core
from plugins.example.problem import RandomWalkProblem

SOLVER = "example.random_walk"
BACKENDS = ["numpy", "numba", "process"]
N_STEPS = 100


def _problem(n_walkers: int) -> RandomWalkProblem:
    return RandomWalkProblem(n_walkers=n_walkers, n_steps=N_STEPS, seed=0)


def _skip_unavailable(backend: str) -> None:
    status = core.availability(backend)
    if not status.available:
        raise NotImplementedError(f"backend {backend!r} is unavailable here: {status.reason}")


class RandomWalkSolve:
    """Steady-state wall time of one ``core.solve`` of ``n_walkers`` walks of 100 steps.

    ``setup`` solves once before timing, so Numba's compile (or cache load)
    and the process pool's start-up are paid there and not timed: these are
    the per-call costs that the cost model's linear terms describe.
    """

    params = (BACKENDS, [10_000, 100_000])
    param_names = ("backend", "n_walkers")
    timeout = 300

    def setup(self, backend: str, n_walkers: int) -> None:
        _skip_unavailable(backend)
        self.problem = _problem(n_walkers)
        core.solve(self.problem, backend=backend, solver=SOLVER)  # warm-up: JIT, pool start

    def time_solve(self, backend: str, n_walkers: int) -> None:
        core.solve(self.problem, backend=backend, solver=SOLVER)


class RandomWalkFirstCall:
    """One-off cost: seconds of the first ``core.solve`` in a fresh benchmark process.

    For numba this is loading (or compiling) the kernels and starting the
    thread pool; for process it is starting the pool's workers. The same
    small problem is solved, so the number is dominated by the one-off cost
    that the design charges only while it is unpaid.
    """

    params = (BACKENDS,)
    param_names = ("backend",)
    unit = "seconds"
    timeout = 300

    def setup(self, backend: str) -> None:
        _skip_unavailable(backend)
        self.problem = _problem(1_000)

    def track_first_call_seconds(self, backend: str) -> float:
        started = time.perf_counter()
        core.solve(self.problem, backend=backend, solver=SOLVER)
        return time.perf_counter() - started


class RandomWalkMemory:
    """Peak resident memory of the benchmark process around one ``core.solve``.

    Only the in-process backends are measured: the process backend's work
    happens in its workers, whose memory asv's ``peakmem`` does not see. The
    numpy reference walks in chunks of ``RandomWalkProblem.chunk`` walkers,
    so its peak should stay flat as ``n_walkers`` grows, while numba holds
    every walker's position at once.
    """

    params = (["numpy", "numba"], [100_000, 1_000_000])
    param_names = ("backend", "n_walkers")
    timeout = 300

    def setup(self, backend: str, n_walkers: int) -> None:
        _skip_unavailable(backend)
        self.problem = _problem(n_walkers)
        core.solve(_problem(1_000), backend=backend, solver=SOLVER)  # imports and JIT outside the peak growth

    def peakmem_solve(self, backend: str, n_walkers: int) -> None:
        core.solve(self.problem, backend=backend, solver=SOLVER)
