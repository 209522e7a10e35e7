"""Selection that holds off the ladder, tested with synthetic backends and solvers of known cost.

Each test pins one rule of docs/costmodel.md: identifiability, the trust
region, the error-driven margin, measuring when unsure, one-off costs paid
where they belong, and expected calls learnt from the process.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings

import numpy as np
import pytest

import core
from core.costmodel import history
from core.costmodel.features import model_features
from core.costmodel.fit import Sample, fit
from core.costmodel.history import IdentifiabilityWarning, sample_record
from core.running import forget_probes
from core.validation import check_int


@dataclasses.dataclass(frozen=True)
class GridProblem:
    n: int = 1000
    m: int = 10

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))
        object.__setattr__(self, "m", check_int("m", self.m, minimum=1))


def _echo(problem):
    return {"n": np.array(problem.n)}


def _sleeper(seconds_per_call):
    def run(problem):
        time.sleep(seconds_per_call)
        return {"n": np.array(problem.n)}

    return run


STARTS = {"pool": 0}


def _start_pool():
    STARTS["pool"] += 1


BACKENDS = {"serial": 0, "pool": 30, "device": 40}


def _spec(name, implementations, features=lambda p: {"n": float(p.n), "m": float(p.m)}, **more):
    return core.SolverSpec(name=name, problem_type=GridProblem, implementations=implementations,
                           features=features, size_axis="n",
                           space=lambda quick: core.SizeSpace(ranges={"n": (10, 1e6), "m": (1, 100)}),
                           memory=lambda p, key: 8.0 * p.n, default_problem=GridProblem, **more)


class Plugin:
    def __init__(self, specs):
        self.specs = specs

    @core.hookimpl
    def crossover_backends(self):
        return [core.Backend(name=name, summary="synthetic", probe=lambda: core.Availability(True),
                             simplicity=simplicity, start=_start_pool if name == "pool" else None)
                for name, simplicity in BACKENDS.items()]

    @core.hookimpl
    def crossover_solvers(self):
        return self.specs


def _install(*specs):
    core.register(Plugin(list(specs)), name="synthetic")
    forget_probes()
    return [core.solvers()[spec.name] for spec in specs]


def _calibrate(spec, key, cost, problems, one_off=0.0):
    records = [sample_record(spec, key, p, cost(p), "calibration") for p in problems]
    history.record_calibration(spec, key, records, one_off, {})


GRID = [GridProblem(n, m) for n in (10, 1_000, 100_000) for m in (1, 10, 100)]


@pytest.fixture
def clean(fresh_registry, empty_cache):
    STARTS["pool"] = 0
    yield


# -- identifiability -------------------------------------------------------------------

def test_a_rank_deficient_design_is_reported_and_handled(clean):
    (spec,) = _install(_spec("synthetic.flat", {"serial": _echo}))
    ladder = [GridProblem(n, 10) for n in (10, 100, 1_000, 10_000)]  # m never moves
    _calibrate(spec, "serial", lambda p: 1e-3 + 1e-6 * p.n + 1e-4 * p.m, ladder)
    with pytest.warns(IdentifiabilityWarning, match=r"synthetic.flat on serial: the samples cannot determine 'm'"):
        model = history.model(spec, "serial")
    assert model.undetermined == ("m",) and model.rank == 2
    # m's share went to the intercept: right where m is 10, and flagged where m moved
    assert model.predict({"n": 5_000.0, "m": 10.0}) == (pytest.approx(1e-3 + 5e-3 + 1e-3), False)
    assert model.predict({"n": 5_000.0, "m": 100.0})[1] is True


def test_a_feature_zero_in_every_sample_is_dropped_without_a_warning(clean):
    """A cost that no calibrated problem reached (a cache spill past the largest one) lent no time to the
    other features: dropped, and predictions where it moves are extrapolated, with nothing to warn of."""
    spill = lambda p: {"n": float(p.n), "m": float(p.m), "spilled": max(0.0, p.n - 1e6)}  # noqa: E731
    (spec,) = _install(_spec("synthetic.unspilled", {"serial": _echo}, features=spill))
    _calibrate(spec, "serial", lambda p: 1e-3 + 1e-6 * p.n + 1e-4 * p.m, GRID)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IdentifiabilityWarning)
        model = history.model(spec, "serial")
    assert model.undetermined == ("spilled",)
    assert model.predict({"n": 5e6, "m": 10.0, "spilled": 4e6})[1] is True

def test_an_implementations_own_features_price_what_only_it_pays(clean):
    """A variant whose first steps launch one by one and whose later ones replay a captured graph (spectra's
    torch:graph) costs per step what no feature of the solver says. Declared as its own features, its model
    prices a one-step run and a long one alike; the other implementation's model never sees them."""
    steps = lambda p: {"n": float(p.n), "steps": float(p.m)}  # noqa: E731
    own = {"device": lambda f: {"eager_steps": min(f["steps"], 3.0), "captures": float(f["steps"] > 2)}}
    graph_cost = lambda p: 1e-4 + 2e-3 * min(p.m, 3) + 5e-3 * (p.m > 2) + 1e-5 * p.m  # noqa: E731
    (spec,) = _install(_spec("synthetic.graph", {"serial": _echo, "device": _echo}, features=steps,
                             implementation_features=own))
    design = [GridProblem(n, m) for n in (10, 1_000, 100_000) for m in (1, 2, 3, 5, 20, 60)]
    _calibrate(spec, "device", graph_cost, design)
    _calibrate(spec, "serial", lambda p: 1e-3 + 1e-6 * p.n + 1e-5 * p.m, design)
    device = history.model(spec, "device")
    for problem in (GridProblem(500, 1), GridProblem(500, 4), GridProblem(50_000, 40)):
        predicted, extrapolated = device.predict(model_features(spec, problem, "device"))
        assert predicted == pytest.approx(graph_cost(problem), rel=1e-6) and not extrapolated
    assert "eager_steps" not in model_features(spec, GridProblem(500, 1), "serial")
    assert {"eager_steps", "captures"} <= set(device.feature_names) and not device.undetermined
    # the plan's prediction goes through the same features
    assert core.plan(GridProblem(500, 1), solver=spec.name).predictions["device"].seconds == pytest.approx(
        graph_cost(GridProblem(500, 1)), rel=1e-6)


