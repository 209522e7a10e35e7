"""Do an MFG solver's features fit every implementation's time over its whole size space?

    python docs/scripts/mfg_feature_fit.py mfg.fp_particle --train 24 --held-out 12

Draws seeded random problems from the solver's declared size space (log
scale for ranges, uniform over choices: every field moves at once), times
every implementation named (default: those whose backend is available here,
plus the parallel implementation on ``--parallel`` backends) on each, fits
the core's own model (``core.costmodel.fit.fit``: non-negative least squares
weighted by 1/t) on the training problems, and prints the relative error of
its predictions on the training and on the held-out problems.

Each sample is the smallest of ``--passes`` medians of 3 timed runs after a
warm-up, the passes taken minutes apart: on a shared virtual machine a
burst of a neighbour's load only ever adds time, so the smallest median is
the closest to what the code costs. Before each sample a short probe (a
sort, and a small step-by-step numba FP, whose barriers wait for a stolen
second core) runs until the machine is calm (within 25 % of its best). Train and held-out
problems are interleaved, so both see the same machine. Name the machine
when quoting the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import numpy as np

from core.costmodel.features import model_features
from core.costmodel.fit import Sample, fit
from core.running import implementations, run_once
from core.solver import SolverSpec, backend_of, problem_from_params
from plugins.mfg.problem import FPProblem
from plugins.mfg.specs import FP_PARTICLE


def draw(spec: SolverSpec, quick: bool, count: int, seed: int) -> list[dict]:
    space = spec.space(quick)
    default = spec.default_problem()
    rng = np.random.default_rng(seed)
    points = []
    for _ in range(count):
        params = dict(space.fixed)
        for name, (low, high) in space.ranges.items():
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
            params[name] = int(round(value)) if isinstance(getattr(default, name), int) else value
        for name, values in space.choices.items():
            params[name] = values[int(rng.integers(len(values)))]
        points.append(params)
    return points


_PROBE = np.random.default_rng(0).random(200_000)
_TWO_THREADS = FPProblem(N=2_000, Nt=30)


def _busy_work() -> None:
    np.sort(_PROBE)  # a core stolen by a neighbour slows this
    # and a parallel kernel per time step waits at every barrier for a stolen second core
    FP_PARTICLE.implementations["numba:steps"](_TWO_THREADS)


class Calm:
    """Waits until a fixed probe runs within ``limit`` of its best time."""

    def __init__(self, limit: float = 1.25):
        self.limit, self.best = limit, math.inf

    def ratio(self) -> float:
        started = time.perf_counter()
        _busy_work()
        seconds = time.perf_counter() - started
        self.best = min(self.best, seconds)
        return seconds / self.best

    def wait(self, tries: int = 30) -> None:
        for _ in range(tries):
            # the best of three: a probe of a few milliseconds jitters by itself
            if min(self.ratio() for _ in range(3)) < self.limit:
                return
            time.sleep(1.0)


def median_of_three(spec: SolverSpec, key: str, problem, cap: float) -> float | None:
    """The core's own timing (outputs moved to the host inside the clock), after a warm-up."""
    if run_once(spec, key, problem)[1] > cap:
        return None
    return statistics.median(run_once(spec, key, problem)[1] for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("solver")
    parser.add_argument("--implementations", nargs="*", help="keys to time (default: every available one)")
    parser.add_argument("--train", type=int, default=24)
    parser.add_argument("--held-out", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--full", action="store_true", help="the full size space instead of the quick one")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--cap", type=float, default=2.0, help="skip a problem whose warm-up takes longer")
    parser.add_argument("--json", help="write the samples and the table here")
    args = parser.parse_args()
    import core

    spec = core.solvers()[args.solver]
    keys = args.implementations or [k for k in implementations(spec) if core.availability(backend_of(k)).available]
    points = draw(spec, not args.full, args.train + args.held_out, args.seed)
    problems = [problem_from_params(spec, p) for p in points]
    cheapest = min(problems, key=lambda p: sum(spec.features(p).values()))
    for key in keys:  # JIT, pool start, CUDA context and compiles outside the clock
        run_once(spec, key, cheapest)
    calm = Calm()
    best: dict[tuple[int, str], float | None] = {}
    for _ in range(args.passes):
        for i, problem in enumerate(problems):
            for key in keys:
                if best.get((i, key), 0.0) is None or spec.supports(problem, key):
                    best[(i, key)] = None  # over the cap once (over it again), or not runnable at all
                    continue
                calm.wait()
                seconds = median_of_three(spec, key, problem, args.cap)
                old = best.get((i, key))
                best[(i, key)] = seconds if old is None or seconds is None else min(old, seconds)
    table, samples_out = [], []
    for key in keys:
        rows = [(i, model_features(spec, problems[i], key), best[(i, key)]) for i in range(len(problems))
                if best[(i, key)] is not None]
        train = [r for r in rows if r[0] < args.train]
        held = [r for r in rows if r[0] >= args.train]
        model = fit([Sample(features=f, seconds=s) for _, f, s in train])

        def errors(group, model=model):
            return [abs(model.predict(f)[0] / s - 1) for _, f, s in group]

        inside, outside = errors(train), errors(held)
        row = {"implementation": key, "train": len(train), "held_out": len(held),
               "in_max": max(inside, default=math.nan), "in_median": statistics.median(inside) if inside else math.nan,
               "out_max": max(outside, default=math.nan),
               "out_median": statistics.median(outside) if outside else math.nan,
               "coefficients": dict(zip(("intercept", *model.feature_names), (model.intercept, *model.coefficients)))}
        table.append(row)
        samples_out += [{"implementation": key, "params": points[i], "seconds": s, "held_out": i >= args.train}
                        for i, _, s in rows]
        print(f"{key:>18}: train {row['train']:2d} max {row['in_max']:6.1%} median {row['in_median']:6.1%} | "
              f"held-out {row['held_out']:2d} max {row['out_max']:6.1%} median {row['out_median']:6.1%}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"solver": args.solver, "quick": not args.full, "table": table, "samples": samples_out}, f,
                      indent=1, default=str)


if __name__ == "__main__":
    main()
