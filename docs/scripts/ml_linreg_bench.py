"""The linear-regression comparison: the preset (4M training points x 200 epochs) on every implementation.

    python docs/scripts/ml_linreg_bench.py --out docs/results/ml-<machine>

On the CPU: the numpy reference and the numba pass, end to end (the
numba/numpy ratio). On a CUDA GPU, side by side in one process:

- ``graph``: the solver's Triton epochs in one CUDA graph, data already on
  the device (the kernel time the memory-bandwidth floor bounds), and the
  same with other launch shapes (tile, programs per SM, warps);
- ``compile`` and ``eager``: the same epochs launched one by one, no host sync;
- ``nn.Linear``: PyTorch's idiom, ``nn.Linear(1, 1)`` + ``MSELoss`` + ``SGD``,
  full batch, data on the device, float32;
- every ``torch:*`` implementation end to end through ``core.solve``
  (upload of the data and the copy back included).

The floor is 200 epochs x 32 MB (x and y as float32) over the bandwidth
measured by a device-to-device copy (bytes read + written), and over the
card's nominal bandwidth. GPU times are CUDA-event medians of repeated runs.
Writes ``ml_linreg.json`` and ``ml_linreg.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from unittest.mock import patch

import numpy as np

import core
from plugins.ml import linreg_triton as triton_epoch
from plugins.ml.linreg_numpy import solve_numpy
from plugins.ml.linreg_problem import preset_problem

NOMINAL_TBPS = {"H100": 3.35, "H200": 4.8}  # vendors' datasheets (SXM)


def wall(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def cuda_time(fn, repeats: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(samples)


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting bytes read and written."""
    import torch

    source = torch.empty(2**28, dtype=torch.float32, device="cuda")
    target = torch.empty_like(source)
    seconds = cuda_time(lambda: target.copy_(source), 10)
    return 2 * source.numel() * 4 / seconds


