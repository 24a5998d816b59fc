"""The experiment in miniature: config checks, report tables by hand from synthetic results, a real end-to-end run
of every arm with the tiny model through the CLI (every report file), resume, and the HTML pages in headless
Chromium (no script errors, screenshots).

Chromium is Debian's ``chromium`` package (``apt-get install -y chromium``); without it the browser tests skip."""

import html
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from envace.config import to_dict
from envace.envs import load_tasks
from envace.evaluation.experiment import (
    ARMS,
    ExperimentConfig,
    SeedRun,
    budgets,
    evaluate_arm,
    fidelity_steps,
    load_experiment_config,
    plan_budget,
    release_memory,
    rl_train_tasks,
    run_experiment,
    sft_more_steps,
    success_point,
    success_steps,
)
from envace.evaluation.fidelity import measure_fidelity
from envace.chat.parsing import format_observation, render_act
from envace.evaluation.claims import FIDELITY_CLAIMS, claims_by_seed_table, measure_fidelity_claim
from envace.evaluation.results import extra_splits, outcome_changes, split_view
from envace.evaluation.report import (
    LOADED_SUFFIX,
    TRAIN_SUCCESS_CURVES,
    VERDICTS,
    claim_verdict,
    claims_table,
    curve_lines,
    fidelity_breakdown_table,
    fidelity_curve,
    fidelity_curve_table,
    fmt_ms,
    fmt_values,
    json_html,
    kind_table,
    main_table,
    mean_std,
    option_arm_table,
    paired_table,
    plot_success,
    plot_tts,
    plot_success_curve,
    success_changes,
    success_curve,
    success_curve_table,
    tts_paired_table,
    tts_table,
    tts_tokens_table,
    write_report,
)
from envace.rollout.engine import RolloutConfig
from envace.training.sft import GoldTeacher
from lifetimes import Made, no_cyclic_gc

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
REPORT_FILES = (
    "report.md",
    "report.html",
    "trajectories.html",
    "results.json",
    "curve_reward.png",
    "curve_train_success.png",
    "curve_sft_nll.png",
    "tts_budget.png",
    "fidelity_curve.png",
    "success.png",
)
ALL_ARMS = ("base", "sft", "sft_more", "real_env", "envace", "per_role", "simulator", "caller_only")
RL_ARMS = ("real_env", "envace", "per_role", "simulator", "caller_only")
TTS_ARMS = ("base", "sft", "envace")

TINY_YAML = """\
model: tiny-random
suite: bank
arms: [base, sft, sft_more, real_env, envace, per_role, simulator, caller_only]
seeds: [0]
sft_steps: 1
sft_tasks: 4
sft_batch_tasks: 2
sft_lr: 0.001
iterations: 2
batch_tasks: 1
group_size: 2
lr: 0.001
train_options: {update_epochs: 2}
rollout:
  max_steps: 2
  max_steps_per_turn: 2
  act: {temperature: 1.0, max_new_tokens: 8}
  rehearse: {temperature: 0.6, top_p: 0.8, max_new_tokens: 8, stop: ["</observation>"]}
eval_tasks: 2
tts_budgets: [0, 1]
tts_modes: [parallel, sequential, plan]
tts_arms: [base, sft, envace]
tts_tasks: 1
tts_memory: concat
tts_max_new_tokens: 8
fidelity_tasks: 1
fidelity_samples: 1
fidelity_every: 1
success_every: 1
progress: false
"""


# --------------------------------------------------------------------------------------------------------
# Config and pure report pieces
# --------------------------------------------------------------------------------------------------------


def test_every_paper_arm_is_registered_and_unknown_names_list_the_valid_ones():
    for arm in ALL_ARMS + ("caller_frozen",):
        assert arm in ARMS
    assert ExperimentConfig().arms == ALL_ARMS and ExperimentConfig().tts_arms == TTS_ARMS
    with pytest.raises(KeyError, match="valid names: .*envace"):
        ExperimentConfig(arms=("base", "nope"))
    with pytest.raises(KeyError, match="parallel"):
        ExperimentConfig(tts_modes=("diagonal",))
    with pytest.raises(ValueError):
        ExperimentConfig(arms=("base", "base"))
    with pytest.raises(KeyError, match="valid names"):
        ExperimentConfig(tts_arms=("envac",))
    with pytest.raises(ValueError, match="needs 'parallel'"):  # the plan budget is measured on the parallel attempts
        ExperimentConfig(tts_modes=("sequential", "plan"))
    with pytest.raises(ValueError, match="must hold 0"):
        ExperimentConfig(tts_budgets=(1, 2))


def test_budgets_evaluate_n0_once_and_every_positive_n_in_every_mode():
    cfg = ExperimentConfig(tts_budgets=(2, 0, 1, 1), tts_modes=("parallel", "sequential"))
    assert cfg.tts_budgets == (0, 1, 2)
    assert budgets(cfg) == [(0, "none"), (1, "parallel"), (1, "sequential"), (2, "parallel"), (2, "sequential")]


def test_only_the_tts_arms_and_seeds_get_the_sweep_with_rehearsal_before_the_plan_baseline():
    cfg = ExperimentConfig(
        tts_budgets=(0, 2), tts_modes=("plan", "sequential", "parallel"), tts_arms=("base", "envace"), tts_seeds=(1,)
    )
    assert budgets(cfg, "envace", 1) == [(0, "none"), (2, "sequential"), (2, "parallel"), (2, "plan")]
    assert budgets(cfg, "envace", 0) == budgets(cfg, "sft", 1) == [(0, "none")]


def test_plan_budget_is_the_mean_tokens_of_one_parallel_attempt_at_the_same_n():
    evals = [
        {"n": 1, "mode": "parallel", "metrics": {"tts/attempt_tokens_per_attempt": 99.0}},
        {"n": 2, "mode": "sequential", "metrics": {"tts/attempt_tokens_per_attempt": 80.0}},
        {"n": 2, "mode": "parallel", "metrics": {"tts/attempt_tokens_per_attempt": 37.4}},
    ]
    assert plan_budget(evals, 2, 160) == (37, "parallel N=2") and plan_budget(evals, 1, 160) == (99, "parallel N=1")
    assert plan_budget(evals[1:2], 2, 160) == (160, "fallback (tts_max_new_tokens)")  # never matched to another mode


def test_sft_more_takes_as_many_steps_as_rl_and_fidelity_segments_end_every_fidelity_every():
    cfg = ExperimentConfig(iterations=7, batch_tasks=3, fidelity_every=3, fidelity_tasks=2)
    assert sft_more_steps(cfg) == 7 and rl_train_tasks(cfg) == 64 and fidelity_steps(cfg) == [3, 6]
    assert (
        rl_train_tasks(ExperimentConfig(iterations=30, batch_tasks=4)) == 120
        and rl_train_tasks(ExperimentConfig(train_tasks=10)) == 10
    )
    assert fidelity_steps(ExperimentConfig(iterations=6, fidelity_every=3)) == [3]  # the end is the final fidelity
    assert (
        fidelity_steps(ExperimentConfig(fidelity_every=0))
        == []
        == fidelity_steps(ExperimentConfig(fidelity_every=2, fidelity_tasks=0))
    )


def test_success_curve_evaluates_every_success_every_iterations_before_the_final_evaluation():
    assert success_steps(ExperimentConfig(iterations=8, success_every=2)) == [2, 4, 6]
    assert success_steps(ExperimentConfig(iterations=8, success_every=0)) == []
    assert success_steps(ExperimentConfig(iterations=3, success_every=4)) == []  # only the final evaluation
    with pytest.raises(ValueError, match="success_every"):
        ExperimentConfig(success_every=-1)


def _success_ev(outcomes, lo=0.1, hi=0.9):
    tasks = [{"task_id": f"t{i}", "successes": [o], "tool_f1": 1.0} for i, o in enumerate(outcomes)]
    rate = sum(outcomes) / len(outcomes)
    return {
        "n": 0,
        "metrics": {"success_rate": rate, "success_rate/ci_lo": lo, "success_rate/ci_hi": hi},
        "per_task": tasks,
    }


def test_the_success_curve_starts_from_the_sft_arm_s_evaluation_or_evaluates_the_warm_up_once(tmp_path, monkeypatch):
    import envace.evaluation.experiment as experiment

    made = []

    def fake_eval(cfg, policy, seed, todo, evals, label=""):
        made.append((policy, todo))
        return [_success_ev([True, False])]

    monkeypatch.setattr(experiment, "evaluate_budgets", fake_eval)
    monkeypatch.setattr(experiment, "arm_backend", lambda cfg, model: f"backend of {model}")
    monkeypatch.setattr(SeedRun, "sft", lambda self: ("warm-up", []))
    cfg = ExperimentConfig(out_dir=str(tmp_path / "a"), success_every=2)
    first = SeedRun(cfg, 0).success_start()
    assert made == [("backend of warm-up", [(0, "none")])] and first == success_point(0, _success_ev([True, False]))
    assert SeedRun(cfg, 0).success_start() == first and len(made) == 1  # once per seed, read back after
    rec = {"evals": [_success_ev([False, True]), {"n": 1, "mode": "parallel"}]}
    other = ExperimentConfig(out_dir=str(tmp_path / "b"), success_every=2)
    assert SeedRun(other, 0).success_start(rec) == success_point(0, rec["evals"][0]) and len(made) == 1  # not again
    later = {"evals": [_success_ev([True, True])]}
    assert SeedRun(other, 0).success_start(later) == success_point(0, rec["evals"][0])  # a point that exists is kept


