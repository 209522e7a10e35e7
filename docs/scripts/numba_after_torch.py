"""Diagnosis: does a Numba parallel region slow down once torch has run in the same process?

    python docs/scripts/numba_after_torch.py

Times the ``numba:threads`` linear-regression solve of a small problem
(many short parallel regions: one per epoch) fresh, after a torch CPU
matmul (torch's own OpenMP pool), after a CUDA op, and after a pause.
Run it under different ``NUMBA_THREADING_LAYER`` / ``OMP_WAIT_POLICY``
settings to see which combination keeps the regions cheap.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import core
from plugins.ml.linreg_problem import LinRegProblem


def timed(problem: LinRegProblem, key: str, repeats: int = 30) -> float:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        core.solve(problem, backend=key, solver="ml.linreg")
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1e3


def main() -> None:
    import numba

    problem = LinRegProblem(n_samples=6842, n_epochs=55)
    row = {"NUMBA_THREADING_LAYER": os.environ.get("NUMBA_THREADING_LAYER", ""),
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "")}
    for key in ("numba:serial", "numba:threads"):
        timed(problem, key, 3)
    row["threading_layer"] = numba.threading_layer()
    row["serial_ms_fresh"] = timed(problem, "numba:serial")
    row["threads_ms_fresh"] = timed(problem, "numba:threads")
    import torch

    a = torch.randn(1024, 1024)
    (a @ a).sum().item()
    row["threads_ms_after_torch_cpu"] = timed(problem, "numba:threads")
    if torch.cuda.is_available():
        (torch.randn(1024, 1024, device="cuda") ** 2).sum().item()
        row["threads_ms_after_cuda"] = timed(problem, "numba:threads")
    (a @ a).sum().item()
    time.sleep(1.0)
    row["threads_ms_after_pause"] = timed(problem, "numba:threads")
    row["serial_ms_end"] = timed(problem, "numba:serial")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
