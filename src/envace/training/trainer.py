"""Role-wise GRPO training (METHOD.md section 2). The loop in :func:`train` reads top to bottom:
sample B tasks -> roll out K trajectories each -> score -> advantages per (group, role) -> update -> log -> checkpoint;
what it works with (models, engines, tasks, reward, logger, the resumed state) is made by :func:`setup`, and
which models the variant trains and who plays Rehearse come from its entry (envace.rollout.variants.VARIANTS).

Departures from the paper / reference code:
- Old log-probs are the sampling log-probs recorded by the backend (one update epoch per batch, as in the
  reference, so the ratio starts at ~1; batched vs packed numerics differ by ~1e-6) -- unless the sampler is not
  the trainer (bf16 rollouts and a float32 update, a vLLM engine): then the trainer recomputes them (in the update's
  own forward when the update is one optimizer step), and each token's loss is weighted by min(pi_old / pi_sampler,
  tis_cap) from the sampler's own log-probs (truncated importance sampling, as verl / TRL / SkyRL do; ``mismatch/*``
  logs the gap).
- Rows of one context are packed into one sequence for the update (exact for a causal LM; see envace.training.update).
- A trajectory whose reward is None (unscored, e.g. a judge failure) is masked out and counted.
- Beyond the paper (off by default): ``real_share`` rolls out a share of each group in the real environment
  (Dyna / DreamGym-style grounding, :func:`grounded_rollouts`); the group's baselines then mix both worlds. Only for
  variants whose rollout mode is ``rehearsal``, on tasks with a real environment; a run with it is an arm of its own,
  never reported as EnvACE (metrics ``rollout/real_trajectories``, ``reward/real_mean``, ``reward/rehearsed_mean``).
- Beyond the paper, one setting each, off by default (docs/training.md): ``clip_eps_high`` (DAPO's clip-higher);
  ``dynamic_sampling`` (DAPO: a group whose K rewards are all equal has advantage 0 on every row of both roles; it is
  dropped and refilled by further tasks, :func:`dynamic_sampling`, metrics ``sampling/*``); ``obs_loss_alpha`` (ECHO:
  a cross-entropy on *real* observations under the Rehearse prompt, rows of role :data:`OBS_ROLE` from the batch
  tasks' gold episodes and real / shadow rollouts, :func:`observation_rows`, :func:`with_obs_loss`, ``loss/obs_ce``).

Scaling out (envace.training.distributed, docs/scaling.md): under torchrun / accelerate launch each process rolls out
whole GRPO groups (its share of the B tasks), so the baselines are exact locally; the update's normalizer is
global and gradients are synchronised, so one step equals the single-process step. Rank 0 logs and checkpoints.
With ``rollout_backend: vllm`` a separate engine generates and gets the weights after each update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..math import algos
from ..backends.base import Backend, SamplingParams
from ..backends.hf import HFBackend
from ..backends.loaders import frozen_backend, open_backend
from ..backends.vllm import VllmProbe, engine_for
from ..core.checkpoint import latest_checkpoint, load_rng, load_state
from ..config import RESUMABLE_FIELDS, TrainConfig, real_share_setting, to_dict
from ..config import check_resume as check_config_resume
from .distributed import Dist, SilentLogger, init_distributed
from ..envs import load_tasks_of_kinds
from ..core.logging import MetricsLogger, truncate_jsonl
from ..core.atomic import write_json
from ..core.paths import check_writable_dir
from ..backends.models import context_length, head_size, load_frozen, load_resumed, make_optimizer, model_path
from ..core.precision import use_bf16
from ..rewards.functions import RewardContext, make_reward, reward_names, score_trajectories, unanchored_note
from ..rollout.engine import RolloutEngine
from ..rollout.memory import rehearsal_lessons
from ..core.seeding import derive_seed, seed_everything
from ..core.types import Row, Task, Trajectory, write_jsonl
from .sft import chat_io, gold_trajectories, real_observations, replayed_trajectories
from .update import optimizer_step, pad_rows, recompute_old_logprobs
from ..rollout.variants import VARIANTS, Variant

ROLE_INDEX = {"act": 0, "rehearse": 1}
ITERATION_PRIME = 100_003
"""Iteration ``i`` of a run seeded ``s`` rolls out and shuffles its update with ``derive_seed(s, i,
prime=ITERATION_PRIME)``."""
REAL_SALT = 1
"""With ``real_share``, iteration seed ``s``'s real-environment rollouts are seeded ``derive_seed(s, REAL_SALT)``."""
REFILL_SALT = 2
"""With ``dynamic_sampling``, refill round r of iteration seed ``s`` draws its tasks and rollouts from
``derive_seed(s, REFILL_SALT, r)``."""
OBS_SALT = 3
"""With ``obs_loss_alpha``, iteration ``i`` splits its observation rows over the optimizer steps with
``derive_seed(seed, i, OBS_SALT)``."""
NOTES_SALT = 4
"""With ``notes_attempts``, the tasks that carry notes are chosen, and their attempts sampled, with
``derive_seed(seed, NOTES_SALT)``."""
OBS_ROLE = "observation"
"""The role of a row whose completion is a *real* observation under the Rehearse prompt (``obs_loss_alpha``): no
advantage, no policy loss (not in :data:`ROLE_INDEX`), only the observation cross-entropy."""


def task_stream(n_tasks: int, seed: int, start: int, count: int) -> list[int]:
    """Which of a pool of ``n_tasks`` training tasks stand at positions ``start .. start + count - 1`` of a run's task
    stream (batch ``it`` is positions ``it * B ..``). Epoch ``e`` (positions ``e * n_tasks ..``) is a permutation of the
    pool seeded ``seed`` for the first epoch (the fixed order of before) and ``derive_seed(seed, e)`` after. A
    position's task depends on (n_tasks, seed, position) only, never on ``iterations``: a resumed or extended run
    continues the stream where it stopped, and no task comes twice before the pool is used up."""
    perms: dict[int, list[int]] = {}

    def at(p: int) -> int:
        e = p // n_tasks
        if e not in perms:
            perms[e] = np.random.default_rng(derive_seed(seed, e) if e else seed).permutation(n_tasks).tolist()
        return perms[e][p % n_tasks]

    return [at(p) for p in range(start, start + count)]


def train_tasks(cfg: TrainConfig) -> list[Task]:
    """The pool a run draws its batches from (:func:`task_stream`): the first ``n_train_tasks`` tasks of the train
    split (of ``task_kinds``), or (None) the split's whole default set (``load_tasks(..., n=None)``: the built-in
    suites' 2,000, every task of the others). It does not depend on ``iterations``, so extending a run keeps it."""
    return load_tasks_of_kinds(
        cfg.suite, "train", cfg.n_train_tasks, cfg.seed, cfg.task_kinds, "TrainConfig.task_kinds"
    )


