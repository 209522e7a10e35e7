"""The tail a task map's scheduling leaves, modelled from measured item times, under four policies.

    python docs/scripts/scheduling_tail_model.py SUMMARY.json --workers 16 --lent-efficiency 0.5

Reads the items' times alone (``t1_s``) from a JSON summary of
``parallel_efficiency.py`` and replays the map on W workers, every item at
the same speed (the all-core penalty scales every time alike, so it drops
out of the loss), under four policies:

- ``in order``: whole items handed to the first free worker in index
  order, one core each (a pool or a cluster without lending);
- ``in order, lending``: the same, but once no item waits, the cores of
  idle workers go to the items still running, the spare ones to those
  started last (``core.backends.core_lending.cores_for_this_task``). A lent
  core adds ``--lent-efficiency`` of a core's speed (1: perfect; the
  particle kernel's 40 chunks at N = 20,000 and its serial tenth make it
  well below);
- ``longest first``: whole items in decreasing time, which needs the times
  before the run (the best a perfect cost predictor could do);
- ``longest first, lending``.

``--noise`` adds Gaussian noise of that relative size to every item's time
in each of ``--trials`` replays, as a loaded host does. The printed loss is
``1 - (sum of times / W) / makespan``, mean and worst over the trials. This
is a model, to see which part of the loss the scheduling can still win; the
measured figure is parallel_efficiency.py's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np


def lent_cores(running: Sequence[int], workers: int, waiting: bool) -> dict[int, int]:
    """Cores per running item: one while items wait; else the pool's cores, spares to the latest started."""
    if waiting or not running:
        return dict.fromkeys(running, 1)
    base, spare = divmod(workers, len(running))
    order = sorted(running)
    return {item: base + (1 if len(order) - 1 - i < spare else 0) for i, item in enumerate(order)}


def makespan(times: np.ndarray, order: Sequence[int], workers: int, lend: bool, lent_efficiency: float) -> float:
    """Wall time of the map, event by event (an item's speed changes only when another starts or ends)."""
    queue, running, now = list(order), {}, 0.0
    while queue or running:
        while queue and len(running) < workers:
            item = queue.pop(0)
            running[item] = float(times[item])
        cores = lent_cores(list(running), workers, bool(queue)) if lend else dict.fromkeys(running, 1)
        speed = {item: 1 + lent_efficiency * (cores[item] - 1) for item in running}
        step = min(left / speed[item] for item, left in running.items())
        now += step
        for item in list(running):
            running[item] -= speed[item] * step
            if running[item] <= 1e-12 * times.max():
                del running[item]
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", help="a JSON summary written by parallel_efficiency.py --json")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--lent-efficiency", type=float, default=0.5)
    args = parser.parse_args()
    with open(args.summary) as handle:
        t1 = np.asarray(json.load(handle)["t1_s"], dtype=float)
    rng = np.random.default_rng(0)
    losses: dict[str, list[float]] = {}
    for _ in range(args.trials):
        times = t1 * np.clip(1 + args.noise * rng.standard_normal(t1.size), 0.1, None)
        ideal = times.sum() / args.workers
        in_order, longest = list(range(t1.size)), [int(i) for i in np.argsort(-times, kind="stable")]
        for name, order, lend in (("in order", in_order, False), ("in order, lending", in_order, True),
                                  ("longest first", longest, False), ("longest first, lending", longest, True)):
            wall = makespan(times, order, args.workers, lend, args.lent_efficiency)
            losses.setdefault(name, []).append(1 - ideal / wall)
    print(f"{t1.size} items (alone: mean {t1.mean():.3f} s, spread {t1.std() / t1.mean():.1%}) on {args.workers} "
          f"workers; noise {args.noise:.0%} per item; a lent core at {args.lent_efficiency:.0%}")
    for name, values in losses.items():
        print(f"  {name:>24}: scheduling loss {np.mean(values):.1%} mean, {np.max(values):.1%} worst")


if __name__ == "__main__":
    main()
