"""Parallel efficiency of a task map, split into the host's all-core penalty and the scheduling loss.

    python docs/scripts/parallel_efficiency.py --workload common_noise --backend process --workers 16 --K 64
    python docs/scripts/parallel_efficiency.py --workload fixed_point_sweep --backend process --workers 16
    CROSSOVER_DASK_SCHEDULER=local python docs/scripts/parallel_efficiency.py --workload common_noise --backend dask

Two workloads of K independent items:

- ``common_noise``: the K paths of a ``CommonNoiseProblem`` (``lq``, N,
  Nx, Nt as given), each a task of :func:`core.tasks.map_tasks`, as
  ``solve_parallel`` runs them;
- ``fixed_point_sweep``: a K-point ``core.sweep`` of ``mfg.fixed_point``
  (``lq`` at N, Nx, Nt, over K pairs of sigma and particle seed), through
  the sweep's own code, per-point ``core.solve`` included.

What it measures, on one backend with W workers (each pool or cluster
warmed up first, so that no worker loads its Numba kernels on the clock):

- ``T1``: each item's seconds alone, one item per map and nothing else
  running (its time inside the task, on one core);
- the all-core penalty ``P``: all K items in rounds of W, each round W
  items at once, one per worker (independent jobs: no round starts before
  the last one ended), their summed time over their summed time alone:
  what running every core costs a task, which no scheduling can win back;
- the K-item wall time, ``--repeats`` times, each between two penalty runs
  (P, K-run, P, K-run, ..., P); a K-item run is split with the mean of the
  two penalty runs beside it. On a shared host the speed drifts: on the
  H200 host the same sweep point took 0.52 to 0.96 s alone within one
  minute, and a penalty from a few items at another moment moved the
  split by up to 10 points. The penalty over the very items of the run,
  on both sides of it, cancels a drift that is steady over the run.

Then ``efficiency = K * mean(T1) / (W * wall)`` splits exactly as
``efficiency = (1 / P) * (1 - scheduling loss)``: the scheduling loss
compares the wall time with the ideal ``P * K * mean(T1) / W``, the K
items at their loaded speed spread perfectly over W workers. It holds every
cost of the map that is not the penalty: the tail of uneven items, the
per-task overhead (dispatch, pickling, results), idle workers. ``busy`` is
the items' summed in-task seconds over ``W * wall`` (with lent cores an
item runs on several, so busy then undercounts the cores in use). Where
every item runs on one core (no lending), the run also splits itself
exactly, with no separate penalty run: ``efficiency = (1 / P_run) * busy``,
``P_run`` being the items' summed in-task time over their summed T1.

On ``dask`` the worker count is the cluster's (a ``local`` scheduler starts
a LocalCluster of one single-threaded worker per usable core). An empty map of K no-op tasks gives the
per-task overhead on its own.
Every run's results must be identical (the script checks it). Lending of
idle workers' cores (the process backend, and dask on a ``local`` cluster)
is off for the T1 and penalty runs (one core per item by definition) and on
for the K-item runs, unless ``--no-lend``; ``--compare-lending`` adds
K-item runs without it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from core.atomic import atomic_write_text
from core.backends.dask_cluster import LOCAL, scheduler_address
from core.costmodel.store import cpu_model
from core.tasks import map_tasks, parallelism
from plugins.mfg.common_noise import path_task
from plugins.mfg.problem import CommonNoiseProblem, MFGProblem

# -- the workloads: each runs items ``indices`` and returns (in-task seconds, a result to compare) per item


def timed_path(task: tuple[CommonNoiseProblem, int], shared, seed) -> tuple[float, np.ndarray]:
    """Path k of the problem with its own seed (the k-th child of SeedSequence(seed)), whatever map runs it."""
    problem, k = task
    path_seed = np.random.SeedSequence(problem.seed).spawn(problem.K)[k]
    out = path_task((problem, "numba"), shared, path_seed)
    return float(out["seconds"]), out["M"]


def no_op(task: int, shared, seed) -> int:
    return task


class CommonNoise:
    def __init__(self, args: argparse.Namespace) -> None:
        self.problem = CommonNoiseProblem(preset="lq", K=args.K, N=args.N, Nx=args.Nx, Nt=args.Nt, seed=args.seed)
        self.warm = CommonNoiseProblem(preset="lq", K=args.K, N=500, Nx=args.Nx, Nt=5, seed=args.seed)

    def run(self, indices: Sequence[int], backend: str, options: dict, warm: bool = False) -> list[tuple]:
        problem = self.warm if warm else self.problem
        return map_tasks(timed_path, [(problem, k % problem.K) for k in indices], backend=backend,
                         labels=[f"path {k}" for k in indices], **options)


class FixedPointSweep:
    def __init__(self, args: argparse.Namespace) -> None:
        sigmas = np.linspace(0.4, 0.6, 8)
        self.points = [{"preset": "lq", "N": args.N, "Nx": args.Nx, "Nt": args.Nt, "sigma": float(sigmas[i % 8]),
                        "seed": args.seed + i // 8} for i in range(args.K)]
        MFGProblem(**self.points[0])  # a bad size is one clear error before anything runs

    def run(self, indices: Sequence[int], backend: str, options: dict, warm: bool = False) -> list[tuple]:
        from core.sweep import sweep

        points = [dict(self.points[i % len(self.points)]) for i in indices]
        if warm:
            points = [{**p, "N": 500, "Nt": 5} for p in points]
        done = sweep("mfg.fixed_point", points, backend=backend, **options)
        failed = [p.error for p in done if not p.ok]
        if failed:
            raise RuntimeError(f"{len(failed)} sweep points failed, the first: {failed[0]}")
        return [(p.seconds, np.asarray(p.outputs["M"])) for p in done]


WORKLOADS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "common_noise": CommonNoise, "fixed_point_sweep": FixedPointSweep}


# -- measuring ---------------------------------------------------------------------------------------


def lending(on: bool) -> None:
    """The process pool and a local dask cluster read this in the calling process at each map."""
    os.environ["CROSSOVER_LEND_IDLE_CORES"] = "1" if on else "0"


def lends(backend: str) -> bool:
    """Whether the backend lends idle workers' cores: the process pool, and dask on a cluster of this host."""
    if backend == "dask":
        return scheduler_address() == LOCAL
    return backend == "process"


