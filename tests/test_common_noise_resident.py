"""``mfg.common_noise``'s ``torch:resident``: the whole fixed point on the device, against the host's answers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from plugins.mfg import work
from plugins.mfg.common_noise import batch_paths, conditional_problem, path_task, shifted_potential
from plugins.mfg.coupling import picard_batch
from plugins.mfg.problem import CommonNoiseProblem, FPProblem, HJBProblem
from plugins.mfg.specs import COMMON_NOISE


def l2(problem, values) -> float:
    return float(np.sqrt(np.sum(values**2 * problem.weights()) * problem.dt))


# -- CPU ------------------------------------------------------------------------------


def test_one_interp_call_for_every_path_gives_each_paths_potential():
    for boundary in ("periodic", "reflecting"):
        problem = CommonNoiseProblem(preset="lq", boundary=boundary, K=5, Nx=21, Nt=8, noise=0.5)
        thetas = batch_paths(problem, range(problem.K))
        each = np.stack([np.stack([shifted_potential(problem, theta[n:n + 1])[0] for n in range(problem.Nt + 1)])
                         for theta in thetas])
        np.testing.assert_array_equal(shifted_potential(problem, thetas), each)


def test_the_device_drift_table_is_the_hosts_bit_for_bit():
    torch = pytest.importorskip("torch")
    from plugins.mfg.fp.common import drift_table
    from plugins.mfg.fp.torch_kernel import device_drift_table

    for boundary in ("periodic", "reflecting"):
        problem = FPProblem(preset="towel_beach", boundary=boundary, Nx=21, Nt=5)
        U = np.random.default_rng(1).standard_normal((3, 6, 21))
        on_host = np.stack([drift_table(problem, u) for u in U])
        np.testing.assert_array_equal(device_drift_table(problem, torch.as_tensor(U)).numpy(), on_host)


def test_the_device_fixed_point_is_the_host_loop_given_the_same_steps():
    """``picard_batch_device`` on CPU torch with numba's steps: the host loop's iterates, iteration for iteration.

    The paths' potentials differ, so they stop after different counts and the
    device loop compacts the live paths; the steps are deterministic (common
    random numbers), so only the loops' bookkeeping could differ.
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("numba")
    from plugins.mfg.coupling import picard_batch_device
    from plugins.mfg.fp.numba_kernel import solve_particles
    from plugins.mfg.hjb.numba_kernel import solve_numba

    problem = CommonNoiseProblem(preset="lq", K=4, N=2_000, Nx=21, Nt=10, noise=0.6, seed=5)
    conditional = conditional_problem(problem)
    fields = conditional.model_fields()
    V = shifted_potential(problem, batch_paths(problem, range(problem.K)))

    def hjb(v, m):
        return np.stack([solve_numba(HJBProblem(**fields, M=mk, V_t=vk))["U"] for vk, mk in zip(v, m)])

    def fp(u):
        return np.stack([solve_particles(FPProblem(**fields, U=uk), fused=True)["M"] for uk in u])

    host = picard_batch(conditional, hjb, fp, V)
    device = picard_batch_device(conditional, lambda v, m: torch.as_tensor(hjb(v.numpy(), m.numpy())),
                                 lambda u: torch.as_tensor(fp(u.numpy())), torch.as_tensor(V))
    assert len(set(host["iterations"])) > 1  # the paths stopped at different iterations
    np.testing.assert_array_equal(device["iterations"], host["iterations"])
    np.testing.assert_array_equal(device["converged"], host["converged"])
    np.testing.assert_allclose(device["U"].numpy(), host["U"], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(device["M"].numpy(), host["M"], rtol=1e-13, atol=1e-13)


def test_resident_is_an_implementation_with_its_supports_and_memory():
    problem = CommonNoiseProblem(preset="lq", K=1_024, N=5_000)
    assert "torch:resident" in COMMON_NOISE.implementations
    # the same two kernels as torch:hjb_fused with the FP's all-steps kernel, so the same bytes per path
    assert COMMON_NOISE.memory(problem, "torch:resident") == work.fixed_point_memory(problem, "torch:hjb_fused") > 0
    silverman = CommonNoiseProblem(preset="lq", K=2, bandwidth="silverman")
    assert "silverman" in COMMON_NOISE.supports(silverman, "torch:resident")  # the FP's all-steps kernel cannot


# -- GPU ------------------------------------------------------------------------------

GPU_PROBLEM = {"preset": "lq", "K": 4, "N": 50_000, "Nt": 20, "seed": 2}


def numba_paths(problem: CommonNoiseProblem) -> list[dict]:
    from core import tasks

    return tasks.run_serially(path_task, [(problem, "numba")] * problem.K, seed=GPU_PROBLEM["seed"])


@pytest.mark.gpu
def test_resident_agrees_with_numba_within_the_particles_monte_carlo_noise():
    """Path by path against numba, at the tolerance a change of particle stream within numba gives.

    The GPU draws its particles from Philox, numba from NumPy's generator, so
    the two answers differ by Monte Carlo noise, never bit for bit. That
    noise is measured here: numba's paths again with another FP seed (the
    paths' own seeds unchanged). The GPU must sit within 3 times that
    distance (one draw of the noise against another), plus the fixed
    point's own stopping tolerance (each run stops within about rtol of its
    limit). Mass is exact: every step of M integrates to one.
    """
    from plugins.mfg.common_noise import solve_batch_resident

    problem = CommonNoiseProblem(**GPU_PROBLEM)
    gpu = solve_batch_resident(problem, True, range(problem.K))
    cpu = numba_paths(problem)
    other_stream = numba_paths(dataclasses.replace(problem, seed=problem.seed + 1))
    for g, c, o in zip(gpu, cpu, other_stream):
        np.testing.assert_array_equal(g["theta"], c["theta"])  # the same common-noise path
        np.testing.assert_array_equal(o["theta"], c["theta"])
        assert bool(g["converged"]) and bool(c["converged"])
        np.testing.assert_allclose(g["M"] @ problem.weights(), 1.0, rtol=0, atol=1e-12)
        for field in ("U", "M"):
            slack = 10 * problem.rtol * l2(problem, c[field])
            assert l2(problem, g[field] - c[field]) <= 3 * l2(problem, o[field] - c[field]) + slack, field


@pytest.mark.gpu
def test_resident_agrees_with_the_host_loop_of_the_same_kernels():
    # the same Triton HJB and FP launches, the drift table formed bit for bit alike: only where the
    # damping and the stop test run differs, so the iterations match and M agrees to the kernels' rounding
    problem = CommonNoiseProblem(**GPU_PROBLEM)
    resident = COMMON_NOISE.implementations["torch:resident"](problem)
    host_loop = COMMON_NOISE.implementations["torch:hjb_fused"](problem)
    np.testing.assert_array_equal(resident["iterations"], host_loop["iterations"])
    assert np.sum(np.abs(resident["M_mean"][-1] - host_loop["M_mean"][-1]) * problem.weights()) < 1e-6
    np.testing.assert_allclose(resident["U_mean"], host_loop["U_mean"], rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
def test_two_resident_runs_give_the_same_bits():
    # int64 deposits, smoothing by gathers, one HJB program per path: no result depends on the order of adds
    problem = CommonNoiseProblem(**{**GPU_PROBLEM, "K": 16, "N": 20_000})
    first = COMMON_NOISE.implementations["torch:resident"](problem)
    second = COMMON_NOISE.implementations["torch:resident"](problem)
    for name in ("U_mean", "M_mean", "U_quantiles", "M_quantiles", "iterations"):
        np.testing.assert_array_equal(first[name], second[name])
