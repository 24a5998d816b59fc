"""The experiment report: tables (95% intervals over tasks, spread over seeds), figures and a trajectory viewer, all
static files.

The claims table has its own module (:mod:`envace.evaluation.claims`), as has the trajectory viewer
(:mod:`envace.evaluation.viewer`); both read ``results.json`` through :mod:`envace.evaluation.results`. Their names
stay importable from here for one version (issue 30).

:func:`write_report` turns an experiment's ``results.json`` content (envace.evaluation.experiment) into, in its folder:

- ``report.md`` and ``report.html``: the paper's claims (:func:`claims_table`: one row per claim of
  :func:`paper_claims` with its measured paired difference, 95% interval and verdict, :func:`claim_verdict`),
  the main table (every arm at N=0: success with its 95% Wilson interval over
  tasks and its spread over seeds), the paired comparison of every RL arm with SFT (difference, paired bootstrap
  interval, p-value; envace.math.stats), success by task kind (when tasks carry one), the test-time rehearsal table
  (success at every budget N and mode, the compute-matched ``plan`` baseline included), each budget paired with
  the same arm at N=0 and with the plan baseline at the same N (:func:`tts_paired_table`), and its generated tokens
  per task, rehearsal fidelity over training (each RL arm on the fixed shadow set), the rehearsal-fidelity tables
  (overall; read vs write, state fields changed, real success vs error, position; per domain, per tool) and the
  figures. The HTML page embeds its figures (base64) and needs nothing from the network.
- ``curve_reward.png`` (training reward vs step, one line per RL arm, mean +- std band over seeds),
  ``curve_train_success.png`` (success on the training rollouts, named by where their observations came from:
  *imagined* for rehearsed / simulated rollouts, *real env* for real_env; the two are not the same quantity),
  ``curve_sft_nll.png`` (the warm-up), ``tts_budget.png`` (success vs N; plan dotted) and ``fidelity_curve.png``
  (fidelity on the shadow set vs RL step, one line per arm), and with ``success_every`` ``success_curve.png`` (held-out
  success at N=0 vs RL step; its table counts the tasks won / lost against the SFT model).
- ``trajectories.html`` (:func:`envace.evaluation.viewer.viewer_html`): shadow trajectories of each arm, each
  rehearsed observation beside the real one, mismatching leaves highlighted.

Pages set ``document.title`` from a script when they load (tests use it to detect script errors).
"""

from __future__ import annotations

import base64
import html
import os
from typing import Any, Sequence

import numpy as np

from .fidelity import BREAKDOWNS as FID_BREAKDOWNS
from .fidelity import METRICS as FID_METRICS
from ..math.stats import fmt_p, fmt_rate, rate_interval
from .claims import (
    SEEDS_CLUSTERS_CI,
    VERDICTS,
    Claim,
    claim_n,
    claim_verdict,
    claims_by_seed_table,
    claims_table,
    measure_claim,
    measure_claims,
    paper_claims,
)
from .results import (
    budget_keys,
    budget_label,
    curve,
    eval_entry,
    eval_values,
    extra_splits,
    fidelity_values,
    fmt_ms,
    fmt_values,
    mean_std,
    outcome_changes,
    over_seeds,
    per_task_outcomes,
    seed_cell,
    seed_runs,
    split_view,
    success_cell,
    task_changes,
)
from .viewer import LOADED_SUFFIX, json_html, page, trajectory_html, viewer_html

MAIN_METRICS: tuple[tuple[str, str], ...] = (
    ("success_rate", "success"),
    ("tool_f1", "tool F1"),
    ("tool_precision", "tool P"),
    ("tool_recall", "tool R"),
    ("call_f1", "call F1"),
    ("format_valid_rate", "format valid"),
    ("steps_per_traj", "steps"),
    ("act_tokens_per_traj", "Act tokens"),
    ("wall_s", "eval s"),
)
RATE_METRICS = ("success_rate", "tool_f1", "tool_precision", "tool_recall", "call_f1", "format_valid_rate")
TRAIN_SUCCESS_CURVES: dict[str, str] = {
    "reward/imagined_success_rate": "imagined",
    "reward/real_success_rate": "real env",
}
"""Training-success metrics (envace.training.trainer._summarise) -> the legend's name for them: success of imagined
(rehearsed / simulated) trajectories is never drawn as if it were real-environment success."""
TRAIN_SUCCESS_NOTE = (
    "Training success: 'imagined' is the success of rehearsed or simulated rollouts (envace, per_role, simulator), "
    "whose tool results the model imagined; 'real env' is the success of real_env's rollouts in the real environment. "
    "They measure different things; the real-environment evaluation is the main table."
)


# --------------------------------------------------------------------------------------------------------
# Tables (rows of cells, rendered as Markdown or HTML)
# --------------------------------------------------------------------------------------------------------


def main_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    k = int(results["config"].get("eval_samples", 1))
    metrics = list(MAIN_METRICS)
    if k > 1:
        metrics.insert(1, (f"pass^{k}", f"pass^{k}"))
    head = [
        "arm",
        "success [95% CI]",
        "success over seeds",
        *[lbl for _, lbl in metrics[1:]],
        "fidelity leaf acc",
        "train s",
    ]
    rows = []
    for arm in results["arms"]:
        row = [
            arm,
            success_cell(results, arm, 0, "none"),
            seed_cell(eval_values(results, arm, 0, "none", "success_rate")),
        ]
        row += [
            fmt_values(
                eval_values(results, arm, 0, "none", m),
                3 if m in RATE_METRICS or m.startswith("pass^") else 1,
            )
            for m, _ in metrics[1:]
        ]
        row.append(fmt_values(fidelity_values(results, arm)["leaf_acc"]))
        row.append(fmt_values([r.get("train_s", 0.0) for r in seed_runs(results, arm)], 0))
        rows.append(row)
    return head, rows


