"""The ML plugin's conventions and limits: d features and sample weights on every ml.linreg backend,
scikit-learn's estimator checks, no calibration inside fit, float32's range, and DotGAT's limits.

The independent truth for the multi-feature, weighted descent is the closed form of gradient descent on a
quadratic (``closed_form`` in test_ml_linreg.py): powers of the step matrix, not another descent.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_ml_linreg import RTOL, assert_same_trajectory, closed_form

import core
from core.errors import ProblemError
from plugins.ml import LinearRegressionGD, LinRegProblem
from plugins.ml import specs as specs_module
from plugins.ml.estimator import SKIPPED_CHECKS, DataConversionWarning, NotFittedError, UncalibratedWarning
from plugins.ml.linreg_numpy import solve_numpy
from plugins.ml.linreg_problem import FLOAT32_MAX, synthetic_data
from plugins.ml.specs import LINREG, linreg_features, linreg_space

TRUE_COEF = np.array([1.5, -0.5, 2.0])


def multi_problem(n: int = 3 * 1024 + 17, weights: bool = False, epochs: int = 40) -> LinRegProblem:
    """Three features of different scales, fixed seed; with weights, integers 0-3 (zeros included)."""
    rng = np.random.default_rng(11)
    X = rng.uniform(-2, 5, (n, 3)) * [1.0, 0.5, 2.0]
    y = X @ TRUE_COEF - 0.25 + 0.3 * rng.standard_normal(n)
    sample_weight = rng.integers(0, 4, n).astype(float) if weights else None
    return LinRegProblem(X=X, y=y, learning_rate=0.02, n_epochs=epochs, w0=[0.1, 0.2, -0.3], b0=1.0,
                         sample_weight=sample_weight)


# -- d features and sample weights, every backend --------------------------------------------------


@pytest.mark.parametrize("weights", [False, True])
def test_reference_follows_the_closed_form_with_features_and_weights(weights):
    problem = multi_problem(weights=weights)
    X, y = problem.data()
    theta, losses = closed_form(X, y, problem.learning_rate, problem.n_epochs, problem.w0, problem.b0,
                                problem.sample_weight)
    out = solve_numpy(problem)
    assert out["coef"].shape == (3,)
    np.testing.assert_allclose([*out["coef"], float(out["intercept"])], theta, rtol=1e-10)
    np.testing.assert_allclose(out["loss_curve"], losses, rtol=1e-9)


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize(("solver", "backend"), [("ml.linreg", "numba:threads"), ("ml.linreg", "numba:serial"),
                                                 ("ml.linreg_moments", "numpy")])
def test_cpu_backends_agree_on_features_and_weights(solver, backend, weights):
    problem = multi_problem(weights=weights)
    assert_same_trajectory(core.solve(problem, backend=backend, solver=solver).outputs, solve_numpy(problem))


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("variant", ["eager", "compile"])
def test_torch_variants_agree_on_features_and_weights_on_cpu(variant, weights):
    """The torch code (float32 slabs per feature, NaN padding, weights) run on the CPU; the size is no
    multiple of the block, so the padding is exercised."""
    pytest.importorskip("torch")
    from plugins.ml.linreg_torch import solve_on

    problem = multi_problem(weights=weights)
    assert_same_trajectory(solve_on(problem, "cpu", variant), solve_numpy(problem))


def test_integer_weights_are_repeated_samples():
    """A weight of k is the sample k times (0: left out): the same trajectory as the repeated data."""
    weighted = multi_problem(n=500, weights=True)
    X, y = weighted.data()
    counts = weighted.sample_weight.astype(int)
    repeated = LinRegProblem(X=np.repeat(X, counts, axis=0), y=np.repeat(y, counts), learning_rate=0.02,
                             n_epochs=40, w0=[0.1, 0.2, -0.3], b0=1.0)
    for backend in ("numpy", "numba:serial"):
        out = core.solve(weighted, backend=backend, solver="ml.linreg").outputs
        assert_same_trajectory(out, solve_numpy(repeated))


def test_one_unweighted_feature_keeps_the_original_problem():
    """d = 1 is what it was: the preset's synthetic data, one coefficient, and the cost features of old."""
    X, y = synthetic_data(1000, 0.0, 0, 1)
    np.testing.assert_array_equal(X[:, 0], np.arange(1000) * (10.0 / 1000))
    np.testing.assert_allclose(y, 0.7 * X[:, 0] + 0.3, rtol=1e-15)
    problem = LinRegProblem(n_samples=40_000, n_epochs=30)
    assert problem.n_features == 1 and problem.coef0().shape == (1,)
    features = linreg_features(problem)
    assert features["sample_epochs"] == 40_000 * 30 and features["samples"] == 40_000
    assert linreg_space(True).fixed == {"n_features": 1}  # the quick calibration is the one of old
    assert "n_features" in linreg_space(False).ranges  # the full one moves it


