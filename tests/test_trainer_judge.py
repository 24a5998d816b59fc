"""`reward: checklist_judge` from `envace train`: the judge is a live `envace serve` (started here on 127.0.0.1),
the policy itself, or a local model; a verdict the tiny random judge cannot give is unscored, masked and counted."""

import json
import os

import pytest

from envace.config import TrainConfig, load_config
from envace.core.logging import read_metrics
from envace.training.trainer import train
from servers import envace_serve
from tiny import tiny_train_config

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    """``envace serve --model tiny-random --port 0 --verbose`` in a subprocess: (its /v1 URL, its request log)."""
    log = tmp_path_factory.mktemp("serve") / "requests.log"
    env = os.environ | {"PYTHONPATH": SRC}
    with open(log, "w") as err, envace_serve("--model", "tiny-random", "--verbose", stderr=err, env=env) as url:
        yield url, log


def _cfg(out, **kw):
    judged = {"batch_tasks": 2, "n_train_tasks": 4, "reward": "checklist_judge", "judge_max_new_tokens": 24}
    return tiny_train_config(out, **(judged | kw))


def _judged(out) -> list[dict]:
    """The checklist_judge info of every trajectory of the run."""
    with open(os.path.join(out, "trajectories.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    return [r["reward_info"]["checklist_judge"] for r in recs]


def _check_masked_and_counted(out, n_trajs: int) -> list[dict]:
    infos = _judged(out)
    assert len(infos) == n_trajs
    # every trajectory got an answer from the judge: a verdict, or text it could not parse (never a backend failure)
    assert all("items" in i or isinstance(i.get("judge_raw"), str) for i in infos), infos
    assert not any("BackendError" in i.get("judge_error", "") for i in infos)
    m = read_metrics(str(out))[-1]
    assert m["step"] == 1 and m["reward/unscored"] == sum("judge_error" in i for i in infos)
    return infos


def test_train_with_checklist_judge_behind_a_live_server(tmp_path, judge_server):
    url, log = judge_server
    before = log.read_text().count("POST /v1/chat/completions")
    res = train(_cfg(tmp_path / "served", judge=url))
    assert res.step == 1
    infos = _check_masked_and_counted(res.out_dir, 4)
    assert (
        sum("judge_error" in i for i in infos) >= 1
    )  # the tiny random judge cannot give a verdict: unscored, not a crash
    assert log.read_text().count("POST /v1/chat/completions") - before == 4  # one verdict asked per trajectory


@pytest.mark.parametrize("judge", ["policy", "tiny-random"])
def test_train_with_checklist_judge_by_the_policy_or_a_local_model(tmp_path, judge):
    res = train(_cfg(tmp_path / judge, judge=judge, batch_tasks=1))
    assert res.step == 1
    _check_masked_and_counted(res.out_dir, 2)


def test_checklist_judge_without_a_judge_is_refused_before_any_rollout(tmp_path):
    with pytest.raises(ValueError, match="needs a judge: set judge to policy"):
        train(_cfg(tmp_path / "none", reward={"gold_f1": 0.5, "checklist_judge": 0.5}))
    assert not os.path.exists(tmp_path / "none" / "trajectories.jsonl")


def test_judge_settings_come_from_the_command_line():
    cfg = load_config(
        TrainConfig,
        None,
        ["reward=checklist_judge", "judge=http://127.0.0.1:9/v1", "judge_max_new_tokens=64", "judge_temperature=0.5"],
    )
    assert (cfg.judge, cfg.judge_max_new_tokens, cfg.judge_temperature) == ("http://127.0.0.1:9/v1", 64, 0.5)
