"""Torch kernel of the backward HJB solver, batched over K instances on one device.

K instances share the grid, ``g`` and the scalars of one :class:`HJBProblem`
but each has its own potential and density (common noise shifts V per path):
``solve_torch_batch(problem, V_batch, M_batch)`` takes both as (K, Nt+1, Nx)
and solves the K HJB equations together. Everything stays on the device;
the Thomas sweep is a Python loop over the Nx rows, each row one set of
kernels over all K instances at once.

The arithmetic mirrors :mod:`plugins.mfg.hjb.reference` line by line: same
scheme (V and M at level n, implicit), same Godunov Hamiltonian and
Jacobian, same Newton stopping rule, applied per instance: an instance whose
update fell below ``newton_tol`` is frozen while the others iterate on.

``fused=True`` runs the same sweep as one Triton kernel launch instead
(:mod:`plugins.mfg.hjb.triton_kernel`, one program per instance, the
tridiagonal solves by parallel cyclic reduction); the source ``V + f(M)``
is formed here either way. It needs CUDA and Triton
(:func:`fused_unsupported` says why not).

torch is imported inside the functions: this module imports without it.
"""

from __future__ import annotations

import importlib.util

import numpy as np

from core.backends.torch_gpu import cuda_available
from core.backends.torch_gpu import device as gpu_device
from core.errors import BackendUnavailableError
from core.validation import check_array, fail
from plugins.mfg.hjb import layout
from plugins.mfg.hjb.reference import residual_and_jacobian
from plugins.mfg.problem import LOG_FLOOR, HJBProblem


def _thomas(torch, lower, diag, upper, rhs):
    """Batched Thomas solve along the last axis; coefficients broadcast against ``rhs``.

    Mirrors :func:`plugins.mfg.hjb.reference.thomas`. The rows are kept in
    Python lists of views and stacked once, so each row costs a handful of
    kernels and no index-put.
    """
    n = diag.shape[-1]
    a, b, c, d = lower.unbind(-1), diag.unbind(-1), upper.unbind(-1), rhs.unbind(-1)
    c_prime = [c[0] / b[0]]
    d_prime = [d[0] / b[0]]
    for j in range(1, n):
        pivot = b[j] - a[j] * c_prime[j - 1]
        c_prime.append(c[j] / pivot)
        d_prime.append((d[j] - a[j] * d_prime[j - 1]) / pivot)
    x = [None] * n
    x[n - 1] = d_prime[n - 1]
    for j in range(n - 2, -1, -1):
        x[j] = d_prime[j] - c_prime[j] * x[j + 1]
    return torch.stack(x, dim=-1)


def _cyclic_thomas(torch, lower, diag, upper, rhs):
    """Batched cyclic tridiagonal solve by Sherman-Morrison; mirrors the reference's ``cyclic_thomas``.

    The two right-hand sides (``rhs`` and Sherman-Morrison's ``u``) go through
    one Thomas sweep, stacked, which halves the kernel launches.
    """
    beta = lower[..., 0]  # A[0, n-1]
    alpha = upper[..., -1]  # A[n-1, 0]
    gamma = -diag[..., 0]
    modified = diag.clone()
    modified[..., 0] = diag[..., 0] - gamma
    modified[..., -1] = diag[..., -1] - alpha * beta / gamma
    u = torch.zeros_like(rhs)
    u[..., 0] = gamma
    u[..., -1] = alpha
    both = _thomas(torch, lower.unsqueeze(-2), modified.unsqueeze(-2), upper.unsqueeze(-2),
                   torch.stack([rhs, u], dim=-2))
    y, z = both[..., 0, :], both[..., 1, :]
    factor = (y[..., 0] + beta * y[..., -1] / gamma) / (1.0 + z[..., 0] + beta * z[..., -1] / gamma)
    return y - factor.unsqueeze(-1) * z


def _neighbours(torch, u, periodic: bool):
    if periodic:
        return torch.roll(u, 1, dims=-1), torch.roll(u, -1, dims=-1)
    left = torch.cat([u[..., 1:2], u[..., :-1]], dim=-1)
    right = torch.cat([u[..., 1:], u[..., -2:-1]], dim=-1)
    return left, right


def _congestion_cost(torch, problem: HJBProblem, m):
    """``problem.congestion_cost`` on a tensor (same floor for the log)."""
    if problem.congestion == "none":
        return torch.zeros_like(m)
    if problem.congestion == "linear":
        return problem.congestion_coef * m
    return problem.congestion_coef * torch.log(torch.clamp(m, min=LOG_FLOOR))


def _as_batch(torch, field: str, value, problem: HJBProblem, dev, *, nonnegative: bool):
    """A (K, Nt+1, Nx) float64 tensor on ``dev``.

    Arrays are validated like problem fields (finite; M non-negative).
    Tensors are only checked for shape: checking their values would cost a
    device synchronisation, and they come from code that already did.
    """
    shape = (None, problem.Nt + 1, problem.Nx)
    if isinstance(value, torch.Tensor):
        if value.dim() != 3 or tuple(value.shape[1:]) != shape[1:]:
            raise fail(field, value, f"must have shape ('any', {shape[1]}, {shape[2]}), got {tuple(value.shape)}")
        return value.to(device=dev, dtype=torch.float64)
    array = check_array(field, value, shape=shape, nonnegative=nonnegative)
    return torch.tensor(array, dtype=torch.float64, device=dev)  # a copy: the validated array is read-only


