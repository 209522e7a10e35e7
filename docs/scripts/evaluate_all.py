"""Regret of auto-selection for every solver, each from an empty wisdom store.

For each registered solver (or those named): a fresh cache directory,
``crossover calibrate SOLVER`` (quick) timed, then ``crossover evaluate
SOLVER --json`` on seeded random held-out problems of its size space (the
real loop of ``core.solve``, then warm timings). Writes the calibration
table, the evaluation's JSON and a summary per solver to ``--out``
(default: stdout only): the final call's median and maximum regret, the
loop total over that of as many calls naming the best implementation
(median and worst), the models' pick's regret,
and the share of problems predicted within a factor of 2. With ``--out``,
each CLI's progress also goes to ``SOLVER.calibrate.log`` and
``SOLVER.evaluate.log`` as it runs, so a run cut short leaves it.

    python docs/scripts/evaluate_all.py [SOLVER ...] [--out DIR] [--count 12] [--seed 2024] [--calls 3]
        [--cache DIR] [--calibrate-only]

``--cache DIR`` keeps every solver's wisdom store in ``DIR/SOLVER`` and
calibrates only where that store has no calibration of the solver yet;
``--calibrate-only`` stops after calibrating. Together they split a long
calibration from its evaluation: on the H200 host DotGAT's calibration
alone took 378 s of a 10-minute device call, so the store is calibrated
in one call, brought back, and evaluated in the next (its calibration
time is then that of the first call).
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


def crossover(*args: str, env: dict, log: Path | None = None) -> subprocess.CompletedProcess:
    """Run the CLI; with ``log``, its standard error goes there as it comes (a run cut short leaves its progress)."""
    if log is None:
        return subprocess.run([sys.executable, "-m", "core.cli", *args], env=env, capture_output=True, text=True,
                              check=False)
    with open(log, "w") as stream:
        done = subprocess.run([sys.executable, "-m", "core.cli", *args], env=env, stdout=subprocess.PIPE,
                              stderr=stream, text=True, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, log.read_text())


CALIBRATED = """
import sys
import core
from core.costmodel.planner import current
from core.registry import get_solver
from core.running import implementations
spec = get_solver(sys.argv[1])
sys.exit(0 if any(current().model(spec, key) is not None for key in implementations(spec)) else 1)
"""


def calibrated(name: str, env: dict) -> bool:
    """Whether the store ``env`` names already holds a calibration of ``name`` (asked in a child process, which
    reads that store)."""
    return subprocess.run([sys.executable, "-c", CALIBRATED, name], env=env, capture_output=True,
                          check=False).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("solvers", nargs="*")
    parser.add_argument("--out")
    parser.add_argument("--count", default="12")
    parser.add_argument("--seed", default="2024")
    parser.add_argument("--calls", default="3")
    parser.add_argument("--cache", help="keep each solver's wisdom store in CACHE/SOLVER, calibrated once")
    parser.add_argument("--calibrate-only", action="store_true", help="stop after calibrating")
    args = parser.parse_args()
    import core

    names = args.solvers or sorted(core.solvers())
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    summary = []
    failed = 0
    for name in names:
        store = Path(args.cache) / name if args.cache else Path(tempfile.mkdtemp(prefix=f"crossover-eval-{name}-"))
        store.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CROSSOVER_CACHE_DIR=str(store), COLUMNS="200")
        began = time.perf_counter()
        if args.cache and calibrated(name, env):  # a kept store: its calibration stands
            calibration = subprocess.CompletedProcess([], 0, f"(calibrated already in {store})\n", "")
        else:
            calibration = crossover("calibrate", name, env=env, log=out / f"{name}.calibrate.log" if out else None)
        calibrate_seconds = time.perf_counter() - began
        if args.calibrate_only:
            failed += calibration.returncode != 0
            print(f"## {name}: calibrated in {calibrate_seconds:.1f} s (store {store})", flush=True)
            continue
        began = time.perf_counter()
        evaluation = crossover("evaluate", name, "--count", args.count, "--seed", args.seed, "--calls", args.calls,
                               "--json", env=env, log=out / f"{name}.evaluate.log" if out else None)
        evaluate_seconds = time.perf_counter() - began
        text = (f"## {name}\n\n$ crossover calibrate {name}   ({calibrate_seconds:.1f} s wall)\n"
                f"{calibration.stdout}{calibration.stderr}\n$ crossover evaluate {name} --json   "
                f"({evaluate_seconds:.1f} s wall)\n{evaluation.stderr}\n")
        print(text, flush=True)
        if out:
            (out / f"{name}.txt").write_text(text)
            (out / f"{name}.json").write_text(evaluation.stdout)
        failed += calibration.returncode != 0 or evaluation.returncode != 0
        try:
            found = json.loads(evaluation.stdout)
            result = {key: found[key] for key in ("median_final_regret", "max_final_regret", "median_loop_ratio",
                                                  "max_loop_ratio", "median_regret", "max_regret",
                                                  "predictions_within_2x")}
        except (ValueError, KeyError):
            result = {"failed": evaluation.stdout[-500:]}
        summary.append({"solver": name, "calibrate_seconds": round(calibrate_seconds, 1),
                        "evaluate_seconds": round(evaluate_seconds, 1), **result})
        print(json.dumps(summary[-1]), flush=True)
    print(json.dumps(summary, indent=1))
    if out:
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
