"""Evaluation harness: pass^k, tool / call F1 and the aggregate metrics by hand; a gold policy scores perfectly;
test-time rehearsal is reached through the budget; the CLI writes its JSON (run folders: test_run_models.py)."""

import json
import os
import subprocess
import sys

import pytest

from envace.chat.parsing import render_act
from envace.backends.scripted import ScriptedBackend
from envace.evaluation.budget import evaluate_at_budget
from envace.evaluation.tts import TTSConfig
from envace.envs import load_tasks
from envace.evaluation.trials import (
    compare_per_task,
    compare_results,
    evaluate,
    format_metrics,
    pass_hat_k,
    rate_with_ci,
    summarize,
    task_scores,
)
from envace.math.stats import mcnemar_exact, wilson_interval
from envace.rollout.engine import RolloutConfig
from envace.training.sft import GoldTeacher
from envace.core.types import Step, Task, ToolCall, Trajectory


def _traj(calls, reward=0.0, counters=None, tid="t"):
    tr = Trajectory(id=tid, task_id="x", group_id="g", mode="real", reward=reward, counters=counters or {})
    tr.steps = [Step(user_turn=0, action_text="", calls=[c]) for c in calls]
    return tr


def test_pass_hat_k_is_the_chance_that_k_draws_without_replacement_all_succeed():
    s = [True, True, False, False]
    assert pass_hat_k(s, 1) == pytest.approx(0.5)
    assert pass_hat_k(s, 2) == pytest.approx(1 / 6)  # C(2,2) / C(4,2)
    assert pass_hat_k(s, 3) == 0.0
    assert pass_hat_k([True, True, True], 3) == 1.0
    assert pass_hat_k([True, True, True, False], 3) == pytest.approx(1 / 4)  # C(3,3) / C(4,3)
    with pytest.raises(ValueError, match="at least 5 trials"):
        pass_hat_k(s, 5)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_hat_k(s, 0)


def test_task_scores_average_tool_and_call_prf_over_the_trials():
    task = Task(
        id="x",
        env="bank",
        system_prompt="",
        user_turns=["u"],
        tools=[],
        gold_actions=[
            [
                ToolCall("get_balance", {"account": "a"}),
                ToolCall("transfer", {"from_account": "a", "to_account": "b", "amount": 5}),
            ]
        ],
    )
    t1 = _traj([ToolCall("get_balance", {"account": "a"}), ToolCall("get_balance", {"account": "b"})], reward=1.0)
    t2 = _traj([], reward=0.0)
    s = task_scores(task, [t1, t2])
    # t1: names {get_balance} vs {get_balance, transfer}: P=1, R=1/2, F1=2/3;
    #     calls: 1 of 2 right each way: 1/2, 1/2, 1/2
    # t2: no calls vs gold -> 0, 0, 0
    assert s["successes"] == [True, False]
    assert (
        s["tool_precision"] == pytest.approx(0.5)
        and s["tool_recall"] == pytest.approx(0.25)
        and s["tool_f1"] == pytest.approx(1 / 3)
    )
    assert (
        s["call_precision"] == pytest.approx(0.25)
        and s["call_recall"] == pytest.approx(0.25)
        and s["call_f1"] == pytest.approx(0.25)
    )
    assert s["domain"] == "bank" and s["steps"] == 1.0