def rows_with_advantages(
    trajs: list[Trajectory], estimator: str, roles: tuple[str, ...]
) -> tuple[list[Row], torch.Tensor, dict[str, float]]:
    """All rows of the trained roles, and their advantages from the group baselines (per role by default).

    Statistics use every row of every scored trajectory (so a role that is not trained still sees the same
    baseline definition); unscored trajectories get advantage 0 and are left out."""
    rows = [r for t in trajs for r in t.rows if r.role in ROLE_INDEX]
    if not rows:
        return [], torch.zeros(0), {}
    reward_of = {t.id: t.reward for t in trajs}
    group_of = {t.id: t.group_id for t in trajs}  # the trajectory decides its group
    groups = {g: i for i, g in enumerate(sorted(set(group_of.values())))}
    rewards = torch.tensor(
        [reward_of[r.traj_id] if reward_of[r.traj_id] is not None else float("nan") for r in rows], dtype=torch.float32
    )
    valid = ~torch.isnan(rewards)
    g = torch.tensor([groups[group_of[r.traj_id]] for r in rows])
    ro = torch.tensor([ROLE_INDEX[r.role] for r in rows])
    adv, m = algos.ADVANTAGES.get(estimator)(torch.nan_to_num(rewards), g, ro, valid)
    keep = [i for i, r in enumerate(rows) if r.role in roles and bool(valid[i]) and r.completion_ids]
    return [rows[i] for i in keep], adv[keep], m


@dataclass
class TrainResult:
    out_dir: str
    step: int
    metrics: list[dict[str, Any]] = field(default_factory=list)
    checkpoint: str | None = None


def _success(t: Trajectory) -> bool:
    """Success by the real environment's own check where the trajectory ran in one, else by a grounded reward
    component when there is one, else a full reward."""
    if t.env_outcome is not None and t.mode == "real":
        return bool(t.env_outcome.get("success", False))
    g = t.reward_info.get("grounded") if isinstance(t.reward_info.get("grounded"), dict) else t.reward_info
    return bool(g.get("success", t.reward is not None and t.reward >= 1.0))


def _world(t: Trajectory) -> str:
    """``real`` for a trajectory the real environment answered, ``imagined`` for a rehearsed / simulated one."""
    return "real" if t.mode == "real" else "imagined"


def _summarise(trajs: list[Trajectory], n_unscored: int) -> dict[str, float]:
    """Metrics of a batch. Success is named by where the observations came from: ``reward/imagined_success_rate``
    for trajectories whose observations were imagined (rehearsal, per_role, simulator: success of a dream, not
    of the world) and ``reward/real_success_rate`` for trajectories the real environment answered (real_env)."""
    scored = [t.reward for t in trajs if t.reward is not None]
    m: dict[str, float] = {
        "reward/mean": float(np.mean(scored)) if scored else 0.0,
        "reward/unscored": float(n_unscored),
    }
    for world in sorted({_world(t) for t in trajs}):
        m[f"reward/{world}_success_rate"] = float(np.mean([_success(t) for t in trajs if _world(t) == world]))
    totals: dict[str, int] = {}
    for t in trajs:
        for k, v in t.counters.items():
            totals[k] = totals.get(k, 0) + v
    for k, v in totals.items():
        m[k if "/" in k else f"rollout/{k}"] = v / max(1, len(trajs))
    m["act/rows"] = float(sum(r.role == "act" for t in trajs for r in t.rows))
    m["rehearse/rows"] = float(sum(r.role == "rehearse" for t in trajs for r in t.rows))
    m["act/tokens"] = float(sum(len(r.completion_ids) for t in trajs for r in t.rows if r.role == "act"))
    m["rehearse/tokens"] = float(sum(len(r.completion_ids) for t in trajs for r in t.rows if r.role == "rehearse"))
    return m


def _reward_split(
    trajs: list[Trajectory], inside: Callable[[Trajectory], bool], names: tuple[str, str, str]
) -> dict[str, float]:
    """Metrics ``names`` = (count, mean_in, mean_out): how many trajectories of the batch are ``inside``, and the
    mean reward of those inside and of the others (scored trajectories only; 0 where there is none)."""
    count, mean_in, mean_out = names
    scored = [t for t in trajs if t.reward is not None]
    rin = [t.reward for t in scored if inside(t)]
    rout = [t.reward for t in scored if not inside(t)]
    return {
        count: float(sum(map(inside, trajs))),
        mean_in: float(np.mean(rin)) if rin else 0.0,
        mean_out: float(np.mean(rout)) if rout else 0.0,
    }


def _real_share_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """With ``real_share``: how many trajectories of the batch the real environment answered, and the mean reward
    of the real and of the rehearsed ones."""
    names = ("rollout/real_trajectories", "reward/real_mean", "reward/rehearsed_mean")
    return _reward_split(trajs, lambda t: t.mode == "real", names)