def test_synthetic_features_and_the_cost_features_scale_with_d():
    X, y = synthetic_data(2000, 0.0, 3, 4)
    assert X.shape == (2000, 4) and X.min() >= 0 and X.max() < 10
    np.testing.assert_allclose(y, 0.7 * X.sum(axis=1) + 0.3, rtol=1e-14)
    one, four = LinRegProblem(n_samples=5000, n_epochs=7), LinRegProblem(n_samples=5000, n_epochs=7, n_features=4)
    f1, f4 = linreg_features(one), linreg_features(four)
    assert f4["sample_epochs"] == 4 * f1["sample_epochs"] and f4["samples"] == 4 * f1["samples"]
    assert f4["epochs"] == f1["epochs"]
    out = core.solve(LinRegProblem(n_samples=5000, n_epochs=400, n_features=3, learning_rate=0.005, w0=0.7,
                                   b0=0.3), backend="numpy", solver="ml.linreg").outputs
    np.testing.assert_allclose(out["coef"], [0.7, 0.7, 0.7], rtol=1e-6)  # started at the truth: it stays


@pytest.mark.parametrize(("params", "message"), [
    ({"w0": [0.1, 0.2]}, r"w0=.* must be one number or one per feature: shape \(3,\), got \(2,\)"),
    ({"sample_weight": -np.ones(6)}, r"sample_weight=.* must be non-negative"),
    ({"sample_weight": np.zeros(6)}, r"sample_weight=.* must not be all zero"),
    ({"sample_weight": np.ones(5)}, r"sample_weight=.* must have one weight per sample: shape \(6,\), got \(5,\)"),
])
def test_bad_coefficients_and_weights_are_refused_in_one_line(params, message):
    with pytest.raises(ProblemError, match=message) as caught:
        LinRegProblem(X=np.ones((6, 3)), y=np.ones(6), **params)
    assert "\n" not in str(caught.value)


# -- the triton epoch and float32's range: the exclusion mechanism ----------------------------------------


def test_the_graph_variant_excludes_several_features_and_weights():
    from plugins.ml.linreg_torch import unsupported_problem

    assert unsupported_problem(multi_problem(), "torch:graph").startswith("the graph variant's Triton epoch fits one")
    one_weighted = LinRegProblem(X=np.ones((4, 1)), y=np.ones(4), sample_weight=np.ones(4))
    assert "without sample weights" in unsupported_problem(one_weighted, "torch:graph")
    for key in ("torch:eager", "torch:compile"):
        assert unsupported_problem(multi_problem(weights=True), key) == ""
    assert unsupported_problem(LinRegProblem(X=np.ones((4, 1)), y=np.ones(4)), "torch:graph") == ""


def overflowing(scale: float = 4e38) -> LinRegProblem:
    X = np.linspace(0.0, 1.0, 50) * scale  # finite in float64, beyond float32's 3.4e38 at the top
    return LinRegProblem(X=X, y=0.5 * X, n_epochs=1, learning_rate=1e-80, w0=0.0, b0=0.0)


def test_float32_storage_overflows_where_float64_is_finite():
    """Why the exclusion exists: the torch epoch on the CPU gives NaN, the float64 reference a finite loss."""
    pytest.importorskip("torch")
    from plugins.ml.linreg_torch import solve_on

    problem = overflowing()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow in the float32 cast
        assert np.isnan(solve_on(problem, "cpu", "eager")["loss_curve"][0])
    assert np.isfinite(solve_numpy(problem)["loss_curve"][0])
    inside = overflowing(3e38)  # within float32's range: both finite and equal
    np.testing.assert_allclose(solve_on(inside, "cpu", "eager")["loss_curve"], solve_numpy(inside)["loss_curve"],
                               rtol=1e-6)


