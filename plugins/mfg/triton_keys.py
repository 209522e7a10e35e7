"""What makes the MFG Triton kernels compile again in a process: the compile keys the cost model reads.

Triton compiles a kernel once per value of its ``constexpr`` arguments, and
specialises each integer argument on whether it is 1 and whether 16 divides
it. In a warm process on the H200 host a common-noise solve on
``torch:hjb_fused`` paid, on the first run at each new key: Nx=48 (16
divides it) 1.7 s, Nx=70 (the HJB row's block grows to 128) 2.2 s, Nt=32
2.2 s, N=1024 (the FP's particle count) 0.85 s; Nx=41, 43, 56 and 75,
Nt=23, N=1013 and 2000, and more paths paid nothing
(docs/results/gpu-2026-11-28f/q-triton-probe.txt). Declared per shape,
calibration measures that one-off and the planner charges it once per key
(a trial on a new key is then no warm sample; ``SolverSpec.compile_key``).

No compiler is imported here: the layouts say what the launches pass.
"""

from __future__ import annotations

from typing import Any

from plugins.mfg.fp.common import all_steps_unsupported
from plugins.mfg.fp.fixed_point import fixed_point_unsupported
from plugins.mfg.fp.layout import histogram_bins
from plugins.mfg.hjb.layout import block_size, scratch_elements, warps

# Triton keeps what it compiles on disk (its cache directory), so a key compiled on this machine is loaded by a
# later process, not compiled again (SolverSpec.compile_cached): the variants whose keys are Triton's alone
CACHED_ON_DISK = frozenset({"torch:fused"})  # mfg.fp_particle's and mfg.hjb_fdm's
COUPLED_CACHED_ON_DISK = frozenset({"torch:hjb_host", "torch:hjb_device", "torch:hjb_fused", "torch:resident"})


def specialised(*values: int) -> tuple[tuple[bool, bool], ...]:
    """What Triton compiles integer arguments for: each one's being 1, and 16 dividing it."""
    return tuple((int(value) == 1, int(value) % 16 == 0) for value in values)


def hjb_key(problem: Any) -> tuple:
    """The batched HJB sweep's key (hjb.triton_kernel._hjb_sweep): the boundary, the row's block and warps,
    and the specialised nx, nt and scratch stride (Newton's cap is not specialised)."""
    nx = int(problem.Nx)
    return ("hjb", problem.boundary == "periodic", block_size(nx), warps(nx),
            *specialised(nx, problem.Nt, scratch_elements(nx)))


def fp_key(problem: Any) -> tuple:
    """The all-steps FP kernel's key (fp.triton_kernel._fp_all_steps): the boundary, the histogram's bins, and
    the specialised particle count, nx and nt (the seed is not specialised)."""
    return ("fp", problem.boundary == "periodic", histogram_bins(problem.Nx),
            *specialised(problem.N, problem.Nx, problem.Nt))


def hjb_compile_key(problem: Any, implementation: str) -> tuple:
    """mfg.hjb_fdm: ``torch:fused`` runs the Triton sweep; the others compile once a process, or not at all."""
    return hjb_key(problem) if implementation == "torch:fused" else ()


def fp_compile_key(problem: Any, implementation: str) -> tuple:
    """mfg.fp_particle: ``torch:fused`` runs the all-steps Triton kernel."""
    return fp_key(problem) if implementation == "torch:fused" else ()


def coupled_compile_key(problem: Any, implementation: str) -> tuple:
    """The fixed point and common noise: every torch variant runs the all-steps FP kernel where it can
    (coupling.torch_steps), and ``torch:hjb_fused`` and ``torch:resident`` the HJB sweep too."""
    if not implementation.startswith("torch:"):
        return ()
    # the torch FP's fused path, where its problem allows it (fp.torch_kernel.fused_unsupported's problem checks)
    fp = () if all_steps_unsupported(problem) or fixed_point_unsupported(problem) else fp_key(problem)
    return fp + (hjb_key(problem) if implementation in ("torch:hjb_fused", "torch:resident") else ())
