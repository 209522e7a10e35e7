"""``crossover report`` draws like with like: curves and dots are the same problems.

A synthetic solver of exactly known cost whose calibration design moves a
second field (``k``) besides the size axis, and whose default problem lies
outside that design (k=16, the design's middle is k~3): a report that drew
its curves through the default problem would sit several times above
every measured dot, which is the fault these tests pin down.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import core
from core.cli import main
from core.costmodel import history
from core.costmodel.design import AXIS_POINTS, BEYOND_TOP, calibration_design, with_size
from core.costmodel.features import model_features
from core.costmodel.history import sample_record
from core.costmodel.plan import curves
from core.costmodel.report import drawing, write_report
from core.solver import SizeSpace
from core.validation import check_int

# seconds = intercept + per_item * n * k; one-off (JIT) seconds; backend start seconds
COSTS = {"fam_serial": (1e-5, 1e-7, 0.0, 0.0), "fam_pool": (1e-2, 1e-8, 0.5, 1.25)}


@dataclasses.dataclass(frozen=True)
class FamilyProblem:
    n: int = 1000
    k: int = 16

    def __post_init__(self):
        object.__setattr__(self, "n", check_int("n", self.n, minimum=1))
        object.__setattr__(self, "k", check_int("k", self.k, minimum=1))


def cost(name: str, problem: FamilyProblem) -> float:
    intercept, per_item, _, _ = COSTS[name]
    return intercept + per_item * problem.n * problem.k


class FamilyPlugin:
    @core.hookimpl
    def crossover_backends(self):
        return [core.Backend(name=name, summary="synthetic", probe=lambda: core.Availability(True),
                             simplicity=10 * i) for i, name in enumerate(COSTS)]

    @core.hookimpl
    def crossover_solvers(self):
        return [core.SolverSpec(
            name="family.work", problem_type=FamilyProblem,
            implementations={name: lambda p: {"n": np.array(p.n)} for name in COSTS},
            features=lambda p: {"items": float(p.n * p.k)}, size_axis="n",
            space=lambda quick: SizeSpace(ranges={"n": (10, 100_000), "k": (1, 8)}),
            memory=lambda p, backend: 8.0 * p.n, default_problem=FamilyProblem)]


@pytest.fixture
def family(fresh_registry, empty_cache, monkeypatch):
    """The synthetic solver, calibrated on its quick design with exactly known times."""
    monkeypatch.setenv("CROSSOVER_DISABLE_PLUGIN_AUTOLOAD", "1")
    core.register(FamilyPlugin(), name="family")
    spec = core.solvers()["family.work"]
    for name, (_, _, one_off, start) in COSTS.items():
        records = [sample_record(spec, name, p, cost(name, p), "calibration") for p in calibration_design(spec, True)]
        history.record_calibration(spec, name, records, one_off, {})
        if start:
            history.record_start(name, start)
    return spec


def test_every_dot_on_the_left_is_a_problem_of_the_curves_family_and_lies_on_its_curve(family):
    data = drawing(family)
    assert data.family.k != family.default_problem().k  # the design's ladder, not the default problem
    for name in COSTS:
        on = [p for p in data.points if p["implementation"] == name and p["on_family"]]
        assert len(on) == AXIS_POINTS[True] + len(BEYOND_TOP)  # the design's axis ladder, carried past the top
        for point in on:
            i = int(np.flatnonzero(data.grid == point["size"])[0])  # each dot's size is a grid point
            problem = with_size(family, data.family, point["size"])
            # the same problem: the curve's problem at that size has the dot's features
            assert model_features(family, problem, name) == pytest.approx(point["features"], rel=1e-12)
            # the model's prediction at the dot's problem is the drawn curve there, and matches the measurement
            assert data.curves[name][i] == pytest.approx(point["predicted"], rel=1e-9)
            assert data.curves[name][i] == pytest.approx(point["seconds"], rel=1e-6)


def test_curves_through_the_default_problem_would_miss_the_dots(family):
    """The check above can fail: the old drawing (default problem, k=16) sits far above every dot."""
    data = drawing(family)
    models = {name: history.model(family, name) for name in COSTS}
    for name in COSTS:
        on = [p for p in data.points if p["implementation"] == name and p["on_family"]]
        sizes = np.array([p["size"] for p in on])
        _, old = curves(family, family.default_problem(), models, sizes)
        ratios = old[name] / np.array([p["seconds"] for p in on])
        assert ratios.max() > 1.5, ratios  # where the per-item work shows (fam_pool's intercept hides it below)
        if name == "fam_serial":
            assert np.all(ratios > 1.5), ratios


def test_the_right_panel_holds_every_measured_problem_against_its_own_prediction(family):
    data = drawing(family)
    design = calibration_design(family, True)
    for name in COSTS:
        mine = [p for p in data.points if p["implementation"] == name]
        assert len(mine) == len(design) and any(not p["on_family"] for p in mine)
        for point in mine:
            assert point["predicted"] == pytest.approx(point["seconds"], rel=1e-6)  # exact costs, exact model
        off = [p for p in mine if not p["on_family"]]
        for point in off:  # off the family: the curve's problem at that size is another problem
            problem = with_size(family, data.family, point["size"])
            assert model_features(family, problem, name)["items"] != pytest.approx(point["features"]["items"])


def test_break_even_is_where_the_drawn_curves_cross(family):
    data = drawing(family)
    crossing_items = (1e-2 - 1e-5) / (1e-7 - 1e-8)  # where the two exact lines meet
    [threshold] = data.thresholds
    assert (threshold["below"], threshold["above"]) == ("fam_serial", "fam_pool")
    assert threshold["size"] == pytest.approx(crossing_items / data.family.k, rel=1e-3)


def test_one_off_costs_are_shown_as_stored(family):
    data = drawing(family)
    assert data.one_offs == {"fam_serial": {"implementation": 0.0, "backend_start": 0.0},
                             "fam_pool": {"implementation": 0.5, "backend_start": 1.25}}


def test_report_files_say_which_family_the_curves_follow(family, tmp_path):
    png, md = write_report(["family.work"], tmp_path / "out")
    assert png.read_bytes()[:4] == b"\x89PNG" and not list((tmp_path / "out").glob(".*"))  # no temporaries left
    text = md.read_text()
    k = drawing(family).family.k
    assert f"axis ladder (n varies, k={k}, other fields as in the default problem)" in text
    assert "| fam_pool |" in text and "| 0.5 | 1.25 |" in text
    assert "| fam_serial | fam_pool |" in text  # the break-even row


def test_report_command_writes_into_a_new_directory(family, tmp_path, capsys):
    target = tmp_path / "new" / "dir"
    assert main(["report", "family.work", "-o", str(target)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote {target / 'family.work.png'}",
                                                    f"wrote {target / 'family.work.md'}"]
    assert sorted(p.name for p in target.iterdir()) == ["family.work.md", "family.work.png"]
