"""Where a torch spectra.fit spends its time, phase by phase, on the GPU.

    python docs/scripts/spectra_gpu_profile.py --implementations torch,torch:fused --batches 512,4096 --out DIR

For each implementation and batch size (realistic grid, 3-arm spectra at
S/N 20, after a warm-up of every one-off): the wall time of the
implementation called directly and through ``core.solve`` with it named (as
``spectra_throughput.py`` measures; each the median of ``--repeats`` calls),
then one more call with every phase bracketed by ``torch.cuda.synchronize()`` and
timed on the host:

- ``transfer in``: the spectra to the device and cleaned (``solve.clean``);
- ``start``: the cross-correlation start (``fit.ccf_start``);
- ``model: templates``: the 16-corner interpolation and exp (``ops.interpolate_exp``);
- ``model: broaden + read``: the rotation kernels, the broadening and the
  cubic read at the data pixels (``model.rotation_kernels``, the resample);
- ``model: rest``: the rest of ``model.shifted_templates`` (the corners, the
  Doppler shift);
- ``normal equations``: the continuum solve, chi-square and the projected
  J^T W J and J^T W r (``model.profile``, or the fused ops' ``profile``);
- ``LM step``: the rest of ``fit.lm_batch`` (the damped solves, the
  acceptance, the convergence test and its copy to the host);
- ``clipping``: the rest of ``fit.fit_clipped`` (judging the residuals);
- ``finish + transfer out``: errors, flags and the columns to the host (``fit.finish``);
- ``other``: what is left of the call (validation, ``model.prepare``, ...).

Each phase's time excludes the phases inside it. The synchronisations cost
a little and stop the host from running ahead of the GPU, so the bracketed
total is a little above the plain wall time; both are printed. The
Jacobian's share is measured apart: one evaluation of the whole batch at its
start with and without derivatives (synchronised, median of 5). Writes
``profile.json`` and ``profile.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

PHASES = ("transfer in", "start", "model: templates", "model: broaden + read", "model: rest", "normal equations",
          "LM step", "clipping", "finish + transfer out", "other")


class PhaseClock:
    """Exclusive time per phase: a phase's time less the phases called inside it, each synchronised."""

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.spent = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self.stack: list[list] = []  # [phase, started, time in children]

    def wrap(self, phase: str, function: Callable) -> Callable:
        def timed(*args, **kwargs):
            self.synchronize()
            self.stack.append([phase, time.perf_counter(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                self.synchronize()
                name, started, inner = self.stack.pop()
                elapsed = time.perf_counter() - started
                self.spent[name] += elapsed - inner
                self.calls[name] += 1
                if self.stack:
                    self.stack[-1][2] += elapsed
        return timed


def instrument(clock: PhaseClock, ops_class: type) -> list[tuple[object, str, object]]:
    """Wrap each phase's function where its caller looks it up; returns what to restore."""
    from plugins.spectra import fit, model, solve

    targets = [(solve, "clean", "transfer in"), (solve, "ccf_start", "start"),
               (solve, "finish", "finish + transfer out"), (solve, "fit_clipped", "clipping"),
               (fit, "lm_batch", "LM step")]
    # torch:graph captures its LM step as a CUDA graph, and a capture may not synchronise: the model's phases
    # inside it are not bracketed, so its "LM step" holds the whole iteration (model and normal equations, and
    # "clipping" the clipping's model evaluations); the one evaluation below prices the model apart
    if not getattr(ops_class, "static_lm", False):
        targets += [(model, "shifted_templates", "model: rest"), (model, "rotation_kernels", "model: broaden + read"),
                    (model, "resample", "model: broaden + read"), (model, "profile", "normal equations"),
                    (ops_class, "interpolate_exp", "model: templates")]
    if hasattr(ops_class, "resample") and not getattr(ops_class, "static_lm", False):  # the fused kernels
        targets.append((ops_class, "resample", "model: broaden + read"))
    if hasattr(ops_class, "profile") and not getattr(ops_class, "static_lm", False):
        targets.append((ops_class, "profile", "normal equations"))
    saved = []
    for owner, name, phase in targets:
        original = getattr(owner, name)  # a class's method may be inherited: it is put back on the class itself
        saved.append((owner, name, original))
        setattr(owner, name, clock.wrap(phase, original))
    return saved


def restore(saved: list) -> None:
    for owner, name, original in reversed(saved):
        setattr(owner, name, original)


def jacobian_share(ops, spectra, library, synchronize) -> dict[str, float]:
    """One evaluation of the whole batch at its starting point, without and with derivatives (ms)."""
    from plugins.spectra.fit import ccf_design, ccf_start
    from plugins.spectra.model import evaluate, prepare
    from plugins.spectra.solve import clean, device_table

    prep = prepare(ops, library, spectra.wave, spectra.arm, 3, device_table(library, ops))
    flux, weight = clean(ops, spectra.flux, spectra.ivar)
    p = ccf_start(prep, flux, weight, ccf_design(prep, library))
    out = {}
    for jac in (False, True):
        times = []
        for _ in range(6):
            synchronize()
            started = time.perf_counter()
            evaluate(prep, p, flux, weight, jac=jac)
            synchronize()
            times.append(1e3 * (time.perf_counter() - started))
        out["with derivatives" if jac else "model only"] = float(np.median(times[1:]))
    return out


def ops_classes() -> dict[str, type]:
    """The ops each measured name runs on; ``torch:fused-model`` (a diagnostic, not an implementation) has
    the model's Triton kernels and the eager normal equations, to price the fused normal equations apart."""
    from plugins.spectra.ops import TorchOps

    classes = {"torch": TorchOps}
    try:
        from plugins.spectra import triton_kernels
    except ImportError:  # an older plugin, or no Triton: torch alone
        return classes
    classes["torch:fused"] = triton_kernels.TritonOps
    if hasattr(triton_kernels, "GraphOps"):
        classes["torch:graph"] = triton_kernels.GraphOps
    if hasattr(triton_kernels, "TritonModelOps"):
        classes["torch:fused-model"] = triton_kernels.TritonModelOps
    return classes


def main(argv: list[str] | None = None) -> int:
    import torch

    import core
    from core.atomic import atomic_write_text
    from core.registry import get_registry
    from core.running import implementations
    from plugins.spectra import solve
    from plugins.spectra.problem import SpectraProblem
    from plugins.spectra.synth import synthetic_spectra
    from plugins.spectra.templates import named_library

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implementations", default="torch,torch:fused,torch:graph")
    parser.add_argument("--batches", default="512,4096")
    parser.add_argument("--grid", default="realistic")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to try the script out without a GPU")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    on_gpu = args.device == "cuda"
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    library = named_library(args.grid)
    spectra = synthetic_spectra(library, max(batches), snr=20.0, seed=1)
    registered = implementations(get_registry().solvers["spectra.fit"])
    card = torch.cuda.get_device_name(0) if on_gpu else "CPU"
    results: dict[str, dict] = {}
    for name in args.implementations.split(","):
        try:
            ops_class = ops_classes()[name]
        except (KeyError, ImportError) as exc:
            print(f"{name}: not measured here ({type(exc).__name__}: {exc})", flush=True)
            continue

        def implementation(problem, ops_class=ops_class):  # solve_torch's work, with these ops
            ops = ops_class(torch.device(args.device))
            out = solve._solve(problem, ops, "lm", table=solve.device_table(problem.library(), ops))
            synchronize()
            return out

        try:
            implementation(SpectraProblem(grid=args.grid, spectra=spectra.rows(0, min(64, max(batches)))))  # one-offs
        except Exception as exc:  # a kernel that does not build here is a finding; measure the others
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
            continue
        results[name] = {}
        for batch in batches:
            problem = SpectraProblem(grid=args.grid, spectra=spectra.rows(0, batch))
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                outputs = implementation(problem)
                times.append(time.perf_counter() - started)
            through_solve = []  # what spectra_throughput.py measures: core.solve with the implementation named
            for _ in range(args.repeats if on_gpu and name in registered else 0):
                started = time.perf_counter()
                core.solve(problem, backend=name)
                through_solve.append(time.perf_counter() - started)
            clock = PhaseClock(synchronize)
            saved = instrument(clock, ops_class)
            try:
                started = time.perf_counter()
                with_clock = clock.wrap("other", implementation)
                with_clock(problem)
                bracketed = time.perf_counter() - started
            finally:
                restore(saved)
            solve_seconds = float(np.median(through_solve)) if through_solve else float("nan")
            row = {"seconds": float(np.median(times)), "spectra_per_second": batch / float(np.median(times)),
                   "solve_seconds": solve_seconds, "solve_spectra_per_second": batch / solve_seconds,
                   "bracketed_seconds": bracketed, "phases_ms": {k: v * 1e3 for k, v in clock.spent.items()},
                   "calls": clock.calls, "mean_iterations": float(np.mean(outputs["ITERATIONS"])),
                   "max_iterations": int(np.max(outputs["ITERATIONS"])),
                   "success": float(np.mean(outputs["SUCCESS"])),
                   "one_evaluation_ms": jacobian_share(ops_class(torch.device(args.device)), spectra.rows(0, batch),
                                                       library, synchronize)}
            results[name][str(batch)] = row
            print(f"{name} batch {batch}: {row['seconds'] * 1e3:.1f} ms ({row['spectra_per_second']:.0f} spectra/s; "
                  f"{row['solve_spectra_per_second']:.0f} through core.solve), "
                  f"bracketed {bracketed * 1e3:.1f} ms, iterations mean {row['mean_iterations']:.2f} max "
                  f"{row['max_iterations']}; " + ", ".join(f"{k} {v:.1f}" for k, v in row["phases_ms"].items())
                  + f"; one evaluation {row['one_evaluation_ms']}", flush=True)
    payload = {"card": card, "grid": args.grid, "pixels": spectra.n_pixels, "snr": 20.0, "results": results}
    atomic_write_text(out / "profile.json", json.dumps(payload, indent=1))
    atomic_write_text(out / "profile.md", markdown(payload))
    print(markdown(payload))
    return 0


def markdown(payload: dict) -> str:
    columns = [(name, batch) for name, rows in payload["results"].items() for batch in rows]
    lines = [f"{payload['card']}, grid {payload['grid']}, {payload['pixels']} pixels, S/N {payload['snr']:g}: "
             "milliseconds per phase of one call (each bracketed by synchronisations).", "",
             "| phase | " + " | ".join(f"{name} @ {batch}" for name, batch in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for phase in PHASES:
        lines.append(f"| {phase} | " + " | ".join(f"{payload['results'][n][b]['phases_ms'][phase]:.1f}"
                                                 for n, b in columns) + " |")
    for label, key, scale in (("bracketed total", "bracketed_seconds", 1e3), ("plain call", "seconds", 1e3),
                              ("spectra per second (plain)", "spectra_per_second", 1.0),
                              ("spectra per second (core.solve)", "solve_spectra_per_second", 1.0),
                              ("mean / max trial steps", None, None)):
        if key is None:
            cells = [f"{payload['results'][n][b]['mean_iterations']:.2f} / {payload['results'][n][b]['max_iterations']}"
                     for n, b in columns]
        else:
            cells = [f"{payload['results'][n][b][key] * scale:.1f}" for n, b in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| one evaluation, model only / with derivatives (ms) | " + " | ".join(
        "{:.2f} / {:.2f}".format(*payload["results"][n][b]["one_evaluation_ms"].values()) for n, b in columns) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