def timed_run(workload, indices: Sequence[int], backend: str, options: dict) -> tuple[float, list[tuple]]:
    started = time.perf_counter()
    out = workload.run(indices, backend, options)
    return time.perf_counter() - started, out


def all_core_penalty(workload, k: int, workers: int, backend: str, options: dict, t1: np.ndarray,
                     reference: list) -> tuple[float, bool]:
    """(The all-core penalty over all K items, whether every result matched): rounds of ``workers`` items at once.

    Each round is a map of one item per worker with lending off, so every
    item runs on one core beside ``workers - 1`` others; the next round
    starts after the last item of this one ended. A last round of fewer
    items (K not a multiple of the workers) loads the host less.
    """
    lending(False)
    loaded, identical = 0.0, True
    for start in range(0, k, workers):
        indices = range(start, min(start + workers, k))
        out = workload.run(indices, backend, options)
        loaded += sum(seconds for seconds, _ in out)
        identical &= all(np.array_equal(r, reference[i]) for i, (_, r) in zip(indices, out))
    return loaded / float(t1.sum()), identical


def split(k_items: int, workers: int, t1_sum: float, penalty: float, wall: float, busy_seconds: float) -> dict:
    """Efficiency and its two factors for one K-item run (see the module docstring)."""
    efficiency = t1_sum / (workers * wall)
    ideal = penalty * t1_sum / workers
    return {"wall_s": wall, "penalty": penalty, "ideal_s": ideal, "efficiency": efficiency,
            "scheduling_loss": 1 - ideal / wall, "busy": busy_seconds / (workers * wall),
            "in_run_penalty": busy_seconds / t1_sum}


