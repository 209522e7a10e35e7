"""The fit: exact on exact data, robust to one wild sample, honest about its range."""

from __future__ import annotations

import time

import pytest

from core.costmodel.fit import Sample, fit
from core.costmodel.plan import choose

SIZES = [1e3, 4e3, 1.6e4, 6.4e4, 2.56e5, 1e6]


def serial(n: float) -> float:
    return 2e-5 + 4e-8 * n


def parallel(n: float) -> float:
    return 5e-3 + 1e-8 * n


def samples(cost, sizes=SIZES):
    return [Sample({"n": n}, cost(n)) for n in sizes]


def test_fit_recovers_known_coefficients():
    model = fit(samples(parallel))
    assert model.intercept == pytest.approx(5e-3, rel=1e-9)
    assert model.coefficients == pytest.approx((1e-8,), rel=1e-9)
    assert model.relative_error < 1e-9 and model.n_rejected == 0


def test_coefficients_are_never_negative():
    # timings that shrink with size would need a negative slope; NNLS clamps it at 0
    model = fit([Sample({"n": n}, 1.0 / n) for n in SIZES])
    assert model.intercept >= 0 and all(c >= 0 for c in model.coefficients)


def test_relative_weighting_keeps_small_sizes_accurate():
    model = fit(samples(serial))
    for n in SIZES:
        assert model.predict({"n": n})[0] == pytest.approx(serial(n), rel=1e-6)


@pytest.mark.parametrize("wild", range(len(SIZES)))
def test_one_wild_sample_does_not_move_the_decision(wild):
    clean = {"serial": fit(samples(serial)), "parallel": fit(samples(parallel))}
    spoiled = samples(parallel)
    spoiled[wild] = Sample(spoiled[wild].features, spoiled[wild].seconds * 50)
    dirty = {"serial": clean["serial"], "parallel": fit(spoiled)}
    assert dirty["parallel"].n_rejected == 1
    simplicity = {"serial": 0, "parallel": 30}
    for n in [500, 2e3, 1e4, 1.5e5, 1.7e5, 5e5, 3e6]:
        costs_clean = {b: m.predict({"n": n})[0] for b, m in clean.items()}
        costs_dirty = {b: m.predict({"n": n})[0] for b, m in dirty.items()}
        assert choose(costs_dirty, simplicity) == choose(costs_clean, simplicity)


def test_predictions_far_outside_the_fitted_range_are_flagged():
    model = fit(samples(serial))
    assert model.predict({"n": 5e5})[1] is False
    assert model.predict({"n": 1.9e6})[1] is False  # within 2x of the top
    assert model.predict({"n": 1e8})[1] is True
    assert model.predict({"n": 10})[1] is True


def test_fit_refuses_no_samples():
    with pytest.raises(ValueError, match="without samples"):
        fit([Sample({"n": 1.0}, float("nan"))])


def test_no_sample_is_rejected_when_the_rest_cannot_judge_it():
    """Four samples of a steep two-feature cost: every one is needed, none is an outlier."""
    data = [Sample({"n": n, "m": 51.0}, 0.4 + 3e-6 * n) for n in (1e3, 3e3, 1e4, 9e5)]
    model = fit(data)
    assert model.n_rejected == 0
    assert model.predict({"n": 9e5, "m": 51.0})[0] == pytest.approx(0.4 + 3e-6 * 9e5, rel=1e-6)


def test_a_backend_is_timed_only_after_the_last_ones_spinning_threads_had_a_pause(monkeypatch):
    """OpenBLAS's and torch's pools spin after a call: a threaded backend timed right after shares the cores."""
    from core.costmodel import calibrate as calibration

    pauses = []
    monkeypatch.setattr(calibration, "hold_the_core", pauses.append)
    monkeypatch.setattr(calibration, "_last_measured", [])
    for backend in ("numpy", "numba", "numba", "torch", "torch", "process", "numpy", "numpy"):
        calibration._quiet_after_spinners(backend)
    # after numpy (before numba) and after torch (before process): never within a backend or after numba
    assert pauses == [calibration.QUIET_SECONDS] * 2


def test_the_pause_keeps_the_core_busy(monkeypatch):
    # asleep, the host's cores go idle and a two-thread kernel then runs slow for tens of ms (the VM)
    from core.costmodel import calibrate as calibration

    monkeypatch.setattr(calibration.time, "sleep", lambda seconds: pytest.fail("the pause slept"))
    began_cpu, began = time.process_time(), time.perf_counter()
    calibration.hold_the_core(0.05)
    assert time.perf_counter() - began >= 0.05 and time.process_time() - began_cpu > 0.02


_COMPILED: list[bool] = []


def _slow_first_run(problem):
    import time as clock

    if not _COMPILED:  # a JIT's first call: compiles, once per process
        _COMPILED.append(True)
        clock.sleep(1.5)
    return {"total": float(problem.n)}


def test_a_first_run_s_compilation_is_not_charged_to_the_calibration_budget(fresh_registry, empty_cache):
    """On a fresh GPU host Numba compiled for 23 s of the quick 25 s budget, and one design point was all
    the models saw. The one-off belongs to the implementation, not to the samples."""
    from dataclasses import dataclass

    import core
    from core.solver import SizeSpace

    @dataclass(frozen=True)
    class Tiny:
        n: int = 1000

    plugin = type("Compiling", (), {})()
    plugin.crossover_solvers = core.hookimpl(lambda: [core.SolverSpec(
        name="jit.tiny", problem_type=Tiny, implementations={"numpy": _slow_first_run},
        features=lambda p: {"n": float(p.n)}, size_axis="n",
        space=lambda quick: SizeSpace(ranges={"n": (1_000, 1_000_000)}),
        memory=lambda p, b: 8.0 * p.n, default_problem=Tiny)])
    core.register(plugin, name="jit")
    _COMPILED.clear()
    [report] = core.calibrate(["jit.tiny"], budget=1.0)
    [row] = report.backends
    assert row.one_off_seconds >= 1.4
    assert row.samples >= 8 and row.stopped == "design done", (row.samples, row.stopped)
