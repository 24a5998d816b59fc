"""Clear errors, not tracebacks: bad configs (unknown field, bad value, wrong type, bad YAML), unknown environment
names, missing models, missing optional packages and tasks that do not fit the context all end the CLI with exit
code 2 and one line ``envace <command>: error: ...`` on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest

from envace.cli import main

TINY = [
    "--set",
    "model=tiny-random",
    "--set",
    "suite=bank",
    "--set",
    "iterations=1",
    "--set",
    "batch_tasks=1",
    "--set",
    "tensorboard=false",
    "--set",
    "progress=false",
    "--set",
    "rollout.group_size=1",
]


def _one_line_error(stderr: str, cmd: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"envace {cmd}: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr[-3000:]
    return errors[0]


SUBPROCESS_CASES = {
    # name: (argv after "envace", words the message must hold)
    "unknown config field": (
        ["train", "--set", "learning_rate=1"],
        ["unknown TrainConfig field", "learning_rate", "valid:", "'lr'"],
    ),
    "unknown environment": (
        ["tasks", "--suite", "nosuch"],
        ["unknown environment or task suite 'nosuch'", "bank", "bfcl", "tau2"],
    ),
    "missing model": (
        ["rollout", "--model", "/nonexistent/model-dir", "--suite", "bank", "-n", "1"],
        ["/nonexistent/model-dir", "not found"],
    ),
    "prompt exceeds the context": (
        ["train", *TINY, "--set", "rollout.max_context_tokens=64"],
        ["no task of the batch fits the context", "max_context_tokens=64"],
    ),
}
BLOCK_BFCL = "import sys; sys.modules['bfcl_eval'] = None; from envace.cli import main; sys.exit(main(sys.argv[1:]))"


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path):
    """The slow cases run as real ``python -m envace.cli`` processes, side by side."""
    procs = {}
    for name, (argv, _) in SUBPROCESS_CASES.items():
        argv = argv + (["--set", f"out_dir={tmp_path / 'run'}"] if argv[0] == "train" else [])
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "envace.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
    # a missing optional package (bfcl_eval made unimportable) names the extra to install
    procs["missing extra"] = subprocess.Popen(
        [sys.executable, "-c", BLOCK_BFCL, "tasks", "--suite", "bfcl:multi_turn_base"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    expect = {name: (argv[0], words) for name, (argv, words) in SUBPROCESS_CASES.items()} | {
        "missing extra": ("tasks", ["'bfcl' extra", "install", "bfcl_eval"])
    }
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=240)
        cmd, words = expect[name]
        assert proc.returncode == 2, (name, proc.returncode, err[-3000:])
        line = _one_line_error(err, cmd)
        for w in words:
            assert w in line, (name, w, line)


@pytest.mark.parametrize(
    "argv,words",
    [
        (["train", "--set", "rollout.group_size=abc"], ["RolloutConfig.group_size", "'abc'"]),
        (["train", "--set", "rollout.group_size=[2]"], ["RolloutConfig.group_size", "expected int"]),
        (["train", "--set", "lr=-1"], ["lr > 0"]),
        (["train", "--set", "variant=magic"], ["unknown variant 'magic'", "envace", "real_env"]),
        (["train", "--set", "reward=nosuch"], ["unknown reward 'nosuch'", "gold_f1"]),
        (["train", "--set", "rollout.act.temperature=hot"], ["SamplingParams.temperature", "'hot'"]),
        (["train", "--set", "lr"], ["not key=value"]),
        (["train", "--set", "model=[unclosed"], ["not valid YAML"]),
        (["train", "--config", "missing.yaml"], ["missing.yaml"]),
        (
            ["train", *TINY, "--set", "rollout.max_context_tokens=100000"],
            ["max_context_tokens=100000", "context length", "8192"],
        ),
        (["eval", "--model", "/nonexistent/model-dir", "-n", "1"], ["not found"]),
    ],
    ids=[
        "not an int",
        "wrong type",
        "out of range",
        "unknown variant",
        "unknown reward",
        "not a float",
        "not key=value",
        "bad YAML value",
        "missing config file",
        "context longer than the model's",
        "missing model (eval)",
    ],
)
def test_bad_configs_and_names_fail_with_one_clear_line(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = argv + (["--set", f"out_dir={tmp_path / 'run'}"] if argv[0] == "train" else [])
    assert main(argv) == 2
    line = _one_line_error(capsys.readouterr().err, argv[0])
    for w in words:
        assert w in line, (w, line)


def test_bad_yaml_file_and_non_mapping_file(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {group_size: [1, 2\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "not valid YAML" in _one_line_error(capsys.readouterr().err, "train")
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    assert main(["train", "--config", str(lst)]) == 2
    assert "must hold a mapping" in _one_line_error(capsys.readouterr().err, "train")
