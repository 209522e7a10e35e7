"""The backward HJB sweep of K instances: numba against the Triton kernel (``mfg.hjb_fdm``'s ``torch:fused``).

    python docs/scripts/hjb_gpu_bench.py --Nx 401 --Nt 200 --batches 1 16 64 256

Each instance has its own potential and density (the preset's, rolled and
scaled, as common-noise paths and Picard iterates differ), so Newton stops
after different counts per instance, as in a real batch. Timed, warm (one
call first: JIT, CUDA context, Triton compile), median of ``--repeats``:

- ``numba``: the instances one after another on one core, each the
  whole-sweep numba kernel (``solve_numba``). There is no batched numba HJB:
  this serial loop is what the coupled GPU solvers' ``torch:hjb_host`` runs.
- ``triton``: one launch for the batch, inputs already on the device and U
  left there, as the coupled solvers hold them (the source ``V + f(M)`` is
  formed inside the clock).
- ``triton+copy``: the same with the NumPy inputs copied in and U copied out
  inside the clock, what a user calling it from the host pays.

``--warps`` also times the kernel at other warp counts per program (the
layout's rule picks one). The last lines are a markdown table; run it on the
machine you quote, and name it (the script prints the GPU and CPU).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from core.costmodel.calibrate import median_seconds
from plugins.mfg.hjb import layout
from plugins.mfg.problem import HJBProblem


def batch(base: HJBProblem, k: int) -> tuple[np.ndarray, np.ndarray]:
    """K potentials and densities: the preset's, rolled along x and scaled, a different amount each."""
    shifts = [(7 * i) % base.Nx for i in range(k)]
    scales = np.geomspace(0.1, 4.0, k) if k > 1 else np.ones(1)
    V = np.stack([np.roll(base.potential(), s, axis=1) * (1 + i % 3) for i, s in enumerate(shifts)])
    M = np.stack([np.roll(base.M, -s, axis=1) * c for s, c in zip(shifts, scales)])
    return V, M


def numba_seconds(base: HJBProblem, V: np.ndarray, M: np.ndarray, repeats: int) -> tuple[float, int]:
    """Median seconds of the serial loop, and the Newton iterations it ran."""
    from plugins.mfg.hjb.numba_kernel import solve_numba

    problems = [HJBProblem(**base.model_fields(), V_t=v, M=m) for v, m in zip(V, M)]  # validation off the clock
    iterations = sum(int(solve_numba(p)["newton_iterations"].sum()) for p in problems)
    return median_seconds(lambda: [solve_numba(p)["U"] for p in problems], repeats), iterations


def triton_seconds(base: HJBProblem, V: np.ndarray, M: np.ndarray, repeats: int,
                   warps: int | None = None, copies: bool = False) -> tuple[float, int]:
    """Median seconds of one batched launch, and the Newton iterations it ran."""
    import torch

    from plugins.mfg.hjb.torch_kernel import _congestion_cost, sweep_torch_batch
    from plugins.mfg.hjb.triton_kernel import sweep_fused

    device = torch.device("cuda")
    on_device = torch.as_tensor(V, device=device), torch.as_tensor(M, device=device)

    def resident():
        v, m = on_device
        if warps is None:
            out = sweep_torch_batch(base, v, m, device, fused=True)
        else:  # the kernel alone at another warp count; the source is formed as sweep_torch_batch forms it
            out = sweep_fused(base, v + _congestion_cost(torch, base, m), num_warps=warps)
        torch.cuda.synchronize()
        return out

    def from_host():
        return sweep_torch_batch(base, V, M, device, fused=True)[0].cpu().numpy()

    iterations = int(resident()[1].sum())
    return median_seconds(from_host if copies else resident, repeats), iterations


def device_names() -> tuple[str, str]:
    import torch

    from core.costmodel.store import cpu_model

    return torch.cuda.get_device_name(0), cpu_model()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--Nx", type=int, default=401)
    parser.add_argument("--Nt", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--presets", nargs="+", default=["towel_beach", "lq"],
                        help="towel_beach (periodic), lq and crowd (reflecting)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--numba-repeats", type=int, default=3, help="the serial loop at K=256 takes about a second")
    parser.add_argument("--warps", type=int, nargs="*", default=[], help="other warp counts to time the kernel at")
    args = parser.parse_args()
    gpu, cpu = device_names()
    print(f"GPU: {gpu}; CPU: {cpu}; Nx={args.Nx}, Nt={args.Nt}; default warps {layout.warps(args.Nx)}")
    rows = []
    for preset in args.presets:
        base = HJBProblem(preset=preset, Nx=args.Nx, Nt=args.Nt)
        for k in args.batches:
            V, M = batch(base, k)
            numba, newton = numba_seconds(base, V, M, args.numba_repeats)
            triton, triton_newton = triton_seconds(base, V, M, args.repeats)
            copied, _ = triton_seconds(base, V, M, args.repeats, copies=True)
            row = {"preset": preset, "boundary": base.boundary, "K": k, "numba_s": numba, "triton_s": triton,
                   "triton_copy_s": copied, "newton": newton, "triton_newton": triton_newton,
                   "warps": {w: triton_seconds(base, V, M, args.repeats, warps=w)[0] for w in args.warps}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nmfg.hjb_fdm, Nx={args.Nx}, Nt={args.Nt}: {gpu} against numba on one core of {cpu} (serial over the"
          " instances); medians, ms\n")
    warp_columns = "".join(f" triton {w} warps |" for w in args.warps)
    print(f"| preset | K | Newton its | numba | triton | triton+copy | numba / triton |{warp_columns}")
    print("|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(args.warps))
    for r in rows:
        warp_cells = "".join(f" {1e3 * r['warps'][w]:.2f} |" for w in args.warps)
        print(f"| {r['preset']} ({r['boundary']}) | {r['K']} | {r['newton']} | {1e3 * r['numba_s']:.2f} | "
              f"{1e3 * r['triton_s']:.2f} | {1e3 * r['triton_copy_s']:.2f} | {r['numba_s'] / r['triton_s']:.2f} |"
              + warp_cells)


if __name__ == "__main__":
    main()
