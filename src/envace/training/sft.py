"""SFT warm-up on gold trajectories (the 135M default cannot emit tool calls before it).

Gold trajectories are produced by the rollout engine itself, in rehearsal mode, with a :class:`GoldTeacher`
backend in place of the model: Act answers with the task's gold calls (one per step) and gold replies, and
Rehearse answers with what the *real* environment returned for that call. The rows therefore have exactly the
contexts that training and inference use: Act rows are trained on gold actions and final replies, Rehearse rows
on real observations.

With ``SFTConfig.memory_attempts`` N > 0 each task also gets a gold trajectory whose Act system prompt carries
rehearsal notes, as test-time scaling's final run does: the starting model rehearses the task N times (no
environment) and :func:`envace.rollout.memory.rehearsal_lessons` distills them. The targets stay the gold, so
the rows teach acting well with notes that may be wrong; the notes never contain the gold (only the model's own
calls and imagined observations).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..math import algos
from ..backends.base import Backend, SamplingParams
from ..core.checkpoint import latest_checkpoint, load_optimizers, load_rng, load_state, save_checkpoint
from ..config import SFT_RESUMABLE_FIELDS, SFTConfig, check_resume, to_dict
from ..envs import load_tasks_of_kinds, make_env
from ..core.logging import MetricsLogger, read_metrics
from ..backends.models import load_resumed, make_optimizer
from ..chat.parsing import ToolFormat, format_observation, tool_format_for
from ..core.precision import use_bf16
from ..chat.prompts import ChatFormat
from ..rollout.engine import RolloutConfig, RolloutEngine
from ..rollout.memory import rehearsal_lessons
from ..backends.hf import HFBackend
from ..core.seeding import seed_everything
from ..core.types import Generation, Row, Task, Trajectory


class GoldTeacher(Backend):
    """Plays the gold script of each task. Sessions (``<traj id>/act`` or ``/rehearse``) identify the trajectory;
    the trajectory id starts with its group id ``<prefix>:<task id>``. Gold calls are written in ``tools`` (the
    model's tool format) and every generation ends with ``end_id`` (its chat format's end of turn); both default
    to what the tokenizer's own formats are."""

    def __init__(
        self,
        tokenizer: Any,
        tasks: list[Task],
        default_reply: str = "Done.",
        tools: ToolFormat | None = None,
        end_id: int | None = None,
    ):
        self.tokenizer = tokenizer
        self.end_id = ChatFormat.for_tokenizer(tokenizer).end_id if end_id is None else end_id
        self.tools = tools or tool_format_for(tokenizer)
        self.tasks = {t.id: t for t in tasks}
        self.default_reply = default_reply
        self._act: dict[str, list[str]] = {}
        self._obs: dict[str, list[str]] = {}

    def _script(self, task: Task) -> tuple[list[str], list[str]]:
        acts, obs = [], []
        one_step = task.metadata.get("max_steps") == 1  # the turn's calls are one response (BFCL parallel)
        env = make_env(task)
        try:
            for i, _ in enumerate(task.user_turns):
                for call in task.user_actions[i] if i < len(task.user_actions) else []:
                    env.user_call(call)  # the scripted user's side comes first (tau2 telecom), as in the rollout
                calls = task.gold_actions[i] if i < len(task.gold_actions) else []
                for step in [calls] if one_step and calls else [[c] for c in calls]:
                    acts.append(self.tools.render(step))
                    obs += [format_observation(env.call(c)) for c in step]
                acts.append(
                    task.gold_replies[i] if i < len(task.gold_replies) and task.gold_replies[i] else self.default_reply
                )
        finally:
            env.close()
        return acts, obs

    def _script_of(self, traj_id: str) -> tuple[list[str], list[str]]:
        """(Act outputs, Rehearse outputs) that trajectory ``traj_id`` plays: its task's gold script."""
        return self._script(self.tasks[traj_id.split(":", 1)[1].rsplit("/", 1)[0]])

    def _queue(self, session: str, kind: str) -> list[str]:
        traj_id = session.rsplit("/", 1)[0]
        store = self._act if kind == "act" else self._obs
        if traj_id not in store:
            self._act[traj_id], self._obs[traj_id] = self._script_of(traj_id)
        return store[traj_id]

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, sessions: Sequence[str | None] | None = None
    ) -> list[Generation]:
        out = []
        for p, s in zip(prompts, sessions or [None] * len(prompts)):
            if s is None:
                raise ValueError("GoldTeacher needs session ids")
            q = self._queue(s, "act" if s.endswith("/act") else "rehearse")
            text = q.pop(0) if q else self.default_reply
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_id]
            out.append(
                Generation(
                    token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="eos", prompt_tokens=len(p)
                )
            )
        return out


