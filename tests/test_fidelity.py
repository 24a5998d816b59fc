"""Rehearsal fidelity: the pure metrics by hand, pair collection and aggregation, and shadow rollouts with a
perfect and a corrupted rehearser."""

import json
import os
import subprocess
import sys

import pytest

from envace.backends.scripted import ScriptedBackend
from envace.envs import load_tasks
from envace.evaluation.fidelity import (
    BREAKDOWNS,
    METRICS,
    FidelityPair,
    aggregate,
    collect_pairs,
    format_fidelity,
    keys_match,
    leaf_accuracy,
    leaf_paths,
    TEACHER_FORCED_SOURCE,
    mean_nll,
    measure_fidelity,
    measure_teacher_forced,
    teacher_forced_pairs,
    mismatched_leaves,
    observation_fidelity,
    path_str,
)
from envace.chat.parsing import format_observation
from envace.rollout.engine import RolloutConfig, changed_fields
from envace.training.sft import GoldTeacher
from envace.core.types import Step, Task, ToolCall, Trajectory, error_obs

REAL = {"account": "rent", "balance": "10.00", "frozen": False}


def test_leaf_paths_flatten_objects_and_arrays_and_keep_empty_containers():
    obj = {"a": 1, "b": {"c": [1, {"d": None}], "e": {}}, "f": []}
    assert leaf_paths(obj) == {("a",): 1, ("b", "c", 0): 1, ("b", "c", 1, "d"): None, ("b", "e"): {}, ("f",): []}
    assert leaf_paths(5) == {(): 5} and leaf_paths({}) == {(): {}} and leaf_paths([]) == {(): []}
    assert path_str(("b", "c", 1, "d")) == "b.c[1].d" and path_str(()) == "$" and path_str((0, "x")) == "[0].x"


def test_an_exact_rehearsal_scores_one_everywhere():
    assert observation_fidelity(dict(REAL), REAL) == {k: 1.0 for k in METRICS}


def test_a_wrong_value_costs_exact_match_and_its_share_of_leaves():
    s = observation_fidelity({"account": "rent", "balance": "12.00", "frozen": False}, REAL)
    assert s == {"valid": 1.0, "exact": 0.0, "keys": 1.0, "leaf_acc": pytest.approx(2 / 3), "outcome": 1.0}


def test_an_extra_key_breaks_the_key_set_but_not_leaf_accuracy_over_the_real_leaves():
    s = observation_fidelity({**REAL, "currency": "USD"}, REAL)
    assert s["keys"] == 0.0 and s["leaf_acc"] == 1.0 and s["exact"] == 0.0
    assert observation_fidelity({"account": "rent"}, REAL)["leaf_acc"] == pytest.approx(1 / 3)


def test_error_versus_success_disagree_and_two_errors_agree():
    err = error_obs("tool_error", "insufficient funds")
    s = observation_fidelity(err, REAL)
    assert s == {"valid": 1.0, "exact": 0.0, "keys": 0.0, "leaf_acc": 0.0, "outcome": 0.0}
    s = observation_fidelity(error_obs("tool_error", "no such account"), err)
    assert (
        s["outcome"] == 1.0 and s["keys"] == 1.0 and s["leaf_acc"] == 0.5 and s["exact"] == 0.0
    )  # kind right, message wrong
    assert observation_fidelity(REAL, err)["outcome"] == 0.0


def test_an_unparsable_rehearsal_is_invalid_and_reproduces_nothing():
    bad = error_obs("bad_format", "rehearsed output has no <observation> block")
    assert observation_fidelity(bad, REAL) == {k: 0.0 for k in METRICS}
    assert observation_fidelity(bad, error_obs("bad_arguments", "x")) == {k: 0.0 for k in METRICS}


def test_values_compare_as_canonical_json_and_non_objects_by_type():
    assert observation_fidelity({"n": 1.0}, {"n": 1})["exact"] == 0.0  # the project's canonical rule: 1 != 1.0
    assert (
        observation_fidelity({"b": 2, "a": [1, 2]}, {"a": [1, 2], "b": 2})["exact"] == 1.0
    )  # key order does not matter
    assert keys_match([1], [2, 3]) and not keys_match([1], "x") and not keys_match({"a": 1}, [1])
    assert leaf_accuracy([1, 2, 3], [1, 5]) == 0.5


