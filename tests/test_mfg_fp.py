"""FP particles against independent truths: conservation, OU moments, the heat kernel.

Noise bounds: a KDE of N particles with bandwidth h has pointwise standard
deviation about sqrt(m(x) R(K) / (N h)) with R(K) = 1/(2 sqrt(pi)) for the
Gaussian kernel; the L1 distance between two independent estimates is
about sqrt(2/pi) * sqrt(2) * integral of that. Tests allow 4x.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import core
from plugins.mfg import kde
from plugins.mfg.fp.numba_kernel import solve_particles
from plugins.mfg.fp.reference import solve_numpy
from plugins.mfg.problem import FPProblem
from plugins.mfg.specs import FP_PARTICLE

CPU_SOLVERS = {"numpy": solve_numpy, "numba:fused": functools.partial(solve_particles, fused=True),
               "numba:steps": functools.partial(solve_particles, fused=False)}


def noise_l1(m: np.ndarray, h: float, n: int, weights: np.ndarray, independent: int = 2) -> float:
    """Expected L1 distance between `independent` KDE noises (2: two estimates; 1: estimate vs truth)."""
    sd = np.sqrt(np.maximum(m, 0) / (2 * math.sqrt(math.pi) * n * h))
    return float(math.sqrt(2 / math.pi) * math.sqrt(independent) * np.sum(sd * weights))


@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
@pytest.mark.parametrize("backend", list(CPU_SOLVERS))
def test_binned_kde_conserves_mass(boundary, backend):
    p = FPProblem(N=5_000, Nx=41, Nt=10, boundary=boundary, bandwidth=0.3)  # wide kernel: heavy folding
    out = CPU_SOLVERS[backend](p)
    assert np.max(np.abs(out["mass"] - 1)) < 1e-12


def test_smoothing_matrix_columns_sum_to_one():
    for boundary in ("periodic", "reflecting"):
        for h in (0.001, 0.05, 2.0):
            s = kde.smoothing_matrix(h, 0.02, 51, boundary)
            assert np.allclose(s.sum(axis=0), 1.0, atol=1e-14)


def ou_problem(n: int) -> tuple[FPProblem, float, float, float]:
    k, c, lam, sigma = 1.0, 0.2, 1.0, 0.4
    base = FPProblem(preset="lq", N=n, Nx=121, Nt=200, T=1.0, sigma=sigma, lam=lam,
                     m0=np.exp(-0.5 * ((np.linspace(-1.5, 1.5, 121) + 0.3) / 0.15) ** 2))
    U = np.tile(k * (base.x - c) ** 2, (base.Nt + 1, 1))
    return FPProblem(**{**base.model_fields(), "U": U}), 2 * lam * k, c, sigma


@pytest.mark.parametrize("backend", list(CPU_SOLVERS))
def test_ornstein_uhlenbeck_mean_and_variance(backend):
    """U = k (x-c)^2 makes dX = -theta (X - c) dt + sigma dW with theta = 2 lam k."""
    p, theta, c, sigma = ou_problem(40_000)
    out = CPU_SOLVERS[backend](p)
    # the initial law: m0 on cells, so take its moments from the first step's particles' law
    mean0 = float(np.sum(p.x * p.m0 * p.weights()))
    var0 = float(np.sum((p.x - mean0) ** 2 * p.m0 * p.weights())) + p.dx**2 / 12  # cell sampling adds dx^2/12
    decay = math.exp(-theta * p.T)
    mean_t = c + (mean0 - c) * decay
    var_t = var0 * decay**2 + sigma**2 / (2 * theta) * (1 - decay**2)
    mean, var = out["moments"][-1]
    n = p.N
    assert abs(mean - mean_t) < 4 * math.sqrt(var_t / n)
    assert abs(var - var_t) < 4 * var_t * math.sqrt(2 / (n - 1)) + 2e-4  # + Euler-Maruyama bias at dt = 1/200


def heat_kernel_expectation(p: FPProblem, h: float) -> np.ndarray:
    """E[binned KDE] for pure diffusion on the circle, by quadrature (independent of the solver).

    Particles start uniform in the cell around each node with probability
    m0_j * dx; after time T they are spread by the wrapped Gaussian of
    variance sigma^2 T. Linear binning takes the expectation of the hat
    functions; the shared smoothing matrix then applies the kernel.
    """
    sub = 40
    fine = p.xmin - p.dx / 2 + (np.arange(p.Nx * sub) + 0.5) * (p.dx / sub)
    start = np.repeat(p.m0, sub)  # piecewise-constant initial density on the fine grid
    s2 = p.sigma**2 * p.T
    offsets = fine[:, None] - fine[None, :]
    kernel = sum(np.exp(-0.5 * (offsets + k * p.length) ** 2 / s2) for k in range(-3, 4)) / math.sqrt(2 * math.pi * s2)
    final = kernel @ (start * p.dx / sub)
    hats = np.zeros(p.Nx)
    position = (fine - p.xmin) / p.dx
    left = np.floor(position).astype(int)
    frac = position - left
    np.add.at(hats, np.mod(left, p.Nx), final * (1 - frac) * p.dx / sub)
    np.add.at(hats, np.mod(left + 1, p.Nx), final * frac * p.dx / sub)
    return kde.smoothing_matrix(h, p.dx, p.Nx, "periodic") @ hats / p.weights()


@pytest.mark.parametrize("backend", list(CPU_SOLVERS))
def test_pure_diffusion_matches_the_wrapped_heat_kernel(backend):
    p = FPProblem(preset="towel_beach", N=100_000, Nx=50, Nt=40, T=0.05, sigma=1.0, bandwidth=0.02,
                  m0=np.exp(-0.5 * ((np.arange(50) / 50 - 0.5) / 0.05) ** 2))
    out = CPU_SOLVERS[backend](p)
    expected = heat_kernel_expectation(p, 0.02)
    l1 = float(np.sum(np.abs(out["M"][-1] - expected) * p.weights()))
    assert l1 < 4 * noise_l1(expected, 0.02, p.N, p.weights(), independent=1) + 0.01  # + EM / interpolation


def driven(boundary: str, n: int, **fields) -> FPProblem:
    """A problem with a smooth time-dependent drift, so the particles do more than diffuse."""
    base = FPProblem(N=n, Nx=51, Nt=30, boundary=boundary, **fields)
    U = 0.2 * np.outer(base.T - base.t, np.cos(2 * np.pi * base.x))
    return FPProblem(**{**base.model_fields(), "U": U})


@pytest.mark.parametrize("boundary", ["periodic", "reflecting"])
@pytest.mark.parametrize("variant", ["numba:fused", "numba:steps"])
def test_each_cpu_variant_agrees_with_numpy_in_distribution(boundary, variant):
    """Every CPU implementation the spec offers, called as the core calls it, against the reference."""
    p = driven(boundary, 60_000)
    a, b = solve_numpy(p), FP_PARTICLE.implementations[variant](p)
    for n in (0, p.Nt // 2, p.Nt):
        l1 = float(np.sum(np.abs(a["M"][n] - b["M"][n]) * p.weights()))
        assert l1 < 4 * noise_l1(a["M"][n], a["bandwidth"][n], p.N, p.weights())


@pytest.mark.parametrize(("fields", "bound"), [({"kde": "direct"}, 0.0), ({"bandwidth": "silverman"}, 0.0)])
def test_step_by_step_numba_runs_what_the_all_steps_kernel_cannot(fields, bound):
    p = driven("periodic", 20_000, **fields)
    a, b = solve_numpy(p), solve_particles(p, fused=False)
    l1 = float(np.sum(np.abs(a["M"][-1] - b["M"][-1]) * p.weights()))
    assert l1 < 4 * noise_l1(a["M"][-1], a["bandwidth"][-1], p.N, p.weights()) + bound


@pytest.mark.parametrize("fields", [{"kde": "direct"}, {"bandwidth": "silverman"}])
def test_all_steps_variants_refuse_what_they_cannot_run_whatever_the_size(fields):
    small, huge = FPProblem(N=100, **fields), FPProblem(N=10**9, Nx=401, Nt=1000, **fields)
    for variant in ("numba:fused", "torch:fused"):
        assert FP_PARTICLE.supports(small, variant) and FP_PARTICLE.supports(huge, variant)
    for variant in ("numpy", "numba:steps", "torch:eager"):
        assert FP_PARTICLE.supports(small, variant) == ""
    with pytest.raises(ValueError, match="all-steps numba kernel cannot run"):
        solve_particles(small, fused=True)


def test_a_capable_problem_is_supported_by_the_cpu_variants_at_any_size():
    # no size rule: what does not fit is the memory estimate's answer, not supports'
    for n in (10, 10**9):
        p = FPProblem(N=n, Nx=401, Nt=1000)
        assert FP_PARTICLE.supports(p, "numba:fused") == "" and FP_PARTICLE.supports(p, "numba:steps") == ""
    huge = FPProblem(N=10**9, Nx=401, Nt=1000)
    histograms = FP_PARTICLE.memory(huge, "numba:fused") - FP_PARTICLE.memory(huge, "numba:steps")
    assert histograms == 8 * -(-10**9 // 4096) * 1001 * 401  # the all-steps kernel's (chunks, steps, Nx) bins


def test_features_are_finite_and_grow_with_every_field():
    base = FPProblem(N=2_000, Nx=51, Nt=20)
    f0 = FP_PARTICLE.features(base)
    assert all(math.isfinite(v) and v >= 0 for v in f0.values())
    for field in ("N", "Nx", "Nt"):
        bigger = FP_PARTICLE.features(FPProblem(**{"N": 2_000, "Nx": 51, "Nt": 20, field: 4 * getattr(base, field)}))
        assert sum(bigger.values()) > sum(f0.values()), field
    direct = FP_PARTICLE.features(FPProblem(N=2_000, Nx=51, Nt=20, kde="direct"))
    assert direct["kernel_work"] >= 3 * 2_000 * 51 * 21  # one weight per particle, node, image and level


def test_direct_kde_reference_matches_the_exact_sum():
    """The scipy pipeline (numpy, kde=direct) equals the float64 Gaussian sum with images."""
    from plugins.mfg.fp.reference import scipy_density

    rng = np.random.default_rng(3)
    for boundary in ("periodic", "reflecting"):
        p = FPProblem(N=2_000, Nx=31, Nt=1, boundary=boundary, kde="direct")
        x = p.xmin + p.length * rng.random(p.N)
        exact = kde.direct_density(x, 0.05, p.x, p.xmin, p.xmax, boundary)
        assert np.allclose(scipy_density(x, 0.05, p), exact, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("fields", [{"N": 20_000, "Nt": 12}, {"N": 4_099, "Nt": 5, "boundary": "reflecting"}])
def test_numba_all_steps_kernel_equals_the_step_by_step_one(fields):
    # the same additions in the same order: equal bit for bit, odd N (a lone last particle) included
    p = FPProblem(**fields)
    fused, stepwise = solve_particles(p, fused=True), solve_particles(p, fused=False)
    for name in ("M", "bandwidth", "moments"):
        assert np.array_equal(fused[name], stepwise[name]), name


def test_numba_starting_state_is_drawn_once_per_seed_and_never_shared():
    from plugins.mfg.fp.numba_kernel import starting_state

    p = FPProblem(N=1_001, seed=7)
    first, keys = starting_state(p)
    first_copy = first.copy()
    first[:] = -1.0  # a kernel overwrites what it gets: the kept state must not change
    keys[:] = 0
    again, keys_again = starting_state(p)
    assert np.array_equal(again, first_copy) and np.any(keys_again != 0)
    unseeded = FPProblem(N=1_001, seed=None)
    assert not np.array_equal(starting_state(unseeded)[0], starting_state(unseeded)[0])


@pytest.mark.parametrize("fused", [True, False])
def test_numba_is_independent_of_thread_count(fused):
    import numba

    p = FPProblem(N=20_000, Nt=10)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = solve_particles(p, fused=fused)["M"]
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = solve_particles(p, fused=fused)["M"]
    finally:
        numba.set_num_threads(before)
    assert np.allclose(one, many, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("fields", "message"), [
    ({"Nx": 2}, "Nx=2 is invalid: must be an integer >= 3"),
    ({"Nt": 0}, "Nt=0 is invalid: must be an integer >= 1"),
    ({"sigma": -0.1}, "sigma=-0.1 is invalid: must be a finite number >= 0"),
    ({"N": 0}, "N=0 is invalid: must be an integer >= 1"),
    ({"m0": [1.0, -1.0] + [1.0] * 49}, "m0=[1.0, -1.0, 1.0"),
    ({"m0": [0.0] * 51}, "must have positive mass to be normalised"),
    ({"m0": [1.0] * 50}, "must have shape (51,), got (50,)"),
    ({"m0": [float("nan")] + [1.0] * 50}, "found 1 NaN or inf"),
    ({"V": [float("inf")] * 51}, "V=[inf, inf, inf"),
    ({"U": np.full((51, 51), np.nan)}, "U=array(shape=(51, 51), dtype=float64) is invalid: must be finite"),
    ({"U": np.zeros((3, 3))}, "must have shape (51, 51), got (3, 3)"),
    ({"preset": "beach"}, "preset='beach' is invalid: must be one of 'towel_beach', 'lq', 'crowd'"),
    ({"boundary": "open"}, "boundary='open' is invalid: must be one of 'periodic', 'reflecting'"),
    ({"kde": "fft"}, "kde='fft' is invalid: must be one of 'binned', 'direct'"),
    ({"bandwidth": "wide"}, "bandwidth='wide' is invalid: must be one of 'scott', 'silverman'"),
    ({"bandwidth": 0.0}, "bandwidth=0.0 is invalid: must be a finite number > 0"),
    ({"xmin": 1.0, "xmax": 0.0}, "xmax=0.0 is invalid: must be greater than xmin=1"),
])
def test_bad_input_names_the_field(fields, message):
    with pytest.raises(core.ProblemError) as caught:
        FPProblem(**fields)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_problems_pickle_for_worker_processes():
    import pickle

    p = FPProblem(N=10)
    assert np.array_equal(pickle.loads(pickle.dumps(p)).m0, p.m0)


def test_smoothing_all_steps_at_once_matches_step_by_step():
    rng = np.random.default_rng(0)
    mass = rng.random((5, 51))
    widths = np.array([0.01, 0.02, 0.05, 0.2, 1.0])
    for boundary in ("periodic", "reflecting"):
        together = kde.smooth_steps(mass, widths, 0.02, boundary)
        one_by_one = np.stack([kde.smoothing_matrix(h, 0.02, 51, boundary) @ m for h, m in zip(widths, mass)])
        assert np.allclose(together, one_by_one, rtol=0, atol=1e-8)  # kernels differ only beyond 6 widths
        assert np.allclose(together.sum(axis=1), mass.sum(axis=1), rtol=1e-14)
