"""The example plugin: Gaussian random walks on every built-in backend.

It is the smallest complete solver, kept as the model for the plugin
tutorial in ``docs/plugins.md``.
"""

from __future__ import annotations

import math

import numpy as np

from core import SolverSpec, hookimpl
from core.formatting import with_error
from core.solver import SizeSpace, lazy
from plugins.example.problem import RandomWalkProblem

__version__ = "0.3.0"  # 0.3: chunk and n_bins in the space, chunk_steps and chunk_bins


def _features(problem: RandomWalkProblem) -> dict[str, float]:
    """What every backend's time is linear in.

    ``walker_steps`` is the random draws (all backends), ``walkers`` the
    per-walker work after the walk (stream keys, binning, the final
    scaling), ``chunks`` the per-task overhead (a task's dispatch on a
    parallel backend), ``chunk_steps`` a chunk's turn of the step loop (one
    generator call per chunk and step on numpy and the parallel backends)
    and ``chunk_bins`` a chunk's histogram (every chunk zeroes and merges
    ``n_bins`` counts). The core shares ``walker_steps`` among a parallel
    backend's workers itself (``span_feature``), so nothing here reads a
    pool's size.
    """
    chunks = float(problem.n_chunks)
    return {"walker_steps": float(problem.n_walkers * problem.n_steps), "walkers": float(problem.n_walkers),
            "chunks": chunks, "chunk_steps": chunks * problem.n_steps, "chunk_bins": chunks * problem.n_bins}


def _space(quick: bool) -> SizeSpace:
    """Every field a user sets that moves the cost varies, so each feature's price is identified.

    Walkers and steps; the chunk size (how many tasks, and numpy's generator
    calls per step); the histogram's bins (counted once per chunk). The
    walk's scale and drift cost nothing. Quick: the largest problem
    (200,000 x 200 in chunks of 512) takes about 0.5 s on numpy on a 2-core
    VM. Full: up to 2,000,000 x 500, about 10 s there.
    """
    if quick:
        return SizeSpace(ranges={"n_walkers": (1_000, 200_000), "n_steps": (10, 200), "chunk": (512, 65_536),
                                 "n_bins": (16, 4_096)})
    return SizeSpace(ranges={"n_walkers": (1_000, 2_000_000), "n_steps": (10, 500), "chunk": (256, 262_144),
                             "n_bins": (16, 16_384)})


# What each chunk leaves in memory on the host, whatever the backend: its task tuple, label and
# SeedSequence before the run, its (count, mean, m2, counts) statistics after: 770 bytes measured
# with tracemalloc over 10,000 chunks, rounded up to 1 kB, plus the histogram counts of n_bins int64.
_PER_CHUNK_BYTES = 1024
_TORCH_BLOCK_ELEMENTS = 1 << 26  # plugins.example.torch_kernel draws at most this many steps at once


def _memory(problem: RandomWalkProblem, backend: str) -> float:
    """Peak bytes, from what each implementation allocates (see the kernels).

    numpy and a parallel backend's worker walk one chunk at a time (positions,
    a step's draws, the final scaling: 3 arrays of the chunk); numba holds
    every walker's position and stream key, and the binning of a chunk at a
    time; torch every position, a block of draws and their sum. All keep the
    per-chunk bookkeeping, which dominates for tiny chunks of many walkers.
    """
    chunk = min(problem.chunk, problem.n_walkers)
    bookkeeping = problem.n_chunks * (_PER_CHUNK_BYTES + 8.0 * problem.n_bins)
    if backend == "numba":
        return 8.0 * (2 * problem.n_walkers + 3 * chunk) + bookkeeping
    if backend == "torch":
        block = min(problem.n_steps * problem.n_walkers, max(_TORCH_BLOCK_ELEMENTS, problem.n_walkers))
        return 8.0 * (3 * problem.n_walkers + block) + 8.0 * problem.n_bins
    return 8.0 * 3 * chunk + bookkeeping


def _summarize(problem: RandomWalkProblem, outputs) -> str:
    """Mean and variance with their standard errors, so that two runs agree within the digits shown.

    The end points are Gaussian: the mean's standard error is sqrt(var/n),
    the variance's var*sqrt(2/(n-1)).
    """
    n, mean, variance = problem.n_walkers, float(outputs["mean"]), float(outputs["variance"])
    mean_error = math.sqrt(max(variance, 0.0) / n)
    variance_error = abs(variance) * math.sqrt(2.0 / (n - 1)) if n > 1 else math.inf
    binned = int(np.sum(outputs["histogram"]))
    return (f"mean {with_error(mean, mean_error)} (exact {problem.exact_mean:g}), "
            f"variance {with_error(variance, variance_error)} (exact {problem.exact_variance:g}), "
            f"{binned:,}/{n:,} walkers binned")


def _spec() -> SolverSpec:
    return SolverSpec(
        name="example.random_walk",
        problem_type=RandomWalkProblem,
        implementations={"numpy": lazy("plugins.example.reference", "solve_numpy"),
                         "numba": lazy("plugins.example.numba_kernel", "solve_numba"),
                         "torch": lazy("plugins.example.torch_kernel", "solve_torch")},
        # one implementation for every parallel backend: a task per chunk through core.tasks.map_tasks
        parallel=lazy("plugins.example.reference", "solve_parallel"),
        parallel_tasks=lambda problem: len(problem.chunks()),
        span_feature="walker_steps",
        features=_features,
        size_axis="n_walkers",
        space=_space,
        memory=_memory,
        default_problem=RandomWalkProblem,
        summarize=_summarize,
        description="independent Gaussian random walks; mean, variance and histogram of the end points",
        version=__version__,
    )


@hookimpl
def crossover_solvers() -> list[SolverSpec]:
    return [_spec()]