def test_success_curve_counts_the_tasks_each_step_won_and_lost_against_the_warm_up(tmp_path):
    p = success_point(4, _success_ev([True, False, True]))
    assert p == {
        "step": 4,
        "success_rate": pytest.approx(2 / 3),
        "ci": [0.1, 0.9],
        "per_task": [{"task_id": f"t{i}", "successes": [o]} for i, o in enumerate([True, False, True])],
    }  # only what the curve needs of each task
    curve = lambda *pts: [success_point(s, _success_ev(o)) for s, o in pts]  # noqa: E731
    runs = {
        "envace": {
            "0": {"evals": [], "success_curve": curve((0, [1, 1, 0, 0]), (2, [1, 0, 1, 1]), (4, [0, 0, 0, 0]))},
            "1": {"evals": [], "success_curve": curve((0, [1, 1, 1, 1]), (2, [1, 1, 1, 1]), (4, [1, 1, 1, 0]))},
        },
        "caller_only": {  # seed 1 has no curve (trained before success_every was set): one seed's curve
            "0": {"evals": [], "success_curve": curve((0, [1, 1, 0, 0]), (4, [1, 1, 0, 1]))},
            "1": {"evals": []},
        },
        "sft": {"0": {"evals": []}},
    }
    res = {"arms": ["sft", "envace", "caller_only"], "runs": runs, "config": {"eval_split": "val"}}
    steps, mean, std = success_curve(res, "envace")
    assert steps == [0, 2, 4] and mean == pytest.approx([0.75, 0.875, 0.375])
    assert success_changes(res, "envace", 2) == (2, 1)  # seed 0: t2, t3 won, t1 lost; seed 1 unchanged
    assert success_changes(res, "envace", 4) == (0, 3) and success_changes(res, "envace", 0) == (0, 0)
    assert success_curve(res, "sft") == ([], [], [])
    head, rows = success_curve_table(res)
    assert head == ["arm", "step 0", "step 2", "step 4"]
    assert rows[0] == ["envace", "0.750 ± 0.354", "0.875 ± 0.177 (+2 / −1)", "0.375 ± 0.530 (+0 / −3)"]
    assert rows[1] == ["caller_only", "0.500", "–", "0.750 (+1 / −0)"] and len(rows) == 2  # one seed: no spread
    path = plot_success_curve(res, str(tmp_path / "s.png"))
    assert open(path, "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_loads_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(TINY_YAML)
    cfg = load_experiment_config(str(path), ["seeds=[3, 4]", "rollout.max_steps=3", "out_dir=/tmp/x"])
    assert (
        cfg.seeds == (3, 4)
        and cfg.rollout.max_steps == 3
        and cfg.rollout.act.max_new_tokens == 8
        and cfg.out_dir == "/tmp/x"
    )
    assert (
        cfg.arms == ALL_ARMS
        and cfg.tts_budgets == (0, 1)
        and cfg.tts_modes == ("parallel", "sequential", "plan")
        and cfg.fidelity_every == 1
    )


def test_train_options_reach_every_rl_arm_but_may_not_override_what_the_experiment_sets(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(TINY_YAML)
    assert load_experiment_config(str(path), ["train_options.mini_batches=2"]).train_options == {
        "update_epochs": 2,
        "mini_batches": 2,
    }
    for bad in ("train_options.lr=0.1", "train_options.seed=3", "train_options.no_such_field=1"):
        with pytest.raises(ValueError, match="train_options"):
            load_experiment_config(str(path), [bad])


def test_sft_options_reach_the_warm_up_but_may_not_override_what_the_experiment_sets(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(TINY_YAML)
    cfg = load_experiment_config(str(path), ["sft_options.bf16=auto", "sft_options.micro_batch_tokens=512"])
    assert cfg.sft_options == {"bf16": "auto", "micro_batch_tokens": 512}
    for bad in ("sft_options.lr=0.1", "sft_options.steps=3", "sft_options.no_such_field=1"):
        with pytest.raises(ValueError, match="sft_options"):
            load_experiment_config(str(path), [bad])


def test_the_ood_split_must_be_another_split():
    assert ExperimentConfig(ood_split="ood").ood_split == "ood"
    with pytest.raises(ValueError, match="ood_split must differ"):
        ExperimentConfig(eval_split="test", ood_split="test")
    with pytest.raises(ValueError, match="ood_tasks"):
        ExperimentConfig(ood_split="ood", ood_tasks=0)


def test_outcome_changes_and_the_split_view_pair_tasks_within_each_seed_by_hand(tmp_path):
    def ev(prefix, xs):
        per_task = [{"task_id": f"{prefix}-{i}", "successes": [bool(x)]} for i, x in enumerate(xs)]
        return [{"n": 0, "mode": "none", "metrics": {"success_rate": sum(xs) / len(xs)}, "per_task": per_task}]

    def rec(test, ood=None):
        return {"evals": ev("t", test)} | ({"splits": {"ood": ev("o", ood)}} if ood is not None else {})

    results = {
        "config": to_dict(ExperimentConfig(arms=("sft", "envace"), seeds=(0, 1))),
        "arms": ["sft", "envace"],
        "runs": {
            "sft": {"0": rec([1, 1, 0, 0], [1, 0, 0, 0]), "1": rec([1, 0, 0, 0], [1, 1, 1, 1])},
            "envace": {"0": rec([0, 1, 1, 0], [0, 0, 0, 0]), "1": rec([1, 0, 0, 0])},  # seed 1: no ood evaluation
        },
    }
    # seed 0: task 0 lost, task 2 won; seed 1: nothing changed
    assert outcome_changes(results, "envace", "sft") == {"won": 1, "lost": 1, "same": 6, "seeds": 2}
    assert extra_splits(results) == ["ood"]
    ood = split_view(results, "ood")
    assert ood["config"]["eval_split"] == "ood" and results["config"]["eval_split"] == "test"
    assert outcome_changes(ood, "envace", "sft") == {"won": 0, "lost": 1, "same": 3, "seeds": 1}
    assert outcome_changes(results, "envace", "base") is None
    head, rows = paired_table(ood)
    assert rows[0][0] == "envace" and rows[0][head.index("won / lost")] == "0 / 1" and rows[0][-1] == "1"
    # envace's ood rate is 0: the figure still draws (its Wilson bound at 0 is a rounding above or below 0)
    assert plot_success(results, str(tmp_path / "success.png")) and (tmp_path / "success.png").stat().st_size > 0


def test_mean_std_and_formatting_by_hand():
    assert mean_std([0.5, 1.0]) == pytest.approx((0.75, 0.35355339))  # sample std (ddof=1)
    assert mean_std([0.4]) == (0.4, 0.0)
    assert fmt_ms((0.75, 0.3535533)) == "0.750 ± 0.354" and fmt_ms(mean_std([])) == "–"
    assert fmt_values([0.5, 1.0]) == "0.750 ± 0.354" and fmt_values([0.4]) == "0.400" and fmt_values([]) == "–"
    assert fmt_values([0.5, 0.5]) == "0.500 ± 0.000"  # seeds that agree still show their (zero) spread


def test_json_html_marks_exactly_the_mismatched_leaves():
    out = json_html({"a": 1, "b": [2, "x<y"]}, {("b", 1)})
    assert out.count('class="mm"') == 1 and '<span class="mm">&quot;x&lt;y&quot;</span>' in out


class _WrongBalance(GoldTeacher):
    """Gold acts; rehearsed observations with every balance wrong (so the viewer has mismatches to show)."""

    def _script(self, task):
        acts, obs = super()._script(task)
        fixed = []
        for text in obs:
            o = json.loads(text[len("<observation>") : -len("</observation>")])
            if isinstance(o, dict) and "balance" in o:
                o["balance"] = "999.99"
            fixed.append(format_observation(o))
        return acts, fixed


def _metrics(success, tool_f1):
    return {
        "success_rate": success,
        "pass^1": success,
        "tool_f1": tool_f1,
        "tool_precision": tool_f1,
        "tool_recall": tool_f1,
        "call_f1": tool_f1,
        "format_valid_rate": 1.0,
        "steps_per_traj": 3.0,
        "act_tokens_per_traj": 40.0,
        "wall_s": 2.0,
    }


@pytest.fixture(scope="module")
def synthetic(tokenizer, tmp_path_factory):
    """Results of two arms x two seeds with hand-chosen numbers and real shadow trajectories, and their report."""
    tasks = load_tasks("bank", "test", n=2)
    fid = measure_fidelity(
        _WrongBalance(tokenizer, tasks),
        tasks,
        RolloutConfig(max_steps=12, max_steps_per_turn=8),
        mode="rehearsal",
        group_size=1,
    )
    cfg = ExperimentConfig(arms=("sft", "envace"), seeds=(0, 1), tts_budgets=(0, 1), eval_samples=1)
    runs = {}
    # per-task outcomes at N=0 of 4 tasks, matching the rates: sft 1/4 in each seed, envace 2/4 then 4/4
    outcomes = {
        ("sft", "0"): [1, 0, 0, 0],
        ("sft", "1"): [0, 1, 0, 0],
        ("envace", "0"): [1, 1, 0, 0],
        ("envace", "1"): [1, 1, 1, 1],
    }
    kinds = ("lookup", "lookup", "recovery", "report")
    for arm, succ in (("sft", (0.25, 0.25)), ("envace", (0.5, 1.0))):
        runs[arm] = {}
        for seed, s in zip(("0", "1"), succ):
            per_task = [
                {"task_id": f"bank-test-{i}", "domain": "bank", "kind": kinds[i], "successes": [bool(x)]}
                for i, x in enumerate(outcomes[arm, seed])
            ]
            runs[arm][seed] = {
                "evals": [
                    {"n": 0, "mode": "none", "metrics": _metrics(s, s / 2), "per_task": per_task},
                    {"n": 1, "mode": "parallel", "metrics": _metrics(min(1.0, s + 0.25), s)},
                    {"n": 1, "mode": "sequential", "metrics": _metrics(s, s)},
                ],
                "fidelity": fid.summary,
                "examples": [t.to_dict(with_rows=False) for t in fid.trajectories],
                "curve": [{"step": i, "reward/mean": 0.1 * i + s, "reward/imagined_success_rate": s} for i in (1, 2, 3)]
                if arm == "envace"
                else [{"step": 1, "sft/nll": 3.0}, {"step": 2, "sft/nll": 2.0}],
                "train_s": 10.0,
            }
    results = {
        "config": to_dict(cfg),
        "arms": list(cfg.arms),
        "docs": {a: ARMS.get(a).doc for a in cfg.arms},
        "runs": runs,
    }
    out = tmp_path_factory.mktemp("synthetic_report")
    with open(out / "results.json", "w") as f:
        json.dump(results, f)
    files = write_report(results, str(out))
    return results, files


def test_training_success_curves_name_imagined_and_real_success_apart(synthetic):
    results, files = synthetic
    curves = {
        "envace": [{"step": 1, "reward/imagined_success_rate": 0.75}],
        "real_env": [{"step": 1, "reward/real_success_rate": 0.25}],
        "old": [{"step": 1, "reward/success_rate": 0.5}],
    }  # a plain key says neither: it is not drawn as either
    res = {"arms": list(curves), "runs": {a: {"0": {"curve": c}} for a, c in curves.items()}}
    assert curve_lines(res, TRAIN_SUCCESS_CURVES) == [
        ("envace (imagined)", "envace", "reward/imagined_success_rate"),
        ("real_env (real env)", "real_env", "reward/real_success_rate"),
    ]
    md = open(files["md"]).read()
    assert "Training success: imagined vs real env" in md and "'imagined' is the success of rehearsed" in md


def test_report_tables_show_wilson_intervals_over_tasks_and_the_spread_over_seeds(synthetic):
    results, files = synthetic
    head, rows = main_table(results)
    assert head[:4] == ["arm", "success [95% CI]", "success over seeds", "tool F1"]
    envace = next(r for r in rows if r[0] == "envace")
    # pooled over both seeds, per-task means (1, 1, 1/2, 1/2): rate 3/4, Wilson over 4 tasks of 3 successes
    assert (
        envace[1] == "0.750 [0.301, 0.954]"
        and envace[2] == "0.750 ± 0.354 (0.500–1.000)"
        and envace[3] == "0.375 ± 0.177"
    )
    assert next(r for r in rows if r[0] == "sft")[1:3] == ["0.250 [0.046, 0.699]", "0.250 ± 0.000 (0.250–0.250)"]
    head, rows = tts_table(results)
    assert head == ["arm", "N=0", "N=1 par", "N=1 seq"]
    # N=0 has per-task outcomes (interval + sd over seeds); N=1 has none: mean ± std over seeds
    assert next(r for r in rows if r[0] == "envace")[1:] == [
        "0.750 [0.301, 0.954] · sd 0.354",
        "0.875 ± 0.177",
        "0.750 ± 0.354",
    ]
    md = open(files["md"]).read()
    assert (
        "| envace | 0.750 [0.301, 0.954] | 0.750 ± 0.354 (0.500–1.000) |" in md
        and "bank/get_balance" in md
        and "trajectories.html" in md
    )
    for name in REPORT_FILES:
        assert os.path.getsize(os.path.join(os.path.dirname(files["md"]), name)) > 0, name


def test_report_compares_each_rl_arm_with_sft_paired_over_the_same_tasks(synthetic):
    results, files = synthetic
    head, rows = paired_table(results)
    assert head[:6] == ["arm", "sft [95% CI]", "arm [95% CI]", "arm - sft", "paired 95% CI", "p"]
    # per-task means sft (1/2, 1/2, 0, 0), envace (1, 1, 1/2, 1/2): every task +1/2, so the bootstrap interval is a
    # point and the exact sign-flip p is 2 of 2^4 sign patterns
    assert rows == [
        [
            "envace",
            "0.250 [0.046, 0.699]",
            "0.750 [0.301, 0.954]",
            "+0.500",
            "[+0.500, +0.500]",
            "0.125",
            "sign flip",
            "4 / 0",  # (task, seed) pairs: seed 0 wins task 1, seed 1 tasks 0, 2 and 3; nothing lost
            "4",
            "2",
        ]
    ]
    head, rows = kind_table(results)
    assert head == ["arm", "lookup", "recovery", "report"]
    assert next(r for r in rows if r[0] == "sft")[1:] == [
        "0.500 [0.095, 0.905] (2)",
        "0.000 [0.000, 0.793] (1)",
        "0.000 [0.000, 0.793] (1)",
    ]
    md = open(files["md"]).read()
    assert (
        "## Paired comparison with SFT" in md
        and "| envace | 0.250 [0.046, 0.699] | 0.750 [0.301, 0.954] | +0.500 |" in md
    )
    assert "## Success by task kind" in md


def test_report_splits_fidelity_by_state_change_outcome_and_position(synthetic):
    results, files = synthetic
    head, rows = fidelity_breakdown_table(results)
    assert head[:4] == ["arm", "split", "bucket", "pairs"]
    summary = results["runs"]["envace"]["0"]["fidelity"]
    for split in ("state", "changed_fields", "outcome", "position"):
        mine = [r for r in rows if r[0] == "envace" and r[1] == split]
        assert sum(int(r[3]) for r in mine) == summary["overall"]["n"], split  # every pair in one bucket
    assert {r[2] for r in rows if r[1] == "state"} == {"read", "write"}
    assert "Fidelity by state change, outcome and position" in open(files["md"]).read()


def test_results_without_per_task_outcomes_fall_back_to_the_spread_over_seeds(synthetic):
    results, _ = synthetic
    old = json.loads(json.dumps(results))
    for runs in old["runs"].values():
        for rec in runs.values():
            for e in rec["evals"]:
                e.pop("per_task", None)
    assert next(r for r in main_table(old)[1] if r[0] == "envace")[1] == "0.750 ± 0.354"
    assert paired_table(old)[1] == [["envace"] + ["–"] * 9] and kind_table(old)[1] == []


def test_claim_verdicts_by_hand():
    assert claim_verdict(0.01, 0.20) == "holds" == claim_verdict(0.02, 0.30, ">=")
    assert claim_verdict(-0.20, -0.01) == "does not hold" == claim_verdict(-0.30, -0.05, ">=")
    for lo, hi in ((-0.10, 0.10), (0.0, 0.10), (-0.10, 0.0), (0.0, 0.0)):  # an interval that contains (or touches) 0
        assert claim_verdict(lo, hi) == "cannot tell at this scale" == claim_verdict(lo, hi, ">="), (lo, hi)
    assert claim_verdict(float("nan"), float("nan")) == "not measured"
    assert set(VERDICTS) == {"holds", "does not hold", "cannot tell at this scale", "not measured"}
    with pytest.raises(ValueError, match="direction"):
        claim_verdict(0.1, 0.2, "<")


def _claims_results():
    """8 held-out tasks, one seed, hand-chosen outcomes: envace solves every task at N=0, sft none, real_env every one;
    at N=2 parallel envace solves none (a loss of 1 per task), its plan baseline the last four, base nothing at all."""

    def ev(n, mode, succ, **extra):
        per_task = [{"task_id": f"bank-test-{i}", "domain": "bank", "successes": [bool(x)]} for i, x in enumerate(succ)]
        m = {
            "success_rate": sum(succ) / len(succ),
            "tts/attempt_tokens_per_task": 100.0 * n,
            "tts/rehearsal_tokens_per_task": 150.0 * n,
        }
        return {"n": n, "mode": mode, "metrics": m, "per_task": per_task, **extra}

    one, zero, half = [1] * 8, [0] * 8, [0] * 4 + [1] * 4
    evals = {
        "base": [ev(0, "none", zero), ev(2, "parallel", zero), ev(2, "plan", zero, plan_max_new_tokens=50)],
        "sft": [ev(0, "none", zero)],
        "envace": [ev(0, "none", one), ev(2, "parallel", zero), ev(2, "plan", half, plan_max_new_tokens=60)],
        "real_env": [ev(0, "none", one)],
    }
    cfg = ExperimentConfig(
        arms=("base", "sft", "envace", "real_env", "per_role"),
        seeds=(0,),
        tts_budgets=(0, 2),
        tts_modes=("parallel", "plan"),
    )
    return {"config": to_dict(cfg), "arms": list(cfg.arms), "runs": {a: {"0": {"evals": e}} for a, e in evals.items()}}


def test_each_option_arm_is_compared_with_its_own_variant_not_with_sft(tmp_path):
    """envace+obs_loss against envace (the arm it adds an option to), paired task by task: the option loses the
    first three of 8 tasks that plain EnvACE solves; an option arm whose variant did not run has no row."""
    results = _claims_results()
    ev = results["runs"]["envace"]["0"]["evals"][0]
    option = {**ev, "per_task": [{**p, "successes": [i >= 3]} for i, p in enumerate(ev["per_task"])]}
    results["arms"] += ["envace+obs_loss", "caller_only+dynamic"]
    results["runs"]["envace+obs_loss"] = results["runs"]["caller_only+dynamic"] = {"0": {"evals": [option]}}
    head, rows = option_arm_table(results)
    assert head[:5] == ["option arm", "variant", "variant [95% CI]", "arm [95% CI]", "arm - variant"]
    assert [r[:2] for r in rows] == [["envace+obs_loss", "envace"]]
    assert rows[0][4:6] == ["-0.375", "[-0.750, +0.000]"]  # the seeded bootstrap over tasks
    assert rows[0][-3:] == ["0 / 3", "8", "1"]
    assert option_arm_table(_claims_results())[1] == []  # no option arm: no table
    md = open(write_report(results, str(tmp_path))["md"]).read()
    assert "## Each option arm against its variant" in md and "| envace+obs_loss | envace |" in md
    for arm in ("envace", "envace+obs_loss"):  # the same outcomes on a further held-out split
        results["runs"][arm]["0"]["splits"] = {"ood": [results["runs"][arm]["0"]["evals"][0]]}
    md = open(write_report(results, str(tmp_path))["md"]).read()
    assert "## Held-out split `ood`: each option arm against its variant" in md


def test_claims_table_measures_each_claim_paired_over_tasks_with_a_verdict():
    head, rows = claims_table(_claims_results())
    assert head == [
        "claim",
        "paper",
        "contrast",
        "measured",
        "paired 95% CI",
        "p",
        "95% CI, seeds × templates",
        "tasks",
        "seeds",
        "verdict",
    ]
    by = {r[0]: r for r in rows}
    assert len(rows) == 12
    assert by["Rehearse fidelity rises with EnvACE training (final > start)"][-1] == "not measured"  # no curve here
    # every task +1: a point interval above 0; exact McNemar with 8 discordant pairs, 2 / 2^8. The 8 bank tasks
    # are of 8 templates (rebuilt from their ids), one seed
    assert by["EnvACE > SFT"][2:] == [
        "envace@N=0 − sft@N=0",
        "+1.000",
        "[+1.000, +1.000]",
        "0.00781",
        "[+1.000, +1.000] (1 × 8 templates)",
        "8",
        "1",
        "holds",
    ]
    assert by["EnvACE ≥ real-env GRPO"][3:] == [
        "+0.000",
        "[+0.000, +0.000]",
        "1",
        "[+0.000, +0.000] (1 × 8 templates)",
        "8",
        "1",
        "cannot tell at this scale",
    ]
    assert by["shared weights ≥ per-role"][-1] == "not measured"  # per_role was not run
    assert by["EnvACE > SFT continued (compute-matched)"][-1] == "not measured"  # sft_more is not an arm here
    # test-time rehearsal: envace loses 1 per task at N=2, base 0: the difference of gains is -1 on every task
    assert by["test-time rehearsal helps EnvACE (N=2 parallel > N=0)"][3:5] == ["-1.000", "[-1.000, -1.000]"]
    gain = by["TTS gain EnvACE > base (N=2 parallel)"]
    assert gain[2] == "envace@N=2 par − envace@N=0 − base@N=2 par + base@N=0"
    assert gain[3:] == [  # exact sign flip: 2 of 2^8
        "-1.000",
        "[-1.000, -1.000]",
        "0.00781",
        "[-1.000, -1.000] (1 × 8 templates)",
        "8",
        "1",
        "does not hold",
    ]
    assert by["TTS gain EnvACE > base (N=2 sequential)"][-1] == "not measured"
    plan = by["rehearsal > compute-matched plans (EnvACE, N=2 parallel vs plan)"]
    assert plan[3] == "-0.500" and plan[-1] == "does not hold"
    head, rows = tts_tokens_table(_claims_results())
    assert head == ["arm", "N=2 par", "N=2 plan"] and rows == [
        ["base", "200 · 300", "200 · 300 (plan ≤ 50)"],
        ["envace", "200 · 300", "200 · 300 (plan ≤ 60)"],
    ]
    assert [r[0] for r in tts_table(_claims_results())[1]] == ["base", "envace"]  # only the arms that were swept


def test_fidelity_claims_pool_the_observations_of_the_seeds_that_measured_both_points():
    def summ(scores):
        return {
            "overall": {"n": float(len(scores)), "leaf_acc": sum(scores) / len(scores)},
            "pair_scores": {"leaf_acc": scores},
        }

    start = {"step": 0, "summary": summ([0.0, 0.0, 0.5])}  # the SFT model on the shadow set, shared by the arms
    rec = lambda final: {"evals": [], "fidelity": summ(final), "fidelity_curve": [start]}  # noqa: E731
    results = {
        "config": to_dict(ExperimentConfig(arms=("envace", "caller_only"), seeds=(0, 1))),
        "arms": ["envace", "caller_only"],
        "runs": {
            "envace": {"0": rec([1.0, 1.0]), "1": rec([1.0, 0.5])},
            "caller_only": {"0": rec([0.0, 0.5, 0.0, 0.5]), "1": {"evals": [], "fidelity": None}},
        },
    }
    by = {r[0]: r for r in claims_table(results)[1]}
    rise = by["Rehearse fidelity rises with EnvACE training (final > start)"]
    # both seeds: envace final (1, 1, 1, .5) -> 0.875, start (0, 0, .5) twice -> 1/6
    assert rise[2] == "envace@final − envace@start (fidelity leaf acc)" and rise[3] == f"{0.875 - 1 / 6:+.3f}"
    assert rise[6:] == ["–", "6 / 4 obs", "2", "holds"] and rise[4].endswith("(unpaired)")
    vs = by["training Rehearse raises fidelity: EnvACE > caller-only (final)"]
    assert vs[3] == "+0.750" and vs[7:9] == ["4 / 2 obs", "1"]  # seed 0 only: caller_only's seed 1 has no fidelity
    assert measure_fidelity_claim(results, FIDELITY_CLAIMS[0])["seeds"] == ["0", "1"]


def test_a_sweep_on_fewer_seeds_and_tasks_is_paired_with_the_n0_outcomes_of_the_same_seeds_and_tasks():
    res = _claims_results()
    for arm, rec in res["runs"].items():  # a second seed without the sweep, where envace solves nothing at N=0
        n0 = json.loads(json.dumps(rec["0"]["evals"][0]))
        if arm == "envace":
            for r in n0["per_task"]:
                r["successes"] = [False]
        rec["1"] = {"evals": [n0]}
    for arm in ("base", "envace"):  # the sweep kept only the first 4 tasks
        for e in res["runs"][arm]["0"]["evals"][1:]:
            e["per_task"] = e["per_task"][:4]
    by = {r[0]: r for r in claims_table(res)[1]}
    assert by["EnvACE > SFT"][3:9] == [
        "+0.500",
        "[+0.500, +0.500]",
        "0.00781",
        "[+0.000, +1.000] (2 × 8 templates)",  # seed 1 alone (a draw in four) gains 0, seed 0 alone 1
        "8",
        "2",
    ]  # N=0 claims: both seeds (two outcomes a task: exact sign flip, 2 / 2^8)
    assert by["EnvACE > SFT"][-1] == "cannot tell at this scale"  # over tasks it would hold
    # what that interval is made of: seed 0's models gain 1 on every task, seed 1's nothing; every template gains
    head, rows = claims_by_seed_table(res)
    assert head == ["claim", "seed 0", "seed 1", "clusters + / − / 0"]
    seeds = {r[0]: r[1:] for r in rows}
    assert seeds["EnvACE > SFT"] == ["+1.000", "+0.000", "8 / 0 / 0 templates"]
    assert seeds["test-time rehearsal helps EnvACE (N=2 parallel > N=0)"] == ["-1.000", "–", "0 / 4 / 0 templates"]
    assert "shared weights ≥ per-role" not in seeds  # not measured: no row
    # N=2 - N=0 on seed 0 only (where envace solved all at N=0) and on the 4 swept tasks (exact McNemar: 2 / 2^4)
    assert by["test-time rehearsal helps EnvACE (N=2 parallel > N=0)"][3:9] == [
        "-1.000",
        "[-1.000, -1.000]",
        "0.125",
        "[-1.000, -1.000] (1 × 4 templates)",
        "4",
        "1",
    ]
    head, rows = tts_table(res)
    envace = next(r for r in rows if r[0] == "envace")
    assert (
        head[1] == "N=0" and envace[1] == "1.000 [0.510, 1.000]" and envace[2] == "0.000 [0.000, 0.490]"
    )  # 4 tasks of seed 0


def test_each_budget_is_paired_with_its_arm_at_n0_and_rehearsal_with_the_plan_baseline_at_the_same_n():
    head, rows = tts_paired_table(_claims_results())
    by = {(r[0], r[1]): r for r in rows}
    assert head[3] == "- N=0" and head[7] == "- plan"
    # envace: every task lost at N=2 parallel (exact McNemar 2 / 2^8), half of them at the plan baseline
    assert by["envace", "N=2 par"][2:] == [
        "0.000 [0.000, 0.324]",
        "-1.000",
        "[-1.000, -1.000]",
        "0.00781",
        "0 / 8",
        "-0.500",
        "[-0.875, -0.125]",
        "0.125",
        "0",
    ]
    assert by["envace", "N=2 plan"][3:] == ["-0.500", "[-0.875, -0.125]", "0.125", "0 / 4", "–", "–", "–", "0"]
    assert by["base", "N=2 par"][3:7] == ["+0.000", "[+0.000, +0.000]", "1", "0 / 0"]
    assert {r[0] for r in rows} == {"base", "envace"}  # only the swept arms
    res = _claims_results()  # the sweep kept only the first 4 tasks: N=0 is paired on those 4 alone
    for e in res["runs"]["envace"]["0"]["evals"][1:]:
        e["per_task"] = e["per_task"][:4]
    row = next(r for r in tts_paired_table(res)[1] if r[:2] == ["envace", "N=2 par"])
    assert row[3:7] == ["-1.000", "[-1.000, -1.000]", "0.125", "0 / 4"]
    assert row[7] == "+0.000"  # the plan baseline also solves none of the first four


def test_a_budget_that_only_some_seeds_ran_is_paired_with_n0_on_those_seeds_alone(tmp_path):
    res = _claims_results()
    one = lambda ok: [{"task_id": f"bank-test-{i}", "domain": "bank", "successes": [ok]} for i in range(8)]  # noqa: E731
    ev = lambda n, mode, ok: {"n": n, "mode": mode, "metrics": {"success_rate": float(ok)}, "per_task": one(ok)}  # noqa: E731
    # seed 1 ran N=0, N=2 and N=3; seed 0 (envace solves all at N=0, none at N=2) stopped at N=2. Seed 1 solves no
    # task at N=0 nor at N=3: no change, where N=0 pooled over both seeds (half of each task) would read -0.5
    res["runs"]["envace"]["1"] = {
        "evals": [ev(0, "none", False), ev(2, "parallel", False), ev(3, "parallel", False), ev(3, "plan", True)]
    }
    res["config"]["tts_budgets"] = [0, 2, 3]
    by = {(r[0], r[1]): r for r in tts_paired_table(res)[1]}
    assert by["envace", "N=3 par"][3:7] == ["+0.000", "[+0.000, +0.000]", "1", "0 / 0"]
    assert by["envace", "N=3 par"][7] == "-1.000" and by["envace", "N=3 par"][-1] == "1"
    # N=2 parallel ran on both seeds: seed 0 loses every task, seed 1 none (pooled -0.5); its plan on seed 0 only
    assert by["envace", "N=2 par"][3] == "-0.500" and by["envace", "N=2 par"][-1] == "0, 1 (plan: 0)"
    head, rows = tts_table(res)
    envace = dict(zip(head, next(r for r in rows if r[0] == "envace")))
    assert envace["N=0"].startswith("0.500 [") and "(seed" not in envace["N=0"]
    assert envace["N=3 par"].startswith("0.000 [") and envace["N=3 par"].endswith(" (seed 1)")
    assert envace["N=2 plan"].endswith(" (seed 0)")
    assert os.path.exists(plot_tts(res, str(tmp_path / "tts.png")))


def test_fidelity_curve_is_drawn_from_each_seed_s_points_on_the_shadow_set():
    def point(step, leaf, n=4.0):
        return {
            "step": step,
            "summary": {"overall": {"n": n, "valid": 1.0, "exact": 0.0, "keys": 1.0, "leaf_acc": leaf, "outcome": 1.0}},
        }

    runs = {
        "envace": {
            "0": {"evals": [], "fidelity_curve": [point(0, 0.2), point(2, 0.4), point(4, 0.6)]},
            "1": {"evals": [], "fidelity_curve": [point(0, 0.4), point(2, 0.6), point(4, 0.8)]},
        },
        "real_env": {"0": {"evals": [], "fidelity_curve": [point(0, 0.2), point(2, 0.0, n=0.0), point(4, 0.1)]}},
    }
    res = {"arms": ["envace", "real_env"], "runs": runs}
    steps, mean, std = fidelity_curve(res, "envace")
    assert steps == [0, 2, 4] and mean == pytest.approx([0.3, 0.5, 0.7]) and std == pytest.approx([0.14142136] * 3)
    assert fidelity_curve(res, "real_env")[:2] == ([0, 4], [0.2, 0.1])  # a point without scored pairs is left out
    head, rows = fidelity_curve_table(res)
    assert head == ["arm", "step 0", "step 2", "step 4"] and rows[0] == [
        "envace",
        "0.300 ± 0.141",
        "0.500 ± 0.141",
        "0.700 ± 0.141",
    ]
    assert rows[1] == ["real_env", "0.200", "–", "0.100"]  # one seed


def test_viewer_puts_rehearsed_beside_real_and_highlights_wrong_balances(synthetic):
    _, files = synthetic
    page = open(files["viewer"]).read()
    assert page.count('<section class="traj"') == 8  # 2 arms x 2 seeds x 2 shadow trajectories
    assert '<span class="mm">&quot;999.99&quot;</span>' in page  # the invented balance, highlighted
    assert 'class="miss"' in page and "tr class='match'" in page  # the real value not reproduced; exact rows marked


# --------------------------------------------------------------------------------------------------------
# Headless Chromium
# --------------------------------------------------------------------------------------------------------


def _chromium(tmp_path, url, *args):
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def check_page_in_chromium(path, tmp_path, shot_name):
    """The page loads without script errors (its script appends LOADED_SUFFIX to the title) and screenshots."""
    url = "file://" + os.path.abspath(path)
    dom = _chromium(tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", dom.stdout, re.S)
    assert title and title.group(1).endswith(LOADED_SUFFIX), (title and title.group(1), dom.stderr[-2000:])
    errors = [ln for ln in dom.stderr.splitlines() if "Uncaught" in ln or ("CONSOLE" in ln and "rror" in ln)]
    assert not errors, errors
    shot = tmp_path / shot_name
    res = _chromium(tmp_path, url, f"--screenshot={shot}", "--window-size=1200,900", "--hide-scrollbars")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    import matplotlib.image

    img = matplotlib.image.imread(str(shot))
    assert img.shape[:2] == (900, 1200) and img[..., :3].std() > 0.01  # not a blank page
    return dom.stdout


def test_no_page_asks_the_network_for_anything(synthetic):
    _, files = synthetic
    for key in ("html", "viewer"):
        page = open(files[key]).read()
        assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", page), key


def test_synthetic_report_and_viewer_render_in_headless_chromium(synthetic, tmp_path):
    _, files = synthetic
    check_page_in_chromium(files["html"], tmp_path, "synthetic_report.png")
    dom = check_page_in_chromium(files["viewer"], tmp_path, "synthetic_viewer.png")
    assert 'style="display: none;"' in dom  # the picker script ran: only the chosen trajectory is shown


# --------------------------------------------------------------------------------------------------------
# End to end with the tiny model
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arm", ["per_role", "simulator"])
def test_an_arm_frees_its_backends_models_and_kv_caches_without_the_cyclic_gc(tmp_path, monkeypatch, arm):
    """One process runs every arm, so what an arm's training and evaluation made (the trainer's rollout engines and
    frozen helpers, each evaluation's and fidelity's backends, their models and KV caches) must be freed when the
    arm is done, by reference counting alone: what waits for the cyclic collector piles up over the arms (the 135M
    experiment grew until the kernel killed it at 24 GB, in the fifth arm's fidelity; its KV caches were in reference
    cycles). The two arms with a second model in training and in fidelity."""
    path = tmp_path / "exp.yaml"
    path.write_text(TINY_YAML)
    sets = [f"out_dir={tmp_path / 'out'}", f"arms=[{arm}]", "tts_arms=[]", "fidelity_every=0", "ood_split=ood"]
    cfg = load_experiment_config(str(path), sets)
    made = Made(monkeypatch)
    with no_cyclic_gc():
        evaluate_arm(cfg, ARMS.get(arm).build(SeedRun(cfg, 0)), 0, arm=arm)
        alive = made.alive()
    assert {"HFBackend", "HFBackend.model", "SlabCache", "_Stream"} <= made.kinds()
    assert len([k for k in made.refs if k[0] == "HFBackend"]) >= 4  # training's two, evaluation's one, fidelity's
    assert alive == []


def test_memory_is_released_after_an_arms_training_before_its_evaluation_starts(tmp_path, monkeypatch):
    import envace.evaluation.experiment as experiment

    events = []
    monkeypatch.setattr(SeedRun, "sft", lambda self: events.append("train") or ("warm-up", []))
    monkeypatch.setattr(experiment, "release_memory", lambda: events.append("release"))
    monkeypatch.setattr(experiment, "arm_backend", lambda cfg, model: events.append("load engine") or object())
    monkeypatch.setattr(
        experiment,
        "evaluate_arm",
        lambda *a, **k: (
            events.append("evaluate")
            or {
                "evals": [
                    {**(ev := _success_ev([True, False])), "mode": "none", "metrics": ev["metrics"] | {"tool_f1": 1.0}}
                ],
                "fidelity": None,
            }
        ),
    )
    monkeypatch.setattr("envace.evaluation.report.write_report", lambda results, out: {"html": "r.html"})
    cfg = ExperimentConfig(arms=("sft",), seeds=(0,), tts_budgets=(0,), out_dir=str(tmp_path / "out"))
    experiment.run_experiment(cfg)
    i = events.index("evaluate")
    assert events[i - 2 : i] == ["release", "load engine"] and events.index("train") < i  # engine on the freed heap


def test_release_memory_collects_what_only_a_reference_cycle_keeps():
    import weakref

    class Node:
        pass

    with no_cyclic_gc():
        a, b = Node(), Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
        assert ref() is not None
        release_memory()
        assert ref() is None


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory):
    """``envace experiment`` with every arm, 1 seed, 1 iteration, N in {0, 1}, through the CLI."""
    root = tmp_path_factory.mktemp("experiment")
    cfg_path = root / "exp.yaml"
    cfg_path.write_text(TINY_YAML)
    out = root / "out"
    cmd = [sys.executable, "-m", "envace.cli", "experiment", "--config", str(cfg_path), "--set", f"out_dir={out}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    return cfg_path, out, p.stdout


def test_tiny_experiment_runs_every_arm_and_writes_every_report_file(tiny_experiment):
    _, out, stdout = tiny_experiment
    for name in REPORT_FILES:
        assert (out / name).stat().st_size > 0, name
    for name in REPORT_FILES:
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[experiment] [8/8] seed 0 arm caller_only" in stdout and "report:" in stdout
    assert "memory format `concat`" in (out / "report.md").read_text()  # the TTS setting the numbers came from
    res = json.loads((out / "results.json").read_text())
    assert res["arms"] == list(ALL_ARMS)
    from envace.core.checkpoint import latest_checkpoint, load_state

    for variant in ("real_env", "envace", "per_role", "simulator", "caller_only"):  # train_options reach every RL arm
        ckpt = latest_checkpoint(str(out / "seed0" / variant / "checkpoints"))
        assert load_state(ckpt)["config"]["update_epochs"] == 2, variant
    for arm in ALL_ARMS:
        rec = res["runs"][arm]["0"]
        swept = [(0, "none"), (1, "parallel"), (1, "sequential"), (1, "plan")]
        assert [(e["n"], e["mode"]) for e in rec["evals"]] == (swept if arm in TTS_ARMS else swept[:1])
        for e in rec["evals"]:
            assert {
                "success_rate",
                "success_rate/ci_lo",
                "success_rate/ci_hi",
                "pass^1",
                "tool_f1",
                "call_f1",
                "format_valid_rate",
                "wall_s",
                "gen_tokens_per_task",
            } <= set(e["metrics"])
            assert [len(r["successes"]) for r in e["per_task"]] == (
                [1, 1] if e["n"] == 0 else [1]
            )  # tts_tasks: 1 of the 2
            assert e["per_task"][0]["task_id"].startswith("bank-test-")
            if e["n"] > 0:  # what the model was told, one JSON line per task
                lines = open(e["records"], encoding="utf-8").read().splitlines()
                assert e["records"].endswith(f"seed0/{arm}-N1-{e['mode']}.jsonl") and len(lines) == 1
                assert json.loads(lines[0])["memory_mode"] == "concat"
            for r in e["per_task"]:  # generated tokens per task, rehearsal included
                assert r["gen_tokens"] == r["private_tokens"] + r["real_tokens"] and r["real_tokens"] > 0
                assert (r["attempt_tokens"] > 0 and r["private_tokens"] > r["attempt_tokens"]) == (e["n"] > 0)
        if arm in TTS_ARMS:
            par, plan = rec["evals"][1], rec["evals"][3]
            assert par["metrics"]["tts/n"] == 1.0 and plan["metrics"]["tts/n"] == 1.0
            # the plan baseline's budget: the mean tokens of one parallel attempt at the same N, and it stays within it
            assert (
                plan["plan_max_new_tokens"] == max(1, round(par["metrics"]["tts/attempt_tokens_per_attempt"]))
                and plan["plan_budget_from"] == "parallel N=1"
            )
            assert 0 < plan["per_task"][0]["attempt_tokens"] <= plan["plan_max_new_tokens"]
        assert set(rec["fidelity"]) >= {"overall", "by_domain", "by_tool", "skipped"}
        assert (
            os.path.isfile(os.path.join(rec["models"]["policy"], "config.json"))
            or rec["models"]["policy"] == "tiny-random"
        )
    start = res["runs"]["envace"]["0"]["fidelity_curve"][0]
    for arm in RL_ARMS:  # same budget: two iterations each (one optimizer step each), from the SFT checkpoint
        rec = res["runs"][arm]["0"]
        assert [m["step"] for m in rec["curve"]] == [1, 2]  # both segments' steps, read back from the run's log
        world = "real" if arm == "real_env" else "imagined"
        assert {k for k in rec["curve"][0] if k.endswith("success_rate")} == {f"reward/{world}_success_rate"}
        # fidelity on the same shadow set at the start (the SFT model, shared), after iteration 1, and at the end
        assert [p["step"] for p in rec["fidelity_curve"]] == [0, 1, 2]
        assert rec["fidelity_curve"][0] == start and rec["fidelity_curve"][-1]["summary"] == rec["fidelity"]
        assert set(rec["fidelity_curve"][1]["summary"]) >= {"overall", "by_state"}
    # held-out success at N=0 at the start (the warm-up, shared), after iteration 1, and the final evaluation
    s_start = res["runs"]["envace"]["0"]["success_curve"][0]
    assert s_start["step"] == 0 and len(s_start["per_task"]) == 2
    for arm in RL_ARMS:
        rec = res["runs"][arm]["0"]
        assert [p["step"] for p in rec["success_curve"]] == [0, 1, 2] and rec["success_curve"][0] == s_start
        final = next(e for e in rec["evals"] if e["n"] == 0)
        assert rec["success_curve"][-1] == json.loads(json.dumps(success_point(2, final)))
        assert [t["task_id"] for t in rec["success_curve"][1]["per_task"]] == [t["task_id"] for t in final["per_task"]]
    assert s_start["per_task"] == [
        {"task_id": t["task_id"], "successes": t["successes"]} for t in res["runs"]["sft"]["0"]["evals"][0]["per_task"]
    ]  # the warm-up evaluated as the sft arm is (greedy, the same tasks)
    for arm in ("base", "sft", "sft_more"):
        assert "fidelity_curve" not in res["runs"][arm]["0"] and "success_curve" not in res["runs"][arm]["0"]
    # sft_more: SFT continued from the warm-up for as many optimizer steps as each RL arm took
    more = res["runs"]["sft_more"]["0"]
    assert [m["step"] for m in more["curve"]] == [1, 2] and all("sft/nll" in m for m in more["curve"])
    done = json.loads((out / "seed0" / "sft_more" / "done.json").read_text())
    assert (
        done["steps"] == 2
        and done["batch_tasks"] == 1
        and done["n_tasks"] == 64
        and more["models"]["policy"] != res["runs"]["sft"]["0"]["models"]["policy"]
    )
    assert res["runs"]["per_role"]["0"]["models"]["rehearser"].endswith("rehearser")
    assert res["runs"]["simulator"]["0"]["models"]["simulator"] == res["runs"]["sft"]["0"]["models"]["policy"]
    md = (out / "report.md").read_text()
    for arm in ALL_ARMS:
        assert f"| {arm} |" in md
    assert "## Paired comparison with SFT" in md and "mcnemar exact" in md  # one sample per task: binary outcomes
    assert (
        "## The paper's claims" in md
        and "## Test-time compute: generated tokens" in md
        and "![Rehearsal fidelity over training](fidelity_curve.png)" in md
        and "## Held-out success over training" in md
        and "![Held-out success over training](success_curve.png)" in md
    )
    assert (out / "success_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ("## Rehearsal fidelity over training" in md) == bool(
        fidelity_curve_table(res)[1]
    )  # the tiny model may score no pair
    claims = claims_table(res)[1]
    assert len(claims) == 12 and all(r[-1] in VERDICTS for r in claims)
    assert {r[0]: r[-1] != "not measured" for r in claims}["EnvACE > SFT continued (compute-matched)"]
    # claim_n=2 was not evaluated: the test-time claims use the largest N run (1)
    assert any(
        r[0] == "rehearsal > compute-matched plans (EnvACE, N=1 parallel vs plan)" and r[-1] != "not measured"
        for r in claims
    )


def test_a_rerun_with_the_same_config_skips_finished_arms_and_another_config_is_refused(tiny_experiment, capsys):
    cfg_path, out, _ = tiny_experiment
    before = json.loads((out / "results.json").read_text())["runs"]
    res = run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={out}"]))
    assert capsys.readouterr().out.count("done before, skipped") == len(ALL_ARMS)
    assert res.results["runs"] == before and os.path.exists(res.report["html"])
    with pytest.raises(ValueError, match=r"another config \(iterations: 2 -> 3\)"):  # names the field
        run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={out}", "iterations=3"]))


def test_results_written_before_a_setting_existed_resume_at_its_default_and_refuse_another_value(
    tiny_experiment, tmp_path, capsys
):
    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "old"
    shutil.copytree(out, work)
    res = json.loads((work / "results.json").read_text())
    del res["config"]["rollout"]["native_tools"], res["config"]["tts_tasks_in_flight"]  # a run from before them
    (work / "results.json").write_text(json.dumps(res))
    run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}"]))
    assert capsys.readouterr().out.count("done before, skipped") == len(ALL_ARMS)
    with pytest.raises(ValueError, match=r"another config \(rollout.native_tools: True -> False\)"):
        run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "rollout.native_tools=false"]))


