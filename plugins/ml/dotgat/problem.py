"""The ``ml.dotgat`` problem: one training run of DynamicDotGAT on the synthetic task, of a given size.

The defaults are a small run that trains on a CPU in seconds (60 steps
lower the validation loss 6-8x; ``crossover demo`` runs it on every
implementation); the
model's own defaults (:class:`~plugins.ml.dotgat.model.DotGATConfig`) are
the published size. Pure numbers and strings, so problems pickle and
build from the command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.validation import check_choice, check_float, check_int, check_seed, fail
from plugins.ml.dotgat.config import GRAPHS, DotGATConfig
from plugins.ml.dotgat.data import SyntheticTask

PRECISIONS = ("fp32", "tf32", "bf16")
# AdamW moves every parameter by about lr a step whatever the gradient's scale (its update is m / sqrt(v),
# about +-1), and the weights start at about 1/sqrt(H) (0.1-0.2): at lr 1 each step already moves a weight
# by several times its own scale (validation loss 30x the default's after 20 steps), at 10 the training
# is NaN within 20 steps, and from 100 on the decoupled weight decay's factor 1 - 0.01 lr is <= 0
LR_MAX = 1.0


@dataclass(frozen=True)
class DotGATProblem:
    """``n_steps`` AdamW steps of batch ``batch`` on a model of the given shape, in ``precision``."""

    batch: int = 32
    n_steps: int = 60
    T: int = 16
    M: int = 16
    A: int = 8
    H: int = 32
    heads: int = 4
    message_steps: int = 2
    rho: float = 0.25
    rank: int = 3
    y_dim: int = 1
    graph: str = "small_world"
    precision: str = "fp32"
    lr: float = 3e-3
    n_train: int = 1024
    n_val: int = 128
    seed: int | None = 0

    def __post_init__(self) -> None:
        for name in ("batch", "n_steps", "T", "M", "A", "H", "heads", "message_steps", "rank", "y_dim", "n_train",
                     "n_val"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1))
        object.__setattr__(self, "rho", check_float("rho", self.rho, minimum=0, maximum=1, strict_minimum=True))
        object.__setattr__(self, "lr", check_float("lr", self.lr, minimum=0, maximum=LR_MAX, strict_minimum=True))
        object.__setattr__(self, "graph", check_choice("graph", self.graph, GRAPHS))
        object.__setattr__(self, "precision", check_choice("precision", self.precision, PRECISIONS))
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
        if self.H % self.heads:
            raise fail("heads", self.heads, f"must divide H={self.H}")

    def config(self) -> DotGATConfig:
        return DotGATConfig(T=self.T, M=self.M, A=self.A, H=self.H, heads=self.heads,
                            message_steps=self.message_steps, rho=self.rho, y_dim=self.y_dim, graph=self.graph,
                            structure_seed=self.seed)

    def task(self) -> SyntheticTask:
        return SyntheticTask(T=self.T, M=self.M, A=self.A, y_dim=self.y_dim, rank=self.rank, seed=self.seed)

    def forward_flops(self) -> float:
        """Multiply-adds x 2 of one sequence's forward pass (the matmuls and both attentions)."""
        T, A, H, M = self.T, self.A, self.H, self.M
        per_block = 20 * H * H + 4 * H * (T + A)  # QKV and outputs of two attentions, the MLP; scores and sums
        return float(T * A * (2 * M * H + self.message_steps * per_block + 2 * H * self.y_dim))

    def parameters(self) -> float:
        A, H, M, S = self.A, self.H, self.M, self.message_steps
        return float(A * M * H + S * A * (10 * H * H + 6 * H) + S * self.heads * A * A + A * H * (2 + self.y_dim))
