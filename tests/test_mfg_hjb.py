"""The backward HJB solver ``mfg.hjb_fdm``: a manufactured solution, backend agreement, bad input.

The manufactured solution picks a smooth U* and solves for the density that
makes it exact: with V = 0 and f(m) = log m, ``-U*_t - nu U*_xx + lam/2 U*_x^2
= log M``, so ``M = exp(-U*_t - nu U*_xx + lam/2 U*_x^2)`` on the grid and
``g = U*(T)``. The scheme is first order in dt and dx (implicit Euler,
upwind Hamiltonian), so halving both should about halve the error.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.errors import ProblemError
from plugins.mfg.hjb.numba_kernel import solve_numba
from plugins.mfg.hjb.reference import cyclic_thomas, newton_summary, solve_numpy, thomas
from plugins.mfg.problem import HJBProblem

SIGMA, LAM, T = 0.5, 1.0, 1.0

# U* = a(t) cos(k x) on [0, 1]: periodic with k = 2 pi; k = pi has U*_x = 0 at both walls (reflecting).
# a(t) = 0.3 (1 + sin(pi t)) is curved in time, so the implicit Euler error is exercised too.
WAVENUMBER = {"periodic": 2 * math.pi, "reflecting": math.pi}
GRIDS = {"periodic": (25, 50, 100), "reflecting": (26, 51, 101)}  # dx = 1/25, 1/50, 1/100 on both
FINEST_ERROR_BOUND = {"periodic": 0.1, "reflecting": 0.025}  # measured 0.094 and 0.019


def exact(boundary: str, t: np.ndarray, x: np.ndarray) -> dict[str, np.ndarray]:
    k = WAVENUMBER[boundary]
    tt, xx = np.meshgrid(t, x, indexing="ij")
    a, a_t = 0.3 * (1 + np.sin(np.pi * tt)), 0.3 * np.pi * np.cos(np.pi * tt)
    c, s = np.cos(k * xx), np.sin(k * xx)
    return {"U": a * c, "U_t": a_t * c, "U_x": -a * k * s, "U_xx": -a * k**2 * c}


def manufactured_problem(boundary: str, nx: int) -> tuple[HJBProblem, np.ndarray]:
    nt = nx - (boundary == "reflecting")  # dt = dx
    grid = HJBProblem(preset="towel_beach", xmin=0.0, xmax=1.0, Nx=nx, Nt=nt, T=T, boundary=boundary)
    u = exact(boundary, grid.t, grid.x)
    nu = SIGMA**2 / 2
    log_m = -u["U_t"] - nu * u["U_xx"] + 0.5 * LAM * u["U_x"] ** 2
    problem = HJBProblem(preset="towel_beach", xmin=0.0, xmax=1.0, Nx=nx, Nt=nt, T=T, boundary=boundary,
                         sigma=SIGMA, lam=LAM, congestion="log", congestion_coef=1.0, V=np.zeros(nx),
                         g=u["U"][-1], M=np.exp(log_m))
    return problem, u["U"]


@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
def test_manufactured_solution_converges_at_first_order(boundary):
    errors, steps = [], []
    for nx in GRIDS[boundary]:
        problem, truth = manufactured_problem(boundary, nx)
        out = solve_numpy(problem)
        assert out["converged"].all()
        errors.append(float(np.max(np.abs(out["U"] - truth))))
        steps.append(problem.dx)
    orders = [math.log(errors[i] / errors[i + 1]) / math.log(steps[i] / steps[i + 1]) for i in range(len(errors) - 1)]
    print(f"\n{boundary}: Nx={GRIDS[boundary]}, max errors " + ", ".join(f"{e:.3e}" for e in errors)
          + "; observed orders " + ", ".join(f"{p:.2f}" for p in orders))
    assert all(p >= 0.8 for p in orders), orders
    assert errors[-1] < FINEST_ERROR_BOUND[boundary]


def test_thomas_and_cyclic_solves_match_dense_algebra():
    rng = np.random.default_rng(3)
    n = 9
    lower, upper = -rng.random(n), -rng.random(n)
    diag = 2.5 + rng.random(n)
    rhs = rng.standard_normal(n)
    dense = np.diag(diag) + np.diag(lower[1:], -1) + np.diag(upper[:-1], 1)
    np.testing.assert_allclose(thomas(lower, diag, upper, rhs), np.linalg.solve(dense, rhs), rtol=0, atol=1e-13)
    dense[0, -1], dense[-1, 0] = lower[0], upper[-1]
    np.testing.assert_allclose(cyclic_thomas(lower, diag, upper, rhs), np.linalg.solve(dense, rhs), rtol=0, atol=1e-13)


@pytest.mark.parametrize("preset", ["towel_beach", "lq"])
def test_numba_agrees_with_numpy(preset):
    problem = HJBProblem(preset=preset)
    a, b = solve_numpy(problem), solve_numba(problem)
    assert b["U"].shape == (problem.Nt + 1, problem.Nx)
    np.testing.assert_allclose(b["U"], a["U"], rtol=0, atol=1e-10)
    np.testing.assert_array_equal(b["newton_iterations"], a["newton_iterations"])
    np.testing.assert_array_equal(b["converged"], a["converged"])


@pytest.mark.parametrize("preset", ["towel_beach", "lq", "crowd"])
def test_newton_converges_on_every_step_of_the_presets(preset):
    problem = HJBProblem(preset=preset)
    for out in (solve_numpy(problem), solve_numba(problem)):
        summary = newton_summary(out)
        assert out["converged"].shape == (problem.Nt,) and summary["newton_converged"]
        assert 1 <= summary["newton_iterations_max"] <= 8  # Newton: a handful, far below newton_max
        assert np.all(np.isfinite(out["U"]))
        np.testing.assert_array_equal(out["U"][-1], problem.g)


def test_newton_reports_non_convergence():
    problem = HJBProblem(preset="towel_beach", newton_max=1)
    for out in (solve_numpy(problem), solve_numba(problem)):
        assert not newton_summary(out)["newton_converged"]
        assert newton_summary(out)["newton_iterations_max"] == 1


def test_features_and_memory():
    from plugins.mfg.specs import HJB_FDM

    problem = HJBProblem(Nx=101, Nt=100, newton_tol=1e-8)  # 8 digits: 3 Newton iterations a step expected
    assert HJB_FDM.features(problem) == {"newton_grid_steps": 101 * 300, "cyclic_newton_grid_steps": 101 * 300,
                                         "newton_iterations": 300, "steps": 100}
    reflecting = HJBProblem(Nx=101, Nt=100, boundary="reflecting")
    assert HJB_FDM.features(reflecting)["cyclic_newton_grid_steps"] == 0
    assert HJB_FDM.features(HJBProblem(Nx=101, Nt=100, newton_max=2))["newton_iterations"] == 200  # the cap
    for backend in HJB_FDM.implementations:
        assert HJB_FDM.memory(problem, backend) >= 4 * 8 * 101 * 101


def test_a_solve_records_the_newton_iterations_it_ran():
    """work_done counts the iterations of every step, which a tighter tolerance raises."""
    from plugins.mfg.specs import HJB_FDM

    counts = []
    for tol in (1e-4, 1e-12):
        problem = HJBProblem(preset="crowd", Nx=101, Nt=50, newton_tol=tol)
        out = solve_numba(problem)
        done = HJB_FDM.work_done(problem, out)
        ran = int(np.sum(out["newton_iterations"]))
        assert done["newton_iterations"] == ran and done["newton_grid_steps"] == 101 * ran
        counts.append(ran)
    assert counts[0] < counts[1]


@pytest.mark.parametrize("bad, shown", [
    (lambda m: np.where(np.arange(m.size).reshape(m.shape) == 7, np.nan, m), "NaN"),
    (lambda m: m[:, :-1], "shape"),
    (lambda m: m - 2 * m.max(), "non-negative"),
])
def test_bad_density_is_refused_naming_M(bad, shown):
    m = np.tile(HJBProblem().m0, (HJBProblem().Nt + 1, 1))
    with pytest.raises(ProblemError, match=rf"^M=.*{shown}"):
        HJBProblem(M=bad(m))


# -- torch -------------------------------------------------------------------

def shifted_batch(problem: HJBProblem, shifts) -> tuple[np.ndarray, np.ndarray]:
    """K potentials and densities: the problem's own, rolled along x by a different amount each."""
    V = np.stack([np.roll(problem.potential(), s, axis=1) for s in shifts])
    M = np.stack([np.roll(problem.M, -s, axis=1) * (1 + 0.1 * i) for i, s in enumerate(shifts)])
    return V, M


