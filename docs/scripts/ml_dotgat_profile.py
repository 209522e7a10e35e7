"""Where a DotGAT training step spends its GPU time: the top kernels of a few steps, per variant.

    python docs/scripts/ml_dotgat_profile.py --out DIR [--batch 64]

Profiles the naive eager fp32 step and the optimised compiled bf16 step
(the issue's speed-up compares these) at the published shape with ``torch.profiler`` and writes
each one's kernel table, sorted by total GPU time, to ``profile_<name>.txt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from plugins.ml.dotgat.data import make_split
from plugins.ml.dotgat.model import build
from plugins.ml.dotgat.problem import DotGATProblem
from plugins.ml.dotgat.train import training_step

PUBLISHED = {"T": 50, "M": 25, "A": 20, "H": 128, "heads": 4, "message_steps": 5, "rho": 0.25}
VARIANTS = {"naive_eager_fp32": ("naive", False, "fp32"), "optimized_compiled_bf16": ("optimized", True, "bf16")}


def kernel_table(kind: str, compiled: bool, precision: str, batch: int, steps: int) -> str:
    problem = DotGATProblem(batch=batch, precision=precision, **PUBLISHED)
    model = build(problem.config(), kind).cuda()
    trainer = training_step(model, total_steps=10_000, precision=precision,
                            compiled=torch.compile(model) if compiled else None, fused=kind == "optimized")
    X, y = (torch.from_numpy(a[:batch]).cuda() for a in make_split(problem.task(), batch, 0))
    for _ in range(3):  # compile and warm up outside the profile
        trainer.step(X, y)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.step(X, y)
        torch.cuda.synchronize()
    averages = prof.key_averages()
    for key in ("device_time_total", "cuda_time_total"):
        try:
            return averages.table(sort_by=key, row_limit=30, max_name_column_width=70)
        except (AttributeError, KeyError, ValueError):
            continue
    return averages.table(row_limit=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (kind, compiled, precision) in VARIANTS.items():
        table = kernel_table(kind, compiled, precision, args.batch, args.steps)
        (args.out / f"profile_{name}.txt").write_text(f"# {name}, batch {args.batch}, {args.steps} steps\n{table}\n")
        print(f"# {name}\n{table}", flush=True)


if __name__ == "__main__":
    main()
