"""Package conventions: one version everywhere, a cheap ``import envace`` with the public API, py.typed, LICENSE."""

import importlib
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import envace

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR = ROOT / "src" / "envace"  # what package-data patterns are relative to

# what the first lines of a LICENSE file say for each SPDX id pyproject may name
LICENSE_HEADINGS = {"Apache-2.0": ("Apache License", "Version 2.0, January 2004"), "MIT": ("MIT License",)}


def _python(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_version_is_written_once_and_the_build_reads_it_from_the_package():
    from setuptools.config.pyprojecttoml import read_configuration

    assert "version" not in PYPROJECT["project"], "a second copy of the version in pyproject.toml can drift"
    assert "version" in PYPROJECT["project"]["dynamic"]
    built = read_configuration(ROOT / "pyproject.toml", expand=True)["project"]["version"]
    assert built == envace.__version__


def test_version_matches_the_installed_metadata():
    try:
        installed = importlib.metadata.version("envace")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("envace is not installed (running from a bare source tree)")
    assert envace.__version__ == installed, "installed metadata differs from the source: reinstall (make install)"


@pytest.mark.parametrize("module", ["envace", "envace.cli"])
def test_version_flag_prints_name_and_version(module):
    p = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"envace {envace.__version__}\n"


def test_import_envace_and_its_version_do_not_import_torch():
    heavy = ["torch", "transformers", "numpy", "envace.backends.models", "envace.training.trainer"]
    out = _python(
        "import sys, json, envace; envace.__version__; dir(envace); "
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    assert json.loads(out) == []


@pytest.mark.parametrize("name", [n for n in envace.__all__ if n != "__version__"])
def test_every_public_name_resolves_to_its_definition(name):
    obj = getattr(envace, name)
    assert callable(obj)
    where = importlib.import_module(f"envace.{envace._EXPORTS[name]}")
    assert obj is getattr(where, name)
    assert name in dir(envace)


def test_star_import_gives_exactly_the_public_names():
    ns: dict = {}
    exec("from envace import *", ns)
    assert set(ns) - {"__builtins__"} == set(envace.__all__)


def test_unknown_attribute_names_the_public_ones():
    with pytest.raises(AttributeError, match="no attribute 'nope'.*RolloutEngine"):
        envace.nope


def test_envace_sft_is_the_sft_function_whichever_is_imported_first():
    """``envace.sft`` is :func:`envace.training.sft.sft` whether the training module was imported before or not."""
    out = _python(
        "import json, envace\n"
        "first = envace.sft\n"
        "import envace.training.sft as mod\n"
        "from envace import sft\n"
        "print(json.dumps([first is mod.sft, sft is mod.sft, envace.sft is mod.sft, callable(first)]))"
    )
    assert json.loads(out) == [True, True, True, True]


def test_py_typed_ships_and_every_package_data_pattern_matches_a_file_in_the_package():
    assert (PACKAGE_DIR / "py.typed").is_file()
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["envace"]
    assert "py.typed" in patterns
    dead = [pat for pat in patterns if not any(PACKAGE_DIR.glob(pat))]
    assert dead == [], f"package-data patterns that match nothing inside src/envace: {dead}"


def test_license_file_is_the_license_pyproject_names():
    spdx = PYPROJECT["project"]["license"]
    spdx = spdx["text"] if isinstance(spdx, dict) else spdx
    assert spdx in LICENSE_HEADINGS, f"no known LICENSE heading for {spdx!r}"
    text = (ROOT / "LICENSE").read_text()
    head = " ".join(text.split()[:40])
    for words in LICENSE_HEADINGS[spdx]:
        assert words in head
    assert "envace contributors" in text


def _requirements(lines):
    from packaging.requirements import Requirement

    return {
        (r := Requirement(line)).name.lower(): r for line in lines if line.strip() and not line.lstrip().startswith("#")
    }


def test_every_tested_pin_lies_inside_the_range_pyproject_declares():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = _requirements(meta["dependencies"] + meta["optional-dependencies"]["test"])
    pins = _requirements((ROOT / "requirements" / "constraints.txt").read_text().splitlines())
    assert set(ranges) == set(pins), "constraints.txt pins exactly the direct dependencies"
    for name, pin in pins.items():
        (version,) = [s.version for s in pin.specifier if s.operator == "=="]
        assert ranges[name].specifier.contains(version), (
            f"{name}=={version} is outside pyproject's {ranges[name].specifier}"
        )
        assert not any(s.operator == "==" for s in ranges[name].specifier), (
            f"pyproject pins {name} exactly; declare a range"
        )


def test_the_installed_dependencies_are_the_tested_pins():
    import importlib.metadata as md

    for name, pin in _requirements((ROOT / "requirements" / "constraints.txt").read_text().splitlines()).items():
        installed = md.version(name).split("+")[0]  # 2.13.0+cpu is torch 2.13.0
        assert pin.specifier.contains(installed), f"{name} {installed} installed, {pin.specifier} tested"


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_readme_folder_tree_names_every_subpackage_and_nothing_else():
    section = _readme_section("What it does")
    tree = section.split("```")[1]
    named = {line.split("/")[0].strip() for line in tree.splitlines() if "/ " in line}
    folders = {p.parent.name for p in PACKAGE_DIR.glob("*/*.py")}
    assert named == folders


def test_every_module_the_readme_table_names_exists():
    import importlib.util
    import re

    section = _readme_section("What it does")
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    named = sorted(set(re.findall(r"`(envace(?:\.\w+)+)`", table)))
    assert len(named) > 10
    missing = [m for m in named if importlib.util.find_spec(m) is None]
    assert missing == []


def _module_level_imports() -> dict[str, set[str]]:
    """envace module -> the envace modules its top-level statements import (a function's lazy import and a
    ``TYPE_CHECKING`` block are not module-level)."""
    import ast

    graph: dict[str, set[str]] = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_pkg else parts)
        package = name if is_pkg else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.startswith("envace"):
                    deps.add(target)
                    deps |= {f"{target}.{a.name}" for a in node.names}  # ``from . import module``
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("envace")}
        graph[name] = deps
    return {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}