def train(cfg: TrainConfig) -> TrainResult:
    """Run (or resume) role-wise GRPO training as configured (on this process's share under a launcher)."""
    run = setup(cfg)  # models, rollout engines, tasks, reward, logger; the latest checkpoint's state if there is one
    result = TrainResult(cfg.out_dir, run.start)
    bar = tqdm(
        range(run.start, cfg.iterations),
        desc=f"train[{cfg.variant}]",
        disable=not (cfg.progress and run.dist.is_main),
        initial=run.start,
        total=cfg.iterations,
    )
    try:  # an interrupted run (Ctrl-C) still closes its progress bar and logs; the CLI says where it resumes
        for it in bar:
            t0 = time.perf_counter()
            # 1. K trajectories for each of this process's tasks of batch ``it``, in the variant's rollout mode
            trajs = rollout_batch(run, it)
            t_roll = time.perf_counter() - t0
            # 2. rewards (shared by both roles of a trajectory); the whole batch for the logs and metrics
            score_trajectories(run.tasks_by_id, trajs, run.reward_fn, run.ctx)
            dropped: list[Trajectory] = []
            if cfg.dynamic_sampling:  # DAPO: groups whose K rewards are equal out, groups of further tasks in
                trajs, dropped, sampling_m = dynamic_sampling(run, it, trajs)
            # the whole batch (light copies); `trajs` itself on one process
            everyone = run.dist.gather_trajectories(trajs)
            everyone_dropped = run.dist.gather_trajectories(dropped) if cfg.dynamic_sampling else []
            _check_context(everyone + everyone_dropped, cfg)
            run.log_trajectories(everyone, it)
            run.log_trajectories(everyone_dropped, it, dropped=True)
            # 3. advantages per (group, role) from this process's whole groups
            rows, adv, _ = rows_with_advantages(trajs, cfg.advantage, cfg.train_roles)
            _, _, adv_m = rows_with_advantages(everyone, cfg.advantage, cfg.train_roles)  # metrics of the whole batch
            metrics = _summarise(everyone, sum(t.reward is None for t in everyone)) | {
                f"adv/{k}": v for k, v in adv_m.items()
            }
            if cfg.real_share > 0:  # the grounded share of the groups
                metrics |= _real_share_metrics(everyone)
            if run.notes:  # the rollouts whose Act prompt carried rehearsal notes
                metrics |= _notes_metrics(everyone, run.notes)
            if cfg.dynamic_sampling:
                metrics |= sampling_m
            # real observations under the Rehearse prompt, for the observation cross-entropy (obs_loss_alpha)
            obs: list[Row] = []
            if cfg.obs_loss_alpha > 0:
                obs, obs_m = observation_rows(run, trajs)
                metrics |= obs_m
            # 4. one update per trained model on the rows of its roles; the rollout engines get the new weights
            t1 = time.perf_counter()
            metrics |= update(run, rows, adv, it, obs)
            # 5. log and checkpoint
            step = it + 1
            metrics |= {
                "perf/rollout_s": t_roll,
                "perf/update_s": time.perf_counter() - t1,  # the weight sync included (perf/sync_s)
                "perf/iteration_s": time.perf_counter() - t0,
                "perf/gen_tokens": run.dist.sum(run.engines["policy"].stats["generated_tokens"]),
            }
            run.logger.log(step, metrics)
            result.metrics.append({"step": step, **metrics})
            bar.set_postfix(reward=f"{metrics['reward/mean']:.2f}")
            if step % cfg.save_every == 0 or step == cfg.iterations:
                result.checkpoint = run.save(step)
            result.step = step
    finally:
        bar.close()
        run.logger.close()
    result.checkpoint = result.checkpoint or latest_checkpoint(run.ckpt_root)
    return result


@dataclass
class Run:
    """What the loop of :func:`train` works with (made by :func:`setup`): no logic of its own but logging and saving."""

    cfg: TrainConfig
    dist: Dist
    variant: Variant
    tok: Any
    models: dict[str, Any]
    """The trained models by name (``variant.trained_models``: policy, and per_role's rehearser), placed and wrapped."""
    optimizers: dict[str, torch.optim.Optimizer]
    engines: dict[str, Backend]
    """The rollout engine of each trained model (``engines["policy"]`` plays Act)."""
    helpers: dict[str, Backend]
    """The RolloutEngine keywords of the variant's mode: who answers Act's calls besides the policy (rehearser,
    simulator)."""
    ref: Reference | None
    tasks: list[Task]
    """The pool of training tasks (:func:`train_tasks`); batches walk through it along :func:`task_stream`."""
    reward_fn: Any
    ctx: RewardContext
    start: int
    """The first iteration to run (the resumed checkpoint's step, else 0)."""
    logger: Any
    ckpt_root: str
    temps: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)
    """Task id -> the rehearsal notes its rollouts show Act (``notes_attempts``; empty: none)."""

    @property
    def tasks_by_id(self) -> dict[str, Task]:
        return {t.id: t for t in self.tasks}

    def batch(self, it: int) -> list[Task]:
        """The B tasks of iteration ``it``: positions ``it * B .. (it + 1) * B - 1`` of the task stream."""
        b = self.cfg.batch_tasks
        return [self.tasks[i] for i in task_stream(len(self.tasks), self.cfg.seed, it * b, b)]

    @property
    def traj_log(self) -> str:
        return os.path.join(self.cfg.out_dir, "trajectories.jsonl")

    def log_trajectories(self, trajs: list[Trajectory], it: int, dropped: bool = False) -> None:
        """Append ``trajs`` to the trajectory log; ``dropped``: groups dynamic sampling left out (marked so)."""
        mark = {"dropped": True} if dropped else {}
        if self.dist.is_main and trajs:  # rank 0 writes the logs
            write_jsonl(self.traj_log, [t.to_dict(with_rows=False) | {"iteration": it} | mark for t in trajs])

    def save(self, step: int) -> str | None:
        c = self.cfg
        return self.dist.save_checkpoint(
            self.ckpt_root,
            step,
            self.models,
            self.optimizers,
            {"data_position": step * c.batch_tasks, "config": to_dict(c)},
            tokenizer=self.tok,
            keep=c.keep_checkpoints,
        )


