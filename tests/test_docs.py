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
    from core.costmodel import calibrate, design, fit, plan

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
        "plan.AT_STAKE_MARGIN": plan.AT_STAKE_MARGIN,
        "plan.MEASURE_AT_MOST": plan.MEASURE_AT_MOST,
        "fit.EXTRAPOLATION_FACTOR": fit.EXTRAPOLATION_FACTOR, "fit.OUTLIER_RATIO": fit.OUTLIER_RATIO,
        'calibrate.QUICK["budget"]': calibrate.QUICK["budget"],
        'calibrate.QUICK["sample_cap"]': calibrate.QUICK["sample_cap"],
        'calibrate.FULL["budget"]': calibrate.FULL["budget"],
        'calibrate.FULL["sample_cap"]': calibrate.FULL["sample_cap"],
    }
    for name, value in stated.items():
        assert f"| `{name}` | {value:g} |" in page, f"docs/costmodel.md does not state {name} = {value:g}"
    assert f"| `design.BEYOND_TOP` | {', '.join(f'{factor:g}' for factor in design.BEYOND_TOP)} |" in page
    # the prose quotes them too
    assert f"`OVERLAP` = {plan.OVERLAP:g} combined relative" in page
    assert f"**{fit.EXTRAPOLATION_FACTOR:g}x** of the range" in page
    assert f"more than **{fit.OUTLIER_RATIO:g}x** off the fit" in page
    assert (f"| budget per solver | {calibrate.QUICK['budget']:g} s | {calibrate.FULL['budget']:g} s |" in page
            and f"| cap per sample | {calibrate.QUICK['sample_cap']:g} s | {calibrate.FULL['sample_cap']:g} s |"
            in page)
    assert f"({calibrate.QUICK['budget']:g} s of timed runs, plus backend starts and compiles; `crossover calibrate`" \
        in page


def test_no_page_says_auto_is_unavailable():
    stale = re.compile(r"needs the cost model|until the cost model lands|not built yet|arrives in a later issue")
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        assert not stale.search(text), f"docs/{page.name} still says auto-selection is not available"


def test_cost_model_page_is_in_the_toctree():
    assert re.search(r"^costmodel$", (DOCS / "index.md").read_text(encoding="utf-8"), flags=re.MULTILINE)


# --- The front door stays true: names on the pages against the installed registry and CLI ---------------------------
#
# Every page is checked, README.md included. What counts as real is what is installed: the registry's solvers,
# backends, implementation keys and plugins, and core.cli's parser (its sub-commands and their options). Names that
# the docs' own example plugins declare (the ``# plugin: FILE`` blocks of plugins.md: ``saxpy.affine``, ``cupy``,
# ``hello``) count as real too, since the pages show them being registered.

PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "results").glob("*.md"))]
FILE_SUFFIXES = (".md", ".py", ".txt", ".png", ".json", ".jsonl", ".fits", ".npz", ".toml", ".html", ".log")


def _registry_names() -> dict[str, set[str]]:
    """Solvers, backends, implementation keys, plugins and CLI commands as installed, plus the docs' example names."""
    from core.registry import get_registry

    registry = get_registry()
    solvers = set(registry.solvers)
    backends = set(registry.backends)
    keys = {key for spec in registry.solvers.values() for key in spec.backends}
    names = {"solvers": solvers, "backends": backends, "keys": keys | backends,
             "plugins": set(registry.plugins), "commands": set(_subcommands())}
    # the docs' own example plugins: what their blocks declare is real on the page that registers them
    guide = (DOCS / "plugins.md").read_text(encoding="utf-8")
    example = "\n".join(re.findall(r"^```(?:python|toml)\n(.*?)^```$", guide, flags=re.MULTILINE | re.DOTALL))
    declared = set(re.findall(r"\bname=\"([\w.:-]+)\"", example))
    names["solvers"] |= {n for n in declared if "." in n}
    names["backends"] |= {n for n in declared if "." not in n}
    names["keys"] |= {n for n in declared if "." not in n}
    names["commands"] |= set(re.findall(r"add_parser\(\"([\w-]+)\"", example))
    names["plugins"] |= set(re.findall(r"^(\w+) = \"\w+\"$", example, flags=re.MULTILINE))
    return names


def _options(command: str | None) -> set[str]:
    """The option strings the top-level parser accepts, plus those of ``command`` where it is a built-in one."""
    from core.cli import build_parser

    parser = build_parser()
    found = {s for a in parser._actions for s in a.option_strings}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if command in sub.choices:
        found |= {s for a in sub.choices[command]._actions for s in a.option_strings}
    return found


