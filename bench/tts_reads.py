"""Does the final Act redo the read that its rehearsal memory quotes? For every task of a bench/tts_val.py cell's
records (``<cell>.records.jsonl``, or gzipped) on a built-in suite, by template: the memory quotes the gold
episode's first call with an imagined result; that result is the real one (the call replayed in a fresh
environment, compared as the memory writes it: canonical JSON on one line, cut at the memory's length); the final
Act makes that call in the real run; the task succeeds (a memory may quote the call without a result: agreed-live).

    python bench/tts_reads.py docs/results/tts-val/decide-sft100-seed2/parallel-2-agreed.records.jsonl.gz

Prints a markdown table and writes ``<cell>.reads.md`` beside the records."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from by_template import branch  # noqa: E402

from envace.core.types import dumps, read_jsonl  # noqa: E402
from envace.envs.builtin import DOMAINS, task_from_id  # noqa: E402
from envace.rollout.memory import clip  # noqa: E402

QUOTED = 160  # the memory's value_chars (envace.rollout.memory.distill)


def quoted_result(memory: str, name: str) -> str | None:
    """The result the memory quotes for the first line that renders a call of ``name`` (None: not quoted with one)."""
    for line in memory.splitlines():
        if f'"name": "{name}"' in line and " returned " in line:
            text = line.split(" returned ", 1)[1]
            return text.rsplit(" (", 1)[0] if text.endswith("attempts)") else text
    return None


def quotes_call(memory: str, name: str) -> bool:
    """Whether a line of the memory renders a call of ``name`` (with a result or, as agreed-live writes a read,
    without)."""
    return any(line.startswith("- ") and f'"name": "{name}"' in line for line in memory.splitlines())


def row(record: dict[str, Any]) -> tuple[str, dict[str, bool]]:
    task = task_from_id(record["task_id"])
    first = task.flat_gold()[0]
    env = DOMAINS[task.env].env_cls(task)
    real = clip(dumps(env.call(first)), QUOTED)
    env.close()
    memory = record.get("memory") or ""
    quoted = quoted_result(memory, first.name)
    made = [
        c["name"] for m in record["final"]["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []
    ]
    key = f"{task.metadata['template']} ({branch(task)})"
    return key, {
        "quoted": quotes_call(memory, first.name),
        "with_result": quoted is not None,
        "quoted_real": quoted == real,
        "redone": first.name in made,
        "success": bool(record["success"]),
    }


def table(path: str) -> str:
    counts: dict[str, list[dict[str, bool]]] = defaultdict(list)
    for record in read_jsonl(path):
        key, r = row(record)
        counts[key].append(r)
    lines = [
        f"{Path(path).name}: the gold episode's first call, as the memory quotes it and as the final Act makes it",
        "",
        "| template | tasks | memory quotes it | with a result | the real result | final Act makes it | success |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in sorted(counts):
        rs = counts[key]
        n = len(rs)
        cells = [
            f"{sum(r[k] for r in rs)} / {n}" for k in ("quoted", "with_result", "quoted_real", "redone", "success")
        ]
        lines.append(f"| {key} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", help="a <cell>.records.jsonl of bench/tts_val.py")
    args = ap.parse_args()
    md = table(args.records)
    print(md)
    name = Path(args.records).name.removesuffix(".gz").removesuffix(".jsonl").removesuffix(".records")
    (Path(args.records).parent / f"{name}.reads.md").write_text(md)


if __name__ == "__main__":
    main()
