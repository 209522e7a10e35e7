"""How the plans that took a costlier implementation within the margin fared, over the evaluations on record.

A plan takes, within its margin of the cheapest by the models, the simpler
implementation or the one with less one-off at stake (``plan.choose``). Each
``evaluate`` row records every implementation's model prediction and its
measured time, so a row whose pick was not the models' cheapest, yet within
``--margin`` of it, says what that choice cost or saved: the pick's measured
time over the models' cheapest's. Run from the repository root:

    python docs/scripts/margin_picks.py [--margin 0.26] [--results docs/results]

Rows are grouped by machine (a folder whose name starts ``gpu``, ``h200`` or
``spectra-h200`` ran on the GPU host; the others on the 2-core VM) and
solver. A median over 1 means the within-margin picks ran slower than the
models' cheapest.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

GPU_FOLDERS = ("gpu", "h200", "spectra-h200")


def pick_ratios(results: Path, margin: float) -> dict[tuple[str, str], list[float]]:
    """(machine, solver) -> the pick's measured time over the models' cheapest's, for within-margin picks."""
    found: dict[tuple[str, str], list[float]] = defaultdict(list)
    for path in sorted(results.glob("*/*.json")):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(document, dict) or "rows" not in document:
            continue
        machine = "gpu" if path.parent.name.startswith(GPU_FOLDERS) else "vm"
        for row in document["rows"]:
            ratio = _ratio(row, margin)
            if ratio is not None:
                found[(machine, str(document.get("solver")))].append(ratio)
    return found


def _ratio(row: dict, margin: float) -> float | None:
    measured = row.get("seconds") or {}
    models = {key: value[0] for key, value in (row.get("predicted") or {}).items()
              if value and value[0] and key in measured}
    chosen = row.get("chosen")
    if chosen not in models:
        return None
    cheapest = min(models, key=models.get)
    if cheapest == chosen or models[chosen] > models[cheapest] * (1 + margin):
        return None
    return measured[chosen] / measured[cheapest]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--margin", type=float, default=0.26, help="the widest margin a plan takes (25 %%)")
    args = parser.parse_args()
    print("| machine | solver | picks | median pick / cheapest | pick >10 % slower | pick >10 % faster |")
    print("|---|---|---:|---:|---:|---:|")
    for (machine, solver), ratios in sorted(pick_ratios(args.results, args.margin).items()):
        print(f"| {machine} | {solver} | {len(ratios)} | {statistics.median(ratios):.3f} | "
              f"{sum(r > 1.1 for r in ratios)} | {sum(r < 0.9 for r in ratios)} |")


if __name__ == "__main__":
    main()
