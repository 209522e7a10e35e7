"""Auto-selection, tested exactly with synthetic backends of known cost."""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import pytest

import core
from core.costmodel import history as timings
from core.costmodel.history import sample_record
from core.running import forget_probes
from core.validation import check_int

DEVICE_FREE_BYTES = {"value": 1e12}


@dataclasses.dataclass(frozen=True)
class WorkProblem:
    n: int = 1000

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))


def _echo(problem):
    return {"n": np.array(problem.n)}


# seconds = intercept + slope * n, one-off seconds, simplicity
KNOWN = {
    "serial": (1e-5, 1e-7, 0.0, 0),
    "pool": (1e-2, 1e-8, 0.5, 30),
    "device": (5e-3, 1e-9, 1.0, 40),
}


def _backend(name):
    free = (lambda: DEVICE_FREE_BYTES["value"]) if name == "device" else (lambda: None)
    return core.Backend(name=name, summary="synthetic", probe=lambda: core.Availability(True),
                        simplicity=KNOWN[name][3], free_memory=free)


class Synthetic:
    @core.hookimpl
    def crossover_backends(self):
        return [_backend(name) for name in KNOWN]

    @core.hookimpl
    def crossover_solvers(self):
        return [core.SolverSpec(
            name="synthetic.work", problem_type=WorkProblem,
            implementations={name: _echo for name in KNOWN},
            features=lambda p: {"n": float(p.n)}, size_axis="n",
            ladder=lambda quick: [WorkProblem(n) for n in (10, 1_000, 100_000, 1_000_000)],
            memory=lambda p, backend: 8.0 * p.n, default_problem=WorkProblem)]


@pytest.fixture
def synthetic(fresh_registry, empty_cache):
    """The synthetic plugin, with calibration samples of exactly known cost on disk."""
    core.register(Synthetic(), name="synthetic")
    spec = core.solvers()["synthetic.work"]
    for name, (intercept, slope, one_off, _) in KNOWN.items():
        records = [sample_record(spec, name, p, intercept + slope * p.n, "calibration") for p in spec.ladder(True)]
        timings.record_calibration(spec, name, records, one_off, {})
    DEVICE_FREE_BYTES["value"] = 1e12
    forget_probes()
    return spec


def test_tiny_problem_goes_to_the_path_without_start_up_cost(synthetic):
    plan = core.plan(WorkProblem(10), expected_calls=math.inf)
    assert plan.backend == "serial"
    assert plan.predictions["serial"].status == "calibrated"
    assert plan.predictions["serial"].seconds == pytest.approx(1e-5 + 1e-6)


def test_large_problem_goes_to_the_parallel_or_gpu_path(synthetic):
    assert core.plan(WorkProblem(1_000_000), expected_calls=math.inf).backend == "device"


def test_memory_exclusion(synthetic):
    DEVICE_FREE_BYTES["value"] = 1e6  # the problem needs 8 MB
    plan = core.plan(WorkProblem(1_000_000), expected_calls=math.inf)
    assert plan.backend == "pool"
    assert plan.excluded["device"] == "not enough memory: needs 0.01 GiB, 0.00 GiB free"


def test_break_even_between_serial_and_pool(synthetic):
    DEVICE_FREE_BYTES["value"] = 1.0
    plan = core.plan(WorkProblem(50_000), expected_calls=math.inf)
    crossing = (1e-2 - 1e-5) / (1e-7 - 1e-8)  # where the two lines meet
    assert [(b["below"], b["above"]) for b in plan.break_even] == [("serial", "pool")]
    assert plan.break_even[0]["size"] == pytest.approx(crossing, rel=1e-3)


def test_margin_rule_prefers_the_simpler_backend():
    from core.costmodel.plan import choose

    simplicity = {"numpy": 0, "process": 30}
    assert choose({"numpy": 1.0, "process": 0.97}, simplicity) == "numpy"
    assert choose({"numpy": 1.0, "process": 0.90}, simplicity) == "process"
    assert choose({"numpy": 1.0, "process": 0.97}, simplicity, margin=0.0) == "process"


