"""DESI-style coadd FITS in, a results table out (through astropy).

A coadd file holds, per arm X in B, R, Z, the HDUs ``X_WAVELENGTH`` (N_X,),
``X_FLUX``, ``X_IVAR`` and ``X_MASK`` (spectra x N_X), plus ``FIBERMAP``
with a ``TARGETID`` column. Arms absent from the file are left out; a
pixel with a nonzero mask gets ivar 0. Anything else wrong with the file
(an HDU of the wrong kind or shape, a TARGETID that is not an integer, a
file cut short) is a :class:`core.errors.ProblemError` naming the file and
what is wrong, never a traceback from astropy or NumPy.

The results table (HDU ``SPECFIT``) gives each column its unit (``TUNITn``)
and a one-line description (the comment of ``TTYPEn``); the primary header
holds the provenance the command passes in (grid, backend, options, input,
crossover's version, date).

astropy is the optional ``fits`` extra: without it, reading or writing is a
:class:`MissingExtraError` with the install command, not a
``ModuleNotFoundError``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from core.atomic import atomic_write
from core.errors import CrossoverError, ProblemError
from plugins.spectra.model import Spectra

ARM_NAMES = ("B", "R", "Z")
RESULT_COLUMNS = ("TARGETID", "VRAD", "VRAD_ERR", "VSINI", "VSINI_ERR", "TEFF", "TEFF_ERR", "LOGG", "LOGG_ERR",
                  "FEH", "FEH_ERR", "ALPHA", "ALPHA_ERR", "CHISQ", "RCHISQ", "NPIX", "NCLIP", "ITERATIONS", "FLAGS",
                  "SUCCESS")
# (unit, description) of each result column; the unit goes to TUNITn, the description to TTYPEn's comment
RESULT_UNITS = {
    "TARGETID": ("", "target id, from the input's FIBERMAP"),
    "VRAD": ("km/s", "radial velocity"), "VRAD_ERR": ("km/s", "1-sigma error of VRAD"),
    "VSINI": ("km/s", "projected rotational velocity"), "VSINI_ERR": ("km/s", "1-sigma error of VSINI"),
    "TEFF": ("K", "effective temperature"), "TEFF_ERR": ("K", "1-sigma error of TEFF"),
    "LOGG": ("dex", "log10 surface gravity (cgs)"), "LOGG_ERR": ("dex", "1-sigma error of LOGG"),
    "FEH": ("dex", "[Fe/H]"), "FEH_ERR": ("dex", "1-sigma error of FEH"),
    "ALPHA": ("dex", "[alpha/Fe]"), "ALPHA_ERR": ("dex", "1-sigma error of ALPHA"),
    "CHISQ": ("", "chi-square at the optimum"), "RCHISQ": ("", "chi-square per degree of freedom"),
    "NPIX": ("pix", "usable pixels fitted (clipped ones excluded)"),
    "NCLIP": ("pix", "pixels clipped as outliers"),
    "ITERATIONS": ("", "trial steps (model evaluations), all rounds"),
    "FLAGS": ("", "bit flags of the fit (0: none)"),
    "SUCCESS": ("", "no failure flag (4, 16, 32, 64, 1) raised"),
}
FITS_EXTRA = 'pip install ".[fits]" from a clone of crossover (or pip install "astropy>=5.3")'


class MissingExtraError(CrossoverError, ImportError):
    """An optional dependency (an extra) that a command needs is not installed; the message says how to add it."""


def _fits():
    try:
        from astropy.io import fits
    except ImportError as exc:
        raise MissingExtraError(f"reading and writing FITS files needs astropy, which is not importable here "
                                f"({exc}); install the fits extra: {FITS_EXTRA}") from None
    return fits


def check_astropy() -> None:
    """Raise :class:`MissingExtraError` now if astropy is missing, before a command starts any work."""
    _fits()


def coadd_rows(path: str | os.PathLike) -> int:
    """How many spectra a coadd file holds (read from FIBERMAP without loading the fluxes)."""
    with _open(path) as hdus:
        return len(_targetids(hdus, path))


# what astropy and NumPy raise on a file that parses as FITS but holds something unexpected
READ_ERRORS = (OSError, ValueError, TypeError, IndexError, KeyError, AttributeError, EOFError)


def _open(path: str | os.PathLike):
    """The file's HDUs, every one of them read and its data checked to lie inside the file."""
    import warnings

    fits = _fits()
    if not Path(path).is_file():
        raise ProblemError(f"input {str(path)!r} is invalid: no such file")
    try:
        with warnings.catch_warnings():
            # a file cut short is refused below, naming the HDU, instead of astropy's warning
            warnings.filterwarnings("ignore", message="File may have been truncated")
            hdus = fits.open(path, memmap=True)
            len(hdus)  # reads every HDU's header; the data stay memory-mapped until a slice is read
    except READ_ERRORS as exc:
        raise ProblemError(f"input {str(path)!r} is not a readable FITS file: {_one_line(exc)}") from None
    try:
        _check_complete(hdus, path)
    except BaseException:
        hdus.close()
        raise
    return hdus