@pytest.fixture
def cuda_pretended(monkeypatch):
    """The torch backend and CUDA pretended available, so that only the problem can exclude a torch variant."""
    torch = pytest.importorskip("torch")
    import core.running
    from core.backend import Availability

    real_probe, real_free = core.running.probe, core.running.safe_free_memory
    monkeypatch.setattr(core.running, "probe", lambda backend: Availability(True) if backend.name == "torch"
                        else real_probe(backend))
    monkeypatch.setattr(core.running, "safe_free_memory", lambda backend: None if backend.name == "torch"
                        else real_free(backend))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_the_cuda_check_is_asked_once_per_answering_function(monkeypatch):
    """Plans ask each CUDA-only variant's ``supports``: the driver is asked once, and a patched check anew."""
    torch = pytest.importorskip("torch")
    from core.backends.torch_gpu import cuda_available

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(1) or True)
    assert cuda_available() and cuda_available() and len(asked) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not cuda_available()


def test_values_beyond_float32_exclude_every_torch_variant_with_the_reason(cuda_pretended):
    from core.running import exclusion

    problem = overflowing()
    assert problem.largest_magnitude() == pytest.approx(4e38)
    for key in ("torch:eager", "torch:compile", "torch:graph"):
        why = exclusion(LINREG, problem, key)
        assert why.startswith("unsupported: the data hold values up to 4e+38, beyond float32's range (3.4e+38)")
    assert exclusion(LINREG, overflowing(3e38), "torch:eager") == ""  # within range: not excluded
    assert exclusion(LINREG, problem, "numpy") == ""
    # weights and y count too; synthetic data by a bound that does not build them
    assert LinRegProblem(X=np.ones((3, 1)), y=np.ones(3), sample_weight=[1.0, 1e39, 1.0]).largest_magnitude() == 1e39
    assert LinRegProblem(n_samples=10**9, noise=1e37).largest_magnitude() > FLOAT32_MAX


def test_naming_an_excluded_torch_variant_is_a_one_line_error(cuda_pretended):
    with pytest.raises(core.BackendUnavailableError) as caught:
        core.solve(overflowing(), backend="torch:eager", solver="ml.linreg")
    message = str(caught.value)
    assert "\n" not in message and "beyond float32's range" in message and "torch:eager" in message


def test_auto_never_picks_an_excluded_torch_variant(cuda_pretended):
    """Uncalibrated, the plan lists why each implementation is out: the torch ones for float32's range."""
    with pytest.raises(core.AutoSelectionError) as caught:
        core.plan(LinRegProblem(X=np.linspace(0, 4e38, 37), y=np.zeros(37)), solver="ml.linreg", explain=False)
    for key in ("torch:eager", "torch:compile", "torch:graph"):
        assert f"{key}: unsupported: the data hold values up to 4e+38" in str(caught.value)


# -- the estimator: scikit-learn's conventions -----------------------------------------------------------


def test_estimator_fits_features_with_weights_against_the_closed_form():
    problem = multi_problem(weights=True, epochs=60)
    X, y = problem.data()
    estimator = LinearRegressionGD(learning_rate=0.02, n_epochs=60, coef_init=[0.1, 0.2, -0.3], intercept_init=1.0,
                                   backend="numba").fit(X, y, sample_weight=problem.sample_weight)
    theta, losses = closed_form(X, y, 0.02, 60, [0.1, 0.2, -0.3], 1.0, problem.sample_weight)
    assert estimator.n_features_in_ == 3 and estimator.coef_.shape == (3,)
    np.testing.assert_allclose([*estimator.coef_, estimator.intercept_], theta, rtol=RTOL)
    np.testing.assert_allclose(estimator.loss_curve_, losses, rtol=RTOL)
    np.testing.assert_allclose(estimator.predict(X), X @ theta[:3] + theta[3], rtol=RTOL)


