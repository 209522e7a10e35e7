"""The example problem: many independent Gaussian random walks.

Small enough to read in one sitting, yet it has what the core must handle:
a size axis, randomness that must be reproducible per task, and a reduction.
The truth is analytic: after ``n`` steps of ``drift + step_std * Z`` a walker
sits at ``N(n * drift, n * step_std**2)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from core.validation import check_float, check_int, check_seed


@dataclass(frozen=True)
class RandomWalkProblem:
    """``n_walkers`` independent walks of ``n_steps`` Gaussian steps each.

    Walkers are split into chunks of ``chunk`` walkers; each chunk has its
    own random stream, so the result does not depend on how many workers or
    threads ran it. ``n_bins`` bins spanning +-6 standard deviations collect
    the final positions.
    """

    n_walkers: int = 200_000
    n_steps: int = 100
    step_std: float = 1.0
    drift: float = 0.0
    n_bins: int = 64
    chunk: int = 32_768
    seed: int | None = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_walkers", check_int("n_walkers", self.n_walkers, minimum=1))
        object.__setattr__(self, "n_steps", check_int("n_steps", self.n_steps, minimum=1))
        object.__setattr__(self, "step_std", check_float("step_std", self.step_std, minimum=0))
        object.__setattr__(self, "drift", check_float("drift", self.drift))
        object.__setattr__(self, "n_bins", check_int("n_bins", self.n_bins, minimum=1, maximum=100_000))
        object.__setattr__(self, "chunk", check_int("chunk", self.chunk, minimum=1))
        object.__setattr__(self, "seed", check_seed("seed", self.seed))

    @property
    def exact_mean(self) -> float:
        return self.n_steps * self.drift

    @property
    def exact_variance(self) -> float:
        return self.n_steps * self.step_std**2

    def bin_edges(self) -> np.ndarray:
        half_width = 6 * math.sqrt(self.exact_variance) or 1.0
        return np.linspace(self.exact_mean - half_width, self.exact_mean + half_width, self.n_bins + 1)

    def chunks(self) -> list[tuple[int, int]]:
        """``(first walker, walkers)`` of every chunk, in order."""
        return [(start, min(self.chunk, self.n_walkers - start)) for start in range(0, self.n_walkers, self.chunk)]