def setup(cfg: TrainConfig) -> Run:
    """Everything the loop needs, resumed from the latest checkpoint in ``cfg.out_dir`` if there is one: the
    variant's trained models (:func:`trained_model`) with their optimizers and rollout engines, its helpers and
    the KL reference (:func:`frozen_models`: the initial model, also on resume), the pool of training tasks
    (:func:`train_tasks`, walked along :func:`task_stream`), the reward, the logger. The order of the loads is the
    order the random state sees them. ``out_dir`` and the tasks are checked before any model loads, and ``out_dir``
    is made only once nothing of the setup can fail: a bad suite or path leaves no empty run folder."""
    dist = init_distributed(cfg.device)  # one process unless started by torchrun / accelerate launch
    check_writable_dir(cfg.out_dir, "out_dir")
    tasks = train_tasks(cfg)  # the same pool whatever `iterations` is: an extended run continues the stream
    ckpt_root = os.path.join(cfg.out_dir, "checkpoints")
    ckpt = latest_checkpoint(ckpt_root)
    if ckpt:
        check_resume(cfg, ckpt)
    seed_everything(cfg.seed)
    variant = VARIANTS.get(cfg.variant)
    policy, tok = trained_model(cfg, ckpt, "policy")
    _check_model_context(policy, tok, cfg)
    models = {"policy": policy} | {
        name: trained_model(cfg, ckpt, name)[0] for name in variant.trained_models if name != "policy"
    }
    optimizers = {name: make_optimizer(m, cfg.lr, cfg.weight_decay) for name, m in models.items()}
    for name in models:  # placed on this process's device; wrapped (DDP/FSDP) under a launcher
        models[name], optimizers[name] = dist.prepare(models[name], optimizers[name])
    ref, simulator = frozen_models(cfg, dist.unwrap(models["policy"]), dist)  # the initial model, also on resume
    engines = {name: rollout_backend(cfg, dist.unwrap(m), tok, dist) for name, m in models.items()}
    for name, engine in engines.items():  # a separate engine (vllm) starts from the trainer's weights (resume, LoRA)
        engine.sync_weights(dist.weights(models[name]))
    frozen = {variant.frozen_helper: simulator} if simulator is not None else {}
    helpers = variant.rollout_mode.helpers(
        lambda helper, role: (engines | frozen)[helper]
    )  # a trained helper's engine, or the frozen one
    reward_fn, ctx = make_reward(cfg.reward), reward_context(cfg, engines["policy"], dist)
    notes = rl_notes(cfg, tasks, engines["policy"], dist, resumed=ckpt is not None)  # the initial policy's
    start = 0
    if ckpt:
        start = int(load_state(ckpt)["step"])
        dist.load_optimizers(ckpt, models, optimizers)
        load_rng(ckpt)
    os.makedirs(cfg.out_dir, exist_ok=True)
    if dist.is_main:  # rank 0 writes the logs
        logger: Any = MetricsLogger(cfg.out_dir, cfg.sinks, resume_step=start if ckpt else None, config=to_dict(cfg))
        # like the metrics: iterations past the checkpoint are redone, so their trajectories (and a torn tail) go
        truncate_jsonl(os.path.join(cfg.out_dir, "trajectories.jsonl"), lambda rec: rec.get("iteration", -1) < start)
    else:
        logger = SilentLogger()
    temps = {"act": cfg.rollout.act.temperature or 1.0, "rehearse": cfg.rollout.rehearse.temperature or 1.0}
    return Run(
        cfg,
        dist,
        variant,
        tok,
        models,
        optimizers,
        engines,
        helpers,
        ref,
        tasks,
        reward_fn,
        ctx,
        start,
        logger,
        ckpt_root,
        temps,
        notes,
    )


def noted_tasks(task_ids: list[str], share: float, seed: int) -> set[str]:
    """The round(``share`` x pool) task ids of the training pool whose rollouts carry notes: a permutation seeded
    ``derive_seed(seed, NOTES_SALT)``, its first ones (a pure function of the pool, the share and the seed)."""
    k = round(share * len(task_ids))
    order = np.random.default_rng(derive_seed(seed, NOTES_SALT)).permutation(len(task_ids))
    return {task_ids[i] for i in order[:k]}


def rl_notes(cfg: TrainConfig, tasks: list[Task], policy: Backend, dist: Dist, resumed: bool) -> dict[str, str]:
    """Task id -> the notes its rollouts show Act (``cfg.notes_attempts`` > 0; else {}): ``notes_attempts``
    rehearsals of each task of :func:`noted_tasks` by ``policy`` (the initial model), distilled in ``notes_format``
    (envace.rollout.memory.rehearsal_lessons; each process rehearses its share of the tasks), written to
    ``<out_dir>/notes.json``; a ``resumed`` run reads that file (its policy is no longer the initial one)."""
    if not cfg.notes_attempts:
        return {}
    path = os.path.join(cfg.out_dir, "notes.json")
    if resumed:
        if not os.path.exists(path):
            raise ValueError(
                f"{cfg.out_dir} holds a checkpoint but not notes.json, the initial policy's rehearsal notes "
                "(notes_attempts > 0), which a resumed policy cannot make again; delete its checkpoints to start over"
            )
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    chosen = noted_tasks([t.id for t in tasks], cfg.notes_share, cfg.seed)
    mine = dist.shard([t for t in tasks if t.id in chosen])
    seed = dist.rank_seed(derive_seed(cfg.seed, NOTES_SALT))
    part = (
        rehearsal_lessons(policy, mine, cfg.rollout, cfg.notes_attempts, seed=seed, memory=cfg.notes_format)
        if mine
        else {}
    )
    notes = {k: v for p in dist.all_gather(part) for k, v in p.items()}
    if dist.is_main:
        write_json(path, notes)
    return notes


def _notes_metrics(trajs: list[Trajectory], notes: dict[str, str]) -> dict[str, float]:
    """With ``notes_attempts``: how many trajectories of the batch carried notes, and the mean reward of those with
    and without."""
    names = ("notes/trajectories", "notes/reward_with", "notes/reward_without")
    return _reward_split(trajs, lambda t: t.task_id in notes, names)


def trained_model(cfg: TrainConfig, ckpt: str | None, name: str) -> tuple[Any, Any]:
    """Trained model ``name`` of the variant (policy, rehearser) and its tokenizer: ``cfg.model``, or its state at
    checkpoint ``ckpt`` (full fine-tuning: the saved ``<ckpt>/<name>``; LoRA: ``cfg.model`` with that saved adapter)."""
    return load_resumed(
        cfg.model, os.path.join(ckpt, name) if ckpt else None, cfg.lora_r, cfg.lora_alpha, cfg.gradient_checkpointing
    )


def rollout_batch(run: Run, it: int, refill: int = 0, tasks: list[Task] | None = None) -> list[Trajectory]:
    """Batch ``it``: B tasks at data position ``it * B`` of the task stream (:meth:`Run.batch`); this process rolls
    out K trajectories for each of its whole tasks (a GRPO group never spans processes), seeded by iteration and rank.
    With ``real_share`` each group's last m of them run in the real environment (:func:`grounded_rollouts`).
    ``refill`` r > 0: dynamic sampling's round r, on this process's ``tasks`` (:func:`dynamic_sampling`)."""
    cfg = run.cfg
    it_seed = derive_seed(cfg.seed, it, prime=ITERATION_PRIME)
    if refill:
        it_seed = derive_seed(it_seed, REFILL_SALT, refill)
    mine = run.dist.shard(run.batch(it)) if tasks is None else tasks
    seed = run.dist.rank_seed(it_seed)
    prefix = run.dist.group_prefix(f"i{it}-" if not refill else f"i{it}r{refill}-")
    if cfg.real_share > 0:
        return grounded_rollouts(run, mine, prefix, it_seed, seed)
    mode = VARIANTS.get(cfg.variant).mode
    engine = RolloutEngine(run.engines["policy"], cfg.rollout, mode=mode, memory=run.notes, **run.helpers)
    return engine.run(mine, group_prefix=prefix, group_size=cfg.group_size, seed=seed)


