"""Shared fixtures. GPU tests are marked ``gpu`` and skipped where no GPU runs."""

from __future__ import annotations

import pytest

from core import registry


def _gpu_available() -> bool:
    from core.backends.torch_gpu import BACKEND

    return BACKEND.probe().available


def pytest_collection_modifyitems(config, items):
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