def gold_trajectories(
    tokenizer: Any,
    tasks: list[Task],
    rollout: RolloutConfig | None = None,
    chat_format: str | None = None,
    tool_format: str | None = None,
    thinking: bool | None = None,
    native_tools: bool = True,
    memory: dict[str, str] | None = None,
    thinking_history: str | None = None,
    shadow: bool = False,
    mode: str | None = None,
) -> list[Trajectory]:
    """One gold trajectory per task, with Act and Rehearse rows, through the real rollout engine. The formats
    (as ``RolloutConfig``'s, None: the tokenizer's own) are ``rollout``'s when it is given. ``memory`` (task id ->
    notes) puts notes into the Act system prompt of those tasks, as ``RolloutEngine(memory=...)`` does at test time.
    ``shadow``: also record which state fields each real call changed (``Step.shadow_changed``). ``mode``: the
    engine's (None: rehearsal, or the deprecated ``rollout.mode``); one trajectory per task whatever
    ``rollout.group_size`` says."""
    n_steps = max((sum(len(g) for g in t.gold_actions) + len(t.user_turns) for t in tasks), default=1)
    cfg = rollout or _teacher_config(n_steps, chat_format, tool_format, thinking, native_tools, thinking_history)
    teacher = GoldTeacher(
        tokenizer,
        tasks,
        tools=tool_format_for(tokenizer, cfg.tool_format),
        end_id=ChatFormat.for_tokenizer(tokenizer, cfg.chat_format, cfg.thinking).end_id,
    )
    engine = RolloutEngine(
        teacher, cfg, memory=memory, mode=cfg.mode if mode is None else mode, shadow=shadow or cfg.shadow
    )
    return engine.run(tasks, group_prefix="gold-notes" if memory else "gold", group_size=1)


class ReplayTeacher(GoldTeacher):
    """Plays recorded trajectories again with their *real* observations (``replays[i]`` is trajectory i of a replay
    run, group prefix :data:`REPLAY_PREFIX`): Act writes the recorded outputs, Rehearse the real environment's answer
    to each call (:func:`real_observations`), so Rehearse's rows are real observations under the Rehearse prompt."""

    def __init__(self, tokenizer: Any, replays: list[Trajectory], **kw: Any):
        super().__init__(tokenizer, [], **kw)
        self.replays = replays

    def _script_of(self, traj_id: str) -> tuple[list[str], list[str]]:
        t = self.replays[int(traj_id.split(":", 1)[0].removeprefix(REPLAY_PREFIX))]
        obs = real_observations(t)
        assert obs is not None, f"trajectory {t.id} has no real observation of every call"
        return [s.action_text for s in t.steps], [format_observation(o) for o in obs]


REPLAY_PREFIX = "replay"


def real_observations(traj: Trajectory) -> list[Any] | None:
    """The real environment's answer to each parsed call of ``traj``, in order: its observations where it ran in the
    real environment (mode ``real``), else the shadow copy's (``RolloutConfig.shadow``); None where some call has none
    (a rehearsed trajectory without shadow, a call never answered)."""
    out: list[Any] = []
    for s in traj.steps:
        for i, _ in enumerate(s.calls):
            if i >= len(s.observations):  # never answered (the trajectory was cut there)
                return None
            real = traj.mode == "real" and s.sources[i] == "real"
            obs = s.observations[i] if real else (s.shadow[i] if i < len(s.shadow) else None)
            if obs is None:
                return None
            out.append(obs)
    return out


