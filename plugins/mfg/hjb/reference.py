"""NumPy reference of the backward HJB solver ``mfg.hjb_fdm``.

The equation, with ``nu = sigma**2/2`` and ``H = lam/2 p**2 - V - f(m)``::

    -dU/dt - nu U_xx + H(x, U_x, m) = 0,   U(T, x) = g(x)

is stepped backward by implicit Euler. For n = Nt-1 down to 0, U^n solves::

    (U^n - U^{n+1})/dt - nu D2 U^n + lam/2 [max(Dm U^n, 0)^2 + min(Dp U^n, 0)^2] - V^n - f(M^n) = 0

with Godunov's upwind Hamiltonian (``Dm``/``Dp`` backward/forward
differences, ``D2`` the 3-point Laplacian). V and M are taken at level n,
the level being solved for (fully implicit), so that the stationary problem
is a fixed point of one step. Each step is solved by Newton's method from
U^{n+1}; each Newton iteration is one tridiagonal solve (periodic: cyclic
tridiagonal, by Sherman-Morrison on top of two Thomas solves).

Boundaries: periodic indices wrap (no duplicate end point, ``dx = L/Nx``);
reflecting uses the homogeneous-Neumann ghosts ``U_{-1} = U_1`` and
``U_{Nx} = U_{Nx-2}`` (``dx = L/(Nx-1)``).

The array helpers below work on the last axis and treat any leading axes as
a batch, so the torch kernel (batched over K instances) mirrors them line by
line.
"""

from __future__ import annotations

import numpy as np

from plugins.mfg.problem import HJBProblem