def test_a_rerun_may_report_a_subset_of_the_seeds_run_there(tiny_experiment, capsys):
    """Seeds are not part of the config comparison: a run stopped after its first seed can be reported alone."""
    cfg_path, out, _ = tiny_experiment
    alone = (out / "report.md").read_text()
    res = json.loads((out / "results.json").read_text())
    for arm in res["runs"]:  # pretend seed 9 was run too, with other training times
        res["runs"][arm]["9"] = {**res["runs"][arm]["0"], "train_s": 123456.0}
    (out / "results.json").write_text(json.dumps(res))
    run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={out}", "seeds=[0, 9]"]))
    assert (out / "report.md").read_text() != alone
    run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={out}", "seeds=[0]"]))
    assert capsys.readouterr().out.count("done before, skipped") == 3 * len(ALL_ARMS)
    assert (out / "report.md").read_text() == alone
    assert "9" in json.loads((out / "results.json").read_text())["runs"]["envace"]  # kept, only not shown


def test_a_rerun_adds_the_sweep_to_arms_finished_without_it_and_redoes_nothing(tiny_experiment, tmp_path, capsys):
    """More seeds / arms may get the test-time sweep on a rerun: a finished arm gets only the budgets it lacks
    (from its saved model, no training), its other evaluations and its curve stay as they were."""
    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    res = json.loads((work / "results.json").read_text())
    full = res["runs"]["envace"]["0"]
    res["runs"]["envace"]["0"] = {
        **full,
        "evals": [e for e in full["evals"] if e["n"] == 0],
    }  # as a run without the sweep left it
    res["config"]["tts_seeds"] = []
    (work / "results.json").write_text(json.dumps(res))
    run_experiment(
        load_experiment_config(str(cfg_path), [f"out_dir={work}", "tts_seeds=[]"])
    )  # accepted: nothing to add
    assert capsys.readouterr().out.count("done before, skipped") == len(ALL_ARMS)
    got = run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "tts_seeds=[0]"])).results["runs"][
        "envace"
    ]["0"]
    said = capsys.readouterr().out
    assert (
        "arm envace: done before; adding 3 evaluations of the sweep" in said
        and said.count("done before, skipped") == len(ALL_ARMS) - 1
    )
    assert [(e["n"], e["mode"]) for e in got["evals"]] == [(e["n"], e["mode"]) for e in full["evals"]]
    assert got["evals"][0] == full["evals"][0] and got["curve"] == full["curve"] and got["train_s"] == full["train_s"]
    assert all(e["per_task"] for e in got["evals"])