def test_mismatched_leaves_name_the_wrong_and_the_missing_paths():
    bad_r, bad_t = mismatched_leaves({"account": "rent", "balance": "12.00", "extra": 1}, REAL)
    assert bad_r == {("balance",), ("extra",)} and bad_t == {("balance",), ("frozen",)}


def _pair(domain, tool, scores):
    return FidelityPair("t", "tr", domain, tool, 0, 0, "rehearsed", None, None, scores)


def test_aggregate_averages_overall_per_domain_and_per_tool():
    one = {k: 1.0 for k in METRICS}
    zero = {k: 0.0 for k in METRICS}
    half = dict(one, exact=0.0, leaf_acc=0.5)
    pairs = [_pair("bank", "get_balance", one), _pair("bank", "get_balance", zero), _pair("shop", "get_balance", half)]
    agg = aggregate(pairs)
    assert (
        agg["overall"]["n"] == 3
        and agg["overall"]["exact"] == pytest.approx(1 / 3)
        and agg["overall"]["leaf_acc"] == pytest.approx(0.5)
    )
    assert agg["overall"]["valid"] == pytest.approx(2 / 3)
    assert agg["by_domain"]["bank"]["exact"] == 0.5 and agg["by_domain"]["shop"]["leaf_acc"] == 0.5
    assert set(agg["by_tool"]) == {"bank/get_balance", "shop/get_balance"}  # same tool name, two domains
    assert aggregate([])["overall"] == {"n": 0.0, **{k: 0.0 for k in METRICS}}
    assert "bank/get_balance" in format_fidelity(agg)


def test_collect_pairs_scores_model_made_observations_and_counts_the_rest():
    task = Task(id="x", env="bank", system_prompt="", user_turns=["u"], tools=[])
    step = Step(
        user_turn=0,
        action_text="",
        calls=[
            ToolCall("get_balance", {"account": "rent"}),
            ToolCall("a"),
            ToolCall("b"),
            ToolCall("c"),
            ToolCall("d"),
        ],
        observations=[dict(REAL), {"cached": 1}, error_obs("unknown_tool", "a"), {"x": 1}, {"y": 1}],
        sources=["rehearsed", "cache", "validation", "rehearsed", "simulator"],
        shadow=[REAL, {"cached": 1}, None, None, {"y": 2}],
    )
    tr = Trajectory(id="tr", task_id="x", group_id="g", mode="rehearsal", steps=[step])
    pairs, skipped = collect_pairs([tr], [task])
    assert skipped == {"n_cache": 1, "n_validation": 1, "n_no_shadow": 1}
    assert [(p.tool, p.source, p.scores["exact"]) for p in pairs] == [
        ("get_balance", "rehearsed", 1.0),
        ("d", "simulator", 0.0),
    ]
    assert pairs[0].domain == "bank" and json.loads(json.dumps(pairs[0].to_dict()))["real"] == REAL


class WrongBalances(GoldTeacher):
    """Plays the gold script, but every rehearsed balance is wrong and the first observation is garbage."""

    def _script(self, task):
        acts, obs = super()._script(task)
        out = []
        for i, text in enumerate(obs):
            o = json.loads(text[len("<observation>") : -len("</observation>")])
            if isinstance(o, dict) and "balance" in o:
                o["balance"] = "999.99"
            out.append("not an observation" if i == 0 else format_observation(o))
        return acts, out


def _cfg(**kw):
    return RolloutConfig(max_steps=12, max_steps_per_turn=8, **kw)


