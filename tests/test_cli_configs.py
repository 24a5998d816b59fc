"""Every configured CLI command (sft, train, eval, fidelity, experiment, rollout, rehearse, serve, export):
``--print-config`` shows the dataclass defaults (for the commands that had hand-written flags: the flags' old defaults),
a YAML file, the shorthand flags and ``--set`` resolve in the documented order, unknown fields name the valid ones,
``--help`` lists every field with its docstring, and ``eval --backend http`` against a live ``envace serve`` gives the
same greedy trajectories as ``--backend hf``."""

import argparse
import dataclasses
import json
import subprocess
import sys
import warnings
from dataclasses import dataclass, field

import pytest
import yaml

import envace.cli as cli
from envace.cli import build_parser, command_config, config_class, main
from envace.config import (
    FLAT_ROLLOUT_KEYS,
    TrainConfig,
    config_fields,
    config_help,
    config_yaml,
    field_docs,
    first_sentence,
    load_config,
    to_dict,
    train_config_dict,
)
from envace.rollout.engine import RolloutConfig
from servers import envace_serve

COMMANDS = {
    "sft": "SFTConfig",
    "train": "TrainConfig",
    "eval": "EvalConfig",
    "fidelity": "FidelityConfig",
    "experiment": "ExperimentConfig",
    "rollout": "RolloutBatchConfig",
    "rehearse": "RehearseConfig",
    "serve": "ServeConfig",
    "export": "ExportConfig",
}
MODEL = "SmolLM2-135M-Instruct"
OLD_FLAG_DEFAULTS = {  # the argparse defaults these commands had before they had configs: behaviour is unchanged
    "eval": dict(
        model=MODEL,
        suite="builtin",
        split="test",
        n=20,
        samples=1,
        tts_n=0,
        tts_mode="parallel",
        tts_memory="lessons",  # changed on purpose (issue 29): the old "model" format stays selectable
        temperature=None,
        max_steps=8,
        max_new_tokens=160,
        seed=0,
        bf16=False,
        out=None,
        trajectories=False,
    ),
    "fidelity": dict(
        model=MODEL,
        suite="builtin",
        split="test",
        n=8,
        k=2,
        mode="rehearsal",
        rehearser=None,
        simulator=None,
        validate_in_code=False,
        reference_cache=False,
        max_steps=8,
        max_new_tokens=160,
        seed=0,
        show=0,
        out=None,
    ),
    "rollout": dict(
        model=MODEL,
        suite="builtin",
        split="train",
        mode="rehearsal",
        simulator=None,
        rehearser=None,
        n=2,
        k=4,
        max_steps=4,
        max_new_tokens=96,
        shadow=False,
        seed=0,
        show=2,
        out="trajectories.jsonl",
    ),
    "rehearse": dict(
        model=MODEL,
        suite="builtin",
        split="test",
        index=0,
        n=2,
        mode="parallel",
        memory="lessons",  # changed on purpose (issue 29), as eval's tts_memory
        memory_max_tokens=256,
        max_steps=6,
        max_new_tokens=128,
        temperature=1.0,
        seed=0,
        out=None,
    ),
    "serve": dict(
        model=MODEL,
        served_model_name=None,
        host="127.0.0.1",
        port=8000,
        backend="hf",
        device="cpu",
        bf16=False,
        max_batch=32,
        batch_wait_ms=5.0,
        default_max_tokens=256,
        max_tokens_limit=4096,
        verbose=False,
    ),
}


def _printed(argv, capsys):
    assert main(argv) == 0
    return capsys.readouterr().out


def _cfg(*argv):
    return command_config(build_parser().parse_args(list(argv)))


@pytest.mark.parametrize("cmd", COMMANDS)
def test_print_config_shows_the_defaults_and_reads_back_as_the_same_config(cmd, capsys, tmp_path):
    out = _printed([cmd, "--print-config"], capsys)
    printed = yaml.safe_load(out)
    cls = config_class(build_parser().parse_args([cmd]).config_class)
    assert cls.__name__ == COMMANDS[cmd]
    assert printed == json.loads(json.dumps(to_dict(cls()), default=str))
    for name, old in OLD_FLAG_DEFAULTS.get(cmd, {}).items():
        for key in [name] if name in printed else [f"rollout.{p}" for p in FLAT_ROLLOUT_KEYS[name]]:
            value = printed
            for part in key.split("."):
                value = value[part]
            assert value == old, (cmd, key)
    (tmp_path / "c.yaml").write_text(out)
    assert _printed([cmd, "--config", str(tmp_path / "c.yaml"), "--print-config"], capsys) == out