def test_summarize_aggregates_success_pass_k_format_and_domains_by_hand():
    per_task = [
        {
            "task_id": "a",
            "domain": "bank",
            "successes": [True, False],
            "tool_precision": 1.0,
            "tool_recall": 0.5,
            "tool_f1": 2 / 3,
            "call_precision": 0.5,
            "call_recall": 0.5,
            "call_f1": 0.5,
        },
        {
            "task_id": "b",
            "domain": "shop",
            "successes": [True, True],
            "tool_precision": 0.0,
            "tool_recall": 0.0,
            "tool_f1": 0.0,
            "call_precision": 0.0,
            "call_recall": 0.0,
            "call_f1": 0.0,
        },
    ]
    trajs = [
        _traj([ToolCall("f")], counters={"act/steps": 3, "act/parse_errors": 1, "act/tool_calls": 1}, tid="1"),
        _traj([], counters={"act/steps": 1}, tid="2"),
        _traj([], counters={"act/steps": 0}, tid="3"),
        _traj([], counters={}, tid="4"),
    ]
    trajs[1].truncated = "max_steps"
    m = summarize(per_task, trajs, samples=2, wall_s=1.5)
    assert m["success_rate"] == pytest.approx(0.75)
    assert m["pass^1"] == pytest.approx(0.75) and m["pass^2"] == pytest.approx(0.5)  # (C(1,2)=0 + 1) / 2
    assert (
        m["tool_f1"] == pytest.approx(1 / 3)
        and m["tool_recall"] == pytest.approx(0.25)
        and m["call_f1"] == pytest.approx(0.25)
    )
    assert m["format_valid_rate"] == pytest.approx(0.75)  # 1 parse error in 4 Act generations
    assert m["tool_calls_per_traj"] == pytest.approx(0.25) and m["truncated_rate"] == pytest.approx(0.25)
    assert m["domain/bank/success_rate"] == 0.5 and m["domain/shop/success_rate"] == 1.0 and m["wall_s"] == 1.5
    text = format_metrics(m)
    assert (
        text.splitlines()[0].startswith("success_rate")
        and text.splitlines()[1].startswith("pass^1")
        and text.splitlines()[2].startswith("pass^2")
    )
    # intervals over the 2 tasks (per-task means 1/2 and 1), printed next to each rate and not as rows of their own
    assert (m["success_rate/ci_lo"], m["success_rate/ci_hi"]) == pytest.approx(wilson_interval(1.5, 2))
    assert (m["domain/shop/success_rate/ci_lo"], m["domain/shop/success_rate/ci_hi"]) == pytest.approx(
        wilson_interval(1, 1)
    )
    assert "success_rate" in text and "0.750 [" in text.splitlines()[0] and "95% CI" in text.splitlines()[0]
    assert (
        "ci_lo" not in text
        and m["n_tasks"] == 2
        and rate_with_ci(m) == "0.750 [{:.3f}, {:.3f}]".format(*wilson_interval(1.5, 2))
    )


def test_tasks_cluster_by_template_from_their_rows_or_their_built_in_ids_else_each_alone():
    from envace.envs.builtin import task_from_id
    from envace.evaluation.results import task_clusters

    ids = [f"shop-world-decide-test-{i:06d}" for i in range(6)]
    kind, names = task_clusters([{"task_id": t} for t in ids])  # results written before rows kept the template
    assert kind == "templates" and names == [task_from_id(t).metadata["template"] for t in ids]
    assert len(set(names)) >= 2
    rows = [{"task_id": "a", "template": "t1"}, {"task_id": "b", "template": "t2"}, {"task_id": "c", "template": "t1"}]
    assert task_clusters(rows) == ("templates", ["t1", "t2", "t1"])
    # one template only, or a task of another environment without one: every task its own cluster
    assert task_clusters(rows[:1] + rows[2:]) == ("tasks", ["a", "c"])
    assert task_clusters([{"task_id": "bfcl-multi_turn_base-3"}, rows[0]]) == ("tasks", ["bfcl-multi_turn_base-3", "a"])


def test_results_are_broken_down_by_task_kind_when_tasks_carry_one():
    task = Task(
        id="x",
        env="bank",
        system_prompt="",
        user_turns=["u"],
        tools=[],
        gold_actions=[[ToolCall("get_balance", {"account": "a"})]],
        metadata={"kind": "lookup"},
    )
    assert task_scores(task, [_traj([], reward=1.0)])["kind"] == "lookup"
    task.metadata["template"] = "balance_question"
    assert task_scores(task, [_traj([])])["template"] == "balance_question"  # the claims' clusters
    assert "kind" not in task_scores(
        Task(id="y", env="bank", system_prompt="", user_turns=["u"], tools=[]), [_traj([])]
    )
    rows = [
        {
            "task_id": t,
            "domain": "bank",
            "kind": k,
            "successes": [s],
            **{f"{a}_{b}": 0.0 for a in ("tool", "call") for b in ("precision", "recall", "f1")},
        }
        for t, k, s in (("a", "lookup", True), ("b", "lookup", False), ("c", "recovery", True), ("d", "report", False))
    ]
    m = summarize(rows, [_traj([], tid=str(i)) for i in range(4)], samples=1)
    assert (
        m["kind/lookup/success_rate"] == 0.5
        and m["kind/recovery/success_rate"] == 1.0
        and m["kind/report/success_rate"] == 0.0
    )
    assert (m["kind/lookup/success_rate/ci_lo"], m["kind/lookup/success_rate/ci_hi"]) == pytest.approx(
        wilson_interval(1, 2)
    )