def gpu_rows(problem, reference) -> tuple[dict, dict]:
    import torch

    from plugins.ml import linreg_torch as lt

    X, y = problem.data()
    x_dev, y_dev = lt.upload(X, y, "cuda")
    rows, checks = {}, {}

    def device_run(step):
        state, scalars, losses, counter = lt._initial(problem, "cuda")
        lt.run_epochs(step, x_dev, y_dev, state, scalars, losses, counter)
        return state, losses

    rows["eager (data on device)"] = cuda_time(lambda: device_run(lt.advance), 5)
    rows["compile (data on device)"] = cuda_time(lambda: device_run(lt.compiled_advance()), 5)
    lt.solve_on(problem, "cuda", "graph")  # capture
    captured = next(iter(lt._captured.values()))
    rows["graph replay (data on device)"] = cuda_time(captured.graph.replay, 20)
    # the Triton epoch's launch shape: tile, programs per SM, warps (the solver's own is the row above)
    for tile, per_sm, warps in ((1024, 4, 4), (2048, 2, 8), (2048, 8, 8), (4096, 4, 8), (4096, 8, 16)):
        with patch.multiple(triton_epoch, TILE=tile, PROGRAMS_PER_SM=per_sm, WARPS=warps):
            lt._captured.clear()
            lt.solve_on(problem, "cuda", "graph")
            captured = next(iter(lt._captured.values()))
            rows[f"graph replay, tile {tile}, {per_sm}/SM, {warps} warps"] = cuda_time(captured.graph.replay, 20)
    lt._captured.clear()

    # PyTorch's idiom, side by side: nn.Linear + MSELoss + SGD, full batch, float32, 200 epochs
    xs = torch.from_numpy(X.astype(np.float32)).cuda()  # X is (n, 1) already
    ys = torch.from_numpy(y.astype(np.float32)).cuda()[:, None]

    def idiom():
        model = torch.nn.Linear(1, 1).cuda()
        with torch.no_grad():
            model.weight.fill_(problem.w0)
            model.bias.fill_(problem.b0)
        optimizer = torch.optim.SGD(model.parameters(), lr=problem.learning_rate)
        loss_fn = torch.nn.MSELoss()
        for _ in range(problem.n_epochs):
            optimizer.zero_grad()
            loss = loss_fn(model(xs), ys)
            loss.backward()
            optimizer.step()
        return model

    rows["nn.Linear + MSELoss + SGD (data on device)"] = cuda_time(idiom, 5)
    model = idiom()
    checks["nn.Linear final (w, b)"] = [float(model.weight.detach()), float(model.bias.detach())]
    for key in ("torch:eager", "torch:compile", "torch:graph"):
        out = core.solve(problem, backend=key, solver="ml.linreg").outputs
        checks[key] = {"w_rel_err": abs(float(out["coef"][0]) / float(reference["coef"][0]) - 1),
                       "b_rel_err": abs(float(out["intercept"]) / float(reference["intercept"]) - 1),
                       "loss_curve_max_rel_err": float(np.max(np.abs(out["loss_curve"] / reference["loss_curve"] - 1)))}
        rows[f"core.solve {key} (upload included)"] = wall(
            lambda key=key: core.solve(problem, backend=key, solver="ml.linreg"), 5)
    return rows, checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu-repeats", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    problem = preset_problem()
    reference = solve_numpy(problem)
    rows = {"numpy (float64 reference)": wall(lambda: solve_numpy(problem), args.cpu_repeats),
            "numba (fused parallel pass)": wall(
                lambda: core.solve(problem, backend="numba:threads", solver="ml.linreg"), args.cpu_repeats)}
    report = {"problem": "preset: 4,000,000 training points x 200 epochs", "seconds": rows,
              "numba_over_numpy_speedup": rows["numpy (float64 reference)"] / rows["numba (fused parallel pass)"],
              "reference_w_b": [float(reference["coef"][0]), float(reference["intercept"])]}
    if core.availability("torch").available:
        import torch

        name = torch.cuda.get_device_name(0)
        bandwidth = copy_bandwidth()
        floor_bytes = problem.n_epochs * problem.n_samples * 8  # x and y as float32, every epoch
        gpu, checks = gpu_rows(problem, reference)
        rows.update(gpu)
        nominal = next((v for k, v in NOMINAL_TBPS.items() if k in name), None)
        report.update(device=name, copy_bandwidth_TBps=bandwidth / 1e12, floor_bytes=floor_bytes,
                      floor_seconds_measured_bandwidth=floor_bytes / bandwidth,
                      floor_seconds_nominal=floor_bytes / (nominal * 1e12) if nominal else None, checks=checks)
        # the solver's own replay (its block for this size), not the best of the block sweep
        graph = rows["graph replay (data on device)"]
        report["solver_launch"] = {"tile": triton_epoch.TILE, "programs_per_sm": triton_epoch.PROGRAMS_PER_SM,
                                   "warps": triton_epoch.WARPS}
        report["graph_over_floor"] = graph / report["floor_seconds_measured_bandwidth"]
        report["idiom_over_graph"] = rows["nn.Linear + MSELoss + SGD (data on device)"] / graph
    (args.out / "ml_linreg.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# ml.linreg preset ({report.get('device', 'CPU only')})", "", "| run | seconds |", "| --- | --- |"]
    lines += [f"| {name} | {seconds:.4g} |" for name, seconds in rows.items()]
    lines += ["", f"numba / numpy speed-up: {report['numba_over_numpy_speedup']:.1f}x"]
    if "graph_over_floor" in report:
        lines += [f"floor (measured copy bandwidth {report['copy_bandwidth_TBps']:.2f} TB/s): "
                  f"{report['floor_seconds_measured_bandwidth'] * 1e3:.2f} ms; the solver's graph replay "
                  f"({report['solver_launch']}) is {report['graph_over_floor']:.2f}x the floor",
                  f"nn.Linear + MSELoss + SGD is {report['idiom_over_graph']:.1f}x slower than the solver's replay"]
    (args.out / "ml_linreg.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(report.get("checks", {}), indent=2))


if __name__ == "__main__":
    main()
