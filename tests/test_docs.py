"""The docs build without warnings, and the code they show runs and is right."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import core

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def plugin_block(page: str, filename: str) -> str:
    """The ```python block of ``docs/<page>`` whose first line is ``# plugin: <filename>``."""
    text = (DOCS / page).read_text(encoding="utf-8")
    pattern = rf"^```python\n(# plugin: {re.escape(filename)}\n.*?)^```$"
    blocks = re.findall(pattern, text, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"expected one '# plugin: {filename}' block in docs/{page}, found {len(blocks)}"
    return blocks[0]


def import_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: str, filename: str):
    """Write a docs code block to ``tmp_path/filename`` and import it as a module."""
    (tmp_path / filename).write_text(plugin_block(page, filename), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    module_name = Path(filename).stem
    sys.modules.pop(module_name, None)
    return importlib.import_module(module_name)


def test_docs_build_without_warnings(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "plugins.html").is_file()


@pytest.mark.parametrize("backend", ["numpy", "numba", "numba:serial", "numba:threads"])
def test_plugin_guide_example_runs_and_matches_closed_form(tmp_path, monkeypatch, fresh_registry, backend):
    plugin = import_block(tmp_path, monkeypatch, "plugins.md", "saxpy_plugin.py")
    try:
        info = core.register(plugin, name="docs_saxpy")
        try:
            assert info.solvers == ["saxpy.affine"]
            spec = core.solvers()["saxpy.affine"]
            assert set(spec.backends) == {"numpy", "numba:threads", "numba:serial"}

            with pytest.raises(core.ProblemError, match=r"n=0 is invalid: must be an integer >= 1"):
                plugin.SaxpyProblem(n=0)

            n, a, b = 100_003, 0.75, -2.5
            problem = plugin.SaxpyProblem(n=n, a=a, b=b)
            result = core.solve(problem, backend=backend, solver="saxpy.affine")
            assert result.backend == backend or result.backend.startswith(backend + ":")

            # independent truth: z[i] = a*i + b exactly at sampled points, and the closed-form sum
            z = result["z"]
            assert z.shape == (n,)
            for i in (0, 1, 12_345, n - 1):
                assert z[i] == a * i + b
            closed_form = a * n * (n - 1) / 2 + b * n
            assert float(result["total"]) == pytest.approx(closed_form, rel=1e-12)
            assert np.isclose(problem.exact_total, closed_form, rtol=0, atol=0)
            assert "exact" in spec.summarize(problem, result.outputs)
            assert spec.space(True).ranges["n"] == (1e3, 1e7)
        finally:
            core.unregister("docs_saxpy")
        assert "saxpy.affine" not in core.solvers()
    finally:
        sys.modules.pop("saxpy_plugin", None)


def test_plugin_guide_backend_example_registers(tmp_path, monkeypatch, fresh_registry):
    plugin = import_block(tmp_path, monkeypatch, "plugins.md", "cupy_backend.py")
    try:
        core.register(plugin, name="docs_cupy_backend")
        try:
            status = core.backends()["cupy"]
            # cupy is not a dependency: either it runs here, or it says why not
            assert status.available or status.reason
        finally:
            core.unregister("docs_cupy_backend")
        assert "cupy" not in core.backends()
    finally:
        sys.modules.pop("cupy_backend", None)



def _subcommands() -> list[str]:
    """Every subcommand name of the ``crossover`` parser (the choices of its subparsers action)."""
    from core.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1, "expected exactly one set of subcommands"
    return list(actions[0].choices)


def test_cli_page_has_a_section_for_every_subcommand():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    prose = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.MULTILINE | re.DOTALL)  # a "# ..." in code is no heading
    headings = re.findall(r"^#{1,6} (.+)$", prose, flags=re.MULTILINE)
    commands = _subcommands()
    assert {"calibrate", "plan", "report", "evaluate"} <= set(commands)  # the parser is what we think it is
    missing = [name for name in commands
               if not any(re.search(rf"\bcrossover {re.escape(name)}\b", heading) for heading in headings)]
    assert not missing, f"docs/cli.md has no section (heading containing `crossover NAME`) for: {missing}"


def test_cost_model_page_quotes_the_selection_rule_as_the_code_states_it():
    from core.costmodel import calibrate, fit, plan

    rule = [line.strip() for line in plan.__doc__.splitlines() if line.startswith("    ") and line.strip()]
    assert len(rule) == 5 and rule[0].startswith("cost(i)") and rule[-1].startswith("chosen")
    page = (DOCS / "costmodel.md").read_text(encoding="utf-8")
    assert "```text\n" + "\n".join(rule) + "\n```" in page

    # the numbers in the rule are the constants the code uses
    def percent(value: float) -> str:
        return f"{value * 100:g} %"

    assert f"at least {percent(plan.MIN_ERROR)}; {percent(plan.EXTRAPOLATED_ERROR)} when extrapolated" in rule[1]
    assert f"{percent(plan.MIN_MARGIN)}, {percent(plan.MAX_MARGIN)})" in rule[3]

    # and so are the ones the page's table of constants states
    stated = {
        "plan.MIN_ERROR": plan.MIN_ERROR, "plan.EXTRAPOLATED_ERROR": plan.EXTRAPOLATED_ERROR,
        "plan.MIN_MARGIN": plan.MIN_MARGIN, "plan.MAX_MARGIN": plan.MAX_MARGIN, "plan.OVERLAP": plan.OVERLAP,
        "plan.MEASURE_AT_MOST": plan.MEASURE_AT_MOST,
        "fit.EXTRAPOLATION_FACTOR": fit.EXTRAPOLATION_FACTOR, "fit.OUTLIER_RATIO": fit.OUTLIER_RATIO,
        'calibrate.QUICK["budget"]': calibrate.QUICK["budget"],
        'calibrate.QUICK["sample_cap"]': calibrate.QUICK["sample_cap"],
        'calibrate.FULL["budget"]': calibrate.FULL["budget"],
        'calibrate.FULL["sample_cap"]': calibrate.FULL["sample_cap"],
    }
    for name, value in stated.items():
        assert f"| `{name}` | {value:g} |" in page, f"docs/costmodel.md does not state {name} = {value:g}"
    # the prose quotes them too
    assert f"`OVERLAP` = {plan.OVERLAP:g} combined relative" in page
    assert f"**{fit.EXTRAPOLATION_FACTOR:g}x** of the range" in page
    assert f"more than **{fit.OUTLIER_RATIO:g}x** off the fit" in page
    assert (f"| budget per solver | {calibrate.QUICK['budget']:g} s | {calibrate.FULL['budget']:g} s |" in page
            and f"| cap per sample | {calibrate.QUICK['sample_cap']:g} s | {calibrate.FULL['sample_cap']:g} s |"
            in page)
    assert f"at most {calibrate.QUICK['budget']:g} s; `crossover calibrate`" in page


def test_no_page_says_auto_is_unavailable():
    stale = re.compile(r"needs the cost model|until the cost model lands|not built yet|arrives in a later issue")
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        assert not stale.search(text), f"docs/{page.name} still says auto-selection is not available"


def test_cost_model_page_is_in_the_toctree():
    assert re.search(r"^costmodel$", (DOCS / "index.md").read_text(encoding="utf-8"), flags=re.MULTILINE)