def test_a_one_sample_fit_is_never_calibrated(clean):
    model = fit([Sample({"n": 100.0, "m": 10.0}, 0.01)])
    assert not model.calibrated and model.status == "uncalibrated"
    (spec,) = _install(_spec("synthetic.single", {"serial": _echo, "pool": _echo}))
    _calibrate(spec, "serial", lambda p: 1e-3, [GridProblem(100, 10)])
    _calibrate(spec, "pool", lambda p: 2e-3 + 1e-9 * p.n, GRID)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IdentifiabilityWarning)
        plan = core.plan(GridProblem(100, 10), expected_calls=math.inf)
    assert plan.predictions["serial"].status == "uncalibrated"
    assert plan.predictions["pool"].status == "calibrated"


def test_a_prediction_off_the_span_of_the_samples_is_extrapolated():
    # n and m always moved together: every feature alone is inside its range ...
    samples = [Sample({"n": float(k), "m": float(k)}, 1e-3 + 1e-6 * k) for k in (10, 100, 1_000, 10_000)]
    model = fit(samples)
    assert model.predict({"n": 500.0, "m": 500.0})[1] is False
    # ... but a point where one is large and the other small was never near a sample
    assert model.predict({"n": 10_000.0, "m": 10.0})[1] is True


# -- the margin follows the measured error ---------------------------------------------

def test_the_margin_grows_with_the_models_error(clean):
    serial_spec, = _install(_spec("synthetic.margin", {"serial": _echo, "pool": _echo}))
    rng = np.random.default_rng(7)
    problem = GridProblem(50_000, 10)
    # pool is truly 6 % faster at this problem
    serial_cost = lambda p: 1e-3 + 1e-7 * p.n  # noqa: E731
    pool_cost = lambda p: 1e-3 + 0.94e-7 * p.n - 0.06e-3  # noqa: E731

    def decide(noise):
        history.forget()
        jitter = {p: float(np.exp(rng.normal(0, noise))) for p in GRID}
        _calibrate(serial_spec, "serial", lambda p: serial_cost(p) * jitter[p], GRID)
        _calibrate(serial_spec, "pool", lambda p: pool_cost(p) / jitter[p], GRID)
        return core.plan(problem, expected_calls=math.inf, explain=False)

    exact, noisy = decide(0.0), decide(0.08)
    assert exact.predictions["pool"].error == pytest.approx(0.02)  # the floor
    assert noisy.predictions["pool"].error > 0.04
    assert exact.backend == "pool"  # 6 % is outside a 3 % margin
    assert noisy.backend == "serial" and "simpler" in noisy.reason  # and inside a noisy model's margin


@pytest.mark.parametrize("seed", range(6))
def test_what_a_deciding_plan_leaves_beyond_reach_changes_no_decision(clean, seed):
    """A plan that only decides (core.solve's) skips what its models put beyond reach of the cheapest: the same
    choice, close set and confidence as the plan that weighs everything, and nothing it left out was close."""
    spec, = _install(_spec(f"synthetic.reach{seed}", {"serial": _echo, "pool": _echo, "device": _echo,
                                                     "device:fast": _echo}))
    rng = np.random.default_rng(seed)
    for key in spec.implementations:
        base, slope, noise = 10 ** rng.uniform(-5, -2), 10 ** rng.uniform(-9, -6), rng.uniform(0, 0.3)
        jitter = {p: float(np.exp(rng.normal(0, noise))) for p in GRID}
        costs = {p: (base + slope * p.n) * jitter[p] for p in GRID}
        _calibrate(spec, key, costs.get, GRID, one_off=rng.uniform(0, 0.5))
    left_out = 0
    for n, m in ((10, 1), (3_000, 20), (90_000, 90), (5_000_000, 200)):
        for calls in (1.0, 10.0, math.inf):
            problem = GridProblem(n, m)
            full = core.plan(problem, solver=spec.name, expected_calls=calls)
            deciding = core.plan(problem, solver=spec.name, expected_calls=calls, explain=False)
            assert not full.beyond
            assert (deciding.backend, deciding.close, deciding.confident) == (full.backend, full.close, full.confident)
            for key in deciding.beyond:
                # not judged, or judged as the full plan judges it
                assert key not in full.close
                assert deciding.predictions[key].status in ("beyond", full.predictions[key].status)
                assert deciding.predictions[key].seconds > 1.25 * full.predictions[full.backend].seconds
            left_out += len(deciding.beyond)
    assert left_out  # the draws leave some out: the comparison is not vacuous


def test_a_far_slower_implementation_is_left_beyond_reach_and_not_raced(clean):
    spec, = _install(_spec("synthetic.far", {"serial": _echo, "pool": _echo}))
    _calibrate(spec, "serial", lambda p: 1e-3, GRID)
    _calibrate(spec, "pool", lambda p: 5e-3, GRID)
    result = core.solve(GridProblem(1_000, 10), solver=spec.name, expected_calls=math.inf)
    assert result.backend == "serial" and result.plan.beyond == ("pool",)
    assert result.plan.predictions["pool"].seconds == pytest.approx(5e-3)
    assert "pool" not in result.plan.excluded  # not checked: it is only not weighed