def fused_unsupported(problem: HJBProblem) -> str:
    """Why the Triton kernel (``fused=True``) cannot solve ``problem`` here ("" when it can).

    The row length is checked first, then Triton, and CUDA last: only that
    step imports torch.
    """
    reason = layout.too_long(problem.Nx)
    if reason:
        return reason
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if not cuda_available():
        return "the Triton HJB kernel needs a CUDA device"
    return ""


def sweep_torch_batch(problem: HJBProblem, V_batch, M_batch, device=None, *, fused: bool = False):
    """``(U, newton_iterations, converged)`` as tensors: (K, Nt+1, Nx), (K, Nt), (K, Nt).

    ``fused`` runs the Triton kernel, else the row-by-row torch sweep.
    """
    import torch

    if device is None:
        device = gpu_device()
    if torch.device(device).type == "mps":
        raise BackendUnavailableError("mfg.hjb_fdm needs float64, which MPS does not have: use numpy or numba")
    if fused:
        reason = fused_unsupported(problem) or ("" if torch.device(device).type == "cuda"
                                                else f"the Triton HJB kernel needs a CUDA device, not {device}")
        if reason:
            raise ValueError(f"the Triton HJB cannot run this problem: {reason}")
    V = _as_batch(torch, "V_batch", V_batch, problem, device, nonnegative=False)
    M = _as_batch(torch, "M_batch", M_batch, problem, device, nonnegative=True)
    if V.shape[0] != M.shape[0]:
        raise fail("M_batch", M_batch, f"must have as many instances as V_batch ({V.shape[0]}), got {M.shape[0]}")
    source = V + _congestion_cost(torch, problem, M)
    if fused:
        from plugins.mfg.hjb.triton_kernel import sweep_fused  # Triton only loads where this variant runs

        return sweep_fused(problem, source)
    return _sweep_rows(torch, problem, source)


def _sweep_rows(torch, problem: HJBProblem, source):
    """The torch sweep: every Newton iteration a Thomas sweep of Nx rows, each row a few kernels over K."""
    device = source.device
    K, nt, nx = source.shape[0], problem.Nt, problem.Nx
    periodic = problem.boundary == "periodic"
    linear_solve = _cyclic_thomas if periodic else _thomas
    dt, dx, nu, lam = problem.dt, problem.dx, problem.nu, problem.lam
    U = torch.empty((K, nt + 1, nx), dtype=torch.float64, device=device)
    U[:, nt] = torch.tensor(problem.g, dtype=torch.float64, device=device)
    iterations = torch.zeros((K, nt), dtype=torch.int64, device=device)
    converged = torch.zeros((K, nt), dtype=torch.bool, device=device)
    for n in range(nt - 1, -1, -1):
        u_next = U[:, n + 1]
        u = u_next.clone()  # Newton starts from the later time level
        active = torch.ones(K, dtype=torch.bool, device=device)
        for k in range(1, problem.newton_max + 1):
            # V and M at level n, the level being solved for (implicit)
            residual, lower, diag, upper = residual_and_jacobian(
                u, u_next, source[:, n], dt, dx, nu, lam, periodic, neighbours=lambda v, p: _neighbours(torch, v, p))
            update = linear_solve(torch, lower, diag, upper, -residual)
            u = u + torch.where(active.unsqueeze(-1), update, torch.zeros_like(update))
            iterations[:, n] = torch.where(active, k, iterations[:, n])
            small = torch.amax(torch.abs(update), dim=-1) < problem.newton_tol
            converged[:, n] = converged[:, n] | (active & small)
            active = active & ~small
            if not bool(active.any()):  # one synchronisation per Newton iteration
                break
        U[:, n] = u
    return U, iterations, converged


def solve_torch_batch(problem: HJBProblem, V_batch, M_batch, device=None, *, fused: bool = False):
    """U of K instances, a float64 tensor (K, Nt+1, Nx) on ``device`` (default: the GPU).

    ``V_batch`` and ``M_batch`` are (K, Nt+1, Nx) arrays or tensors; ``g``,
    the grid and the scalars come from ``problem`` (its own V and M are not
    used). Pass ``device=torch.device("cpu")`` to run the same code on CPU
    torch, e.g. to check it where there is no GPU. ``fused`` takes the
    Triton kernel (CUDA only).
    """
    return sweep_torch_batch(problem, V_batch, M_batch, device, fused=fused)[0]


def solve_torch(problem: HJBProblem, device=None, *, fused: bool = False) -> dict[str, np.ndarray]:
    """The problem as a batch of one; the same outputs as the numpy reference."""
    U, iterations, converged = sweep_torch_batch(problem, problem.potential()[None], problem.M[None], device,
                                                 fused=fused)
    return {"U": U[0].cpu().numpy(), "newton_iterations": iterations[0].cpu().numpy(),
            "converged": converged[0].cpu().numpy()}
