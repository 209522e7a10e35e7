"""Bad input, class by class: overflow, bounds from the numerics, dtypes, blame, memory, non-finite results.

Each test pins one class of fault of issue 9 with the library's own error
(or, where a value is valid, with what must then hold); the random search
over every solver's fields is in ``tests/test_input_fuzz.py``.
"""

from __future__ import annotations

import math
import pathlib
import tracemalloc
import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import core
from core import backend as host
from core.errors import ProblemError
from core.problem import make_problem
from core.result import NonFiniteResultWarning, Result
from core.validation import INT64_MAX, check_array, check_float, check_int
from plugins.example import _features as walk_features
from plugins.example import _memory as walk_memory
from plugins.example.problem import RandomWalkProblem
from plugins.mfg import work
from plugins.mfg.problem import CommonNoiseProblem, FPProblem, HJBProblem, MFGProblem

# -- numbers that overflow float64 or int64 --------------------------------------------


@pytest.mark.parametrize(("make", "field"), [
    (lambda: HJBProblem(T=10**354), "T"),
    (lambda: HJBProblem(T=Fraction(10**400, 3)), "T"),
    (lambda: HJBProblem(sigma=-Fraction(10**400, 7)), "sigma"),
    (lambda: HJBProblem(T=Decimal("1e400")), "T"),
    (lambda: HJBProblem(T=Decimal("sNaN")), "T"),
    (lambda: HJBProblem(V=[10**400] * 51), "V"),
    (lambda: HJBProblem(newton_max=10**69), "newton_max"),
    (lambda: HJBProblem(Nx=10**400), "Nx"),
    (lambda: RandomWalkProblem(n_walkers=1e30), "n_walkers"),
    (lambda: RandomWalkProblem(n_walkers=Fraction(10**400, 1)), "n_walkers"),
    (lambda: RandomWalkProblem(seed=2**64), "seed"),
])
def test_overflowing_numbers_give_the_librarys_error_naming_the_field(make, field):
    with pytest.raises(ProblemError) as caught:
        make()
    message = str(caught.value)
    assert message.startswith(f"{field}=") and "\n" not in message
    assert len(message) < 300  # a 400-digit number is summarised, not printed


def test_exact_whole_numbers_of_any_type_are_accepted_as_counts():
    assert check_int("n", Fraction(8, 2)) == 4
    assert check_int("n", Decimal("12")) == 12
    assert check_int("n", np.int64(7)) == 7
    assert check_int("n", 2**63 - 1) == INT64_MAX
    with pytest.raises(ProblemError, match=r"^n=9223372036854775808 is invalid: must be an integer >= 1 and "
                                           r"<= 9223372036854775807$"):
        check_int("n", 2**63, minimum=1)
    with pytest.raises(ProblemError, match=r"^n=np\.True_ is invalid: must be an integer$"):
        check_int("n", np.bool_(True))
    assert check_float("x", Fraction(1, 3)) == 1 / 3
    with pytest.raises(ProblemError, match=r"^x=Decimal\('-1E\+400'\) is invalid: must be a finite number$"):
        check_float("x", Decimal("-1e400"))


def test_cli_text_that_overflows_is_refused_in_the_validators_words():
    with pytest.raises(ProblemError, match=r"^n_walkers=inf is invalid: must be an integer >= 1$"):
        make_problem(RandomWalkProblem, {"n_walkers": "1e400"})
    with pytest.raises(ProblemError, match=r"^n_walkers='many' is invalid: must be an integer$"):
        make_problem(RandomWalkProblem, {"n_walkers": "many"})
    with pytest.raises(ProblemError, match=r"^drift=inf is invalid: must be a finite number$"):
        make_problem(RandomWalkProblem, {"drift": "1e400"})
    # a field that takes a number or a name: the name reaches the field's own check
    assert make_problem(HJBProblem, {"bandwidth": "silverman"}).bandwidth == "silverman"
    with pytest.raises(ProblemError, match=r"^bandwidth='wide' is invalid: must be one of 'scott', 'silverman'$"):
        make_problem(HJBProblem, {"bandwidth": "wide"})