def test_a_calibrated_model_is_left_beyond_reach_by_its_judged_error(clean):
    """Within an extrapolation's reach but far beyond the cheapest by its own error: judged, then left out, its
    exclusions never looked up; the same implementation extrapolating stays a candidate."""
    asked = []

    def supports(problem, key):
        asked.append(key)
        return ""

    spec, = _install(_spec("synthetic.judged_far", {"serial": _echo, "pool": _echo}, supports=supports))
    _calibrate(spec, "serial", lambda p: 1e-3, GRID)
    _calibrate(spec, "pool", lambda p: 2e-3, GRID)  # 2x: inside exp(2 * 50 %), far outside exp(2 * 2 %)
    inside = core.plan(GridProblem(1_000, 10), solver=spec.name, expected_calls=math.inf, explain=False)
    assert inside.backend == "serial" and inside.beyond == ("pool",)
    assert inside.predictions["pool"].status == "calibrated" and asked == ["serial"]
    far = GridProblem(max(p.n for p in GRID) * 10, 10)  # off the calibrated span: both extrapolate
    outside = core.plan(far, solver=spec.name, expected_calls=math.inf, explain=False)
    assert outside.predictions["pool"].status == "extrapolated" and not outside.beyond


def test_the_truth_never_times_what_a_plan_left_beyond_reach_unchecked_and_cannot_run(clean):
    from core.costmodel.evaluate import worth_timing

    spec, = _install(_spec("synthetic.far_unsupported", {"serial": _echo, "pool": _echo, "device": _echo},
                           supports=lambda p, key: "needs m <= 5" if key == "device" and p.m > 5 else ""))
    _calibrate(spec, "serial", lambda p: 1e-3, GRID)
    _calibrate(spec, "pool", lambda p: 5e-3, GRID)
    _calibrate(spec, "device", lambda p: 6e-3, GRID)
    problem = GridProblem(1_000, 10)
    decision = core.plan(problem, solver=spec.name, expected_calls=math.inf, explain=False)
    assert set(decision.beyond) == {"pool", "device"} and not decision.excluded
    assert worth_timing(decision, {"serial"}, spec, problem) == ["serial", "pool"]


# -- when in doubt, measure ------------------------------------------------------------

def test_planning_measure_times_the_close_candidates_before_choosing(clean):
    # the models think serial and pool are neck and neck; in truth pool is 20x faster
    (spec,) = _install(_spec("synthetic.doubt", {"serial": _sleeper(0.02), "pool": _sleeper(0.001)}))
    _calibrate(spec, "serial", lambda p: 1.00e-3, GRID)
    _calibrate(spec, "pool", lambda p: 1.01e-3, GRID)
    problem = GridProblem(1_000, 10)
    once = core.plan(problem, solver="synthetic.doubt", expected_calls=1)
    assert "not confident" in once.reason and once.measure == ()  # one call: nothing to measure for
    assert core.plan(problem, solver="synthetic.doubt", expected_calls=10).measure == ("serial", "pool")
    result = core.solve(problem, solver="synthetic.doubt", expected_calls=10, planning="measure")
    assert result.backend == "pool" and result.plan.predictions["serial"].status == "measured"
    # remembered: the next plan for this problem knows, and says how it knows
    again = core.plan(problem, solver="synthetic.doubt", expected_calls=10)
    assert again.backend == "pool" and again.predictions["pool"].status == "measured"
    # and the measured times went into the history that the models are refitted from
    history.flush()
    stored = history.stored()["solvers"]["synthetic.doubt"]["backends"]
    assert any(r["source"] == "solve" for r in stored["pool"]["history"])


# -- one-off costs where they are paid ---------------------------------------------------

def test_a_backends_start_is_charged_once_across_two_solvers(clean):
    first, second = _install(_spec("synthetic.first", {"serial": _echo, "pool": _echo}),
                             _spec("synthetic.second", {"serial": _echo, "pool": _echo}))
    for spec in (first, second):
        _calibrate(spec, "serial", lambda p: 1e-3, GRID)
        _calibrate(spec, "pool", lambda p: 1e-4, GRID, one_off=0.2)  # its JIT: per implementation
    history.record_start("pool", 0.5)  # the pool's start: per backend
    problem = GridProblem(1_000, 10)
    assert core.plan(problem, solver="synthetic.first").predictions["pool"].one_off_seconds == pytest.approx(0.7)
    assert core.plan(problem, solver="synthetic.second").predictions["pool"].one_off_seconds == pytest.approx(0.7)
    core.solve(problem, backend="pool", solver="synthetic.first")
    assert STARTS["pool"] == 1
    # the second solver still owes its own JIT, but no longer the pool's start
    assert core.plan(problem, solver="synthetic.second").predictions["pool"].one_off_seconds == pytest.approx(0.2)
    core.solve(problem, backend="pool", solver="synthetic.second")
    assert STARTS["pool"] == 1


def test_a_compiled_variant_pays_its_one_off_per_shape(clean):
    (spec,) = _install(_spec("synthetic.shapes", {"device:compiled": _echo, "serial": _echo},
                             compile_key=lambda p, key: (p.n,) if key == "device:compiled" else ()))
    _calibrate(spec, "device:compiled", lambda p: 1e-4, GRID, one_off=0.3)
    _calibrate(spec, "serial", lambda p: 1e-3, GRID, one_off=0.1)
    small, same_shape, other_shape = GridProblem(1_000, 10), GridProblem(1_000, 50), GridProblem(2_000, 10)
    core.solve(small, backend="device:compiled")
    core.solve(small, backend="serial")
    plan = core.plan(same_shape)
    assert plan.predictions["device:compiled"].one_off_seconds == 0.0
    plan = core.plan(other_shape)
    owed = plan.predictions["device:compiled"].one_off_seconds
    assert owed > 0 and owed == history.implementation_one_off(spec, "device:compiled", other_shape)
    assert plan.predictions["serial"].one_off_seconds == 0.0  # compiled once per process