def test_estimator_converges_to_least_squares():
    """Enough epochs reach the least-squares solution (numpy's lstsq), the statistical truth of the data."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((400, 3))
    y = X @ TRUE_COEF + 0.5 + 0.01 * rng.standard_normal(400)
    estimator = LinearRegressionGD(learning_rate=0.1, n_epochs=2000, backend="numpy").fit(X, y)
    solution = np.linalg.lstsq(np.column_stack([X, np.ones(400)]), y, rcond=None)[0]
    np.testing.assert_allclose([*estimator.coef_, estimator.intercept_], solution, rtol=1e-9, atol=1e-12)
    assert estimator.score(X, y) > 0.999


def test_get_params_reads_the_signature():
    class WithMomentum(LinearRegressionGD):
        def __init__(self, learning_rate=0.01, n_epochs=200, coef_init=0.0, intercept_init=0.0, backend="auto",
                     momentum=0.9):
            super().__init__(learning_rate, n_epochs, coef_init, intercept_init, backend)
            self.momentum = momentum

    assert set(LinearRegressionGD().get_params()) == {"backend", "coef_init", "intercept_init", "learning_rate",
                                                      "n_epochs"}
    params = WithMomentum(momentum=0.5).get_params()
    assert params["momentum"] == 0.5 and len(params) == 6
    assert WithMomentum().set_params(momentum=0.1).momentum == 0.1


def test_the_estimator_refuses_what_scikit_learn_refuses():
    estimator = LinearRegressionGD(backend="numpy").fit(np.ones((5, 2)) * [[1], [2], [3], [4], [5]], np.arange(5.0))
    with pytest.raises(ProblemError, match=r"X has 1 features, but LinearRegressionGD is expecting 2 features"):
        estimator.predict(np.ones((3, 1)))
    with pytest.raises(ProblemError, match=r"Reshape your data"):
        estimator.predict(np.ones(2))
    with pytest.raises(ProblemError, match=r"requires y to be passed"):
        LinearRegressionGD(backend="numpy").fit(np.ones((3, 1)), None)
    with pytest.raises(ProblemError, match=r"Complex data not supported"):
        LinearRegressionGD(backend="numpy").fit(np.ones((3, 1)) * 1j, np.ones(3))
    with pytest.raises(TypeError, match=r"X=.* must hold only numbers \(float\(\) argument must be"):
        LinearRegressionGD(backend="numpy").fit(np.array([[1.0], [{"a": 1}]], dtype=object), np.ones(2))
    with pytest.warns(DataConversionWarning, match="A column-vector y was passed"):
        LinearRegressionGD(backend="numpy").fit(np.ones((3, 1)) * [[1], [2], [3]], np.ones((3, 1)))


def test_not_fitted_is_also_scikit_learns_error_where_it_is_in_use():
    exceptions = pytest.importorskip("sklearn.exceptions")
    with pytest.raises(exceptions.NotFittedError) as caught:
        LinearRegressionGD().predict(np.ones((2, 1)))
    assert isinstance(caught.value, NotFittedError)


@pytest.mark.parametrize("backend", ["numpy", "auto"])
def test_scikit_learn_check_estimator_passes(backend, empty_cache):
    """Every check of scikit-learn's check_estimator runs and passes, but those named in SKIPPED_CHECKS (the
    estimator's docstring names them too), which skip themselves without pandas or the array API."""
    pytest.importorskip("sklearn")
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skips' SkipTestWarning, the UncalibratedWarning of "auto"
        results = check_estimator(LinearRegressionGD(backend=backend), on_fail=None, on_skip=None)
    failed = {r["check_name"]: str(r["exception"])[:300] for r in results if r["status"] == "failed"}
    skipped = {r["check_name"] for r in results if r["status"] == "skipped"}
    assert not failed
    assert skipped <= set(SKIPPED_CHECKS), skipped - set(SKIPPED_CHECKS)
    assert sum(r["status"] == "passed" for r in results) >= 50


# -- no calibration inside fit ---------------------------------------------------------------------


def test_first_fit_never_calibrates_and_says_what_it_ran(empty_cache, monkeypatch):
    from core.costmodel import calibrate

    def refuse(*args, **kwargs):
        raise AssertionError("fit calibrated")

    monkeypatch.setattr(calibrate, "calibrate_solver", refuse)
    problem = multi_problem(epochs=5)
    with pytest.warns(UncalibratedWarning, match=r"not calibrated on this machine, so backend='auto' fits on "
                                                  r"'numpy' \(no calibration inside fit\); run `crossover calibrate"):
        estimator = LinearRegressionGD(n_epochs=5).fit(*problem.data())
    assert estimator.backend_ == "numpy"
    for _ in range(2):  # later fits too: the in-process samples give numpy a model, never a calibration
        assert LinearRegressionGD(n_epochs=5).fit(*problem.data()).backend_ == "numpy"


def test_fit_runs_the_cost_models_pick_once_calibrated(empty_cache):
    core.calibrate(["ml.linreg"], budget=2.0, progress=False)
    problem = multi_problem(n=20_000, epochs=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncalibratedWarning)
        estimator = LinearRegressionGD(n_epochs=5).fit(*problem.data())
    assert estimator.backend_ in LINREG.backends
    assert_same_trajectory({"coef": estimator.coef_, "intercept": estimator.intercept_,
                            "loss_curve": estimator.loss_curve_, "n_iter": estimator.n_iter_},
                           solve_numpy(LinRegProblem(X=problem.X, y=problem.y, n_epochs=5, w0=0.0, b0=0.0)))


