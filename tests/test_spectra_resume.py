"""fit-spectra resumes: a run stopped part-way keeps its batches, and the rerun fits only the rest.

The truth is an uninterrupted run of the same command, and the rows handed
to the solver, counted by wrapping ``core.solve``.
"""

from __future__ import annotations

import numpy as np
import pytest

import core
from core.cli import main
from plugins.spectra.cli import checkpoint_path
from plugins.spectra.fitsio import read_results

SOLVE = core.solve  # the real one, before any test wraps it


@pytest.fixture(scope="module")
def reference(coadd, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "out.fits"
    assert main(["fit-spectra", str(coadd), "-o", str(out), "--backend", "numba", "--batch", "4"]) == 0
    return read_results(out)


class Solves:
    """``core.solve`` wrapped: records the TARGETIDs of each batch, and raises Ctrl-C at batch ``stop_at``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stop_at: int | None = None):
        self.batches: list[list[int]] = []
        self.stop_at = stop_at
        monkeypatch.setattr(core, "solve", self)

    def __call__(self, problem, **kwargs):
        if len(self.batches) == self.stop_at:
            raise KeyboardInterrupt
        self.batches.append([int(t) for t in problem.spectra.targetid])
        return SOLVE(problem, **kwargs)


def fit(coadd, out, *extra: str) -> int:
    return main(["fit-spectra", str(coadd), "-o", str(out), "--backend", "numba", *extra])


def same_table(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def test_an_interrupted_fit_resumes_and_matches_an_uninterrupted_one(coadd, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.fits"
    stopped = Solves(monkeypatch, stop_at=1)
    assert fit(coadd, out, "--batch", "4") == 130
    assert f"interrupted: kept the spectra fitted so far in {checkpoint_path(str(out))}" in capsys.readouterr().err
    assert stopped.batches == [list(reference["TARGETID"][:4])]
    assert checkpoint_path(str(out)).is_file() and not out.exists()

    resumed = Solves(monkeypatch)
    assert fit(coadd, out, "--batch", "4") == 0
    captured = capsys.readouterr()
    assert "resumed: 4 of 10 spectra already fitted, skipped" in captured.err
    assert "6 spectra fitted in" in captured.out and "4 resumed; 10 succeeded, 0 flagged" in captured.out
    assert sorted(t for batch in resumed.batches for t in batch) == sorted(reference["TARGETID"][4:])
    assert same_table(read_results(out), reference)
    assert not checkpoint_path(str(out)).exists()  # removed once the table is written


def test_a_rerun_with_another_batch_size_fits_only_the_missing_rows(coadd, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.fits"
    Solves(monkeypatch, stop_at=2)
    assert fit(coadd, out, "--batch", "3") == 130
    resumed = Solves(monkeypatch)
    assert fit(coadd, out, "--batch", "4") == 0
    assert "resumed: 6 of 10 spectra already fitted, skipped" in capsys.readouterr().err
    assert resumed.batches == [list(reference["TARGETID"][6:10])]
    table = read_results(out)
    assert np.array_equal(table["TARGETID"], reference["TARGETID"]) and table["SUCCESS"].all()
    for column in ("VRAD", "TEFF", "LOGG", "FEH"):  # other batches, the same fits to well within their errors
        assert np.all(np.abs(table[column] - reference[column]) <= 1e-3 * table[f"{column}_ERR"]), column


def test_a_checkpoint_of_other_settings_is_refused(coadd, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out.fits"
    Solves(monkeypatch, stop_at=1)
    assert fit(coadd, out, "--batch", "4") == 130
    capsys.readouterr()
    assert fit(coadd, out, "--batch", "4", "--max-iter", "5") == 2
    error = capsys.readouterr().err
    assert (f"crossover: error: checkpoint {checkpoint_path(str(out))} belongs to another run (max_iter: 30 there, "
            f"5 here); delete it to start afresh, or give another checkpoint path") in error
    assert checkpoint_path(str(out)).is_file()  # never thrown away for the user


def test_a_run_stopped_while_writing_the_table_resumes_without_fitting(coadd, reference, tmp_path, monkeypatch,
                                                                       capsys):
    from plugins.spectra import fitsio

    out, other = tmp_path / "out.fits", tmp_path / "other.fits"
    write = fitsio.write_results

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(fitsio, "write_results", interrupted)
    assert fit(coadd, out, "--batch", "4") == 130
    assert "kept the spectra fitted so far in" in capsys.readouterr().err
    monkeypatch.setattr(fitsio, "write_results", write)
    path = checkpoint_path(str(out))
    checkpoint_path(str(other)).write_bytes(path.read_bytes())  # every row is in it

    solves = Solves(monkeypatch)
    assert fit(coadd, other, "--batch", "4") == 0
    captured = capsys.readouterr()
    assert "resumed: 10 of 10 spectra already fitted, skipped" in captured.err
    assert "no spectra left to fit (10 resumed); 10 succeeded, 0 flagged" in captured.out and not solves.batches
    assert same_table(read_results(other), reference)

    path.write_bytes(path.read_bytes()[:-5])  # a crash cut the last batch's line short
    assert fit(coadd, out, "--batch", "4") == 0
    captured = capsys.readouterr()
    assert f"crossover: warning: checkpoint {path}: its last line was cut short" in captured.err
    assert "resumed: 8 of 10 spectra already fitted, skipped" in captured.err
    assert solves.batches == [list(reference["TARGETID"][8:])] and "2 spectra fitted in" in captured.out
    assert same_table(read_results(out), reference)
