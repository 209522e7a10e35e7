"""Shared fixtures. GPU tests are marked ``gpu`` and skipped where no GPU runs.

Tests are marked ``slow`` by measurement, not by hand: ``tests/slow_tests.txt``
lists those whose setup and call took over a second on the 2-core VM, so
``pytest -m "not slow"`` is the quick subset a contributor runs (CI runs
them all). Regenerate the list from a full run's durations with
``python -m pytest --durations=0 tests | python tests/slow_list.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core import registry


def _gpu_available() -> bool:
    from core.backends.torch_gpu import BACKEND

    return BACKEND.probe().available


SLOW_LIST = Path(__file__).with_name("slow_tests.txt")


def _slow_ids() -> set[str]:
    if not SLOW_LIST.exists():
        return set()
    return {line.strip() for line in SLOW_LIST.read_text().splitlines() if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    slow = _slow_ids()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
    if any("gpu" in item.keywords for item in items) and not _gpu_available():
        skip = pytest.mark.skip(reason="needs a CUDA or MPS GPU (torch backend unavailable here)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def fresh_registry(monkeypatch):
    """A registry rebuilt from scratch for this test and thrown away after it."""
    monkeypatch.delenv("CROSSOVER_PLUGINS_STRICT", raising=False)
    monkeypatch.delenv("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    registry.reset()
    yield
    registry.reset()


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory):
    """Tests never read or write the user's wisdom file."""
    import os

    from core.costmodel import history as timings

    os.environ["CROSSOVER_CACHE_DIR"] = str(tmp_path_factory.mktemp("crossover-cache"))
    timings.forget()
    yield


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A private, empty wisdom store for one test."""
    from core.costmodel import history as timings

    monkeypatch.setenv("CROSSOVER_CACHE_DIR", str(tmp_path / "cache"))
    timings.forget()
    yield tmp_path / "cache"
    timings.forget()


@pytest.fixture(scope="module")
def coadd(tmp_path_factory):
    """A 10-spectrum synthetic DESI-like coadd (``crossover synth-coadd``), for the fit-spectra tests."""
    from core.cli import main

    path = tmp_path_factory.mktemp("coadd") / "coadd.fits"
    assert main(["synth-coadd", str(path), "-n", "10", "--seed", "4", "--snr-min", "15", "--snr-max", "60"]) == 0
    return path