def test_file_then_shorthand_flags_then_set_win_in_that_order(tmp_path):
    f = tmp_path / "eval.yaml"
    f.write_text("n: 5\nseed: 3\nsplit: val\nrollout: {max_steps: 2}\nbackend_options: {timeout: 9}\n")
    cfg = _cfg(
        "eval",
        "--config",
        str(f),
        "-n",
        "7",
        "--split",
        "train",
        "--set",
        "split=ood",
        "--trajectories",
        "--set",
        "backend_options.max_retries=1",
    )
    assert (cfg.n, cfg.seed, cfg.split, cfg.rollout.max_steps, cfg.trajectories) == (
        7,
        3,
        "ood",
        2,
        True,
    )  # flag > file; --set > flag
    assert (
        cfg.backend_options == {"timeout": 9, "max_retries": 1} and cfg.samples == 1 and cfg.model == MODEL
    )  # dotted --set reaches into a dict
    # the same order for the commands without shorthands, and nested fields
    f.write_text("iterations: 3\ngroup_size: 2\nrollout: {act: {max_new_tokens: 7}}\n")
    cfg = _cfg("train", "--config", str(f), "--set", "group_size=6")
    assert (cfg.iterations, cfg.group_size, cfg.rollout.act.max_new_tokens, cfg.rollout.max_steps) == (3, 6, 7, 8)