def _command_words(text: str) -> list[str]:
    """The words of one command line up to its first shell operator (a ``|`` inside [...] is argparse's, kept)."""
    words, depth = [], 0
    for word in text.split():
        if depth == 0 and (word in {"|", "||", "&&", ";"} or re.match(r"\d?>|<", word)):
            break
        depth += word.count("[") - word.count("]")
        words.append(word.strip("[]"))
    return [word for word in words if word]


def _is_placeholder(word: str) -> bool:
    return word.isupper() or word in {"auto", "...", "NAME"} or word.startswith(("<", "$"))


def check_command(line: str, names: dict[str, set[str]], expect_error: bool = False) -> list[str]:
    """Problems with one ``crossover ...`` command line: an unknown sub-command, option, solver or backend."""
    words = _command_words(line)
    if not words or words[0] != "crossover":
        return []
    problems = []
    rest = words[1:]
    while rest and rest[0].startswith("-"):  # global options before the command
        option = rest.pop(0).split("=")[0]
        if option not in _options(None):
            problems.append(f"unknown option {option!r} in `{line}`")
        elif option == "--scheduler" and rest:
            rest.pop(0)
    if not rest:
        return problems
    command = rest[0]
    if _is_placeholder(command) or not re.fullmatch(r"[a-z][\w-]*", command):
        return problems  # a placeholder, or not a command line at all (a log line "crossover demo: ...")
    if command not in names["commands"]:
        return [*problems, f"unknown command `crossover {command}` in `{line}`"]
    allowed = _options(command)
    for i, word in enumerate(rest[1:], start=1):
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", word):
            option = word.split("=")[0]
            if option not in allowed and command in _subcommands():
                problems.append(f"`crossover {command}` has no option {option!r} (in `{line}`)")
            if option == "--backend" and i + 1 < len(rest) and not expect_error:
                value = rest[i + 1]
                if not _is_placeholder(value) and value not in names["keys"]:
                    problems.append(f"unknown backend {value!r} in `{line}`")
    if command in {"run", "plan", "evaluate", "calibrate", "report"} and not expect_error:
        for word in rest[1:]:
            if word.startswith("-"):
                break
            if not _is_placeholder(word) and "." in word and word not in names["solvers"]:
                problems.append(f"unknown solver {word!r} in `{line}`")
    return problems


def _listed(text: str) -> list[str]:
    return [item.strip().strip(".") for item in text.split(",") if item.strip()]


def check_output(command: str, output: str, names: dict[str, set[str]]) -> list[str]:
    """Problems with a sample output: names it shows that differ from the registry's (all of them, where all)."""
    problems = []
    words = _command_words(command)
    sub = words[1] if len(words) > 1 else ""
    table = [line for line in output.splitlines() if line.startswith("│")]
    rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in table]
    as_json = "--json" in words
    if sub == "backends":
        shown = ({item["name"] for item in _json(output)} if as_json else {row[0] for row in rows if row[0]})
        real = names["backends"] - _example_only(names, "backends")
        if shown != real:
            problems.append(f"`{command}` shows backends {sorted(shown)}; installed: {sorted(real)}")
    if sub == "plugins":
        problems += _check_plugins(command, output, rows, as_json, names)
    if sub == "demo":
        for row in rows:
            cell = row[0]
            if "…" in cell:
                problems.append(f"`{command}` shows a truncated name {cell!r}")
            elif re.fullmatch(r"[a-z_]+(:[a-z_]+)?", cell) and cell not in names["keys"]:
                problems.append(f"`{command}` shows an unknown implementation {cell!r}")
            elif re.fullmatch(r"[a-z_]+\.[a-z_]+", cell) and cell not in names["solvers"]:
                problems.append(f"`{command}` shows an unknown solver {cell!r}")
    for kind in ("backends", "solvers"):
        for listed in re.findall(rf"registered {kind}: ([^\n;]+)", output):
            real = names[kind] - _example_only(names, kind)
            if set(_listed(listed)) != real:
                problems.append(f"`{command}` lists registered {kind} {_listed(listed)}; installed: {sorted(real)}")
    for listed in re.findall(r"it runs on: ([^\n;]+)", output):
        unknown = [key for key in _listed(listed) if key not in names["keys"]]
        if unknown:
            problems.append(f"`{command}` lists unknown implementations {unknown}")
    for key in re.findall(r"^[\w.]+ on ([\w:]+): [\d.]+ s$", output, flags=re.MULTILINE):
        if key not in names["keys"]:
            problems.append(f"`{command}` says it ran on {key!r}, which is no implementation")
    return problems