def _compiles_per_shape(whole, per_shape, seen):
    # the first call in the process compiles for ``whole`` s; a first call at each new n after it, ``per_shape``
    def run(problem):
        if problem.n not in seen:
            time.sleep(per_shape if seen else whole)
            seen.add(problem.n)
        return {"n": np.array(problem.n)}
    return run


def test_calibration_measures_a_shape_s_one_off_apart_from_the_first_compile(clean):
    """torch.compile's linreg epoch took 18.7 s to compile and 15-90 ms at each new size after it (H200 host).
    Calibration keeps the two apart: the first warm-up's excess is the whole one-off, those at later shapes
    a shape's; a new shape then owes a shape's one-off once the implementation has run here, the whole one
    before (a new process)."""
    from core.costmodel.calibrate import calibrate_solver

    seen: set = set()
    (spec,) = _install(_spec("synthetic.per_shape", {"device:compiled": _compiles_per_shape(0.4, 0.05, seen),
                                                     "serial": _echo},
                             compile_key=lambda p, key: (p.n,) if key == "device:compiled" else ()))
    calibrate_solver(spec, quick=True, budget=2.0)
    slot = history.entry(spec, "device:compiled")
    assert slot["one_off_seconds"] == pytest.approx(0.4, abs=0.1)
    assert slot["shape_one_off_seconds"] == pytest.approx(0.05, abs=0.03)
    assert len(slot["shape_one_off_observations"]) >= 2
    assert "shape_one_off_seconds" not in history.entry(spec, "serial")  # one compile a process: no shapes
    new, paid = GridProblem(4_321, 10), GridProblem(next(iter(seen)), 10)
    assert history.implementation_one_off(spec, "device:compiled", new) == slot["shape_one_off_seconds"]
    assert history.implementation_one_off(spec, "device:compiled", paid) == 0.0
    facts = history.current().process
    facts.paid.clear()  # a new process: nothing has run
    facts.ran.clear()
    assert history.implementation_one_off(spec, "device:compiled", new) == slot["one_off_seconds"]


def test_a_shape_s_one_off_follows_the_size_where_the_stored_shapes_show_it_growing():
    """The line through (one-off, warm run) pairs: Theil-Sen, so one one-off that met a busy machine moves it
    no more than its share; too few pairs, or runs that do not span sizes, give no line."""
    from core.costmodel.planner import shape_one_off_line

    grows = [[0.002 + 6.0 * run, run] for run in (1e-4, 4e-4, 1e-3, 3e-3, 8e-3)]
    a, b = shape_one_off_line(grows)
    assert a == pytest.approx(0.002) and b == pytest.approx(6.0)
    a, b = shape_one_off_line([*grows, [0.9, 2e-3]])  # an outlier: the medians keep the line
    assert a == pytest.approx(0.002, abs=2e-3) and b == pytest.approx(6.0, rel=0.2)
    flat = [[0.003, run] for run in (1e-4, 1e-3, 1e-2)]  # a capture: the same at any size
    assert shape_one_off_line(flat) == (pytest.approx(0.003), 0.0)
    assert shape_one_off_line(grows[:2]) is None  # two points are no line
    assert shape_one_off_line([[0.01, 1e-3], [0.02, 1.5e-3], [0.03, 2e-3]]) is None  # runs within 4x


def test_a_shape_line_is_fitted_once_for_equal_pairs_in_any_list(monkeypatch):
    """evaluate's planners each deep-copy the calibration: the same pairs in a new list reuse the line."""
    import copy
    import statistics

    from core.costmodel.planner import shape_one_off_line

    pairs = [[0.003 + 2.0 * run, run] for run in (2e-4, 7e-4, 3e-3, 9e-3)]
    line = shape_one_off_line(pairs)
    monkeypatch.setattr(statistics, "median", lambda values: pytest.fail("the line was fitted again"))
    assert shape_one_off_line(copy.deepcopy(pairs)) == line
    monkeypatch.undo()
    assert shape_one_off_line([*pairs, [0.5, 2e-2]]) != line  # other pairs: fitted anew


def test_a_gain_inside_the_models_error_does_not_buy_a_large_one_off():
    """The cheapest by the models owes a compile for this shape; another, equally simple, bets less by more
    than a call. Within the models' combined error, up to 25 %, the smaller bet is taken (H200 linreg at 16M
    samples: compile modelled 11.5 % under graph, each to 24 and 36 %, graph 12 % faster); with errors that
    can tell them apart, or a gain past 25 %, or a bet smaller by less than a call, the cheapest."""
    from core.costmodel.plan import _Candidate, _decide
    from core.result import Prediction

    def candidates(compile_cost, compile_error, graph_error, graph_stake=0.01):
        def candidate(cost, error, stake):
            return _Candidate(Prediction(cost, "calibrated", stake, error), cost, error, 30, stake)
        return {"torch:compile": candidate(compile_cost, compile_error, 0.53),
                "torch:graph": candidate(13.8e-3, graph_error, graph_stake)}

    chosen, reason, *_ = _decide(candidates(12.2e-3, 0.24, 0.36), math.inf, None)
    assert chosen == "torch:graph" and "owes less one-off" in reason
    assert _decide(candidates(11.1e-3, 0.24, 0.36), math.inf, None)[0] == "torch:graph"  # 24 % under
    assert _decide(candidates(10.9e-3, 0.24, 0.36), math.inf, None)[0] == "torch:compile"  # past 25 %
    assert _decide(candidates(12.2e-3, 0.03, 0.03), math.inf, None)[0] == "torch:compile"  # the errors tell
    # a bet smaller by less than one of the cheapest's calls: the usual 10 % cap
    assert _decide(candidates(12.2e-3, 0.24, 0.36, graph_stake=0.525), math.inf, None)[0] == "torch:compile"


