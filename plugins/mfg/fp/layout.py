"""How the compiled FP kernels lay out their work: numba's particle chunks, the GPU's slotted histograms.

No numba, torch or Triton is imported here, so the kernels and the memory
estimates (which must not load a compiler to answer) share one truth, and
the torch eager path and the Triton kernel spread their adds over the same
slots.
"""

from __future__ import annotations

SLOTS = 128  # private histogram copies per time step on the GPU: spreads the atomic adds on busy bins
# particles per Triton program: at N = 1e7, Nx = 101, Nt = 100 on an H200, 512 ran the kernel 11 % faster
# than 1024 and 1.5x as fast as 2048 (8 warps), docs/results/gpu-2026-11-27-fp
BLOCK = 512
MAX_HISTOGRAM_BINS = 1024


def histogram_bins(nx: int) -> int:
    """Bins of a block's shared-memory count histogram (a power of two above Nx), or 0 past MAX_HISTOGRAM_BINS.

    The histogram is a register tensor of that many bins in each program, so
    past the declared grids (Nx <= 801) the kernel counts with a global add
    per particle instead.
    """
    bins = 1 << int(nx).bit_length()  # the smallest power of two >= nx + 1
    return bins if bins <= MAX_HISTOGRAM_BINS else 0


def chunk_size(n: int) -> int:
    """Particles per private histogram of the numba kernels: even, so pairs never straddle chunks.

    At least 64 chunks when N allows (so that extra threads lent to a
    running task have work to share), at least 512 particles each (so that a
    chunk's zeroing and merging stay small next to its particles), at most
    4096 (the fixed size the large-N throughput in docs/mfg.md was measured
    with). The chunking depends on N only, so results do not depend on the
    thread count.
    """
    size = min(max(-(-n // 64), 512), 4096)
    return size + size % 2


# Particles a thread needs to pay for its share of every step's fork and join. Lent threads (core_lending)
# slept while their worker was idle: on the 2-core VM, paths of 2,000 particles ran 24 % slower on 2 lent
# threads than on 1, 5,000 broke even, 20,000 ran 15 % faster. No more threads than chunks either: a
# 366-particle path (one chunk) on 8 lent threads of the H200 host took 3x its time on one. At 4,096
# particles a thread, a 20,000-particle sweep point's last task took at most 4 of 16 idle cores, and the
# 16-worker cluster's scheduling loss rose from 3-5 % to 8-14 %. The numba backend's own solves keep the
# same cap: a 499-particle common-noise path on all 16 threads of that host was calibrated at 2.5x the
# time it later took, as every step waited for the slowest of 16 threads on a host busy with 32 idle
# workers' wake-ups, and the model built on it chose the process pool, 84 % slower.
PARTICLES_PER_THREAD = 1024


def threads_worth(n: int) -> int:
    """How many threads a path of ``n`` particles can use (at least one)."""
    return max(1, min(chunks(n), n // PARTICLES_PER_THREAD))


def chunks(n: int) -> int:
    """How many chunks of :func:`chunk_size` hold ``n`` particles."""
    return -(-n // chunk_size(n))


def all_steps_bytes(problem) -> int:
    """Memory of numba's all-steps kernel's (chunks, steps, Nx) histograms."""
    return 8 * chunks(problem.N) * (problem.Nt + 1) * problem.Nx


def slotted_histogram_bytes(problem, steps: int) -> int:
    """Memory of ``steps`` GPU histograms of SLOTS x 2 x Nx int64 bins, with their (sum, sum of squares) slots.

    The Triton kernel keeps two rows per slot (its particles per cell and
    their right units); the eager path's one step fills one row per slot.
    """
    return 8 * steps * SLOTS * (2 * problem.Nx + 2)
