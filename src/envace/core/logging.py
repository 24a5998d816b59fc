"""One metrics logger with the same calls whatever it reports to (nanochat's DummyWandb idea).

Metrics always go to ``metrics.jsonl`` (one line per step, fsync'd); on resume, lines past the resumed step are
dropped first so the log has no gaps or duplicates. Other sinks are chosen by name, like ``report_to`` in
transformers (:data:`SINKS`): ``tensorboard`` (``out_dir/tb``), ``wandb`` and ``trackio`` (when installed; project
``$WANDB_PROJECT`` / ``$TRACKIO_PROJECT`` or ``envace``, the run named after ``out_dir``, the run's config attached).
A sink that was asked for and cannot start (package missing, init error), or fails later, says so once on stderr,
in one line naming it and why, and is off from then on: training goes on, and the JSON lines are always written.
Keys are grouped: ``reward/...``, ``act/...``, ``rehearse/...``, ``loss/...``, ``perf/...``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from .atomic import write_lines
from .registry import Registry


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@dataclass
class SinkContext:
    """What a sink is started with: the run's folder, the step it resumes from (None: a fresh run), its config."""

    out_dir: str
    resume_step: int | None = None
    config: dict[str, Any] | None = None


SINKS: Registry[Callable[[SinkContext], Sink]] = Registry("metrics sink")
"""name -> fn(SinkContext) -> Sink. ``jsonl`` is always on; the others only when asked for (``report_to``)."""


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


@SINKS.register("jsonl")
class JsonlSink:
    """``metrics.jsonl``: a fresh run replaces it; a resumed one keeps the lines up to the resumed step."""

    def __init__(self, ctx: SinkContext):
        os.makedirs(ctx.out_dir, exist_ok=True)
        self.path = os.path.join(ctx.out_dir, "metrics.jsonl")
        if ctx.resume_step is not None:
            truncate_jsonl(self.path, lambda rec: rec.get("step", -1) <= ctx.resume_step)
        elif os.path.exists(self.path):
            os.remove(self.path)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        rec = {
            "step": step,
            **{k: (float(v) if isinstance(v, (int, float)) else v) for k, v in sorted(metrics.items())},
        }
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        pass


@SINKS.register("tensorboard")
class TensorBoardSink:
    def __init__(self, ctx: SinkContext):
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(os.path.join(ctx.out_dir, "tb"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in _scalars(metrics).items():
            self.tb.add_scalar(k, v, step)
        self.tb.flush()

    def close(self) -> None:
        self.tb.close()


@SINKS.register("wandb")
class WandbSink:
    def __init__(self, ctx: SinkContext):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "envace"),
            name=os.path.basename(os.path.abspath(ctx.out_dir)),
            dir=ctx.out_dir,
            config=ctx.config,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(_scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


@SINKS.register("trackio")
class TrackioSink:
    def __init__(self, ctx: SinkContext):
        import trackio

        self.trackio = trackio
        trackio.init(
            project=os.environ.get("TRACKIO_PROJECT", "envace"),
            name=os.path.basename(os.path.abspath(ctx.out_dir)),
            config=ctx.config,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.trackio.log(_scalars(metrics), step=step)

    def close(self) -> None:
        self.trackio.finish()


def report_sinks(report_to: Iterable[str] | str | None, tensorboard: bool = True) -> tuple[str, ...]:
    """The sinks a run reports to: ``jsonl`` first (always), then ``report_to``'s names in order without repeats (a
    string is a comma-separated list); ``tensorboard=False`` (the older switch) drops ``tensorboard``. An unknown
    name is an error that lists the valid ones."""
    names = [x.strip() for x in report_to.split(",")] if isinstance(report_to, str) else list(report_to or ())
    for name in names:
        SINKS.get(name)
    out = dict.fromkeys(["jsonl", *(n for n in names if n)])
    if not tensorboard:
        out.pop("tensorboard", None)
    return tuple(out)


_WARNED: set[tuple[str, str]] = set()  # (sink, reason) already said on stderr in this process


def _say_off(name: str, why: str) -> None:
    if (name, why) not in _WARNED:
        _WARNED.add((name, why))
        print(f"envace: metrics sink {name!r} is off: {why}", file=sys.stderr, flush=True)


def _reason(e: BaseException) -> str:
    if isinstance(e, ModuleNotFoundError) and e.name:
        return f"the package {e.name.split('.')[0]!r} is not installed (pip install {e.name.split('.')[0]})"
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


class MetricsLogger:
    """Writes each step's metrics to every sink of ``report_to`` (:func:`report_sinks`; ``jsonl`` always)."""

    def __init__(
        self,
        out_dir: str,
        report_to: Iterable[str] | str | None = ("tensorboard",),
        resume_step: int | None = None,
        config: dict[str, Any] | None = None,
    ):
        ctx = SinkContext(out_dir, resume_step, config)
        self.jsonl = JsonlSink(ctx)
        self.path = self.jsonl.path
        self.sinks: dict[str, Sink] = {}
        for name in report_sinks(report_to)[1:]:
            try:
                self.sinks[name] = SINKS.get(name)(ctx)
            except Exception as e:  # noqa: BLE001 - an optional sink never stops a run; it says why it is off
                _say_off(name, _reason(e))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.jsonl.log(step, metrics)
        for name, sink in list(self.sinks.items()):
            try:
                sink.log(step, metrics)
            except Exception as e:  # noqa: BLE001
                del self.sinks[name]
                _say_off(name, f"it failed while logging step {step}: {_reason(e)}")

    def close(self) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                sink.close()
            except Exception as e:  # noqa: BLE001
                _say_off(name, f"it failed to close: {_reason(e)}")
        self.sinks = {}


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
                kept.append(line)  # write_lines ends the last one with a newline if it lacks one
            elif line.strip():
                dropped += 1
    write_lines(path, kept)
    return dropped
