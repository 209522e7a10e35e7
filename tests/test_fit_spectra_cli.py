"""fit-spectra never loses nor blocks a user's data, and writes a table that says what it holds.

- a run refused by validation leaves nothing behind, and the corrected run works;
- Ctrl-C keeps exactly the batches it says it kept, and batches are small enough to matter;
- outputs follow astropy's ``overwrite`` convention, and the input is never the output;
- a malformed input is one line, no traceback;
- the table has units and a provenance header;
- a missing astropy is one line with the install command.

The truth is an uninterrupted run of the same command (bit-exact where the
batches are the same), the bytes of the files before and after, and for the
batch schedule a stand-in solver whose outputs and clock are known.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from astropy.io import fits

import core
from core.checkpoint import open_checkpoint
from core.cli import main
from plugins.spectra import cli
from plugins.spectra.cli import checkpoint_path
from plugins.spectra.fitsio import RESULT_COLUMNS, read_coadd, read_results
from tests.test_spectra_resume import Solves


@pytest.fixture(scope="module")
def reference(coadd, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "out.fits"
    assert main(["fit-spectra", str(coadd), "-o", str(out), "--backend", "numba", "--batch", "4"]) == 0
    return out


def fit(coadd, out, *extra: str) -> int:
    return main(["fit-spectra", str(coadd), "-o", str(out), "--backend", "numba", *extra])


def same_table(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def one_error(err: str) -> str:
    """The single ``crossover: error:`` line of a failed command (no traceback anywhere)."""
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("crossover: error:")]
    assert len(errors) == 1, err
    return errors[0]


# -- 1. a refused run leaves nothing that blocks the next ------------------------------------------


def malformed_flux(coadd, path):
    """The coadd with B_FLUX one row short: a bad HDU."""
    with fits.open(coadd) as hdus:
        copy = fits.HDUList([hdu.copy() for hdu in hdus])
    copy["B_FLUX"].data = copy["B_FLUX"].data[:-1]
    copy.writeto(path)
    return path


@pytest.mark.parametrize("bad, message", [
    (("--backend", "numbaa"), "unknown backend 'numbaa'"),
    (("--grid", "tiny"), "grid='tiny' is invalid"),
    (("bad-hdu",), "B_FLUX has shape (9, 2751), expected (10, 2751) (an image of FIBERMAP rows x B_WAVELENGTH)"),
])
def test_a_refused_run_leaves_nothing_and_the_corrected_run_succeeds(coadd, reference, tmp_path, capsys, bad,
                                                                     message):
    out = tmp_path / "out.fits"
    if bad == ("bad-hdu",):
        status = fit(malformed_flux(coadd, tmp_path / "bad.fits"), out)
    else:
        status = main(["fit-spectra", str(coadd), "-o", str(out), "--batch", "4", *bad])
    assert status == 2
    assert message in one_error(capsys.readouterr().err)  # the real error, not "belongs to another run"
    assert sorted(os.listdir(tmp_path)) == (["bad.fits"] if bad == ("bad-hdu",) else [])  # no checkpoint

    assert fit(coadd, out, "--batch", "4") == 0
    assert "belongs to another run" not in capsys.readouterr().err
    assert same_table(read_results(out), read_results(reference))


def test_a_header_only_checkpoint_of_other_settings_does_not_block(coadd, reference, tmp_path, capsys):
    out = tmp_path / "out.fits"
    other = SimpleNamespace(grid="small", degree=3, max_iter=5, input=str(coadd))
    open_checkpoint(checkpoint_path(str(out)), cli._run_identity(other, 10)).close()  # a header, no rows
    assert fit(coadd, out, "--batch", "4") == 0
    assert "belongs to another run" not in capsys.readouterr().err
    assert same_table(read_results(out), read_results(reference))
    assert not checkpoint_path(str(out)).exists()


def test_a_one_line_file_that_is_not_a_checkpoint_is_never_deleted(coadd, tmp_path, capsys):
    out = tmp_path / "out.fits"
    checkpoint_path(str(out)).write_text('{"my": "notes"}\n')
    assert fit(coadd, out, "--batch", "4") == 2
    assert "is not a crossover checkpoint" in one_error(capsys.readouterr().err)
    assert checkpoint_path(str(out)).read_text() == '{"my": "notes"}\n'


def test_a_run_that_fails_or_stops_before_its_first_batch_leaves_nothing(coadd, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.fits"
    Solves(monkeypatch, stop_at=0)
    assert fit(coadd, out, "--batch", "4") == 130
    assert "interrupted: stopped before any spectrum was fitted; nothing was kept" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []

    def broken(problem, **kwargs):
        raise core.BackendUnavailableError("backend 'numba' is unavailable here: a test said so")

    monkeypatch.setattr(core, "solve", broken)
    assert fit(coadd, out, "--batch", "4") == 2
    assert "a test said so" in one_error(capsys.readouterr().err)
    assert os.listdir(tmp_path) == []


# -- 2. Ctrl-C keeps what was fitted; batches are sized from time ----------------------------------


def test_next_batch_aims_at_a_few_seconds_of_work():
    assert cli.next_batch(8, 8, 0.5, 10**6) == 32  # 80 wanted, but at most 4x the last batch
    assert cli.next_batch(128, 128, 8.0, 10**6) == 80  # 1/16 s per spectrum: 5 s is 80 spectra
    assert cli.next_batch(80, 80, 40.0, 10**6) == 10  # a slow stretch: smaller batches
    assert cli.next_batch(100, 100, 5.0, 40) == 40  # never more than the memory allows
    assert cli.next_batch(1, 1, 100.0, 10) == 1  # never below one
    assert cli.next_batch(8, 8, 0.0, 10**6) == 32  # a clock too coarse to see the batch: grow


def small_coadd(path, n: int):
    """A coadd of ``n`` spectra on 120 pixels of one arm: cheap to write and read."""
    wave = np.linspace(4000.0, 4100.0, 120)
    fibermap = fits.BinTableHDU.from_columns([fits.Column(name="TARGETID", format="K", array=np.arange(n) + 100)],
                                             name="FIBERMAP")
    fits.HDUList([fits.PrimaryHDU(), fibermap, fits.ImageHDU(wave, name="B_WAVELENGTH"),
                  fits.ImageHDU(np.ones((n, 120), np.float32), name="B_FLUX"),
                  fits.ImageHDU(np.ones((n, 120), np.float32), name="B_IVAR")]).writeto(path)
    return path


class Timed:
    """A stand-in solver of known outputs (VRAD = 2 x TARGETID) and known cost: 1/16 s a spectrum on a fake
    clock (numba fits about 0.04 s a spectrum on a 2-core machine); Ctrl-C at batch ``stop_at``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stop_at: int | None = None):
        self.sizes: list[int] = []
        self.stop_at, self.now = stop_at, 0.0
        monkeypatch.setattr(core, "solve", self)
        monkeypatch.setattr(cli, "_clock", lambda: self.now)

    def __call__(self, problem, **kwargs):
        if len(self.sizes) == self.stop_at:
            raise KeyboardInterrupt
        targetid = np.asarray(problem.spectra.targetid)
        self.sizes.append(len(targetid))
        self.now += len(targetid) / 16
        outputs = {name: np.zeros(len(targetid)) for name in RESULT_COLUMNS}
        outputs.update(TARGETID=targetid, VRAD=2.0 * targetid, NPIX=np.full(len(targetid), 120),
                       ITERATIONS=np.full(len(targetid), 3), FLAGS=np.zeros(len(targetid), np.int64),
                       SUCCESS=np.ones(len(targetid), bool))
        return SimpleNamespace(outputs=outputs, backend="numba:stand-in")