def test_a_new_shape_owes_what_its_size_predicts_and_a_near_tie_goes_to_the_smaller_bet(clean):
    """Two equally simple variants that the models cannot tell apart: one whose first call at a new shape
    redoes the size's work (torch.compile's linreg epoch on the H200 host: 18 ms at 2M samples, 53 at 7.7M),
    one that pays a fixed capture. At a large new shape the first owes more (the line through its shapes),
    and a near-tie goes to the one whose worst shape cost less (Planner.one_off_at_stake)."""
    (spec,) = _install(_spec("synthetic.bets", {"device:compile": _echo, "device:graph": _echo},
                             compile_key=lambda p, key: (p.n,)))
    _calibrate(spec, "device:compile", lambda p: 1e-8 * p.n * p.m, GRID, one_off=5.0)
    _calibrate(spec, "device:graph", lambda p: 1.01e-8 * p.n * p.m, GRID, one_off=0.5)
    core.solve(GridProblem(1_000, 10), backend="device:compile", solver=spec.name)
    core.solve(GridProblem(1_000, 10), backend="device:graph", solver=spec.name)
    # what calibration's later shapes measured: the compile six runs' worth, the capture 3 ms at any size
    for key, pairs in (("device:compile", [[6.0 * run, run] for run in (1e-5, 1e-4, 1e-3)]),
                       ("device:graph", [[0.003, run] for run in (1e-5, 1e-4, 1e-3)])):
        slot = history.entry(spec, key)
        slot["shape_one_off_pairs"], slot["shape_one_off_seconds"] = pairs, 6e-4 if key == "device:compile" else 3e-3
    large = GridProblem(500_000, 100)  # the compile owes six of its runs there, the capture 3 ms
    plan = core.plan(large, solver=spec.name, expected_calls=math.inf)  # one-offs weigh nothing in the costs
    run = plan.predictions["device:compile"].seconds
    owed = plan.predictions["device:compile"].one_off_seconds
    assert owed == pytest.approx(6.0 * run, rel=0.05) and owed > 0.01
    assert plan.predictions["device:graph"].one_off_seconds == pytest.approx(0.003)
    # the models cannot tell them apart (1 %): the tie goes to the smaller one-off at stake, the capture's
    assert plan.backend == "device:graph" and "owes less one-off" in plan.reason
    # where no shape ever cost the compile as much as a capture, the tie goes to it, the cheaper
    history.entry(spec, "device:compile")["shape_one_off_pairs"] = [[1e-4, run] for run in (1e-5, 1e-4, 1e-3)]
    history.entry(spec, "device:compile")["shape_one_off_observations"] = [1e-4]
    assert core.plan(GridProblem(400_000, 100), solver=spec.name, expected_calls=math.inf).backend == "device:compile"


def test_a_solve_at_a_new_shape_adds_a_shape_s_one_off(clean):
    """A real first call at a new shape, after the implementation ran at another, is an observation of a
    shape's one-off (its excess over the model), not of the whole one-off."""
    seen: set = set()
    (spec,) = _install(_spec("synthetic.observed_shapes", {"device:compiled": _compiles_per_shape(0.2, 0.05, seen),
                                                           "serial": _echo},
                             compile_key=lambda p, key: (p.n,) if key == "device:compiled" else ()))
    _calibrate(spec, "device:compiled", lambda p: 1e-3, GRID, one_off=0.2)
    _calibrate(spec, "serial", lambda p: 1e-2, GRID)
    core.solve(GridProblem(1_000, 10), backend="device:compiled", solver=spec.name)
    slot = history.entry(spec, "device:compiled")
    assert "shape_one_off_observations" not in slot and len(slot["one_off_observations"]) == 2
    core.solve(GridProblem(2_000, 10), backend="device:compiled", solver=spec.name)
    slot = history.entry(spec, "device:compiled")
    assert slot["shape_one_off_observations"] == [pytest.approx(0.05, abs=0.03)]
    assert len(slot["one_off_observations"]) == 2  # unchanged


def test_repeated_calls_raise_the_expected_count_until_a_one_off_pays_for_itself(clean):
    (spec,) = _install(_spec("synthetic.loop", {"serial": _echo, "device": _echo}))
    _calibrate(spec, "serial", lambda p: 0.1, GRID)
    _calibrate(spec, "device", lambda p: 0.01, GRID, one_off=0.5)
    problem = GridProblem(1_000, 10)
    chosen = []
    for _ in range(8):
        history.count_call(spec)  # what core.solve does first, for every call
        chosen.append(core.plan(problem, explain=False).backend)
    # at the k-th call 0.01 + 0.5 / k < 0.1 once k >= 6: then the device's one-off pays for itself
    assert chosen == ["serial"] * 5 + ["device"] * 3
    assert core.plan(problem, expected_calls=1e6, explain=False).backend == "device"


# -- variants inside one device -----------------------------------------------------------