def informative_trajectories(trajs: list[Trajectory]) -> tuple[list[Trajectory], list[Trajectory]]:
    """(kept, dropped): the trajectories of the groups that carry a GRPO signal (:func:`envace.math.algos.
    informative_groups`: their scored rewards are not all equal) and those of the others, each in order."""
    index = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajs))}
    if not index:
        return [], []
    rewards = torch.tensor([math.nan if t.reward is None else t.reward for t in trajs], dtype=torch.float32)
    groups = torch.tensor([index[t.group_id] for t in trajs], dtype=torch.long)
    keep, _ = algos.informative_groups(rewards, groups, ~torch.isnan(rewards))
    kept = [t for t in trajs if keep[index[t.group_id]]]
    return kept, [t for t in trajs if not keep[index[t.group_id]]]


def dynamic_sampling(
    run: Run, it: int, trajs: list[Trajectory]
) -> tuple[list[Trajectory], list[Trajectory], dict[str, float]]:
    """DAPO's dynamic sampling on this process's scored groups ``trajs``: drop each group whose K rewards are all
    equal (advantage 0 on every row of both roles) and roll out as many further tasks (drawn from the pool by
    ``derive_seed(iteration seed, REFILL_SALT, r)``, the task stream untouched) in round r, up to
    ``dynamic_sampling`` rounds; then go on with what is kept. Returns (kept, dropped, ``sampling/*`` metrics of the
    whole batch: groups dropped, extra rounds, share kept of the groups rolled out, groups short of B; and
    ``perf/refill_s``, the time of the extra rounds)."""
    cfg, t0 = run.cfg, time.perf_counter()
    kept, dropped = informative_trajectories(trajs)
    want = len({t.group_id for t in trajs})
    rolled, rounds = want, 0
    while len({t.group_id for t in kept}) < want and rounds < cfg.dynamic_sampling:
        rounds += 1
        missing = want - len({t.group_id for t in kept})
        seed = run.dist.rank_seed(derive_seed(derive_seed(cfg.seed, it, prime=ITERATION_PRIME), REFILL_SALT, rounds))
        tasks = [run.tasks[i] for i in task_stream(len(run.tasks), seed, 0, missing)]
        more = rollout_batch(run, it, refill=rounds, tasks=tasks)
        score_trajectories(run.tasks_by_id, more, run.reward_fn, run.ctx)
        k, d = informative_trajectories(more)
        kept, dropped, rolled = kept + k, dropped + d, rolled + missing
    n_kept, n_want = run.dist.sum(len({t.group_id for t in kept})), run.dist.sum(want)
    n_rolled = run.dist.sum(rolled)
    return (
        kept,
        dropped,
        {
            "sampling/groups_dropped": n_rolled - n_kept,
            "sampling/extra_rounds": run.dist.max(rounds),
            "sampling/kept_share": n_kept / max(1.0, n_rolled),
            "sampling/groups_short": n_want - n_kept,
            "perf/refill_s": time.perf_counter() - t0,
        },
    )


def observation_rows(run: Run, trajs: list[Trajectory]) -> tuple[list[Row], dict[str, float]]:
    """Rows of role :data:`OBS_ROLE` for the observation cross-entropy: the Rehearse rows of the gold episodes of this
    process's batch tasks (:func:`envace.training.sft.gold_trajectories`, the rows SFT trains on) and of replays of
    its trajectories with a real observation for every call (real_share, real_env, shadow:
    :func:`envace.training.sft.replayed_trajectories`), in the rollouts' chat and tool formats. A row longer than
    ``rollout.max_context_tokens`` is left out, counted (``obs/too_long``)."""
    r, tasks_by_id = run.cfg.rollout, run.tasks_by_id
    io = chat_io(r)
    tasks = [tasks_by_id[i] for i in dict.fromkeys(t.task_id for t in trajs)]
    real = [t for t in trajs if real_observations(t) is not None and any(s.calls for s in t.steps)]
    sources = {
        "gold": gold_trajectories(run.tok, tasks, **io),
        "replayed": replayed_trajectories(run.tok, real, tasks_by_id, **io),
    }
    rows: list[Row] = []
    metrics: dict[str, float] = {}
    too_long = 0
    for name, done in sources.items():
        mine = [x for t in done for x in t.rows if x.role == "rehearse" and x.completion_ids]
        fits = [x for x in mine if len(x.prompt_ids) + len(x.completion_ids) <= r.max_context_tokens]
        too_long += len(mine) - len(fits)
        rows += [dataclasses.replace(x, role=OBS_ROLE) for x in fits]
        metrics[f"obs/{name}_rows"] = run.dist.sum(len(fits))
    metrics["obs/tokens"] = run.dist.sum(sum(len(x.completion_ids) for x in rows))
    metrics["obs/too_long"] = run.dist.sum(too_long)
    return rows, metrics


def grounded_rollouts(run: Run, tasks: list[Task], prefix: str, it_seed: int, seed: int) -> list[Trajectory]:
    """K trajectories for each task as one GRPO group: trajectories 0 .. K-m-1 rehearsed as configured (seeded
    ``seed``), K-m .. K-1 in the task's real environment (mode ``real``, Act rows only), m = round(real_share * K);
    the two engines' seeds are apart (the real one's is the iteration seed ``it_seed`` with :data:`REAL_SALT` folded
    in). Returned task by task, the rehearsed ones of each group first."""
    cfg = run.cfg
    k = cfg.group_size
    m = real_share_setting(cfg.real_share, cfg.variant, k)
    real_seed = run.dist.rank_seed(derive_seed(it_seed, REAL_SALT))
    mode = VARIANTS.get(cfg.variant).mode
    trajs: list[Trajectory] = []
    if m < k:
        engine = RolloutEngine(run.engines["policy"], cfg.rollout, mode=mode, memory=run.notes, **run.helpers)
        trajs += engine.run(tasks, group_prefix=prefix, group_size=k - m, seed=seed)
    engine = RolloutEngine(run.engines["policy"], cfg.rollout, mode="real", memory=run.notes)
    trajs += engine.run(tasks, group_prefix=prefix, first=k - m, group_size=m, seed=real_seed)
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:  # task by task (the order of the groups' first trajectories), rehearsed before real
        groups.setdefault(t.group_id, []).append(t)
    return [t for group in groups.values() for t in group]


