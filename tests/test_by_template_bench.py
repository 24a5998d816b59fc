"""bench/by_template.py: an experiment's per-task outcomes split by template and by whether the gold episode writes,
counted from the tasks the results name (other splits' evaluations left out)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from by_template import balanced_contrast, columns_of_experiment, columns_of_results, table  # noqa: E402

from envace.envs import load_tasks  # noqa: E402


def test_outcomes_are_counted_by_template_and_branch_and_other_splits_are_left_out():
    tasks = load_tasks("shop-world-decide", "val", n=12, seed=0)
    ood = load_tasks("shop-world-decide", "ood", n=3, seed=0)
    wins = {t.id: i % 3 != 0 for i, t in enumerate(tasks)}
    ev = {"n": 0, "per_task": [{"task_id": t.id, "successes": [wins[t.id]]} for t in tasks]}
    ev_ood = {"n": 0, "per_task": [{"task_id": t.id, "successes": [True]} for t in ood]}
    results = {
        "config": {"suite": "shop-world-decide", "eval_split": "val", "eval_tasks": 12, "ood_tasks": 3},
        "arms": ["sft", "envace"],
        "runs": {"sft": {"0": {"evals": [ev, ev_ood]}}, "envace": {}},
    }
    md = table(*columns_of_experiment(results))
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| template")]
    rows, balanced = rows[:-1], rows[-1]
    want: dict[tuple[str, str], list[int]] = {}
    for t in tasks:
        key = (t.metadata["template"], "reads only" if t.metadata["read_only"] else "writes")
        c = want.setdefault(key, [0, 0])
        c[0] += wins[t.id]
        c[1] += 1
    assert rows == [f"| {k[0]} | {k[1]} | {c[0]} / {c[1]} |" for k, c in sorted(want.items())]
    mean_of_cells = sum(c[0] / c[1] for c in want.values()) / len(want)
    assert balanced == f"| every cell weighted equally | mean of the cells' rates | {mean_of_cells:.3f} |"
    assert "| template | gold episode | sft |" in md  # an arm without runs has no column
    results["runs"]["sft"]["0"] = {"evals": [ev], "splits": {"ood": [ev_ood]}}  # where an experiment keeps them
    suite, split, cols = columns_of_experiment(results, "ood")
    assert split == "ood" and [p["task_id"] for p in cols["sft"]] == [t.id for t in ood]


def test_saved_results_are_a_column_each(tmp_path):
    tasks = load_tasks("shop-world-decide", "val", n=6, seed=0)
    paths = []
    for name, ok in (("0", True), ("parallel-2-agreed", False)):
        r = {"suite": "", "config": {"suite": "shop-world-decide"}, "split": "val"}
        r["per_task"] = [{"task_id": t.id, "successes": [ok]} for t in tasks]
        (tmp_path / f"{name}.json").write_text(__import__("json").dumps(r))
        paths.append(str(tmp_path / f"{name}.json"))
    suite, split, cols = columns_of_results(paths)
    md = table(suite, split, cols)
    assert (suite, split, list(cols)) == ("shop-world-decide", "val", ["0", "parallel-2-agreed"])
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| template")][:-1]
    assert sum(int(r.split(" | ")[2].split(" / ")[1]) for r in rows) == 6
    assert all(r.split(" | ")[3].startswith("0 / ") for r in rows)  # the failing column
    twin = tmp_path / "other"
    twin.mkdir()
    (twin / "0.json").write_text((tmp_path / "0.json").read_text())
    _, _, cols = columns_of_results(paths + [str(twin / "0.json")])  # the same cell of another model: its own column
    assert list(cols) == [f"{tmp_path.name}/0", "parallel-2-agreed", "other/0"]


def test_budgets_give_a_column_per_swept_arm_and_budget_on_the_sweep_s_tasks_alone():
    tasks = load_tasks("shop-world-decide", "val", n=6, seed=0)

    def ev(n, mode, ok, upto=6):
        return {"n": n, "mode": mode, "per_task": [{"task_id": t.id, "successes": [ok]} for t in tasks[:upto]]}

    results = {
        "config": {"suite": "shop-world-decide", "eval_split": "val", "eval_tasks": 6, "ood_tasks": 3},
        "arms": ["sft", "envace"],
        "runs": {
            "sft": {"0": {"evals": [ev(0, "none", True)]}},  # not swept: no column
            "envace": {"0": {"evals": [ev(0, "none", True), ev(2, "parallel", False, 4), ev(2, "plan", True, 4)]}},
        },
    }
    _, _, cols = columns_of_experiment(results, budgets=True)
    assert list(cols) == ["envace N=0", "envace N=2 par", "envace N=2 plan"]
    assert all(len(rows) == 4 for rows in cols.values())  # N=0 on the 4 swept tasks, not all 6
    assert [p["successes"] for p in cols["envace N=2 par"]] == [[False]] * 4
    _, _, cols = columns_of_experiment(results)
    assert list(cols) == ["sft", "envace"] and len(cols["envace"]) == 6  # without: N=0 of every arm, every task


def test_the_balanced_contrast_pairs_by_seed_and_task_and_weights_each_cell_equally():
    tasks = load_tasks("shop-world-decide", "val", n=40, seed=0)
    cells = {t.id: (t.metadata["template"], "reads only" if t.metadata["read_only"] else "writes") for t in tasks}
    small = min(set(cells.values()), key=lambda c: sum(v == c for v in cells.values()))
    # B wins exactly the tasks of the smallest cell, on seed "1" only; A and B agree everywhere else
    a = [{"task_id": t.id, "successes": [False], "seed": s} for s in ("0", "1") for t in tasks]
    b = [p | {"successes": [p["seed"] == "1" and cells[p["task_id"]] == small]} for p in a]
    b.append({"task_id": tasks[0].id, "successes": [True], "seed": "2"})  # a seed A lacks: not paired
    c = balanced_contrast({"a": a, "b": b}, "a", "b")
    n_cells = len(set(cells.values()))
    assert c["n_tasks"] == 80 and c["n_strata"] == n_cells
    assert c["diff"] == pytest.approx(0.5 / n_cells)  # half the pairs of one cell of n_cells
    n_small = sum(v == small for v in cells.values())
    assert c["plain_diff"] == pytest.approx(n_small / 80)
    with pytest.raises(SystemExit, match="no column 'c'"):
        balanced_contrast({"a": a, "b": b}, "a", "c")