def test_one_wording_for_integers_and_numbers_everywhere():
    """No message says "must be a int" or "must be a float": the validators' words are the only ones."""
    root = pathlib.Path(__file__).resolve().parents[1]
    offenders = [str(path.relative_to(root)) for folder in ("core", "plugins") for path in (root / folder).rglob("*.py")
                 if any(f"must be a {word}" in path.read_text() for word in ("int", "float", "bool", "{"))]
    assert offenders == []


# -- values the validator must bound by what the numerics represent ----------------------


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"xmax": 1e308}, "xmax", "must be a finite number >= -1.1037e+144 and <= 1.1037e+144"),
    ({"xmin": 0.0, "xmax": 1e-263}, "xmax", "the grid spacing dx=(xmax-xmin)/Nx is 1.96e-265"),
    ({"xmin": 1e9, "xmax": 1e9 + 1e-5}, "xmax", "too fine for coordinates near 1e+09"),
    ({"sigma": 1e308}, "sigma", "the implicit step's diagonal"),
    ({"sigma": 1e7}, "sigma", "condition number"),
    ({"T": 1e-320}, "T", "the time step dt=T/Nt"),
    ({"lam": 1e305}, "lam", "lam/dx**2"),
    ({"congestion_coef": 1e307}, "congestion_coef", "the largest congestion cost"),
    ({"bandwidth": 1e300}, "bandwidth", "the kernel's reach"),
    ({"bandwidth": 1e-320}, "bandwidth", "must be between"),
])
def test_mfg_bounds_come_from_the_scheme(fields, field, says):
    with pytest.raises(ProblemError) as caught:
        HJBProblem(**fields)
    assert str(caught.value).startswith(f"{field}=") and says in str(caught.value)


def test_example_bounds_keep_positions_and_bins_representable():
    with pytest.raises(ProblemError, match=r"^step_std=1e\+300 is invalid: .* sum of squares stays finite"):
        RandomWalkProblem(step_std=1e300)
    with pytest.raises(ProblemError, match=r"^drift=1e\+17 is invalid: the histogram's 64 bins .* cannot be told"):
        RandomWalkProblem(drift=1e17)
    edges = RandomWalkProblem(drift=1e10, n_steps=4).bin_edges()  # 4e10 +- 12: still 64 distinct bins
    assert np.all(np.diff(edges) > 0)


def test_a_drift_that_overflows_or_outruns_the_wrapping_is_refused_naming_U():
    u = np.zeros((51, 51))
    u[:, ::2] = 1e308
    with pytest.raises(ProblemError, match=r"^U=.* a particle's largest drift step, .* is inf"):
        FPProblem(U=u)
    u[:, ::2] = 1e12  # finite, but a step of 1e12 lengths could not be wrapped back with 20 bits left
    with pytest.raises(ProblemError, match=r"^U=.* largest drift step, .* must be between 0 and 4\.29e\+09"):
        FPProblem(U=u)
    assert FPProblem(U=np.full((51, 51), 1e12)).U[0, 0] == 1e12  # a constant U does not drive anyone


# -- arrays of the wrong kind ----------------------------------------------------------------


@pytest.mark.parametrize(("value", "kind"), [
    (np.ones(51) + 1j, "complex dtype complex128"),
    (np.ones(51, dtype=bool), "bool dtype bool"),
    (np.arange(51).astype("datetime64[s]"), "datetime dtype datetime64[s]"),
    (np.arange(51).astype("timedelta64[s]"), "timedelta dtype timedelta64[s]"),
    (np.array([1.0] * 50 + [None], dtype=object), "object dtype object"),
    (["1.5"] * 51, "string dtype <U3"),
    (np.array([b"1"] * 51), "bytes dtype |S1"),
    ([1.0, [2.0, 3.0]] + [1.0] * 49, "with the same length in every row"),
])
def test_arrays_of_refused_dtypes_say_what_is_allowed(value, kind):
    with pytest.raises(ProblemError) as caught:
        HJBProblem(V=value)
    message = str(caught.value)
    assert message.startswith("V=") and "must be an array of real numbers (integer or float dtype)" in message
    assert kind in message


