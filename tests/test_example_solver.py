"""The example random-walk solver against its analytic law, on every backend.

After n steps of ``drift + std * Z`` a walker sits at N(n*drift, n*std^2).
Bounds are 5 standard errors for the N used, so a correct backend fails with
probability below 1e-6 per check, and the seeds are fixed anyway.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import core
from plugins.example.problem import RandomWalkProblem

PROBLEM = RandomWalkProblem(n_walkers=40_000, n_steps=50, step_std=2.0, drift=0.3, n_bins=24, chunk=5_000, seed=7)


def gaussian_bin_probabilities(problem: RandomWalkProblem) -> np.ndarray:
    edges = problem.bin_edges()
    z = (edges - problem.exact_mean) / math.sqrt(problem.exact_variance)
    cdf = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in z])
    return np.diff(cdf)


def assert_matches_law(outputs, problem: RandomWalkProblem) -> None:
    n = problem.n_walkers
    sd = math.sqrt(problem.exact_variance)
    assert abs(float(outputs["mean"]) - problem.exact_mean) < 5 * sd / math.sqrt(n)
    variance_error = 5 * problem.exact_variance * math.sqrt(2 / (n - 1))
    assert abs(float(outputs["variance"]) - problem.exact_variance) < variance_error
    p = gaussian_bin_probabilities(problem)
    counts = np.asarray(outputs["histogram"])
    assert counts.shape == (problem.n_bins,)
    assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1)


def cpu_backends():
    return [b for b in ("numpy", "numba", "process") if core.availability(b).available]


@pytest.mark.parametrize("backend", ["numpy", "numba", "process"])
def test_backend_matches_the_analytic_law(backend):
    result = core.solve(PROBLEM, backend=backend)
    assert result.backend == backend and result.seconds > 0
    assert_matches_law(result.outputs, PROBLEM)


def test_process_equals_numpy_bit_for_bit():
    a = core.solve(PROBLEM, backend="numpy").outputs
    b = core.solve(PROBLEM, backend="process").outputs
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_numba_is_independent_of_thread_count():
    import numba

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = core.solve(PROBLEM, backend="numba").outputs
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = core.solve(PROBLEM, backend="numba").outputs
    finally:
        numba.set_num_threads(before)
    for name in one:
        np.testing.assert_array_equal(one[name], many[name])


def assert_same_distribution(a, b, n: int) -> None:
    """Histograms of two independent samples of n: each bin within 5 sigma of the difference."""
    ca, cb = np.asarray(a["histogram"], float), np.asarray(b["histogram"], float)
    p = (ca + cb) / (2 * n)
    assert np.all(np.abs(ca - cb) <= 5 * np.sqrt(2 * n * p * (1 - p)) + 2)


def test_numba_agrees_with_numpy_in_distribution():
    assert_same_distribution(core.solve(PROBLEM, backend="numpy").outputs,
                             core.solve(PROBLEM, backend="numba").outputs, PROBLEM.n_walkers)


def test_merge_is_exact_for_uneven_chunks():
    """Chunked mean/variance equal the float64 one-pass reference on the same draws."""
    from plugins.example.reference import chunk_stats, merge

    rng = np.random.default_rng(0)
    values = rng.normal(5.0, 3.0, size=10_001)
    edges = np.linspace(-20, 30, 11)
    bounds = [0, 1, 17, 5000, 10_001]
    merged = merge([chunk_stats(values[a:b], edges) for a, b in itertools.pairwise(bounds)], edges)
    assert merged["mean"] == pytest.approx(values.mean(), rel=1e-13)
    assert merged["variance"] == pytest.approx(values.var(ddof=1), rel=1e-12)
    assert merged["histogram"].sum() == values.size


def test_zero_noise_walk_is_deterministic():
    problem = RandomWalkProblem(n_walkers=1000, n_steps=10, step_std=0.0, drift=0.5, n_bins=4)
    for backend in cpu_backends():
        out = core.solve(problem, backend=backend).outputs
        assert float(out["mean"]) == pytest.approx(5.0) and float(out["variance"]) == pytest.approx(0.0, abs=1e-20)


def test_single_walker():
    for backend in cpu_backends():
        out = core.solve(RandomWalkProblem(n_walkers=1, n_steps=3), backend=backend).outputs
        assert float(out["variance"]) == 0.0 and out["histogram"].sum() == 1


@pytest.mark.gpu
def test_torch_matches_the_analytic_law_and_numpy():
    result = core.solve(PROBLEM, backend="torch")
    assert_matches_law(result.outputs, PROBLEM)
    assert_same_distribution(core.solve(PROBLEM, backend="numpy").outputs, result.outputs, PROBLEM.n_walkers)
    again = core.solve(PROBLEM, backend="torch").outputs
    np.testing.assert_array_equal(result.outputs["histogram"], again["histogram"])  # fixed seed, same answer


@pytest.mark.gpu
def test_torch_names_the_device():
    status = core.backends()["torch"]
    assert status.available and status.details["device"].startswith(("cuda", "mps"))