def test_within_the_margin_equally_simple_variants_go_to_the_one_owing_the_least_one_off():
    from core.costmodel.plan import choose

    simplicity = {"torch:compile": 40, "torch:graph": 40, "numpy": 0}
    costs = {"torch:compile": 6.58e-3, "torch:graph": 6.74e-3}
    owed = {"torch:compile": 0.3, "torch:graph": 0.003}
    assert choose(costs, simplicity, 0.05) == "torch:compile"  # nothing owed: the cheaper
    assert choose(costs, simplicity, 0.05, owed) == "torch:graph"  # the models cannot tell them apart
    assert choose(costs, simplicity, 0.01, owed) == "torch:compile"  # outside the margin the cost decides
    # simplicity still comes first: the simpler one wins whatever the others owe
    assert choose({**costs, "numpy": 6.8e-3}, simplicity, 0.05, {**owed, "numpy": 0.5}) == "numpy"


def test_margin_rule_in_a_plan(synthetic):
    DEVICE_FREE_BYTES["value"] = 1.0
    # at n = 111_000 pool is 0.1 % faster than serial: inside the margin, serial wins
    plan = core.plan(WorkProblem(111_500), expected_calls=math.inf)
    assert plan.backend == "serial" and "simpler" in plan.reason


def test_unpaid_one_off_costs_are_charged_once_per_process(synthetic):
    problem = WorkProblem(1_000_000)
    first = core.plan(problem)  # device would need its 1 s one-off: serial (0.1 s) is cheaper now
    assert first.backend == "serial"
    assert first.predictions["device"].one_off_seconds == 1.0
    core.solve(problem, backend="device")  # pays the one-off
    second = core.plan(problem, expected_calls=1)
    assert second.backend == "device" and second.predictions["device"].one_off_seconds == 0.0
    # spreading the pool's one-off over many calls also makes it worth paying
    assert core.plan(problem, expected_calls=1e6).predictions["pool"].one_off_seconds == 0.5


def test_uncalibrated_backend_is_reported_not_chosen(synthetic):
    class Late:
        @core.hookimpl
        def crossover_backends(self):
            return [core.Backend(name="late", summary="synthetic", probe=lambda: core.Availability(True))]

    core.register(Late(), name="late")
    forget_probes()
    spec = core.solvers()["synthetic.work"]
    patched = dataclasses.replace(spec, implementations={**spec.implementations, "late": _echo})
    core.registry.get_registry().solvers["synthetic.work"] = patched
    plan = core.plan(WorkProblem(10))
    assert plan.predictions["late"].status == "uncalibrated"
    assert plan.excluded["late"].startswith("uncalibrated")


def test_extrapolated_predictions_are_marked(synthetic):
    plan = core.plan(WorkProblem(10**9), expected_calls=math.inf)
    assert all(p.status == "extrapolated" for p in plan.predictions.values())


def test_solves_add_to_the_history_and_the_model_refits(synthetic):
    spec = synthetic
    before = timings.model(spec, "pool")
    core.solve(WorkProblem(5), backend="pool")  # first call owes pool's 0.5 s one-off: not a steady sample
    core.solve(WorkProblem(5), backend="pool")
    core.solve(WorkProblem(5), backend="pool")
    timings.flush()
    history = timings.stored()["solvers"]["synthetic.work"]["backends"]["pool"]["history"]
    assert len(history) == 2 and all(r["source"] == "solve" for r in history)
    after = timings.model(spec, "pool")
    assert after is not before and after.n_samples + after.n_rejected == before.n_samples + 1


def test_a_named_backend_checks_memory_too(synthetic):
    DEVICE_FREE_BYTES["value"] = 1e6  # the problem needs 8 MB
    with pytest.raises(core.NotEnoughMemoryError,
                       match=r"^backend 'device' cannot run synthetic.work on this problem: device: not enough memory: "
                             r"needs 0.01 GiB, 0.00 GiB free$"):
        core.solve(WorkProblem(1_000_000), backend="device")


