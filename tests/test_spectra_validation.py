"""Validation of Spectra objects: every malformed field is a one-line ProblemError naming it, never a raw
numpy error, a silent broadcast or a silently ignored mask."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from core.errors import ProblemError
from plugins.spectra.model import Spectra, check_spectra
from plugins.spectra.problem import SpectraProblem
from plugins.spectra.solve import fit_batch, numba_ops
from plugins.spectra.synth import synthetic_spectra
from plugins.spectra.templates import named_library


@pytest.fixture(scope="module")
def library():
    return named_library("small")


@pytest.fixture(scope="module")
def three(library) -> Spectra:
    return synthetic_spectra(library, 3, snr=30, seed=41)


def _refused(spectra: Spectra, pattern: str) -> str:
    """Both doors refuse it: the problem (what fit_spectra and the CLI build) and fit_batch itself."""
    with pytest.raises(ProblemError, match=pattern) as caught:
        SpectraProblem(spectra=spectra)
    message = str(caught.value)
    assert "\n" not in message, message
    with pytest.raises(ProblemError, match=pattern):
        check_spectra(spectra)
    return message


def test_an_ivar_with_an_extra_row_is_refused(three):
    ivar = np.vstack([three.ivar, three.ivar[:1]])
    _refused(replace(three, ivar=ivar), r"spectra\.ivar has shape \(4, 7958\): must be \(3, 7958\).*never broadcast")


def test_an_ivar_of_one_row_for_three_spectra_is_not_broadcast(three):
    _refused(replace(three, ivar=three.ivar[:1]), r"spectra\.ivar has shape \(1, 7958\): must be \(3, 7958\)")


@pytest.mark.parametrize("name", ["flux", "ivar"])
def test_complex_flux_or_ivar_is_refused(three, name):
    value = getattr(three, name).astype(np.complex64) + 1j
    _refused(replace(three, **{name: value}),
             rf"spectra\.{name}=.* is invalid: must hold real numbers in 2 dimensions, got complex dtype")


def test_flux_of_strings_is_refused(three):
    _refused(replace(three, flux=three.flux.astype(str)), r"spectra\.flux=.* is invalid: .*got string dtype")


def test_a_ragged_nested_list_is_refused(three):
    ragged = [list(three.flux[0]), list(three.flux[1][:-3]), list(three.flux[2])]
    _refused(replace(three, flux=ragged), r"spectra\.flux=.* is invalid: .*(ragged|same length)")


def test_a_boolean_ivar_is_refused(three):
    _refused(replace(three, ivar=three.ivar > 0), r"spectra\.ivar=.* got bool dtype")


def test_arm_numbers_with_a_gap_are_refused(three):
    arm = np.where(three.arm >= 1, three.arm + 1, 0)  # 0, 2, 3
    _refused(replace(three, arm=arm, arm_names=("B", "R", "Z")), r"spectra\.arm=.* no gap.*got arms \[0, 2, 3\]")


def test_arms_out_of_order_are_refused(three):
    _refused(replace(three, arm=three.arm[::-1].copy()), r"spectra\.arm=.*in pixel order")


def test_arm_names_must_name_every_arm(three):
    _refused(replace(three, arm_names=("B", "R")), r"spectra\.arm_names=\('B', 'R'\) is invalid: must be 3 strings")


def test_a_decreasing_wave_within_an_arm_is_refused(three):
    wave = three.wave.copy()
    first = three.arm == 0
    wave[first] = wave[first][::-1]
    _refused(replace(three, wave=wave), r"spectra\.wave=.* must increase strictly within each arm: arm 0")


def test_a_non_monotonic_wave_within_an_arm_is_refused(three):
    wave = three.wave.copy()
    i = int(np.flatnonzero(three.arm == 1)[10])
    wave[i], wave[i + 1] = wave[i + 1], wave[i]
    _refused(replace(three, wave=wave), rf"arm 1 has .* at pixels {i} and {i + 1}")


def test_overlapping_arms_are_accepted(three):
    """DESI's arms overlap in wavelength (B ends after R starts): order is checked within an arm only."""
    b_end = three.wave[three.arm == 0].max()
    r_start = three.wave[three.arm == 1].min()
    assert r_start < b_end
    assert SpectraProblem(spectra=three).n_spectra == 3


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0, 0.0])
def test_a_non_finite_or_non_positive_wavelength_is_refused(three, bad):
    wave = three.wave.copy()
    wave[-1] = bad
    _refused(replace(three, wave=wave), r"spectra\.wave=.* must be finite positive wavelengths")


