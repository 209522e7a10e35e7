"""Torch kernel of the random-walk example: everything stays on the GPU.

Steps are drawn in blocks of walkers x steps so that a 100-step walk costs a
handful of kernel launches, not hundreds; only the mean, the variance and
the histogram come back to the host.
"""

from __future__ import annotations

import numpy as np

from plugins.example.problem import RandomWalkProblem

_BLOCK_ELEMENTS = 1 << 26  # 512 MB of float64 per block of random steps at most


def solve_torch(problem: RandomWalkProblem) -> dict:
    import torch

    from core.backends.torch_gpu import device

    dev = device()
    dtype = torch.float64 if dev.type == "cuda" else torch.float32  # MPS has no float64
    generator = torch.Generator(device=dev)
    generator.manual_seed(problem.seed if problem.seed is not None else torch.seed())
    positions = torch.zeros(problem.n_walkers, dtype=dtype, device=dev)
    block = max(1, min(problem.n_steps, _BLOCK_ELEMENTS // problem.n_walkers))
    done = 0
    while done < problem.n_steps:
        steps = min(block, problem.n_steps - done)
        positions += torch.randn(steps, problem.n_walkers, generator=generator, dtype=dtype, device=dev).sum(0)
        done += steps
    positions = positions * problem.step_std + problem.n_steps * problem.drift
    edges = problem.bin_edges()
    # histc drops values outside [min, max], as np.histogram does with fixed edges
    histogram = torch.histc(positions, bins=problem.n_bins, min=float(edges[0]), max=float(edges[-1]))
    variance = positions.var(correction=1) if problem.n_walkers > 1 else torch.zeros((), dtype=dtype, device=dev)
    # one device-to-host copy for all results: each copy is a synchronisation
    packed = torch.cat([positions.mean().reshape(1), variance.reshape(1), histogram]).cpu().numpy()
    return {"mean": packed[0], "variance": packed[1], "histogram": np.rint(packed[2:]).astype(np.int64),
            "bin_edges": edges}