def thomas(lower: np.ndarray, diag: np.ndarray, upper: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve tridiagonal systems along the last axis (no pivoting: the matrix is diagonally dominant).

    Row j reads ``lower[j] x[j-1] + diag[j] x[j] + upper[j] x[j+1] = rhs[j]``;
    ``lower[..., 0]`` and ``upper[..., -1]`` are ignored. Leading axes are a
    batch, vectorised over; the coefficients broadcast against ``rhs``. The
    sweep along x is a recurrence, so it is a Python loop either way; one
    system alone runs it on Python floats, several times faster than on
    0-d numpy values.
    """
    if lower.ndim == diag.ndim == upper.ndim == rhs.ndim == 1:
        try:
            return np.array(_sweep(lower.tolist(), diag.tolist(), upper.tolist(), rhs.tolist()))
        except ZeroDivisionError:  # a pivot lost to rounding: NumPy's rows give inf/NaN, which the Result flags
            pass
    # sweep along the first axis of transposed views: a[j] indexes faster than a[..., j]
    a, b, c = (np.moveaxis(v, -1, 0) for v in np.broadcast_arrays(lower, diag, upper))
    return np.moveaxis(np.stack(np.broadcast_arrays(*_sweep(a, b, c, np.moveaxis(rhs, -1, 0)))), 0, -1)


def _sweep(a, b, c, d) -> list:
    """The Thomas recurrence over the first index: Python floats for one system, array rows for a batch."""
    n = len(b)
    c_prime = [c[0] / b[0]] + [0.0] * (n - 1)
    x = [d[0] / b[0]] + [0.0] * (n - 1)
    for j in range(1, n):
        pivot = b[j] - a[j] * c_prime[j - 1]
        c_prime[j] = c[j] / pivot
        x[j] = (d[j] - a[j] * x[j - 1]) / pivot
    for j in range(n - 2, -1, -1):
        x[j] = x[j] - c_prime[j] * x[j + 1]
    return x


def cyclic_thomas(lower: np.ndarray, diag: np.ndarray, upper: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Solve cyclic tridiagonal systems along the last axis (n >= 3) by Sherman-Morrison.

    As :func:`thomas`, plus the corners ``A[0, n-1] = lower[0]`` and
    ``A[n-1, 0] = upper[n-1]``. With ``gamma = -diag[0]`` the matrix is
    ``B + u v^T``, ``u = (gamma, 0, ..., 0, upper[n-1])``,
    ``v = (1, 0, ..., 0, lower[0]/gamma)``, and ``B`` tridiagonal; two
    Thomas solves ``B y = rhs``, ``B z = u`` give
    ``x = y - z (v.y)/(1 + v.z)``. Subtracting ``gamma < 0`` keeps ``B``
    diagonally dominant.
    """
    beta = lower[..., 0]  # A[0, n-1]
    alpha = upper[..., -1]  # A[n-1, 0]
    gamma = -diag[..., 0]
    modified = diag.copy()
    modified[..., 0] = diag[..., 0] - gamma
    modified[..., -1] = diag[..., -1] - alpha * beta / gamma
    u = np.zeros(np.broadcast_shapes(diag.shape, rhs.shape))
    u[..., 0] = gamma
    u[..., -1] = alpha
    y = thomas(lower, modified, upper, rhs)
    z = thomas(lower, modified, upper, u)
    factor = (y[..., 0] + beta * y[..., -1] / gamma) / (1.0 + z[..., 0] + beta * z[..., -1] / gamma)
    return y - factor[..., None] * z


def neighbours(u: np.ndarray, periodic: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(U_{j-1}, U_{j+1})`` along the last axis: wrapped, or Neumann ghosts U_{-1}=U_1, U_{n}=U_{n-2}."""
    if periodic:
        return np.roll(u, 1, axis=-1), np.roll(u, -1, axis=-1)
    left = np.concatenate([u[..., 1:2], u[..., :-1]], axis=-1)
    right = np.concatenate([u[..., 1:], u[..., -2:-1]], axis=-1)
    return left, right


def residual_and_jacobian(u: np.ndarray, u_next: np.ndarray, source: np.ndarray, dt: float, dx: float,
                          nu: float, lam: float, periodic: bool, neighbours=neighbours):
    """The step's residual F(u) and its tridiagonal Jacobian ``(lower, diag, upper)``.

    ``source`` is ``V^n + f(M^n)``. With ``a = max(Dm u, 0)`` and
    ``b = min(Dp u, 0)``, row j of the Jacobian is
    ``dF/du_{j-1} = -nu/dx^2 - lam a/dx``,
    ``dF/du_j = 1/dt + 2 nu/dx^2 + lam (a - b)/dx``,
    ``dF/du_{j+1} = -nu/dx^2 + lam b/dx``. At a reflecting wall the ghost is
    the interior neighbour, so its entry folds onto that neighbour's.

    Only arithmetic, ``clip`` and item assignment are used, so the torch
    kernel calls this same function on tensors, passing its own
    ``neighbours``.
    """
    left, right = neighbours(u, periodic)
    back = ((u - left) / dx).clip(min=0.0)
    fwd = ((right - u) / dx).clip(max=0.0)
    residual = ((u - u_next) / dt - nu * (left - 2.0 * u + right) / dx**2
                + 0.5 * lam * (back * back + fwd * fwd) - source)
    lower = -nu / dx**2 - lam * back / dx
    upper = -nu / dx**2 + lam * fwd / dx
    diag = 1.0 / dt + 2.0 * nu / dx**2 + lam * (back - fwd) / dx
    if not periodic:
        upper[..., 0] = upper[..., 0] + lower[..., 0]
        lower[..., 0] = 0.0
        lower[..., -1] = lower[..., -1] + upper[..., -1]
        upper[..., -1] = 0.0
    return residual, lower, diag, upper


def step_source(problem: HJBProblem) -> np.ndarray:
    """``V(t_n, x) + f(M^n)`` on the space-time grid (Nt+1, Nx): the running cost each step uses."""
    return problem.potential() + problem.congestion_cost(problem.M)


def solve_numpy(problem: HJBProblem) -> dict[str, np.ndarray]:
    """U on the space-time grid, the Newton iterations of every step and whether each converged."""
    periodic = problem.boundary == "periodic"
    linear_solve = cyclic_thomas if periodic else thomas
    dt, dx, nu, lam = problem.dt, problem.dx, problem.nu, problem.lam
    source = step_source(problem)
    U = np.empty((problem.Nt + 1, problem.Nx))
    U[-1] = problem.g
    iterations = np.zeros(problem.Nt, dtype=np.int64)
    converged = np.zeros(problem.Nt, dtype=bool)
    for n in range(problem.Nt - 1, -1, -1):
        u = U[n + 1].copy()  # Newton starts from the later time level
        for k in range(1, problem.newton_max + 1):
            # V and M at level n, the level being solved for (implicit)
            residual, lower, diag, upper = residual_and_jacobian(u, U[n + 1], source[n], dt, dx, nu, lam, periodic)
            update = linear_solve(lower, diag, upper, -residual)
            u += update
            iterations[n] = k
            if np.max(np.abs(update)) < problem.newton_tol:
                converged[n] = True
                break
        U[n] = u
    return {"U": U, "newton_iterations": iterations, "converged": converged}


def newton_summary(outputs: dict) -> dict:
    """The worst Newton iteration count over the steps, and whether every step converged."""
    return {"newton_iterations_max": int(np.max(outputs["newton_iterations"], initial=0)),
            "newton_converged": bool(np.all(outputs["converged"]))}
