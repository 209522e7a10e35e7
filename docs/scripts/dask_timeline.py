"""Where a dask map's wall time goes: each worker's start delay, its gaps between tasks, and its idle tail.

    CROSSOVER_DASK_SCHEDULER=local python docs/scripts/dask_timeline.py --K 64 --N 20000

Runs the K-point ``mfg.fixed_point`` sweep of ``parallel_efficiency.py``
(lending idle cores) under Dask's task stream, which records when each task
computed on which worker. For each worker thread, over a run's wall time:

- *start*: from the map's call to the worker's first task starting (the
  scatter, the submissions, the first dispatch);
- *gaps*: between one of its tasks finishing and its next starting (each
  result's trip to the scheduler and the next task's trip back);
- *tail*: from its last task finishing to the map returning (the slowest
  workers' last tasks, and the results' trip home).

Their mean over the workers, as a share of the wall, is what the cluster
lost to scheduling; ``parallel_efficiency.py`` gives the same loss from
timings alone, with its noise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from parallel_efficiency import FixedPointSweep, lending

from core.backends import dask_cluster


def split_run(records: list[dict], began: float, ended: float) -> dict:
    """Per-worker start delay, gaps and tail (seconds, means over the workers) of one recorded run."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        for part in record.get("startstops", ()):
            if part["action"] == "compute":
                spans.setdefault(record["worker"], []).append((part["start"], part["stop"]))
    starts, gaps, tails = [], [], []
    for worker_spans in spans.values():
        worker_spans.sort()
        starts.append(worker_spans[0][0] - began)
        gaps.append(sum(b[0] - a[1] for a, b in itertools.pairwise(worker_spans)))
        tails.append(ended - worker_spans[-1][1])
    wall = ended - began
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    return {"wall_s": wall, "workers": len(spans), "start_s": mean(starts), "gaps_s": mean(gaps),
            "tail_s": mean(tails), "tail_max_s": max(tails), "tasks": len(records),
            "lost": (mean(starts) + mean(gaps) + mean(tails)) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--K", type=int, default=64)
    parser.add_argument("--N", type=int, default=20_000)
    parser.add_argument("--Nx", type=int, default=51)
    parser.add_argument("--Nt", type=int, default=51)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from distributed import get_task_stream

    workload = FixedPointSweep(args)
    client = dask_cluster.get_client()
    workers = dask_cluster.worker_slots()
    lending(False)
    workload.run(range(8 * workers), "dask", {}, warm=True)  # every worker loads its kernels off the clock
    lending(True)
    rows = []
    for _ in range(args.repeats):
        with get_task_stream(client=client) as stream:
            began = time.time()
            workload.run(range(args.K), "dask", {})
            ended = time.time()
        rows.append(split_run(stream.data, began, ended))
    for row in rows:
        print(f"wall {row['wall_s']:.2f} s on {row['workers']} workers, {row['tasks']} dask tasks: start "
              f"{1e3 * row['start_s']:.0f} ms, gaps {1e3 * row['gaps_s']:.0f} ms, tail {1e3 * row['tail_s']:.0f} ms "
              f"(longest {1e3 * row['tail_max_s']:.0f}) a worker; lost {row['lost']:.1%} of the wall")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
