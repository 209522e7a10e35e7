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