def test_a_two_dimensional_wave_is_refused(three):
    _refused(replace(three, wave=three.wave[None, :]), r"spectra\.wave=.* must hold real numbers in 1 dimension")


def test_targetid_and_truth_must_have_a_row_per_spectrum(three):
    _refused(replace(three, targetid=three.targetid[:2]), r"spectra\.targetid has shape \(2,\): must have one entry")
    _refused(replace(three, targetid=np.array([1.5, 2.0, 3.0])), r"spectra\.targetid=.* must hold "
             "integers in 1 dimension, got non-integer")
    _refused(replace(three, truth=three.truth[:, :5]), r"spectra\.truth has shape \(3, 5\): must be \(3, 6\)")


def test_nan_and_infinite_flux_stay_allowed_as_unusable_pixels(three):
    """A NaN flux or an infinite ivar is how pipelines mark a bad pixel: it is weighted 0, not refused."""
    flux, ivar = three.flux.copy(), three.ivar.copy()
    flux[0, :10] = np.nan
    ivar[1, :10] = np.inf
    checked = SpectraProblem(spectra=replace(three, flux=flux, ivar=ivar)).spectra
    _, weight = checked.clean()
    assert np.all(weight[0, :10] == 0) and np.all(weight[1, :10] == 0)


def test_lists_and_integer_arrays_are_converted(three):
    small = replace(three, wave=list(three.wave), arm=list(three.arm), flux=three.flux.tolist(),
                    ivar=(three.ivar > 0).astype(np.int32), targetid=list(three.targetid))
    checked = SpectraProblem(spectra=small).spectra
    assert checked.flux.dtype == np.float64 and checked.ivar.dtype == np.float64 and checked.arm.dtype == np.int64
    assert np.array_equal(checked.flux, three.flux.astype(np.float64))


def test_a_masked_arrays_mask_is_honoured(library, three):
    """Masked pixels get ivar 0: the fit through the mask is the fit with those pixels' ivar set to 0."""
    rng = np.random.default_rng(2)
    hidden = np.zeros(three.flux.shape, dtype=bool)
    hidden[:, rng.choice(three.n_pixels, 400, replace=False)] = True
    garbage = np.where(hidden, 50.0 * np.abs(three.flux).max(), three.flux)
    masked_flux = np.ma.MaskedArray(garbage, mask=hidden)
    checked = SpectraProblem(spectra=replace(three, flux=masked_flux)).spectra
    assert isinstance(checked.flux, np.ndarray) and not isinstance(checked.flux, np.ma.MaskedArray)
    assert np.all(checked.ivar[hidden] == 0) and np.array_equal(checked.ivar[~hidden], three.ivar[~hidden])
    # a mask on ivar counts too
    masked_ivar = np.ma.MaskedArray(three.ivar, mask=hidden)
    assert np.all(check_spectra(replace(three, ivar=masked_ivar)).ivar[hidden] == 0)

    explicit = replace(three, flux=garbage, ivar=np.where(hidden, 0, three.ivar).astype(np.float32))
    ops = numba_ops(False)
    expected = fit_batch(explicit, library, ops)
    through_mask = fit_batch(replace(three, flux=masked_flux), library, ops)
    assert np.array_equal(through_mask["VRAD"], expected["VRAD"])
    assert through_mask["SUCCESS"].all()


def test_a_masked_wavelength_is_refused(three):
    wave = np.ma.MaskedArray(three.wave, mask=np.arange(three.n_pixels) == 5)
    _refused(replace(three, wave=wave), r"spectra\.wave=.* must not be masked")
