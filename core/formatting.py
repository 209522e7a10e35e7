"""Numbers for people: an estimate printed with its standard error, at the error's precision.

A Monte Carlo answer printed to more digits than its noise allows makes two
correct runs look as if they disagree. Solvers' one-line summaries print
such numbers as ``value ± error``, both rounded at the error's leading
significant digit, so the digits shown are the digits that mean something.
"""

from __future__ import annotations

import math


def with_error(value: float, error: float) -> str:
    """``value ± error`` rounded at the error's first significant digit (``0.498 ± 0.001``).

    A zero, negative or non-finite error prints the value alone, to four
    significant digits; a non-finite value prints as ``nan`` or ``inf``.
    """
    value, error = float(value), float(error)
    if not math.isfinite(value):
        return str(value)
    if not (math.isfinite(error) and error > 0):
        return f"{value:.4g}"
    decimals = max(0, -math.floor(math.log10(error)))
    if round(error, decimals) >= 10.0 ** (1 - decimals):  # 0.096 rounds up to 0.1: one digit fewer
        decimals = max(0, decimals - 1)
    return f"{value:.{decimals}f} ± {error:.{decimals}f}"