def test_modules_import_each_other_without_cycles():
    graph = _module_level_imports()
    assert "envace.rollout.engine" in graph and graph["envace.rollout.engine"]
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(path[path.index(d) :] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_lower_folders_never_import_the_higher_ones_at_module_level():
    order = ["core", "math", "chat", "backends", "envs", "rollout", "rewards", "training", "evaluation", "serving"]
    rank = {f"envace.{p}": i for i, p in enumerate(order)}

    def folder(m: str) -> str | None:
        return next((p for p in rank if m == p or m.startswith(p + ".")), None)

    upward = [
        (m, d)
        for m, deps in _module_level_imports().items()
        for d in deps
        if folder(m) and folder(d) and rank[folder(d)] > rank[folder(m)]
    ]
    assert upward == []


def _imports_anywhere(module: str) -> set[str]:
    """The envace modules that ``module``'s file imports anywhere: at module level, inside functions, in a
    ``TYPE_CHECKING`` block (``from .x import y`` counts as ``x`` and as ``x.y``)."""
    import ast

    path = PACKAGE_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")
    package = module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            out |= {target} | {f"{target}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            out |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return {m for m in out if m.startswith("envace")}


def test_evaluation_flows_one_way_budget_over_trials_and_tts_over_policy():
    """A budget-N evaluation is one call down (issue 30): budget runs ``trials.evaluate`` of a rehearsing policy;
    trials and tts never import each other (nor budget), anywhere, and the policy module imports neither."""
    ev = "envace.evaluation"
    below = {
        f"{ev}.policy": {f"{ev}.trials", f"{ev}.tts", f"{ev}.budget"},
        f"{ev}.trials": {f"{ev}.tts", f"{ev}.budget"},
        f"{ev}.tts": {f"{ev}.trials", f"{ev}.budget"},
    }
    for module, never in below.items():
        assert _imports_anywhere(module) & never == set(), module
    assert {f"{ev}.trials", f"{ev}.tts"} <= _imports_anywhere(f"{ev}.budget")


def test_moved_modules_keep_their_old_path_for_one_version():
    """rewards.agreement moved to evaluation/ and the report's claims table and trajectory viewer have modules of
    their own (issue 30); the old import paths still give the same objects, and the lower floor loads nothing of
    the higher one until a name is asked for."""
    out = _python(
        "import sys, json\n"
        "import envace.rewards.agreement as old\n"
        "lazy = 'envace.evaluation.agreement' not in sys.modules\n"
        "import envace.evaluation.agreement as new, envace.evaluation.report as report\n"
        "import envace.evaluation.claims as claims, envace.evaluation.viewer as viewer\n"
        "print(json.dumps([lazy, old.spec_label is new.spec_label, old.measure_reward_agreement is "
        "new.measure_reward_agreement, report.claims_table is claims.claims_table, report.viewer_html is "
        "viewer.viewer_html]))"
    )
    assert json.loads(out) == [True, True, True, True, True]


def test_the_test_time_names_that_moved_up_say_where_they_went():
    """evaluate_with_tts and run_tts run evaluate, so they live above it (evaluation/budget.py); the tts module,
    which must not import upward, names their new place instead of re-exporting them."""
    import envace.evaluation.budget as budget
    import envace.evaluation.tts as tts

    for name in ("evaluate_with_tts", "run_tts"):
        with pytest.raises(AttributeError, match=f"tts.{name} moved to envace.evaluation.budget"):
            getattr(tts, name)
        assert callable(getattr(budget, name))
    assert envace.run_tts is budget.run_tts
