"""Does Rehearse fidelity rise with Rehearse training, on a persistent world and on a fresh one? (issue 27, item 3)

From the base model, supervised stages train the **Rehearse rows only** (`SFTConfig.roles = [rehearse]`: the real
observations of gold trajectories of train tasks, 4 trajectories a step, lr 1e-4; stage i continues from stage
i-1 with seed i, so each stage draws its own train tasks). After every stage, Rehearse is measured
**teacher-forced** on a fixed held-out set (`envace.evaluation.fidelity.measure_teacher_forced`): the gold
trajectories of the first `--tasks` test tasks, every Rehearse row (the gold call, the real earlier observations
in its context) answered greedily and scored against the real observation, plus the per-token negative
log-likelihood of the real observation. The calls are the same for every checkpoint and suite run, whatever Act
does, so the curve measures Rehearse alone (the first version of this script scored each checkpoint's own
trajectories, whose calls changed as Rehearse-only training damaged Act).

Two suites with the same tools and templates:

- `bank-world`: every task starts from the record of one of eight customers (named in the first user turn), the
  same record each time, so a balance, a transaction or a frozen account can be learnt;
- `bank`: a fresh random world per task, which no training can predict beyond the tools' formats and rules.

    python bench/world_learning.py                       # both suites, resumable (finished stages are kept)
    python bench/world_learning.py --suites bank-world --steps 0 25 50 100

Writes docs/results/world-learning/: one JSON per (suite, stage) with the summary and every pair, and
summary.md / summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from envace.config import SFTConfig  # noqa: E402
from envace.core.precision import hardware_summary  # noqa: E402
from envace.evaluation.fidelity import exact_cell, summary_bucket, unshown_leaves  # noqa: E402
from envace.training.sft import sft  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
STEPS = (0, 25, 50, 100)
"""Cumulative Rehearse-only optimizer steps (x 4 gold trajectories) after which Rehearse is measured."""
TASKS = 48
"""Test tasks of the fixed held-out set (their gold trajectories' Rehearse rows)."""


def trained(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "DONE"))