def test_a_rehearser_that_returns_the_real_observations_has_perfect_fidelity(tokenizer):
    tasks = load_tasks("bank", "test", n=3)
    res = measure_fidelity(GoldTeacher(tokenizer, tasks), tasks, _cfg(), group_size=1)
    n_gold = sum(len(t.flat_gold()) for t in tasks)
    assert res.summary["overall"] == {"n": float(n_gold), **{k: 1.0 for k in METRICS}}
    assert set(res.summary["by_domain"]) == {"bank"} and all(k.startswith("bank/") for k in res.summary["by_tool"])
    assert all(s.shadow == s.observations for t in res.trajectories for s in t.steps)
    assert res.summary["skipped"] == {"n_cache": 0, "n_validation": 0, "n_no_shadow": 0}


def test_a_corrupted_rehearser_loses_exactly_what_it_got_wrong(tokenizer):
    tasks = load_tasks("bank", "test", n=3)
    res = measure_fidelity(WrongBalances(tokenizer, tasks), tasks, _cfg(), group_size=1)
    pairs = res.pairs
    firsts = [p for p in pairs if p.step == 0 and p.index == 0]
    assert len(firsts) == 3 and all(p.scores == {k: 0.0 for k in METRICS} for p in firsts)  # garbage -> invalid
    for p in pairs:
        if p in firsts:
            continue
        has_balance = isinstance(p.real, dict) and "balance" in p.real
        assert p.scores["valid"] == 1.0 and p.scores["keys"] == 1.0 and p.scores["outcome"] == 1.0
        assert p.scores["exact"] == (0.0 if has_balance else 1.0)
        if has_balance:
            assert p.scores["leaf_acc"] == pytest.approx(1 - 1 / len(leaf_paths(p.real)))
    assert res.summary["overall"]["valid"] == pytest.approx(1 - 3 / len(pairs))


def test_code_validation_answers_are_counted_not_scored_and_real_mode_is_refused(tokenizer):
    tasks = load_tasks("bank", "test", n=1)

    def respond(prompt):
        return (
            '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'
            if "<|im_start|>tool" not in prompt
            else "Done."
        )

    res = measure_fidelity(ScriptedBackend(tokenizer, respond), tasks, _cfg(validate_in_code=True), group_size=1)
    assert res.pairs == [] and res.summary["skipped"]["n_validation"] == 1 and res.summary["overall"]["n"] == 0
    with pytest.raises(ValueError, match="rehearsed observations"):
        measure_fidelity(ScriptedBackend(tokenizer, respond), tasks, RolloutConfig(), mode="real")


