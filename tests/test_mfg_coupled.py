"""The coupled MFG, common noise and sweeps against independent truths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sweep_targets

import core
from plugins.mfg.common_noise import solve_parallel, solve_serial
from plugins.mfg.coupling import solve_fixed_point
from plugins.mfg.problem import LQ_STIFFNESS, CommonNoiseProblem, MFGProblem, lq_ergodic


def l1(problem, a, b) -> float:
    return float(np.sum(np.abs(a - b) * problem.weights()))


@pytest.mark.parametrize("preset", ["towel_beach", "lq"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_fixed_point_converges(preset, backend):
    p = MFGProblem(preset=preset, N=10_000, Nt=30)
    out = solve_fixed_point(p, steps=backend)
    assert bool(out["converged"])
    last = out["history"][-1]
    # converged means the allclose rule held at the last iteration, for U and for M
    assert last[0] <= p.atol + p.rtol * last[0] / last[1] and last[2] <= p.atol + p.rtol * last[2] / last[3]
    assert np.allclose(out["M"] @ p.weights(), 1.0, atol=1e-12)  # damping keeps the mass


def test_a_run_that_did_not_converge_is_not_reported_as_converged():
    out = solve_fixed_point(MFGProblem(preset="towel_beach", N=5_000, Nt=20, max_iter=2), steps="numba")
    assert not bool(out["converged"]) and int(out["iterations"]) == 2


def test_numba_agrees_with_numpy_in_distribution():
    p = MFGProblem(preset="lq", N=40_000, Nt=30)
    a, b = solve_fixed_point(p, steps="numpy"), solve_fixed_point(p, steps="numba")
    assert l1(p, a["M"][-1], b["M"][-1]) < 0.05  # 4x the KDE noise of two 40k-particle estimates
    # U only where agents are: with log congestion an empty cell's cost is log of a noisy near-zero count
    crowded = a["M"] > 0.05 * a["M"].max()
    assert np.max(np.abs(a["U"] - b["U"])[crowded]) < 0.05 * np.max(np.abs(a["U"]))


def ergodic_gaussian(problem: MFGProblem) -> np.ndarray:
    _, variance = lq_ergodic(problem.sigma, problem.lam, LQ_STIFFNESS, problem.congestion_coef)
    return np.exp(-0.5 * problem.x**2 / variance) / math.sqrt(2 * math.pi * variance)


def test_lq_density_approaches_the_ergodic_gaussian():
    """Over a long horizon the mid-time density is the closed-form Gaussian (docs/mfg.md derives it)."""
    errors = []
    for horizon, steps in ((3.0, 90), (6.0, 180)):
        p = MFGProblem(preset="lq", T=horizon, Nt=steps, N=40_000, Nx=61)
        out = solve_fixed_point(p, steps="numba")
        assert bool(out["converged"])
        errors.append(l1(p, out["M"][steps // 2], ergodic_gaussian(p)))
    assert errors[1] < errors[0] and errors[1] < 0.04


def test_lq_started_at_the_ergodic_state_stays_there():
    base = MFGProblem(preset="lq", Nx=61)
    a, variance = lq_ergodic(base.sigma, base.lam, LQ_STIFFNESS, base.congestion_coef)
    p = MFGProblem(preset="lq", Nx=61, Nt=40, N=40_000, m0=np.exp(-0.5 * base.x**2 / variance), g=0.5 * a * base.x**2)
    out = solve_fixed_point(p, steps="numba")
    assert max(l1(p, row, ergodic_gaussian(p)) for row in out["M"]) < 0.04


@pytest.mark.parametrize("runner", ["numpy", "numba", "process"])
def test_common_noise_with_one_path_and_no_noise_is_the_deterministic_solve(runner):
    cn = CommonNoiseProblem(preset="lq", K=1, noise=0.0, N=5_000, Nt=20)
    conditional = MFGProblem(**{name: getattr(cn, name) for name in MFGProblem.__dataclass_fields__})
    deterministic = solve_fixed_point(conditional, steps="numba" if runner == "process" else runner)
    out = solve_parallel(cn, backend="process") if runner == "process" else solve_serial(cn, steps=runner)
    np.testing.assert_array_equal(out["M_mean"], deterministic["M"])
    np.testing.assert_array_equal(out["U_mean"], deterministic["U"])
    assert np.all(out["M_std"] == 0) and np.all(out["theta"] == 0)


def test_common_noise_paths_are_in_order_and_independent_of_workers():
    cn = CommonNoiseProblem(preset="lq", K=5, noise=0.3, N=2_000, Nt=20)
    serial, parallel = solve_serial(cn, steps="numba"), solve_parallel(cn, backend="process")
    for name in ("theta", "M_mean", "U_std", "M_quantiles"):
        np.testing.assert_array_equal(serial[name], parallel[name])
    assert len({row[5] for row in serial["theta"]}) == 5  # five different paths
    q = serial["M_quantiles"]
    assert q.shape == (3, cn.Nt + 1, cn.Nx) and np.all(q[0] <= q[1] + 1e-15) and np.all(q[1] <= q[2] + 1e-15)
    assert np.allclose(serial["M_mc_error"], serial["M_std"] / math.sqrt(5))


def test_ou_path_has_the_stationary_variance():
    """Exact OU transitions: at long times Var(theta) = noise^2 / (2 kappa), within 4 standard errors."""
    from plugins.mfg.common_noise import ou_path

    cn = CommonNoiseProblem(preset="lq", K=1, kappa=2.0, noise=0.5, T=20.0, Nt=200)
    seeds = np.random.SeedSequence(11).spawn(400)
    finals = np.array([ou_path(cn, s)[-1] for s in seeds])
    target = 0.5**2 / (2 * 2.0)
    assert abs(finals.var(ddof=1) - target) < 4 * target * math.sqrt(2 / 399)


@pytest.mark.parametrize("implementation", ["numba", "torch:hjb_host", "torch:hjb_device"])
def test_every_route_times_each_of_its_paths(monkeypatch, implementation):
    """``path_seconds`` is a finite, positive time per path whichever route ran the paths (issue 21: NaN on torch).

    CPU torch stands in for the GPU, as in tests/test_multi_gpu.py: the
    batched route's bookkeeping is the same on either device.
    """
    import time

    from core.backends import torch_gpu
    from core.result import Result, as_arrays
    from plugins.mfg.specs import COMMON_NOISE

    if implementation.startswith("torch"):
        torch = pytest.importorskip("torch")
        from plugins.mfg.fp import torch_kernel as fp_torch
        from plugins.mfg.hjb import torch_kernel as hjb_torch

        for module in (fp_torch, hjb_torch):
            monkeypatch.setattr(module, "gpu_device", lambda: torch.device("cpu"))
        monkeypatch.setattr(torch_gpu, "free_for_batches", lambda: None)
        monkeypatch.setattr(torch_gpu, "gpu_count", lambda devices=None: 1)
    problem = CommonNoiseProblem(preset="lq", K=3, N=500, Nx=21, Nt=5, max_iter=2, seed=3)
    started = time.perf_counter()
    outputs = as_arrays(COMMON_NOISE.implementations[implementation](problem))
    wall = time.perf_counter() - started
    seconds = outputs["path_seconds"]
    assert seconds.shape == (3,) and np.all(np.isfinite(seconds)) and np.all(seconds > 0), seconds
    assert seconds.sum() <= wall  # one process ran the paths, one after another or as one batch
    assert Result("mfg.common_noise", implementation, wall, outputs).diagnostics["non_finite_outputs"] == []


@pytest.mark.parametrize(("fields", "message"), [
    ({"damping_U": 0.0}, "damping_U=0.0 is invalid: must be a finite number > 0 and <= 1"),
    ({"damping_M": 1.5}, "damping_M=1.5 is invalid"),
    ({"max_iter": 0}, "max_iter=0 is invalid"),
    ({"K": 0}, "K=0 is invalid: must be an integer >= 1"),
    ({"noise": -1.0}, "noise=-1.0 is invalid"),
    ({"quantiles": (0.5, 2.0)}, "quantiles=(0.5, 2.0) is invalid: must be numbers in [0, 1]"),
])
def test_bad_coupled_input(fields, message):
    with pytest.raises(core.ProblemError, match=None) as caught:
        CommonNoiseProblem(**fields)
    assert message in str(caught.value)


def test_sweep_keeps_order_and_records_failures():
    points = core.sweep(sweep_targets.fragile, {"x": [1, 2, 3, 4, 5, 6]}, backend="process", workers=2)
    assert [p.params["x"] for p in points] == [1, 2, 3, 4, 5, 6]
    assert [p.outputs["y"] for p in points if p.ok] == [1, 4, 16, 36]
    assert points[2].error == "ValueError: three is not allowed"
    assert points[4].error.startswith("worker process died")


def test_sweep_of_a_solver_serially_and_on_the_pool():
    grid = [{"preset": "lq", "N": 2_000, "Nt": 10}, {"preset": "lq", "N": 2_000, "Nt": 0}]
    for backend in ("numba", "process"):
        points = core.sweep("mfg.fixed_point", grid, backend=backend)
        assert points[0].ok and bool(points[0].outputs["converged"])
        assert "Nt=0 is invalid" in points[1].error


def test_sweep_cartesian_grid_order():
    points = core.sweep(sweep_targets.square, {"x": [1, 2], "y_unused": [0]} if False else {"x": [3, 1, 2]},
                        backend="numpy")
    assert [p.outputs["y"] for p in points] == [9, 1, 4]
    with pytest.raises(core.CrossoverError, match=r"grid\['x'\]=3 is invalid: must be a list of values"):
        core.sweep(sweep_targets.square, {"x": 3})


def test_held_out_sizes_rebuild_grid_arrays():
    """Held-out problems move Nx across the space, and each one re-derives the preset's arrays."""
    from core.costmodel.design import held_out_problems

    spec = core.solvers()["mfg.hjb_fdm"]
    problems = held_out_problems(spec)
    assert len({p.Nx for p in problems}) >= 4 and len({p.Nt for p in problems}) >= 4
    assert all(p.V.shape == (p.Nx,) and p.M.shape == (p.Nt + 1, p.Nx) for p in problems)