def test_auto_on_an_uncalibrated_solver_calibrates_once_and_logs(fresh_registry, empty_cache, caplog):
    core.register(Synthetic(), name="synthetic")
    forget_probes()
    with caplog.at_level(logging.WARNING, logger="crossover"):
        result = core.solve(WorkProblem(100))
    assert "synthetic.work has never been calibrated on this machine" in caplog.text
    assert result.plan.backend == result.backend
    assert set(result.plan.predictions) == set(KNOWN)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="crossover"):
        core.solve(WorkProblem(100))
    assert "never been calibrated" not in caplog.text


def test_no_runnable_backend_is_a_clear_error(synthetic):
    DEVICE_FREE_BYTES["value"] = 1.0
    spec = core.solvers()["synthetic.work"]
    only_device = dataclasses.replace(spec, implementations={"device": _echo})
    core.registry.get_registry().solvers["synthetic.work"] = only_device
    with pytest.raises(core.AutoSelectionError, match=r"no backend can run synthetic.work here \(device: not enough"):
        core.plan(WorkProblem(1000))


def test_break_even_applies_memory_limits_size_by_size(synthetic):
    DEVICE_FREE_BYTES["value"] = 8e5  # the device holds problems up to n = 100_000
    plan = core.plan(WorkProblem(1_000_000), expected_calls=math.inf)
    assert plan.backend == "pool" and plan.excluded["device"].startswith("not enough memory")
    steps = [(b["below"], b["above"]) for b in plan.break_even]
    # device wins from where its line crosses serial's until it runs out of memory; then serial
    # is cheapest again until pool's line crosses it
    assert steps == [("serial", "device"), ("device", "serial"), ("serial", "pool")]
    sizes = [b["size"] for b in plan.break_even]
    assert sizes[0] == pytest.approx((5e-3 - 1e-5) / (1e-7 - 1e-9), rel=1e-3)
    assert sizes[1] == pytest.approx(100_000, rel=1e-3)
    assert sizes[2] == pytest.approx((1e-2 - 1e-5) / (1e-7 - 1e-8), rel=1e-3)


def test_first_calls_update_the_one_off_cost(synthetic):
    spec = synthetic
    assert timings.one_off(spec, "serial", WorkProblem(10)) == 0.0
    core.solve(WorkProblem(10), backend="serial")  # instant: observed one-off is about 0
    entry = timings.stored()["solvers"]["synthetic.work"]["backends"]["serial"]
    assert len(entry["one_off_observations"]) == 2  # the calibration's and this first call's


def test_a_recent_reading_of_free_memory_serves_the_problems_it_dwarfs(synthetic, monkeypatch):
    """A free-memory reading (six file opens for the host's) is reused for up to 30 s by a problem needing at
    most a sixteenth of it; a larger problem, or an older reading, reads again, and a reading too small for
    the problem excludes it as before."""
    from core import running

    reads = []
    real = running.safe_free_memory
    monkeypatch.setattr(running, "safe_free_memory", lambda backend: reads.append(backend.name) or real(backend))
    small, large = WorkProblem(1_000), WorkProblem(10_000_000_000)  # 8 KB; 80 GB, over a sixteenth of 1 TB
    assert running.exclusion(synthetic, small, "device") == "" and reads == ["device"]
    assert running.exclusion(synthetic, small, "device") == "" and reads == ["device"]  # dwarfed: no new read
    DEVICE_FREE_BYTES["value"] = 1e10
    assert running.exclusion(synthetic, large, "device").startswith("not enough memory")  # read again
    assert reads == ["device"] * 2
    monkeypatch.setattr(running, "AGED_READING_SECONDS", 0.0)
    assert running.exclusion(synthetic, small, "device") == "" and reads == ["device"] * 3  # too old: read again
