"""Offline synthetic data for DynamicDotGAT: low-rank temporal matrices from Gaussian-process factors.

Each sequence is ``X = U V + noise`` with ``U [T, rank]`` drawn from a
Gaussian process over time (squared-exponential kernel, unit variance)
and ``V [rank, M]`` fixed for the data set, so every row lies near one
``rank``-dimensional subspace and entries have about unit variance. The
task: agent ``a`` predicts ``tanh(X[t-1] . g_a)`` (``y_dim`` outputs) from
what it has seen up to ``t``, where ``g_a`` is a fixed direction over all
M columns, most of which the agent never sees; ``y[0]`` is ``tanh(0) = 0``.
The agents must share what they see (social attention) or use the
low-rank structure to infer the rest of the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from core.validation import check_float, check_int, check_seed


@dataclass(frozen=True)
class SyntheticTask:
    """The data set's shape and randomness."""

    T: int = 50
    M: int = 25
    A: int = 20
    y_dim: int = 1
    rank: int = 4
    lengthscale: float = 5.0  # in time steps
    noise: float = 0.05
    seed: int | None = 0

    def __post_init__(self) -> None:
        for name in ("T", "M", "A", "y_dim", "rank"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1))
        object.__setattr__(self, "lengthscale", check_float("lengthscale", self.lengthscale, minimum=0,
                                                            strict_minimum=True))
        object.__setattr__(self, "noise", check_float("noise", self.noise, minimum=0))
        object.__setattr__(self, "seed", check_seed("seed", self.seed))


def _task_weights(task: SyntheticTask) -> tuple[np.ndarray, np.ndarray]:
    """The data set's loadings ``V [rank, M]`` and target directions ``G [A, M, y_dim]`` (fixed by the seed)."""
    rng = np.random.default_rng([task.seed or 0, 0])
    loadings = rng.standard_normal((task.rank, task.M)) / np.sqrt(task.rank)
    directions = rng.standard_normal((task.A, task.M, task.y_dim)) * (1.5 / np.sqrt(task.M))
    return loadings, directions


def gp_factors(task: SyntheticTask, count: int, rng: np.random.Generator) -> np.ndarray:
    """``[count, T, rank]`` draws of a unit-variance GP over time (squared-exponential kernel)."""
    t = np.arange(task.T, dtype=np.float64)
    kernel = np.exp(-0.5 * ((t[:, None] - t[None, :]) / task.lengthscale) ** 2) + 1e-6 * np.eye(task.T)
    root = np.linalg.cholesky(kernel)
    return np.einsum("ts,nsr->ntr", root, rng.standard_normal((count, task.T, task.rank)))


def make_split(task: SyntheticTask, count: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` sequences of split ``split`` (0 train, 1 validation, ...): X ``[n, T, M]``, y ``[n, T, A, y_dim]``.

    float32, as the model trains in float32 or below.
    """
    count = check_int("count", count, minimum=1)
    loadings, directions = _task_weights(task)
    rng = np.random.default_rng([task.seed or 0, 1, split])
    X = gp_factors(task, count, rng) @ loadings + task.noise * rng.standard_normal((count, task.T, task.M))
    previous = np.concatenate([np.zeros_like(X[:, :1]), X[:, :-1]], axis=1)
    y = np.tanh(np.einsum("ntm,amy->ntay", previous, directions))
    return X.astype(np.float32), y.astype(np.float32)
