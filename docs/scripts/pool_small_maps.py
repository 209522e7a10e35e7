"""Does lending idle cores help or hurt a map of a few short tasks? Times mfg.common_noise paths on the pool.

For K paths of a small problem, each timed as evaluate times it (best of three rounds of a calibration
sample): the in-process numba solve, the process pool lending idle cores to a map's last tasks, and the
pool with lending off (``CROSSOVER_LEND_IDLE_CORES=0``).

    python3 docs/scripts/pool_small_maps.py [--K 1,2,4,8,16,32] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core.atomic import atomic_write_text
from core.backends.core_lending import LEND_VARIABLE
from core.costmodel.calibrate import measure
from core.costmodel.store import cpu_model
from core.registry import get_solver
from plugins.mfg.problem import CommonNoiseProblem

SHAPES = {"short": {"N": 366, "Nx": 35, "Nt": 8, "max_iter": 5, "preset": "towel_beach"},
          "long": {"N": 742, "Nx": 32, "Nt": 23, "max_iter": 2, "preset": "lq"}}
VARIANTS = {"numba": ("numba", None), "process, lending": ("process", "1"), "process, no lending": ("process", "0")}


def timed(spec, key: str, problem, lend: str | None) -> float:
    if lend is not None:
        os.environ[LEND_VARIABLE] = lend
    return measure(spec, key, problem, 3)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--K", default="1,2,4,8,16,32")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    spec = get_solver("mfg.common_noise")
    ks = [int(k) for k in args.K.split(",")]
    cases = [(shape, k, CommonNoiseProblem(K=k, rtol=0.0, atol=0.0, **params))
             for shape, params in SHAPES.items() for k in ks]
    best = {(shape, k, name): float("inf") for shape, k, _ in cases for name in VARIANTS}
    for _ in range(3):  # rounds seconds apart, best of three, as evaluate does
        for shape, k, problem in cases:
            for name, (key, lend) in VARIANTS.items():
                best[shape, k, name] = min(best[shape, k, name], timed(spec, key, problem, lend))
    lines = [f"# Short maps on the pool, {cpu_model()} ({os.cpu_count()} CPUs)", "",
             "| shape | K | " + " | ".join(VARIANTS) + " |", "|---|---:|" + "---:|" * len(VARIANTS)]
    for shape, k, _ in cases:
        lines.append(f"| {shape} | {k} | " + " | ".join(f"{best[shape, k, n] * 1e3:.2f} ms" for n in VARIANTS) + " |")
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "pool-small-maps.md", "\n".join(lines) + "\n")
        atomic_write_text(out / "pool-small-maps.json", json.dumps(
            [{"shape": s, "K": k, "variant": n, "seconds": best[s, k, n]} for s, k, _ in cases for n in VARIANTS],
            indent=1))


if __name__ == "__main__":
    main()
