"""Functions swept in the checkpoint tests; workers import them by name.

Each call appends its ``x`` to the file ``calls``, so a test counts what
was computed even where the points ran in worker processes.
"""

from __future__ import annotations

import os
import time

import numpy as np


def _called(calls: str, x: int) -> None:
    with open(calls, "a", encoding="utf-8") as handle:
        handle.write(f"{x}\n")


def calls_of(calls: str) -> list[int]:
    """The points computed so far, in the order they were called."""
    if not os.path.exists(calls):
        return []
    with open(calls, encoding="utf-8") as handle:
        return [int(line) for line in handle]


def awkward(x: int, calls: str) -> dict:
    """Outputs that JSON cannot write plainly: float64 bits past repr, NaN, infinities, float32, a tuple."""
    _called(calls, x)
    rng = np.random.default_rng(x)
    values = rng.standard_normal(5) * 10.0 ** rng.integers(-300, 300, 5)
    return {"values": np.append(values, [np.nan, np.inf, -np.inf, -0.0]), "single": np.float32(x / 3),
            "mean": float(values.mean()) if x % 2 else float("nan"), "shape": (x, "ok"),
            "grid": np.arange(6, dtype=np.int32).reshape(2, 3) * x}


def fails_until(x: int, calls: str, fixed: str) -> dict:
    """Fails at x == 2 until the file ``fixed`` exists."""
    _called(calls, x)
    if x == 2 and not os.path.exists(fixed):
        raise ValueError("two fails until fixed")
    return {"y": np.array([x * 0.1])}


def interrupted_at(x: int, calls: str, flag: str) -> dict:
    """Ctrl-C at x == 3, the first time only (the file ``flag`` marks that it happened)."""
    _called(calls, x)
    if x == 3 and not os.path.exists(flag):
        open(flag, "w").close()
        raise KeyboardInterrupt
    return {"y": np.sqrt(np.arange(x + 1) / 7.0)}


def slow(x: int, calls: str) -> dict:
    _called(calls, x)
    time.sleep(0.3)
    return {"y": np.sqrt(np.arange(x + 1) / 7.0)}