def test_fidelity_cli_prints_the_table_and_writes_pairs_and_trajectories(tmp_path):
    out = tmp_path / "fid.json"
    cmd = [
        sys.executable,
        "-m",
        "envace.cli",
        "fidelity",
        "--model",
        "tiny-random",
        "--suite",
        "bank",
        "-n",
        "1",
        "-k",
        "1",
        "--max-steps",
        "1",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "leaf_acc" in p.stdout and "overall" in p.stdout
    d = json.loads(out.read_text())
    assert set(d) == {"summary", "pairs", "trajectories"} and len(d["trajectories"]) == 1
    assert set(d["summary"]) == {"overall", "by_domain", "by_tool", "skipped", "pair_scores", *BREAKDOWNS}
    assert d["summary"]["pair_scores"]["leaf_acc"] == [p["scores"]["leaf_acc"] for p in d["pairs"]]


# --------------------------------------------------------------------------------------------------------
# Where rehearsal fails: read vs write, real success vs error, position
# --------------------------------------------------------------------------------------------------------


def test_changed_fields_names_the_top_level_state_fields_that_differ():
    before = {"accounts": {"a": 1}, "transactions": [], "next_txn": 1}
    assert changed_fields(before, before) == []
    assert changed_fields(before, {"accounts": {"a": 2}, "transactions": [1], "next_txn": 1}) == [
        "accounts",
        "transactions",
    ]
    assert changed_fields({"x": 1}, {"y": 1}) == ["x", "y"]  # a removed and an added field


def test_breakdowns_put_each_pair_in_one_bucket_by_hand():
    one, zero = {k: 1.0 for k in METRICS}, {k: 0.0 for k in METRICS}
    err = error_obs("tool_error", "insufficient funds")
    pairs = [
        FidelityPair("t", "tr", "bank", "get_balance", 0, 0, "rehearsed", None, REAL, one, []),
        FidelityPair(
            "t", "tr", "bank", "freeze_account", 1, 0, "rehearsed", None, {"frozen": True}, zero, ["accounts"]
        ),
        FidelityPair(
            "t",
            "tr",
            "bank",
            "transfer",
            2,
            0,
            "rehearsed",
            None,
            {"ok": 1},
            zero,
            ["accounts", "next_txn", "transactions"],
        ),
        FidelityPair("t", "tr", "bank", "transfer", 5, 1, "rehearsed", None, err, one, []),
        FidelityPair(
            "t", "tr", "bank", "get_balance", 1, 1, "rehearsed", None, REAL, one
        ),  # recorded without state changes
    ]
    agg = aggregate(pairs)
    assert {k: v["n"] for k, v in agg["by_state"].items()} == {"read": 2, "write": 2, "unknown": 1}
    assert agg["by_state"]["read"]["exact"] == 1.0 and agg["by_state"]["write"]["exact"] == 0.0
    assert {k: v["n"] for k, v in agg["by_changed_fields"].items()} == {"0": 2, "1": 1, "3+": 1, "unknown": 1}
    assert {k: v["n"] for k, v in agg["by_outcome"].items()} == {"success": 4, "error": 1}
    assert {k: v["n"] for k, v in agg["by_position"].items()} == {"1": 1, "2": 2, "3+": 2}
    text = format_fidelity(agg)
    assert "state=read" in text and "state=write" in text and "outcome=error" in text and "position=3+" in text
    assert aggregate([])["by_state"] == {}


def test_shadow_rollouts_record_what_each_real_call_changed_and_the_breakdowns_add_up(tokenizer):
    tasks = load_tasks(
        "bank", "test", n=3
    )  # gold: balance reads, transfers / deposits (3 fields), a freeze (1), a failing transfer
    res = measure_fidelity(WrongBalances(tokenizer, tasks), tasks, _cfg(), group_size=1)
    by_call = {(p.tool, bool(p.changed), len(p.changed)) for p in res.pairs}
    assert (
        ("get_balance", False, 0) in by_call
        and ("freeze_account", True, 1) in by_call
        and ("transfer", True, 3) in by_call
    )
    for p in res.pairs:
        if p.tool == "get_balance":
            assert p.changed == [] and BREAKDOWNS["by_state"].bucket(p) == "read"
        if p.tool == "transfer" and "error" not in p.real:
            assert p.changed == ["accounts", "next_txn", "transactions"] and BREAKDOWNS["by_state"].bucket(p) == "write"
        if isinstance(p.real, dict) and "error" in p.real:
            assert (
                p.changed == [] and BREAKDOWNS["by_outcome"].bucket(p) == "error"
            )  # a failed transfer changes nothing
    summary = res.summary
    total = summary["overall"]["n"]
    assert total == len(res.pairs) == sum(len(t.flat_gold()) for t in tasks)
    for key in BREAKDOWNS:
        assert sum(v["n"] for v in summary[key].values()) == total, key
    assert "unknown" not in summary["by_state"] and summary["by_outcome"]["error"]["n"] >= 1
    # every rehearsed observation with a "balance" (reads, deposits) is wrong, transfers and freezes are right
    assert summary["by_state"]["read"]["exact"] < summary["by_state"]["write"]["exact"]
    steps = [s for t in res.trajectories for s in t.steps]
    assert all(len(s.shadow_changed) == len(s.shadow) for s in steps)
    assert all(c is None for s in steps for c, x in zip(s.shadow_changed, s.shadow) if x is None)


class Answers(ScriptedBackend):
    """Answers each prompt from a table (prompt text -> reply), a fixed garbage reply for any other."""

    def __init__(self, tokenizer, table=None):
        super().__init__(tokenizer, lambda text: (table or {}).get(text, "I am not sure."))


def test_teacher_forced_fidelity_scores_every_gold_call_on_the_same_prompts_whatever_the_model(tiny):
    model, tok = tiny
    tasks = load_tasks("bank-world", "test", n=4)
    n_gold = sum(len(t.flat_gold()) for t in tasks)
    garbage = Answers(tok)
    bad = measure_teacher_forced(garbage, tok, tasks, model=model)
    assert bad.summary["overall"] == {"n": float(n_gold), **{k: 0.0 for k in METRICS}}
    assert all(p.source == TEACHER_FORCED_SOURCE for p in bad.pairs)
    assert {"read", "write"} <= set(bad.summary["by_state"])  # gold trajectories record what each call changed
    # the same prompts again, answered with the real observations: perfect, and the prompts did not change
    oracle = Answers(tok, {prompt: format_observation(p.real) for prompt, p in zip(garbage.prompts, bad.pairs)})
    good = measure_teacher_forced(oracle, tok, tasks)
    assert oracle.prompts == garbage.prompts
    assert good.summary["overall"] == {"n": float(n_gold), **{k: 1.0 for k in METRICS}}
    assert "nll" not in good.summary and all("nll" not in p.scores for p in good.pairs)
    # the NLL of the real observation: one per pair, token-weighted in the summary
    for p, prompt in zip(bad.pairs, garbage.prompts):
        assert p.scores["nll"] > 0 and p.scores["nll_tokens"] >= len(tok.encode(format_observation(p.real)))
        assert "Current call:" in prompt and "name: " + p.tool in prompt.rsplit("Current call:", 1)[1]
    assert bad.summary["nll"]["overall"] == pytest.approx(mean_nll(bad.pairs))
    assert set(bad.summary["nll"]["by_state"]) == set(bad.summary["by_state"])


def test_teacher_forced_pairs_refuse_answers_that_do_not_match_the_gold_calls(tokenizer):
    tasks = load_tasks("bank", "test", n=2)
    res = measure_teacher_forced(Answers(tokenizer), tokenizer, tasks)
    answers = [p.real for p in res.pairs]
    assert [p.scores["exact"] for p in teacher_forced_pairs(res.trajectories, tasks, answers)] == [1.0] * len(answers)
    with pytest.raises(ValueError, match="answers for"):
        teacher_forced_pairs(res.trajectories, tasks, answers[:-1])


def test_exact_cell_shows_the_rate_with_its_wilson_interval_and_a_dash_for_no_observation():
    from envace.evaluation.demo import fidelity_table
    from envace.evaluation.fidelity import exact_cell, summary_bucket
    from envace.math.stats import wilson_interval

    summary = {"overall": {"n": 4.0, "exact": 0.5, "leaf_acc": 0.7, "outcome": 1.0}, "by_state": {"read": {"n": 0}}}
    lo, hi = wilson_interval(2, 4)
    assert exact_cell(summary_bucket(summary, "overall")) == f"0.50 [{lo:.2f}, {hi:.2f}] (n=4)"
    assert exact_cell(summary_bucket(summary, "by_state", "read")) == "-"
    assert exact_cell(summary_bucket(summary, "by_state", "write")) == "-"
    row = fidelity_table([("m", summary)])[2]
    assert row.startswith(f"| m | 0.50 [{lo:.2f}, {hi:.2f}] (n=4) | -") and row.endswith("| 0.70 | 1.00 |")


def test_unshown_leaves_are_the_values_the_prompt_does_not_show_and_say_whether_rehearse_got_them():
    from envace.evaluation.fidelity import unshown_leaves

    real = {"products": [{"product_id": "P-708", "price": "37.50", "stock": 14, "ok": True}], "note": "fragile"}
    rehearsed = {"products": [{"product_id": "P-560", "price": "37.50", "stock": 14, "ok": True}], "note": "fragile"}
    prompt = 'User: is the "P-708" in stock? It was 14 dollars, or $37.50 with tax.'
    # P-708 (JSON text), 14 (number) and 37.50 (bare text) are shown; booleans never count; "fragile" is not shown
    assert unshown_leaves(real, rehearsed, prompt) == [("note", '"fragile"', True)]
    assert unshown_leaves(real, {"note": "sturdy"}, "nothing here") == [
        ("product_id", '"P-708"', False),
        ("price", '"37.50"', False),
        ("stock", "14", False),
        ("note", '"fragile"', False),
    ]
