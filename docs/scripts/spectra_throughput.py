"""Spectra per second against batch size for each backend of spectra.fit, on 3-arm DESI-like spectra.

Run on the machine to measure (the figures name it):

    python docs/scripts/spectra_throughput.py --out docs/results/spectra-<machine>

Each backend is warmed up first (Numba's compile or cache load, the process
pool's start and every worker's template library, the CUDA context and the
library's copy to the GPU), then each batch size is fitted through
``core.solve`` with that backend named: the time a user pays per call once
the backend runs. A point whose time, extrapolated from the previous batch
size, would exceed ``--max-seconds`` is skipped and says so (the numpy
reference fits one spectrum at a time). On the torch backend the peak GPU
memory is recorded next to the memory model's estimate. Writes
``throughput.json`` and ``throughput.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import core
from core.atomic import atomic_write_text
from core.costmodel.store import cpu_model
from plugins.spectra import work
from plugins.spectra.model import Spectra
from plugins.spectra.problem import SpectraProblem
from plugins.spectra.synth import synthetic_spectra
from plugins.spectra.templates import named_library


def machine() -> str:
    text = f"{cpu_model()}, {os.cpu_count()} logical CPUs"
    if core.availability("torch").available:
        import torch

        text += f", {torch.cuda.get_device_name(0)}"
    return text


def run_once(spectra: Spectra, grid: str, backend: str) -> tuple[float, dict]:
    problem = SpectraProblem(grid=grid, spectra=spectra)
    started = time.perf_counter()
    result = core.solve(problem, backend=backend)
    return time.perf_counter() - started, result.outputs


def measure(backend: str, all_spectra: Spectra, grid: str, batches: list[int], max_seconds: float,
            log) -> list[dict]:
    rows: list[dict] = []
    # warm-up: every one-off paid here (64 spectra for the pool, so that every worker loads the library)
    run_once(all_spectra.rows(0, min(64 if backend == "process" else 8, len(all_spectra))), grid, backend)
    previous = None
    for batch in batches:
        predicted = None if previous is None else previous["seconds"] * batch / previous["batch"]
        if predicted is not None and predicted > max_seconds:
            rows.append({"batch": batch, "skipped": f"predicted {predicted:.0f} s"})
            log(f"{backend:8s} batch {batch:5d}: skipped ({rows[-1]['skipped']})")
            continue
        repeats = 3 if predicted is None or predicted < 2.0 else 1
        try:
            row = time_batch(backend, all_spectra, grid, batch, repeats)
        except Exception as exc:  # an out-of-memory or a failed solve is a finding, not the end of the run
            rows.append({"batch": batch, "skipped": f"{type(exc).__name__}: {str(exc)[:200]}"})
            log(f"{backend:8s} batch {batch:5d}: FAILED {rows[-1]['skipped']}")
            break
        rows.append(row)
        previous = row
        peak = row.get("peak_gpu_bytes")
        log(f"{backend:8s} batch {batch:5d}: {row['seconds']:.3f} s, {row['spectra_per_second']:.1f} spectra/s, "
            f"success {row['success']:.3f}, {row['mean_iterations']:.1f} iterations"
            + (f", peak GPU {peak / 2**30:.2f} GiB (model {row['model_bytes'] / 2**30:.2f})" if peak else ""))
    return rows


def time_batch(backend: str, all_spectra: Spectra, grid: str, batch: int, repeats: int) -> dict:
    on_gpu = backend.split(":", 1)[0] == "torch"
    if on_gpu:
        import torch

        torch.cuda.reset_peak_memory_stats()
    seconds = []
    for _ in range(repeats):
        elapsed, outputs = run_once(all_spectra.rows(0, batch), grid, backend)
        seconds.append(elapsed)
    median = float(np.median(seconds))
    row = {"batch": batch, "seconds": median, "spectra_per_second": batch / median, "repeats": repeats,
           "success": float(np.mean(outputs["SUCCESS"])), "mean_iterations": float(np.mean(outputs["ITERATIONS"])),
           "model_bytes": work.batch_bytes(batch, all_spectra.n_pixels, named_library(grid).nodes, backend)}
    if on_gpu:
        row["peak_gpu_bytes"] = float(torch.cuda.max_memory_allocated())
    return row


def crossover(results: dict, fast: str, slow: str) -> int | None:
    """The smallest measured batch size from which ``fast`` beats ``slow`` at every larger size measured."""
    a = {r["batch"]: r["spectra_per_second"] for r in results.get(fast, []) if "seconds" in r}
    b = {r["batch"]: r["spectra_per_second"] for r in results.get(slow, []) if "seconds" in r}
    common = sorted(set(a) & set(b))
    winning = [n for n in common if all(a[m] > b[m] for m in common if m >= n)]
    return winning[0] if winning else None


def markdown(payload: dict) -> str:
    backends = list(payload["results"])
    lines = [f"Machine: {payload['machine']}; grid {payload['grid']} ({payload['nodes']} nodes), "
             f"{payload['pixels']} pixels in 3 arms, S/N {payload['snr']:g}; spectra per second "
             "(median of 3 calls where one takes under 2 s, else one call).", "",
             "| batch | " + " | ".join(backends) + " |", "|---:|" + "---:|" * len(backends)]
    batches = sorted({r["batch"] for rows in payload["results"].values() for r in rows})
    for n in batches:
        cells = []
        for b in backends:
            row = next((r for r in payload["results"][b] if r["batch"] == n), None)
            cells.append("-" if row is None else (row.get("skipped", "") if "seconds" not in row
                                                  else f"{row['spectra_per_second']:.1f}"))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    if payload.get("crossover_torch_over_process") is not None or "torch" in backends:
        lines += ["", f"torch beats process from batch {payload.get('crossover_torch_over_process')} on."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="numpy,numba:serial,numba:threads,process,torch,torch:fused,torch:graph")
    parser.add_argument("--batches", default="1,8,64,512,4096")
    parser.add_argument("--grid", default="realistic")
    parser.add_argument("--snr", type=float, default=20.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--limit", action="append", default=[],
                        help="BACKEND=N: measure that backend up to N spectra only (e.g. numpy=8)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    limits = {name: int(n) for name, n in (item.split("=") for item in args.limit)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(text: str) -> None:
        print(text, flush=True)

    library = named_library(args.grid)
    started = time.perf_counter()
    spectra = synthetic_spectra(library, max(batches), snr=args.snr, seed=1)
    log(f"{machine()}: {max(batches)} spectra generated in {time.perf_counter() - started:.1f} s")
    results = {}
    for backend in args.backends.split(","):
        status = core.availability(backend.split(":", 1)[0])  # a variant (numba:serial) runs on its backend
        if not status.available:
            log(f"{backend}: unavailable ({status.reason})")
            continue
        mine = [b for b in batches if b <= limits.get(backend, max(batches))]
        results[backend] = measure(backend, spectra, args.grid, mine, args.max_seconds, log)
    payload = {"machine": machine(), "grid": args.grid, "nodes": library.nodes, "pixels": spectra.n_pixels,
               "snr": args.snr, "cpus": os.cpu_count(), "python": sys.version.split()[0], "results": results,
               "crossover_torch_over_process": crossover(results, "torch", "process")}
    atomic_write_text(out / "throughput.json", json.dumps(payload, indent=1))
    atomic_write_text(out / "throughput.md", markdown(payload))
    log(markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
