"""What a task map costs beyond the work, on one backend: its start, and its overhead per task.

    python docs/scripts/task_overhead.py --backend process
    python docs/scripts/task_overhead.py --backend dask --scheduler local
    python docs/scripts/task_overhead.py --backend dask --scheduler tcp://10.0.0.5:8786

Sleeping tasks cost no CPU, so the figures hold on a machine that other work
keeps busy (where timing computing tasks would not):

- ``start``: the backend's one-off (the pool's start, or the cluster's
  connection: for ``local``, the cluster's start), as the core times it;
- ``empty``: a map of K no-op tasks, each batched as the backend batches
  them: the overhead a sweep of very short points pays per point;
- ``sleep``: K tasks of ``--sleep`` seconds (0.1 by default, so the dask
  backend sends each alone) on W slots take ``ceil(K / W)`` rounds of the
  sleep at best; the excess per round is the round trip of one task
  (dispatch, result, scheduling), and ``K * sleep / (W * wall)`` the
  efficiency of a map with no all-core penalty.

The parallel efficiency of real work, split into the all-core penalty and
the scheduling loss, is measured by ``docs/scripts/parallel_efficiency.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

from core.atomic import atomic_write_text
from core.backends import dask_cluster
from core.costmodel import history
from core.costmodel.store import cpu_model
from core.registry import get_registry
from core.tasks import map_tasks, parallelism


def no_op(task: int, shared, seed) -> int:
    return task


def sleep_for(task: float, shared, seed) -> float:
    time.sleep(task)
    return task


def timed(fn, tasks: list, backend: str) -> float:
    began = time.perf_counter()
    map_tasks(fn, tasks, backend=backend)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="process", help="a backend with a task map: process, dask, ...")
    parser.add_argument("--scheduler", default=None, help="for dask: an address, or local")
    parser.add_argument("--K", type=int, default=64, help="tasks per map")
    parser.add_argument("--sleep", type=float, default=0.1, help="seconds each sleeping task lasts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the summary to this file")
    args = parser.parse_args()
    if args.scheduler is not None:
        dask_cluster.use_scheduler(args.scheduler)

    history.disable()  # measuring the map, not keeping a start cost in the user's wisdom
    start = history.start_backend(get_registry().backends[args.backend]) or 0.0
    slots = parallelism(args.backend)
    map_tasks(no_op, list(range(4 * slots)), backend=args.backend)  # warm: every worker has run a task
    empty = [timed(no_op, list(range(args.K)), args.backend) for _ in range(args.repeats)]
    sleeps = [timed(sleep_for, [args.sleep] * args.K, args.backend) for _ in range(args.repeats)]
    rounds = math.ceil(args.K / slots)
    wall = statistics.median(sleeps)
    round_trip = (wall - rounds * args.sleep) / rounds
    efficiency = args.K * args.sleep / (slots * wall)

    print(f"host: {cpu_model()}, {os.cpu_count()} cores; backend {args.backend} with {slots} slots"
          + (f" (scheduler {args.scheduler})" if args.scheduler else ""))
    print(f"start (one-off): {start:.3f} s")
    print(f"empty map of {args.K} tasks: median {statistics.median(empty) * 1e3:.1f} ms "
          f"({statistics.median(empty) / args.K * 1e3:.2f} ms a task); runs "
          + ", ".join(f"{1e3 * s:.1f}" for s in empty) + " ms")
    print(f"{args.K} tasks of {args.sleep:g} s on {slots} slots: median wall {wall:.3f} s for {rounds} rounds "
          f"(ideal {rounds * args.sleep:.3f} s): {round_trip * 1e3:.1f} ms per round trip, efficiency "
          f"{efficiency:.1%}; runs " + ", ".join(f"{s:.3f}" for s in sleeps) + " s")
    summary = {"host": cpu_model(), "cores": os.cpu_count(), "backend": args.backend, "scheduler": args.scheduler,
               "slots": slots, "K": args.K, "start_s": start, "empty_map_s": empty, "sleep_s": args.sleep,
               "sleep_map_s": sleeps, "round_trip_s": round_trip, "efficiency": efficiency}
    print(json.dumps(summary))
    if args.json:
        atomic_write_text(args.json, json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