def _json(output: str):
    import json

    return json.loads(output)


def _example_only(names: dict[str, set[str]], kind: str) -> set[str]:
    """Names that only the docs' example plugins declare (absent from a listing made without them)."""
    from core.registry import get_registry

    registry = get_registry()
    real = {"backends": set(registry.backends), "solvers": set(registry.solvers), "plugins": set(registry.plugins)}
    return names[kind] - real[kind]


def _check_plugins(command: str, output: str, rows: list[list[str]], as_json: bool,
                   names: dict[str, set[str]]) -> list[str]:
    from core.registry import get_registry

    if as_json:
        shown = {item["name"]: (set(item["solvers"]), set(item["backends"])) for item in _json(output)}
    else:  # a wrapped cell continues on rows whose first cell is empty
        shown, current = {}, None
        for row in rows:
            if len(row) < 5:
                continue
            current = row[0] or current
            solvers, backends = shown.setdefault(current, (set(), set()))
            text = {3: row[3], 4: row[4]}
            solvers.update(_listed(text[3]))
            backends.update(_listed(text[4]))
    problems = []
    for name, info in get_registry().plugins.items():
        if name not in shown:
            problems.append(f"`{command}` does not show the installed plugin {name!r}")
        elif shown[name] != (set(info.solvers), set(info.backends)):
            problems.append(f"`{command}` shows plugin {name!r} with {sorted(shown[name][0])} and "
                            f"{sorted(shown[name][1])}; installed: {sorted(info.solvers)} and {sorted(info.backends)}")
    for name, (solvers, _) in shown.items():
        if name not in names["plugins"] or not solvers <= names["solvers"]:
            problems.append(f"`{command}` shows a plugin {name!r} that is not installed")
    return problems


def check_inline(span: str, names: dict[str, set[str]]) -> list[str]:
    """Problems with one `code span` of prose: a solver or ``backend:variant`` name that does not exist."""
    if span.startswith("crossover "):
        return check_command(span, names)
    if span.endswith(FILE_SUFFIXES) or "/" in span:
        return []
    namespaces = {name.split(".")[0] for name in names["solvers"]}
    if re.fullmatch(r"[a-z_]+\.[a-z_]+", span) and span.split(".")[0] in namespaces and span not in names["solvers"]:
        return [f"unknown solver `{span}`"]
    if re.fullmatch(r"[a-z_]+:[a-z_]+", span) and span.split(":")[0] in names["backends"] and span not in names["keys"]:
        return [f"unknown implementation `{span}`"]
    return []


def check_page(text: str, names: dict[str, set[str]]) -> list[str]:
    """Every problem of one Markdown page: its command lines, sample outputs and inline names."""
    problems = []
    for _fence, body in re.findall(r"^(```|~~~)[^\n]*\n(.*?)^\1\s*$", text, flags=re.MULTILINE | re.DOTALL):
        lines = body.splitlines()
        transcript = any(line.startswith("$ ") for line in lines)  # then only "$ crossover" lines are commands
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            prompt = line.startswith("$ ")
            command = line[2:] if prompt else line
            if transcript and not prompt:
                i += 1
                continue
            if not command.startswith("crossover ") and not re.match(r"\S*/?crossover ", command):
                i += 1
                continue
            command = re.sub(r"^\S*/crossover ", "crossover ", command)
            j = i + 1
            while j < len(lines) and prompt and not lines[j].startswith("$ "):
                j += 1
            output = "\n".join(lines[i + 1:j])
            expect_error = "crossover: error:" in output
            problems += check_command(command, names, expect_error)
            if prompt:
                problems += check_output(command, output, names)
            i = j if prompt else i + 1
    prose = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.MULTILINE | re.DOTALL)
    for span in re.findall(r"`([^`\n]+)`", prose):
        problems += check_inline(span.strip(), names)
    real_solvers = len(names["solvers"] - _example_only(names, "solvers"))
    for count in re.findall(r"crossover demo: (\d+) solvers", text):
        if int(count) != real_solvers:
            problems.append(f"the demo's sample says {count} solvers; installed: {real_solvers}")
    for command in re.findall(r"\bbackend=\"([\w:]+)\"", text):
        if command not in names["keys"] and command != "auto":
            problems.append(f"unknown backend=\"{command}\"")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_names_only_what_exists(page):
    problems = check_page(page.read_text(encoding="utf-8"), _registry_names())
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


