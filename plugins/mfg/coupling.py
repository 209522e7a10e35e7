"""The full MFG: damped Picard iteration between the HJB and FP solvers.

    U_{k+1} = (1 - dU) U_k + dU HJB(M_k)
    M_{k+1} = (1 - dM) M_k + dM FP(U_{k+1})

The particle FP uses the same seed at every iteration (common random
numbers), so the map is deterministic and its fixed point exists for the
particle system itself; a fresh seed per iteration would leave a noise floor
that no tolerance below it could ever reach.

Converged means: for both U and M, the change of the last iteration in L2
over space-time satisfies ``|change| <= atol + rtol * |new|`` (NumPy's
``allclose`` rule). A run that stops at ``max_iter`` is reported as not
converged, whatever its last errors were.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from plugins.mfg.fp import reference as fp_reference
from plugins.mfg.fp import torch_kernel as fp_torch
from plugins.mfg.fp.common import all_steps_unsupported
from plugins.mfg.hjb import reference as hjb_reference
from plugins.mfg.hjb import torch_kernel as hjb_torch
from plugins.mfg.problem import (
    FPProblem,
    HJBProblem,
    MFGModel,
    MFGProblem,
    drives_particles_too_far,
    largest_step,
)

HJBStep = Callable[[HJBProblem], np.ndarray]
FPStep = Callable[[FPProblem], np.ndarray]


def l2(problem: MFGModel, values: np.ndarray) -> float:
    """Space-time L2 norm with the grid's quadrature weights."""
    return float(np.sqrt(np.sum(values**2 * problem.weights()) * problem.dt))


def hjb_problem(problem: MFGProblem, M: np.ndarray, V_t: np.ndarray | None) -> HJBProblem:
    return HJBProblem(**problem.model_fields(), M=M, V_t=V_t)


def fp_problem(problem: MFGProblem, U: np.ndarray) -> FPProblem:
    return FPProblem(**problem.model_fields(), U=U)


BatchHJB = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (V, M) -> U, each (K, Nt+1, Nx)
BatchFP = Callable[[np.ndarray], np.ndarray]  # U -> M


def picard_batch(problem: MFGProblem, hjb: BatchHJB, fp: BatchFP, V: np.ndarray) -> dict[str, np.ndarray]:
    """The damped fixed point for K instances at once (potentials ``V``, (K, Nt+1, Nx)).

    Each instance stops updating once it has converged; the batch stops when
    every instance has converged or reached ``max_iter``. The CPU solvers
    call this with K = 1; the GPU common-noise solver with K paths.
    """
    k = V.shape[0]
    M = np.tile(problem.m0, (k, problem.Nt + 1, 1))
    U = None
    converged = np.zeros(k, dtype=bool)
    iterations = np.zeros(k, dtype=np.int64)
    history: list[list[tuple[float, float, float, float]]] = [[] for _ in range(k)]
    active = np.ones(k, dtype=bool)
    diverged = np.zeros(k, dtype=bool)
    while active.any():
        iterations[active] += 1
        U_hjb = hjb(V, M)
        live = active[:, None, None]
        U_next = U_hjb if U is None else np.where(live, (1 - problem.damping_U) * U + problem.damping_U * U_hjb, U)
        # an instance whose U overflowed, or drives particles further than wrapping can bring back,
        # has diverged: it stops here with that U (not converged; flagged by the Result where not
        # finite), and the FP never sees it
        diverged |= active & np.array([drives_particles_too_far(problem, u) for u in U_next])
        active &= ~diverged
        if not active.any():
            U = U_next
            break
        live = active[:, None, None]
        M_fp = fp(np.where(live, U_next, 0.0))
        M_next = np.where(live, (1 - problem.damping_M) * M + problem.damping_M * M_fp, M)
        if U is not None:
            for i in np.flatnonzero(active):
                change_U, change_M = l2(problem, U_next[i] - U[i]), l2(problem, M_next[i] - M[i])
                size_U, size_M = l2(problem, U_next[i]), l2(problem, M_next[i])
                history[i].append((change_U, change_U / max(size_U, 1e-300), change_M, change_M / max(size_M, 1e-300)))
                converged[i] = (change_U <= problem.atol + problem.rtol * size_U
                                and change_M <= problem.atol + problem.rtol * size_M)
        U, M = U_next, M_next
        active = ~converged & ~diverged & (iterations < problem.max_iter)
    return {"U": U, "M": M, "history": [np.array(h).reshape(-1, 4) for h in history], "converged": converged,
            "iterations": iterations}


DeviceHJB = Callable[[object, object], object]  # (V, M) -> U, device tensors (k, Nt+1, Nx) of the live instances
DeviceFP = Callable[[object], object]  # U -> M