def sweep_scope(results: dict[str, Any], arm: str) -> tuple[list[str], set[str]] | None:
    """(seeds, task ids) of an arm's test-time sweep (its evaluations at N > 0: ``tts_seeds`` and ``tts_tasks``
    may make them a subset of the N=0 ones), or None without a sweep or when it kept no per-task outcomes."""
    seeds: list[str] = []
    ids: set[str] = set()
    for s in sorted(results["runs"].get(arm, {}), key=int):
        ev = [e for e in results["runs"][arm][s]["evals"] if e["n"] > 0]
        if not ev:
            continue
        if any("per_task" not in e for e in ev):
            return None
        seeds.append(s)
        ids |= {r["task_id"] for e in ev for r in e["per_task"]}
    return (seeds, ids) if seeds else None


def budget_seeds(results: dict[str, Any], arm: str, n: int, mode: str, seeds: Sequence[str]) -> list[str]:
    """The seeds among ``seeds`` in which ``arm`` was evaluated at (n, mode) with per-task outcomes: a sweep whose
    seeds ran different budgets (one seed to N=3, another to N=2) pairs each budget with N=0 on these alone."""
    return [
        s
        for s in seeds
        if (e := eval_entry(results["runs"].get(arm, {}).get(s, {"evals": []}), n, mode)) is not None
        and "per_task" in e
    ]


def sweep_rate(
    results: dict[str, Any], arm: str, n: int, mode: str
) -> tuple[tuple[float, float, float], dict[str, float]] | None:
    """((rate, low, high) pooled over the sweep's tasks and the seeds evaluated at (n, mode), {seed: that seed's
    rate}) at (n, mode), N=0 included, so every budget of the N curve is measured on the same tasks; a budget that
    only some of the sweep's seeds ran is pooled over those (:func:`budget_seeds`; the caller says so). None
    without a scope or without outcomes at (n, mode)."""
    scope = sweep_scope(results, arm)
    if scope is None:
        return None
    seeds, ids = scope
    seeds = budget_seeds(results, arm, n, mode, seeds)
    rows = [r for r in per_task_outcomes(results, arm, n, mode, seeds) if r["task_id"] in ids]
    if not rows:
        return None
    per_seed = {}
    for s in seeds:
        mine = [r["successes"] for r in per_task_outcomes(results, arm, n, mode, [s]) if r["task_id"] in ids]
        if mine:
            per_seed[s] = rate_interval(mine)[0]
    return rate_interval([r["successes"] for r in rows]), per_seed


def seeds_note(used: Sequence[str], scope: Sequence[str]) -> str:
    """`` (seed 1)`` / `` (seeds 0, 1)`` where a cell pools fewer seeds than its sweep, else empty."""
    if list(used) == list(scope):
        return ""
    return f" (seed{'s' if len(used) != 1 else ''} {', '.join(used)})"