def replayed_trajectories(
    tokenizer: Any,
    trajs: list[Trajectory],
    tasks_by_id: dict[str, Task],
    chat_format: str | None = None,
    tool_format: str | None = None,
    thinking: bool | None = None,
    native_tools: bool = True,
    thinking_history: str | None = None,
) -> list[Trajectory]:
    """``trajs`` (each with :func:`real_observations`) played again by :class:`ReplayTeacher` through the rollout
    engine, as :func:`gold_trajectories` plays the gold: their Rehearse rows are those SFT would make of these calls
    and real observations. Every parsed call goes to Rehearse (no validation in code, no reference cache); the user
    turns are the task's scripted ones."""
    if not trajs:
        return []
    tasks = [tasks_by_id[t.task_id] for t in trajs]
    cfg = _teacher_config(
        max(len(t.steps) for t in trajs) + max(len(t.user_turns) for t in tasks),
        chat_format,
        tool_format,
        thinking,
        native_tools,
        thinking_history,
    )
    teacher = ReplayTeacher(
        tokenizer,
        trajs,
        tools=tool_format_for(tokenizer, cfg.tool_format),
        end_id=ChatFormat.for_tokenizer(tokenizer, cfg.chat_format, cfg.thinking).end_id,
    )
    return RolloutEngine(teacher, cfg, mode="rehearsal").run(tasks, group_prefix=REPLAY_PREFIX, group_size=1)


CHAT_IO = ("chat_format", "tool_format", "thinking", "thinking_history", "native_tools")
"""The chat and tool format settings a teacher's rollout takes (:func:`gold_trajectories`' keywords)."""


def chat_io(rollout: RolloutConfig) -> dict[str, Any]:
    """The :data:`CHAT_IO` settings of ``rollout`` (``SFTConfig.rollout``, ``TrainConfig.rollout``), as keywords."""
    return {k: getattr(rollout, k) for k in CHAT_IO}


def _teacher_config(
    n_steps: int,
    chat_format: str | None,
    tool_format: str | None,
    thinking: bool | None,
    native_tools: bool,
    thinking_history: str | None,
) -> RolloutConfig:
    """The rollout of a teacher (gold, replay): one trajectory per task, room for ``n_steps`` Act steps, no
    context bound (the rows are trained on, whatever their length)."""
    return RolloutConfig(
        max_steps=n_steps + 1,
        max_steps_per_turn=n_steps + 1,
        max_context_tokens=1 << 20,
        chat_format=chat_format,
        tool_format=tool_format,
        thinking=thinking,
        thinking_history=thinking_history,
        native_tools=native_tools,
    )


def lesson_rollout(cfg: SFTConfig) -> RolloutConfig:
    """The attempts of ``SFTConfig.memory_attempts``: ``cfg.rollout`` (by default Act sampled at T=1, at most 4 steps
    of 96 new tokens), its progress bar shown only where ``cfg.progress`` is on too."""
    return replace(cfg.rollout, progress=cfg.rollout.progress and cfg.progress)


@dataclass
class SFTResult:
    out_dir: str
    checkpoint: str | None
    metrics: list[dict[str, Any]] = field(default_factory=list)


def finished(state: dict[str, Any]) -> bool:
    """Whether a warm-up checkpoint's ``state`` is its last step's: a mid-run checkpoint holds the data order's
    position to resume from (``"data"``), the final one does not."""
    return "data" not in state