def test_variants_are_planned_like_backends_and_a_named_backend_picks_among_them(clean):
    (spec,) = _install(_spec("synthetic.variants", {"serial": _echo, "device:eager": _echo,
                                                     "device:fused": _echo},
                             supports=lambda p, key: "needs m <= 50" if key == "device:fused" and p.m > 50 else ""))
    _calibrate(spec, "serial", lambda p: 1e-2, GRID)
    _calibrate(spec, "device:eager", lambda p: 2e-3 + 1e-5 * p.m, GRID)
    _calibrate(spec, "device:fused", lambda p: 1e-3, GRID)
    plan = core.plan(GridProblem(1_000, 10), expected_calls=math.inf)
    assert set(plan.predictions) == {"serial", "device:eager", "device:fused"}
    assert plan.backend == "device:fused"
    wide = core.plan(GridProblem(1_000, 80), expected_calls=math.inf)
    assert wide.backend == "device:eager" and wide.excluded["device:fused"] == "unsupported: needs m <= 50"
    assert core.solve(GridProblem(1_000, 10), backend="device").backend == "device:fused"
    assert core.solve(GridProblem(1_000, 80), backend="device").backend == "device:eager"
    assert core.solve(GridProblem(1_000, 80), backend="device:eager").backend == "device:eager"
    with pytest.raises(core.UnknownBackendError, match="has no 'device:other' implementation"):
        core.solve(GridProblem(1_000, 80), backend="device:other")


def test_the_design_identifies_every_feature(clean):
    from core.costmodel.design import calibration_design, held_out_problems

    (spec,) = _install(_spec("synthetic.design", {"serial": _echo}))
    design = calibration_design(spec, quick=True)
    rows = np.array([[1.0, p.n, p.m] for p in design], dtype=float)
    assert np.linalg.matrix_rank(rows / rows.max(axis=0)) == 3
    assert len({(p.n, p.m) for p in design}) == len(design) >= 6
    costs = [p.n + 1e4 * p.m for p in design]  # cheapest first by the features relative to their top
    assert costs[0] <= costs[-1]
    held_out = held_out_problems(spec, quick=True, count=8)
    assert not {(p.n, p.m) for p in held_out} & {(p.n, p.m) for p in design}
    assert max(p.n for p in held_out) > 1e6  # some beyond the top of the space


def test_the_quick_design_measures_the_size_axis_past_its_top(clean):
    """evaluate (and users) go past a quick space's top: its axis ladder carries on there, the full design not."""
    from core.costmodel.design import BEYOND_TOP, calibration_design

    (spec,) = _install(_spec("synthetic.beyond", {"serial": _echo}))
    top = spec.space(True).ranges["n"][1]
    beyond = [p for p in calibration_design(spec, quick=True) if p.n > top]
    assert sorted(p.n for p in beyond) == [round(top * factor) for factor in BEYOND_TOP]
    assert len({p.m for p in beyond}) == 1  # the ladder's other fields, at their middle
    assert max(p.n for p in calibration_design(spec, quick=False)) <= spec.space(False).ranges["n"][1]


def _seven_features(p):
    n, m = float(p.n), float(p.m)
    return {"n": n, "m": m, "nm": n * m, "nm2": n * m * m, "n2": n * n, "sqrt_n": n ** 0.5, "log_m": math.log1p(m)}


@pytest.mark.parametrize("parallel", [False, True])
def test_the_design_has_three_problems_per_coefficient_of_the_largest_model(clean, parallel):
    from core.costmodel.design import MAX_POINTS, calibration_design, model_coefficients

    more = {"parallel_tasks": lambda p: 4.0, "span_feature": "nm"} if parallel else {}
    (spec,) = _install(_spec("synthetic.wide", {"serial": _echo}, features=_seven_features, **more))
    # seven features and the intercept, and a pool model's span on top: a 16-point cap gave such a
    # model under two problems per coefficient
    assert model_coefficients(spec) == 8 + parallel
    design = calibration_design(spec, quick=True)
    assert MAX_POINTS[True] >= len(design) >= 3 * (8 + parallel)


def test_a_threaded_implementation_gets_the_span_over_its_backends_threads():
    from core.costmodel.features import SPAN, model_features, threads
    from plugins.spectra.problem import SpectraProblem

    spec = core.solvers()["spectra.fit"]
    pool = threads("numba:threads")
    assert pool is not None and pool >= 1
    for n in sorted({1, 2, pool, pool + 1, 3 * pool + 1}):
        features = model_features(spec, SpectraProblem(n_spectra=n, n_pixels=1000, max_iter=2), "numba:threads")
        # each thread fits ceil(n / threads) of the batch's spectra, one after the other
        per_spectrum = features[spec.span_feature] / n
        assert features[SPAN] == pytest.approx(per_spectrum * math.ceil(n / pool))
        assert SPAN not in model_features(spec, SpectraProblem(n_spectra=n, n_pixels=1000), "numba:serial")


def test_a_compile_at_a_later_design_point_is_not_charged_to_the_budget(clean):
    from core.costmodel.calibrate import calibrate_solver

    compiled = set()

    def compiles_once_past_the_first_problem(problem):
        # a variant whose kernels for larger problems compile on their first call (a JIT's one-off)
        kind = problem.n > 10
        if kind not in compiled:
            compiled.add(kind)
            time.sleep(0.6 if kind and len(compiled) > 1 else 0.0)
        return {"n": np.array(problem.n)}

    (spec,) = _install(_spec("synthetic.late_jit", {"serial": compiles_once_past_the_first_problem}))
    report = calibrate_solver(spec, quick=True, budget=0.5)
    row = report.backends[0]
    # the 0.6 s compile alone would spend a 0.5 s budget at the second problem
    assert row.samples == report.problems and row.warm_up_excess >= 0.5, row


