"""Regret of auto-selection for every solver, each from an empty wisdom store.

For each registered solver (or those named): a fresh cache directory,
``crossover calibrate SOLVER`` (quick) timed, then ``crossover evaluate
SOLVER`` on seeded random held-out problems of its size space. Writes the
calibration and evaluation tables and a summary line per solver to
``--out`` (default: stdout only).

    python docs/scripts/evaluate_all.py [SOLVER ...] [--out DIR] [--count 12] [--seed 2024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def crossover(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.cli", *args], env=env, capture_output=True, text=True,
                          check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("solvers", nargs="*")
    parser.add_argument("--out")
    parser.add_argument("--count", default="12")
    parser.add_argument("--seed", default="2024")
    args = parser.parse_args()
    import core

    names = args.solvers or sorted(core.solvers())
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    summary = []
    failed = 0
    for name in names:
        env = dict(os.environ, CROSSOVER_CACHE_DIR=tempfile.mkdtemp(prefix=f"crossover-eval-{name}-"),
                   COLUMNS="200")
        began = time.perf_counter()
        calibration = crossover("calibrate", name, env=env)
        calibrate_seconds = time.perf_counter() - began
        evaluation = crossover("evaluate", name, "--count", args.count, "--seed", args.seed, env=env)
        text = (f"## {name}\n\n$ crossover calibrate {name}   ({calibrate_seconds:.1f} s wall)\n"
                f"{calibration.stdout}{calibration.stderr}\n$ crossover evaluate {name}\n"
                f"{evaluation.stdout}{evaluation.stderr}\n")
        print(text, flush=True)
        if out:
            (out / f"{name}.txt").write_text(text)
        failed += calibration.returncode != 0 or evaluation.returncode != 0
        last = [line for line in evaluation.stdout.splitlines() if line.startswith("median regret")]
        summary.append({"solver": name, "calibrate_seconds": round(calibrate_seconds, 1),
                        "result": last[0] if last else "failed"})
    print(json.dumps(summary, indent=1))
    if out:
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
