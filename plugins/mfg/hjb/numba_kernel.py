"""Numba kernel of the backward HJB solver: the whole sweep in one compiled call.

It is serial on purpose: each Newton iteration is one tridiagonal solve, a
recurrence along x, and the time steps depend on each other, so there is no
wide loop to spread over threads. The arithmetic follows
:mod:`plugins.mfg.hjb.reference` term by term (same scheme, same Newton
stopping rule, V and M at level n), so the two agree to rounding.
"""

from __future__ import annotations

import numpy as np

from core.backends.numba_threads import jit
from plugins.mfg.hjb.reference import step_source
from plugins.mfg.problem import HJBProblem


@jit()
def _thomas(lower, diag, upper, rhs, c_prime, x):
    """Tridiagonal solve into ``x`` (``c_prime`` is scratch); lower[0] and upper[n-1] are ignored."""
    n = diag.shape[0]
    c_prime[0] = upper[0] / diag[0]
    x[0] = rhs[0] / diag[0]
    for j in range(1, n):
        pivot = diag[j] - lower[j] * c_prime[j - 1]
        c_prime[j] = upper[j] / pivot
        x[j] = (rhs[j] - lower[j] * x[j - 1]) / pivot
    for j in range(n - 2, -1, -1):
        x[j] = x[j] - c_prime[j] * x[j + 1]


@jit()
def _cyclic_thomas(lower, diag, upper, rhs, modified, u, c_prime, y, z):
    """Cyclic tridiagonal solve into ``y`` by Sherman-Morrison (corners lower[0], upper[n-1])."""
    n = diag.shape[0]
    beta = lower[0]
    alpha = upper[n - 1]
    gamma = -diag[0]
    for j in range(n):
        modified[j] = diag[j]
        u[j] = 0.0
    modified[0] = diag[0] - gamma
    modified[n - 1] = diag[n - 1] - alpha * beta / gamma
    u[0] = gamma
    u[n - 1] = alpha
    _thomas(lower, modified, upper, rhs, c_prime, y)
    _thomas(lower, modified, upper, u, c_prime, z)
    factor = (y[0] + beta * y[n - 1] / gamma) / (1.0 + z[0] + beta * z[n - 1] / gamma)
    for j in range(n):
        y[j] = y[j] - factor * z[j]


@jit()
def _backward_sweep(g, source, dt, dx, nu, lam, periodic, tol, max_iter):
    nt = source.shape[0] - 1
    n = g.shape[0]
    U = np.empty((nt + 1, n))
    U[nt] = g
    iterations = np.zeros(nt, dtype=np.int64)
    converged = np.zeros(nt, dtype=np.bool_)
    u = np.empty(n)
    neg_residual = np.empty(n)
    lower = np.empty(n)
    diag = np.empty(n)
    upper = np.empty(n)
    update = np.empty(n)
    modified = np.empty(n)
    sm_u = np.empty(n)
    c_prime = np.empty(n)
    z = np.empty(n)
    inv_dx2 = 1.0 / dx**2
    for step in range(nt - 1, -1, -1):
        u_next = U[step + 1]
        src = source[step]  # V and M at level n, the level being solved for (implicit)
        for j in range(n):
            u[j] = u_next[j]  # Newton starts from the later time level
        for k in range(1, max_iter + 1):
            for j in range(n):
                if periodic:
                    left = u[j - 1] if j > 0 else u[n - 1]
                    right = u[j + 1] if j < n - 1 else u[0]
                else:
                    left = u[j - 1] if j > 0 else u[1]
                    right = u[j + 1] if j < n - 1 else u[n - 2]
                back = max((u[j] - left) / dx, 0.0)
                fwd = min((right - u[j]) / dx, 0.0)
                residual = ((u[j] - u_next[j]) / dt - nu * (left - 2.0 * u[j] + right) * inv_dx2
                            + 0.5 * lam * (back * back + fwd * fwd) - src[j])
                neg_residual[j] = -residual
                lower[j] = -nu * inv_dx2 - lam * back / dx
                upper[j] = -nu * inv_dx2 + lam * fwd / dx
                diag[j] = 1.0 / dt + 2.0 * nu * inv_dx2 + lam * (back - fwd) / dx
            if periodic:
                _cyclic_thomas(lower, diag, upper, neg_residual, modified, sm_u, c_prime, update, z)
            else:
                # a reflecting wall's ghost is the interior neighbour: fold its entry onto that one
                upper[0] = upper[0] + lower[0]
                lower[0] = 0.0
                lower[n - 1] = lower[n - 1] + upper[n - 1]
                upper[n - 1] = 0.0
                _thomas(lower, diag, upper, neg_residual, c_prime, update)
            largest = 0.0
            for j in range(n):
                u[j] = u[j] + update[j]
                largest = max(largest, abs(update[j]))
            iterations[step] = k
            if largest < tol:
                converged[step] = True
                break
        U[step] = u
    return U, iterations, converged


def solve_numba(problem: HJBProblem) -> dict[str, np.ndarray]:
    U, iterations, converged = _backward_sweep(
        np.ascontiguousarray(problem.g, dtype=np.float64), np.ascontiguousarray(step_source(problem)),
        problem.dt, problem.dx, problem.nu, problem.lam, problem.boundary == "periodic",
        problem.newton_tol, problem.newton_max)
    return {"U": U, "newton_iterations": iterations, "converged": converged}