def test_a_rerun_adds_only_the_budgets_a_finished_arm_lacks_and_refuses_a_sweep_that_measures_otherwise(
    tiny_experiment, tmp_path, capsys
):
    """A run made with ``tts_budgets: [0]`` gets N = 1 on a rerun that asks for it (from its saved models, no
    training); a rerun that changes what an evaluation of the sweep measures (its memory) is refused."""
    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    res = json.loads((work / "results.json").read_text())
    full = [(e["n"], e["mode"]) for e in res["runs"]["envace"]["0"]["evals"]]
    for recs in res["runs"].values():
        for rec in recs.values():
            rec["evals"] = [e for e in rec["evals"] if e["n"] == 0]
    res["config"]["tts_budgets"] = [0]
    (work / "results.json").write_text(json.dumps(res))
    got = run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}"])).results
    said = capsys.readouterr().out
    assert "arm envace: done before; adding 3 evaluations of the sweep" in said and "training" not in said.lower()
    assert [(e["n"], e["mode"]) for e in got["runs"]["envace"]["0"]["evals"]] == full and len(full) == 4
    assert list(got["config"]["tts_budgets"]) == [0, 1]
    with pytest.raises(ValueError, match="tts_memory"):
        run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "tts_memory=calls"]))


def test_a_rerun_may_add_an_arm_which_alone_is_trained_from_the_warm_up_on_disk(tiny_experiment, tmp_path, capsys):
    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    before = json.loads((work / "results.json").read_text())["runs"]
    warm = {p: p.stat().st_mtime_ns for p in (work / "seed0" / "sft").rglob("*")}
    got = run_experiment(
        load_experiment_config(str(cfg_path), [f"out_dir={work}", f"arms=[{', '.join(ALL_ARMS)}, envace+kl]"])
    )
    assert capsys.readouterr().out.count("done before, skipped") == len(ALL_ARMS)
    assert {p: p.stat().st_mtime_ns for p in (work / "seed0" / "sft").rglob("*")} == warm  # not trained again
    assert {a: got.results["runs"][a] for a in ALL_ARMS} == before
    rec = got.results["runs"]["envace+kl"]["0"]
    assert rec["evals"][0]["per_task"] and rec["curve"][-1]["loss/policy/kl"] >= 0.0
    assert (work / "seed0" / "envace+kl").is_dir() and "envace+kl" in (work / "report.md").read_text()


