"""The int64 fixed-point units of the GPU FP deposits, shared by the torch eager path and the Triton kernel.

Kept apart from both, so that the Triton kernel (loaded only where its
variant runs) and the eager path import one definition without importing
each other.
"""

from __future__ import annotations


def _torch():
    import torch

    return torch


# -- the units -------------------------------------------------------------------------------------------------
# A particle's unit mass is FIXED_POINT_SCALE integer units, split (SCALE - w, w) between its two nodes. Integer
# addition is associative, so atomic adds give the same counts in any order. 2**32 resolves a split to 2.3e-10
# of a particle, far below what the float32 positions carry (their rounding moves a split by about 1e-5 at
# x ~ 1, dx ~ 0.01). Bound: the largest sum, a step's total N * SCALE (or every particle in one bin), must fit
# int64; with N <= MAX_PARTICLES = 2**30 it is at most 2**62, half of int64's range. The fused kernel's moment
# sums count u = (x - xmin) / L and u**2, both in [0, 1] up to float32 rounding, at the same scale: same bound.
FIXED_POINT_SCALE = 2**32
MAX_PARTICLES = 2**30


def fixed_point_unsupported(problem) -> str:
    """Why the int64 fixed-point deposits cannot count ``problem``'s particles ("" when they can)."""
    if problem.N > MAX_PARTICLES:
        return (f"N={problem.N:,} particles exceed the {MAX_PARTICLES:,} (2**30) that the GPU's int64 fixed-point "
                f"deposits can count: N * 2**32 units must stay within int64")
    return ""


def split_units(frac):
    """The fixed-point linear-binning weights ``(SCALE - w, w)`` of fractions in [0, 1], int64; they sum to SCALE.

    ``w = floor(frac * SCALE + 0.5)`` in float64: the product by a power of
    two is exact, so w is the same bits on every IEEE device, here as in the
    Triton kernel, and within half a unit (plus float64 rounding of the sum)
    of ``frac * SCALE``.
    """
    torch = _torch()
    right = (frac * FIXED_POINT_SCALE).add_(0.5).floor_().to(torch.int64)  # one float64 temporary
    return FIXED_POINT_SCALE - right, right


def moment_units(problem, x):
    """int64 (sum of u, sum of u**2) at SCALE units, u = (x - xmin) * (1 / L), as the Triton kernel counts them.

    ``x`` is float64; the last dimension holds the particles. (Multiplying
    by the inverse spares the kernel a float64 division per particle step.)
    """
    torch = _torch()
    u = (x - problem.xmin) * (1.0 / problem.length)
    first = torch.floor(u * FIXED_POINT_SCALE + 0.5).to(torch.int64).sum(dim=-1)
    second = torch.floor(u * u * FIXED_POINT_SCALE + 0.5).to(torch.int64).sum(dim=-1)
    return torch.stack([first, second], dim=-1)


def moments_from_units(problem, units):
    """(sum of x, sum of x**2) in float64 from the fixed-point (sum of u, sum of u**2), x = xmin + L u."""
    torch = _torch()
    su = units[..., 0].to(torch.float64) / FIXED_POINT_SCALE
    suu = units[..., 1].to(torch.float64) / FIXED_POINT_SCALE
    n, xmin, length = problem.N, problem.xmin, problem.length
    return torch.stack([n * xmin + length * su, n * xmin**2 + 2 * xmin * length * su + length**2 * suu], dim=-1)
