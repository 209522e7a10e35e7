"""NumPy kernels of the random-walk example, shared by the numpy and parallel backends.

:func:`walk_chunk` is the task function: the numpy backend runs the chunks
serially, and every parallel backend (the process pool, a cluster) maps
them with :func:`core.tasks.map_tasks`, with the same per-chunk seeds, so
they all agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from core.tasks import map_tasks, run_serially
from plugins.example.problem import RandomWalkProblem

# (walkers, mean, sum of squared deviations, histogram counts)
ChunkStats = tuple[int, float, float, np.ndarray]


def walk_chunk(task: tuple, shared: Mapping[str, np.ndarray],
               seed: np.random.SeedSequence | None) -> ChunkStats:
    """Walk one chunk of walkers and reduce it to mergeable statistics."""
    count, n_steps, step_std, drift = task
    rng = np.random.default_rng(seed)
    positions = np.zeros(count)
    for _ in range(n_steps):
        positions += rng.standard_normal(count)
    positions = positions * step_std + n_steps * drift
    return chunk_stats(positions, shared["edges"])


def chunk_stats(positions: np.ndarray, edges: np.ndarray) -> ChunkStats:
    mean = float(positions.mean())
    counts, _ = np.histogram(positions, bins=edges)
    return positions.size, mean, float(((positions - mean) ** 2).sum()), counts


def merge(stats: list[ChunkStats], edges: np.ndarray) -> dict[str, np.ndarray]:
    """Chan et al.'s pairwise merge of chunk means and variances (stable for any chunk count)."""
    total, mean, m2 = 0, 0.0, 0.0
    histogram = np.zeros(len(edges) - 1, dtype=np.int64)
    for count, chunk_mean, chunk_m2, counts in stats:
        delta = chunk_mean - mean
        merged = total + count
        mean += delta * count / merged
        m2 += chunk_m2 + delta**2 * total * count / merged
        total = merged
        histogram += counts
    variance = m2 / (total - 1) if total > 1 else 0.0
    return {"mean": np.float64(mean), "variance": np.float64(variance), "histogram": histogram,
            "bin_edges": edges}


def chunk_tasks(problem: RandomWalkProblem) -> tuple[list[tuple], list[str]]:
    chunks = problem.chunks()
    task_list = [(count, problem.n_steps, problem.step_std, problem.drift) for _, count in chunks]
    labels = [f"walkers {start}..{start + count - 1}" for start, count in chunks]
    return task_list, labels


def solve_numpy(problem: RandomWalkProblem) -> dict[str, np.ndarray]:
    task_list, _ = chunk_tasks(problem)
    edges = problem.bin_edges()
    return merge(run_serially(walk_chunk, task_list, shared={"edges": edges}, seed=problem.seed), edges)


def solve_parallel(problem: RandomWalkProblem, backend: str) -> dict[str, np.ndarray]:
    """One chunk per task on the parallel ``backend`` the core names (``process``, a cluster's)."""
    task_list, labels = chunk_tasks(problem)
    edges = problem.bin_edges()
    stats = map_tasks(walk_chunk, task_list, shared={"edges": edges}, seed=problem.seed, labels=labels,
                      backend=backend)
    return merge(stats, edges)