def test_a_rerun_adds_the_ood_split_to_finished_arms_with_its_own_tables_and_redoes_nothing(
    tiny_experiment, tmp_path, capsys
):
    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    before = json.loads((work / "results.json").read_text())["runs"]
    got = run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "ood_split=ood", "ood_tasks=1"]))
    said = capsys.readouterr().out
    assert said.count("adding its evaluation on the ood split") == len(ALL_ARMS) and "training" not in said.lower()
    for arm in ALL_ARMS:
        rec = got.results["runs"][arm]["0"]
        assert rec["evals"] == before[arm]["0"]["evals"] and rec["curve"] == before[arm]["0"]["curve"]
        (ev,) = rec["splits"]["ood"]
        assert (ev["n"], ev["mode"]) == (0, "none") and [r["task_id"] for r in ev["per_task"]] == [
            load_tasks("bank", "ood", n=1, seed=0)[0].id
        ]
    md = (work / "report.md").read_text()
    assert "## Held-out split `ood`: each arm against SFT" in md and "![Success per arm](success.png)" in md
    run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "ood_split=ood", "ood_tasks=1"]))
    assert capsys.readouterr().out.count("done before, skipped") == len(ALL_ARMS)


def test_a_finished_arm_whose_model_is_gone_is_said_and_passed_over_while_the_others_get_the_ood_split(
    tiny_experiment, tmp_path, capsys
):
    """results.json copied without an arm's seed folder (a new checkout, a deleted run): a rerun that asks for a new
    split says which arm it cannot add it to and why, and adds it to every other arm instead of failing on a model
    path that no longer exists."""
    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    res = json.loads((work / "results.json").read_text())
    for arm in ALL_ARMS:  # as a run started from another directory recorded them: found again under work/
        rec = res["runs"][arm]["0"]["models"]
        rec["policy"] = re.sub(r"^.*[/\\](seed0[/\\])", r"runs/elsewhere/\1", rec["policy"])
    (work / "results.json").write_text(json.dumps(res))
    shutil.rmtree(work / "seed0" / "envace")
    got = run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "ood_split=ood", "ood_tasks=1"]))
    said = capsys.readouterr().out
    assert "arm envace: done before, but its model" in said and "cannot add its evaluation on the ood split" in said
    assert said.count("adding its evaluation on the ood split") == len(ALL_ARMS) - 1
    runs = got.results["runs"]
    assert "splits" not in runs["envace"]["0"] or "ood" not in runs["envace"]["0"]["splits"]
    assert all(runs[a]["0"]["splits"]["ood"][0]["per_task"] for a in ALL_ARMS if a != "envace")
    assert os.path.exists(got.report["html"])