def tts_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Success at every budget: ``rate [95% CI]`` pooled over the sweep's seeds and tasks (:func:`sweep_rate`, N=0
    on the same ones), ``· sd`` over seeds when several, and the seeds in brackets where a budget ran on fewer of
    them than the sweep. Results without per-task outcomes at N > 0 show :func:`success_cell` instead."""
    keys = budget_keys(results)
    head = ["arm", *[budget_label(n, m) for n, m in keys]]
    rows = []
    for arm in tts_arms_run(results):
        cells = []
        scope = sweep_scope(results, arm) or ([], set())
        for n, m in keys:
            sr = sweep_rate(results, arm, n, m)
            if sr is None:
                cells.append(success_cell(results, arm, n, m, spread=True))
                continue
            (rate, lo, hi), per_seed = sr
            sd = f" · sd {mean_std(list(per_seed.values()))[1]:.3f}" if len(per_seed) > 1 else ""
            cells.append(fmt_rate(rate, lo, hi) + sd + seeds_note(list(per_seed), scope[0]))
        rows.append([arm, *cells])
    return head, rows


def _diff_cells(c: dict[str, Any]) -> list[str]:
    """A paired comparison (envace.evaluation.trials.compare_per_task's ``overall``) as three cells: the difference,
    its 95% interval and the p-value."""
    return [f"{c['diff']:+.3f}", "[{:+.3f}, {:+.3f}]".format(*c["diff_ci95"]), fmt_p(c["p"])]


def tts_paired_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Each budget N > 0 of each swept arm, paired task by task on the sweep's tasks (:func:`sweep_scope`) and the
    seeds that ran that budget (:func:`budget_seeds`) with the same arm at N=0 and, for a rehearsal mode, with the
    compute-matched ``plan`` baseline at the same N (on the seeds that ran both): the difference with its paired
    bootstrap 95% interval and p-value (envace.evaluation.trials.compare_per_task), the (task, seed) outcomes won /
    lost against N=0, and the seeds."""
    from .trials import compare_per_task

    head = [
        "arm",
        "budget",
        "success [95% CI]",
        "- N=0",
        "paired 95% CI",
        "p",
        "won / lost",
        "- plan",
        "paired 95% CI",
        "p",
        "seeds",
    ]
    rows: list[list[str]] = []
    for arm in tts_arms_run(results):
        scope = sweep_scope(results, arm)
        if scope is None:
            continue
        seeds, ids = scope
        at = lambda n, m, ss: [r for r in per_task_outcomes(results, arm, n, m, ss) if r["task_id"] in ids]  # noqa: E731
        for n, m in [k for k in budget_keys(results) if k[0] > 0]:
            ran = budget_seeds(results, arm, n, m, budget_seeds(results, arm, 0, "none", seeds))
            b, zero = at(n, m, ran), at(0, "none", ran)
            if not b or not zero:  # (no seed ran both: both empty)
                continue
            c = compare_per_task(zero, b)["overall"]
            ch = outcome_changes(results, arm, arm, n, m, baseline_at=(0, "none"), tasks=ids)
            row = [arm, budget_label(n, m), fmt_rate(c["b"]["rate"], *c["b"]["ci95"]), *_diff_cells(c)]
            row.append(f"{ch['won']} / {ch['lost']}" if ch else "–")
            both = budget_seeds(results, arm, n, "plan", ran) if m != "plan" else []
            plan = at(n, "plan", both) if both else []
            row += _diff_cells(compare_per_task(plan, at(n, m, both))["overall"]) if plan else ["–", "–", "–"]
            row.append(", ".join(ran) + ("" if both in ([], ran) else f" (plan: {', '.join(both)})"))
            rows.append(row)
    return head, rows


def tts_arms_run(results: dict[str, Any]) -> list[str]:
    """The arms evaluated at some budget N > 0 (the test-time sweep), in arm order."""
    return [a for a in results["arms"] if any(e["n"] > 0 for rec in seed_runs(results, a) for e in rec["evals"])]


def tts_tokens_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Generated tokens per task at every budget N > 0: ``attempts A · all P`` with A the tokens of the private
    attempts (Act + Rehearse of rehearsed attempts, or the plans of the compute-matched baseline) and P everything
    generated before the real run (+ reflections, memory), mean over seeds of the per-seed means; then the
    plan budget that was set. Whether the baseline was matched can be read off each row."""
    keys = [k for k in budget_keys(results) if k[0] > 0]
    head = ["arm", *[budget_label(n, m) for n, m in keys]]
    rows = []
    for arm in tts_arms_run(results):
        cells = []
        for n, m in keys:
            att = eval_values(results, arm, n, m, "tts/attempt_tokens_per_task")
            allt = eval_values(results, arm, n, m, "tts/rehearsal_tokens_per_task")
            budgets = [
                e["plan_max_new_tokens"]
                for rec in seed_runs(results, arm)
                for e in rec["evals"]
                if e["n"] == n and e["mode"] == m and "plan_max_new_tokens" in e
            ]
            cell = f"{np.mean(att):.0f} · {np.mean(allt):.0f}" if att and allt else "–"
            cells.append(cell + (f" (plan ≤ {np.mean(budgets):.0f})" if budgets else ""))
        rows.append([arm, *cells])
    return head, rows


def kind_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Success at N=0 by task kind (tasks carrying ``metadata["kind"]``), ``rate [95% CI] (tasks)`` pooled over
    seeds; no rows when no task has a kind."""
    per_arm = {arm: per_task_outcomes(results, arm, 0, "none") for arm in results["arms"]}
    kinds = sorted({str(r["kind"]) for rows in per_arm.values() for r in rows if "kind" in r})
    rows = []
    for arm, ts in per_arm.items():
        cells = []
        for k in kinds:
            sel = [r["successes"] for r in ts if str(r.get("kind")) == k]
            cells.append(f"{fmt_rate(*rate_interval(sel))} ({len(sel)})" if sel else "–")
        if kinds:
            rows.append([arm, *cells])
    return ["arm", *kinds], rows


PAIRED_HEAD = ["arm [95% CI]", "paired 95% CI", "p", "test", "won / lost", "tasks", "seeds"]
PAIRED_CELLS = len(PAIRED_HEAD) + 2  # a row of _paired_row: PAIRED_HEAD's cells, the baseline's rate and the difference


def _paired_row(results: dict[str, Any], arm: str, baseline: str) -> list[str]:
    """``arm`` against ``baseline`` at N=0 on the seeds in which both were evaluated (a split view may lack an arm's
    evaluation in some): both rates, the difference and its interval, p, the test, won / lost, tasks, seeds."""
    from .trials import compare_per_task

    seeds = [
        s
        for s in sorted(set(results["runs"].get(arm, {})) & set(results["runs"].get(baseline, {})), key=int)
        if all(eval_entry(results["runs"][x][s], 0, "none") is not None for x in (arm, baseline))
    ]
    a, b = per_task_outcomes(results, baseline, 0, "none", seeds), per_task_outcomes(results, arm, 0, "none", seeds)
    if not a or not b:
        return ["–"] * PAIRED_CELLS
    c = compare_per_task(a, b)["overall"]
    ch = outcome_changes(results, arm, baseline)
    return [
        fmt_rate(c["a"]["rate"], *c["a"]["ci95"]),
        fmt_rate(c["b"]["rate"], *c["b"]["ci95"]),
        *_diff_cells(c),
        c["p_method"].replace("_", " "),
        f"{ch['won']} / {ch['lost']}" if ch else "–",
        str(c["n_tasks"]),
        str(len(seeds)),
    ]


def paired_table(results: dict[str, Any], baseline: str = "sft") -> tuple[list[str], list[list[str]]]:
    """Each RL arm against ``baseline`` at N=0, paired over the same held-out tasks (per-task outcomes pooled over
    the seeds both ran): both rates with 95% Wilson intervals, the difference (arm - baseline) with its paired
    bootstrap 95% interval, and the p-value (exact McNemar with one binary outcome per task, else paired
    sign-flip permutation); see envace.math.stats."""
    head = ["arm", f"{baseline} [95% CI]", PAIRED_HEAD[0], f"arm - {baseline}", *PAIRED_HEAD[1:]]
    if baseline not in results["arms"]:
        return head, []
    arms = [a for a in results["arms"] if a not in ("base", baseline)]
    return head, [[arm, *_paired_row(results, arm, baseline)] for arm in arms]


def option_arm_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Each option arm (``<variant>+<option>``, envace.evaluation.experiment.OPTION_ARMS) against its plain variant
    at N=0, as :func:`paired_table` does against SFT: what the option adds to the arm it is an option of. No rows
    when no option arm ran beside its variant."""
    head = ["option arm", "variant", "variant [95% CI]", PAIRED_HEAD[0], "arm - variant", *PAIRED_HEAD[1:]]
    rows = []
    for arm in results["arms"]:
        variant = arm.split("+", 1)[0]
        if "+" in arm and variant in results["arms"]:
            rows.append([arm, variant, *_paired_row(results, arm, variant)])
    return head, rows


# --------------------------------------------------------------------------------------------------------
# Rehearsal fidelity over training
# --------------------------------------------------------------------------------------------------------


def fidelity_curve(
    results: dict[str, Any], arm: str, metric: str = "leaf_acc"
) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std over seeds) of an arm's fidelity on the fixed shadow set (``fidelity_curve`` of each
    seed's record), at the steps every seed measured with at least one scored pair."""
    return over_seeds(fidelity_points(results, arm, metric))


def fidelity_points(results: dict[str, Any], arm: str, metric: str = "leaf_acc") -> list[dict[int, float]]:
    """Each seed's fidelity curve, ``{step: metric}`` of its points with at least one scored pair."""
    return [
        {
            int(p["step"]): float(p["summary"]["overall"][metric])
            for p in rec.get("fidelity_curve") or []
            if p.get("summary") and p["summary"]["overall"].get("n")
        }
        for rec in seed_runs(results, arm)
    ]


def n_curves(per_seed: list[dict[int, float]]) -> int:
    """How many seeds a curve of :func:`~envace.evaluation.results.over_seeds` averages (its non-empty ones)."""
    return sum(1 for d in per_seed if d)


def fidelity_curve_table(results: dict[str, Any], metric: str = "leaf_acc") -> tuple[list[str], list[list[str]]]:
    """Fidelity ``metric`` per RL arm at every measured step (mean ± std over seeds)."""
    curves = {a: fidelity_curve(results, a, metric) for a in results["arms"]}
    steps = sorted({s for st, _, _ in curves.values() for s in st})
    rows = []
    for arm, (st, mean, std) in curves.items():
        if st:
            at = {s: (m, sd) for s, m, sd in zip(st, mean, std)}
            n = n_curves(fidelity_points(results, arm, metric))
            rows.append([arm, *[fmt_ms(at[s], n=n) if s in at else "–" for s in steps]])
    return ["arm", *[f"step {s}" for s in steps]], rows


def fidelity_table(results: dict[str, Any], group: str = "overall") -> tuple[list[str], list[list[str]]]:
    """Overall: one row per arm. by_domain / by_tool: one row per (arm, domain or tool)."""
    head = ["arm"] + ([] if group == "overall" else [group[3:]]) + ["pairs", *FID_METRICS]
    rows = []
    for arm in results["arms"]:
        names: list[str | None] = [None]
        if group != "overall":
            names = sorted(
                {n for rec in seed_runs(results, arm) if rec.get("fidelity") for n in rec["fidelity"].get(group, {})}
            )
        for name in names:
            v = fidelity_values(results, arm, group, name)
            if not v["n"]:
                if group == "overall":  # keep the arm visible: its Rehearse role was never asked
                    rows.append([arm, "0"] + ["–"] * len(FID_METRICS))
                continue
            rows.append(
                [arm]
                + ([] if name is None else [name])
                + [f"{np.mean(v['n']):.0f}"]
                + [fmt_values(v[k]) for k in FID_METRICS]
            )
    return head, rows


def fidelity_breakdown_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Fidelity where rehearsal fails (envace.evaluation.fidelity.BREAKDOWNS): per arm, read vs write calls, the number
    of state fields changed, real success vs error and the position in the trajectory; mean ± std over seeds."""
    head = ["arm", "split", "bucket", "pairs", *FID_METRICS]
    rows = []
    for arm in results["arms"]:
        for key, bd in FID_BREAKDOWNS.items():
            for name in bd.order:
                v = fidelity_values(results, arm, key, name)
                if v["n"]:
                    rows.append(
                        [arm, key[3:], name, f"{np.mean(v['n']):.0f}"] + [fmt_values(v[k]) for k in FID_METRICS]
                    )
    return head, rows


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def html_table(head: list[str], rows: list[list[str]], cls: str = "t") -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


# --------------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def curve_lines(
    results: dict[str, Any], keys: str | dict[str, str], arms: Sequence[str] | None = None
) -> list[tuple[str, str, str]]:
    """The lines a figure of training metrics draws, as ``(legend label, arm, metric key)``: for one metric
    (``keys`` a str) one line per arm that logged it, labelled with the arm; for several named ones
    (``{key: name}``) one line per (arm, key) the arm logged, labelled ``"<arm> (<name>)"``."""
    named = {keys: ""} if isinstance(keys, str) else dict(keys)
    out = []
    for arm in arms if arms is not None else results["arms"]:
        for key, name in named.items():
            if curve(results, arm, key)[0]:
                out.append((f"{arm} ({name})" if name else arm, arm, key))
    return out


def plot_curves(
    results: dict[str, Any],
    key: str | dict[str, str],
    path: str,
    title: str,
    arms: Sequence[str] | None = None,
    ylabel: str | None = None,
) -> str:
    """Training metric(s) vs step, mean +- std band over seeds; ``key`` as in :func:`curve_lines`."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    lines = curve_lines(results, key, arms)
    for label, arm, k in lines:
        steps, mean, std = curve(results, arm, k)
        m, s = np.asarray(mean), np.asarray(std)
        ax.plot(steps, m, marker="o", ms=3, label=label)
        ax.fill_between(steps, m - s, m + s, alpha=0.2)
    if not lines:
        ax.text(0.5, 0.5, "no training steps logged", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or (key if isinstance(key, str) else "value"))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_tts(results: dict[str, Any], path: str, metric: str = "success_rate") -> str:
    """Success vs rehearsal budget N per swept arm: parallel solid, sequential dashed, plan dotted (all from the N=0
    point), on the sweep's tasks and seeds with 95% Wilson bars (:func:`sweep_rate`; else mean ± std over seeds); a
    budget that ran on fewer of the sweep's seeds has an open marker."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    keys = budget_keys(results)
    modes = sorted({m for n, m in keys if n > 0}) or ["none"]
    styles = {"parallel": "-", "sequential": "--", "plan": ":"}

    def point(arm: str, n: int, mode: str, scope: list[str]) -> tuple[float, float, float, bool]:
        """(y, below, above, fewer seeds): Wilson on the sweep, else ± std over seeds; the flag where the budget
        ran on fewer of the sweep's seeds (``scope``) than it has (an open marker; as :func:`seeds_note`)."""
        sr = sweep_rate(results, arm, n, mode) if metric == "success_rate" else None
        if sr is not None:
            (rate, lo, hi), per_seed = sr
            return rate, rate - lo, hi - rate, bool(seeds_note(list(per_seed), scope))
        m, sd = mean_std(eval_values(results, arm, n, mode, metric))
        return m, sd, sd, False

    partial = False
    for i, arm in enumerate(tts_arms_run(results) or results["arms"]):
        color = f"C{i % 10}"
        scope = (sweep_scope(results, arm) or ([], set()))[0]
        for mode in modes:
            pts = [(0, point(arm, 0, "none", scope))]
            pts += [(n, point(arm, n, mode, scope)) for n, m in keys if n > 0 and m == mode]
            pts = [(n, v) for n, v in pts if v[0] == v[0]]  # drop budgets without values (nan)
            if pts:
                label = arm if mode == "none" else f"{arm} ({mode})"
                ax.errorbar(
                    [n for n, _ in pts],
                    [v[0] for _, v in pts],
                    yerr=[[v[1] for _, v in pts], [v[2] for _, v in pts]],
                    color=color,
                    linestyle=styles.get(mode, ":"),
                    marker="o",
                    ms=3,
                    capsize=2,
                    label=label,
                )
                few = [(n, v[0]) for n, v in pts if v[3]]
                if few:
                    ax.plot([n for n, _ in few], [y for _, y in few], "o", color=color, mfc="white", ms=6)
                    partial = True
    if partial:
        ax.text(0.01, 0.01, "open marker: fewer seeds than N=0", transform=ax.transAxes, fontsize=7)
    ax.set_xlabel("rehearsal budget N")
    ax.set_ylabel(metric)
    ax.set_title("Test-time rehearsal budget")
    ax.set_xticks(sorted({n for n, _ in keys}))
    if metric in RATE_METRICS:
        ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_success(results: dict[str, Any], path: str) -> str:
    """Success at N=0 per arm with its 95% Wilson interval over tasks (outcomes pooled over seeds), one marker per
    held-out split (the evaluation split and each of :func:`envace.evaluation.results.extra_splits`)."""
    plt = _plt()
    main = str(results["config"].get("eval_split", "test"))
    splits = [(main, results)] + [(sp, split_view(results, sp)) for sp in extra_splits(results)]
    arms = list(results["arms"])
    fig, ax = plt.subplots(figsize=(max(6.4, 0.8 * len(arms) + 2), 3.8), dpi=100)
    width = 0.6 / len(splits)
    for j, (name, view) in enumerate(splits):
        xs, ys, below, above = [], [], [], []
        for i, arm in enumerate(arms):
            rows = per_task_outcomes(view, arm, 0, "none")
            if not rows:
                continue
            rate, lo, hi = rate_interval([r["successes"] for r in rows])
            xs.append(i + (j - (len(splits) - 1) / 2) * width)
            ys.append(rate)
            below.append(max(0.0, rate - lo))  # Wilson's bound at a rate of 0 (or 1) can miss it by a rounding
            above.append(max(0.0, hi - rate))
        if xs:
            ax.errorbar(xs, ys, yerr=[below, above], fmt="o", ms=4, capsize=3, color=f"C{j}", label=f"{name} split")
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels(arms, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("success rate (N=0)")
    ax.set_title("Success per arm, 95% Wilson intervals over tasks")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _plot_step_curves(
    curves: dict[str, tuple[list[int], list[float], list[float]]], path: str, ylabel: str, title: str, empty: str
) -> str:
    """One line per arm of (steps, mean, std over seeds) vs RL step, a ± std band; ``empty`` written where none."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    drawn = 0
    for arm, (steps, mean, std) in curves.items():
        if steps:
            m, sd = np.asarray(mean), np.asarray(std)
            ax.plot(steps, m, marker="o", ms=3, label=arm)
            ax.fill_between(steps, m - sd, m + sd, alpha=0.2)
            drawn += 1
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("RL iteration (0 = the SFT model)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_fidelity_curve(results: dict[str, Any], path: str, metric: str = "leaf_acc") -> str:
    """Rehearsal fidelity on the fixed shadow set vs RL step, one line per arm (mean ± std band over seeds)."""
    return _plot_step_curves(
        {a: fidelity_curve(results, a, metric) for a in results["arms"]},
        path,
        f"fidelity {metric}",
        "Rehearsal fidelity on the fixed held-out shadow set",
        "no fidelity curve (fidelity_every = 0)",
    )


# --------------------------------------------------------------------------------------------------------
# Held-out success over training
# --------------------------------------------------------------------------------------------------------


def success_curve(results: dict[str, Any], arm: str) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std over seeds) of an arm's held-out success at N=0 over training (``success_curve`` of each
    seed's record), at the steps every seed measured."""
    return over_seeds(success_points(results, arm))


def success_points(results: dict[str, Any], arm: str) -> list[dict[int, float]]:
    """Each seed's success curve, ``{step: success rate}``."""
    return [
        {int(p["step"]): float(p["success_rate"]) for p in rec.get("success_curve") or []}
        for rec in seed_runs(results, arm)
    ]


def success_changes(results: dict[str, Any], arm: str, step: int) -> tuple[int, int]:
    """(won, lost): the (task, seed) pairs whose success at ``step`` is above / below the warm-up's (step 0) on the
    same task, over the seeds whose curve has both points."""
    won = lost = 0
    for rec in seed_runs(results, arm):
        pts = {int(p["step"]): p["per_task"] for p in rec.get("success_curve") or []}
        if 0 in pts and step in pts:
            c = task_changes(pts[0], pts[step])
            won, lost = won + c["won"], lost + c["lost"]
    return won, lost


def success_curve_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Held-out success at N=0 per RL arm at every evaluated step (mean ± std over seeds), with the tasks won / lost
    against the warm-up (step 0)."""
    curves = {a: success_curve(results, a) for a in results["arms"]}
    steps = sorted({s for st, _, _ in curves.values() for s in st})
    rows = []
    for arm, (st, mean, std) in curves.items():
        if st:
            cells, n = [], n_curves(success_points(results, arm))
            for s in steps:
                if s not in st:
                    cells.append("–")
                    continue
                i = st.index(s)
                won, lost = success_changes(results, arm, s)
                cells.append(fmt_ms((mean[i], std[i]), n=n) + (f" (+{won} / −{lost})" if s else ""))
            rows.append([arm, *cells])
    return ["arm", *[f"step {s}" for s in steps]], rows


def plot_success_curve(results: dict[str, Any], path: str) -> str:
    """Held-out success at N=0 vs RL step, one line per arm (mean ± std band over seeds)."""
    return _plot_step_curves(
        {a: success_curve(results, a) for a in results["arms"]},
        path,
        "success rate (N=0)",
        f"Held-out success over training ({results['config'].get('eval_split')})",
        "no success curve (success_every = 0)",
    )


# --------------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------------


def _img_data(path: str) -> str:
    with open(path, "rb") as f:
        return "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")


def _config_summary(c: dict[str, Any]) -> str:
    return (
        f"model `{c.get('model')}`, suite `{c.get('suite')}`, seeds {list(c.get('seeds', []))}; SFT "
        f"{c.get('sft_steps')} steps; RL {c.get('iterations')} iterations x B={c.get('batch_tasks')} x "
        f"K={c.get('group_size')} (lr {c.get('lr')}, reward {c.get('reward')}); evaluation on {c.get('eval_tasks')} "
        f"`{c.get('eval_split')}` tasks x {c.get('eval_samples')} trials (T={c.get('eval_temperature')})"
        + (
            f" and on {c.get('ood_tasks') or c.get('eval_tasks')} `{c['ood_split']}` tasks at N=0"
            if c.get("ood_split")
            else ""
        )
        + ", rehearsal "
        f"budgets N={list(c.get('tts_budgets', []))} ({', '.join(c.get('tts_modes', []))}; memory format "
        f"`{c.get('tts_memory')}`); fidelity on {c.get('fidelity_tasks')} tasks x {c.get('fidelity_samples')}."
    )


def read_interval(row: list[str], col: dict[str, int]) -> str:
    """The interval a claims row's verdict read: over seeds and templates where there is one, else over tasks."""
    wide = row[col[SEEDS_CLUSTERS_CI]] if SEEDS_CLUSTERS_CI in col else "–"
    return wide if wide != "–" else row[col["paired 95% CI"]]


def verdict_summary(claims: tuple[list[str], list[list[str]]]) -> str:
    """The claims table in a sentence, verdict by verdict (:data:`VERDICTS` order): the claims that hold or do not
    hold by name with their measured difference and interval, the others counted."""
    head, rows = claims
    col = {h: i for i, h in enumerate(head)}
    parts = []
    for verdict in VERDICTS:
        mine = [r for r in rows if r[col["verdict"]] == verdict]
        if not mine:
            continue
        if verdict in ("holds", "does not hold"):
            named = "; ".join(f"{r[col['claim']]} ({r[col['measured']]} {read_interval(r, col)})" for r in mine)
            parts.append(f"{verdict}: {named}")
        else:
            parts.append(f"{verdict}: {len(mine)} claim{'s' if len(mine) > 1 else ''}")
    return "In short, " + "; ".join(parts) + "." if parts else ""


LEAD_TABLES = (
    "claims",
    "claims_by_seed",
    "main",
    "paired",
    "options",
    "success_curve",
    "kinds",
    "tts",
    "tts_paired",
    "tts_tokens",
)
"""The report's tables before its figures, in order (those with rows)."""


def write_report(results: dict[str, Any], out_dir: str) -> dict[str, str]:
    """Write every report file into ``out_dir``; returns kind -> path."""
    os.makedirs(out_dir, exist_ok=True)
    p = lambda name: os.path.join(out_dir, name)  # noqa: E731
    rl_arms = [a for a in results["arms"] if a not in ("base", "sft")]
    figs = {
        "success": plot_success(results, p("success.png")),
        "curve_reward": plot_curves(
            results, "reward/mean", p("curve_reward.png"), "Training reward (mean ± std over seeds)", rl_arms
        ),
        "curve_train_success": plot_curves(
            results,
            TRAIN_SUCCESS_CURVES,
            p("curve_train_success.png"),
            "Training success on rollouts: imagined (rehearsed) vs real env",
            rl_arms,
            ylabel="success rate",
        ),
        "curve_sft_nll": plot_curves(
            results, "sft/nll", p("curve_sft_nll.png"), "SFT warm-up NLL", [a for a in results["arms"] if a == "sft"]
        ),
        "tts_budget": plot_tts(results, p("tts_budget.png")),
        "fidelity_curve": plot_fidelity_curve(results, p("fidelity_curve.png")),
    }
    if any(rec.get("success_curve") for a in results["arms"] for rec in seed_runs(results, a)):
        figs["success_curve"] = plot_success_curve(results, p("success_curve.png"))
    c = results["config"]
    n_seeds = max((len(results["runs"].get(a, {})) for a in results["arms"]), default=0)
    measured = measure_claims(results)  # both claims tables read them
    tables = {
        "claims": claims_table(results, measured=measured),
        "claims_by_seed": claims_by_seed_table(results, measured),
        "main": main_table(results),
        "paired": paired_table(results),
        "options": option_arm_table(results),
        "kinds": kind_table(results),
        "tts": tts_table(results),
        "tts_paired": tts_paired_table(results),
        "tts_tokens": tts_tokens_table(results),
        "fidelity_curve": fidelity_curve_table(results),
        "success_curve": success_curve_table(results),
        "fidelity": fidelity_table(results),
        "fidelity_domain": fidelity_table(results, "by_domain"),
        "fidelity_tool": fidelity_table(results, "by_tool"),
        "fidelity_breakdown": fidelity_breakdown_table(results),
    }
    captions = {
        "claims": "Each claim as a per-task contrast of evaluations on the same held-out tasks (outcomes pooled over "
        "the seeds every arm of the claim ran): the measured difference, its paired bootstrap 95% interval over "
        "tasks and p-value (two evaluations: envace.math.stats.paired_comparison, exact McNemar for one binary "
        "outcome per task; a difference of gains: sign-flip permutation of the per-task contrast). That interval "
        "holds the trained models fixed and takes tasks as independent. The claims are about methods, so the "
        "verdict reads the next one: the pigeonhole bootstrap over training seeds and task templates at once "
        "(envace.math.stats.seed_cluster_bootstrap; templates where the tasks have two or more, else tasks; "
        "seeds × clusters in brackets): a policy acts by template, so the tasks of one template succeed or fail "
        "together, and another seed trains other models. With few seeds or templates it is rough and wide. "
        "Verdict: holds = that interval excludes 0 in the claimed direction; does not hold = it excludes 0 in the "
        "other direction; cannot tell at this scale = it contains 0 (a ≥ claim has no margin here: it needs the "
        "same evidence as >). The fidelity claims compare the leaf accuracy of rehearsed observations on the fixed "
        "shadow set; each side is its own model's rollouts, so their interval is unpaired (bootstrap of each side) "
        "with a permutation p-value, and the count is of observations. "
        "The paper's numbers are Qwen3-8B on tau2-Bench / BFCL; this is a small model on CPU.",
        "claims_by_seed": "What the interval over seeds and templates is made of: each measured claim's contrast "
        "for each seed's models alone (mean over the tasks), and the clusters (templates, or tasks where there are "
        "none) whose contrast over the seeds is above / below / at 0.",
        "main": "Held-out tasks in the real environment, no test-time rehearsal (N=0). Success: the per-task outcomes "
        f"of all {n_seeds} seed(s) pooled, with the 95% Wilson interval over tasks "
        "(conservative with several outcomes per task, envace.math.stats); over seeds: "
        "mean ± std (min–max) of each seed's rate. Other columns: mean ± std over seeds.",
        "paired": "Each RL arm against SFT on the same held-out tasks (N=0, outcomes pooled over the seeds both ran): "
        "the difference with its paired bootstrap 95% interval over tasks (10,000 "
        "resamples, seeded) and its p-value (exact McNemar for one binary outcome per "
        "task, else a paired sign-flip permutation test of per-task mean success). Won / lost: the (task, seed) "
        "pairs on which the arm succeeds more / less often than SFT of the same seed (how many outcomes training "
        "changed).",
        "options": "Each option arm beyond the paper (one training option added to a variant, never folded into it) "
        "against that variant, trained from the same warm-up with the same budget: columns as in the paired "
        "comparison with SFT; won / lost: the (task, seed) pairs on which the option arm succeeds more / less often.",
        "kinds": "Success at N=0 by task kind (rate [95% Wilson interval] (tasks), pooled over seeds).",
        "tts": "Success rate with private test-time rehearsal of budget N before the single real run (par = parallel, "
        "seq = sequential, plan = the compute-matched baseline: N plans without tool "
        "results): rate [95% Wilson interval over tasks] pooled over the sweep's seeds and "
        "tasks (tts_seeds, tts_tasks; N=0 on the same ones), · sd = std of the per-seed rates.",
        "tts_paired": "Each budget against the same arm at N=0 and, for rehearsal, against the compute-matched plan "
        "baseline at the same N, paired task by task on the sweep's seeds and tasks: the difference with its paired "
        "bootstrap 95% interval over tasks and p-value (exact McNemar for one binary outcome per task, else paired "
        "sign-flip permutation); won / lost: the (task, seed) outcomes that rose / fell against N=0.",
        "tts_tokens": "Generated tokens per task before the real run, at each budget: attempts · all (attempts = Act "
        "+ Rehearse tokens of the rehearsed attempts, or the plans' tokens of the compute-matched "
        "baseline; all = + reflections and memory), mean over seeds; (plan ≤ T): the plan budget, the mean "
        "tokens of one parallel attempt of the same arm at that N. Per-task counts are in results.json.",
        "success_curve": "Success at N=0 on the held-out evaluation tasks (real environment, as the final "
        "evaluation) at step 0 (the SFT model) and every success_every RL iterations, the last being the final "
        "evaluation: mean ± std over seeds, (+won / −lost): the (task, seed) pairs whose outcome rose / fell "
        "against the SFT model's.",
        "fidelity_curve": "Leaf-value accuracy of rehearsed observations on the same held-out shadow tasks (same "
        "rollout seed) at step 0 (the SFT model) and every fidelity_every RL iterations, mean ± std over seeds.",
        "fidelity": "Rehearsal fidelity of each arm's Rehearse model on shadow rollouts (valid JSON, "
        "exact match, key-set match, leaf-value accuracy, error-vs-success agreement).",
        "fidelity_domain": "Fidelity per domain.",
        "fidelity_tool": "Fidelity per tool.",
        "fidelity_breakdown": "Fidelity split where rehearsal fails: read (the real call changed no top-level state "
        "field) vs write, the number of state fields the real call changed, real "
        "success vs error observation, and the Act step the call came from (1, 2, 3+).",
    }
    titles = {
        "claims": "The paper's claims",
        "claims_by_seed": "The claims seed by seed and template by template",
        "tts_tokens": "Test-time compute: generated tokens",
        "fidelity_curve": "Rehearsal fidelity over training",
        "success_curve": "Held-out success over training",
        "main": "Main results",
        "paired": "Paired comparison with SFT",
        "options": "Each option arm against its variant",
        "kinds": "Success by task kind",
        "tts": "Test-time rehearsal",
        "tts_paired": "Test-time rehearsal, paired",
        "fidelity": "Rehearsal fidelity",
        "fidelity_domain": "Fidelity by domain",
        "fidelity_tool": "Fidelity by tool",
        "fidelity_breakdown": "Fidelity by state change, outcome and position",
    }
    fig_titles = {
        "success": "Success per arm",
        "curve_reward": "Training reward",
        "curve_train_success": "Training success: imagined vs real env",
        "curve_sft_nll": "SFT warm-up",
        "tts_budget": "Rehearsal budget",
        "fidelity_curve": "Rehearsal fidelity over training",
        "success_curve": "Held-out success over training",
    }
    split_sections = []  # (title, caption, table) for each further held-out split
    for sp in extra_splits(results):
        view = split_view(results, sp)
        split_sections.append(
            (
                f"Held-out split `{sp}`: each arm against SFT",
                f"The same models evaluated greedily at N=0 on the `{sp}` split; columns as in the paired comparison "
                "above.",
                paired_table(view),
            )
        )
        head, rows = option_arm_table(view)
        if rows:
            split_sections.append(
                (
                    f"Held-out split `{sp}`: each option arm against its variant",
                    f"The option arms and their variants on the `{sp}` split (N=0).",
                    (head, rows),
                )
            )
        head, rows = claims_table(view, fidelity=False)  # fidelity is of the shadow set, not of a split
        rows = [r for r in rows if r[-1] != "not measured"]
        if rows:
            split_sections.append(
                (f"The paper's claims on `{sp}`", f"The claims measurable on the `{sp}` split (N=0).", (head, rows))
            )
    docs = results.get("docs", {})
    arms_md = "\n".join(f"- **{a}**: {docs.get(a, '')}" for a in results["arms"])

    # Markdown
    summary = verdict_summary(tables["claims"])
    md = [f"# EnvACE experiment in miniature\n\n{_config_summary(c)}\n\nArms:\n{arms_md}\n"]
    if summary:
        md.append(f"**{summary}**\n")
    for key in [k for k in LEAD_TABLES if tables[k][1]]:
        md.append(f"## {titles[key]}\n\n{captions[key]}\n\n{md_table(*tables[key])}\n")
    for title, caption, table in split_sections:
        md.append(f"## {title}\n\n{caption}\n\n{md_table(*table)}\n")
    md.append(
        "## Figures\n\n"
        + TRAIN_SUCCESS_NOTE
        + "\n\n"
        + "\n\n".join(f"![{fig_titles[k]}]({os.path.basename(v)})" for k, v in figs.items())
        + "\n"
    )
    for key in [k for k in ("fidelity_curve",) if tables[k][1]] + [
        "fidelity",
        "fidelity_breakdown",
        "fidelity_domain",
        "fidelity_tool",
    ]:
        md.append(f"## {titles[key]}\n\n{captions[key]}\n\n{md_table(*tables[key])}\n")
    md.append(
        "## Trajectories\n\nRehearsed vs real observations, mismatches highlighted: "
        "[trajectories.html](trajectories.html). Raw numbers: [results.json](results.json).\n"
    )
    if "elapsed_s" in results:
        md.append(f"Total time: {results['elapsed_s']:.0f} s.\n")
    with open(p("report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md))

    # HTML
    arms_html = "".join(f"<li><b>{html.escape(a)}</b>: {html.escape(docs.get(a, ''))}</li>" for a in results["arms"])
    body = [
        "<h1>EnvACE experiment in miniature</h1><p>"
        f"{html.escape(_config_summary(c).replace('`', ''))}</p><ul>{arms_html}</ul>"
    ]
    if summary:
        body.append(f"<p><b>{html.escape(summary)}</b></p>")
    for key in [k for k in LEAD_TABLES if tables[k][1]]:
        body.append(
            f"<h2 id='{key}'>{titles[key]}</h2><p class='meta'>"
            f"{html.escape(captions[key])}</p>{html_table(*tables[key])}"
        )
    for title, caption, table in split_sections:
        body.append(
            f"<h2>{html.escape(title.replace('`', ''))}</h2><p class='meta'>"
            f"{html.escape(caption.replace('`', ''))}</p>{html_table(*table)}"
        )
    body.append(
        f"<h2 id='figures'>Figures</h2><p class='meta'>{html.escape(TRAIN_SUCCESS_NOTE)}</p>"
        + "".join(f"<img alt='{html.escape(fig_titles[k])}' src='{_img_data(v)}'>" for k, v in figs.items())
    )
    if tables["fidelity_curve"][1]:
        body.append(
            f"<h3>{titles['fidelity_curve']}</h3><p class='meta'>"
            f"{html.escape(captions['fidelity_curve'])}</p>{html_table(*tables['fidelity_curve'])}"
        )
    body.append(
        f"<h2 id='fidelity'>{titles['fidelity']}</h2><p class='meta'>"
        f"{html.escape(captions['fidelity'])}</p>{html_table(*tables['fidelity'])}"
    )
    body.append(
        f"<h3>{titles['fidelity_breakdown']}</h3><p class='meta'>"
        f"{html.escape(captions['fidelity_breakdown'])}</p>{html_table(*tables['fidelity_breakdown'])}"
    )
    for key in ("fidelity_domain", "fidelity_tool"):
        body.append(f"<details><summary>{titles[key]}</summary>{html_table(*tables[key])}</details>")
    body.append(
        "<h2 id='trajectories'>Trajectories</h2><p>Rehearsed vs real observations with mismatches highlighted: "
        "<a href='trajectories.html'>trajectory viewer</a>. Raw numbers: <a href='results.json'>results.json</a>.</p>"
    )
    if "elapsed_s" in results:
        body.append(f"<p class='meta'>Total time: {results['elapsed_s']:.0f} s.</p>")
    with open(p("report.html"), "w", encoding="utf-8") as f:
        f.write(page("envace experiment report", "\n".join(body)))
    with open(p("trajectories.html"), "w", encoding="utf-8") as f:
        f.write(viewer_html(results))
    return {
        "md": p("report.md"),
        "html": p("report.html"),
        "viewer": p("trajectories.html"),
        "results": p("results.json"),
        **figs,
    }


__all__ = [  # Claim ... claims_table, per_task_outcomes ... curve, viewer_html ... LOADED_SUFFIX: one-version aliases
    "Claim",
    "VERDICTS",
    "paper_claims",
    "claim_verdict",
    "measure_claim",
    "claim_n",
    "claims_table",
    "fidelity_curve",
    "fidelity_curve_table",
    "plot_fidelity_curve",
    "success_curve",
    "success_changes",
    "success_curve_table",
    "plot_success_curve",
    "plot_success",
    "tts_tokens_table",
    "tts_arms_run",
    "sweep_scope",
    "sweep_rate",
    "budget_seeds",
    "seeds_note",
    "write_report",
    "verdict_summary",
    "main_table",
    "paired_table",
    "kind_table",
    "per_task_outcomes",
    "success_cell",
    "seed_cell",
    "tts_table",
    "tts_paired_table",
    "fidelity_table",
    "md_table",
    "html_table",
    "plot_curves",
    "plot_tts",
    "viewer_html",
    "trajectory_html",
    "json_html",
    "fidelity_breakdown_table",
    "mean_std",
    "fmt_ms",
    "fmt_values",
    "eval_values",
    "curve",
    "curve_lines",
    "TRAIN_SUCCESS_CURVES",
    "LOADED_SUFFIX",
]