def rehearse_stage(start: str, suite: str, out: str, seed: int, steps: int) -> str:
    if not trained(out):
        sft(
            SFTConfig(
                model=start,
                suite=suite,
                roles=("rehearse",),
                steps=steps,
                batch_tasks=4,
                lr=1e-4,
                bf16="auto",
                seed=seed,
                out_dir=out,
                tensorboard=False,
                progress=False,
            )
        )
        Path(out, "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    return out


def measure(model: str, suite: str, n_tasks: int, path: Path) -> dict:
    if path.exists():
        saved = json.loads(path.read_text())
        return with_context(saved["summary"], suite, n_tasks, saved["pairs"])
    from envace.backends.hf import HFBackend
    from envace.backends.models import load_frozen
    from envace.envs import load_tasks
    from envace.evaluation.fidelity import measure_teacher_forced

    t0 = time.perf_counter()
    net, tok = load_frozen(model)
    res = measure_teacher_forced(
        HFBackend(net, tok, bf16="auto"), tok, load_tasks(suite, "test", n=n_tasks), model=net, bf16=False
    )
    path.write_text(
        json.dumps(
            {
                "model": model,
                "suite": suite,
                "tasks": n_tasks,
                "seconds": round(time.perf_counter() - t0),
                "summary": res.summary,
                "pairs": [p.to_dict() for p in res.pairs],
            },
            indent=1,
        )
    )
    return with_context(res.summary, suite, n_tasks, [p.to_dict() for p in res.pairs])


def with_context(summary: dict, suite: str, n_tasks: int, pairs: list[dict]) -> dict:
    """A stage's fidelity summary plus the splits by what Rehearse's prompt shows (reads by whether all values
    are shown; leaf accuracy on the values not shown)."""
    return {
        **summary,
        "by_context": context_split(suite, n_tasks, pairs),
        "unshown_leaves": unshown_leaf_accuracy(suite, n_tasks, pairs),
    }


def _values_shown(real: object, prompt: str) -> bool:
    """Whether every value of the real observation (strings and numbers) appears in Rehearse's prompt as JSON text:
    the answer could then be copied from the context (a reference example, an earlier observation, the call)."""
    from envace.evaluation.fidelity import leaf_paths

    values = [v for v in leaf_paths(real).values() if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
    return all(json.dumps(v, ensure_ascii=False) in prompt for v in values)


_PROMPTS: dict[tuple[str, int], list[str]] = {}


def _prompts(suite: str, n_tasks: int) -> list[str]:
    """The decoded Rehearse prompts of the fixed held-out set, in the order of its pairs (built once per suite)."""
    if (suite, n_tasks) not in _PROMPTS:
        from envace.backends.models import load_tokenizer
        from envace.envs import load_tasks
        from envace.evaluation.fidelity import gold_rehearse_rows

        tok = load_tokenizer(MODEL)
        _PROMPTS[suite, n_tasks] = [
            tok.decode(r.prompt_ids) for r in gold_rehearse_rows(tok, load_tasks(suite, "test", n=n_tasks))[1]
        ]
    return _PROMPTS[suite, n_tasks]


def context_split(suite: str, n_tasks: int, pairs: list[dict]) -> dict[str, dict[str, float]]:
    """Reads split by whether the real observation's values are all shown in Rehearse's prompt: {bucket: {n, exact}}."""
    prompts = _prompts(suite, n_tasks)
    out: dict[str, list[float]] = {"shown": [], "not shown": []}
    for p, prompt in zip(pairs, prompts, strict=True):
        if p["changed"] == []:  # a read
            out["shown" if _values_shown(p["real"], prompt) else "not shown"].append(p["scores"]["exact"])
    return {k: {"n": float(len(v)), "exact": sum(v) / len(v) if v else 0.0} for k, v in out.items()}


def unshown_leaf_accuracy(suite: str, n_tasks: int, pairs: list[dict]) -> dict[str, dict]:
    """Leaf accuracy on the values Rehearse cannot copy (`envace.evaluation.fidelity.unshown_leaves`), for reads
    and for writes: {"read" | "write": {n (leaves), distinct (values), acc, by_key: {key: {n, distinct, acc}}}}.
    The measure of what the weights hold about the world; a value asked again counts again (``distinct``: how
    many values)."""
    prompts = _prompts(suite, n_tasks)
    out: dict[str, list[tuple[str, str, bool]]] = {"read": [], "write": []}
    for p, prompt in zip(pairs, prompts, strict=True):
        out["read" if p["changed"] == [] else "write"] += unshown_leaves(p["real"], p["rehearsed"], prompt)

    def rate(leaves: list[tuple[str, str, bool]]) -> dict[str, float]:
        n = len(leaves)
        return {
            "n": float(n),
            "distinct": float(len({(k, v) for k, v, _ in leaves})),
            "acc": sum(ok for _, _, ok in leaves) / n if n else 0.0,
        }

    return {
        kind: {
            **rate(leaves),
            "by_key": {k: rate([x for x in leaves if x[0] == k]) for k in sorted({x[0] for x in leaves})},
        }
        for kind, leaves in out.items()
    }


CELLS = (("all", "overall", None), ("reads", "by_state", "read"), ("writes", "by_state", "write"))
CONTEXT = (("reads, values shown", "by_context", "shown"), ("reads, a value not shown", "by_context", "not shown"))
ERRORS = ("real errors", "by_outcome", "error")


def _cell(summary: dict, group: str, bucket: str | None, metric: str = "exact") -> str:
    s = summary_bucket(summary, group, bucket)
    if metric == "exact" or not s or not s["n"]:
        return exact_cell(s)
    return f"{s[metric]:.2f}"


def _nll(summary: dict, group: str, bucket: str | None) -> str:
    nll = summary.get("nll", {})
    v = nll.get(group) if bucket is None else nll.get(group, {}).get(bucket)
    return "-" if v is None else f"{v:.3f}"


def _unshown(summary: dict, kind: str) -> str:
    u = summary.get("unshown_leaves", {}).get(kind)
    return "-" if not u or not u["n"] else f"{u['acc']:.2f} ({int(u['n'])} leaves, {int(u['distinct'])} values)"


def table(rows: list[tuple[str, dict]]) -> list[str]:
    head = [
        "suite, Rehearse steps",
        *(f"exact, {h}" for h, _, _ in (*CELLS, *CONTEXT, ERRORS)),
        "leaf acc, reads",
        "leaf acc, writes",
        "error vs success agrees",
        "leaf acc, values not in prompt, reads",
        "leaf acc, values not in prompt, writes",
        *(f"NLL/token, {h}" for h, _, _ in CELLS),
    ]
    out = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    for name, s in rows:
        cells = [_cell(s, g, b) for _, g, b in (*CELLS, *CONTEXT, ERRORS)]
        cells += [_cell(s, "by_state", "read", "leaf_acc"), _cell(s, "by_state", "write", "leaf_acc")]
        cells += [f"{s['overall']['outcome']:.2f}", *(_unshown(s, k) for k in ("read", "write"))]
        cells += [_nll(s, g, b) for _, g, b in CELLS]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suites", nargs="+", default=["bank-world", "bank"])
    p.add_argument("--out", default="docs/results/world-learning")
    p.add_argument("--runs", default="runs/world-learning")
    p.add_argument("--steps", type=int, nargs="+", default=list(STEPS), help="cumulative steps measured after")
    p.add_argument("--tasks", type=int, default=TASKS, help="test tasks of the fixed held-out set")
    p.add_argument("--model", default=MODEL, help="starting model")
    p.add_argument("--tabulate", action="store_true", help="only tabulate the stages already measured in --out")
    args = p.parse_args()
    steps = sorted(set(args.steps))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, results = [], {}
    for suite in args.suites:
        model, done = args.model, 0
        for i, total in enumerate(steps):  # each stage measured as soon as it is trained (a stopped run keeps them)
            if args.tabulate and not (out / f"{suite}-r{total}.json").exists():
                continue
            if total > done:
                run = os.path.join(args.runs, f"{suite}-r{total}")
                model = run if args.tabulate else rehearse_stage(model, suite, run, seed=i, steps=total - done)
                done = total
            summary = measure(model, suite, args.tasks, out / f"{suite}-r{total}.json")
            rows.append((f"`{suite}`, {total}", summary))
            results[f"{suite}/{total}"] = {"steps": total, "model": model, "summary": summary}
            o = summary["overall"]
            print(
                f"{suite} +{total} Rehearse steps: exact {o['exact']:.3f} leaf {o['leaf_acc']:.3f} "
                f"nll {summary.get('nll', {}).get('overall')} (n={int(o['n'])})",
                flush=True,
            )
    lines = [
        "Teacher-forced Rehearse fidelity on the gold trajectories "
        f"of the first {args.tasks} test tasks of each suite:",
        "every Rehearse row (gold call, real earlier observations) answered greedily and scored against the real",
        "observation; exact = canonical JSON equal, 95% Wilson interval over observations; NLL/token = negative",
        "log-likelihood of the real observation per token; leaf acc, values not in prompt = the share of the real",
        "observation's string and number values that Rehearse's prompt does not show (so they cannot be copied) and",
        "that Rehearse reproduces (leaves: how many were asked; values: how many distinct ones, summary.json has them",
        "by key). Rehearse steps: Rehearse-only SFT steps x 4 gold",
        f"trajectories from {args.model}.",
        f"`python bench/world_learning.py {' '.join(sys.argv[1:])}`",
        "",
        *table(rows),
        "",
        f"Hardware: {hardware_summary()['cpu']}",
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