def _check_complete(hdus, path) -> None:
    """Refuse a file cut short inside an HDU (a copy or download that stopped part-way)."""
    size = os.path.getsize(path)
    for index, hdu in enumerate(hdus):
        end = hdus.fileinfo(index)["datLoc"] + hdu.size
        if end > size:
            raise ProblemError(f"input {str(path)!r} is truncated: HDU {index} ({hdu.name or 'unnamed'}) ends at "
                               f"byte {end}, but the file has {size} bytes")


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _targetids(hdus, path) -> np.ndarray:
    names = {hdu.name for hdu in hdus}
    if "FIBERMAP" not in names:
        raise ProblemError(f"input {str(path)!r} is malformed: it has no FIBERMAP HDU (found {sorted(names)})")
    hdu = hdus["FIBERMAP"]
    if hdu.is_image:
        raise ProblemError(f"input {str(path)!r} is malformed: FIBERMAP is an image HDU; it must be a binary table "
                           "with a TARGETID column")
    table = hdu.data
    if table is None or "TARGETID" not in table.columns.names:
        raise ProblemError(f"input {str(path)!r} is malformed: FIBERMAP has no TARGETID column")
    targetid = np.asarray(table["TARGETID"])
    if targetid.dtype.kind not in "iu" or targetid.ndim != 1:
        raise ProblemError(f"input {str(path)!r} is malformed: FIBERMAP TARGETID has dtype {targetid.dtype} and "
                           f"shape {targetid.shape}; it must be one integer per row")
    return targetid.astype(np.int64)


def _image(hdus, name: str, shape: tuple[int, ...], meaning: str, path) -> np.ndarray:
    """HDU ``name``'s data, checked to be an image of ``shape`` (``meaning`` says what that shape is)."""
    hdu = hdus[name]
    if not hdu.is_image:
        found = "is a table"
    elif hdu.data is None:
        found = "is empty"
    elif hdu.data.shape != shape:
        found = f"has shape {hdu.data.shape}"
    else:
        return hdu.data
    raise ProblemError(f"input {str(path)!r} is malformed: {name} {found}, expected {shape} (an image of {meaning})")


def read_coadd(path: str | os.PathLike, start: int = 0, stop: int | None = None) -> Spectra:
    """Rows ``start:stop`` of a coadd file as :class:`Spectra` (memory-mapped: a slice reads only its rows)."""
    with _open(path) as hdus:
        try:
            return _read_rows(hdus, path, start, stop)
        except ProblemError:
            raise
        except READ_ERRORS as exc:  # data astropy could not give back, after every check above passed
            raise ProblemError(f"input {str(path)!r} is malformed: {_one_line(exc)}") from None


def _read_rows(hdus, path, start: int, stop: int | None) -> Spectra:
    targetid = _targetids(hdus, path)
    stop = len(targetid) if stop is None else min(stop, len(targetid))
    names = {hdu.name for hdu in hdus}
    arms = [a for a in ARM_NAMES if f"{a}_WAVELENGTH" in names]
    if not arms:
        raise ProblemError(f"input {str(path)!r} is malformed: no B_, R_ or Z_WAVELENGTH HDU")
    waves, fluxes, ivars, arm_index = [], [], [], []
    for i, arm in enumerate(arms):
        missing = [f"{arm}_{part}" for part in ("FLUX", "IVAR") if f"{arm}_{part}" not in names]
        if missing:
            raise ProblemError(f"input {str(path)!r} is malformed: arm {arm} lacks {', '.join(missing)}")
        wave_hdu = hdus[f"{arm}_WAVELENGTH"]
        if not wave_hdu.is_image or wave_hdu.data is None or wave_hdu.data.ndim != 1:
            raise ProblemError(f"input {str(path)!r} is malformed: {arm}_WAVELENGTH must be a 1-D image, one "
                               "wavelength per pixel")
        wave = np.asarray(wave_hdu.data, dtype=np.float64)
        shape = (len(targetid), len(wave))
        meaning = f"FIBERMAP rows x {arm}_WAVELENGTH"
        flux = np.asarray(_image(hdus, f"{arm}_FLUX", shape, meaning, path)[start:stop], dtype=np.float32)
        ivar = np.asarray(_image(hdus, f"{arm}_IVAR", shape, meaning, path)[start:stop], dtype=np.float32)
        if f"{arm}_MASK" in names and hdus[f"{arm}_MASK"].data is not None:
            mask = np.asarray(_image(hdus, f"{arm}_MASK", shape, meaning, path)[start:stop])
            ivar = np.where(mask != 0, 0.0, ivar).astype(np.float32)
        waves.append(wave)
        fluxes.append(flux)
        ivars.append(ivar)
        arm_index.append(np.full(len(wave), i))
    return Spectra(wave=np.concatenate(waves), arm=np.concatenate(arm_index), flux=np.concatenate(fluxes, axis=1),
                   ivar=np.concatenate(ivars, axis=1), targetid=targetid[start:stop], arm_names=tuple(arms))