def test_a_model_name_is_never_gone_a_missing_run_folder_is(tmp_path):
    from envace.evaluation.experiment import model_gone

    assert not model_gone("SmolLM2-135M-Instruct") and not model_gone(str(tmp_path))
    assert model_gone(str(tmp_path / "seed1" / "envace" / "checkpoints" / "step-000008" / "policy"))
    assert model_gone("runs/x/seed0/sft/policy") and not model_gone("runs/x/sft/policy")


def test_a_sweep_cut_short_keeps_the_evaluations_it_finished_and_the_rerun_adds_only_the_rest(
    tiny_experiment, tmp_path, capsys, monkeypatch
):
    """Adding the sweep to a finished arm saves results.json after each evaluation: a process killed in the middle
    (here the second evaluation fails) loses only the evaluation it was in."""
    import envace.evaluation.budget as budget

    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    res = json.loads((work / "results.json").read_text())
    full = res["runs"]["envace"]["0"]
    res["runs"]["envace"]["0"] = {**full, "evals": [e for e in full["evals"] if e["n"] == 0]}
    (work / "results.json").write_text(json.dumps(res))
    real, calls = budget.evaluate_at_budget, []

    def dies_on_the_second(*a, **kw):
        calls.append(kw.get("n"))
        if len(calls) == 2:
            raise MemoryError("killed")
        return real(*a, **kw)

    monkeypatch.setattr(budget, "evaluate_at_budget", dies_on_the_second)
    with pytest.raises(MemoryError):
        run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "tts_seeds=[0]"]))
    kept = json.loads((work / "results.json").read_text())["runs"]["envace"]["0"]["evals"]
    assert [(e["n"], e["mode"]) for e in kept] == [(e["n"], e["mode"]) for e in full["evals"][:2]]
    monkeypatch.setattr(budget, "evaluate_at_budget", real)
    capsys.readouterr()
    got = run_experiment(load_experiment_config(str(cfg_path), [f"out_dir={work}", "tts_seeds=[0]"])).results
    assert "arm envace: done before; adding 2 evaluations of the sweep" in capsys.readouterr().out
    evals = got["runs"]["envace"]["0"]["evals"]
    assert [(e["n"], e["mode"]) for e in evals] == [(e["n"], e["mode"]) for e in full["evals"]]
    assert evals[1] == kept[1]  # the evaluation finished before the cut is kept, not redone


