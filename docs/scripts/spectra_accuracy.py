"""The issue's accuracy acceptance run: 500 in-model spectra at each of S/N 10, 20 and 50.

    python docs/scripts/spectra_accuracy.py --backend numba --out docs/results/spectra-<machine>

For each S/N: the median velocity offset in units of sigma_v, the RV scatter
over the Cramer-Rao bound of the model (per spectrum, then the standard
deviation of dv / bound), the pull standard deviation of every parameter,
and the fraction of velocity outliers (|dv| > max(5 sigma, 20 km/s)). With
``--compare`` it also fits ``--compare-n`` spectra on every named backend and
reports the largest difference from the first, in units of sigma. With
``--interp`` it measures the realistic grid's interpolation error against
the exact generator. Writes ``accuracy.json`` and ``accuracy.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from core.atomic import atomic_write_text
from plugins.spectra.accuracy import accuracy_run, interpolation_error
from plugins.spectra.ops import NumpyOps, TorchOps
from plugins.spectra.solve import fit_batch, numba_ops
from plugins.spectra.synth import synthetic_spectra
from plugins.spectra.templates import GRIDS, Generator, named_library

ACCEPTANCE = {"median_dv_over_sigma": "|x| < 0.1", "rv_scatter_over_crb": "<= 1.2", "pull_std_v": "0.9 - 1.2",
              "outlier_fraction": "< 0.01", "pull_std_teff": "0.8 - 1.3", "pull_std_logg": "0.8 - 1.3",
              "pull_std_feh": "0.8 - 1.3"}


def ops_for(name: str):
    if name == "numpy":
        return NumpyOps(), "scipy"
    if name == "numba":
        return numba_ops(), "lm"
    if name == "torch":
        import torch

        return TorchOps(torch.device("cuda")), "lm"
    if name == "torch-fused":
        import torch

        from plugins.spectra.triton_kernels import TritonOps

        return TritonOps(torch.device("cuda")), "lm"
    if name == "torch-graph":
        import torch

        from plugins.spectra.triton_kernels import GraphOps

        return GraphOps(torch.device("cuda")), "lm"
    if name == "torch-cpu":
        return TorchOps("cpu"), "lm"
    raise SystemExit(f"--backend {name!r}: must be numpy, numba, torch, torch-fused (Triton), torch-graph "
                     "(Triton, CUDA graphs) or torch-cpu")


def compare(names: list[str], n: int, grid: str) -> dict:
    library = named_library(grid)
    spectra = synthetic_spectra(library, n, snr=20, seed=99)
    fits = {}
    for name in names:
        ops, method = ops_for(name)
        fits[name] = fit_batch(spectra, library, ops, method=method)
    first = names[0]
    ok = np.logical_and.reduce([fits[name]["SUCCESS"] for name in names])
    out = {"n": n, "reference": first, "fitted_by_all": int(ok.sum())}
    for name in names[1:]:
        out[name] = {col: float(np.max(np.abs(fits[name][col] - fits[first][col])[ok] / fits[first][f"{col}_ERR"][ok]))
                     for col in ("VRAD", "VSINI", "TEFF", "LOGG", "FEH", "ALPHA")}
    return out


def markdown(payload: dict) -> str:
    snrs = list(payload["by_snr"])
    lines = [f"Backend {payload['backend']}, grid {payload['grid']}, {payload['n']} spectra per S/N, "
             f"{payload['seconds']:.0f} s in all.", "",
             "| statistic | acceptance | " + " | ".join(f"S/N {s}" for s in snrs) + " |",
             "|---|---|" + "---:|" * len(snrs)]
    keys = [k for k in payload["by_snr"][snrs[0]] if k not in ("n",)]
    for key in keys:
        cells = [payload["by_snr"][s][key] for s in snrs]
        text = [f"{c:.3f}" if isinstance(c, float) else str(c) for c in cells]
        lines.append(f"| {key} | {ACCEPTANCE.get(key, '')} | " + " | ".join(text) + " |")
    if "compare" in payload:
        c = payload["compare"]
        lines += ["", f"Backends against {c['reference']} on {c['n']} spectra at S/N 20 "
                  "(largest |difference| / sigma):", ""]
        for name, gaps in c.items():
            if isinstance(gaps, dict):
                lines.append(f"- {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in gaps.items()))
    if "interpolation" in payload:
        i = payload["interpolation"]
        lines += ["", f"Interpolation error of the realistic grid ({i['nodes']} nodes) at 200 random off-grid "
                  f"parameters, as a fraction of the continuum: rms {i['rms']:.4f}, 99.9th percentile {i['p999']:.4f}, "
                  f"max {i['max']:.4f}; the noise at S/N 50 is 0.02 (rms/noise {i['rms'] / 0.02:.2f})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numba")
    parser.add_argument("--grid", default="small")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--snr", default="10,20,50")
    parser.add_argument("--compare", default="", help="comma-separated backends to compare, e.g. numpy,numba,torch")
    parser.add_argument("--compare-n", type=int, default=100)
    parser.add_argument("--interp", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ops, method = ops_for(args.backend)
    library = named_library(args.grid)
    started = time.perf_counter()
    by_snr = {}
    for snr in (float(s) for s in args.snr.split(",")):
        t0 = time.perf_counter()
        by_snr[f"{snr:g}"] = accuracy_run(library, args.n, snr, ops, seed=int(snr) * 1000 + 7, method=method)
        print(f"S/N {snr:g}: {time.perf_counter() - t0:.1f} s", json.dumps(by_snr[f"{snr:g}"]), flush=True)
    payload = {"backend": args.backend, "grid": args.grid, "n": args.n, "by_snr": by_snr,
               "seconds": time.perf_counter() - started}
    if args.compare:
        payload["compare"] = compare(args.compare.split(","), args.compare_n, args.grid)
        print(json.dumps(payload["compare"]), flush=True)
    if args.interp:
        generator = Generator(0)
        payload["interpolation"] = {"nodes": GRIDS["realistic"].nodes,
                                    **interpolation_error(named_library("realistic"), generator, n=200)}
    atomic_write_text(out / "accuracy.json", json.dumps(payload, indent=1))
    atomic_write_text(out / "accuracy.md", markdown(payload))
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
