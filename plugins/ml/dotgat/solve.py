"""The ``ml.dotgat`` implementations: one training run, naive or optimised, eager or compiled, CPU or GPU.

One function serves every variant: the model class, whether the step is
compiled, and the device are its arguments. Models are kept per shape
and variant, and re-initialised in place for each run, so a compiled
model is compiled once per shape in a process (its ``compile_key``), not
once per run.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from core.backends.torch_gpu import compile_in_process
from plugins.ml.dotgat.data import make_split
from plugins.ml.dotgat.model import build
from plugins.ml.dotgat.problem import DotGATProblem
from plugins.ml.dotgat.train import train, training_step

_KEEP = 4  # models kept (the calibration and evaluation of one solver revisit a few shapes)
_models: OrderedDict[tuple, tuple[torch.nn.Module, Any]] = OrderedDict()


def _model(problem: DotGATProblem, kind: str, compiled: bool, device: torch.device):
    key = (problem.config(), kind, compiled, str(device))
    if key in _models:
        _models.move_to_end(key)
    else:
        model = build(problem.config(), kind).to(device)
        _models[key] = (model, compile_in_process(model) if compiled else None)
        while len(_models) > _KEEP:
            _models.popitem(last=False)
    return _models[key]


@functools.lru_cache(maxsize=2)
def _data(problem_task, n_train: int, n_val: int):
    return make_split(problem_task, n_train, 0), make_split(problem_task, n_val, 1)


def run_training(problem: DotGATProblem, kind: str, compiled: bool, device: torch.device) -> dict[str, Any]:
    """Train from the seeded initialisation; the validation loss before and after, and the training curve."""
    model, forward = _model(problem, kind, compiled, device)
    model.reset_parameters(problem.seed)
    (X, y), (X_val, y_val) = [[torch.from_numpy(a).to(device) for a in pair]
                              for pair in _data(problem.task(), problem.n_train, problem.n_val)]
    # the fused AdamW kernel is part of the optimised variant; the naive one keeps PyTorch's default
    trainer = training_step(model, total_steps=problem.n_steps, lr=problem.lr, precision=problem.precision,
                            compiled=forward, fused=kind == "optimized")
    start = trainer.evaluate(X_val, y_val)
    generator = torch.Generator().manual_seed(problem.seed or 0)
    losses = train(trainer, X, y, problem.n_steps, problem.batch, generator)
    end = trainer.evaluate(X_val, y_val)
    return {"train_loss": losses.float().cpu().numpy(), "val_loss_start": np.float64(start),
            "val_loss_end": np.float64(end), "val_loss_ratio": np.float64(start / end)}


def solve_cpu(problem: DotGATProblem, kind: str, compiled: bool = False) -> dict[str, Any]:
    return run_training(problem, kind, compiled, torch.device("cpu"))


def solve_gpu(problem: DotGATProblem, kind: str, compiled: bool = False) -> dict[str, Any]:
    from core.backends.torch_gpu import device

    return run_training(problem, kind, compiled, device())
