"""The example problem: many independent Gaussian random walks.

Small enough to read in one sitting, yet it has what the core must handle:
a size axis, randomness that must be reproducible per task, and a reduction.
The truth is analytic: after ``n`` steps of ``drift + step_std * Z`` a walker
sits at ``N(n * drift, n * step_std**2)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.validation import FLOAT_MAX, check_float, check_int, check_seed, fail

# the histogram spans +-6 standard deviations; the walkers' largest |z| stays below 40 at float64
SPAN = 6.0


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
        set_ = object.__setattr__
        set_(self, "n_walkers", check_int("n_walkers", self.n_walkers, minimum=1))
        set_(self, "n_steps", check_int("n_steps", self.n_steps, minimum=1))
        set_(self, "step_std", check_float("step_std", self.step_std, minimum=0))
        # the variance is the walkers' sum of squared deviations, each below (40 * sqrt(n_steps) * step_std)**2
        # (40: the largest normal draw in float64): that sum must stay finite
        spread = 40 * self.step_std * math.sqrt(self.n_walkers * self.n_steps)
        if not spread <= math.sqrt(FLOAT_MAX):
            raise fail("step_std", self.step_std, f"must be at most {math.sqrt(FLOAT_MAX) / 40:.3g} / "
                       "sqrt(n_walkers * n_steps) so that the walkers' sum of squares stays finite")
        set_(self, "drift", check_float("drift", self.drift))
        if not math.isfinite(abs(self.exact_mean) + 40 * self.half_width):
            raise fail("drift", self.drift, "n_steps * drift, the walkers' mean, overflows float64")
        set_(self, "n_bins", check_int("n_bins", self.n_bins, minimum=1, maximum=100_000))
        edges = self.bin_edges()
        if not np.all(np.diff(edges) > 0):
            # a mean so far from zero that bins of the walkers' width round to the same float
            raise fail("drift", self.drift, f"the histogram's {self.n_bins} bins of width "
                       f"{2 * self.half_width / self.n_bins:.3g} around the mean {self.exact_mean:.3g} "
                       "cannot be told apart in float64: a smaller drift or a wider step_std")
        set_(self, "chunk", check_int("chunk", self.chunk, minimum=1))
        set_(self, "seed", check_seed("seed", self.seed))

    @property
    def exact_mean(self) -> float:
        return self.n_steps * self.drift

    @property
    def exact_variance(self) -> float:
        return self.n_steps * self.step_std * self.step_std  # ** would raise OverflowError, * gives inf

    @property
    def half_width(self) -> float:
        """Half the histogram's span: 6 standard deviations, or 1 when the walkers do not move."""
        return SPAN * math.sqrt(self.n_steps) * self.step_std or 1.0

    def bin_edges(self) -> np.ndarray:
        return np.linspace(self.exact_mean - self.half_width, self.exact_mean + self.half_width, self.n_bins + 1)

    @property
    def n_chunks(self) -> int:
        return -(-self.n_walkers // self.chunk)

    def chunks(self) -> Chunks:
        """``(first walker, walkers)`` of every chunk, in order: a lazy sequence, never a list of them all."""
        return Chunks(self.n_walkers, self.chunk)


class Chunks(Sequence):
    """The chunks of ``n`` walkers, ``size`` at a time, computed on demand.

    ``n_walkers=10**12`` with the default chunk is 3e7 chunks: their list
    alone would take gigabytes before any walker moved.
    """

    def __init__(self, n: int, size: int):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return -(-self.n // self.size)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.size
        return start, min(self.size, self.n - start)