def test_an_arm_s_first_sweep_is_saved_after_each_evaluation_so_a_cut_run_keeps_what_it_finished(
    tiny_experiment, tmp_path, monkeypatch
):
    """A newly evaluated arm is written with its N=0 evaluation before its sweep starts, and again after each sweep
    evaluation: a process killed in the sweep (here in its second evaluation) loses only the evaluation it was in,
    and the rerun adds only the rest (the warm-up on disk: nothing is trained again)."""
    import envace.evaluation.budget as budget

    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    res = json.loads((work / "results.json").read_text())
    full = res["runs"]["sft"]["0"]
    del res["runs"]["sft"]
    (work / "results.json").write_text(json.dumps(res))
    real, calls = budget.evaluate_at_budget, []

    def dies_on_the_third(*a, **kw):
        calls.append((kw.get("n"), kw.get("mode")))
        if len(calls) == 3:
            raise MemoryError("killed")
        return real(*a, **kw)

    monkeypatch.setattr(budget, "evaluate_at_budget", dies_on_the_third)
    sets = [f"out_dir={work}", "arms=[sft]"]
    with pytest.raises(MemoryError):
        run_experiment(load_experiment_config(str(cfg_path), sets))
    kept = json.loads((work / "results.json").read_text())["runs"]["sft"]["0"]["evals"]
    assert [(e["n"], e["mode"]) for e in kept] == [(0, "none"), (1, "parallel")] == calls[:2]
    monkeypatch.setattr(budget, "evaluate_at_budget", real)
    evals = run_experiment(load_experiment_config(str(cfg_path), sets)).results["runs"]["sft"]["0"]["evals"]
    assert [(e["n"], e["mode"]) for e in evals] == [(e["n"], e["mode"]) for e in full["evals"]]
    assert evals[:2] == kept  # finished before the cut: kept, not redone


def test_an_arm_s_evaluation_split_and_sweep_share_one_engine_on_a_first_run_and_on_a_rerun(
    tiny_experiment, tmp_path, monkeypatch
):
    """The arm's engine is loaded once for its N=0 evaluation, its ``ood_split`` evaluation, its fidelity and its
    sweep (a vLLM engine takes ~30 s to start): on a first run, and on a rerun adding both a sweep and a split."""
    import envace.evaluation.experiment as experiment

    cfg_path, out, _ = tiny_experiment
    work = tmp_path / "out"
    shutil.copytree(out, work)
    res = json.loads((work / "results.json").read_text())
    del res["runs"]["sft"]
    full = res["runs"]["envace"]["0"]
    res["runs"]["envace"]["0"] = {**full, "evals": [e for e in full["evals"] if e["n"] == 0]}
    (work / "results.json").write_text(json.dumps(res))
    real, loaded = experiment.arm_backend, []

    def counted(cfg, model):
        loaded.append(model)
        return real(cfg, model)

    monkeypatch.setattr(experiment, "arm_backend", counted)
    sets = [f"out_dir={work}", "arms=[sft, envace]", "ood_split=ood", "ood_tasks=1"]
    got = run_experiment(load_experiment_config(str(cfg_path), sets)).results["runs"]
    for arm in ("sft", "envace"):
        evals = got[arm]["0"]["evals"]
        assert [(e["n"], e["mode"]) for e in evals] == [(0, "none"), (1, "parallel"), (1, "sequential"), (1, "plan")]
        assert got[arm]["0"]["splits"]["ood"][0]["per_task"]
        assert loaded.count(got[arm]["0"]["models"]["policy"]) == 1, (arm, loaded)


