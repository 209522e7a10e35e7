"""The example plugin: Gaussian random walks on every built-in backend.

It is the smallest complete solver, kept as the model for the plugin
tutorial in ``docs/plugins.md``.
"""

from __future__ import annotations

import math

import numpy as np

from core import SolverSpec, hookimpl
from plugins.example.problem import RandomWalkProblem

__version__ = "0.1.0"


def _solve_numba(problem: RandomWalkProblem):
    from plugins.example.numba_kernel import solve_numba  # defer numba's import to first use

    return solve_numba(problem)


def _solve_torch(problem: RandomWalkProblem):
    from plugins.example.torch_kernel import solve_torch

    return solve_torch(problem)


def _features(problem: RandomWalkProblem) -> dict[str, float]:
    """Total work, task count, and the work of the longest worker's share of tasks.

    The last one is what a pool of W workers waits for: ceil(chunks / W)
    chunks in a row. Serial backends' fits simply give it no weight.
    """
    from core.backends.process_pool import default_workers

    chunks = len(problem.chunks())
    span = math.ceil(chunks / default_workers()) * min(problem.chunk, problem.n_walkers) * problem.n_steps
    return {"walker_steps": float(problem.n_walkers * problem.n_steps), "chunks": float(chunks),
            "span_walker_steps": float(span)}


def _ladder(quick: bool) -> list[RandomWalkProblem]:
    sizes = [1_000, 4_000, 16_000, 64_000, 256_000] if quick else [1_000 * 4**k for k in range(8)]
    return [RandomWalkProblem(n_walkers=n, n_steps=100, seed=k) for k, n in enumerate(sizes)]


def _memory(problem: RandomWalkProblem, backend: str) -> float:
    walkers = problem.n_walkers if backend in ("numba", "torch") else min(problem.chunk, problem.n_walkers)
    return 8.0 * walkers * (3 if backend != "torch" else 2 + min(problem.n_steps, 64))


def _summarize(problem: RandomWalkProblem, outputs) -> str:
    return (f"mean {float(outputs['mean']):+.4f} (exact {problem.exact_mean:+.4f}), "
            f"variance {float(outputs['variance']):.3f} (exact {problem.exact_variance:.3f}), "
            f"{int(np.sum(outputs['histogram']))}/{problem.n_walkers} walkers binned")


def _spec():
    from plugins.example import reference

    return SolverSpec(
        name="example.random_walk",
        problem_type=RandomWalkProblem,
        implementations={"numpy": reference.solve_numpy, "numba": _solve_numba,
                         "process": reference.solve_process, "torch": _solve_torch},
        features=_features,
        size_axis="n_walkers",
        ladder=_ladder,
        memory=_memory,
        default_problem=RandomWalkProblem,
        summarize=_summarize,
        description="independent Gaussian random walks; mean, variance and histogram of the end points",
        version=__version__,
    )


@hookimpl
def crossover_solvers() -> list[SolverSpec]:
    return [_spec()]