def test_a_thousand_spectra_are_many_batches_and_ctrl_c_keeps_the_finished_ones(tmp_path, monkeypatch, capsys):
    coadd, out = small_coadd(tmp_path / "coadd.fits", 1000), tmp_path / "out.fits"
    stopped = Timed(monkeypatch, stop_at=3)
    assert fit(coadd, out) == 130
    err = capsys.readouterr().err
    assert "batches of about 5 s each (the first 8 spectra" in err
    assert f"interrupted: kept the spectra fitted so far in {checkpoint_path(str(out))}" in err
    assert stopped.sizes == [8, 32, 80]  # 0.5 s, 2 s, 5 s of work

    kept = open_checkpoint(checkpoint_path(str(out)), cli._run_identity(SimpleNamespace(
        grid="small", degree=3, max_iter=30, input=str(coadd)), 1000))
    kept.close()
    rows = np.concatenate([record["outputs"]["TARGETID"] for record in kept.records])
    assert np.array_equal(rows, np.arange(120) + 100)  # exactly what the message says was kept
    assert all(np.array_equal(r["outputs"]["VRAD"], 2.0 * r["outputs"]["TARGETID"]) for r in kept.records)

    resumed = Timed(monkeypatch)
    assert fit(coadd, out) == 0
    assert "resumed: 120 of 1000 spectra already fitted, skipped" in capsys.readouterr().err
    assert sum(resumed.sizes) == 880 and len(resumed.sizes) >= 11  # never one batch of everything
    assert max(resumed.sizes) / 16 <= cli.BATCH_SECONDS
    table = read_results(out)
    assert np.array_equal(table["TARGETID"], np.arange(1000) + 100)
    assert np.array_equal(table["VRAD"], 2.0 * table["TARGETID"])


