"""One metrics logger with the same calls whether TensorBoard is on or off (nanochat's DummyWandb idea).

Metrics go to ``metrics.jsonl`` (one line per step, fsync'd) and, if enabled, to TensorBoard. Keys are grouped:
``reward/...``, ``act/...``, ``rehearse/...``, ``loss/...``, ``perf/...``. On resume, lines past the resumed step
are dropped first so the log has no gaps or duplicates.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable


class MetricsLogger:
    def __init__(self, out_dir: str, tensorboard: bool = True, resume_step: int | None = None):
        os.makedirs(out_dir, exist_ok=True)
        self.path = os.path.join(out_dir, "metrics.jsonl")
        if resume_step is not None:
            self._truncate_after(resume_step)
        elif os.path.exists(self.path):
            os.remove(self.path)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(out_dir, "tb"))
            except Exception:  # noqa: BLE001 - tensorboard is optional; JSON lines always work
                self.tb = None

    def _truncate_after(self, step: int) -> None:
        truncate_jsonl(self.path, lambda rec: rec.get("step", -1) <= step)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        rec = {"step": step, **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in sorted(metrics.items())}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(out_dir: str) -> list[dict[str, Any]]:
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def truncate_jsonl(path: str, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite a JSON-lines file (atomically) with only the records ``keep`` accepts; a line that is not a
    complete JSON object (the torn tail of a killed append) is dropped. Returns how many lines were dropped."""
    if not os.path.exists(path):
        return 0
    kept, dropped = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)  # a torn object never parses: it lacks its closing brace
            except ValueError:
                rec = None
            if isinstance(rec, dict) and keep(rec):
                kept.append(line if line.endswith("\n") else line + "\n")
            elif line.strip():
                dropped += 1
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return dropped