def check_torch_against_numpy(device) -> None:
    from plugins.mfg.hjb.torch_kernel import solve_torch, solve_torch_batch

    for preset in ("towel_beach", "lq", "crowd"):  # periodic and reflecting; log and linear congestion
        problem = HJBProblem(preset=preset, Nx=41, Nt=30)
        one = solve_torch(problem, device=device)
        ref = solve_numpy(problem)
        assert np.max(np.abs(one["U"] - ref["U"])) < 1e-8
        np.testing.assert_array_equal(one["newton_iterations"], ref["newton_iterations"])
        assert one["converged"].all()

        V, M = shifted_batch(problem, [0, 3, 11])
        U = solve_torch_batch(problem, V, M, device=device).cpu().numpy()
        assert U.shape == (3, problem.Nt + 1, problem.Nx)
        for k in range(3):
            single = HJBProblem(preset=preset, Nx=41, Nt=30, V_t=V[k], M=M[k])
            assert np.max(np.abs(U[k] - solve_numpy(single)["U"])) < 1e-8


def test_torch_kernel_imports_without_torch():
    import plugins.mfg.hjb.torch_kernel as kernel

    assert callable(kernel.solve_torch_batch) and callable(kernel.solve_torch)


def test_torch_kernel_on_cpu_torch_matches_numpy():
    torch = pytest.importorskip("torch")
    check_torch_against_numpy(torch.device("cpu"))


def test_torch_batch_refuses_a_wrong_shape():
    torch = pytest.importorskip("torch")
    from plugins.mfg.hjb.torch_kernel import solve_torch_batch

    problem = HJBProblem(Nx=11, Nt=4)
    V, M = shifted_batch(problem, [0, 1])
    with pytest.raises(ProblemError, match=r"^M_batch="):
        solve_torch_batch(problem, V, M[:, :, :-1], device=torch.device("cpu"))


@pytest.mark.gpu
def test_torch_on_gpu_matches_numpy():
    from core.backends.torch_gpu import device

    check_torch_against_numpy(device())