def test_integer_and_single_precision_arrays_are_accepted_as_float64():
    assert check_array("V", np.arange(3, dtype=np.int8)).dtype == np.float64
    assert check_array("V", np.ones(3, dtype=np.float32)).dtype == np.float64
    with pytest.raises(ProblemError, match=r"^V=array\(shape=\(2,\), dtype=float32\) is invalid: must be finite, "
                                           r"found 1 NaN or inf"):
        check_array("V", np.array([1.0, np.inf], dtype=np.float32))
    with pytest.raises(ProblemError, match=r"^V=array\(shape=\(2,\), dtype=float\d+\) is invalid: must be finite"):
        check_array("V", np.array([1.0, 1e4000], dtype=np.longdouble))  # finite in longdouble, inf in float64


# -- errors blame the field the user set ---------------------------------------------------


def test_a_domain_that_misses_the_presets_crowd_blames_the_domain_not_m0():
    with pytest.raises(ProblemError) as caught:
        HJBProblem(xmin=-4331)
    message = str(caught.value)
    assert message.startswith("xmin=-4331.0 is invalid: the preset 'towel_beach' starts the crowd near x=0.5")
    assert "m0 must" not in message


def test_the_domain_field_set_by_the_user_is_the_one_blamed():
    with pytest.raises(ProblemError, match=r"^xmin=1\.0 is invalid: must be less than xmax=1$"):
        HJBProblem(xmin=1.0)
    with pytest.raises(ProblemError, match=r"^xmax=0\.0 is invalid: must be greater than xmin=0$"):
        HJBProblem(xmax=0.0)
    with pytest.raises(ProblemError, match=r"^m0=.* must have positive mass"):
        HJBProblem(m0=np.zeros(51))  # a density given as zeros is the density's fault


def test_fields_are_checked_before_the_fields_derived_from_them():
    with pytest.raises(ProblemError, match=r"^Nx=2 is invalid"):
        HJBProblem(Nx=2, V=np.zeros(7))  # not "V must have shape (2,)"
    with pytest.raises(ProblemError, match=r"^T=-1 is invalid"):
        CommonNoiseProblem(T=-1, noise=1e308)


def test_a_huge_or_tiny_density_is_normalised_exactly():
    for scale in (1e300, 1e-300):
        m0 = HJBProblem(m0=np.full(51, scale)).m0
        assert np.all(np.isfinite(m0))
        assert math.isclose(float(np.sum(m0 * HJBProblem().weights())), 1.0, rel_tol=1e-12)


# -- memory --------------------------------------------------------------------------------


def _peak_bytes(make) -> int:
    tracemalloc.start()
    try:
        make()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_constructing_a_huge_grid_allocates_nothing_of_its_size():
    peak = _peak_bytes(lambda: HJBProblem(Nx=1e5, Nt=1e5))
    assert peak < 50e6  # the (Nt+1, Nx) density alone would be 80 GB
    problem = HJBProblem(Nx=1e5, Nt=1e5)
    assert problem.M.shape == (100_001, 100_000) and not problem.M.flags.writeable
    assert np.array_equal(problem.M[-1], problem.m0)
    assert work.hjb_memory(problem, "numpy") >= 4 * 8 * 100_001 * 100_000  # what a solve would need: refused
    assert _peak_bytes(lambda: FPProblem(Nx=1e5, Nt=1e5, N=10)) < 50e6


def test_default_space_time_fields_solve_as_before():
    """The broadcast default density gives the same U as the explicit array it stands for."""
    from plugins.mfg.hjb.reference import solve_numpy

    lazy = HJBProblem(Nx=21, Nt=10)
    explicit = HJBProblem(Nx=21, Nt=10, M=np.tile(lazy.m0, (11, 1)))
    assert np.array_equal(solve_numpy(lazy)["U"], solve_numpy(explicit)["U"])


