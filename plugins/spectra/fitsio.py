"""DESI-style coadd FITS in, a results table out (through astropy).

A coadd file holds, per arm X in B, R, Z, the HDUs ``X_WAVELENGTH`` (N_X,),
``X_FLUX``, ``X_IVAR`` and ``X_MASK`` (spectra x N_X), plus ``FIBERMAP``
with a ``TARGETID`` column. Arms absent from the file are left out; a
pixel with a nonzero mask gets ivar 0. Anything else wrong with the file
is a :class:`core.errors.ProblemError` naming the file and what is wrong.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from core.atomic import atomic_write
from core.errors import ProblemError
from plugins.spectra.model import Spectra

ARM_NAMES = ("B", "R", "Z")
RESULT_COLUMNS = ("TARGETID", "VRAD", "VRAD_ERR", "VSINI", "VSINI_ERR", "TEFF", "TEFF_ERR", "LOGG", "LOGG_ERR",
                  "FEH", "FEH_ERR", "ALPHA", "ALPHA_ERR", "CHISQ", "RCHISQ", "NPIX", "ITERATIONS", "FLAGS", "SUCCESS")


def _fits():
    from astropy.io import fits

    return fits


def coadd_rows(path: str | os.PathLike) -> int:
    """How many spectra a coadd file holds (read from FIBERMAP without loading the fluxes)."""
    with _open(path) as hdus:
        return len(_targetids(hdus, path))


def _open(path: str | os.PathLike):
    fits = _fits()
    if not Path(path).is_file():
        raise ProblemError(f"input {str(path)!r} is invalid: no such file")
    try:
        return fits.open(path, memmap=True)
    except (OSError, ValueError, TypeError) as exc:
        raise ProblemError(f"input {str(path)!r} is not a readable FITS file: {exc}") from exc


def _targetids(hdus, path) -> np.ndarray:
    names = {hdu.name for hdu in hdus}
    if "FIBERMAP" not in names:
        raise ProblemError(f"input {str(path)!r} is malformed: it has no FIBERMAP HDU (found {sorted(names)})")
    table = hdus["FIBERMAP"].data
    if table is None or "TARGETID" not in table.columns.names:
        raise ProblemError(f"input {str(path)!r} is malformed: FIBERMAP has no TARGETID column")
    return np.asarray(table["TARGETID"], dtype=np.int64)


def read_coadd(path: str | os.PathLike, start: int = 0, stop: int | None = None) -> Spectra:
    """Rows ``start:stop`` of a coadd file as :class:`Spectra` (memory-mapped: a slice reads only its rows)."""
    with _open(path) as hdus:
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
            wave = np.asarray(hdus[f"{arm}_WAVELENGTH"].data, dtype=np.float64)
            flux = hdus[f"{arm}_FLUX"].data
            ivar = hdus[f"{arm}_IVAR"].data
            for label, array in ((f"{arm}_FLUX", flux), (f"{arm}_IVAR", ivar)):
                if array is None or array.ndim != 2 or array.shape != (len(targetid), len(wave)):
                    shape = None if array is None else array.shape
                    raise ProblemError(f"input {str(path)!r} is malformed: {label} has shape {shape}, expected "
                                       f"({len(targetid)}, {len(wave)}) (FIBERMAP rows x {arm}_WAVELENGTH)")
            flux = np.asarray(flux[start:stop], dtype=np.float32)
            ivar = np.asarray(ivar[start:stop], dtype=np.float32)
            if f"{arm}_MASK" in names and hdus[f"{arm}_MASK"].data is not None:
                ivar = np.where(np.asarray(hdus[f"{arm}_MASK"].data[start:stop]) != 0, 0.0, ivar).astype(np.float32)
            waves.append(wave)
            fluxes.append(flux)
            ivars.append(ivar)
            arm_index.append(np.full(len(wave), i))
    return Spectra(wave=np.concatenate(waves), arm=np.concatenate(arm_index), flux=np.concatenate(fluxes, axis=1),
                   ivar=np.concatenate(ivars, axis=1), targetid=targetid[start:stop], arm_names=tuple(arms))


def write_coadd(spectra: Spectra, path: str | os.PathLike, drop_arms: tuple[str, ...] = ()) -> Path:
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
    return _write_atomic(fits.HDUList(hdus), path)


def results_hdu(columns: Mapping[str, np.ndarray]):
    """The results as a FITS binary table named SPECFIT."""
    fits = _fits()
    cols = []
    for name in RESULT_COLUMNS:
        array = np.asarray(columns[name])
        fmt = {"b": "L", "i": "J" if array.dtype.itemsize <= 4 else "K", "f": "D"}[array.dtype.kind]
        cols.append(fits.Column(name=name, format=fmt, array=array))
    return fits.BinTableHDU.from_columns(cols, name="SPECFIT")


def write_results(columns: Mapping[str, np.ndarray], path: str | os.PathLike) -> Path:
    """Write the results table atomically (a reader sees the previous file or the new one, never half)."""
    fits = _fits()
    return _write_atomic(fits.HDUList([fits.PrimaryHDU(), results_hdu(columns)]), path)


def read_results(path: str | os.PathLike) -> dict[str, np.ndarray]:
    with _open(path) as hdus:
        data = hdus["SPECFIT"].data
        return {name: np.asarray(data[name]) for name in data.columns.names}


def _write_atomic(hdulist, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda target: hdulist.writeto(target, overwrite=True))
    return path