def test_ctrl_c_between_real_batches_keeps_them_and_the_rerun_matches(coadd, reference, tmp_path, monkeypatch,
                                                                      capsys):
    out = tmp_path / "out.fits"
    monkeypatch.setattr(cli, "FIRST_BATCH", 3)
    monkeypatch.setattr(cli, "BATCH_SECONDS", 1e-9)  # every later batch: one spectrum
    stopped = Solves(monkeypatch, stop_at=2)
    assert fit(coadd, out) == 130
    assert "kept the spectra fitted so far in" in capsys.readouterr().err
    want = read_results(reference)
    assert stopped.batches == [list(want["TARGETID"][:3]), [int(want["TARGETID"][3])]]

    Solves(monkeypatch)
    assert fit(coadd, out) == 0
    assert "resumed: 4 of 10 spectra already fitted, skipped" in capsys.readouterr().err
    table = read_results(out)
    assert np.array_equal(table["TARGETID"], want["TARGETID"]) and table["SUCCESS"].all()
    for column in ("VRAD", "TEFF", "LOGG", "FEH"):  # other batches, the same fits to well within their errors
        assert np.all(np.abs(table[column] - want[column]) <= 1e-3 * table[f"{column}_ERR"]), column


# -- 3. astropy's overwrite convention ------------------------------------------------------------