def test_a_slow_implementation_spends_only_its_share_of_the_budget(clean):
    """Charged alike, numpy's slow solves stopped mfg.common_noise's 5-15 ms contenders two thirds through the
    quick design on the H200 host. Fair shares: the cheap one finishes, the slow one gets the rest and stops."""
    from core.costmodel.calibrate import calibrate_solver

    (spec,) = _install(_spec("synthetic.shares", {"serial": _sleeper(0.001), "device": _sleeper(0.03)}))
    budget = 1.0
    report = calibrate_solver(spec, quick=True, budget=budget)
    rows = {row.backend: row for row in report.backends}
    cheap, slow = rows["serial"], rows["device"]
    # four runs a sample (warm-up and three timed): the cheap one needs ~0.004 s a problem, the slow one ~0.12
    assert cheap.samples == report.problems and cheap.stopped == "design done", cheap
    assert slow.samples < report.problems and slow.stopped.startswith("its share of the 1 s budget spent"), slow
    # the slow one got what the cheap one left: more than an even split, and the total stayed near the budget
    assert budget / 2 < slow.seconds_spent < budget - cheap.seconds_spent + 0.2, (cheap, slow)


def test_fair_shares_give_cheap_implementations_their_need_and_split_the_rest():
    from core.costmodel.calibrate import BackendCalibration, _Climb, fair_shares

    def climb(name, charged, visited, done=False):
        return _Climb(BackendCalibration(name), done=done, charged=charged, visited=visited)

    # 10 problems; needs at this pace: a 1.0, b 4.0, c 20.0, d unknown (not started); e stopped at 2.0
    climbs = [climb("a", 0.5, 5), climb("b", 2.0, 5), climb("c", 10.0, 5), climb("d", 0.0, 0), climb("e", 2.0, 4, True)]
    shares = fair_shares(20.0, climbs, 10)
    assert shares["e"] == 2.0  # stopped: keeps what it spent
    assert shares["a"] == pytest.approx(1.0)  # 18 left over 4: 4.5 each; a needs 1.0
    # 17 left over the 3 others: 5.67 each; b needs 4.0; c and d split the remaining 13
    assert shares["b"] == pytest.approx(4.0)
    assert shares["c"] == pytest.approx(6.5) and shares["d"] == pytest.approx(6.5)
    assert sum(shares.values()) == pytest.approx(20.0)


def test_a_loop_tiers_up_in_the_background(clean, monkeypatch):
    from core.costmodel import warmup

    monkeypatch.delenv("CROSSOVER_TIER_UP", raising=False)
    warmed = []

    def device_run(problem):
        warmed.append(problem)
        return {"n": np.array(problem.n)}

    # serial really takes its 0.1 s: the loop's warm runs of it must agree with its model
    (spec,) = _install(_spec("synthetic.tier", {"serial": _sleeper(0.1), "device": device_run}))
    _calibrate(spec, "serial", lambda p: 0.1, GRID)
    _calibrate(spec, "device", lambda p: 0.01, GRID, one_off=50.0)  # far too dear for any one call
    problem = GridProblem(1_000, 10)
    assert core.solve(problem).backend == "serial"
    assert not warmed  # one call says nothing about the next
    assert core.solve(problem).backend == "serial"  # the second call starts the warm-up beside it
    warmup.wait()
    assert len(warmed) == 1 and warmed[0] != problem  # warmed on the cheapest designed problem
    assert core.solve(problem).backend == "device"  # its one-off is paid: the loop moved


def test_an_implementation_that_compiles_per_shape_is_not_warmed_while_its_keyless_siblings_are(clean, monkeypatch):
    """A solver whose GPU variant declares per-shape keys (MFG's Triton kernels) still tiers up to its CPU
    variant, whose key is (): a warm-up at the design's cheapest problem pays that one's one-off. The variant
    with a key is never warmed on another shape."""
    from core.costmodel import warmup

    monkeypatch.delenv("CROSSOVER_TIER_UP", raising=False)
    warmed = []

    def device_run(problem):
        warmed.append(problem)
        return {"n": np.array(problem.n)}

    keys = {"device": lambda p: (), "shaped": lambda p: (p.n,)}
    specs = _install(*[_spec(f"synthetic.tier_{compiled}", {"serial": _sleeper(0.1), compiled: device_run},
                             compile_key=lambda p, key: keys.get(key, lambda _: ())(p))
                       for compiled in ("device", "shaped")])
    for spec, compiled in zip(specs, ("device", "shaped")):
        warmed.clear()
        _calibrate(spec, "serial", lambda p: 0.1, GRID)
        _calibrate(spec, compiled, lambda p: 0.01, GRID, one_off=50.0)
        for _ in range(2):
            assert core.solve(GridProblem(1_000, 10), solver=spec.name).backend == "serial"
        warmup.wait()
        assert len(warmed) == (1 if compiled == "device" else 0), compiled


def test_tiering_up_can_be_turned_off(clean, monkeypatch):
    from core.costmodel import warmup

    monkeypatch.setenv("CROSSOVER_TIER_UP", "0")
    (spec,) = _install(_spec("synthetic.still", {"serial": _echo, "device": _echo}))
    _calibrate(spec, "serial", lambda p: 0.1, GRID)
    _calibrate(spec, "device", lambda p: 0.01, GRID, one_off=50.0)
    for _ in range(3):
        assert core.solve(GridProblem(1_000, 10)).backend == "serial"
    warmup.wait()
    assert not history.is_paid(spec, "device", GridProblem(1_000, 10))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: core.plan(GridProblem(10), margin=float("nan")), "margin=nan is invalid: must be a finite number >= 0"),
    (lambda: core.plan(GridProblem(10), margin=-0.1), "margin=-0.1 is invalid: must be a finite number >= 0"),
    (lambda: core.evaluate("synthetic.bad", count=-1), "count=-1 is invalid: must be an integer >= 1"),
    (lambda: core.evaluate("synthetic.bad", repeats=0), "repeats=0 is invalid: must be an integer >= 1"),
    (lambda: core.evaluate("synthetic.bad", seed="x"),
     "seed='x' is invalid: must be an integer >= 0 and <= 18446744073709551615"),
])
def test_planning_and_evaluation_arguments_are_checked(clean, call, message):
    _install(_spec("synthetic.bad", {"serial": _echo}))
    with pytest.raises(core.ProblemError) as caught:
        call()
    assert str(caught.value) == message