# -- DotGAT's limits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "message"), [
    ({"lr": 1e86}, r"lr=1e\+86 is invalid: must be a finite number > 0 and <= 1$"),
    ({"lr": 1.5}, r"lr=1.5 is invalid: must be a finite number > 0 and <= 1$"),
    ({"lr": 0.0}, r"lr=0.0 is invalid: must be a finite number > 0 and <= 1$"),
    ({"lr": float("inf")}, r"lr=inf is invalid"),
    ({"n_steps": 0}, r"n_steps=0 is invalid: must be an integer >= 1$"),
    ({"rho": 1.5}, r"rho=1.5 is invalid: must be a finite number > 0 and <= 1$"),
    ({"seed": -1}, r"seed=-1 is invalid"),
    ({"T": 10**30}, r"T=.* is invalid: must be an integer >= 1 and <= 9223372036854775807$"),
])
def test_dotgat_fields_are_checked_in_one_line(params, message):
    from plugins.ml.dotgat.problem import DotGATProblem

    with pytest.raises(ProblemError, match=message):
        DotGATProblem(**params)


def test_dotgat_lr_at_its_bound_is_accepted():
    from plugins.ml.dotgat.problem import LR_MAX, DotGATProblem

    assert DotGATProblem(lr=LR_MAX).lr == 1.0


@pytest.mark.parametrize("params", [{"n_steps": 10**15}, {"rank": 10**9}, {"T": 10**6}, {"n_val": 10**13}])
def test_dotgat_sizes_beyond_memory_are_a_one_line_refusal_before_any_work(params):
    """Huge fields that build arrays before the first step (the schedule's picks, the GP's draws and kernel)
    are in the memory estimate, so the named backend refuses them instead of torch or NumPy failing to
    allocate."""
    pytest.importorskip("torch")
    from plugins.ml.dotgat.problem import DotGATProblem

    problem = DotGATProblem(**{"batch": 4, "n_train": 8, "n_val": 4, "n_steps": 2, **params})
    with pytest.raises(core.NotEnoughMemoryError) as caught:
        core.solve(problem, backend="torch_cpu:optimized", solver="ml.dotgat", max_seconds=float("inf"))
    assert "\n" not in str(caught.value) and "not enough memory" in str(caught.value)


@pytest.mark.gpu
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("backend", ["torch:eager", "torch:compile"])
def test_gpu_variants_agree_on_features_and_weights(backend, weights):
    problem = multi_problem(n=200_003, weights=weights)
    assert_same_trajectory(core.solve(problem, backend=backend, solver="ml.linreg").outputs, solve_numpy(problem))


@pytest.mark.gpu
def test_gpu_refuses_float32_overflow_and_routes_several_features_away_from_the_graph():
    with pytest.raises(core.BackendUnavailableError, match="beyond float32's range"):
        core.solve(overflowing(), backend="torch", solver="ml.linreg")
    with pytest.raises(core.BackendUnavailableError, match="Triton epoch fits one feature"):
        core.solve(multi_problem(), backend="torch:graph", solver="ml.linreg")
    assert core.solve(multi_problem(), backend="torch", solver="ml.linreg").backend != "torch:graph"


def test_command_line_parameters_still_convert():
    """``--param w0=0.5 --param n_features=2``: text becomes the fields' numbers (w0 is a number or an array)."""
    from core.problem import make_problem

    problem = make_problem(LinRegProblem, {"w0": "0.5", "n_features": "2", "n_samples": "100"})
    assert problem.w0 == 0.5 and problem.n_features == 2 and problem.coef0().tolist() == [0.5, 0.5]


def test_the_values_a_pass_reads_beyond_the_last_level_cache_are_a_feature(monkeypatch):
    from core import backend

    monkeypatch.setattr(specs_module, "last_level_cache_bytes", lambda: 8.0 * 1_000_000)  # a million values fit
    small, large = LinRegProblem(n_samples=400_000, n_epochs=5), LinRegProblem(n_samples=3_000_000, n_epochs=5)
    assert linreg_features(small)["spilled_samples"] == 0  # 800,000 values (X and y) fit
    assert linreg_features(large)["spilled_samples"] == 6_000_000 - 1_000_000
    assert linreg_features(large)["spilled_sample_epochs"] == 5 * 5_000_000
    # the host's own figure: sysfs's largest data cache, or 32 MiB where it does not say
    assert backend.last_level_cache_bytes("/nonexistent") == 32 * 2**20 and backend.last_level_cache_bytes() > 0