def test_an_existing_output_is_replaced_only_with_overwrite(coadd, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.fits"
    out.write_bytes(b"the user's own results")
    solves = Solves(monkeypatch)
    assert fit(coadd, out, "--batch", "4") == 2
    assert f"output {str(out)!r} already exists: pass --overwrite to replace it" in one_error(capsys.readouterr().err)
    assert out.read_bytes() == b"the user's own results" and not solves.batches
    assert not checkpoint_path(str(out)).exists()

    assert fit(coadd, out, "--batch", "4", "--overwrite") == 0
    assert same_table(read_results(out), read_results(reference))


def test_an_output_that_appears_during_the_fit_is_not_replaced_and_the_fit_is_kept(coadd, reference, tmp_path,
                                                                                  monkeypatch, capsys):
    out = tmp_path / "out.fits"

    class Intruder(Solves):
        def __call__(self, problem, **kwargs):
            out.write_bytes(b"written by another program")
            return super().__call__(problem, **kwargs)

    Intruder(monkeypatch)
    assert fit(coadd, out, "--batch", "4") == 2
    assert one_error(capsys.readouterr().err) == (
        f"crossover: error: output {str(out)!r} already exists: pass --overwrite to replace it; the fitted spectra "
        f"are kept in {checkpoint_path(str(out))}, so that run does no fitting again")
    assert out.read_bytes() == b"written by another program"
    solves = Solves(monkeypatch)
    assert fit(coadd, out, "--batch", "4", "--overwrite") == 0  # every row was kept: nothing to fit again
    assert "resumed: 10 of 10 spectra already fitted" in capsys.readouterr().err and not solves.batches
    assert same_table(read_results(out), read_results(reference))


def test_a_missing_directory_is_refused_not_created(coadd, tmp_path, capsys):
    out = tmp_path / "missing" / "dir" / "out.fits"
    assert fit(coadd, out, "--batch", "4") == 2
    error = one_error(capsys.readouterr().err)
    assert error == (f"crossover: error: output {str(out)!r} is invalid: its directory {str(out.parent)!r} does "
                     "not exist (create it first)")
    assert os.listdir(tmp_path) == []
    assert main(["synth-coadd", str(out), "-n", "2"]) == 2
    assert "does not exist (create it first)" in one_error(capsys.readouterr().err)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("how", ["same path", "another path", "symlink", "hard link"])
def test_the_input_is_never_the_output(coadd, tmp_path, monkeypatch, capsys, how):
    before = digest(coadd)
    if how == "same path":
        out = coadd
    elif how == "another path":
        out = coadd.parent / ".." / coadd.parent.name / coadd.name
    else:
        out = tmp_path / "link.fits"
        (os.symlink if how == "symlink" else os.link)(coadd, out)
    solves = Solves(monkeypatch)
    assert fit(coadd, out, "--batch", "4", "--overwrite") == 2  # not even with --overwrite
    assert "is the input file" in one_error(capsys.readouterr().err)
    assert digest(coadd) == before and not solves.batches and not checkpoint_path(str(out)).exists()


def test_an_output_that_is_a_directory_is_refused_before_any_fit(coadd, tmp_path, monkeypatch, capsys):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.txt").write_text("mine")
    solves = Solves(monkeypatch)
    assert fit(coadd, tmp_path / "results", "--batch", "4", "--overwrite") == 2
    assert "is a directory: give the path of a file" in one_error(capsys.readouterr().err)
    assert not solves.batches and sorted(os.listdir(tmp_path)) == ["results"]
    assert os.listdir(tmp_path / "results") == ["keep.txt"]


def test_synth_coadd_keeps_an_existing_file_without_overwrite(tmp_path, capsys):
    out = tmp_path / "coadd.fits"
    out.write_bytes(b"precious")
    assert main(["synth-coadd", str(out), "-n", "2"]) == 2
    assert "already exists: pass --overwrite" in one_error(capsys.readouterr().err)
    assert out.read_bytes() == b"precious"
    assert main(["synth-coadd", str(out), "-n", "2", "--overwrite"]) == 0
    assert len(read_coadd(out)) == 2


# -- 4. malformed inputs: one line, no traceback --------------------------------------------------


def rewritten(coadd, path, change) -> str:
    with fits.open(coadd) as hdus:
        copy = fits.HDUList([hdu.copy() for hdu in hdus])
    change(copy)
    copy.writeto(path)
    return str(path)


def fibermap_as_image(hdus):
    hdus[hdus.index_of("FIBERMAP")] = fits.ImageHDU(np.arange(10), name="FIBERMAP")


def string_targetid(hdus):
    column = fits.Column(name="TARGETID", format="8A", array=np.array([f"t{i}" for i in range(10)]))
    hdus[hdus.index_of("FIBERMAP")] = fits.BinTableHDU.from_columns([column], name="FIBERMAP")


def short_mask(hdus):
    hdus["Z_MASK"].data = hdus["Z_MASK"].data[:, :-3]


@pytest.mark.parametrize("case, message", [
    ("fibermap image", "FIBERMAP is an image HDU; it must be a binary table with a TARGETID column"),
    ("string targetid", "FIBERMAP TARGETID has dtype <U8 and shape (10,); it must be one integer per row"),
    ("short mask", "Z_MASK has shape (10, 2878), expected (10, 2881)"),
    ("truncated", "is truncated: HDU 13 (Z_MASK) ends at byte"),
])
def test_a_malformed_input_is_one_line_and_leaves_nothing(coadd, tmp_path, capsys, case, message):
    path = tmp_path / "bad.fits"
    if case == "truncated":
        data = coadd.read_bytes()
        path.write_bytes(data[:len(data) - 20000])  # inside the last HDU's data
    else:
        rewritten(coadd, path, {"fibermap image": fibermap_as_image, "string targetid": string_targetid,
                                "short mask": short_mask}[case])
    before = digest(path)
    out = tmp_path / "out.fits"
    assert fit(path, out) == 2
    error = one_error(capsys.readouterr().err)
    assert error.startswith(f"crossover: error: input {str(path)!r} is ") and message in error
    assert digest(path) == before and sorted(os.listdir(tmp_path)) == ["bad.fits"]


# -- 5. units and provenance ----------------------------------------------------------------------


def test_the_table_has_units_descriptions_and_provenance(coadd, reference):
    from core.checkpoint import file_fingerprint

    with fits.open(reference) as hdus:
        columns, header = hdus["SPECFIT"].columns, hdus[0].header
        table = hdus["SPECFIT"].header
    units = {c.name: c.unit for c in columns}
    assert units["VRAD"] == units["VRAD_ERR"] == units["VSINI"] == units["VSINI_ERR"] == "km/s"
    assert units["TEFF"] == units["TEFF_ERR"] == "K"
    assert units["LOGG"] == units["FEH"] == units["ALPHA"] == units["FEH_ERR"] == "dex"
    assert units["TARGETID"] is None and units["CHISQ"] is None
    comments = {table[f"TTYPE{i}"]: table.comments[f"TTYPE{i}"] for i in range(1, len(columns) + 1)}
    assert comments["ITERATIONS"] == "trial steps (model evaluations), all rounds"

    assert header["ORIGIN"] == "crossover" and header["CROSSVER"] == core.__version__
    assert header["INFILE"] == "coadd.fits" and header["INSHA256"] == file_fingerprint(coadd)
    assert header["GRID"] == "small" and header["DEGREE"] == 3 and header["MAXITER"] == 30
    assert header["BACKREQ"] == "numba" and header["BACKEND"].startswith("numba") and header["BATCH"] == 4
    written = datetime.datetime.fromisoformat(header["DATE"]).replace(tzinfo=datetime.timezone.utc)
    assert abs(datetime.datetime.now(datetime.timezone.utc) - written) < datetime.timedelta(hours=1)


def test_provenance_of_long_and_non_ascii_names_is_written_whole_without_a_warning(tmp_path):
    import warnings

    from plugins.spectra import fitsio

    args = SimpleNamespace(grid=str(tmp_path / ("g" * 90 + ".npz")), input=str(tmp_path / ("\u00e9toile" * 20)),
                           degree=2, max_iter=7, backend="auto", batch=None)
    columns = {name: np.arange(3.0) for name in RESULT_COLUMNS}
    columns.update(TARGETID=np.arange(3), NPIX=np.arange(3), ITERATIONS=np.arange(3), FLAGS=np.zeros(3, np.int32),
                   SUCCESS=np.ones(3, bool))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a card astropy would cut short warns
        fitsio.write_results(columns, tmp_path / "out.fits", cli._provenance(args, ["torch:cuda"], "f" * 64))
    header = fits.getheader(tmp_path / "out.fits")
    assert header["INFILE"] == "\\xe9toile" * 20 and header["GRID"] == "g" * 90 + ".npz"
    assert header["INSHA256"] == "f" * 64 and header["BATCH"] == "auto" and header["BACKEND"] == "torch:cuda"
    assert header["DEGREE"] == 2 and header["MAXITER"] == 7 and header["BACKREQ"] == "auto"
    table = read_results(tmp_path / "out.fits")
    assert table.keys() == columns.keys() and all(np.array_equal(table[k], columns[k]) for k in columns)


def test_a_resumed_run_names_every_backend_that_fitted_rows(coadd, reference, tmp_path, monkeypatch):
    out = tmp_path / "out.fits"
    Solves(monkeypatch, stop_at=2)
    assert fit(coadd, out, "--batch", "4") == 130
    Solves(monkeypatch)
    assert main(["fit-spectra", str(coadd), "-o", str(out), "--backend", "numpy", "--batch", "4"]) == 0
    backends = fits.getheader(out)["BACKEND"].split(", ")
    assert len(backends) == 2 and backends[0].startswith("numba") and backends[1].startswith("numpy")
    table, want = read_results(out), read_results(reference)
    for column in ("VRAD", "TEFF"):  # numpy's own optimiser: the same answers well within the errors
        assert np.all(np.abs(table[column] - want[column]) <= 0.1 * table[f"{column}_ERR"]), column


# -- 6. without astropy ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["fit-spectra", "synth-coadd"])
def test_missing_astropy_is_one_line_with_the_install_command(coadd, tmp_path, monkeypatch, capsys, command):
    for name in [m for m in sys.modules if m == "astropy" or m.startswith("astropy.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import astropy...` now fails as if not installed
    before = digest(coadd)
    out = tmp_path / "out.fits"
    argv = ["fit-spectra", str(coadd), "-o", str(out)] if command == "fit-spectra" else ["synth-coadd", str(out)]
    assert main(argv) == 2
    error = one_error(capsys.readouterr().err)
    assert "needs astropy" in error and 'pip install ".[fits]" from a clone of crossover' in error
    assert digest(coadd) == before and os.listdir(tmp_path) == []