def test_a_gold_policy_succeeds_everywhere_in_the_real_environment(tokenizer):
    tasks = load_tasks("bank", "test", n=3)
    res = evaluate(
        GoldTeacher(tokenizer, tasks), tasks, samples=2, rollout=RolloutConfig(max_steps=12, max_steps_per_turn=8)
    )
    m = res.metrics
    for key in (
        "success_rate",
        "pass^1",
        "pass^2",
        "tool_f1",
        "tool_precision",
        "tool_recall",
        "call_f1",
        "format_valid_rate",
    ):
        assert m[key] == 1.0, key
    assert (
        m["truncated_rate"] == 0.0
        and m["act_tokens_per_traj"] > 0
        and m["context_tokens_per_traj"] > m["act_tokens_per_traj"]
    )
    assert [t.task_id for t in res.trajectories] == [t.id for t in tasks for _ in range(2)]  # task by task, K each
    assert all(t.mode == "real" and t.reward == 1.0 for t in res.trajectories)
    d = json.loads(json.dumps(res.to_dict(with_trajectories=True)))
    assert (
        d["per_task"][0]["successes"] == [True, True]
        and d["split"] == "test"
        and d["task_ids"] == [t.id for t in tasks]
    )


def test_a_rehearsal_budget_runs_private_attempts_and_shows_the_memory_to_the_real_run(tokenizer):
    tasks = load_tasks("bank", "test", n=2)
    be = ScriptedBackend(tokenizer, lambda prompt: "All done.")
    rc = RolloutConfig(max_steps=3, max_steps_per_turn=2)
    plain = evaluate_at_budget(be, tasks, rollout=rc, n=0)
    assert plain.metrics["tts/n"] == 0.0 and "Notes from private rehearsal" not in "".join(be.prompts)
    be.prompts.clear()
    res = evaluate_at_budget(be, tasks, rollout=rc, n=1, mode="sequential", tts=TTSConfig(memory="concat"))
    assert res.metrics["tts/n"] == 1.0 and res.metrics["gen_tokens_per_task"] > plain.metrics["gen_tokens_per_task"]
    assert all(t.mode == "real" for t in res.trajectories) and len(res.trajectories) == 2
    assert any("Notes from private rehearsal" in p for p in be.prompts)
    with pytest.raises(ValueError):
        evaluate_at_budget(be, tasks, rollout=rc, n=-1)


