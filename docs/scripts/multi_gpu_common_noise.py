"""Common noise on 1, 2 and 4 GPUs: wall time and speed-up of splitting the K paths across the devices.

    python docs/scripts/multi_gpu_common_noise.py --K 256 --N 1000000 --Nx 101 --Nt 100 --max-iter 10

Each GPU count up to the visible devices (1, 2, 4, ... or ``--gpus``) runs
the same problem through ``plugins.mfg.common_noise.solve_torch`` (the
torch backend's code, ``devices=`` capping the GPUs used): one warm-up on a
small problem first (it starts each GPU's process, its CUDA context and its
Triton kernels, one-off costs paid once per process), then ``--repeats``
timed runs, outputs on the host inside the clock. The tolerances are zero
and ``max_iter`` is fixed, so every path runs exactly ``max_iter`` Picard
iterations and every run does the same work.

It prints the card (torch.cuda.get_device_name), the median wall time per
GPU count, the speed-up over one GPU, and the largest difference of the
path-averaged U and M from the one-GPU answer: the paths are the same on
any split, and only the order of the kernels' float64 atomic adds differs.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from core.atomic import atomic_write_text
from plugins.mfg.common_noise import solve_torch
from plugins.mfg.problem import CommonNoiseProblem


def run(problem: CommonNoiseProblem, gpus: int, hjb_device: bool) -> tuple[float, dict]:
    started = time.perf_counter()
    out = solve_torch(problem, hjb_device=hjb_device, devices=gpus)  # NumPy outputs: on the host in the clock
    return time.perf_counter() - started, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--K", type=int, default=256)
    parser.add_argument("--N", type=int, default=1_000_000)
    parser.add_argument("--Nx", type=int, default=101)
    parser.add_argument("--Nt", type=int, default=100)
    parser.add_argument("--max-iter", type=int, default=10)
    parser.add_argument("--preset", default="lq")
    parser.add_argument("--hjb", choices=["device", "host"], default="host",
                        help="the HJB sweep with numba on the host (torch:hjb_host; each GPU's process runs its "
                             "paths') or batched on the GPU (torch:hjb_device, launch-bound: ~2 s a sweep at "
                             "Nx = Nt = 101 whatever K, on every GPU at once)")
    parser.add_argument("--gpus", type=int, nargs="+", default=None, help="GPU counts (default 1, 2, 4, ...)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the summary to this file")
    args = parser.parse_args()

    import torch

    visible = torch.cuda.device_count()
    if visible == 0:
        raise SystemExit("no CUDA GPU is visible here: run this on a GPU host")
    counts = args.gpus or [g for g in (1, 2, 4, 8) if g <= visible]
    fields = {"preset": args.preset, "K": args.K, "N": args.N, "Nx": args.Nx, "Nt": args.Nt,
              "max_iter": args.max_iter, "rtol": 0.0, "atol": 0.0, "seed": 0}
    problem = CommonNoiseProblem(**fields)
    warm = CommonNoiseProblem(**{**fields, "K": 2 * max(counts), "N": 10_000, "max_iter": 2})
    hjb_device = args.hjb == "device"
    names = [torch.cuda.get_device_name(i) for i in range(visible)]
    print(f"GPUs: {visible} visible: {', '.join(names)}; K={args.K}, N={args.N:,}, Nx={args.Nx}, Nt={args.Nt}, "
          f"{args.max_iter} Picard iterations, {args.preset}, HJB on the {args.hjb}")

    rows, reference = [], None
    for gpus in counts:
        warm_seconds, _ = run(warm, gpus, hjb_device)
        times, out = [], None
        for _ in range(args.repeats):
            seconds, out = run(problem, gpus, hjb_device)
            times.append(seconds)
        reference = reference or out
        row = {"gpus": gpus, "seconds": times, "median_s": float(np.median(times)), "warm_up_s": warm_seconds,
               "max_abs_diff_U_mean": float(np.max(np.abs(out["U_mean"] - reference["U_mean"]))),
               "max_abs_diff_M_mean": float(np.max(np.abs(out["M_mean"] - reference["M_mean"]))),
               "same_paths": bool(np.array_equal(out["theta"], reference["theta"]))}
        row["speed_up"] = rows[0]["median_s"] / row["median_s"] if rows else 1.0
        rows.append(row)
        print(f"{gpus} GPU(s): {', '.join(f'{t:.2f}' for t in times)} s (median {row['median_s']:.2f} s, "
              f"warm-up {warm_seconds:.1f} s); speed-up over 1 GPU x{row['speed_up']:.2f}; "
              f"vs 1 GPU: max |dU_mean| {row['max_abs_diff_U_mean']:.1e}, max |dM_mean| "
              f"{row['max_abs_diff_M_mean']:.1e}, same paths {row['same_paths']}")
    summary = {"gpus_visible": visible, "cards": names, "problem": fields, "hjb": args.hjb, "rows": rows}
    print(json.dumps(summary))
    if args.json:
        atomic_write_text(args.json, json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
