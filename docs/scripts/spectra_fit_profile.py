"""Where one spectra.fit call's time goes on a backend: the whole ``core.solve`` against the fit alone.

    python docs/scripts/spectra_fit_profile.py --backend torch --batches 64 512

For each batch size (realistic grid, 3-arm spectra at S/N 20, after a
warm-up of every one-off): the wall time of ``core.solve`` with the backend
named, of the implementation called directly, and of the fit's parts (the
CCF start, the Levenberg-Marquardt, the rest); the LM's iterations; on
torch the count of torch operations one LM iteration issues (each is a
kernel launch or more: at small batches their host cost is the fit's cost).
Then the ``cProfile`` of one ``core.solve`` call, by cumulative time, so that
anything outside the fit shows up by name.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable

import numpy as np

import core
from core.registry import get_registry
from core.running import implementations
from plugins.spectra import solve
from plugins.spectra.problem import SpectraProblem
from plugins.spectra.synth import synthetic_spectra
from plugins.spectra.templates import named_library


def seconds(call: Callable[[], object], repeats: int) -> float:
    """The median of ``repeats`` timed calls."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def timed_parts(problem: SpectraProblem, implementation: Callable) -> dict[str, float]:
    """The fit's parts, timed for one call by wrapping ccf_start and lm_batch where solve imported them."""
    spent = {"ccf_start": 0.0, "lm_batch": 0.0}
    originals = {name: getattr(solve, name) for name in spent}

    def wrap(name: str) -> Callable:
        def timed(*args, **kwargs):
            started = time.perf_counter()
            out = originals[name](*args, **kwargs)
            if name == "ccf_start":
                solve_sync(args[0].ops)
            spent[name] += time.perf_counter() - started
            return out
        return timed

    for name in spent:
        setattr(solve, name, wrap(name))
    try:
        started = time.perf_counter()
        outputs = implementation(problem)
        spent["whole"] = time.perf_counter() - started
    finally:
        for name, original in originals.items():
            setattr(solve, name, original)
    spent["iterations_max"] = float(np.max(outputs["ITERATIONS"]))
    return spent


def solve_sync(ops: object) -> None:
    if getattr(ops, "name", "") == "torch" and ops.device.type == "cuda":
        ops.torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--grid", default="realistic")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    library = named_library(args.grid)
    spec = get_registry().solvers["spectra.fit"]
    implementation = implementations(spec)[args.backend]
    all_spectra = synthetic_spectra(library, max(args.batches), snr=20.0, seed=1)
    warm = SpectraProblem(grid=args.grid, spectra=all_spectra.rows(0, min(64, max(args.batches))))
    core.solve(warm, backend=args.backend)
    for batch in args.batches:
        problem = SpectraProblem(grid=args.grid, spectra=all_spectra.rows(0, batch))
        whole = seconds(lambda problem=problem: core.solve(problem, backend=args.backend), args.repeats)
        direct = seconds(lambda problem=problem: implementation(problem), args.repeats)
        parts = timed_parts(problem, implementation)
        print(f"batch {batch}: core.solve {whole * 1e3:.1f} ms, the implementation alone {direct * 1e3:.1f} ms; "
              f"one call's parts: start {parts['ccf_start'] * 1e3:.1f} ms, LM {parts['lm_batch'] * 1e3:.1f} ms "
              f"({parts['iterations_max']:.0f} iterations), whole {parts['whole'] * 1e3:.1f} ms", flush=True)
        profile = cProfile.Profile()
        profile.enable()
        core.solve(problem, backend=args.backend)
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
        print(text.getvalue(), flush=True)


if __name__ == "__main__":
    main()
