"""Who decides wrong in the training rollouts on shop-world-decide: Rehearse (the imagined price or total is not the
real one) or Act (it does not act on the value it was shown)? For every training rollout of a comparison template
(``buy_if_under``, ``cancel_if_over``): the value of the first observation as imagined and as the real tool returns it
(the gold call replayed in a fresh environment), the branch each value implies against the user's limit, and
whether Act then ordered / cancelled.

    python bench/decide_rollouts.py envace=docs/results/decide-val/envace_rollouts.jsonl.gz \
        caller_only=docs/results/decide-val/caller_only_rollouts.jsonl.gz

Each file: an arm's training trajectories (``<run>/trajectories.jsonl``, or the gzipped copy that keeps only what
this needs, which ``--keep DIR`` writes). Prints a markdown table per 2 iterations and writes ``decide_rollouts.md``
beside the first file."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from envace.core.types import read_jsonl  # noqa: E402
from envace.envs.builtin import task_from_id  # noqa: E402
from envace.envs.builtin.shop import ShopEnv  # noqa: E402

WRITES = {"buy_if_under": "place_order", "cancel_if_over": "cancel_order"}
KEEP = ("id", "task_id", "reward", "iteration", "messages")


def value(template: str, obs: Any, query: str | None) -> float | None:
    """The number the decision compares: the named product's price (``buy_if_under``) or the order's total."""
    try:
        if template == "buy_if_under":
            return float(next(p["price"] for p in obs["products"] if p["name"] == query))
        return float(obs["total"])
    except (KeyError, TypeError, ValueError, StopIteration):
        return None


def decides_to_write(template: str, v: float | None, limit: int) -> bool | None:
    if v is None:
        return None
    return v < limit if template == "buy_if_under" else v > limit


def row(traj: dict[str, Any]) -> dict[str, Any] | None:
    """The decision of one rollout, or None when its task is not a comparison template."""
    task = task_from_id(traj["task_id"])
    template = task.metadata["template"]
    if template not in WRITES:
        return None
    limit = int(re.search(r"\$(\d+)", task.user_turns[0])[1])
    first = task.flat_gold()[0]
    env = ShopEnv(task)
    real = value(template, env.call(first), first.arguments.get("query"))
    env.close()
    msgs = traj["messages"]
    imagined = None
    for i, m in enumerate(msgs):
        calls = m.get("tool_calls") or []
        if m["role"] == "assistant" and calls and calls[0]["name"] == first.name and i + 1 < len(msgs):
            try:
                obs = json.loads(msgs[i + 1].get("content") or "")
            except json.JSONDecodeError:
                obs = None
            imagined = value(template, obs, calls[0]["arguments"].get("query"))
            break
    wrote = any(
        c["name"] == WRITES[template] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []
    )
    return {
        "iteration": int(traj.get("iteration", traj["id"].split("-", 1)[0].lstrip("i"))),
        "value_right": imagined is not None and imagined == real,
        "told_right": decides_to_write(template, imagined, limit) == decides_to_write(template, real, limit),
        "act_follows": decides_to_write(template, imagined, limit) == wrote,
        "right": decides_to_write(template, real, limit) == wrote,
        "wrote": wrote,
        "reward": float(traj["reward"]),
    }


def table(name: str, trajs: list[dict[str, Any]], every: int = 2) -> str:
    blocks: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for t in trajs:
        r = row(t)
        if r is not None:
            blocks[r["iteration"] // every].append(r)
    lines = [
        f"**{name}**: training rollouts of buy_if_under and cancel_if_over, by {every} iterations",
        "",
        "| iterations | rollouts | imagined value = real | imagined value implies the right branch | "
        "Act follows the imagined value | Act's branch right | Act writes | mean reward |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in sorted(blocks):
        rs = blocks[b]
        n = len(rs)
        cnt = [sum(r[k] for r in rs) for k in ("value_right", "told_right", "act_follows", "right", "wrote")]
        its = f"{b * every + 1}-{b * every + every}"
        lines.append(
            f"| {its} | {n} | " + " | ".join(f"{c} / {n}" for c in cnt) + f" | {sum(r['reward'] for r in rs) / n:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="NAME=PATH of an arm's trajectories (.jsonl or .jsonl.gz)")
    ap.add_argument("--keep", metavar="DIR", help="write DIR/NAME_rollouts.jsonl.gz: the fields this uses, gzipped")
    args = ap.parse_args()
    out = []
    for spec in args.files:
        name, path = spec.split("=", 1) if "=" in spec else (Path(spec).stem, spec)
        trajs = read_jsonl(path)
        if args.keep:
            keep = Path(args.keep) / f"{name}_rollouts.jsonl.gz"
            with gzip.open(keep, "wt") as f:
                for t in trajs:
                    f.write(json.dumps({k: t[k] for k in KEEP if k in t}) + "\n")
        out.append(table(name, trajs))
    md = "\n".join(out)
    print(md)
    first = args.files[0].split("=", 1)[-1]
    (Path(first).parent / "decide_rollouts.md").write_text(md)


if __name__ == "__main__":
    main()