def test_a_shape_a_disk_cache_kept_owes_a_later_process_only_what_such_loads_cost(clean):
    """Triton keeps its kernels on disk: a later process on the H200 host ran a common-noise problem's first
    call on torch:hjb_fused in 7.8 ms at a key calibration had compiled (7.5 warm), where the planner charged
    a compile (0.8-2.2 s) and ran the process pool, 20 % slower. A shape that calibration compiled owes a later
    process only what such loads were seen to cost (nothing before any is seen), a shape never compiled here a
    compile; a solver that declares no disk cache owes a compile at every shape new to the process."""
    from core.costmodel.calibrate import calibrate_solver

    disk: set = set()  # the disk cache: what any process compiled on this machine

    def compiles_into(disk, seen):
        def run(problem):
            if problem.n not in seen:  # a first run here: compiled, or loaded from the disk cache
                time.sleep(0.0 if problem.n in disk else 0.05)
                seen.add(problem.n)
                disk.add(problem.n)
            return {"n": np.array(problem.n)}
        return run

    def solver(name, cached, disk):
        return _spec(name, {"device:compiled": compiles_into(disk, set()), "serial": _echo},
                     compile_key=lambda p, key: (p.n,) if key == "device:compiled" else (),
                     compile_cached=frozenset({"device:compiled"} if cached else ()))

    spec, plain = _install(solver("synthetic.disk_cache", True, disk), solver("synthetic.no_disk_cache", False, set()))
    calibrate_solver(spec, quick=True, budget=2.0)
    compiled = [int(text.strip("(,)")) for text in history.entry(spec, "device:compiled")["compiled_keys"]]
    assert len(compiled) >= 3 and set(compiled) <= disk
    facts = history.current().process
    facts.paid.clear()  # a new process: nothing has run, the disk cache stays
    facts.ran.clear()
    core.solve(GridProblem(compiled[0], 10), backend="device:compiled", solver=spec.name)
    cached, new = GridProblem(compiled[1], 10), GridProblem(4_321, 10)
    shape_one_off = history.entry(spec, "device:compiled")["shape_one_off_seconds"]
    assert shape_one_off > 0.01
    assert history.implementation_one_off(spec, "device:compiled", cached) == 0.0
    assert history.one_off_at_stake(spec, "device:compiled", cached) == 0.0
    assert history.implementation_one_off(spec, "device:compiled", new) == shape_one_off
    # a run at a cached shape is an observation of a load, not of a shape's compile
    observed = list(history.entry(spec, "device:compiled").get("shape_one_off_observations", []))
    core.solve(cached, backend="device:compiled", solver=spec.name)
    slot = history.entry(spec, "device:compiled")
    assert len(slot["cached_one_off_observations"]) == 1 and slot["shape_one_off_observations"] == observed
    assert history.implementation_one_off(spec, "device:compiled", GridProblem(compiled[2], 10)) == \
        pytest.approx(slot["cached_one_off_seconds"])
    core.solve(new, backend="device:compiled", solver=spec.name)  # compiled here now: the store keeps it
    assert repr((4_321,)) in history.entry(spec, "device:compiled")["compiled_keys"]
    # no disk cache declared: every shape new to the process owes a shape's compile
    calibrate_solver(plain, quick=True, budget=2.0)
    assert "compiled_keys" not in history.entry(plain, "device:compiled")
    facts.paid.clear()
    facts.ran.clear()
    core.solve(GridProblem(compiled[0], 10), backend="device:compiled", solver=plain.name)
    owed = history.entry(plain, "device:compiled")["shape_one_off_seconds"]
    assert owed > 0.01
    assert history.implementation_one_off(plain, "device:compiled", GridProblem(compiled[1], 10)) == owed


def test_a_calibration_after_another_learns_no_compile_from_the_shapes_that_one_compiled(clean):
    """A second calibration on the machine loads what the first compiled (Triton's disk cache): its warm-ups'
    excesses at those shapes are loads, kept apart, and the shape's compile the first measured stands."""
    from core.costmodel.calibrate import calibrate_solver

    disk: set = set()

    def run(problem):
        if problem.n not in seen:
            time.sleep(0.0 if problem.n in disk else 0.05)
            seen.add(problem.n)
            disk.add(problem.n)
        return {"n": np.array(problem.n)}

    seen: set = set()
    (spec,) = _install(_spec("synthetic.recalibrated", {"device:compiled": run, "serial": _echo},
                             compile_key=lambda p, key: (p.n,) if key == "device:compiled" else (),
                             compile_cached=frozenset({"device:compiled"})))
    calibrate_solver(spec, quick=True, budget=2.0)
    first = dict(history.entry(spec, "device:compiled"))
    assert first["shape_one_off_seconds"] > 0.01 and "cached_one_off_observations" not in first
    facts = history.current().process
    facts.paid.clear()  # a new process: nothing has run here, the disk cache stays
    facts.ran.clear()
    seen.clear()
    calibrate_solver(spec, quick=True, budget=2.0)
    again = history.entry(spec, "device:compiled")
    assert again["shape_one_off_observations"] == first["shape_one_off_observations"]
    assert again["cached_one_off_observations"] and again["cached_one_off_seconds"] < 0.01
