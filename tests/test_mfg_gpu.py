"""MFG on the GPU: every torch implementation against the float64 CPU reference (run on the lent GPU machine).

The FP variants (``torch:fused``, the Triton kernel, and ``torch:eager``)
are called both directly and through the spec's lazy bindings, as the core
calls them; the coupled solvers' HJB variants (``torch:hjb_host``,
``torch:hjb_device``) against numba. The GPU tests carry the ``gpu``
marker; the int64 fixed-point helpers the GPU deposits share are also
checked on CPU torch, unmarked.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_mfg_fp import noise_l1, ou_problem

from plugins.mfg.fp.numba_kernel import solve_particles
from plugins.mfg.fp.reference import solve_numpy
from plugins.mfg.problem import CommonNoiseProblem, FPProblem, HJBProblem, MFGProblem
from plugins.mfg.specs import COMMON_NOISE, FIXED_POINT, FP_PARTICLE

FP_VARIANTS = ["torch:fused", "torch:eager"]


def host(outputs: dict) -> dict:
    return {k: (v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v)) for k, v in outputs.items()}


def driven(boundary: str, n: int, kde: str = "binned", bandwidth="scott") -> FPProblem:
    base = FPProblem(N=n, Nx=51, Nt=30, boundary=boundary, kde=kde, bandwidth=bandwidth)
    u = 0.2 * np.outer(base.T - base.t, np.cos(2 * np.pi * base.x))
    return FPProblem(N=n, Nx=51, Nt=30, boundary=boundary, kde=kde, bandwidth=bandwidth, U=u)


def l1(problem, a, b) -> float:
    return float(np.sum(np.abs(a - b) * problem.weights()))


@pytest.mark.gpu
def test_the_fused_kernel_runs_here():
    # on the GPU host every binned-KDE problem with Scott's rule is open to the Triton kernel
    from plugins.mfg.fp.torch_kernel import fused_unsupported

    assert fused_unsupported(driven("periodic", 1_000)) == ""
    assert FP_PARTICLE.supports(driven("reflecting", 1_000, bandwidth=0.03), "torch:fused") == ""


@pytest.mark.gpu
@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
@pytest.mark.parametrize("variant", FP_VARIANTS)
def test_torch_fp_agrees_with_numpy_in_distribution(boundary, variant):
    p = driven(boundary, 200_000)
    ref, out = solve_numpy(p), host(FP_PARTICLE.implementations[variant](p))
    assert str(out["path"]) == variant.split(":")[1]
    for n in (0, p.Nt // 2, p.Nt):
        assert l1(p, out["M"][n], ref["M"][n]) < 4 * noise_l1(ref["M"][n], ref["bandwidth"][n], p.N, p.weights())
    assert np.max(np.abs(out["mass"] - 1)) < 1e-12  # exact int64 deposits, then float64 smoothing


@pytest.mark.gpu
@pytest.mark.parametrize(("kde", "bandwidth"), [("direct", "scott"), ("binned", "silverman"), ("binned", 0.03)])
def test_torch_eager_kde_variants(kde, bandwidth):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p = driven("periodic", 20_000, kde=kde, bandwidth=bandwidth)
    ref, out = solve_numpy(p), host(solve_torch(p, fused=False))
    assert l1(p, out["M"][-1], ref["M"][-1]) < 4 * noise_l1(ref["M"][-1], ref["bandwidth"][-1], p.N, p.weights()) + 0.01
    assert abs(out["bandwidth"][-1] - ref["bandwidth"][-1]) < 0.05 * ref["bandwidth"][-1]


@pytest.mark.gpu
@pytest.mark.parametrize(("kde", "bandwidth"), [("direct", "scott"), ("binned", "silverman")])
def test_the_fused_variant_refuses_what_it_cannot_run(kde, bandwidth):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p = driven("periodic", 1_000, kde=kde, bandwidth=bandwidth)
    assert FP_PARTICLE.supports(p, "torch:fused")
    with pytest.raises(ValueError, match="fused torch FP cannot run"):
        solve_torch(p, fused=True)


@pytest.mark.gpu
def test_fused_with_a_fixed_bandwidth_agrees_with_numpy():
    p = driven("reflecting", 100_000, bandwidth=0.03)
    ref, out = solve_numpy(p), host(FP_PARTICLE.implementations["torch:fused"](p))
    assert l1(p, out["M"][-1], ref["M"][-1]) < 4 * noise_l1(ref["M"][-1], 0.03, p.N, p.weights())
    np.testing.assert_allclose(out["bandwidth"], 0.03)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_torch_ou_moments(fused):
    from plugins.mfg.fp.torch_kernel import solve_torch

    p, theta, c, sigma = ou_problem(1_000_000)
    out = host(solve_torch(p, fused=fused))
    mean0 = float(np.sum(p.x * p.m0 * p.weights()))
    var0 = float(np.sum((p.x - mean0) ** 2 * p.m0 * p.weights())) + p.dx**2 / 12
    decay = math.exp(-theta * p.T)
    mean_t, var_t = c + (mean0 - c) * decay, var0 * decay**2 + sigma**2 / (2 * theta) * (1 - decay**2)
    mean, var = out["moments"][-1]
    assert abs(mean - mean_t) < 4 * math.sqrt(var_t / p.N) + 1e-5  # + float32 positions
    assert abs(var - var_t) < 4 * var_t * math.sqrt(2 / (p.N - 1)) + 2e-4


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_fp_batch_equals_single_solves(fused):
    from plugins.mfg.fp.torch_kernel import solve_torch, solve_torch_batch

    p = driven("periodic", 50_000)
    us = np.stack([p.U, 2 * p.U, np.zeros_like(p.U)])
    batch = solve_torch_batch(p, us, fused=fused).cpu().numpy()
    for k, u in enumerate(us):
        single = solve_torch(FPProblem(**{**p.model_fields(), "U": u}), fused=fused)["M"].cpu().numpy()
        # the same counts (test_batch_counts_equal_single_counts); the smoothing's reach is the batch's
        # widest bandwidth's, so equal to rounding
        np.testing.assert_allclose(batch[k], single, rtol=1e-9, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FP_VARIANTS)
def test_fp_memory_estimate_covers_the_device_peak(variant):
    import torch

    p = driven("periodic", 2_000_000)
    FP_PARTICLE.implementations[variant](p)  # compiles and caches outside the measured run
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    host(FP_PARTICLE.implementations[variant](p))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= FP_PARTICLE.memory(p, variant), (peak, FP_PARTICLE.memory(p, variant))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["torch:hjb_host", "torch:hjb_device"])
def test_torch_fixed_point_converges_and_agrees_with_numba(variant):
    from plugins.mfg.coupling import solve_fixed_point

    p = MFGProblem(preset="lq", N=200_000, Nt=30)
    gpu, cpu = FIXED_POINT.implementations[variant](p), solve_fixed_point(p, steps="numba")
    assert bool(gpu["converged"])
    assert l1(p, gpu["M"][-1], cpu["M"][-1]) < 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["torch:hjb_device", "torch:hjb_fused"])
def test_the_hjb_variants_of_the_fixed_point_agree(variant):
    # the same FP kernel and seed on the device; the HJB on the host (numba) or the device (the torch sweep,
    # or the Triton kernel) agree to 1e-8 per solve: only the HJB's rounding differs
    p = MFGProblem(preset="towel_beach", N=50_000, Nx=41, Nt=20)
    on_host = FIXED_POINT.implementations["torch:hjb_host"](p)
    on_device = FIXED_POINT.implementations[variant](p)
    assert int(on_host["iterations"]) == int(on_device["iterations"])
    assert l1(p, on_host["M"][-1], on_device["M"][-1]) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["torch:hjb_host", "torch:hjb_device"])
def test_torch_common_noise_agrees_with_numba(variant):
    from plugins.mfg.common_noise import solve_serial

    cn = CommonNoiseProblem(preset="lq", K=4, N=50_000, Nt=20)
    gpu, cpu = COMMON_NOISE.implementations[variant](cn), solve_serial(cn, steps="numba")
    np.testing.assert_array_equal(gpu["theta"], cpu["theta"])  # the same paths, in the same order
    assert gpu["converged"].all()
    assert l1(cn, gpu["M_mean"][-1], cpu["M_mean"][-1]) < 0.05


@pytest.mark.gpu
def test_the_two_hjb_variants_of_common_noise_agree():
    from plugins.mfg.common_noise import solve_torch

    cn = CommonNoiseProblem(preset="lq", K=4, N=50_000, Nt=20)
    on_host, on_device = solve_torch(cn, hjb_device=False), solve_torch(cn, hjb_device=True)
    assert l1(cn, on_host["M_mean"][-1], on_device["M_mean"][-1]) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_numba_fp_still_agrees_on_the_gpu_host(fused):
    p = driven("reflecting", 100_000)
    a, b = solve_numpy(p), solve_particles(p, fused=fused)
    assert l1(p, a["M"][-1], b["M"][-1]) < 4 * noise_l1(a["M"][-1], a["bandwidth"][-1], p.N, p.weights())


# -- int64 fixed-point deposits: exact mass, the same bits run to run -----------------------------------------------

def kernel_inputs(p: FPProblem, seed: int = 11):
    """Float32 start positions and drift on the GPU, as solve_torch prepares them for the Triton kernel."""
    import torch

    from plugins.mfg.fp.common import drift_table
    from plugins.mfg.fp.torch_kernel import initial_positions

    device = torch.device("cuda")
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    positions = initial_positions(p, generator, device).to(torch.float32)
    return positions, torch.as_tensor(drift_table(p, p.U), device=device, dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", FP_VARIANTS)
def test_two_runs_with_one_seed_give_bit_identical_densities(variant):
    import torch

    p = driven("reflecting", 300_000)
    solve = FP_PARTICLE.implementations[variant]
    first, second = solve(p), solve(p)
    for key in ("M", "bandwidth", "moments", "mass"):
        assert torch.equal(first[key], second[key]), key
    ref, out = solve_numpy(p), host(first)
    for n in (0, p.Nt):
        assert l1(p, out["M"][n], ref["M"][n]) < 4 * noise_l1(ref["M"][n], ref["bandwidth"][n], p.N, p.weights())


@pytest.mark.gpu
@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
def test_every_step_holds_exactly_n_times_the_scale(boundary):
    import torch

    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE
    from plugins.mfg.fp.layout import SLOTS
    from plugins.mfg.fp.torch_kernel import deposit_units
    from plugins.mfg.fp.triton_kernel import run_fused, run_fused_counts

    p = driven(boundary, 250_000)
    start, drift = kernel_inputs(p)
    counts, _ = run_fused_counts(p, start.clone(), drift, 11)
    assert counts.dtype == torch.int64
    assert torch.all(counts.sum(dim=-1) == p.N * FIXED_POINT_SCALE)
    # N * 2**32 < 2**53: every bin, and every partial sum of bins, is exact in float64
    mass, _ = run_fused(p, start.clone(), drift, 11)
    assert torch.all(mass.sum(dim=-1) == p.N)
    histogram = torch.zeros(SLOTS, p.Nx, dtype=torch.int64, device=start.device)
    deposit_units(p, start, histogram, torch.arange(p.N, device=start.device) % SLOTS)  # the eager path's deposit
    assert int(histogram.sum()) == p.N * FIXED_POINT_SCALE


@pytest.mark.gpu
@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
def test_the_kernel_counts_what_the_torch_deposit_counts(boundary):
    # two implementations of one integer rule, on the same positions: equal counts and moment units
    import torch

    from plugins.mfg.fp.fixed_point import moment_units
    from plugins.mfg.fp.layout import SLOTS
    from plugins.mfg.fp.torch_kernel import deposit_units
    from plugins.mfg.fp.triton_kernel import run_fused_counts

    p = driven(boundary, 100_000)
    start, drift = kernel_inputs(p)
    last = start.clone()
    counts, units = run_fused_counts(p, last, drift, 11)  # leaves the last step's positions in `last`
    slot_index = torch.arange(p.N, device=start.device) % SLOTS
    for step, x in ((0, start), (p.Nt, last)):
        histogram = torch.zeros(SLOTS, p.Nx, dtype=torch.int64, device=x.device)
        deposit_units(p, x, histogram, slot_index)
        assert torch.equal(histogram.sum(dim=0), counts[step]), step
        assert torch.equal(moment_units(p, x.double()), units[step]), step


@pytest.mark.gpu
def test_batch_counts_equal_single_counts():
    import torch

    from plugins.mfg.fp.triton_kernel import run_fused_counts

    p = driven("periodic", 50_000)
    start, drift = kernel_inputs(p)
    drifts = torch.stack([drift, 2 * drift, torch.zeros_like(drift)])
    counts, units = run_fused_counts(p, start.expand(3, -1).clone(), drifts, 11)
    for k in range(3):
        single, single_units = run_fused_counts(p, start.clone(), drifts[k], 11)
        assert torch.equal(counts[k], single) and torch.equal(units[k], single_units), k


@pytest.mark.gpu
def test_the_kernel_steps_add_standard_normal_increments():
    # zero drift on a domain far wider than the walk: a step adds sigma * sqrt(dt) * z, so the variance grows by
    # sigma**2 * dt a step only if the four normals of each Philox draw (four consecutive steps) are standard
    # and uncorrelated; the end point, a sum of eight, is normal (kurtosis 3) only if their shape is right too.
    # Nx = 2001 is past the block histogram's bins: the kernel counts with one add per particle, checked here
    import torch

    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE, moments_from_units
    from plugins.mfg.fp.layout import SLOTS
    from plugins.mfg.fp.torch_kernel import deposit_units
    from plugins.mfg.fp.triton_kernel import histogram_bins, run_fused_counts

    p = FPProblem(N=1 << 20, Nx=2001, Nt=8, xmin=-10.0, xmax=10.0, sigma=1.0)
    assert histogram_bins(p.Nx) == 0
    last = torch.zeros(p.N, device="cuda", dtype=torch.float32)
    counts, units = run_fused_counts(p, last, torch.zeros(p.Nt + 1, p.Nx, device="cuda", dtype=torch.float32), 5)
    assert torch.all(counts.sum(dim=-1) == p.N * FIXED_POINT_SCALE)
    histogram = torch.zeros(SLOTS, p.Nx, dtype=torch.int64, device=last.device)
    deposit_units(p, last, histogram, torch.arange(p.N, device=last.device) % SLOTS)
    assert torch.equal(histogram.sum(dim=0), counts[-1])
    sums = moments_from_units(p, units).cpu().numpy()
    variance = (sums[1:, 1] - sums[1:, 0] ** 2 / p.N) / p.N
    np.testing.assert_allclose(variance / (p.sigma**2 * p.dt * np.arange(1, p.Nt + 1)), 1.0, atol=5 * np.sqrt(2 / p.N))
    z = last.double().cpu().numpy() / (p.sigma * np.sqrt(p.T))
    assert abs(z.mean()) < 5 / np.sqrt(p.N)
    assert abs(np.mean(z**4) / np.mean(z**2) ** 2 - 3.0) < 5 * np.sqrt(96 / p.N)


def test_too_many_particles_for_the_fixed_point_are_refused_with_the_bound():
    pytest.importorskip("torch")
    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE, MAX_PARTICLES, fixed_point_unsupported
    from plugins.mfg.fp.torch_kernel import fused_unsupported, solve_torch

    assert 2 * MAX_PARTICLES * FIXED_POINT_SCALE <= 2**63  # a step's N * SCALE units use at most half of int64
    assert fixed_point_unsupported(FPProblem(N=MAX_PARTICLES)) == ""
    big = FPProblem(N=MAX_PARTICLES + 1)
    assert "(2**30)" in fixed_point_unsupported(big)
    assert fused_unsupported(big) == fixed_point_unsupported(big)  # refused before Triton or CUDA is asked
    with pytest.raises(ValueError, match=r"torch FP cannot run this problem: N=1,073,741,825 particles exceed"):
        solve_torch(big, fused=False)


def test_split_units_sum_to_the_scale_and_round_the_fraction():
    torch = pytest.importorskip("torch")
    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE, split_units

    edges = torch.tensor([0.0, 1.0, 0.5, 2.0**-33, 2.0**-33 - 2.0**-60, 1 - 2.0**-53], dtype=torch.float64)
    frac = torch.cat([edges, torch.rand(100_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)])
    left, right = split_units(frac)
    assert left.dtype == right.dtype == torch.int64
    assert torch.all(left + right == FIXED_POINT_SCALE)
    assert torch.all((right >= 0) & (right <= FIXED_POINT_SCALE))
    assert float(torch.max(torch.abs(right.double() - frac * FIXED_POINT_SCALE))) <= 0.5 + 1e-9
    assert right[: len(edges)].tolist() == [0, FIXED_POINT_SCALE, FIXED_POINT_SCALE // 2, 1, 0, FIXED_POINT_SCALE]


@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
def test_the_fixed_point_deposit_counts_exact_mass_on_cpu_torch(boundary):
    torch = pytest.importorskip("torch")
    from plugins.mfg import kde
    from plugins.mfg.fp.fixed_point import FIXED_POINT_SCALE
    from plugins.mfg.fp.layout import SLOTS
    from plugins.mfg.fp.torch_kernel import deposit_units

    p = FPProblem(N=20_001, Nx=41, Nt=5, boundary=boundary)
    uniform = torch.rand(p.N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = (p.xmin + p.length * uniform).float()  # float32, as the GPU keeps positions
    histogram = torch.zeros(SLOTS, p.Nx, dtype=torch.int64)
    deposit_units(p, x, histogram, torch.arange(p.N) % SLOTS)
    counts = histogram.sum(dim=0)
    assert int(counts.sum()) == p.N * FIXED_POINT_SCALE
    reference = kde.linear_binning(x.double().numpy(), p.xmin, p.dx, p.Nx, boundary)
    # each particle's split is rounded by at most half a unit, 2**-33 of its mass
    np.testing.assert_allclose(counts.double().numpy() / (FIXED_POINT_SCALE * p.N), reference, rtol=0, atol=2.0**-33)


def test_the_fixed_point_moments_convert_back_to_the_float64_sums():
    torch = pytest.importorskip("torch")
    from plugins.mfg.fp.fixed_point import moment_units, moments_from_units

    p = FPProblem(preset="lq", N=50_000, Nx=41, Nt=5)  # xmin = -1.5: the shift back to x is exercised
    x = p.xmin + p.length * torch.rand(p.N, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    sums = moments_from_units(p, moment_units(p, x)).numpy()
    unit = 2.0**-33 * p.N  # half a unit of 2**-32 per particle, at most
    assert abs(sums[0] - float(x.sum())) <= unit * p.length
    assert abs(sums[1] - float((x * x).sum())) <= unit * (2 * abs(p.xmin) * p.length + p.length**2) + 1e-9


@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
@pytest.mark.parametrize("h", [0.05, 0.3])  # 0.3 on 41 nodes: the kernel folds over the domain many times
def test_the_gathered_smoothing_equals_the_smoothing_matrix(boundary, h):
    torch = pytest.importorskip("torch")
    from plugins.mfg import kde
    from plugins.mfg.fp.torch_kernel import smooth

    p = FPProblem(N=1_000, Nx=41, Nt=3, boundary=boundary)
    mass = torch.rand(p.Nt + 1, p.Nx, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out = smooth(p, mass, torch.full((p.Nt + 1,), h, dtype=torch.float64)).numpy()
    expected = mass.numpy() @ kde.smoothing_matrix(h, p.dx, p.Nx, boundary).T / p.weights()
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out @ p.weights(), mass.numpy().sum(axis=1), rtol=1e-13)


# the probe's sequence on the H200 host (docs/results/gpu-2026-11-28f/q-triton-probe.txt): common noise on
# torch:hjb_fused in one warm process, from K=2, N=1000, Nx=40, Nt=20, each change from that base in this order;
# True where the first run paid 0.75-2.2 s of compiling, False where at most 2 ms. Seed 17 recompiled there too,
# since the FP kernel specialised its seed; it no longer does, so the key leaves seeds out
PROBED = [({}, True), ({}, False), ({"Nx": 41}, False), ({"Nx": 43}, False), ({"Nx": 48}, True), ({"Nx": 56}, False),
          ({"Nx": 70}, True), ({"Nx": 75}, False), ({"Nt": 32}, True), ({"Nt": 23}, False), ({"N": 1024}, True),
          ({"N": 1013}, False), ({"N": 2000}, False), ({"seed": 16}, False), ({"seed": 33}, False), ({"K": 3}, False),
          ({"K": 4}, False)]


def _probed(change):
    return CommonNoiseProblem(**{"K": 2, "N": 1000, "Nx": 40, "Nt": 20, "max_iter": 3, **change})


def test_the_triton_compile_keys_are_new_exactly_where_the_kernels_compiled_again():
    seen = set()
    for change, recompiled in PROBED:
        key = COMMON_NOISE.compile_key(_probed(change), "torch:hjb_fused")
        assert (key not in seen) == recompiled, change
        seen.add(key)
    # the CPU implementations compile once a process (numba) or never: no key, so they tier up as before
    for implementation in ("numpy", "numba"):
        assert COMMON_NOISE.compile_key(_probed({"Nx": 48}), implementation) == ()


def _compiled_variants(kernel) -> int:
    """How many specialisations of a Triton kernel this process has compiled (on any device)."""
    caches = getattr(kernel, "device_caches", None)  # Triton 3.2 on: device -> (cache, ...)
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(cache) for cache in kernel.cache.values())


@pytest.mark.gpu
def test_the_triton_kernels_compile_once_per_compile_key():
    """Nothing but a new FP or HJB key compiles its kernel again (not a new seed, K, or a shape with the same
    key): the planner charges a shape's one-off by keys no coarser than Triton's own. (That a new key did
    compile is the probe's measurement, above: here earlier tests may have compiled some keys already.)"""
    import torch

    from plugins.mfg import triton_keys
    from plugins.mfg.fp.triton_kernel import _fp_all_steps, run_fused_counts
    from plugins.mfg.hjb.triton_kernel import _hjb_sweep, sweep_fused

    fp_keys, hjb_keys = set(), set()
    fp_before, hjb_before = _compiled_variants(_fp_all_steps), _compiled_variants(_hjb_sweep)
    def fp_counts(problem, seed):
        positions = torch.rand((problem.K, problem.N), dtype=torch.float64, device="cuda") * problem.length
        grid = torch.zeros((problem.K, problem.Nt + 1, problem.Nx), dtype=torch.float64, device="cuda")
        run_fused_counts(problem, positions, grid, seed=seed)
        return grid

    for change, _ in PROBED:
        problem = _probed(change)
        source = fp_counts(problem, problem.seed or 0)  # zeros still: a drift for the FP, a source for the HJB
        sweep_fused(HJBProblem(**problem.model_fields()), source)  # as common noise's HJB step builds it
        torch.cuda.synchronize()
        fp_keys.add(triton_keys.fp_key(problem))
        hjb_keys.add(triton_keys.hjb_key(problem))
        assert _compiled_variants(_fp_all_steps) - fp_before <= len(fp_keys), change
        assert _compiled_variants(_hjb_sweep) - hjb_before <= len(hjb_keys), change
    for seed in (1, 16, 17, 32, 2**20 + 1):  # seeds of every specialisation Triton would have told apart
        fp_counts(_probed({"seed": seed}), seed)
        assert _compiled_variants(_fp_all_steps) - fp_before <= len(fp_keys), seed