def listed(rows: list[dict], key: str, form: str) -> str:
    return ", ".join(form.format(row[key]) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="common_noise")
    parser.add_argument("--backend", default="process", help="a backend with a task map: process, dask, ...")
    parser.add_argument("--workers", type=int, default=None,
                        help="process pool size (default: CROSSOVER_WORKERS or the cores); other backends: their own")
    parser.add_argument("--K", type=int, default=64, help="items: paths, or sweep points")
    parser.add_argument("--N", type=int, default=20_000)
    parser.add_argument("--Nx", type=int, default=51)
    parser.add_argument("--Nt", type=int, default=51)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5,
                        help="K-item runs (one run's split moves by several points with the host's drift)")
    parser.add_argument("--no-lend", action="store_true", help="K-item runs without lending idle cores")
    parser.add_argument("--compare-lending", action="store_true", help="also K-item runs without lending")
    parser.add_argument("--json", default=None, help="also write the summary to this file")
    args = parser.parse_args()

    workload = WORKLOADS[args.workload](args)
    options: dict[str, Any] = {}
    if args.backend == "process":
        from core.backends.process_pool import default_workers

        options["workers"] = args.workers or default_workers()
    elif args.workers is not None:
        parser.error("--workers sizes the process pool only; size the cluster itself (its workers are counted)")
    workers = options.get("workers") or parallelism(args.backend)
    k = args.K
    if workers > k:
        parser.error(f"--K {k} is below the {workers} workers: the penalty runs one item on every worker")

    # warm every worker: many tiny items, so that each one (not only the first free) loads its kernels
    lending(False)
    workload.run(range(8 * workers), args.backend, options, warm=True)
    empty_started = time.perf_counter()
    map_tasks(no_op, list(range(k)), backend=args.backend, **options)
    empty = time.perf_counter() - empty_started

    alone = [workload.run([i], args.backend, options)[0] for i in range(k)]
    t1 = np.array([seconds for seconds, _ in alone])
    reference = [result for _, result in alone]

    kinds = [not args.no_lend] + ([False] if args.compare_lending and not args.no_lend else [])
    runs: dict[bool, list[dict]] = {kind: [] for kind in kinds}
    penalty_runs = [all_core_penalty(workload, k, workers, args.backend, options, t1, reference)]
    identical = penalty_runs[0][1]
    for _ in range(args.repeats):
        walls = []
        for lend in kinds:  # alternating, so that a drift of the host's load hits both kinds alike
            lending(lend)
            wall, out = timed_run(workload, range(k), args.backend, options)
            identical &= all(np.array_equal(r, reference[i]) for i, (_, r) in enumerate(out))
            walls.append((lend, wall, sum(s for s, _ in out)))
        penalty_runs.append(all_core_penalty(workload, k, workers, args.backend, options, t1, reference))
        identical &= penalty_runs[-1][1]
        beside = (penalty_runs[-2][0] + penalty_runs[-1][0]) / 2  # the penalty runs before and after these runs
        for lend, wall, busy_seconds in walls:
            runs[lend].append(split(k, workers, float(t1.sum()), beside, wall, busy_seconds))
    penalties = [p for p, _ in penalty_runs]
    penalty = float(np.median(penalties))
    lending(True)

    print(f"host: {cpu_model()}, {os.cpu_count()} cores; backend {args.backend} with {workers} workers; "
          f"{args.workload}: K={k}, N={args.N}, Nx={args.Nx}, Nt={args.Nt}")
    print(f"per-task overhead: an empty map of {k} tasks took {empty:.3f} s ({1e3 * empty / k:.2f} ms a task)")
    print(f"T1 (alone, one core): mean {t1.mean():.3f} s, min {t1.min():.3f}, max {t1.max():.3f}, "
          f"spread (std/mean) {t1.std() / t1.mean():.1%}")
    print(f"all-core penalty (all {k} items, {workers} at once, over alone; before, between and after the "
          f"K-item runs): {', '.join(f'x{p:.3f}' for p in penalties)} (median x{penalty:.3f})")
    summary: dict[str, Any] = {
        "host": cpu_model(), "cores": os.cpu_count(), "backend": args.backend, "workers": workers,
        "workload": args.workload, "K": k, "N": args.N, "Nx": args.Nx, "Nt": args.Nt,
        "empty_map_s": empty, "t1_s": t1.tolist(), "penalties": penalties, "penalty": penalty,
        "identical": bool(identical)}
    lent = lends(args.backend)
    for lend, rows in runs.items():
        label = "one core per item" if not lend else (
            "lending idle cores" if lent else "as the backend schedules them")
        middle = sorted(rows, key=lambda r: r["wall_s"])[len(rows) // 2]
        print(f"K-item runs, {label}: wall {listed(rows, 'wall_s', '{:.2f}')} s (ideal at the loaded speed "
              f"{middle['ideal_s']:.2f} s); efficiency {listed(rows, 'efficiency', '{:.1%}')}; scheduling loss "
              f"{listed(rows, 'scheduling_loss', '{:.1%}')}; busy {listed(rows, 'busy', '{:.1%}')}")
        print(f"  median run: efficiency {middle['efficiency']:.1%} = 1/{middle['penalty']:.3f} (all-core penalty) x "
              f"{1 - middle['scheduling_loss']:.1%} (1 - scheduling loss)")
        print(f"  scheduling loss, median over the {len(rows)} runs: "
              f"{float(np.median([r['scheduling_loss'] for r in rows])):.1%}")
        if not lend or not lent:  # one core per item: the run splits itself, immune to drift
            print("  in-run split, each run: " + "; ".join(
                f"1/{r['in_run_penalty']:.3f} x {r['busy']:.1%} (scheduling loss {1 - r['busy']:.1%})" for r in rows))
        summary["lend" if lend else "no_lend"] = rows
    print(f"identical results in every run: {identical}")
    print(json.dumps(summary))
    if args.json:
        atomic_write_text(args.json, json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