def sft(cfg: SFTConfig) -> SFTResult:
    """Supervised warm-up; writes a checkpoint folder usable as ``TrainConfig.model``. Every ``cfg.save_every`` steps
    it saves a resumable checkpoint (weights, optimizer, the data order's position and generator, the notes), and a
    rerun in the same ``out_dir`` resumes the latest one (:func:`envace.config.check_resume` decides whether it may):
    the resumed run trains on the same rows in the same order as one that was never stopped."""
    from .update import optimizer_step

    ckpt_root = os.path.join(cfg.out_dir, "checkpoints")
    ckpt = latest_checkpoint(ckpt_root)
    state = load_state(ckpt) if ckpt else {}
    if ckpt:
        check_resume(cfg, state, SFT_RESUMABLE_FIELDS, "sft", ckpt)
        if finished(state):
            return _finished(cfg, ckpt, int(state["step"]))
    seed_everything(cfg.seed)
    model, tok = load_resumed(
        cfg.model,
        os.path.join(ckpt, "policy") if ckpt else None,
        cfg.lora_r,
        cfg.lora_alpha,
        gradient_checkpointing=cfg.gradient_checkpointing,
    )
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay)
    bf16 = use_bf16(cfg.bf16, next(model.parameters()).device)  # "auto": only where bf16 is faster than float32
    tasks = load_tasks_of_kinds(cfg.suite, "train", cfg.n_tasks, cfg.seed, cfg.task_kinds, "SFTConfig.task_kinds")
    io = chat_io(cfg.rollout)
    trajs = gold_trajectories(tok, tasks, **io)
    notes: dict[str, str] | None = None
    if cfg.memory_attempts:  # the starting model's own rehearsals, distilled (kept: a resumed model is not it)
        notes = state.get("notes")
        if notes is None:
            policy = HFBackend(model, tok, bf16=bf16)  # the attempts sample in the update's precision
            notes = rehearsal_lessons(
                policy, tasks, lesson_rollout(cfg), cfg.memory_attempts, seed=cfg.seed, memory=cfg.memory_format
            )
        trajs += gold_trajectories(tok, tasks, **io, memory=notes)
    rows_by_traj = [[r for r in t.rows if r.role in cfg.roles] for t in trajs]
    rng = np.random.default_rng(cfg.seed)
    order: list[int] = []
    start = int(state.get("step", 0))
    if ckpt:
        load_optimizers(ckpt, {"policy": opt})
        load_rng(ckpt)
        rng.bit_generator.state, order = state["data"]["generator"], list(state["data"]["order"])
        print(f"[sft] resuming {cfg.out_dir} from step {start} ({ckpt})", flush=True)
    logger = MetricsLogger(cfg.out_dir, cfg.sinks, resume_step=start if ckpt else None, config=to_dict(cfg))
    result = SFTResult(cfg.out_dir, None, read_metrics(cfg.out_dir) if ckpt else [])

    def loss_fn(logp: torch.Tensor, mask: torch.Tensor, idxs: list[int], normalizer: float):
        return algos.sft_loss(logp, mask, "token_mean", normalizer)

    bar = tqdm(range(start + 1, cfg.steps + 1), desc="sft", initial=start, total=cfg.steps, disable=not cfg.progress)
    for step in bar:
        t0 = time.perf_counter()
        if len(order) < cfg.batch_tasks:
            order += rng.permutation(len(trajs)).tolist()
        pick, order = order[: cfg.batch_tasks], order[cfg.batch_tasks :]
        rows: list[Row] = [r for i in pick for r in rows_by_traj[i]]
        m = optimizer_step(
            model,
            opt,
            rows,
            loss_fn,
            agg="token_mean",
            micro_batch_tokens=cfg.micro_batch_tokens,
            temperatures={},
            max_grad_norm=cfg.max_grad_norm,
            bf16=bf16,
        )
        m = {f"sft/{k}": v for k, v in m.items()} | {"perf/step_s": time.perf_counter() - t0}
        logger.log(step, m)
        result.metrics.append({"step": step, **m})
        if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
            data = {"generator": rng.bit_generator.state, "order": order}
            save_checkpoint(
                ckpt_root,
                step,
                {"policy": model},
                {"policy": opt},
                {"config": to_dict(cfg), "data": data} | ({"notes": notes} if notes is not None else {}),
                tokenizer=tok,
                keep=1,
            )
    logger.close()
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()  # the warm-up checkpoint is a plain model, ready for RL or LoRA
    result.checkpoint = save_checkpoint(
        ckpt_root,
        cfg.steps,
        {"policy": model},
        {},
        {"config": to_dict(cfg)},
        tokenizer=tok,
        keep=1,
    )
    result.checkpoint = os.path.join(result.checkpoint, "policy")
    return result


def _finished(cfg: SFTConfig, ckpt: str, step: int) -> SFTResult:
    """The warm-up in ``cfg.out_dir`` that finished at ``step``: returned as it is when it has ``cfg.steps`` steps."""
    if step != cfg.steps:
        raise ValueError(
            f"{cfg.out_dir} holds a finished warm-up of {step} steps, not {cfg.steps}: its last checkpoint keeps no "
            f"optimizer state to go on from; use another out_dir, or delete {os.path.dirname(ckpt)} to start over"
        )
    return SFTResult(cfg.out_dir, os.path.join(ckpt, "policy"), read_metrics(cfg.out_dir))
