"""Suites from outside envace: real packages with ``envace.environments`` entry points, built and pip-installed into a
temporary folder; envace runs in subprocesses with that folder on its path (the test process's registries stay
clean)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import envace

GOOD = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "envace-echo-plugin"
        version = "0.1"

        [project.entry-points."envace.environments"]
        echo = "envace_echo_plugin:load_tasks"
        echo-failing = "envace_echo_plugin:load_failing"
        echo-not-tasks = "envace_echo_plugin:load_not_tasks"
        echo-unknown-env = "envace_echo_plugin:load_unknown_env"
    """,
    "envace_echo_plugin/__init__.py": '''
        """A suite of echo tasks and its environment, registered from outside envace."""
        from envace.core.types import Task, ToolSpec
        from envace.envs import ENVS, Environment, Score

        ECHO = ToolSpec("echo", "Echo the text.", {"type": "object", "properties": {"text": {"type": "string"}},
                                                     "required": ["text"]})


        class EchoEnv(Environment):
            def _execute(self, call):
                return {"echo": call.arguments["text"]}

            def state(self):
                return {"calls": self.n_calls}

            def score(self, traj):
                return Score(True, 1.0)


        ENVS.add("echo", EchoEnv)


        def load_tasks(spec, split="train", n=None, seed=0):
            return [Task(id=f"echo_{split}_{i}", env="echo", system_prompt="", user_turns=["Echo hi."],
                         tools=[ECHO], split=split) for i in range(3 if n is None else n)]


        def load_failing(spec, split="train", n=None, seed=0):
            raise RuntimeError("the echo data set is missing")


        def load_not_tasks(spec, split="train", n=None, seed=0):
            return {"tasks": []}


        def load_unknown_env(spec, split="train", n=None, seed=0):
            return [Task(id="t", env="nowhere", system_prompt="", user_turns=["x"], tools=[])]
    ''',
}

BROKEN = {
    "pyproject.toml": """
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "envace-broken-plugin"
        version = "0.2"

        [project.entry-points."envace.environments"]
        needs-missing = "envace_broken_plugin.missing:load_tasks"
        raises-on-import = "envace_broken_plugin.raising:load_tasks"
        not-a-loader = "envace_broken_plugin:NOT_A_LOADER"
        wrong-signature = "envace_broken_plugin:takes_nothing"
        bank = "envace_broken_plugin:load_tasks"
    """,
    "envace_broken_plugin/__init__.py": """
        NOT_A_LOADER = 42


        def takes_nothing():
            return []


        def load_tasks(spec, split="train", n=None, seed=0):
            return []
    """,
    "envace_broken_plugin/missing.py": "import envace_no_such_dependency  # noqa: F401\n",
    "envace_broken_plugin/raising.py": "raise RuntimeError('cannot find my config file')\n",
}

BROKEN_NAMES = ("needs-missing", "raises-on-import", "not-a-loader", "wrong-signature", "bank")


def _project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


@pytest.fixture(scope="module")
def plugins_on_path(tmp_path_factory) -> dict[str, str]:
    """Both packages pip-installed into one target folder; the environment of a subprocess that imports them."""
    pytest.importorskip("setuptools", reason="the test packages are built with this environment's setuptools")
    root = tmp_path_factory.mktemp("plugins")
    target = root / "site"
    projects = [_project(root / "good", GOOD), _project(root / "broken", BROKEN)]
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(target), *map(str, projects)], check=True, capture_output=True, timeout=300)
    src = str(Path(envace.__file__).parents[1])
    path = os.pathsep.join([str(target), src, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def _envace(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_tasks_list_shows_the_builtin_suites_and_the_installed_plugins(plugins_on_path):
    p = _envace(plugins_on_path, "tasks", "--list")
    assert p.returncode == 0, p.stderr
    rows = dict(line.split(None, 1) for line in p.stdout.splitlines())
    assert rows["bank"] == "built-in" and rows["mcp"] == "built-in, extra 'mcp'"
    assert rows["echo"] == "plug-in: envace-echo-plugin 0.1 (envace_echo_plugin:load_tasks)"
    assert not set(BROKEN_NAMES) - {"bank"} & set(rows)


def test_each_broken_plugin_is_one_stderr_line_naming_it_and_the_others_still_load(plugins_on_path):
    p = _envace(plugins_on_path, "tasks", "--list")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == len(BROKEN_NAMES), lines
    why = {name: line for name in BROKEN_NAMES for line in lines if f"plug-in suite {name!r} " in line}
    assert set(why) == set(BROKEN_NAMES), lines
    assert all(line.startswith("envace: plug-in suite ") and "envace-broken-plugin 0.2" in line for line in lines)
    assert "skipped: ModuleNotFoundError: No module named 'envace_no_such_dependency'" in why["needs-missing"]
    assert "skipped: RuntimeError: cannot find my config file" in why["raises-on-import"]
    assert "skipped: TypeError: int object is not a loader" in why["not-a-loader"]
    assert "cannot be called as loader(spec, split=, n=, seed=)" in why["wrong-signature"]
    assert "skipped: the name is envace's own suite 'bank'" in why["bank"]
    assert "echo" in _envace(plugins_on_path, "tasks", "--list").stdout  # the good package's suites are there


def test_a_plugin_suite_loads_its_tasks_and_runs_in_its_registered_environment(plugins_on_path):
    p = _envace(plugins_on_path, "tasks", "--suite", "echo", "--split", "test", "-n", "2")
    assert p.returncode == 0, p.stderr
    ids = [json.loads(t)["id"] for t in p.stdout.replace("}\n{", "}\x00{").split("\x00")]
    assert ids == ["echo_test_0", "echo_test_1"]
    script = (
        "from envace.envs import load_tasks, make_env, check_env\n"
        "from envace.core.types import ToolCall\n"
        "task = load_tasks('echo', 'train', n=1)[0]\n"
        "env = make_env(task)\n"
        "print(env.call(ToolCall('echo', {'text': 'hi'})), env.call(ToolCall('echo', {}))['error']['kind'])\n"
        "print(check_env(task, calls=[ToolCall('echo', {'text': 'a'})]).ok)\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=plugins_on_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["{'echo': 'hi'} bad_arguments", "True"]


@pytest.mark.parametrize(
    "suite,message",
    [
        (
            "echo-failing",
            "from envace-echo-plugin 0.1 (envace_echo_plugin:load_failing) "
            "failed: RuntimeError: the echo data set is missing",
        ),
        ("echo-not-tasks", "returned dict; expected a list of envace Task"),
        ("echo-unknown-env", "returned tasks of environment 'nowhere', which no module registered"),
    ],
    ids=["loader_raises", "loader_returns_no_tasks", "tasks_of_an_unregistered_environment"],
)
def test_a_plugin_loader_that_fails_is_a_one_line_error_of_its_suite(plugins_on_path, suite, message):
    p = _envace(plugins_on_path, "tasks", "--suite", suite)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"envace tasks: error: plug-in suite {suite!r} ") and message in last, last


def test_an_unknown_suite_names_the_plugin_suites_among_the_valid_ones(plugins_on_path):
    p = _envace(plugins_on_path, "tasks", "--suite", "ehco")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "unknown environment or task suite 'ehco'" in last and "echo" in last and "bank" in last, last