def picard_batch_device(problem: MFGProblem, hjb: DeviceHJB, fp: DeviceFP, V) -> dict[str, object]:
    """:func:`picard_batch`'s fixed point with every iterate a device tensor; ``V`` is (K, Nt+1, Nx) on the device.

    The same damping, divergence and convergence rules, evaluated for all
    instances at once on the device, so U and M never cross the bus between
    iterations: the only transfer per iteration is the list of live
    instances (a few bytes), which the host needs to know whether to go on.
    Each iteration solves only the instances still live, compacted into one
    smaller batch: a path's answer does not depend on which paths share its
    batch (see ``common_noise.solve_torch``), so this changes no result and
    spends nothing on finished paths. Returns U, M (device tensors) and
    ``converged``, ``iterations`` (host arrays); no error history.
    """
    import torch

    dev = V.device
    k = V.shape[0]
    weights = torch.as_tensor(problem.weights(), device=dev, dtype=torch.float64)
    largest = largest_step(problem)

    def l2_each(values):  # l2() of every instance, in its order of operations
        return torch.sqrt(torch.sum(values**2 * weights, dim=(1, 2)) * problem.dt)

    M = torch.tensor(problem.m0, device=dev, dtype=torch.float64).expand(k, problem.Nt + 1, -1).clone()
    U = torch.zeros_like(M)
    converged = torch.zeros(k, dtype=torch.bool, device=dev)
    diverged = torch.zeros_like(converged)
    iterations = torch.zeros(k, dtype=torch.int64, device=dev)
    active = torch.ones_like(converged)
    first = True
    while True:
        live = torch.nonzero(active).squeeze(1)  # the iteration's one synchronisation
        if live.numel() == 0:
            break
        iterations[live] += 1
        U_old, M_old = U[live], M[live]
        U_hjb = hjb(V[live], M_old)
        U_next = U_hjb if first else (1 - problem.damping_U) * U_old + problem.damping_U * U_hjb
        # drives_particles_too_far for each instance; "not <=" so that a NaN bound counts as too far
        spread = torch.amax(U_next, dim=(1, 2)) - torch.amin(U_next, dim=(1, 2))
        fine = problem.lam * spread / problem.dx * problem.dt <= largest
        diverged[live] |= ~fine
        M_fp = fp(torch.where(fine[:, None, None], U_next, 0.0))
        M_next = torch.where(fine[:, None, None], (1 - problem.damping_M) * M_old + problem.damping_M * M_fp, M_old)
        if not first:
            close_U = l2_each(U_next - U_old) <= problem.atol + problem.rtol * l2_each(U_next)
            close_M = l2_each(M_next - M_old) <= problem.atol + problem.rtol * l2_each(M_next)
            converged[live] = fine & close_U & close_M
        U[live], M[live] = U_next, M_next
        active = ~converged & ~diverged & (iterations < problem.max_iter)
        first = False
    return {"U": U, "M": M, "converged": converged.cpu().numpy(), "iterations": iterations.cpu().numpy()}


def picard(problem: MFGProblem, hjb: HJBStep, fp: FPStep, V_t: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Run the damped fixed point for one instance; returns U, M, the error history and the converged flag."""
    V = np.tile(problem.V, (problem.Nt + 1, 1)) if V_t is None else V_t
    out = picard_batch(problem, lambda v, m: hjb(hjb_problem(problem, m[0], v[0] if V_t is not None else None))[None],
                       lambda u: fp(fp_problem(problem, u[0]))[None], V[None])
    return {"U": out["U"][0], "M": out["M"][0], "history": out["history"][0],
            "converged": np.bool_(out["converged"][0]), "iterations": np.int64(out["iterations"][0])}


# -- the backends' HJB and FP steps --------------------------------------------------
#
# Inside the fixed point the FP runs an all-steps kernel wherever the problem
# allows one (binned KDE, no Silverman): a capability, whatever the size. The
# choices that do depend on size (the host or the device for the HJB; numba,
# numpy or torch) are separate implementations, measured by the cost model.

def numpy_steps() -> tuple[HJBStep, FPStep]:
    return (lambda p: hjb_reference.solve_numpy(p)["U"]), (lambda p: fp_reference.solve_numpy(p)["M"])


def numba_steps() -> tuple[HJBStep, FPStep]:
    # numba compiles (or loads) its kernels on import: only where these steps run
    from plugins.mfg.fp.numba_kernel import solve_particles
    from plugins.mfg.hjb.numba_kernel import solve_numba as hjb_numba

    def fp(p: FPProblem) -> np.ndarray:
        return solve_particles(p, fused=not all_steps_unsupported(p))["M"]

    return (lambda p: hjb_numba(p)["U"]), fp


def torch_steps(hjb_device: bool, fused_hjb: bool = False) -> tuple[HJBStep, FPStep]:
    """Particles on the GPU; the HJB sweep on the device, or with numba on the host.

    The HJB step is a chain of Nx-long tridiagonal recurrences: as torch
    operations on the GPU it is bound by kernel launches, as the Triton
    kernel (``fused_hjb``) it is one launch bound by each Newton iteration's
    log2(Nx) dependent stages, and on the host numba runs it in a
    millisecond but U and M cross the bus once per iteration. Which wins
    depends on the machine and the size, so each is an implementation
    (``torch:hjb_device``, ``torch:hjb_fused``, ``torch:hjb_host``) and the
    cost model measures them.
    """
    def fp(p: FPProblem) -> np.ndarray:
        return fp_torch.solve_torch(p, fused=not fp_torch.fused_unsupported(p))["M"].cpu().numpy()

    if hjb_device:
        return (lambda p: hjb_torch.solve_torch(p, fused=fused_hjb)["U"]), fp
    from plugins.mfg.hjb.numba_kernel import solve_numba as hjb_numba  # numba compiles on import

    return (lambda p: hjb_numba(p)["U"]), fp


# what each implementation key of the coupled solvers runs for one Picard iteration
STEPS: dict[str, Callable[[], tuple[HJBStep, FPStep]]] = {
    "numpy": numpy_steps,
    "numba": numba_steps,
    "torch:hjb_host": lambda: torch_steps(hjb_device=False),
    "torch:hjb_device": lambda: torch_steps(hjb_device=True),
    "torch:hjb_fused": lambda: torch_steps(hjb_device=True, fused_hjb=True),
}


def solve_fixed_point(problem: MFGProblem, *, steps: str) -> dict[str, np.ndarray]:
    """The damped fixed point with the HJB and FP steps of ``steps`` (a key of :data:`STEPS`)."""
    hjb, fp = STEPS[steps]()
    return picard(problem, hjb, fp)