def test_the_old_rollout_group_size_key_of_train_is_read_one_version_with_a_warning(tmp_path):
    """``rollout.group_size`` (before ``TrainConfig.group_size``): a file and ``--set`` still set K, with a
    DeprecationWarning; both keys with different values are an error; a saved config round-trips without one."""
    f = tmp_path / "old.yaml"
    f.write_text("iterations: 3\nrollout: {group_size: 2, act: {max_new_tokens: 7}}\n")
    with pytest.warns(DeprecationWarning, match="rollout.group_size is now group_size"):
        cfg = _cfg("train", "--config", str(f))
    assert (cfg.group_size, cfg.rollout.group_size, cfg.rollout.act.max_new_tokens) == (2, 4, 7)
    with pytest.warns(DeprecationWarning, match="rollout.group_size is now group_size"):
        assert _cfg("train", "--set", "rollout.group_size=6").group_size == 6
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="give group_size only"):
        _cfg("train", "--config", str(f), "--set", "group_size=5")
    with pytest.warns(DeprecationWarning):  # Python: a RolloutConfig with the old field (it warns itself)
        old = TrainConfig(rollout=RolloutConfig(group_size=3))
    assert (old.group_size, old.rollout.group_size) == (3, 4)
    assert TrainConfig(rollout={"max_steps": 2}, group_size=5).group_size == 5
    (tmp_path / "saved.yaml").write_text(config_yaml(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        again = load_config(TrainConfig, str(tmp_path / "saved.yaml"))
    assert to_dict(again) == to_dict(cfg)
    saved_before = to_dict(cfg) | {"rollout": to_dict(cfg)["rollout"] | {"group_size": 2, "mode": "real"}}
    del saved_before["group_size"]  # a checkpoint's config.json of the version before: the resume check reads it
    assert train_config_dict(saved_before, warn=False) == {
        **{k: v for k, v in to_dict(cfg).items()},
        "rollout": {k: v for k, v in to_dict(cfg)["rollout"].items() if k not in ("group_size", "mode")},
    }


def test_old_flags_still_parse_into_their_fields():
    cfg = _cfg(
        "eval",
        "--model",
        "m",
        "--suite",
        "bank",
        "-n",
        "20",
        "-k",
        "3",
        "--tts-n",
        "2",
        "--tts-mode",
        "sequential",
        "--tts-memory",
        "concat",
        "--temperature",
        "0.5",
        "--max-steps",
        "2",
        "--max-new-tokens",
        "9",
        "--seed",
        "4",
        "--bf16",
        "auto",
        "--out",
        "x.json",
        "--backend",
        "vllm",
    )
    assert (cfg.model, cfg.suite, cfg.n, cfg.samples, cfg.tts_n, cfg.tts_mode, cfg.tts_memory, cfg.temperature) == (
        "m",
        "bank",
        20,
        3,
        2,
        "sequential",
        "concat",
        0.5,
    )
    assert (cfg.rollout.max_steps, cfg.rollout.act.max_new_tokens, cfg.rollout.rehearse.max_new_tokens, cfg.seed) == (
        2,
        9,
        9,
        4,
    )
    assert cfg.rollout.rehearse.stop == ["</observation>"] and cfg.rollout.act.temperature == 1.0  # the rest stays
    assert (cfg.bf16, cfg.out, cfg.backend) == (
        "auto",
        "x.json",
        "vllm",
    )
    assert [_cfg("eval", *a).bf16 for a in ([], ["--bf16"], ["--bf16", "auto"], ["--bf16", "off"])] == [
        False,
        True,
        "auto",
        False,
    ]
    fid = _cfg(
        "fidelity", "-k", "3", "--mode", "per_role", "--rehearser", "r", "--validate-in-code", "--backend", "http"
    )
    assert fid.k == 3 and fid.rollout.validate_in_code and not fid.rollout.reference_cache and fid.rollout.progress
    reh = _cfg("rehearse", "--temperature", "0.3", "--max-new-tokens", "7")
    assert (reh.rollout.act.temperature, reh.rollout.act.max_new_tokens, reh.rollout.max_steps) == (0.3, 7, 6)
    assert _cfg("rehearse", "-N", "0", "--index", "4").n == 0 and _cfg("rollout", "--shadow", "--out", "t.jsonl").shadow
    serve = _cfg(
        "serve", "--served-model-name", "x", "--port", "0", "--batch-wait-ms", "2", "--verbose", "--bf16", "auto"
    )
    assert (serve.served_model_name, serve.port, serve.batch_wait_ms, serve.verbose, serve.bf16) == (
        "x",
        0,
        2.0,
        True,
        "auto",
    )


def _commands(parser):
    """The configured commands of ``parser``: name -> (its subparser, its config dataclass)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    configured = {name: sp for name, sp in sub.choices.items() if sp.get_default("config_class")}
    for sp in configured.values():
        sp.add_config_flags()  # added when a command is parsed: only the one that runs imports its config
    return {name: (sp, config_class(sp.get_default("config_class"))) for name, sp in configured.items()}


def flag_faults(parser) -> list[str]:
    """What breaks the rule of envace.cli.FLAGS in ``parser``: a flag or argument that sets no field of its command's
    config, a shorthand spelled otherwise than from its field (or its FLAG_EXTRAS), a table entry without its flag."""
    faults = []
    for name, (sp, cls) in _commands(parser).items():
        fields = {f.name for f in dataclasses.fields(cls)} | set(getattr(cls, "FLAT_ROLLOUT", ()))  # (shorthands)
        table = cli.FLAGS.get(name, "").split()
        for a in sp._actions:
            if a.dest in {"help", "config", "overrides", "print_config"}:
                continue
            if a.dest not in fields:
                faults.append(f"{name} {a.option_strings or a.dest}: no field {a.dest!r} of {cls.__name__}")
            elif a.option_strings:
                spelled = cli.FLAG_EXTRAS.get(f"{name}.{a.dest}", {}).get("flags", cli.flag_names(a.dest))
                if a.dest not in table or list(a.option_strings) != list(spelled):
                    faults.append(f"{name} {a.option_strings}: not the table's flag of {a.dest!r}")
        dests = {a.dest for a in sp._actions}
        faults += [f"{name}: table entry {f!r} has no flag" for f in table if f not in dests]
    return faults


def test_each_commands_flags_are_spelled_from_its_config_fields():
    parser = build_parser()
    assert flag_faults(parser) == []
    assert set(cli.FLAGS) <= set(_commands(parser))
    for key in cli.FLAG_EXTRAS:  # every extra belongs to a flag of the table
        command, field_name = key.split(".")
        assert field_name in cli.FLAGS[command].split(), key
    # the rule's spelling, and the few aliases the table lists
    assert cli.flag_names("max_new_tokens") == ("--max-new-tokens",) and cli.flag_names("n") == ("-n",)
    eval_flags = {a.dest: a.option_strings for a in _commands(parser)["eval"][0]._actions}
    assert eval_flags["samples"] == ["--samples", "-k"] and eval_flags["tts_n"] == ["--tts-n"]
    assert {a.dest: a.option_strings for a in _commands(parser)["rehearse"][0]._actions}["n"] == ["-N"]
    # a flag for a field the config does not have is caught
    eval_parser = _commands(parser)["eval"][0]
    eval_parser.add_argument("--max-tokens", dest="max_tokens", default=argparse.SUPPRESS)
    assert flag_faults(parser) == ["eval ['--max-tokens']: no field 'max_tokens' of EvalConfig"]


def test_a_table_entry_naming_a_missing_field_stops_the_parser(monkeypatch):
    monkeypatch.setitem(cli.FLAGS, "eval", cli.FLAGS["eval"] + " max_tokens")
    with pytest.raises(ValueError, match="EvalConfig has no field 'max_tokens'; fields: .*max_new_tokens"):
        build_parser().parse_args(["eval"])
    monkeypatch.setitem(cli.FLAGS, "eval", "backend_options")  # a dict: no flag parses one
    with pytest.raises(ValueError, match="EvalConfig.backend_options: no flag parses a 'dict'"):
        build_parser().parse_args(["eval", "--help"])


def test_only_the_command_that_runs_imports_its_config_for_its_flags():
    loaded = "print('envace.config' in sys.modules)"
    code = (
        "import sys; from envace.cli import build_parser; p = build_parser(); "
        f"p.parse_args(['tasks']); {loaded}; p.parse_args(['eval', '-n', '2']); {loaded}"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


@pytest.mark.parametrize(
    "argv,cls",
    [
        (["fidelity", "--set", "nope=1"], "FidelityConfig"),
        (["rollout", "--config", "FILE"], "RolloutBatchConfig"),
        (["serve", "--set", "max_tokens=3"], "ServeConfig"),
    ],
)
def test_an_unknown_field_is_one_error_line_naming_the_valid_fields(argv, cls, capsys, tmp_path):
    (tmp_path / "c.yaml").write_text("nope: 1\n")
    argv = [str(tmp_path / "c.yaml") if a == "FILE" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    valid = sorted(f.name for f in dataclasses.fields(config_class(f"envace.config:{cls}")))
    assert (
        err == f"envace {argv[0]}: error: unknown {cls} field(s) "
        f"['{argv[-1].split('=')[0] if '=' in argv[-1] else 'nope'}']; valid: {valid}"
    )


def test_a_bad_backend_lists_the_valid_ones_and_vllm_without_vllm_names_the_extra(monkeypatch, capsys):
    for cmd in ("eval", "fidelity", "rollout", "rehearse"):
        assert main([cmd, "--backend", "nosuch", "--print-config"]) == 2
        assert (
            capsys.readouterr().err.strip()
            == f"envace {cmd}: error: unknown backend 'nosuch'; valid names: auto, hf, http, vllm"
        )
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError (as on any machine without it)
    assert main(["eval", "--backend", "vllm", "--model", "tiny-random", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "envace[vllm]" in err
    assert main(["eval", "--model", "http://127.0.0.1:1/v1", "-n", "1"]) == 2  # a URL needs --backend http
    assert "--backend http" in capsys.readouterr().err
    assert main(["eval", "--backend", "http", "--model", "tiny-random", "-n", "1"]) == 2
    assert "http(s)://host:port/v1 URL, got 'tiny-random'" in capsys.readouterr().err
    assert main(["eval", "--backend", "http", "--model", "http://127.0.0.1:1/v1", "--bf16", "-n", "1"]) == 2
    assert "bf16 is a setting of the hf backend" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_lists_every_field_with_its_default_and_docstring(cmd, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([cmd, "--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "--config" in out and "--set" in out and "--print-config" in out and f"{COMMANDS[cmd]} fields" in out
    fields = config_fields(
        config_class(f"envace.{'evaluation.experiment' if cmd == 'experiment' else 'config'}:{COMMANDS[cmd]}")
    )
    assert len(fields) >= 10
    for name, default, doc in fields:
        assert f"\n  {name} = {default!r}\n" in out + "\n", name
        assert " ".join(doc.split()) in flat, name
    if cmd in OLD_FLAG_DEFAULTS:  # the new configs document every field
        assert all(doc for _, _, doc in fields), [n for n, _, doc in fields if not doc]


def test_chat_and_user_settings_reach_the_rollout_of_eval(monkeypatch):
    """eval builds its rollout config itself: the chat / tool formats, thinking and the user simulator of its
    config are passed on (as under ``rollout.`` for train)."""
    import envace.evaluation.budget
    from envace.config import EvalConfig

    seen = {}

    def fake(*a, rollout=None, **kw):
        seen["rollout"] = rollout
        raise SystemExit(0)

    monkeypatch.setattr(envace.evaluation.budget, "evaluate_model", fake)
    sets = ["chat_format=template", "tool_format=mistral", "native_tools=false", "thinking=false", "user=llm"]
    sets += ["user_model=tiny-random", "thinking_history=keep"]
    want = ("template", "mistral", False, False, "llm", "tiny-random", "keep")
    for prefix in ("rollout.", ""):  # "": the flat keys of before (ChatIO), one version, with a warning
        with pytest.raises(SystemExit), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            main(["eval", "-n", "1", "--max-steps", "3"] + [x for kv in sets for x in ("--set", prefix + kv)])
        rc = seen["rollout"]
        got = (rc.chat_format, rc.tool_format, rc.native_tools, rc.thinking, rc.user, rc.user_model)
        assert got + (rc.thinking_history,) == want and rc.max_steps == 3
        deprecated = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        assert bool(deprecated) == (prefix == "") and all("rollout.chat_format" in str(w.message) for w in deprecated)
    assert EvalConfig().rollout == RolloutConfig()  # eval's own defaults are the engine's


@dataclass
class _Documented:
    a: int = 1
    """First sentence, e.g. ``x``, i.e. with abbreviations. Second sentence."""
    b: str = "x"
    c: list = field(default_factory=lambda: [1])
    """Spans
    two lines.

    A second paragraph."""


def test_field_docs_read_the_docstring_under_each_field():
    assert field_docs(_Documented) == {
        "a": "First sentence, e.g. ``x``, i.e. with abbreviations. Second sentence.",
        "c": "Spans\ntwo lines.\n\nA second paragraph.",
    }
    assert config_fields(_Documented) == [
        ("a", 1, "First sentence, e.g. ``x``, i.e. with abbreviations."),
        ("b", "x", ""),
        ("c", [1], "Spans two lines."),
    ]
    assert first_sentence("x" * 400).endswith("...") and len(first_sentence("x" * 400)) == 300
    assert config_help(_Documented).splitlines()[1:] == [
        "  a = 1",
        "      First sentence, e.g. ``x``, i.e. with abbreviations.",
        "  b = 'x'",
        "  c = [1]",
        "      Spans two lines.",
    ]


def test_eval_backend_http_against_envace_serve_evaluates_like_backend_hf(tmp_path, capsys):
    """tiny-random decodes greedily to newlines on every prompt, so equal outcomes alone (all failures) would say
    little: the saved trajectories (messages, steps, completions, truncation) must be equal too, and in process
    the rows: the same prompt and completion token ids, and log-probs equal up to batching numerics (the server
    batches the requests its own way; the argmax is the same)."""
    from envace.backends.base import SamplingParams
    from envace.evaluation.budget import evaluate_model
    from envace.rollout.engine import RolloutConfig
    from numerics import assert_logprobs_close

    common = ["--suite", "bank", "-n", "2", "--max-steps", "2", "--max-new-tokens", "24", "--trajectories"]
    assert main(["eval", "--model", "tiny-random", *common, "--out", str(tmp_path / "hf.json")]) == 0
    kw = dict(
        suite="bank", n=2, rollout=RolloutConfig(max_steps=2, act=SamplingParams(max_new_tokens=12)), progress=False
    )
    local = evaluate_model("tiny-random", **kw)
    with envace_serve("--model", "tiny-random", "--served-model-name", "tiny") as url:
        # the served name is no local model: the client is told which tokenizer to use, and says so when it cannot tell
        assert main(["eval", "--backend", "http", "--model", url, *common]) == 2
        assert "set backend_options.tokenizer" in capsys.readouterr().err
        assert (
            main(
                [
                    "eval",
                    "--backend",
                    "http",
                    "--model",
                    url,
                    "--set",
                    "backend_options.tokenizer=tiny-random",
                    *common,
                    "--out",
                    str(tmp_path / "http.json"),
                ]
            )
            == 0
        )
        remote = evaluate_model(url, backend="http", backend_options={"tokenizer": "tiny-random"}, **kw)
    hf, http = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("hf", "http"))
    assert http["config"]["backend"] == "http" and http["config"]["model"] == url and hf["config"]["backend"] == "hf"
    assert hf["task_ids"] == http["task_ids"] and len(hf["per_task"]) == 2
    assert hf["per_task"] == http["per_task"]  # the same per-task outcomes and scores
    assert hf["trajectories"] == http["trajectories"] and all(
        st["action_text"] for t in hf["trajectories"] for st in t["steps"]
    )
    rows = [[r for t in res.trajectories for r in t.rows] for res in (local, remote)]
    assert len(rows[0]) == len(rows[1]) >= 2
    for a, b in zip(*rows):
        assert (a.role, a.prompt_ids, a.completion_ids) == (b.role, b.prompt_ids, b.completion_ids) and len(
            a.completion_ids
        ) == 12
        assert_logprobs_close(b.old_logprobs, a.old_logprobs)


class _Opened(Exception):
    """Raised by a stand-in ``open_backend``: the command asked for its model (and got no further)."""


@pytest.mark.parametrize("cmd", ["rollout", "rehearse", "eval", "fidelity"])
def test_every_model_command_opens_its_model_through_open_backend_with_its_backend(cmd, monkeypatch):
    import envace.backends.loaders as loaders

    asked = []

    def opened(model, backend="hf", options=None, **kw):
        asked.append((model, backend, options))
        raise _Opened

    monkeypatch.setattr(loaders, "open_backend", opened)
    argv = [cmd, "--model", "http://h:1/v1", "--backend", "http", "--set", "backend_options.tokenizer=tiny-random"]
    with pytest.raises(_Opened):
        main([*argv, "--suite", "bank"])
    assert asked == [("http://h:1/v1", "http", {"tokenizer": "tiny-random"})]


def test_rollout_and_rehearse_backend_http_against_envace_serve(tmp_path, capsys):
    """``--backend http`` as for eval: the served model plays Act and Rehearse (its tokenizer found by the served
    name), and the server sees the requests."""
    log = tmp_path / "requests.log"
    common = ["--backend", "http", "--suite", "bank", "--max-steps", "1", "--max-new-tokens", "4"]
    with open(log, "w") as err, envace_serve("--model", "tiny-random", "--verbose", stderr=err) as url:
        out = tmp_path / "t.jsonl"
        assert main(["rollout", "--model", url, *common, "-n", "1", "-k", "2", "--out", str(out)]) == 0
        trajs = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(trajs) == 2 and all(t["rows"] for t in trajs)
        served = log.read_text().count("POST /v1/completions")
        assert served >= 2
        rec = tmp_path / "r.json"
        assert main(["rehearse", "--model", url, *common, "-N", "1", "--out", str(rec)]) == 0
        assert json.loads(rec.read_text())["attempts"] and log.read_text().count("POST /v1/completions") > served


@pytest.mark.parametrize(
    "cls,flat,path,value",
    [
        ("EvalConfig", "max_new_tokens", ("act.max_new_tokens", "rehearse.max_new_tokens"), 9),
        ("FidelityConfig", "reference_cache", ("reference_cache",), True),
        ("RolloutBatchConfig", "max_steps", ("max_steps",), 3),
        ("RehearseConfig", "temperature", ("act.temperature",), 0.25),
        ("EvalConfig", "user", ("user",), "llm"),
        ("SFTConfig", "thinking_history", ("thinking_history",), "keep"),
        ("SFTConfig", "native_tools", ("native_tools",), False),
    ],
)
def test_the_flat_keys_of_before_set_the_nested_rollout_one_version_with_a_warning(tmp_path, cls, flat, path, value):
    """A command config's flat keys of before it nested one ``rollout`` (issue 30): as a keyword, in a file and with
    ``--set``, each sets the nested field(s) with a DeprecationWarning; the nested key given later wins."""
    import envace.config as config

    klass = getattr(config, cls)

    def nested(cfg):
        out = []
        for p in path:
            v = cfg.rollout
            for part in p.split("."):
                v = getattr(v, part)
            out.append(v)
        return out

    with pytest.warns(DeprecationWarning, match=f"{flat} -> rollout"):
        assert nested(klass(**{flat: value})) == [value] * len(path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({flat: value}))
    with pytest.warns(DeprecationWarning, match=f"{flat} -> rollout"):
        from_file = load_config(klass, str(tmp_path / "c.yaml"))
    assert nested(from_file) == [value] * len(path)
    with pytest.warns(DeprecationWarning):
        assert nested(load_config(klass, None, [f"{flat}={yaml.safe_dump(value).split(chr(10))[0]}"])) == [value] * len(
            path
        )
    default = nested(klass())
    with pytest.warns(DeprecationWarning):  # the file's flat key, then the nested key of --set: the later one wins
        later = load_config(
            klass,
            str(tmp_path / "c.yaml"),
            [f"rollout.{p}={yaml.safe_dump(d).split(chr(10))[0]}" for p, d in zip(path, default)],
        )
    assert nested(later) == default
    other = {k: v for k, v in dataclasses.asdict(klass()).items() if k != "rollout"}
    assert {k: v for k, v in dataclasses.asdict(from_file).items() if k != "rollout"} == other
