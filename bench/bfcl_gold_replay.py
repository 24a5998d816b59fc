"""Gold replay of BFCL-v4's single-turn and memory categories through envace's adapters, scored by BFCL's own
checkers (AST; agentic).

Single-turn: each entry's possible answer becomes its gold first response (envace.envs.bfcl.single_turn.replay_gold)
and is scored exactly as a model's response would be. Memory (memory_kv, memory_rec_sum): in the memory the gold
writer filled from the prerequisite conversations, the gold path reads the question's fact back and answers with
the first possible answer (envace.envs.bfcl.memory.replay_gold); "answer in memory" counts the questions whose
read result already holds a possible answer by BFCL's agentic check. Prints, per category, passed / replayed /
entries and the error types of the failures (entries whose possible answer no call can pass:
tests/test_bfcl_single.py lists them); ``--json FILE`` writes the same as JSON. Needs no model:
``PYTHONPATH=src python bench/bfcl_gold_replay.py``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from envace.envs.bfcl import memory as bfcl_memory, single_turn as bfcl_single


def counts() -> dict[str, dict]:
    out = {}
    for category in bfcl_single.CATEGORIES:
        tasks = bfcl_single.load_category(category)
        scores = {t.id: bfcl_single.replay_gold(t) for t in tasks}
        replayed = {i: s for i, s in scores.items() if s is not None}
        failed = {i: s.details["error_type"] for i, s in replayed.items() if not s.success}
        out[category] = {
            "entries": len(tasks),
            "replayed": len(replayed),
            "passed": len(replayed) - len(failed),
            "failed": failed,
        }
    for category in bfcl_memory.CATEGORIES:
        tasks = bfcl_memory.load_category(category)
        replays = {t.id: bfcl_memory.replay_gold(t) for t in tasks}
        failed = {i: g.score.details["error_type"] for i, g in replays.items() if not g.score.success}
        out[category] = {
            "entries": len(tasks),
            "replayed": len(replays),
            "passed": len(replays) - len(failed),
            "answer_in_memory": sum(g.answer_in_memory for g in replays.values()),
            "failed": failed,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the counts here")
    args = ap.parse_args()
    res = counts()
    for category, r in res.items():
        why = dict(Counter(r["failed"].values()))
        print(
            f"{category:<24} {r['passed']:>5} / {r['replayed']:>5} of {r['entries']:>5} entries"
            + (f"  answer in memory: {r['answer_in_memory']}" if "answer_in_memory" in r else "")
            + (f"  failed: {why}" if why else "")
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
