"""How the Triton HJB kernel lays out its work: one program per instance, one grid row per program.

No torch or Triton is imported here, so the kernel's launcher, the memory
estimate and the "can it run" answer share one truth without loading a
compiler.

A program holds its instance's row of Nx values in registers, padded to a
power of two (``block_size``), for every time step and Newton iteration.
Its threads exchange values through a private scratch area in global
memory (:func:`scratch_elements`): the neighbours of the residual, every
stage of the parallel cyclic reduction (two buffers, written in turn, so one
barrier a stage suffices), and a few scalars of the cyclic correction.
"""

from __future__ import annotations

# Rows up to this long fit one program's registers, nearly: at 2,048 (16 warps, 4 values a thread) ptxas
# caps a thread at 128 registers and spills about 100 bytes; longer rows would spill more on every stage.
MAX_NX = 2048

# One value a thread, up to 16 warps (512 values): each PCR stage is a chain of dependent memory round trips
# and divisions, so more threads shorten it and more values a thread lengthen it. Measured on an H200 at
# Nx = 401 (a 512 block), one instance, Nt = 200: 2, 4, 8, 16 warps took 6.4-6.8, 4.3-4.4, 3.4-3.7 and
# 2.3-2.6 ms; at 256 instances 16 warps were still the fastest (docs/scripts/hjb_gpu_bench.py --warps).
VALUES_PER_THREAD = 1
MAX_WARPS = 16
PCR_VECTORS = 4  # lower and upper (the diagonal is kept at one), the right-hand side and Sherman-Morrison's
SCALARS = 8  # the cyclic correction's corners: A[0, n-1], A[n-1, 0], A[0, 0]; y_0, y_{n-1}, z_0, z_{n-1}


def block_size(nx: int) -> int:
    """The row length a program works on: the next power of two of ``nx`` (Triton's blocks are powers of two)."""
    return max(16, 1 << (int(nx) - 1).bit_length())


def stages(nx: int) -> int:
    """Parallel cyclic reduction stages: each doubles the reach of a row, until it spans the block."""
    return block_size(nx).bit_length() - 1


def warps(nx: int) -> int:
    """Warps per program: ``VALUES_PER_THREAD`` values a thread, 1 to ``MAX_WARPS`` warps of 32 threads."""
    return min(MAX_WARPS, max(1, block_size(nx) // (32 * VALUES_PER_THREAD)))


def scratch_elements(nx: int) -> int:
    """float64 scratch of one program: two PCR buffers, the row exchange, the cyclic scalars."""
    return (2 * PCR_VECTORS + 1) * block_size(nx) + SCALARS


def fused_bytes(nx: int, nt: int, instances: int) -> int:
    """Device memory of a batched fused sweep beyond its inputs.

    Per instance: the source ``V + f(M)`` and its congestion term while it
    is formed, U, the scratch, and int64 + int8 Newton counts per step.
    """
    grid = 8 * (nt + 1) * nx
    return instances * (3 * grid + 8 * scratch_elements(nx) + 9 * nt)


def too_long(nx: int) -> str:
    """Why one program cannot hold a row of ``nx`` values ("" when it can)."""
    if nx > MAX_NX:
        return f"Nx={nx} exceeds {MAX_NX}, the longest row one Triton program holds in registers"
    return ""
