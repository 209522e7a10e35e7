"""The DotGAT model's shape and fixed structure (column masks, social graph): NumPy only, no torch import."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from core.validation import check_choice, check_float, check_int, check_seed, fail

GRAPHS = ("ring", "small_world")


@dataclass(frozen=True)
class DotGATConfig:
    """The model's shape. Defaults are the published model's: T 50, M 25, A 20, H 128, 4 heads, 5 steps, rho 0.25."""

    T: int = 50
    M: int = 25
    A: int = 20
    H: int = 128
    heads: int = 4
    message_steps: int = 5
    rho: float = 0.25
    y_dim: int = 1
    graph: str = "small_world"
    neighbours: int = 2  # on each side of the ring, before rewiring
    rewire: float = 0.1  # small world: the chance that each ring edge is rewired to a random agent
    structure_seed: int | None = 0  # the column masks and the graph

    def __post_init__(self) -> None:
        for name in ("T", "M", "A", "H", "heads", "message_steps", "y_dim"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1))
        object.__setattr__(self, "neighbours", check_int("neighbours", self.neighbours, minimum=0))
        object.__setattr__(self, "rho", check_float("rho", self.rho, minimum=0, maximum=1, strict_minimum=True))
        object.__setattr__(self, "rewire", check_float("rewire", self.rewire, minimum=0, maximum=1))
        object.__setattr__(self, "graph", check_choice("graph", self.graph, GRAPHS))
        object.__setattr__(self, "structure_seed", check_seed("structure_seed", self.structure_seed))
        if self.H % self.heads:
            raise fail("heads", self.heads, f"must divide H={self.H}")

    @property
    def head_dim(self) -> int:
        return self.H // self.heads

    def as_dict(self) -> dict:
        return asdict(self)


def column_masks(config: DotGATConfig) -> np.ndarray:
    """``[A, M]`` 0/1: agent a sees round(rho * M) columns (at least one), drawn without replacement."""
    rng = np.random.default_rng([config.structure_seed or 0, 1])
    seen = max(1, round(config.rho * config.M))
    masks = np.zeros((config.A, config.M), dtype=np.float32)
    for agent in range(config.A):
        masks[agent, rng.choice(config.M, size=seen, replace=False)] = 1.0
    return masks


def social_graph(config: DotGATConfig) -> np.ndarray:
    """``[A, A]`` bool adjacency with self-loops: a ring of ``neighbours`` a side, rewired for a small world.

    Watts-Strogatz rewiring: each ring edge (i, i+k) moves, with chance
    ``rewire``, to (i, j) for a random j not already linked; undirected.
    """
    A, k = config.A, min(config.neighbours, (config.A - 1) // 2)
    adjacency = np.eye(A, dtype=bool)
    for i in range(A):
        for step in range(1, k + 1):
            adjacency[i, (i + step) % A] = adjacency[(i + step) % A, i] = True
    if config.graph == "small_world":
        rng = np.random.default_rng([config.structure_seed or 0, 2])
        for step in range(1, k + 1):
            for i in range(A):
                j = (i + step) % A
                free = np.flatnonzero(~adjacency[i])
                if rng.random() < config.rewire and free.size:
                    target = int(rng.choice(free))
                    adjacency[i, j] = adjacency[j, i] = False
                    adjacency[i, target] = adjacency[target, i] = True
    return adjacency
