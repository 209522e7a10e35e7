"""Functions swept in tests; workers import them by name."""

from __future__ import annotations

import os


def square(x: float) -> dict:
    return {"y": x * x}


def fragile(x: float) -> dict:
    if x == 3:
        raise ValueError("three is not allowed")
    if x == 5:
        os._exit(7)  # the worker dies with this point
    return {"y": x * x}


def seeded_draws(seed: int, count: int) -> dict:
    """Deterministic in its parameters, so every backend must return the same numbers."""
    import numpy as np

    return {"draws": np.random.default_rng(seed).standard_normal(count)}


def stuck_at(x: float, stuck: float) -> dict:
    """Never returns for ``x == stuck``."""
    import time

    while x == stuck:
        time.sleep(1)
    return {"y": x * x}
