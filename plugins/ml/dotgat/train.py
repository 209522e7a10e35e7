"""The training loop: MSE, AdamW, a cosine learning-rate schedule with warm-up, gradient clipping.

:func:`training_step` builds the one step every caller uses (the solver,
the tests, the benchmark), for either implementation, eager or compiled,
in fp32, TF32 or bf16 autocast. The optimised variant uses the fused AdamW
kernel where torch has one for the device.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.validation import check_choice

PRECISIONS = ("fp32", "tf32", "bf16")


@dataclass
class Trainer:
    """A model, its optimiser and schedule, and the step (forward, loss, backward, clip, update)."""

    model: torch.nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    precision: str
    clip: float

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The trainer's numerics for the block: TF32 matmuls for ``tf32``, bf16 autocast for ``bf16``."""
        device = next(self.model.parameters()).device
        cast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if self.precision == "bf16"
                else contextlib.nullcontext())
        with precision_scope(self.precision), cast:
            yield

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return F.mse_loss(self.forward(x).float(), y)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimisation step; returns the loss as a device tensor (no host sync here)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip, foreach=True)
        self.optimizer.step()
        self.schedule.step()
        return loss.detach()

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
        """Mean squared error over a data set, in batches, eval mode, on the eager model.

        Eager even when training is compiled: a no-grad, eval-mode call of
        another batch size would cost a compiled forward one more compile.
        """
        self.model.eval()
        try:
            total = torch.zeros((), device=x.device)
            for i in range(0, len(x), batch):
                with self.autocast():
                    total += F.mse_loss(self.model(x[i:i + batch]).float(), y[i:i + batch], reduction="sum")
        finally:
            self.model.train()
        return float(total) / y.numel()


def cosine_with_warmup(total_steps: int, warmup: int) -> Callable[[int], float]:
    """The learning-rate factor: linear warm-up, then cosine decay to 10 % at the last step."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))
    return factor


@contextlib.contextmanager
def precision_scope(precision: str) -> Iterator[None]:
    """TF32 matmuls on inside the block for ``tf32`` only (``fp32`` means true float32; bf16 uses autocast).

    The flags are the process's: set for good, a tf32 training left every
    later float32 product in the process (another solver's, the spectra
    fit's) on TF32's 10-bit mantissa. The caller's settings come back after.
    """
    check_choice("precision", precision, PRECISIONS)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def training_step(model: torch.nn.Module, *, total_steps: int, lr: float = 3e-3, weight_decay: float = 0.01,
                  precision: str = "fp32", compiled: Callable | None = None, fused: bool = False,
                  clip: float = 1.0) -> Trainer:
    """A :class:`Trainer` for ``model``; ``compiled`` is a compiled forward to use instead of the module's own.

    ``fused``: the fused AdamW kernel (one launch for every parameter), else PyTorch's default AdamW.
    """
    check_choice("precision", precision, PRECISIONS)
    options = {"fused": True} if fused else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, **options)
    warmup = max(1, total_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(total_steps, warmup))
    # `compiled or model` would call len() on the compiled module
    return Trainer(model=model, forward=compiled if compiled is not None else model, optimizer=optimizer,
                   schedule=schedule, precision=precision, clip=clip)


def train(trainer: Trainer, X: torch.Tensor, y: torch.Tensor, steps: int, batch: int,
          generator: torch.Generator) -> torch.Tensor:
    """``steps`` steps on random mini-batches of (X, y); the losses stay on the device until the end."""
    losses = torch.empty(steps, device=X.device)
    # every step's batch drawn up front on the host (the same draws on any device) and copied once: a copy
    # from pageable host memory each step would wait for the GPU each step
    picks = torch.randint(len(X), (steps, batch), generator=generator, device="cpu").to(X.device)
    for index in range(steps):
        losses[index] = trainer.step(X[picks[index]], y[picks[index]])
    return losses