def update(run: Run, rows: list[Row], adv: torch.Tensor, it: int, obs: list[Row] | None = None) -> dict[str, float]:
    """One update of every trained model on the rows its roles route to it (``variant.model_of``): old log-probs
    recomputed where the sampler's are not the trainer's (the sampler's own kept for the rollout correction,
    ``tis_cap``; in the step's own forward where there is one step, :func:`old_logprobs_in_the_step`), then
    ``update_epochs`` x ``mini_batches`` optimizer steps (the KL reference applies to the policy
    only); the rollout engines then get the new weights. Every process steps every model, with its rows (maybe
    none). Returns the ``loss/<model>/...`` metrics of the last step that updated the model (a part can be empty
    when there are fewer rows than mini-batches), or ``loss/<model>/micro_batches: 0`` when none did; where the
    old log-probs were recomputed, the batch's ``mismatch/...`` (:func:`mismatch_metrics`). ``obs`` (with
    ``obs_loss_alpha`` > 0): real-observation rows (:func:`observation_rows`), split over the optimizer steps like the
    rows, whose cross-entropy the model that plays Rehearse adds to each step (``loss/obs_ce``: the last step's)."""
    cfg, dist, temps = run.cfg, run.dist, run.temps
    metrics: dict[str, float] = {}
    engine = "hf" if all(isinstance(e, HFBackend) for e in run.engines.values()) else "separate"
    recompute = recomputes_old_logprobs(
        cfg, dist.device, engine
    )  # the rollout engine's log-probs are not the trainer's
    sampler = [list(r.old_logprobs) for r in rows]  # the sampler's own, kept for the rollout correction
    in_step = recompute and old_logprobs_in_the_step(cfg)
    for name, model in run.models.items():
        mine = [i for i, r in enumerate(rows) if run.variant.model_of(r.role) == name]
        sub_rows, sub_adv = [rows[i] for i in mine], adv[mine]
        if recompute and not in_step:
            recompute_old_logprobs(
                model,
                sub_rows,
                micro_batch_tokens=cfg.micro_batch_tokens,
                temperatures=temps,
                bf16=update_bf16(cfg, dist.device),
                dist=dist,
            )
        ref = run.ref if name == "policy" else None
        last: dict[str, float] = {}
        steps = update_parts(
            len(sub_rows), cfg.update_epochs, cfg.mini_batches, seed=derive_seed(cfg.seed, it, prime=ITERATION_PRIME)
        )
        learns_obs = cfg.obs_loss_alpha > 0 and name == run.variant.model_of("rehearse")  # the same on every process
        my_obs = list(obs or []) if learns_obs else []
        obs_steps = update_parts(
            len(my_obs), cfg.update_epochs, cfg.mini_batches, seed=derive_seed(cfg.seed, it, OBS_SALT)
        )  # as many steps as `steps`, in the same (epoch, part) order
        for (epoch, part), (_, obs_part) in zip(steps, obs_steps):
            p_rows, p_adv = [sub_rows[i] for i in part], sub_adv[part]
            p_sampler = [sampler[mine[i]] for i in part] if recompute and cfg.tis_cap is not None else None
            loss_fn, step_rows = _grpo_loss(p_rows, p_adv, cfg, ref, temps, p_sampler, old_in_step=in_step), p_rows
            if learns_obs:  # the observation cross-entropy joins this step: its rows after the policy rows
                o_rows = [my_obs[i] for i in obs_part]
                loss_fn, obs_ce = with_obs_loss(loss_fn, p_rows, o_rows, cfg.obs_loss_alpha, cfg.loss_agg, dist)
                step_rows = p_rows + o_rows
            um = optimizer_step(
                model,
                run.optimizers[name],
                step_rows,
                loss_fn,
                agg=cfg.loss_agg,
                micro_batch_tokens=cfg.micro_batch_tokens,
                temperatures=temps,
                max_grad_norm=cfg.max_grad_norm,
                bf16=update_bf16(cfg, dist.device),
                dist=dist,
            )
            updated = um.get("micro_batches", 0.0) > 0
            if learns_obs:
                metrics["loss/obs_ce"] = obs_ce()
            if epoch == 0 and updated:  # the first pass: the sampled policy's view (ratio 1 on its first part)
                metrics |= {f"loss/{name}/first_pass/{k}": v for k, v in um.items() if k in ("clip_frac", "loss")}
            if updated or not last:
                last = um
        metrics |= {f"loss/{name}/{k}": v for k, v in last.items()}  # the last optimizer step's that updated
    if recompute:  # how far the sampler was from the trainer on this batch
        metrics |= mismatch_metrics(rows, sampler, cfg.tis_cap, dist)
    t_sync = time.perf_counter()
    for name, engine in run.engines.items():  # new weights: hf drops its kept caches, vllm loads them
        engine.sync_weights(dist.weights(run.models[name]))
    return metrics | {"perf/sync_s": time.perf_counter() - t_sync}


def with_obs_loss(
    loss_fn: Callable, rows: list[Row], obs: list[Row], alpha: float, agg: str, dist: Dist
) -> tuple[Callable, Callable[[], float]]:
    """The loss of one optimizer step over ``rows + obs``: ``loss_fn`` (the policy loss of ``rows``, with their own
    normalizer, as without ``obs``) plus ``alpha`` x the token-mean negative log-likelihood of the rows ``obs`` (real
    observations, role :data:`OBS_ROLE`; ECHO's auxiliary loss). A micro-batch index ``i < len(rows)`` is a policy
    row, any other an observation row: roles decide which loss sees a token. Also returns ``obs_ce()``: the step's
    token-mean NLL of the observation tokens (every process's; call it after the step, on every process)."""
    n = len(rows)
    policy_norm = dist.sum(algos.rows_normalizer([len(r.completion_ids) for r in rows], agg))
    obs_norm = dist.sum(sum(len(r.completion_ids) for r in obs))
    seen = {"nll": 0.0, "n_tokens": 0.0}

    def fn(logp: torch.Tensor, mask: torch.Tensor, idxs: list[int], normalizer: float):
        pol = [j for j, i in enumerate(idxs) if i < n]  # micro-batch rows of the policy loss
        ob = [j for j, i in enumerate(idxs) if i >= n]  # micro-batch rows of real observations
        loss, m = logp.sum() * 0.0, {}
        if pol:  # as wide as the policy rows' longest completion, as in a micro-batch of policy rows alone
            w = int(mask[pol].sum(-1).max())
            loss, m = loss_fn(logp[pol, :w], mask[pol, :w], [idxs[j] for j in pol], policy_norm)
        if ob:
            ce, om = algos.sft_loss(logp[ob], mask[ob], "token_mean", obs_norm)
            loss = loss + alpha * ce
            seen["nll"] += om["nll"] * om["n_tokens"]
            seen["n_tokens"] += om["n_tokens"]
        return loss, m

    def obs_ce() -> float:
        total = dist.merge_metrics(dict(seen))
        return total["nll"] / max(1.0, total["n_tokens"])

    return fn, obs_ce