def test_sweep_rejects_unknown_names_up_front():
    with pytest.raises(core.UnknownSolverError, match=r"unknown solver 'mfg\.nope'"):
        core.sweep("mfg.nope", {"N": [1, 2]})
    with pytest.raises(core.UnknownBackendError, match="unknown backend 'gpu'"):
        core.sweep("mfg.fixed_point", {"N": [1, 2]}, backend="gpu")
    with pytest.raises(core.CrossoverError, match="target=3 is invalid"):
        core.sweep(3, {"N": [1]})


def test_each_problem_type_reaches_its_own_solver():
    from core.api import find_solver
    from plugins.mfg.problem import FPProblem, HJBProblem

    names = {type(p).__name__: find_solver(p).name for p in
             (FPProblem(N=10), HJBProblem(), MFGProblem(N=10), CommonNoiseProblem(N=10))}
    assert names == {"FPProblem": "mfg.fp_particle", "HJBProblem": "mfg.hjb_fdm",
                     "MFGProblem": "mfg.fixed_point", "CommonNoiseProblem": "mfg.common_noise"}


def test_a_solve_that_converges_early_records_the_iterations_it_ran():
    """History samples of real solves count the Picard iterations run, not max_iter."""
    import core
    from core.costmodel.history import sample_record

    spec = core.solvers()["mfg.fixed_point"]
    problem = MFGProblem(preset="lq", N=2_000, Nt=10, Nx=31, max_iter=60)
    outputs = core.solve(problem, backend="numba", solver=spec.name).outputs
    ran = int(outputs["iterations"])
    assert bool(outputs["converged"]) and ran < problem.max_iter
    planned = spec.features(problem)
    recorded = sample_record(spec, "numba", problem, 0.1, "solve", outputs)["features"]
    assert recorded["iterations"] == ran and planned["iterations"] == problem.max_iter
    assert recorded["particle_steps"] == pytest.approx(planned["particle_steps"] * ran / problem.max_iter)