PLANTED = {
    "a command that does not exist": "Run `crossover calibrat example.random_walk` first.",
    "an option that does not exist": "```bash\ncrossover run example.random_walk --bakend numpy\n```\n",
    "an option of another command": "```text\n$ crossover demo --full\n```\n",
    "a solver that does not exist": "```bash\ncrossover plan mfg.fp_particles\n```\n",
    "an inline solver that does not exist": "The solver `ml.linreg_moment` is exact.",
    "a variant that does not exist": "Then `numba:fusedd` runs.",
    "a backend that does not exist": "```python\ncore.solve(problem, backend=\"cuda\")\n```\n",
    "a backend in a command": "`crossover run example.random_walk --backend gpu`",
    "a backends table short of one": (
        "```text\n$ crossover backends\n│ numpy │ yes │ x │\n│ numba │ yes │ x │\n│ process │ yes │ x │\n"
        "│ torch │ no │ x │\n```\n"),
    "a plugins table with too few solvers": (
        "```text\n$ crossover plugins\n│ core │ 0.1.0 │ builtin │ │ numpy, numba, process, torch │ loaded │\n"
        "│ example │ 0.1.0 │ entry point │ example.random_walk │ │ loaded │\n```\n"),
    "an error listing stale backends": (
        "```text\n$ crossover run example.random_walk --backend gpu\n"
        "crossover: error: unknown backend 'gpu'; registered backends: numpy, numba, process, torch\n```\n"),
    "a demo that counts the wrong solvers": (
        "```text\n$ crossover demo\ncrossover demo: 5 solvers, each implementation run twice\n```\n"),
    "a demo table with a truncated name": "```text\n$ crossover demo\n│ numba:… │ 0.1 │ 0.1 │ x │\n```\n",
    "a run that names a key that does not exist": (
        "```text\n$ crossover run saxpy.affine --backend numba\nsaxpy.affine on numba:thread: 0.3 s\n```\n"),
}


@pytest.mark.parametrize("planted", list(PLANTED), ids=list(PLANTED))
def test_checker_catches_a_planted_wrong_name(planted):
    assert check_page(PLANTED[planted], _registry_names()), f"the docs checker missed {planted}"


def test_checker_passes_true_samples():
    from core.registry import get_registry

    names = _registry_names()
    registry = get_registry()
    rows = "\n".join(f"│ {name} │ yes │ x │" for name in registry.backends)
    solvers = ", ".join(sorted(registry.solvers))
    page = (f"```text\n$ crossover backends\n{rows}\n```\n"
            f"```text\n$ crossover run example.random_wlak\ncrossover: error: unknown solver 'example.random_wlak'; "
            f"registered solvers: {solvers}\n```\n"
            "`crossover --scheduler local run mfg.common_noise --backend dask` and `numba:fused`, "
            "`crossover calibrate [SOLVER ...] [--quick | --full] [--budget SECONDS] [--json]`, "
            "`crossover plan SOLVER --json | head -1`, `mfg.fp_particle`\n")
    assert check_page(page, names) == []


def test_every_result_folder_and_script_is_cited():
    texts = _texts_except(ROOT)
    cited = "\n".join(text for _, text in texts)
    folders = [p.name for p in (DOCS / "results").iterdir() if p.is_dir()]
    assert folders, "docs/results/ holds no result folders"
    unused = [name for name in folders if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", cited)]
    assert not unused, f"docs/results/ folders that no page cites: {unused}"
    scripts = [p.name for p in (DOCS / "scripts").glob("*.py")]
    # a script counts as cited when something other than itself names it
    unused = [name for name in scripts
              if not any(name in text for path, text in texts if path.name != name)]
    assert not unused, f"docs/scripts/ files that nothing cites: {unused}"


def _texts_except(skip: Path) -> list[tuple[Path, str]]:
    paths = [*PAGES]
    for folder in ("core", "plugins", "tests", "asv_benchmarks", "docs/scripts"):
        paths += sorted((ROOT / folder).rglob("*.py"))
    return [(path, path.read_text(encoding="utf-8")) for path in paths if path != skip]


def test_pages_install_from_a_clone():
    # the name "crossover" on the public index is an unrelated project: extras are installed from the clone
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"pip install [\"']?crossover\[", text), f"{page.name} installs crossover from the index"