def check_output(path: str | os.PathLike, overwrite: bool, flag: str = "overwrite=True") -> Path:
    """``path`` if a file may be written there, else the one-line reason (astropy's ``overwrite`` convention).

    An existing file is replaced only with ``overwrite`` (``flag`` names how
    the caller sets it); a missing directory is never created, a directory is
    never a file to write.
    """
    path = Path(path)
    if path.is_dir():
        raise ProblemError(f"output {str(path)!r} is a directory: give the path of a file to write")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist (create it first)"
        raise ProblemError(f"output {str(path)!r} is invalid: its directory {str(parent)!r} {what}")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise ProblemError(f"output {str(path)!r} already exists: pass {flag} to replace it")
    return path


def write_coadd(spectra: Spectra, path: str | os.PathLike, drop_arms: tuple[str, ...] = (),
                overwrite: bool = False) -> Path:
    """Write ``spectra`` as a DESI-style coadd (the truth, when known, as TRUE_* FIBERMAP columns)."""
    fits = _fits()
    hdus = [fits.PrimaryHDU()]
    columns = [fits.Column(name="TARGETID", format="K", array=np.asarray(spectra.targetid))]
    if spectra.truth is not None:
        for i, name in enumerate(("VRAD", "VSINI", "TEFF", "LOGG", "FEH", "ALPHA")):
            columns.append(fits.Column(name=f"TRUE_{name}", format="D", array=spectra.truth[:, i]))
    hdus.append(fits.BinTableHDU.from_columns(columns, name="FIBERMAP"))
    for i, arm in enumerate(spectra.arm_names):
        if arm in drop_arms:
            continue
        sel = spectra.arm == i
        mask = (np.asarray(spectra.ivar)[:, sel] <= 0).astype(np.int32)
        hdus += [fits.ImageHDU(spectra.wave[sel], name=f"{arm}_WAVELENGTH"),
                 fits.ImageHDU(np.asarray(spectra.flux)[:, sel].astype(np.float32), name=f"{arm}_FLUX"),
                 fits.ImageHDU(np.asarray(spectra.ivar)[:, sel].astype(np.float32), name=f"{arm}_IVAR"),
                 fits.ImageHDU(mask, name=f"{arm}_MASK")]
    return _write_atomic(fits.HDUList(hdus), path, overwrite)


def results_hdu(columns: Mapping[str, np.ndarray]):
    """The results as a FITS binary table named SPECFIT, each column with its unit and description."""
    fits = _fits()
    cols = []
    for name in RESULT_COLUMNS:
        array = np.asarray(columns[name])
        fmt = {"b": "L", "i": "J" if array.dtype.itemsize <= 4 else "K", "f": "D"}[array.dtype.kind]
        cols.append(fits.Column(name=name, format=fmt, array=array, unit=RESULT_UNITS[name][0] or None))
    hdu = fits.BinTableHDU.from_columns(cols, name="SPECFIT")
    for index, name in enumerate(RESULT_COLUMNS, start=1):
        hdu.header.comments[f"TTYPE{index}"] = RESULT_UNITS[name][1]
    return hdu


def write_results(columns: Mapping[str, np.ndarray], path: str | os.PathLike,
                  provenance: Mapping[str, tuple[str | int | float, str]] | None = None,
                  overwrite: bool = False) -> Path:
    """Write the results table atomically (a reader sees the previous file or the new one, never half).

    ``provenance`` maps a primary-header keyword (8 characters at most) to
    its value and comment; ``DATE`` (UTC, when written) is always added.
    """
    import datetime

    fits = _fits()
    primary = fits.PrimaryHDU()
    cards = {"DATE": (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"),
                      "UTC date and time this file was written")}
    for keyword, (value, comment) in {**cards, **dict(provenance or {})}.items():
        if isinstance(value, str):  # FITS headers hold ASCII only; a file name may not be
            value = value.encode("ascii", "backslashreplace").decode("ascii")
        primary.header[keyword] = (value, comment)
    return _write_atomic(fits.HDUList([primary, results_hdu(columns)]), path, overwrite)


def read_results(path: str | os.PathLike) -> dict[str, np.ndarray]:
    with _open(path) as hdus:
        data = hdus["SPECFIT"].data
        return {name: np.asarray(data[name]) for name in data.columns.names}


def _write_atomic(hdulist, path: str | os.PathLike, overwrite: bool) -> Path:
    path = check_output(path, overwrite)
    try:
        # the temporary file is ours (mkstemp made it): astropy may replace it
        atomic_write(path, lambda target: hdulist.writeto(target, overwrite=True))
    except OSError as exc:
        raise ProblemError(f"output {str(path)!r} cannot be written: {exc.strerror or exc}") from None
    return path
