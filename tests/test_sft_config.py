"""SFTConfig nests one ``rollout`` (issue 30): the gold chats' format (chat and tool formats, native tools, thinking,
thinking history) is read from ``SFTConfig.rollout``; the flat keys of before are read for one version, with a
DeprecationWarning, from keywords, a config file (a run's saved config of the older version) and ``--set``."""

import dataclasses
import json
import warnings

import pytest
import yaml

from envace.backends.base import SamplingParams
from envace.cli import main
from envace.config import SFTConfig, load_config, to_dict
from envace.envs import load_tasks
from envace.rollout.engine import RolloutConfig, rehearse_sampling
from envace.training.sft import chat_io, gold_trajectories, lesson_rollout

FORMATS = {
    "chat_format": "chatml",
    "tool_format": "llama3_json",
    "native_tools": False,
    "thinking": False,
    "thinking_history": "strip",
}
"""The gold chats' format, none of it the default."""


def _ids(tok, cfg: SFTConfig) -> list[tuple[list[int], list[int]]]:
    tasks = load_tasks("bank", "train", n=2)
    return [
        (r.prompt_ids, r.completion_ids) for t in gold_trajectories(tok, tasks, **chat_io(cfg.rollout)) for r in t.rows
    ]


def test_an_old_sft_config_with_flat_keys_loads_into_the_nested_rollout_with_a_warning(tmp_path, tokenizer, capsys):
    nested = SFTConfig(suite="bank", rollout=dataclasses.replace(SFTConfig().rollout, **FORMATS))
    old = {k: v for k, v in to_dict(SFTConfig(suite="bank")).items() if k != "rollout"} | FORMATS  # as saved before
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.warns(DeprecationWarning, match="chat_format -> rollout.chat_format"):
        from_file = load_config(SFTConfig, str(path))
    with pytest.warns(DeprecationWarning, match="thinking_history -> rollout.thinking_history"):
        from_keywords = SFTConfig(**old)
    with pytest.warns(DeprecationWarning, match="tool_format -> rollout.tool_format"):
        from_sets = load_config(
            SFTConfig, None, ["suite=bank"] + [f"{k}={yaml.safe_dump(v).split()[0]}" for k, v in FORMATS.items()]
        )
    assert from_file == from_keywords == from_sets == nested
    assert {k: getattr(nested.rollout, k) for k in FORMATS} == FORMATS
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the nested form and its saved copy: no warning
        assert (
            load_config(
                SFTConfig,
                None,
                [f"rollout.{k}={yaml.safe_dump(v).split()[0]}" for k, v in FORMATS.items()] + ["suite=bank"],
            )
            == nested
        )
        path.write_text(yaml.safe_dump(to_dict(nested)))
        assert load_config(SFTConfig, str(path)) == nested
    gold = _ids(tokenizer, from_file)
    assert gold == _ids(tokenizer, nested) and gold != _ids(tokenizer, SFTConfig(suite="bank"))

    with pytest.warns(DeprecationWarning, match="tool_format -> rollout.tool_format"):  # the command line too
        assert main(["sft", "--set", "tool_format=llama3_json", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["rollout"]["tool_format"] == "llama3_json" and "tool_format" not in printed


def test_the_rehearsed_attempts_of_memory_attempts_roll_out_as_before():
    """``SFTConfig.rollout``'s defaults are the attempts' rollout of before (4 steps of 96 new tokens, Act at T=1)."""
    before = RolloutConfig(
        max_steps=4,
        act=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=96),
        rehearse=rehearse_sampling(96),
        progress=True,
    )
    assert lesson_rollout(SFTConfig()) == before
    assert lesson_rollout(SFTConfig(progress=False)) == dataclasses.replace(before, progress=False)
    quiet = SFTConfig(rollout=dataclasses.replace(SFTConfig().rollout, progress=False, tool_format="mistral"))
    assert lesson_rollout(quiet) == dataclasses.replace(before, progress=False, tool_format="mistral")


def test_a_warmup_saved_with_the_flat_keys_of_before_is_the_same_warmup():
    """The demo reuses a finished warm-up whose checkpoint holds the config an earlier version wrote (flat
    chat_format, tool_format, ...), and still refuses one trained with another setting."""
    from envace.config import to_dict
    from envace.evaluation.demo import demo_sft_config, same_config

    cfg = demo_sft_config("tiny-random", "shop-world", "runs/x", quick=True)
    saved = json.loads(json.dumps(to_dict(cfg), default=str))
    del saved["rollout"]
    saved |= {"chat_format": None, "tool_format": None, "native_tools": True, "thinking": None}
    saved["thinking_history"] = None
    assert same_config(saved, cfg)
    assert not same_config({**saved, "lr": cfg.lr * 2}, cfg)
    assert not same_config({**saved, "tool_format": "mistral"}, cfg)
    assert not same_config({**saved, "no_such_field": 1}, cfg) and not same_config(None, cfg)