def test_eval_cli_writes_metrics_and_per_task_json(tmp_path):
    out = tmp_path / "eval.json"
    cmd = [
        sys.executable,
        "-m",
        "envace.cli",
        "eval",
        "--model",
        "tiny-random",
        "--suite",
        "bank",
        "-n",
        "2",
        "--samples",
        "2",
        "--max-steps",
        "1",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
        "--trajectories",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "success_rate" in p.stdout and "pass^2" in p.stdout
    d = json.loads(out.read_text())
    assert set(d) == {"config", "suite", "split", "task_ids", "metrics", "per_task", "trajectories"}
    assert d["suite"] == "bank" and d["split"] == "test" and d["task_ids"] == [r["task_id"] for r in d["per_task"]]
    assert [len(r["successes"]) for r in d["per_task"]] == [2, 2] and "success_rate/ci_lo" in d["metrics"]
    assert len(d["per_task"]) == 2 and len(d["trajectories"]) == 4 and d["config"]["samples"] == 2
    for key in (
        "success_rate",
        "pass^1",
        "pass^2",
        "tool_f1",
        "tool_precision",
        "tool_recall",
        "call_f1",
        "format_valid_rate",
        "steps_per_traj",
        "act_tokens_per_traj",
        "wall_s",
    ):
        assert key in d["metrics"], key


# --------------------------------------------------------------------------------------------------------
# envace compare: paired comparison of two saved results
# --------------------------------------------------------------------------------------------------------


def _saved(outcomes, split="test", suite="bank", kinds=None, prefix="bank-test-"):
    rows = [
        {
            "task_id": f"{prefix}{i:06d}",
            "domain": "bank",
            "successes": [bool(x) for x in (o if isinstance(o, list) else [o])],
        }
        | ({"kind": kinds[i]} if kinds else {})
        for i, o in enumerate(outcomes)
    ]
    return {
        "config": {"suite": suite, "split": split},
        "suite": suite,
        "split": split,
        "task_ids": [r["task_id"] for r in rows],
        "metrics": {},
        "per_task": rows,
    }


def _compare_cli(*args):
    cmd = [sys.executable, "-m", "envace.cli", "compare", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_compare_cli_prints_the_paired_table_and_its_json(tmp_path):
    kinds = ["lookup", "recovery"] * 6
    a = [1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]  # 3 / 12
    b = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 0]  # 8 / 12: b wins 5 tasks, a wins none
    (tmp_path / "a.json").write_text(json.dumps(_saved(a, kinds=kinds)))
    (tmp_path / "b.json").write_text(json.dumps(_saved(b, kinds=kinds)))
    p = _compare_cli(tmp_path / "a.json", tmp_path / "b.json")
    assert p.returncode == 0, p.stderr
    head, overall = p.stdout.splitlines()[1:3]
    assert "A success [95% CI]" in head and "paired 95% CI" in head
    cells = overall.split()
    assert cells[:2] == ["overall", "12"] and "0.250" in overall and "0.667" in overall and "+0.417" in overall
    assert f"{mcnemar_exact(a, b):.3g}" in overall  # 2 / 2^5
    assert "kind/lookup" in p.stdout and "kind/recovery" in p.stdout and "exact McNemar" in p.stdout
    text = p.stdout
    p = _compare_cli(tmp_path / "a.json", tmp_path / "b.json", "--json")
    c = json.loads(p.stdout)
    assert (
        c["n_tasks"] == 12
        and c["overall"]["p"] == pytest.approx(2 / 2**5)
        and c["overall"]["p_method"] == "mcnemar_exact"
    )
    assert c["overall"]["a"]["ci95"] == pytest.approx(list(wilson_interval(3, 12))) and c["overall"][
        "diff"
    ] == pytest.approx(5 / 12)
    lo, hi = c["overall"]["diff_ci95"]
    assert (
        0 < lo < 5 / 12 < hi and set(c["by_kind"]) == {"lookup", "recovery"} and c["by_kind"]["lookup"]["n_tasks"] == 6
    )
    assert c == json.loads(_compare_cli(tmp_path / "a.json", tmp_path / "b.json", "--json").stdout)  # seeded
    # the bank tasks' templates, rebuilt from their ids: the interval for another draw of templates too
    n = c["overall"]["n_templates"]
    assert n >= 2 and f"whole templates resampled ({n} templates" in text
    tlo, thi = c["overall"]["diff_ci95_templates"]
    assert tlo <= 5 / 12 <= thi


def test_compare_resamples_whole_templates_where_outcomes_move_together_by_template():
    # B solves every task of templates t0-t2 and none of t3, A none: over tasks a sure gain, over templates not
    rows = lambda succ: [  # noqa: E731
        {"task_id": f"x{i}", "template": f"t{i % 4}", "successes": [succ(i)]} for i in range(40)
    ]
    c = compare_per_task(rows(lambda i: False), rows(lambda i: i % 4 != 3))["overall"]
    assert c["diff"] == pytest.approx(0.75) and c["diff_ci95"][0] > 0.5
    assert c["n_templates"] == 4 and c["diff_ci95_templates"][0] <= 0.5 <= c["diff_ci95"][0]
    plain = [{"task_id": f"x{i}", "successes": [i % 2 == 0]} for i in range(10)]  # no template: tasks only
    assert "diff_ci95_templates" not in compare_per_task(plain, plain)["overall"]


def test_compare_with_several_samples_pairs_the_per_task_means():
    a = _saved([[1, 0], [0, 0], [1, 1]])
    b = _saved([[1, 1], [1, 0], [1, 1]])
    c = compare_results(a, b)["overall"]
    assert (
        c["p_method"] == "sign_flip" and c["diff"] == pytest.approx(1 / 3) and c["p"] == pytest.approx(2 / 4)
    )  # 2 non-zero, equal


def test_compare_refuses_other_task_sets_splits_and_suites(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_saved([1] * 10)))
    other = _saved([1] * 10)
    other["per_task"] = other["per_task"][:7] + [
        {"task_id": f"bank-test-9{i:05d}", "successes": [True]} for i in range(4)
    ]
    (tmp_path / "b.json").write_text(json.dumps(other))
    p = _compare_cli(tmp_path / "a.json", tmp_path / "b.json")
    assert p.returncode == 2 and p.stdout == ""
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1 and "different task sets" in err and "7 task ids differ" in err
    assert "3 only in" in err and "bank-test-000007" in err and "4 only in" in err and "bank-test-900000" in err
    with pytest.raises(ValueError, match="different splits: A is 'test', B is 'test_ood'"):
        compare_results(_saved([1, 0]), _saved([1, 0], split="test_ood"))
    with pytest.raises(ValueError, match="different suites"):
        compare_results(_saved([1, 0]), _saved([1, 0], suite="shop"))
    (tmp_path / "x.json").write_text(json.dumps({"metrics": {}}))
    p = _compare_cli(tmp_path / "a.json", tmp_path / "x.json")
    assert p.returncode == 2 and "not a saved evaluation result" in p.stderr