def test_a_trillion_walkers_plan_without_building_their_chunks():
    problem = RandomWalkProblem(n_walkers=10**12)
    peak = _peak_bytes(lambda: (walk_features(problem), [walk_memory(problem, b) for b in ("numpy", "numba")],
                                len(problem.chunks()), problem.chunks()[-1]))
    assert peak < 10e6
    chunks = problem.chunks()
    assert len(chunks) == problem.n_chunks == -(-10**12 // 32_768)
    assert chunks[-1] == ((len(chunks) - 1) * 32_768, 10**12 - (len(chunks) - 1) * 32_768)
    # what each backend would hold: every position and stream key on numba and torch, the bookkeeping of
    # 3e7 chunks on numpy; all far beyond this machine, so the memory check can refuse them
    assert walk_memory(problem, "numba") >= 16 * 10**12
    assert walk_memory(problem, "torch") >= 24 * 10**12
    assert walk_memory(problem, "numpy") >= len(chunks) * 1024
    assert all(math.isfinite(v) for v in walk_features(problem).values())


def test_lazy_chunks_match_the_eager_list():
    problem = RandomWalkProblem(n_walkers=100_003, chunk=1000)
    eager = [(start, min(1000, 100_003 - start)) for start in range(0, 100_003, 1000)]
    assert list(problem.chunks()) == eager and problem.chunks()[3:5] == eager[3:5]
    with pytest.raises(IndexError):
        problem.chunks()[len(eager)]


def test_mfg_memory_counts_the_host_kde_matrix():
    problem = FPProblem(Nx=100_000, N=10)
    assert work.fp_memory(problem, "numpy") >= 8 * 100_000**2  # the (Nx, Nx) smoothing matrix


# -- free memory: ulimit -v and cgroups -------------------------------------------------------


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_room_is_the_tightest_of_the_group_and_its_parents(tmp_path):
    _write(tmp_path / "proc", "0::/user.slice/job\n")
    mount = tmp_path / "cgroup"
    _write(mount / "user.slice/job/memory.max", f"{4 * 2**30}\n")
    _write(mount / "user.slice/job/memory.current", f"{1 * 2**30}\n")
    _write(mount / "user.slice/job/memory.stat", f"anon 123\ninactive_file {2**29}\nactive_file 7\n")
    assert host.cgroup_room(str(tmp_path / "proc"), str(mount)) == 4 * 2**30 - 2**29  # cache is reclaimable
    _write(mount / "user.slice/memory.max", f"{2 * 2**30}\n")
    _write(mount / "user.slice/memory.current", f"{2**30}\n")
    assert host.cgroup_room(str(tmp_path / "proc"), str(mount)) == 2**30
    _write(mount / "user.slice/memory.max", "max\n")
    _write(mount / "user.slice/job/memory.max", "max\n")
    assert host.cgroup_room(str(tmp_path / "proc"), str(mount)) is None


def test_cgroup_v1_room_and_its_unlimited_marker(tmp_path):
    _write(tmp_path / "proc", "5:cpu,cpuacct:/\n4:memory:/process_api/abc\n0::/\n")
    group = tmp_path / "cgroup/memory/process_api/abc"
    _write(group / "memory.limit_in_bytes", f"{3 * 2**30}\n")
    _write(group / "memory.usage_in_bytes", f"{2**30}\n")
    _write(group / "memory.stat", "cache 5\ntotal_inactive_file 0\n")
    _write(tmp_path / "cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    assert host.cgroup_room(str(tmp_path / "proc"), str(tmp_path / "cgroup")) == 2 * 2**30
    _write(group / "memory.usage_in_bytes", f"{5 * 2**30}\n")  # over the limit: no room, never negative
    assert host.cgroup_room(str(tmp_path / "proc"), str(tmp_path / "cgroup")) == 0.0


def test_missing_or_junk_cgroup_files_mean_no_limit_known(tmp_path):
    assert host.cgroup_room(str(tmp_path / "absent"), str(tmp_path)) is None
    _write(tmp_path / "proc", "garbage\n0::/x\n")
    _write(tmp_path / "cgroup/x/memory.max", "lots\n")
    assert host.cgroup_room(str(tmp_path / "proc"), str(tmp_path / "cgroup")) is None


def test_ulimit_v_is_the_address_space_left(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (3 * 2**30, resource.RLIM_INFINITY))
    monkeypatch.setattr(host, "_mapped_bytes", lambda: 2**30)
    assert host.address_space_room() == 2 * 2**30
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert host.address_space_room() is None


def test_host_free_memory_takes_the_smallest_limit(monkeypatch):
    monkeypatch.setattr(host, "_mem_available", lambda: 24e9)
    monkeypatch.setattr(host, "address_space_room", lambda: 8e9)
    monkeypatch.setattr(host, "cgroup_room", lambda: 3e9)
    assert host.host_free_memory() == 3e9
    monkeypatch.setattr(host, "cgroup_room", lambda: None)
    assert host.host_free_memory() == 8e9
    monkeypatch.setattr(host, "address_space_room", lambda: None)
    monkeypatch.setattr(host, "_mem_available", lambda: None)
    assert host.host_free_memory() is None


def test_host_free_memory_here_is_a_positive_number():
    free = host.host_free_memory()
    assert free is None or free > 0


# -- results holding NaN or inf are flagged --------------------------------------------------


def test_a_result_flags_its_non_finite_outputs_and_warns():
    outputs = {"U": np.array([1.0, np.nan]), "counts": np.array([1, 2]), "mass": np.array([1.0, np.inf]),
               "ok": np.ones(3)}
    with pytest.warns(NonFiniteResultWarning, match=r"x\.y on numpy returned NaN or inf in U, mass"):
        result = Result("x.y", "numpy", 0.1, outputs, diagnostics={"first_call": True})
    assert result.diagnostics == {"first_call": True, "non_finite_outputs": ["U", "mass"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean = Result("x.y", "numpy", 0.1, {"ok": np.ones(3), "name": np.array("text")})
    assert clean.diagnostics["non_finite_outputs"] == []


def test_a_horizon_the_implicit_step_cannot_resolve_is_refused_naming_T():
    """T=4.7e16 used to return a non-finite U with no word: dt then swamps the diagonal's 1/dt."""
    with pytest.raises(ProblemError, match=r"^T=4\.7e\+16 is invalid: the implicit step's condition number"):
        HJBProblem(T=4.7e16)
    with pytest.raises(ProblemError, match=r"^sigma=1000\.0 is invalid: the implicit step's condition number"):
        HJBProblem(sigma=1e3, T=1e6)  # the user's sigma is blamed when they set it


def test_a_solve_that_overflows_is_flagged_by_the_solve(empty_cache):
    """A potential of +-1e300 is finite and valid; the Newton steps overflow on it: the Result must say so."""
    v = np.zeros(21)
    v[::2] = 1e300
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = core.solve(HJBProblem(Nx=21, Nt=10, V=v), backend="numpy")
    flagged = result.diagnostics["non_finite_outputs"]
    assert flagged == [name for name, value in result.outputs.items()
                       if np.issubdtype(np.asarray(value).dtype, np.inexact) and not np.all(np.isfinite(value))]
    assert flagged == ["U"]
    assert any(issubclass(w.category, NonFiniteResultWarning) for w in caught)


def test_a_particle_made_nan_stays_inside_numbas_histogram():
    """A diverged drift makes particles NaN: numba must not index outside its histograms (memory safety).

    The problem refuses such a U, so the kernel is handed it directly, as a coupled solver's step could.
    """
    pytest.importorskip("numba")
    from plugins.mfg.fp.numba_kernel import solve_particles

    u = np.zeros((11, 21))
    u[:, ::2] = 1e300
    problem = FPProblem(Nx=21, Nt=10, N=64, lam=1e5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fused in (True, False):
            out = solve_particles(problem, U=u, fused=fused)
            assert not np.all(np.isfinite(out["moments"]))  # the NaN shows where it belongs
            assert np.all(np.isfinite(out["M"])) and np.allclose(out["M"] @ problem.weights(), 1.0)


def test_coupled_problems_keep_their_bounds():
    with pytest.raises(ProblemError, match=r"^max_iter=.* must be an integer >= 1 and <= 9223372036854775807"):
        MFGProblem(max_iter=2**63)
    with pytest.raises(ProblemError, match=r"^noise=1e\+307 is invalid: the common noise's largest shift"):
        CommonNoiseProblem(noise=1e307)