def mismatch_metrics(rows: list[Row], sampler: list[list[float]], cap: float | None, dist: Dist) -> dict[str, float]:
    """``mismatch/*`` of :func:`envace.math.algos.rollout_correction` over the completion tokens of every process's
    ``rows``: the trainer's old log-probs (``row.old_logprobs``) against the sampler's (``sampler[i]`` of row i)."""
    sums: dict[str, float] = {}
    if rows:
        old, mask = pad_rows([torch.tensor(r.old_logprobs, dtype=torch.float32) for r in rows])  # (rows, T)
        smp, _ = pad_rows([torch.tensor(s, dtype=torch.float32) for s in sampler])  # (rows, T)
        _, m = algos.rollout_correction(old, smp, mask, math.inf if cap is None else cap)
        n = m.pop("n_tokens")
        sums = {k: (v if k.endswith("_max") else v * n) for k, v in m.items()} | {"n_tokens": n}
    sums = dist.merge_metrics(sums)
    n = sums.pop("n_tokens", 0.0) or 1.0
    return {f"mismatch/{k}": (v if k.endswith("_max") else v / n) for k, v in sums.items()}


def update_parts(n_rows: int, epochs: int, mini_batches: int, seed: int) -> list[tuple[int, list[int]]]:
    """The optimizer steps of one iteration's update: ``epochs`` passes over ``n_rows`` rows, each pass the rows in
    a seeded shuffle split into ``mini_batches`` parts (one pass of one part: every row, in order). Every part
    is one (epoch, row indices) step; under a launcher every process takes as many steps, some maybe empty."""
    if epochs == 1 and mini_batches == 1:
        return [(0, list(range(n_rows)))]
    rng = np.random.default_rng(seed)
    steps = []
    for epoch in range(epochs):
        perm = rng.permutation(n_rows).tolist()
        steps += [(epoch, sorted(perm[k::mini_batches])) for k in range(mini_batches)]
    return steps


def update_bf16(cfg: TrainConfig, device: Any = None) -> bool:
    """Whether the update runs under bf16 autocast: ``bf16`` decided for ``device`` (default ``cfg.device``;
    ``auto``: only where bf16 is fast, envace.core.precision)."""
    return use_bf16(cfg.bf16, device or cfg.device)


def rollout_bf16(cfg: TrainConfig, device: Any = None) -> bool:
    """Whether rollouts run in bf16: ``rollout_bf16`` if set, else ``bf16``, decided for ``device`` as above."""
    return use_bf16(cfg.bf16 if cfg.rollout_bf16 is None else cfg.rollout_bf16, device or cfg.device)


def old_logprobs_in_the_step(cfg: TrainConfig) -> bool:
    """Whether recomputed old log-probs come from the update's own forward instead of a pass before it: with one
    optimizer step per model (``update_epochs`` 1, ``mini_batches`` 1) the weights do not change before the step,
    so the step's log-probs, detached, are the old ones (ratio 1); the forward a separate pass would cost is saved
    (measured for vLLM rollouts: docs/benchmarks.md section 6)."""
    return cfg.update_epochs == 1 and cfg.mini_batches == 1


def recomputes_old_logprobs(cfg: TrainConfig, device: Any = None, engine: str | None = None) -> bool:
    """``recompute_old_logprobs`` if set, else whether the sampler's numbers differ from the trainer's (the decided
    precisions, not the settings: ``auto`` rollouts that fall back to float32 match a float32 update). ``engine``:
    the rollout engine decided (:func:`rollout_backend`; default ``cfg.rollout_backend``)."""
    if cfg.recompute_old_logprobs is not None:
        return cfg.recompute_old_logprobs
    return (engine or cfg.rollout_backend) != "hf" or rollout_bf16(cfg, device) != update_bf16(cfg, device)


def rollout_backend(
    cfg: TrainConfig, model: Any, tok: Any, dist: Dist, probe: Callable[[], VllmProbe] | None = None
) -> Backend:
    """The engine that rolls out with ``model``'s weights. ``hf`` generates with the model object itself; any
    other loader (envace.backends.loaders.LOADERS: ``vllm``) is a separate engine, opened on the base model's files
    with ``tok`` and ``cfg.rollout_backend_options``, that receives the weights through ``sync_weights``. ``vllm``
    where vLLM cannot run (``probe``, default envace.backends.vllm.vllm_probe) is the ``hf`` engine, said in one
    line."""
    name = engine_for(cfg.rollout_backend, probe, head_size=head_size(model.config), training=True)
    if name == "hf":
        if dist.shards_parameters:
            raise ValueError(
                "rollout_backend 'hf' cannot generate with FSDP-sharded weights; set rollout_backend: vllm (or use DDP)"
            )
        return HFBackend(model, tok, bf16=rollout_bf16(cfg, dist.device))
    return open_backend(str(model_path(cfg.model)), name, {"tokenizer": tok, **cfg.rollout_backend_options})


def check_resume(cfg: TrainConfig, ckpt: str) -> None:
    """:func:`envace.config.check_resume` of a training run (fields of RESUMABLE_FIELDS may differ)."""
    check_config_resume(cfg, load_state(ckpt), RESUMABLE_FIELDS, "train", ckpt)


class Reference:
    """The KL reference: log-probs of the initial model ``cfg.model``, whatever checkpoint the policy resumed from.

    Full fine-tuning: a frozen copy of ``cfg.model`` loaded fresh from its files. LoRA: the policy itself with its
    adapters disabled. That is exact -- LoRA never changes the base weights (frozen, outside the optimizer, no
    dropout) and a disabled LoRA layer returns its base layer's output unchanged, and a resumed LoRA policy is
    ``cfg.model`` plus the saved adapter -- and cheap: no second copy of the model in memory."""

    def __init__(self, model: Any, adapters_off: bool = False):
        self.model, self.adapters_off = model, adapters_off

    def logprobs(self, packs: list[Any], rows: list[Row], temps: dict[str, float]) -> dict[int, torch.Tensor]:
        from .update import completion_logprobs

        off = self.model.disable_adapter() if self.adapters_off else contextlib.nullcontext()
        with torch.no_grad(), off:
            return completion_logprobs(self.model, packs, rows, temps)


def frozen_models(cfg: TrainConfig, policy: Any, dist: Dist) -> tuple[Reference | None, Backend | None]:
    """The KL reference (``kl_coef > 0``) and the variant's frozen helper (``variant: simulator``), else None. Both
    are the initial model ``cfg.model`` -- never a copy of ``policy``, which after a resume is partly trained; one
    fresh load of it serves both. ``policy``: the (unwrapped) policy, the LoRA reference."""
    initial = functools.cache(lambda: _load_frozen(cfg.model, dist))
    ref = None
    if cfg.kl_coef > 0:
        ref = Reference(policy, adapters_off=True) if cfg.lora_r > 0 else Reference(initial()[0])
    return ref, (_simulator(cfg, initial, dist) if VARIANTS.get(cfg.variant).frozen_helper else None)