EVAL_CALLS: dict[str, list[str]] = {}  # task id -> every Environment.call on an environment made for it


def _counting_bank(task):
    from envace.envs import ENVS

    env = ENVS.get("bank")(task)
    inner = env.call
    env.call = lambda c: EVAL_CALLS.setdefault(task.id, []).append(c.key()) or inner(c)
    return env


def test_evaluation_scores_each_trial_from_its_own_run_and_executes_every_call_once(tokenizer):
    """The real trials' calls run once each; success comes from the environment they ran in (no replay)."""
    from envace.envs import ENVS, make_env

    make_env(load_tasks("bank", "train", n=1)[0])  # registers the built-in environments
    if "eval_count" not in ENVS:
        ENVS.add("eval_count", _counting_bank)
    tasks = [t for t in load_tasks("bank", "test", n=30) if len(t.user_turns) == 1 and len(t.flat_gold()) >= 2][:3]
    assert len(tasks) == 3
    for t in tasks:
        t.env = "eval_count"
    by_user = {t.user_turns[0]: t for t in tasks}

    def gold(prompt):  # the gold calls one per step, then the gold reply
        task = next(t for u, t in by_user.items() if u in prompt)
        n = prompt.count("<|im_start|>tool")
        return render_act([task.flat_gold()[n]]) if n < len(task.flat_gold()) else task.gold_replies[0] or "Done."

    EVAL_CALLS.clear()
    res = evaluate(
        ScriptedBackend(tokenizer, gold), tasks, samples=2, rollout=RolloutConfig(max_steps=12, max_steps_per_turn=8)
    )
    assert res.metrics["success_rate"] == 1.0
    for task in tasks:
        assert sorted(EVAL_CALLS[task.id]) == sorted(
            [c.key() for c in task.flat_gold()] * 2
        )  # two trials (interleaved), every call once
    assert all(t.reward_info["scored_in"] == "rollout" and t.reward_info["n_replayed"] == 0 for t in res.trajectories)


def test_tts_options_dict_still_works_one_version_with_a_warning_and_equals_the_typed_config(tokenizer):
    from envace.evaluation.budget import _tts_config

    with pytest.warns(DeprecationWarning, match="tts=TTSConfig"):
        old = _tts_config(None, {"memory": "concat", "memory_max_tokens": 64})
    assert old == TTSConfig(memory="concat", memory_max_tokens=64)
    assert _tts_config(None, None) == TTSConfig()
    with pytest.raises(ValueError, match="not both"), pytest.warns(DeprecationWarning):
        _tts_config(TTSConfig(), {"memory": "concat"})