def test_a_recorded_model_is_found_under_the_out_dir_when_the_rerun_starts_elsewhere(tmp_path, monkeypatch):
    from envace.evaluation.experiment import ExperimentConfig, recorded_model

    saved = tmp_path / "new" / "seed2" / "sft" / "checkpoints" / "step-000016" / "policy"
    saved.mkdir(parents=True)
    cfg = ExperimentConfig(out_dir=str(tmp_path / "new"))
    as_recorded = "runs/old-name/seed2/sft/checkpoints/step-000016/policy"  # relative to the first run's directory
    monkeypatch.chdir(tmp_path)
    assert recorded_model(cfg, as_recorded) == str(saved)
    assert recorded_model(cfg, "SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"  # a name stays a name
    assert recorded_model(cfg, "runs/old-name/seed3/sft/policy") == "runs/old-name/seed3/sft/policy"  # not there
    assert recorded_model(cfg, str(saved)) == str(saved)


def _first_of_group(task, traj, ctx):
    """A reward that differs within every group (a random tiny model never earns a real one), so the update moves."""
    from envace.rewards.functions import RewardResult

    return RewardResult(1.0 if traj.id.endswith("/0") else 0.0)


def test_training_in_fidelity_segments_ends_with_the_weights_of_one_uninterrupted_run(tmp_path, monkeypatch):
    """The fidelity curve trains each RL arm in segments (train to step 1, measure, resume to step 2): the
    segments must compute what one run computes, or the curve's arms would not be the arms evaluated."""
    import dataclasses

    import torch
    from safetensors.torch import load_file

    from envace.backends.base import SamplingParams
    from envace.config import TrainConfig
    from envace.rewards.functions import REWARDS
    from envace.training.trainer import train

    monkeypatch.setitem(REWARDS._entries, "segments_first_of_group", _first_of_group)  # only for this test
    small = SamplingParams(temperature=1.0, max_new_tokens=8)
    rc = RolloutConfig(
        max_steps=2,
        max_steps_per_turn=2,
        act=small,
        rehearse=small.with_(stop=["</observation>"]),
        progress=False,
    )
    base = TrainConfig(
        model="tiny-random",
        suite="bank",
        n_train_tasks=8,
        variant="envace",
        reward="segments_first_of_group",
        iterations=2,
        batch_tasks=1,
        lr=1e-3,
        group_size=2,
        rollout=rc,
        save_every=2,
        keep_checkpoints=1,
        tensorboard=False,
        progress=False,
    )
    whole = train(dataclasses.replace(base, out_dir=str(tmp_path / "whole")))
    first = train(dataclasses.replace(base, out_dir=str(tmp_path / "seg"), iterations=1))
    w1 = load_file(os.path.join(first.checkpoint, "policy", "model.safetensors"))
    seg = train(dataclasses.replace(base, out_dir=str(tmp_path / "seg")))
    a, b = (load_file(os.path.join(r.checkpoint, "policy", "model.safetensors")) for r in (whole, seg))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(w1[k], b[k]) for k in b)  # the second step moved the weights: the check can fail
    assert [m["step"] for m in seg.metrics] == [2] and whole.metrics[1]["reward/mean"] == seg.metrics[0]["reward/mean"]


def test_the_simulator_arm_s_fidelity_is_rehearsed_by_the_simulator_it_trained_with(tmp_path, monkeypatch):
    """``train_options.simulator_model`` answers the simulator arm's Rehearse in training; its fidelity rollouts must
    be answered by that same model, not by the SFT start (the trainer's default simulator)."""
    import yaml

    import envace.evaluation.experiment as experiment
    from envace.backends.models import load
    from envace.backends.scripted import ScriptedBackend
    from envace.core.checkpoint import latest_checkpoint, load_state

    sim = str(tmp_path / "sim")  # another model folder than the SFT checkpoint
    model, tok = load("tiny-random")
    model.save_pretrained(sim)
    tok.save_pretrained(sim)
    opts = {"arms": ["simulator"], "iterations": 1, "fidelity_every": 0, "out_dir": str(tmp_path / "out")}
    cfg = ExperimentConfig(**(yaml.safe_load(TINY_YAML) | opts | {"train_options": {"simulator_model": sim}}))
    models = ARMS.get("simulator").build(experiment.SeedRun(cfg, 0))
    ckpt = latest_checkpoint(os.path.join(cfg.out_dir, "seed0", "simulator", "checkpoints"))
    assert load_state(ckpt)["config"]["simulator_model"] == models.simulator == sim

    answered = []
    real_backend = experiment.arm_backend

    def recording(c, name):
        be = real_backend(c, name)
        chat = be.chat
        be.chat = lambda convs, params: answered.extend([name] * len(convs)) or chat(convs, params)
        return be

    monkeypatch.setattr(experiment, "arm_backend", recording)
    (task,) = load_tasks(cfg.suite, cfg.eval_split, n=cfg.fidelity_tasks, seed=0)
    gold = render_act([task.flat_gold()[0]])
    caller = ScriptedBackend(tok, lambda prompt: gold if "<|im_start|>tool" not in prompt else "done")
    cfg.rollout.act = cfg.rollout.act.with_(max_new_tokens=64)  # room for the scripted call
    fid = experiment.arm_fidelity(cfg, models, 0, caller)
    assert answered and set(answered) == {sim}
    assert any("simulator" in st.sources for t in fid.trajectories for st in t.steps)


def test_the_rehearse_stage_trains_only_rehearse_rows_from_the_warm_up_and_every_arm_starts_after_it(
    tmp_path, monkeypatch
):
    """``rehearse_steps``: a second warm-up stage, Rehearse rows only, from the warm-up's checkpoint; the sft arm is
    its checkpoint and the curve continues the warm-up's step numbers; a second SeedRun (a rerun) reuses it."""
    import yaml

    import envace.evaluation.experiment as experiment
    import envace.training.sft as sft_module

    real_sft, seen = sft_module.sft, []
    monkeypatch.setattr(sft_module, "sft", lambda scfg: seen.append(scfg) or real_sft(scfg))
    opts = {"arms": ["sft"], "sft_steps": 2, "rehearse_steps": 1, "out_dir": str(tmp_path / "out")}
    cfg = ExperimentConfig(**(yaml.safe_load(TINY_YAML) | opts))
    models = ARMS.get("sft").build(experiment.SeedRun(cfg, 0))
    warm, stage = seen
    assert warm.roles == ("act", "rehearse") and stage.roles == ("rehearse",) and stage.steps == 1
    assert stage.model.startswith(os.path.join(cfg.out_dir, "seed0", "sft", "checkpoints"))
    assert models.policy.startswith(os.path.join(cfg.out_dir, "seed0", "sft_rehearse"))
    assert [(m["step"], m.get("stage")) for m in models.curve] == [(1, None), (2, None), (3, "rehearse")]
    ARMS.get("sft").build(experiment.SeedRun(cfg, 0))
    assert len(seen) == 2  # both stages finished before: nothing trained again
    with pytest.raises(ValueError, match="rehearse_steps"):
        ExperimentConfig(rehearse_steps=-1)


def test_the_notes_stage_trains_on_notes_in_the_test_time_format_from_the_warm_up_and_every_arm_starts_after_it(
    tmp_path, monkeypatch
):
    """``notes_steps``: a last warm-up stage from the warm-up's checkpoint with notes distilled from rehearsals in the
    format of ``tts_memory``, at its own lr, tasks and batch; ``notes_attempts: 0`` is the same stage without notes;
    the curve continues the step numbers; a rerun reuses it; a memory format training cannot write is refused."""
    import yaml

    import envace.evaluation.experiment as experiment
    import envace.training.sft as sft_module

    real_sft, seen = sft_module.sft, []
    monkeypatch.setattr(sft_module, "sft", lambda scfg: seen.append(scfg) or real_sft(scfg))
    opts = {
        "arms": ["sft"],
        "sft_steps": 2,
        "notes_steps": 1,
        "notes_tasks": 2,
        "notes_batch_tasks": 1,
        "notes_lr": 3e-6,
        "notes_attempts": 1,
        "tts_memory": "agreed-live",
        "out_dir": str(tmp_path / "out"),
    }
    cfg = ExperimentConfig(**(yaml.safe_load(TINY_YAML) | opts))
    models = ARMS.get("sft").build(experiment.SeedRun(cfg, 0))
    warm, stage = seen
    assert warm.memory_attempts == 0 and warm.lr == cfg.sft_lr
    assert (stage.memory_attempts, stage.memory_format, stage.lr) == (1, "agreed-live", 3e-6)
    assert (stage.steps, stage.n_tasks, stage.batch_tasks) == (1, 2, 1)
    assert stage.model.startswith(os.path.join(cfg.out_dir, "seed0", "sft", "checkpoints"))
    assert models.policy.startswith(os.path.join(cfg.out_dir, "seed0", "sft_notes"))
    assert [(m["step"], m.get("stage")) for m in models.curve] == [(1, None), (2, None), (3, "notes")]
    ARMS.get("sft").build(experiment.SeedRun(cfg, 0))
    assert len(seen) == 2  # both stages finished before: nothing trained again

    control = ExperimentConfig(
        **(yaml.safe_load(TINY_YAML) | opts | {"notes_attempts": 0, "out_dir": str(tmp_path / "c")})
    )
    seen.clear()
    experiment.SeedRun(control, 0).sft()
    assert seen[1].memory_attempts == 0 and seen[1].steps == 1 and seen[1].lr == 3e-6
    with pytest.raises(ValueError, match="tts_memory"):
        ExperimentConfig(notes_steps=4, tts_memory="lessons")
    ExperimentConfig(notes_steps=4, notes_attempts=0, tts_memory="lessons")  # the control writes no notes
    with pytest.raises(ValueError, match="notes_steps"):
        ExperimentConfig(notes_steps=-1)


def test_the_report_opens_with_the_claims_in_a_sentence_naming_those_that_hold_or_do_not(synthetic):
    from envace.evaluation.report import verdict_summary

    head = ["claim", "paper", "contrast", "measured", "paired 95% CI", "p", "95% CI, seeds × templates"]
    head += ["tasks", "seeds", "verdict"]
    row = lambda text, d, ci, v, wide="–": [text, "", "", d, ci, "", wide, "", "", v]  # noqa: E731
    rows = [
        row("A > B", "+0.125", "[+0.040, +0.210]", "holds"),
        row("A > C", "-0.055", "[-0.085, -0.025]", "does not hold", "[-0.105, -0.005] (3 × 4 templates)"),
        row("A > D", "+0.010", "[-0.050, +0.070]", "cannot tell at this scale"),
        row("A > E", "-0.010", "[-0.080, +0.060]", "cannot tell at this scale"),
        row("A at N=2", "–", "–", "not measured"),
    ]
    assert verdict_summary((head, rows)) == (
        "In short, holds: A > B (+0.125 [+0.040, +0.210]); does not hold: A > C (-0.055 [-0.105, -0.005] "
        "(3 × 4 templates)); "
        "cannot tell at this scale: 2 claims; not measured: 1 claim."
    )
    assert verdict_summary((head, [])) == ""
    results, files = synthetic
    summary = verdict_summary(claims_table(results))
    md = open(files["md"], encoding="utf-8").read()
    assert summary.startswith("In short, ") and f"**{summary}**" in md.split("## The paper's claims")[0]
    assert html.escape(summary) in open(files["html"], encoding="utf-8").read()
