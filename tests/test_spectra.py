"""The spectrum fitter: library, model, fit, bad data, FITS I/O and the CLI, each against an independent truth."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from core.errors import ProblemError
from plugins.spectra import fit as fitmod
from plugins.spectra import templates as T
from plugins.spectra.accuracy import interpolation_error
from plugins.spectra.model import (
    C_KMS,
    Spectra,
    corners,
    evaluate,
    interpolate_logflux,
    log_doppler,
    prepare,
    rotation_kernel,
)
from plugins.spectra.ops import NumpyOps, TorchOps
from plugins.spectra.solve import fit_batch, numba_ops
from plugins.spectra.synth import clean_flux, synthetic_spectra


@pytest.fixture(scope="module")
def library() -> T.TemplateLibrary:
    return T.named_library("small")


@pytest.fixture(scope="module")
def batch(library) -> Spectra:
    return synthetic_spectra(library, 12, snr=30, seed=5)


# -- the template library -------------------------------------------------------------------------


def test_library_is_deterministic_for_a_seed_and_differs_between_seeds():
    grid = T.GridSpec(teff=(5000.0, 6000.0), logg=(3.0, 4.0), feh=(-1.0, 0.0), alpha=(0.0, 0.4))
    a, b, c = T.Generator(3).library(grid), T.Generator(3).library(grid), T.Generator(4).library(grid)
    assert np.array_equal(a.logflux, b.logflux)
    assert not np.allclose(a.logflux, c.logflux)


def test_library_covers_the_arms_with_the_shift_margin(library):
    wave = library.wave
    margin = (T.V_MAX + T.VSINI_MAX) / C_KMS
    assert wave[0] <= T.ARMS[0][1] * (1 - margin) and wave[-1] >= T.ARMS[-1][2] * (1 + margin)
    # a log-wavelength grid: constant velocity step
    steps = np.diff(np.log(wave)) * C_KMS
    assert np.allclose(steps, T.TEMPLATE_STEP_KMS, rtol=1e-4)


@pytest.mark.parametrize("line", ["H-alpha", "H-beta", "Ca II K", "Mg b1", "Na D2", "Ca II 8542"])
def test_named_lines_are_absorption_features_at_their_wavelengths(library, line):
    centre = dict((s[0], s[1]) for s in T.STRONG_LINES)[line]
    node = library.node_index((1, 1, 2, 0))
    flux = np.exp(library.logflux[node])
    wave = library.wave
    at_line = flux[np.argmin(np.abs(wave - centre))]
    nearby = flux[(np.abs(wave - centre) > 15) & (np.abs(wave - centre) < 40)]
    assert at_line < 0.8 * np.median(nearby)


def test_balmer_lines_strengthen_and_metal_lines_weaken_with_temperature(library):
    wave = library.wave
    cool, hot = library.node_index((0, 1, 2, 0)), library.node_index((3, 1, 2, 0))

    def depth(node, centre):
        flux = np.exp(library.logflux[node] - T.upper_envelope(library.logflux[node : node + 1])[0])
        return 1 - flux[np.argmin(np.abs(wave - centre))]

    assert depth(hot, 4861.33) > depth(cool, 4861.33)
    assert depth(hot, 5183.60) < depth(cool, 5183.60)


def test_save_and_load_round_trip_exactly(library, tmp_path):
    path = T.save(library, tmp_path / "lib.npz")
    again = T.load(path)
    assert np.array_equal(again.logflux, library.logflux)
    assert all(np.array_equal(a, b) for a, b in zip(again.axes, library.axes))
    assert (again.ln_wave0, again.dlnw, again.seed) == (library.ln_wave0, library.dlnw, library.seed)
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, renamed


def test_a_damaged_library_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz file at all")
    with pytest.raises(ProblemError, match=r"template library .*bad\.npz.* cannot be read"):
        T.load(bad)


def test_unknown_grid_name_is_refused():
    with pytest.raises(ProblemError, match="grid='huge' is invalid: must be one of small, medium, realistic"):
        T.generate("huge")


def test_interpolation_is_exact_at_nodes_and_linear_along_an_axis(library):
    nodes = [library.node_index((1, 2, 0, 1)), library.node_index((2, 2, 0, 1))]
    params = np.array([library.node_params(n) for n in nodes])
    assert np.allclose(interpolate_logflux(library, params, NumpyOps()), library.logflux[nodes], atol=1e-6)
    mid = params.mean(axis=0, keepdims=True)
    expected = 0.5 * (library.logflux[nodes[0]].astype(np.float64) + library.logflux[nodes[1]])
    assert np.allclose(interpolate_logflux(library, mid, NumpyOps())[0], expected, atol=1e-6)


def test_evenly_spaced_axes_find_the_same_cells_as_the_search_for_uneven_ones(library):
    """The arithmetic cell lookup (every named grid) against the per-axis search a library file may need,
    inside the grid, on its edges and beyond them (clipped); weights sum to 1 and their slopes to 0."""
    prep = prepare(NumpyOps(), library, library.wave[500:2500], np.zeros(2000, dtype=int), 2)
    assert prep.even_axes is not None
    lower, upper = np.array([a[0] for a in library.axes]), np.array([a[-1] for a in library.axes])
    theta = np.random.default_rng(4).uniform(lower - 0.1 * (upper - lower), upper + 0.1 * (upper - lower), (200, 4))
    theta[:4] = [lower, upper, lower + 0.37 * (upper - lower), upper - 1e-9]
    even = corners(prep, theta, derivatives=True)
    searched = corners(replace(prep, even_axes=None, constants={}), theta, derivatives=True)
    for a, b in zip(even, searched):
        assert np.allclose(a, b, rtol=0, atol=1e-12)
    assert np.allclose(even[1].sum(axis=1), 1.0, atol=1e-12)
    assert np.allclose(even[2].sum(axis=1), 0.0, atol=1e-9)


def test_interpolation_error_shrinks_with_a_finer_grid():
    """The coarse test grid against a finer one over the same box: the error must drop (second order)."""
    generator = T.Generator(0)
    coarse = generator.library(T.GridSpec(teff=(5000.0, 6000.0), logg=(3.0, 4.0), feh=(-1.0, 0.0), alpha=(0.0, 0.4)))
    fine = generator.library(T.GridSpec(teff=(5000.0, 5500.0, 6000.0), logg=(3.0, 3.5, 4.0), feh=(-1.0, -0.5, 0.0),
                                        alpha=(0.0, 0.2, 0.4)))
    e_coarse = interpolation_error(coarse, generator, n=40)["rms"]
    e_fine = interpolation_error(fine, generator, n=40)["rms"]
    assert e_fine < 0.5 * e_coarse


# -- the model ------------------------------------------------------------------------------------


def test_relativistic_doppler_factor():
    v = np.array([-1000.0, -10.0, 0.0, 250.0, 1000.0])
    beta = v / C_KMS
    assert np.allclose(np.exp(log_doppler(v, np)), np.sqrt((1 + beta) / (1 - beta)), rtol=1e-14)


def test_rotation_kernel_is_normalised_symmetric_and_has_the_profiles_width(library):
    prep = prepare(NumpyOps(), library, *_arm_pixels(), 1)
    step = prep.step_kms
    vsini = np.array([0.0, 3.0, 60.0, 250.0])
    kernel = rotation_kernel(prep, vsini, 25)
    assert np.allclose(kernel.sum(axis=1), 1.0)
    assert np.allclose(kernel, kernel[:, ::-1])
    # the limb-darkened profile's second moment <u^2>, from its analytic integrals
    eps = 0.6
    area = math.pi * (1 - eps / 3)
    u2 = (2 * (1 - eps) * math.pi / 8 + math.pi * eps / 2 * 4 / 15) / area
    assert kernel[0, 25] == pytest.approx(1.0, abs=1e-12)  # a delta at vsini = 0
    m = np.arange(-25, 26) * step
    variance = (kernel * m**2).sum(axis=1)
    # the cubic basis adds no variance: exactly the profile's (tent sharing added step^2 / 6)
    assert np.allclose(variance, vsini**2 * u2, rtol=1e-9, atol=1e-9)


def _arm_pixels(n: int | None = None):
    from plugins.spectra.model import arm_wavelengths

    return arm_wavelengths(n)


def test_noise_free_spectrum_at_the_truth_has_zero_chisq_and_the_true_continuum(library, batch):
    clean = clean_flux(library, batch, 3, seed=5)
    prep = prepare(NumpyOps(), library, batch.wave, batch.arm, 3)
    _, weight = batch.clean()
    at_truth = evaluate(prep, batch.truth, clean, weight)
    assert np.all(at_truth.chi2 < 1e-12 * np.sum(weight * clean**2, axis=1))


def test_analytic_jacobian_matches_finite_differences(library):
    """At the truth of a noise-free spectrum the projected Jacobian is the derivative of the profiled model."""
    # inside grid cells (multilinear: the derivative jumps at nodes), vsini above the one-pixel kernel
    p = np.array([[-123.4, 33.0, 5100.0, 2.7, -0.4, 0.13], [401.0, 47.0, 6311.0, 4.3, -1.1, 0.31],
                  [5.0, 21.0, 4712.0, 3.1, -0.2, 0.07]])
    spectra = synthetic_spectra(library, 3, snr=30, seed=6, params=p)
    clean = clean_flux(library, spectra, 3, seed=6)
    prep = prepare(NumpyOps(), library, spectra.wave, spectra.arm, 3)
    weight = np.ones_like(clean)
    base = evaluate(prep, p, clean, weight, jac=True, keep_jacobian=True)
    steps = [0.05, 0.05, 0.5, 1e-3, 1e-3, 1e-3]  # small enough to stay within one grid cell
    for k, h in enumerate(steps):
        up, down = p.copy(), p.copy()
        up[:, k] += h
        down[:, k] -= h
        numeric = (evaluate(prep, up, clean, weight).model - evaluate(prep, down, clean, weight).model) / (2 * h)
        analytic = base.jproj[:, k]
        # the profiled model's derivative: its component off the continuum's columns. In L2 over pixels:
        # the model is piecewise linear in v (and in theta across nodes), so a few pixels sit on a kink
        gap = np.linalg.norm(_project(prep, base, numeric) - analytic, axis=1) / np.linalg.norm(numeric, axis=1)
        assert np.all(gap < 0.01), (fitmod.PARAM_NAMES[k], gap)


def _project(prep, evaluation, vectors):
    """Remove from each row its weighted least-squares fit by the continuum design (unit weights)."""
    out = np.empty_like(vectors)
    template = evaluation.model / (prep.basis @ evaluation.coeffs.T).T
    for i in range(len(vectors)):
        design = prep.basis * template[i][:, None]
        coef, *_ = np.linalg.lstsq(design, vectors[i], rcond=None)
        out[i] = vectors[i] - design @ coef
    return out


# -- the fit --------------------------------------------------------------------------------------


def _pulls(out, truth):
    return (out["VRAD"] - truth[:, 0]) / out["VRAD_ERR"]


def test_every_backend_gives_the_same_answers_within_a_small_fraction_of_sigma(library, batch):
    reference = fit_batch(batch, library, NumpyOps(), method="scipy")
    for ops in (numba_ops(True), numba_ops(False), TorchOps("cpu")):
        out = fit_batch(batch, library, ops)
        assert np.all(out["SUCCESS"]), ops.name
        for name in ("VRAD", "TEFF", "LOGG", "FEH", "ALPHA"):
            gap = np.abs(out[name] - reference[name]) / reference[f"{name}_ERR"]
            assert np.max(gap) < 0.1, (ops.name, name, np.max(gap))
        assert np.allclose(out["VRAD_ERR"], reference["VRAD_ERR"], rtol=0.05)


def test_the_threaded_fit_is_reproducible_to_the_last_bit(library):
    """Numba's kernels run spectra on threads: each spectrum's arithmetic must not depend on the others',
    so the threaded build, run twice, and the serial build give the same bits."""
    from plugins.spectra.numba_kernels import PARALLEL_FROM

    spectra = synthetic_spectra(library, PARALLEL_FROM + 4, snr=30, seed=15)  # big enough for the threaded build
    first, second = fit_batch(spectra, library, numba_ops()), fit_batch(spectra, library, numba_ops(True))
    serial = fit_batch(spectra, library, numba_ops(False))
    for name in ("VRAD", "VRAD_ERR", "TEFF", "CHISQ"):
        assert np.array_equal(first[name], second[name]), name
        assert np.array_equal(first[name], serial[name]), name


def test_every_backend_in_a_process_shares_one_ccf_design_per_wavelength_grid(library):
    """The cross-correlation start's design (a dozen templates read at every pixel and lag) is built once per
    wavelength grid on the host and copied to each backend's device: a GPU trial after numba had fitted the
    same data built it again (161 ms of a 20 ms fit on the H200 host). The copies hold the same numbers, and
    the fits from them agree with a build of their own."""
    torch = pytest.importorskip("torch")
    spectra = synthetic_spectra(library, 2, snr=30, n_pixels=777, seed=5)
    fitmod._DESIGNS.clear()
    before = fitmod.BUILDS["built"]
    designs = {}
    for name, ops in (("numba", numba_ops(False)), ("numpy", NumpyOps()), ("torch", TorchOps("cpu"))):
        prep = prepare(ops, library, spectra.wave, spectra.arm, 3)
        designs[name] = fitmod.ccf_design(prep, library)
    assert fitmod.BUILDS["built"] == before + 1
    assert designs["numba"].shifted is designs["numpy"].shifted  # on the host: the very arrays
    np.testing.assert_array_equal(designs["torch"].shifted.numpy(), designs["numpy"].shifted)
    assert designs["torch"].shifted.dtype == torch.float32
    own = fitmod.on_device(fitmod.build_ccf_design(prepare(TorchOps("cpu"), library, spectra.wave, spectra.arm, 3)),
                           TorchOps("cpu"))
    np.testing.assert_array_equal(own.squared.numpy(), designs["torch"].squared.numpy())
    fit_batch(spectra, library, TorchOps("cpu"))
    assert fitmod.BUILDS["built"] == before + 1  # the fit found it


def test_the_ccf_start_finds_the_velocity_over_the_whole_range(library):
    params = np.array([[v, 10.0, 5500.0, 4.0, -0.5, 0.1] for v in (-950.0, -480.0, 0.0, 333.0, 960.0)])
    spectra = synthetic_spectra(library, len(params), snr=10, seed=8, params=params)
    prep = prepare(NumpyOps(), library, spectra.wave, spectra.arm, 3)
    flux, weight = spectra.clean()
    start = fitmod.ccf_start(prep, flux, weight)
    assert np.all(np.abs(start[:, 0] - params[:, 0]) < 3 * prep.step_kms)


def test_fit_spectra_through_the_core_names_the_backend(library):
    from plugins.spectra import fit_spectra

    spectra = synthetic_spectra(library, 4, snr=40, seed=9)
    result = fit_spectra(spectra, backend="numba")  # the device: the models pick serial or threads
    assert result.backend in ("numba:serial", "numba:threads")
    assert np.all(np.abs(_pulls(result.outputs, spectra.truth)) < 5)
    assert list(result.outputs["TARGETID"]) == list(spectra.targetid)


def test_the_process_backend_maps_chunks_and_agrees_with_numba(library):
    import core
    from plugins.spectra.problem import SpectraProblem

    # two chunks of four: the workers run the kernels the numba solve just compiled (and cached)
    problem = SpectraProblem(n_spectra=8, snr=25, seed=2)
    direct = core.solve(problem, backend="numba").outputs
    mapped = core.solve(problem, backend="process").outputs
    assert np.array_equal(mapped["TARGETID"], direct["TARGETID"])
    assert np.allclose(mapped["VRAD"], direct["VRAD"], atol=1e-6 * 1000)


# -- bad data -------------------------------------------------------------------------------------


def test_bad_spectra_are_flagged_and_never_abort_the_batch(library):
    spectra = synthetic_spectra(library, 6, snr=30, seed=12)
    flux, ivar = spectra.flux.copy(), spectra.ivar.copy()
    z = spectra.arm == 2
    ivar[0] = 0.0  # fully masked
    flux[1, ::3] = np.nan  # NaN in a third of the pixels
    ivar[2, z] = 0.0  # the Z arm missing
    flux[3] = 0.0  # zero signal
    flux[4] = np.nan  # all NaN
    bad = Spectra(wave=spectra.wave, arm=spectra.arm, flux=flux, ivar=ivar, targetid=spectra.targetid,
                  truth=spectra.truth)
    out = fit_batch(bad, library, numba_ops())
    flags = out["FLAGS"]
    assert flags[0] & fitmod.NO_DATA and flags[3] & fitmod.NO_DATA and flags[4] & fitmod.NO_DATA
    assert not out["SUCCESS"][[0, 3, 4]].any() and np.isnan(out["VRAD"][[0, 3, 4]]).all()
    assert flags[2] & fitmod.MISSING_ARM and out["SUCCESS"][2]
    assert out["SUCCESS"][[1, 2, 5]].all()
    assert np.all(np.abs(_pulls(out, spectra.truth)[[1, 2, 5]]) < 5)


def test_masked_pixels_are_ignored_whatever_their_flux(library):
    spectra = synthetic_spectra(library, 3, snr=30, seed=13, mask_fraction=0.05)
    out = fit_batch(spectra, library, numba_ops())
    corrupted = Spectra(wave=spectra.wave, arm=spectra.arm,
                        flux=np.where(spectra.ivar > 0, spectra.flux, 1e30).astype(np.float32), ivar=spectra.ivar,
                        targetid=spectra.targetid)
    again = fit_batch(corrupted, library, numba_ops())
    assert np.allclose(again["VRAD"], out["VRAD"], atol=1e-6)


def test_a_spectrum_of_pure_noise_is_flagged_not_fatal(library):
    spectra = synthetic_spectra(library, 3, snr=30, seed=14)
    rng = np.random.default_rng(0)
    flux = spectra.flux.copy()
    flux[1] = rng.standard_normal(flux.shape[1])
    ivar = spectra.ivar.copy()
    ivar[1] = 1.0
    noisy = Spectra(wave=spectra.wave, arm=spectra.arm, flux=flux, ivar=ivar, targetid=spectra.targetid)
    out = fit_batch(noisy, library, numba_ops())
    assert out["SUCCESS"][[0, 2]].all()
    assert np.isfinite(out["CHISQ"]).all()


def test_problem_validation_names_the_field(library):
    from plugins.spectra.problem import SpectraProblem

    with pytest.raises(ProblemError, match="max_iter=0 is invalid"):
        SpectraProblem(n_spectra=1, max_iter=0)
    with pytest.raises(ProblemError, match="grid='tiny' is invalid"):
        SpectraProblem(n_spectra=1, grid="tiny")
    spectra = synthetic_spectra(library, 2, seed=1)
    wrong = Spectra(wave=spectra.wave, arm=spectra.arm, flux=spectra.flux[:, :-1], ivar=spectra.ivar,
                    targetid=spectra.targetid)
    with pytest.raises(ProblemError, match=r"spectra.flux has shape \(2, 7957\): must be \(spectra, 7958\)"):
        SpectraProblem(spectra=wrong)


# -- FITS and the command line ------------------------------------------------------------------


def test_coadd_round_trip_and_a_missing_arm(library, tmp_path):
    from plugins.spectra.fitsio import read_coadd, write_coadd

    spectra = synthetic_spectra(library, 5, snr=20, seed=3)
    write_coadd(spectra, tmp_path / "c.fits")
    back = read_coadd(tmp_path / "c.fits", 1, 4)
    assert np.array_equal(back.flux, spectra.flux[1:4]) and np.array_equal(back.targetid, spectra.targetid[1:4])
    assert np.array_equal(back.ivar > 0, spectra.ivar[1:4] > 0)
    write_coadd(spectra, tmp_path / "noz.fits", drop_arms=("Z",))
    two = read_coadd(tmp_path / "noz.fits")
    assert two.arm_names == ("B", "R") and two.n_pixels == int((spectra.arm < 2).sum())
    out = fit_batch(two, library, numba_ops())
    assert out["SUCCESS"].all()


def test_malformed_fits_files_give_clear_errors(tmp_path):
    from astropy.io import fits

    from plugins.spectra.fitsio import read_coadd

    junk = tmp_path / "junk.fits"
    junk.write_text("SIMPLE = nonsense")
    with pytest.raises(ProblemError, match="not a readable FITS file"):
        read_coadd(junk)
    with pytest.raises(ProblemError, match="no such file"):
        read_coadd(tmp_path / "absent.fits")
    fits.HDUList([fits.PrimaryHDU()]).writeto(tmp_path / "nofibermap.fits")
    with pytest.raises(ProblemError, match="has no FIBERMAP HDU"):
        read_coadd(tmp_path / "nofibermap.fits")
    fibermap = fits.BinTableHDU.from_columns([fits.Column(name="TARGETID", format="K", array=np.arange(3))],
                                             name="FIBERMAP")
    fits.HDUList([fits.PrimaryHDU(), fibermap, fits.ImageHDU(np.arange(10.0), name="B_WAVELENGTH"),
                  fits.ImageHDU(np.zeros((2, 10)), name="B_FLUX"),
                  fits.ImageHDU(np.zeros((3, 10)), name="B_IVAR")]).writeto(tmp_path / "shape.fits")
    with pytest.raises(ProblemError, match=r"B_FLUX has shape \(2, 10\), expected \(3, 10\)"):
        read_coadd(tmp_path / "shape.fits")


def test_cli_fits_a_coadd_in_batches_and_streams_the_table(tmp_path, capsys):
    from astropy.io import fits

    from core.cli import main
    from plugins.spectra.fitsio import read_results

    coadd, out = tmp_path / "coadd.fits", tmp_path / "out.fits"
    assert main(["synth-coadd", str(coadd), "-n", "10", "--seed", "4", "--snr-min", "15", "--snr-max", "60"]) == 0
    assert main(["fit-spectra", str(coadd), "-o", str(out), "--backend", "numba", "--batch", "4"]) == 0
    captured = capsys.readouterr()
    assert "fitted 4/10" in captured.err and "fitted 10/10" in captured.err  # three batches, each written out
    table = read_results(out)
    truth = fits.getdata(coadd, "FIBERMAP")
    assert np.array_equal(table["TARGETID"], truth["TARGETID"])
    pulls = (table["VRAD"] - truth["TRUE_VRAD"]) / table["VRAD_ERR"]
    assert table["SUCCESS"].all() and np.all(np.abs(pulls) < 5)
    for column in ("VSINI_ERR", "TEFF_ERR", "LOGG_ERR", "FEH_ERR", "ALPHA_ERR", "CHISQ", "FLAGS"):
        assert column in table


def test_cli_rejects_a_malformed_input_with_exit_status_2(tmp_path, capsys):
    from core.cli import main

    junk = tmp_path / "junk.fits"
    junk.write_bytes(b"\x00" * 100)
    assert main(["fit-spectra", str(junk), "-o", str(tmp_path / "o.fits")]) == 2
    assert "not a readable FITS file" in capsys.readouterr().err


def test_batch_size_comes_from_the_memory_model(library):
    from plugins.spectra import work

    per = work.batch_bytes(100, 7958, 72, "torch") - work.batch_bytes(99, 7958, 72, "torch")
    size = work.largest_batch(7958, 72, "torch", free_bytes=2 * (work.batch_bytes(1, 7958, 72, "torch") + 50 * per),
                              limit=10**6)
    assert size == 51  # half of the free memory: the library and one spectrum, plus 50 more
    assert work.largest_batch(7958, 72, "torch", free_bytes=1.0, limit=10) == 0


def test_the_solver_is_registered_with_its_size_space_and_features():
    import core

    spec = core.solvers()["spectra.fit"]
    assert {"numpy", "numba:serial", "numba:threads", "torch"} <= set(spec.implementations)
    assert spec.parallel is not None
    space = spec.space(False)
    assert {"n_spectra", "n_pixels", "max_iter"} <= set(space.ranges) and "grid" in space.choices
    from plugins.spectra.problem import SpectraProblem

    small = spec.features(SpectraProblem(n_spectra=2, n_pixels=2000, max_iter=5))
    big = spec.features(SpectraProblem(n_spectra=4, n_pixels=4000, max_iter=10))
    assert big["template_iterations"] > 2 * small["template_iterations"]
    assert big["pixel_iterations"] == 8 * small["pixel_iterations"]
    # the CCF design's read and the basis: once per call, whatever the batch and its iterations
    assert big["pixels"] == 2 * small["pixels"] == spec.features(SpectraProblem(n_spectra=64, n_pixels=4000))["pixels"]


@pytest.mark.parametrize(("steps", "eager", "captures"), [(1, 1, 0), (2, 2, 0), (3, 3, 1), (40, 3, 1), (2.5, 2.5, 1)])
def test_only_torch_graph_prices_its_eager_steps_and_its_capture(steps, eager, captures):
    """torch:graph launches GRAPH_AFTER steps kernel by kernel, runs the next on the capture stream and
    captures it, then replays: its own features, from the steps expected or done; no other implementation
    has them."""
    import core
    from core.costmodel.features import model_features
    from plugins.spectra.fit import GRAPH_AFTER
    from plugins.spectra.problem import SpectraProblem

    assert GRAPH_AFTER == 2
    spec = core.solvers()["spectra.fit"]
    problem = SpectraProblem(n_spectra=2, n_pixels=1500)
    base = {**spec.features(problem), "steps": float(steps)}
    graph = model_features(spec, problem, "torch:graph", base)
    assert (graph["eager_steps"], graph["captures"]) == (eager, captures) and graph["steps"] == steps
    for other in ("numba:threads", "torch", "torch:fused", "numpy"):
        assert not {"eager_steps", "captures"} & set(model_features(spec, problem, other, base))


@pytest.mark.parametrize("n", [1, 2, 5, 6, 9, 63, 255, 257, 4096, 10_001])
def test_parallel_chunks_are_balanced_and_cover_the_batch(n):
    """The process backend's tasks: contiguous, covering every spectrum once, sizes within one; at most 64
    of them unless that would make them larger than MAX_CHUNK spectra."""
    from plugins.spectra.solve import MAX_CHUNK, chunks

    bounds = chunks(n)
    sizes = [stop - start for start, stop in bounds]
    assert bounds[0][0] == 0 and bounds[-1][1] == n and all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1 and max(sizes) <= max(4, MAX_CHUNK)
    assert len(bounds) == max(min(64, -(-n // 4)), -(-n // MAX_CHUNK))
    assert len(bounds) <= 64 or n > 64 * MAX_CHUNK