def _load_frozen(name: str, dist: Dist) -> tuple[Any, Any]:
    """A model loaded fresh, in eval mode, without gradients, on this process's device: (model, tokenizer)."""
    model, tok = load_frozen(name)
    return dist.place(model), tok


def _simulator(cfg: TrainConfig, initial: Callable[[], tuple[Any, Any]], dist: Dist) -> Backend:
    """The frozen simulator of the simulator variant: ``cfg.simulator_model`` (a served model's http(s) URL or a
    local model: envace.backends.loaders.frozen_backend), or (None) the initial model (``initial()``: ``cfg.model``
    loaded fresh)."""
    if cfg.simulator_model:
        return _frozen(cfg, cfg.simulator_model, dist)
    return HFBackend(*initial(), bf16=rollout_bf16(cfg, dist.device))


def _frozen(cfg: TrainConfig, name: str, dist: Dist) -> Backend:
    """A helper model that is never trained (envace.backends.loaders.frozen_backend) on this process's device, in
    the rollouts' precision."""
    return frozen_backend(name, device=str(dist.device), bf16=rollout_bf16(cfg, dist.device))


def judge_backend(cfg: TrainConfig, policy: Backend, dist: Dist) -> Backend | None:
    """The judge that ``cfg.judge`` names: ``policy`` (the policy's own rollout engine), else a model opened as
    every helper is (a served model's http(s) URL, or a local model loaded frozen); None without one."""
    if cfg.judge is None:
        return None
    return policy if cfg.judge == "policy" else _frozen(cfg, cfg.judge, dist)


def reward_context(cfg: TrainConfig, policy: Backend, dist: Dist) -> RewardContext:
    """What the rewards get besides task and trajectory: the judge, where ``cfg.judge`` names one. A reward spec
    with ``checklist_judge`` and no judge is a configuration error, raised before any rollout."""
    if cfg.judge is None and "checklist_judge" in reward_names(cfg.reward):
        raise ValueError(
            "reward 'checklist_judge' needs a judge: set judge to policy, a "
            "local model or an http(s)://.../v1 URL (e.g. --set judge=policy)"
        )
    if dist.is_main and (note := unanchored_note(cfg.reward)):
        print(note, file=sys.stderr, flush=True)
    judge = judge_backend(cfg, policy, dist)
    return RewardContext(
        judge=judge,
        judge_params=SamplingParams(temperature=cfg.judge_temperature, max_new_tokens=cfg.judge_max_new_tokens)
        if judge
        else None,
    )


def _check_model_context(model: Any, tok: Any, cfg: TrainConfig) -> None:
    """Contexts longer than the model takes would run past its positions silently: refuse them up front."""
    try:
        n = context_length(model, tok)
    except (ValueError, AttributeError):  # the config names no limit: nothing to check against
        return
    if cfg.rollout.max_context_tokens > n:
        raise ValueError(
            f"rollout.max_context_tokens={cfg.rollout.max_context_tokens} "
            f"exceeds the context length of model {cfg.model!r} ({n} tokens)"
        )


def _check_context(trajs: list[Trajectory], cfg: TrainConfig) -> None:
    """A batch in which no trajectory got a single step because no prompt fits the context is a configuration
    error (training on it would silently do nothing); a few over-long tasks are only counted (truncated/context)."""
    if trajs and all(t.truncated == "context:act" and not t.steps for t in trajs):
        r = cfg.rollout
        raise ValueError(
            "no task of the batch fits the context: the first prompt of each "
            f"({', '.join(sorted({t.task_id for t in trajs}))[:200]}) plus "
            f"rollout.act.max_new_tokens={r.act.max_new_tokens} exceeds "
            f"rollout.max_context_tokens={r.max_context_tokens}; raise "
            "rollout.max_context_tokens (up to the model's context length) or use shorter tasks"
        )


def _grpo_loss(
    rows: list[Row],
    adv: torch.Tensor,
    cfg: TrainConfig,
    ref_model: Reference | None,
    temps: dict[str, float],
    sampler: list[list[float]] | None = None,
    old_in_step: bool = False,
):
    """The loss of one micro-batch: clipped surrogate (+ optional k3 KL to the reference). ``sampler[i]``: the
    sampler's own log-probs of row i where the old ones are the trainer's; each token's surrogate is then weighted
    by the rollout correction (truncated at ``cfg.tis_cap``). None: no correction. ``old_in_step``
    (:func:`old_logprobs_in_the_step`): the old log-probs are this forward's, detached, and are written into the
    rows (for ``mismatch/*``) as a separate pass would have."""
    from .update import pack_rows

    def loss_fn(logp: torch.Tensor, mask: torch.Tensor, idxs: list[int], normalizer: float):
        def padded(lists: list[list[float]]) -> torch.Tensor:  # (n, T) like logp
            return pad_rows([torch.tensor(lists[i], dtype=torch.float32, device=logp.device) for i in idxs])[0]

        if old_in_step:
            for j, i in enumerate(idxs):
                rows[i].old_logprobs = logp[j, : len(rows[i].completion_ids)].detach().float().tolist()
        old = padded([r.old_logprobs for r in rows])  # (n, T)
        w = None if sampler is None else algos.rollout_correction(old, padded(sampler), mask, cfg.tis_cap)[0]
        a = adv[idxs].to(logp.device)  # (n,)
        loss, m = algos.policy_loss(
            logp,
            old,
            a,
            mask,
            clip_eps=cfg.clip_eps,
            clip_eps_high=cfg.clip_eps_high,
            agg=cfg.loss_agg,
            normalizer=normalizer,
            is_weights=w,
        )
        if ref_model is not None and cfg.kl_coef > 0:
            sub = [rows[i] for i in idxs]
            ref_lp = ref_model.logprobs(pack_rows(sub), sub, temps)
            ref, _ = pad_rows([ref_lp[j] for j in range(len(sub))])
            kl = algos.aggregate(algos.kl_k3(logp, ref), mask, cfg.loss_agg, normalizer)
            loss = loss + cfg.kl_coef * kl
            m = m | {"kl": float(kl.detach())}
        return loss, m | {"loss": float(loss.detach()) * normalizer / max(1.0, float(mask.sum()))}

    return loss_fn
