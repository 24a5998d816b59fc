"""The paper's comparison in miniature: one config, every arm, several seeds, one report folder.

For each seed: an SFT warm-up from ``model`` (shared by every arm that needs it), then each arm of
:data:`ARMS` produces its models, and every arm is evaluated the same way:

- **base**: ``model`` untouched; **sft**: the warm-up checkpoint;
- **sft_more**: SFT continued from the warm-up checkpoint for exactly as many optimizer steps as each RL arm
  takes -- ``iterations`` (the trainer makes one optimizer step per iteration: one update epoch per batch; the
  per-role arm steps each of its two models once) -- on gold trajectories of the RL arms' own training-task
  pool (the same ``n_train_tasks`` tasks, the same seed), ``batch_tasks`` tasks per step (an RL step sees
  ``batch_tasks`` tasks too, as ``group_size`` sampled trajectories each; one gold trajectory per task is the
  same token-mean gradient as ``group_size`` identical copies), at the warm-up's learning rate ``sft_lr`` and a
  fresh optimizer. The compute-matched control that uses gold: does RL beat simply more SFT?
- **RL arms** (one per :data:`envace.config.VARIANTS` entry: ``real_env``, ``envace``, ``per_role``,
  ``simulator``, ``caller_frozen``, ``caller_only``): role-wise GRPO from the SFT checkpoint with the *same*
  budget (``iterations`` x ``batch_tasks`` tasks x ``group_size`` trajectories, same reward, same rollout limits).
  Beyond the paper, :data:`OPTION_ARMS` add one training option each to a variant, run beside it and never in place
  of it: ``envace+clip_higher`` (``clip_eps_high``), ``envace+dynamic`` (``dynamic_sampling``), ``envace+obs_loss``
  (``obs_loss_alpha``), ``envace+kl`` (``kl_coef``), ``envace+low_lr`` (``lr``), ``envace+real_share``
  (``real_share``); the plain ``envace`` arm is unchanged.
- **evaluation**: held-out tasks in the real environment, ``eval_samples`` trials each, at N=0 (plain acting)
  for every arm and, for the arms of ``tts_arms``, at every rehearsal budget N > 0 of ``tts_budgets`` in each
  mode of ``tts_modes`` (envace.evaluation.tts; ``plan`` is the compute-matched baseline: its plan budget is the mean
  generated tokens of one rehearsed attempt of the same arm at the same N in the ``parallel`` mode, measured
  just before, so the rehearsal modes run first at each N) -- see envace.evaluation.trials. Every per-task row holds
  its generated tokens (``attempt_tokens``, ``private_tokens``, ``real_tokens``, ``gen_tokens``);
- **rehearsal fidelity**: shadow rollouts of held-out tasks, each rehearsed observation scored against the real
  one (envace.evaluation.fidelity), with the arm's own Rehearse model (the policy; the second model for ``per_role``;
  the frozen simulator that answered in its training for ``simulator``: ``train_options.simulator_model``, else the SFT
  model). With ``fidelity_every`` > 0, every RL arm is also measured on the same
  shadow set (the same tasks, rollout seed and mode) at the start (the SFT model, measured once per seed) and
  after every ``fidelity_every`` iterations: training runs in segments that end there (each resumes the
  previous segment's checkpoint, which the trainer makes exact: same data order, RNG and optimizer state), and
  the curve (``fidelity_curve``: step, summary) ends with the arm's final fidelity;
- **success curve**: with ``success_every`` > 0, every RL arm is also evaluated at N=0 on the evaluation tasks at
  the start (the warm-up, once per seed) and after every ``success_every`` iterations (the same segments), ending
  with its final evaluation (``success_curve``: step, success rate, per-task outcomes), to choose a budget on val.

Everything goes to ``out_dir``: ``results.json`` (each evaluation with its metrics and per-task outcomes; rewritten
after every arm's main evaluation and after each evaluation of its sweep; a rerun with the same config skips the
(arm, seed) pairs already there and adds the sweep evaluations they lack -- ``seeds`` may differ: more seeds are added,
fewer are reported -- and training itself resumes from its checkpoints), the per-arm training folders,
and the report (``report.md``, ``report.html``, PNG figures, ``trajectories.html``; see envace.evaluation.report).

Departures, all at CPU scale: tiny budgets; the per-role and simulator arms rehearse with their *policy* at test
time (envace.evaluation.tts has one model); fidelity is measured on the policy's own rollouts, so arms differ in the
calls they make as well as in the observations they imagine.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..backends.base import SamplingParams
from ..config import (
    SFTConfig,
    TrainConfig,
    VARIANTS,
    config_diff,
    describe_diff,
    from_dict,
    load_config,
    saved_config_dict,
    to_dict,
)
from ..core.atomic import write_json
from ..core.precision import bf16_setting
from ..core.registry import Registry
from ..rollout.engine import RolloutConfig, rehearse_sampling
from ..rollout.memory import RULE_FORMATS
from ..rollout.modes import MODES

PLAN_MATCHES = "parallel"
"""The rehearsal mode whose attempt tokens set the plan baseline's budget at the same N (the claims compare the
two)."""


def _small_rollout() -> RolloutConfig:
    return RolloutConfig(
        max_steps=6,
        max_steps_per_turn=4,
        act=SamplingParams(temperature=1.0, max_new_tokens=96),
        rehearse=rehearse_sampling(96),
    )


EXPERIMENT_SETS = frozenset(
    {
        "model",
        "suite",
        "n_train_tasks",
        "variant",
        "reward",
        "iterations",
        "batch_tasks",
        "lr",
        "rollout",
        "out_dir",
        "save_every",
        "rollout_bf16",
        "keep_checkpoints",
        "seed",
        "tensorboard",
        "progress",
        "resume",
    }
)
"""TrainConfig fields the experiment sets for each RL arm itself (not allowed in ``train_options``)."""

SFT_SETS = frozenset(
    {"model", "suite", "n_tasks", "steps", "batch_tasks", "lr", "out_dir", "seed", "tensorboard", "progress", "resume"}
)
"""SFTConfig fields the experiment sets for the warm-up and sft_more itself (not allowed in ``sft_options``)."""


@dataclass
class ExperimentConfig:
    """The paper's comparison at CPU scale (see the module docstring). Loadable from YAML (``envace experiment
    --config F --set key=value``)."""

    model: str = "SmolLM2-135M-Instruct"
    """Base model of every arm (the embedded default, "tiny-random", a local model folder, or a training checkpoint /
    run folder, LoRA ones merged: envace.backends.models.load)."""
    suite: str = "builtin"
    """Task suite: training tasks from its train split, evaluation tasks from ``eval_split``."""
    arms: tuple[str, ...] = ("base", "sft", "sft_more", "real_env", "envace", "per_role", "simulator", "caller_only")
    """Arms to run (envace.evaluation.experiment.ARMS): base, sft, sft_more, any training variant, and a variant with
    one training option beyond the paper (OPTION_ARMS: envace+clip_higher, envace+dynamic, envace+obs_loss,
    envace+kl, envace+low_lr, envace+real_share)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """One full run of every arm per seed; the report shows mean +- std over seeds."""
    sft_steps: int = 60
    """SFT warm-up optimizer steps (shared start of every RL arm)."""
    sft_tasks: int = 256
    """Gold trajectories for the warm-up."""
    sft_batch_tasks: int = 8
    sft_lr: float = 1e-4
    sft_options: dict = field(default_factory=dict)
    """Further :class:`envace.config.SFTConfig` fields of the warm-up and of sft_more, e.g. ``{bf16: auto}`` (not
    those the experiment sets itself: model, suite, n_tasks, steps, batch_tasks, lr, out_dir, seed, ...)."""
    rehearse_steps: int = 0
    """A second warm-up stage of this many optimizer steps that trains the Rehearse rows only (``SFTConfig.roles =
    [rehearse]``, the same gold trajectories, batch and lr), so that every arm starts from a Rehearse that predicts
    the world better without more SFT on Act (which lowers success: the sft_more arm). Part of the shared start:
    the sft arm, sft_more and every RL arm begin after it. 0: none (the warm-up trains both roles only). Measured
    on shop-world val (docs/results/val-rehearse70): 70 steps at the warm-up's lr 1e-4 broke Act (success 0.85 ->
    0.00): the weights are shared, and Rehearse rows alone pull them away from Act's tool format."""
    notes_steps: int = 0
    """A last warm-up stage that shows the model rehearsal notes (issue 29, item 2): SFT of this many optimizer steps
    from the warm-up (after the Rehearse-only stage, if any) on ``notes_tasks`` gold trajectories twice, once plain and
    once with a memory distilled from ``notes_attempts`` rehearsals of the same task by the warm-up model, in the
    format of ``tts_memory`` (``SFTConfig.memory_attempts``, ``memory_format``), at ``notes_lr``. Part of the shared
    start. ``notes_attempts: 0`` is its control: the same stage, the same steps, without notes. 0: no stage. Chosen on
    shop-world-decide val (docs/results/tts-val): at lr 1e-4 the stage collapsed both models' policy; at 1e-5 the
    notes-trained model made the read its memory names (12/12, every other model 0/12) and lost nothing to rehearsal."""
    notes_tasks: int = 64
    """Training tasks of the notes stage."""
    notes_batch_tasks: int = 4
    """Gold trajectories per step of the notes stage (plain and with notes drawn alike)."""
    notes_lr: float = 1e-5
    """Learning rate of the notes stage."""
    notes_attempts: int = 2
    """Rehearsed attempts distilled into each training row's notes (``SFTConfig.memory_attempts``); 0: the control."""
    iterations: int = 8
    """RL iterations, the same for every RL arm (the equal compute budget)."""
    batch_tasks: int = 4
    """B: tasks per RL iteration."""
    group_size: int = 4
    """K: trajectories per task (GRPO group)."""
    lr: float = 2e-6
    """RL learning rate (all RL arms)."""
    reward: Any = "gold_f1"
    """RL reward spec (envace.rewards.functions); "grounded" would put the real environment in every arm's loop."""
    train_tasks: int | None = None
    """Training tasks to draw batches from (None: max(64, iterations x batch_tasks), as many as a run visits)."""
    train_options: dict = field(default_factory=dict)
    """Further :class:`envace.config.TrainConfig` fields, the same for every RL arm, e.g. ``{update_epochs: 2,
    mini_batches: 2, bf16: auto, kl_coef: 0.001}`` (not those the experiment sets itself: model, suite, variant,
    reward, iterations, batch_tasks, lr, rollout, seed, out_dir, ...)."""
    rollout: RolloutConfig = field(default_factory=_small_rollout)
    """Rollout limits and sampling for training, rehearsal attempts and fidelity rollouts (mode and group size
    are set per use)."""
    eval_split: str = "test"
    eval_tasks: int = 30
    """Held-out tasks per evaluation."""
    ood_split: str | None = None
    """A further held-out split every arm is also evaluated on, at N=0 only, as on ``eval_split`` (the built-in
    suites' ``ood``: customers, names and task templates no other split has); in a run record's ``splits``, with its
    own tables and claims in the report. None: none."""
    ood_tasks: int | None = None
    """Tasks of the ``ood_split`` evaluation (None: ``eval_tasks``)."""
    eval_samples: int = 1
    """Real trials per task (pass^k for k <= eval_samples)."""
    eval_temperature: float = 0.0
    """Act temperature of the real trials (0 = greedy; use > 0 with eval_samples > 1)."""
    tts_budgets: tuple[int, ...] = (0, 1, 2, 3)
    """Rehearsal budgets N (0 = no rehearsal; must be listed: every arm is evaluated at N=0)."""
    tts_modes: tuple[str, ...] = ("parallel", "sequential", "plan")
    """Test-time rehearsal modes for N > 0 (envace.evaluation.tts.REHEARSAL_MODES); ``plan`` is the compute-matched
    baseline (needs ``parallel`` too: its budget is measured there)."""
    tts_arms: tuple[str, ...] = ("base", "sft", "envace")
    """Arms evaluated at the budgets N > 0 (the sweep costs several evaluations per budget and mode); the others
    at N=0 only. Arms not run are ignored."""
    tts_tasks: int | None = None
    """Held-out tasks of the sweep at N > 0: the first ``tts_tasks`` evaluation tasks (None: all). Gains are paired
    over these tasks, against the N=0 outcomes of the same tasks."""
    tts_seeds: tuple[int, ...] | None = None
    """Seeds whose ``tts_arms`` get the sweep (None: every seed)."""
    claim_n: int = 2
    """Budget N of the test-time claims of the report (the paper's best: N=2); the largest evaluated N if absent."""
    generate_bf16: bool | str = False
    """Generate in bf16 in the evaluations, fidelity rollouts and RL rollouts (HFBackend bf16; TrainConfig.rollout_bf16,
    the update stays float32): true, false or ``auto`` (envace.core.precision). ~1.8x faster generation on a CPU with
    AVX-512-BF16 (docs/benchmarks.md); SFT is unchanged."""
    tts_memory: str = "lessons"
    """The rehearsal memory format (envace.evaluation.tts.MEMORY_FORMATS): lessons | calls | agreed | agreed-live |
    agreed-real | model | concat."""
    tts_max_new_tokens: int = 160
    """Token limit of each reflection and memory generation."""
    tts_tasks_in_flight: int | None = None
    """Tasks rehearsed at a time in the sweep (``TTSConfig.tasks_in_flight``; None: all): bounds memory."""
    fidelity_tasks: int = 8
    """Held-out tasks rolled out in shadow mode per arm for rehearsal fidelity (0: skip)."""
    fidelity_samples: int = 2
    """Shadow trajectories per fidelity task."""
    fidelity_every: int = 0
    """Fidelity curve: measure each RL arm on the shadow set (the fidelity tasks) at the start (the SFT model) and
    after every ``fidelity_every`` iterations, the last point being the final fidelity (0: final fidelity only)."""
    success_every: int = 0
    """Success curve: evaluate every RL arm's policy at N=0 on the evaluation tasks (as its final evaluation: greedy
    by default, real environment, the same tasks) at the start (the warm-up, measured once per seed) and after every
    ``success_every`` iterations, the last point being the arm's final evaluation; each point records its per-task
    outcomes, so the report counts the tasks whose outcome left the warm-up's (won / lost). To choose an RL budget on
    ``val`` from one run (0: the final evaluation only). About 80 s per point for 100 shop-world tasks on 2 cores."""
    viewer_trajectories: int = 4
    """Shadow trajectories per arm (first seed) kept for the trajectory viewer."""
    out_dir: str = "runs/experiment"
    resume: bool = True
    """Skip (arm, seed) pairs already in out_dir/results.json written with the same config."""
    progress: bool = True

    def __post_init__(self) -> None:
        from .tts import MEMORY_FORMATS, REHEARSAL_MODES

        self.arms = tuple(self.arms)
        self.tts_arms = tuple(self.tts_arms)
        self.seeds = tuple(int(s) for s in self.seeds)
        if self.tts_seeds is not None:
            self.tts_seeds = tuple(int(s) for s in self.tts_seeds)
        self.generate_bf16 = bf16_setting(self.generate_bf16, "ExperimentConfig.generate_bf16")
        self.tts_budgets = tuple(sorted({int(n) for n in self.tts_budgets}))
        self.tts_modes = tuple(self.tts_modes)
        if isinstance(self.rollout, dict):
            self.rollout = from_dict(RolloutConfig, self.rollout)
        for a in self.arms + self.tts_arms:
            ARMS.get(a)  # raises, listing the valid arms
        for m in self.tts_modes:
            REHEARSAL_MODES.get(m)
        MEMORY_FORMATS.get(self.tts_memory)
        if any(not REHEARSAL_MODES.get(m).imagined for m in self.tts_modes) and PLAN_MATCHES not in self.tts_modes:
            raise ValueError(
                f"tts_modes {list(self.tts_modes)}: a compute-matched baseline "
                f"needs {PLAN_MATCHES!r} too (its token budget is measured there)"
            )
        unknown = set(self.train_options) - (
            TRAIN_OPTIONS := {f.name for f in dataclasses.fields(TrainConfig)} - EXPERIMENT_SETS
        )
        if unknown:
            raise ValueError(
                f"train_options: {', '.join(sorted(unknown))} cannot be "
                f"set there (allowed: {', '.join(sorted(TRAIN_OPTIONS))})"
            )
        unknown = set(self.sft_options) - (SFT_OPTIONS := {f.name for f in dataclasses.fields(SFTConfig)} - SFT_SETS)
        if unknown:
            raise ValueError(
                f"sft_options: {', '.join(sorted(unknown))} cannot be "
                f"set there (allowed: {', '.join(sorted(SFT_OPTIONS))})"
            )
        if len(set(self.arms)) != len(self.arms) or not self.arms:
            raise ValueError(f"arms must be a non-empty list without repeats, got {self.arms}")
        if not self.seeds or not self.tts_budgets or min(self.tts_budgets) < 0 or 0 not in self.tts_budgets:
            raise ValueError(
                "seeds must be non-empty and tts_budgets must hold 0 (every arm's "
                f"main evaluation) and no negative budget, got {list(self.tts_budgets)}"
            )
        if self.ood_split is not None and self.ood_split == self.eval_split:
            raise ValueError(f"ood_split must differ from eval_split, got {self.ood_split!r} for both")
        if self.ood_tasks is not None and self.ood_tasks < 1:
            raise ValueError(f"ood_tasks must be >= 1 (or null), got {self.ood_tasks}")
        if self.eval_tasks < 1 or self.eval_samples < 1 or self.fidelity_tasks < 0 or self.fidelity_samples < 1:
            raise ValueError("eval_tasks, eval_samples, fidelity_samples >= 1 and fidelity_tasks >= 0 are required")
        if self.rehearse_steps < 0:
            raise ValueError(f"rehearse_steps must be >= 0, got {self.rehearse_steps}")
        if self.notes_steps < 0 or self.notes_attempts < 0 or self.notes_tasks < 1 or self.notes_batch_tasks < 1:
            raise ValueError("notes_steps, notes_attempts >= 0 and notes_tasks, notes_batch_tasks >= 1 are required")
        if self.notes_steps and self.notes_attempts and self.tts_memory not in RULE_FORMATS:
            raise ValueError(
                f"notes_steps: the notes are written in the format of tts_memory, {self.tts_memory!r}, which training "
                f"cannot write (it can: {', '.join(RULE_FORMATS)}); set tts_memory to one of those"
            )
        if self.success_every < 0:
            raise ValueError(f"success_every must be >= 0, got {self.success_every}")
        if self.fidelity_every < 0 or (self.tts_tasks is not None and self.tts_tasks < 1) or self.claim_n < 1:
            raise ValueError("fidelity_every >= 0, tts_tasks >= 1 (or null) and claim_n >= 1 are required")


# --------------------------------------------------------------------------------------------------------
# Arms
# --------------------------------------------------------------------------------------------------------


@dataclass
class ArmModels:
    """What an arm produced for one seed: the model folders to evaluate and its training log."""

    policy: str
    """Act model (also Rehearse, unless ``rehearser`` / ``simulator`` is set)."""
    rehearser: str | None = None
    """The second model of the per-role arm (plays Rehearse)."""
    simulator: str | None = None
    """The frozen external simulator of the simulator arm."""
    mode: str = "rehearsal"
    """The rollout mode in which its models rehearse (fidelity; envace.rollout.modes.MODES): rehearsal (the policy),
    per_role (``rehearser``) or simulator (``simulator``): each helper is the field named as its engine keyword."""
    curve: list[dict[str, Any]] = field(default_factory=list)
    """Training metrics, one dict per step (empty for untrained arms)."""
    fidelity_curve: list[dict[str, Any]] | None = None
    """RL arms with ``fidelity_every`` > 0: ``{"step", "summary"}`` on the shadow set at step 0 (the SFT model) and
    every ``fidelity_every`` iterations before the last; run_experiment appends the final fidelity. None: no curve."""
    success_curve: list[dict[str, Any]] | None = None
    """RL arms with ``success_every`` > 0: :func:`success_point` of the warm-up (step 0) and every ``success_every``
    iterations before the last; run_experiment appends the final evaluation. None: no curve."""


def rl_train_tasks(cfg: ExperimentConfig) -> int:
    """The training-task pool of every RL arm and of sft_more: at least as many tasks as a run visits, fixed here so
    that sft_more draws from the very same pool as the RL arms."""
    return cfg.train_tasks or max(64, cfg.iterations * cfg.batch_tasks)


def sft_more_steps(cfg: ExperimentConfig) -> int:
    """Optimizer steps of sft_more: one per RL iteration, as each RL arm (and each model of per_role) takes."""
    return cfg.iterations


def fidelity_steps(cfg: ExperimentConfig) -> list[int]:
    """RL steps after which the fidelity curve measures, before the final one: every ``fidelity_every``."""
    if cfg.fidelity_every <= 0 or cfg.fidelity_tasks <= 0:
        return []
    return list(range(cfg.fidelity_every, cfg.iterations, cfg.fidelity_every))


def success_steps(cfg: ExperimentConfig) -> list[int]:
    """RL steps after which the success curve evaluates, before the final evaluation: every ``success_every``."""
    if cfg.success_every <= 0:
        return []
    return list(range(cfg.success_every, cfg.iterations, cfg.success_every))


def success_point(step: int, evaluation: dict[str, Any]) -> dict[str, Any]:
    """One point of a success curve: the step, the success rate with its interval, and each task's outcomes (for
    paired counts against the warm-up), from an N=0 evaluation (an entry of a record's ``evals``)."""
    m = evaluation["metrics"]
    return {
        "step": step,
        "success_rate": m["success_rate"],
        "ci": [m.get("success_rate/ci_lo"), m.get("success_rate/ci_hi")],
        "per_task": [{"task_id": t["task_id"], "successes": t["successes"]} for t in evaluation["per_task"]],
    }


def stage_metrics(metrics: list[dict[str, Any]], after: int, stage: str) -> list[dict[str, Any]]:
    """A later warm-up stage's metrics as a continuation of the warm-up's curve: steps numbered after ``after``
    and marked ``stage`` (rehearse, notes)."""
    return [m | {"step": int(m.get("step", i + 1)) + after, "stage": stage} for i, m in enumerate(metrics)]


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class SeedRun:
    """One seed's shared state: its folder, the SFT warm-up and the fidelity of the SFT model on the shadow set
    (each made once, on first use, and reused on a rerun)."""

    def __init__(self, cfg: ExperimentConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        self.dir = os.path.join(cfg.out_dir, f"seed{seed}")
        self._sft: tuple[str, list[dict[str, Any]]] | None = None

    def run_sft(self, name: str, scfg: SFTConfig, what: str) -> tuple[str, list[dict[str, Any]]]:
        """(checkpoint folder, metrics) of an SFT run in ``<seed dir>/<name>``, run unless it finished before."""
        from ..training.sft import sft

        done = os.path.join(self.dir, name, "done.json")
        if os.path.exists(done):
            d = _read_json(done)
            return d["checkpoint"], d["metrics"]
        _say(f"seed {self.seed}: {what}")
        res = sft(scfg)
        _write_json(
            done,
            {
                "checkpoint": res.checkpoint,
                "metrics": res.metrics,
                "steps": scfg.steps,
                "batch_tasks": scfg.batch_tasks,
                "n_tasks": scfg.n_tasks,
            },
        )
        return res.checkpoint, res.metrics

    def sft(self) -> tuple[str, list[dict[str, Any]]]:
        """(SFT checkpoint folder, SFT metrics): the warm-up, then its Rehearse-only stage where ``rehearse_steps``
        > 0, then its notes stage where ``notes_steps`` > 0 (metrics of all, each stage's steps numbered after the
        previous ones')."""
        if self._sft is None:
            c = self.cfg
            scfg = SFTConfig(
                model=c.model,
                suite=c.suite,
                n_tasks=c.sft_tasks,
                steps=c.sft_steps,
                batch_tasks=c.sft_batch_tasks,
                lr=c.sft_lr,
                out_dir=os.path.join(self.dir, "sft"),
                seed=self.seed,
                tensorboard=False,
                progress=c.progress,
                **c.sft_options,
            )
            self._sft = self.run_sft(
                "sft", scfg, f"SFT warm-up ({c.sft_steps} steps on {c.sft_tasks} gold trajectories)"
            )
            if c.rehearse_steps > 0:
                rcfg = dataclasses.replace(
                    scfg,
                    model=self._sft[0],
                    steps=c.rehearse_steps,
                    roles=("rehearse",),
                    out_dir=os.path.join(self.dir, "sft_rehearse"),
                )
                ckpt, metrics = self.run_sft(
                    "sft_rehearse", rcfg, f"Rehearse-only warm-up stage ({c.rehearse_steps} steps, Rehearse rows only)"
                )
                self._sft = ckpt, self._sft[1] + stage_metrics(metrics, c.sft_steps, "rehearse")
            if c.notes_steps > 0:
                ncfg = dataclasses.replace(
                    scfg,
                    model=self._sft[0],
                    n_tasks=c.notes_tasks,
                    steps=c.notes_steps,
                    batch_tasks=c.notes_batch_tasks,
                    lr=c.notes_lr,
                    memory_attempts=c.notes_attempts,
                    memory_format=c.tts_memory if c.notes_attempts else scfg.memory_format,
                    out_dir=os.path.join(self.dir, "sft_notes"),
                )
                what = (
                    f"{c.notes_attempts} rehearsals' {c.tts_memory} notes" if c.notes_attempts else "no notes: control"
                )
                ckpt, metrics = self.run_sft("sft_notes", ncfg, f"notes stage ({c.notes_steps} steps, {what})")
                self._sft = ckpt, self._sft[1] + stage_metrics(metrics, c.sft_steps + c.rehearse_steps, "notes")
        return self._sft

    def fidelity_start(self) -> dict[str, Any]:
        """The fidelity curve's first point: the SFT model (rehearsal mode) on the shadow set, once per seed."""
        path = os.path.join(self.dir, "fidelity_start.json")
        if not os.path.exists(path):
            _say(f"seed {self.seed}: rehearsal fidelity of the SFT model (the curves' start)")
            fid = arm_fidelity(self.cfg, ArmModels(policy=self.sft()[0]), self.seed)
            _write_json(path, {"step": 0, "summary": fid.summary})
        return _read_json(path)

    def success_start(self, sft_rec: dict[str, Any] | None = None) -> dict[str, Any]:
        """The success curve's first point: the warm-up evaluated at N=0 on the evaluation tasks, once per seed.
        ``sft_rec``: the sft arm's record of this seed, whose N=0 evaluation is that evaluation of the same model:
        kept instead of made again when the point does not exist yet."""
        path = os.path.join(self.dir, "success_start.json")
        if not os.path.exists(path) and sft_rec is not None:
            _write_json(path, success_point(0, next(e for e in sft_rec["evals"] if e["n"] == 0)))
        elif not os.path.exists(path):
            _say(f"seed {self.seed}: success of the SFT model at N=0 (the success curves' start)")
            policy = arm_backend(self.cfg, self.sft()[0])
            ev = evaluate_budgets(self.cfg, policy, self.seed, [(0, "none")], [], f"seed {self.seed} SFT model")[0]
            _write_json(path, success_point(0, ev))
        return _read_json(path)


@dataclass(frozen=True)
class Arm:
    doc: str
    build: Callable[[SeedRun], ArmModels]


ARMS: Registry[Arm] = Registry("experiment arm")
ARMS.add("base", Arm("the base model, no training", lambda run: ArmModels(policy=run.cfg.model)))
ARMS.add("sft", Arm("SFT warm-up on gold trajectories", lambda run: ArmModels(*run.sft()[:1], curve=run.sft()[1])))


def _sft_more(run: SeedRun) -> ArmModels:
    c = run.cfg
    start, _ = run.sft()
    n = sft_more_steps(c)
    scfg = SFTConfig(
        model=start,
        suite=c.suite,
        n_tasks=rl_train_tasks(c),
        steps=n,
        batch_tasks=c.batch_tasks,
        lr=c.sft_lr,
        out_dir=os.path.join(run.dir, "sft_more"),
        seed=run.seed,
        tensorboard=False,
        progress=c.progress,
        **c.sft_options,
    )
    ckpt, metrics = run.run_sft(
        "sft_more", scfg, f"SFT continued for {n} steps (as many as an RL arm) on gold trajectories of the RL task pool"
    )
    return ArmModels(policy=ckpt, curve=metrics)


ARMS.add(
    "sft_more",
    Arm(
        "SFT continued from the warm-up for as many optimizer steps as each RL arm takes (one per iteration), on gold "
        "trajectories of the RL tasks: the compute-matched control that uses gold",
        _sft_more,
    ),
)


def _rl_arm(
    variant: str, options: dict[str, Any] | None = None, name: str | None = None
) -> Callable[[SeedRun], ArmModels]:
    """The build of an RL arm: ``variant`` trained from the SFT checkpoint into ``<seed dir>/<name>`` (default: the
    variant's name), with ``train_options`` and then the arm's own ``options`` (TrainConfig fields, OPTION_ARMS)."""
    arm = name or variant

    def build(run: SeedRun) -> ArmModels:
        from ..core.checkpoint import load_state
        from ..core.logging import read_metrics
        from ..training.trainer import train

        c = run.cfg
        start, _ = run.sft()
        rc = dataclasses.replace(c.rollout, progress=False)
        out = os.path.join(run.dir, arm)
        fields: dict[str, Any] = dict(
            model=start,
            suite=c.suite,
            n_train_tasks=rl_train_tasks(c),
            variant=variant,
            reward=c.reward,
            iterations=c.iterations,
            batch_tasks=c.batch_tasks,
            lr=c.lr,
            group_size=c.group_size,
            rollout=rc,
            out_dir=out,
            save_every=max(1, c.iterations),
            rollout_bf16=c.generate_bf16,
            keep_checkpoints=1,
            seed=run.seed,
            tensorboard=False,
            progress=c.progress,
        )
        tcfg = TrainConfig(**(fields | c.train_options | (options or {})))  # an option arm may set lr, batch_tasks
        f_steps, s_steps = fidelity_steps(c), success_steps(c)
        cache, s_cache = os.path.join(out, "fidelity_curve.json"), os.path.join(out, "success_curve.json")
        points: dict[str, Any] = _read_json(cache) if os.path.exists(cache) else {}
        s_points: dict[str, Any] = _read_json(s_cache) if os.path.exists(s_cache) else {}
        res = None
        for end in sorted(set(f_steps) | set(s_steps)) + [c.iterations]:  # segments, each resuming the last one's
            res = train(dataclasses.replace(tcfg, iterations=end))  # checkpoint (iterations is resumable)
            todo = [
                what
                for what, steps, have in (("fidelity", f_steps, points), ("success", s_steps, s_points))
                if end in steps and str(end) not in have
            ]
            if end == c.iterations or not todo:
                continue
            if not (res.checkpoint and int(load_state(res.checkpoint)["step"]) == end):
                # a later checkpoint already existed (a rerun after a crash): this point cannot be measured any more
                _say(
                    f"seed {run.seed} arm {arm}: no checkpoint at step {end}; its {' and '.join(todo)} point is missing"
                )
                continue
            at = _arm_models(variant, res.checkpoint, start, tcfg.simulator_model)
            if "fidelity" in todo:
                _say(f"seed {run.seed} arm {arm}: rehearsal fidelity after {end} of {c.iterations} iterations")
                points[str(end)] = arm_fidelity(c, at, run.seed).summary
                _write_json(cache, points)
            if "success" in todo:
                _say(f"seed {run.seed} arm {arm}: success at N=0 after {end} of {c.iterations} iterations")
                label = f"seed {run.seed} arm {arm} at step {end}"
                ev = evaluate_budgets(c, arm_backend(c, at.policy), run.seed, [(0, "none")], [], label)[0]
                s_points[str(end)] = success_point(end, ev)
                _write_json(s_cache, s_points)
        assert res is not None
        models = _arm_models(variant, res.checkpoint, start, tcfg.simulator_model)
        models.curve = read_metrics(out)  # every step, also those of earlier runs of a resumed arm
        if c.fidelity_every > 0 and c.fidelity_tasks > 0:
            models.fidelity_curve = [run.fidelity_start()] + [
                {"step": int(k), "summary": v} for k, v in sorted(points.items(), key=lambda kv: int(kv[0]))
            ]
        if c.success_every > 0:
            models.success_curve = [run.success_start()] + [
                v for _, v in sorted(s_points.items(), key=lambda kv: int(kv[0]))
            ]
        return models

    return build


def _arm_models(variant: str, ckpt: str | None, start: str, simulator_model: str | None = None) -> ArmModels:
    """The models of an RL arm at checkpoint ``ckpt`` (None: untrained, the start): each of the variant's players
    (envace.rollout.variants.Variant.models_at). A frozen simulator is the one that played Rehearse in training:
    the arm's ``simulator_model`` (``train_options``), else the trainer's default, the initial SFT weights."""
    v = VARIANTS.get(variant)
    return ArmModels(mode=v.rehearse_mode, **v.models_at(ckpt, start, simulator_model))


for _v in VARIANTS.names():
    ARMS.add(_v, Arm(VARIANTS.get(_v).doc + " (GRPO from the SFT checkpoint)", _rl_arm(_v)))


@dataclass(frozen=True)
class OptionArm:
    """An RL arm that is a variant plus training options beyond the paper (TrainConfig fields), run beside it."""

    variant: str
    options: dict[str, Any]
    doc: str


OPTION_ARMS: dict[str, OptionArm] = {
    "envace+clip_higher": OptionArm(
        "envace", {"clip_eps_high": 0.28}, "EnvACE with DAPO's clip-higher (clip_eps_high 0.28 beside clip_eps 0.2)"
    ),
    "envace+dynamic": OptionArm(
        "envace",
        {"dynamic_sampling": 3},
        "EnvACE with DAPO's dynamic sampling (groups with equal rewards dropped, refilled in up to 3 extra rounds)",
    ),
    "envace+obs_loss": OptionArm(
        "envace",
        {"obs_loss_alpha": 0.1},
        "EnvACE plus a cross-entropy (weight 0.1) on real observations under the Rehearse prompt (ECHO)",
    ),
    "envace+kl": OptionArm(
        "envace",
        {"kl_coef": 0.04},
        "EnvACE with a KL penalty to the warm-up (k3, coefficient 0.04 as DeepSeekMath's GRPO; the paper uses none)",
    ),
    "envace+low_lr": OptionArm(
        "envace",
        {"lr": 2.5e-6},
        "EnvACE at a quarter of the claims runs' RL learning rate (2.5e-6 instead of 1e-5): smaller steps for a larger "
        "budget",
    ),
    "envace+notes": OptionArm(
        "envace",
        {"notes_attempts": 2},
        "EnvACE whose rollouts of half the training tasks show Act the notes (agreed-live) of 2 rehearsals of a task "
        "by the warm-up, as test-time rehearsal's final run sees them: the reward teaches using notes that err",
    ),
    "envace+real_share": OptionArm(
        "envace",
        {"real_share": 0.25},
        "EnvACE with a quarter of each group rolled out in the real environment (Dyna-style grounding: with K=4, "
        "1 real and 3 rehearsed trajectories per group, one GRPO baseline)",
    ),
}
"""Arms that add one training option to a variant (``<variant>+<option>``); the plain variant's arm stays as it is.
Their option overrides the same field of ``train_options``. Not among the default ``arms``: list them to run them."""

for _name, _o in OPTION_ARMS.items():
    ARMS.add(_name, Arm(_o.doc + " (GRPO from the SFT checkpoint)", _rl_arm(_o.variant, _o.options, _name)))


# --------------------------------------------------------------------------------------------------------
# Evaluation of one arm
# --------------------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"[experiment] {msg}", flush=True)


def sweeps(cfg: ExperimentConfig, arm: str, seed: int) -> bool:
    """Whether (arm, seed) gets the test-time sweep at N > 0."""
    return arm in cfg.tts_arms and (cfg.tts_seeds is None or seed in cfg.tts_seeds)


def budgets(cfg: ExperimentConfig, arm: str | None = None, seed: int | None = None) -> list[tuple[int, str]]:
    """The (N, mode) pairs evaluated: N=0 once (mode "none"), every N > 0 in every mode -- for ``arm`` and ``seed``
    only when they get the sweep (:func:`sweeps`; None: the full list). At each N the modes that rehearse come
    first: the compute-matched baseline's token budget is measured on them."""
    from .tts import REHEARSAL_MODES

    full = arm is None or seed is None or sweeps(cfg, arm, seed)
    modes = sorted(cfg.tts_modes, key=lambda m: not REHEARSAL_MODES.get(m).imagined)  # stable: rehearsal modes first
    out: list[tuple[int, str]] = []
    for n in cfg.tts_budgets:
        out += [(0, "none")] if n == 0 else ([(n, m) for m in modes] if full else [])
    return out


def plan_budget(evals: list[dict[str, Any]], n: int, fallback: int) -> tuple[int, str]:
    """(max new tokens of one plan, where it came from): the mean generated tokens (Act + Rehearse) of one rehearsed
    attempt in this arm's :data:`PLAN_MATCHES` evaluation at budget ``n``, rounded; ``fallback`` without one."""
    for e in evals:
        if e["n"] == n and e["mode"] == PLAN_MATCHES and e["metrics"].get("tts/attempt_tokens_per_attempt", 0) > 0:
            return max(1, round(e["metrics"]["tts/attempt_tokens_per_attempt"])), f"{PLAN_MATCHES} N={n}"
    return fallback, "fallback (tts_max_new_tokens)"


def arm_backend(cfg: ExperimentConfig, model: str) -> Any:
    """A backend generating with ``model`` (a folder an arm saved, or a name) at the experiment's precision; an
    http(s) URL (a served ``simulator_model``) is that server, as in training
    (envace.backends.loaders.frozen_backend)."""
    from ..backends.loaders import frozen_backend

    return frozen_backend(model, bf16=cfg.generate_bf16)


def arm_fidelity(cfg: ExperimentConfig, models: ArmModels, seed: int, policy: Any = None) -> Any:
    """Rehearsal fidelity (envace.evaluation.fidelity.FidelityResult) of an arm's models on the fixed shadow set: the
    first ``fidelity_tasks`` held-out tasks, the same rollout seed for every arm and checkpoint; Rehearse is the
    policy, the per-role arm's second model, or the simulator arm's frozen simulator."""
    from ..envs import load_tasks
    from .fidelity import measure_fidelity

    ftasks = load_tasks(cfg.suite, cfg.eval_split, n=cfg.fidelity_tasks, seed=0)
    extra = MODES.get(models.mode).helpers(lambda helper, role: arm_backend(cfg, getattr(models, helper)))
    fcfg = dataclasses.replace(cfg.rollout, progress=cfg.progress)
    return measure_fidelity(
        policy or arm_backend(cfg, models.policy),
        ftasks,
        fcfg,
        **extra,
        mode=models.mode,
        group_size=cfg.fidelity_samples,
        seed=seed,
    )


def evaluate_arm(
    cfg: ExperimentConfig,
    models: ArmModels,
    seed: int,
    label: str = "",
    arm: str | None = None,
    policy: Any = None,
) -> dict[str, Any]:
    """The arm's main evaluation, JSON-able: in the real environment at N=0, on the ``ood_split`` too, then rehearsal
    fidelity. The sweep at N > 0 is added to the written record afterwards (:func:`add_budgets`, saved after each
    evaluation), so that a run cut short during a long sweep keeps the evaluations it finished. ``policy``: the
    backend of ``models.policy`` if the caller holds one (loaded here otherwise)."""
    if policy is None:
        policy = arm_backend(cfg, models.policy)
    evals = evaluate_budgets(cfg, policy, seed, [(0, "none")], [], label, arm=arm or "policy")
    out: dict[str, Any] = {"evals": evals, "fidelity": None, "examples": []}
    if cfg.ood_split:
        out["splits"] = {cfg.ood_split: evaluate_split(cfg, policy, seed, label)}
    if cfg.fidelity_tasks > 0:
        _say(f"{label}: rehearsal fidelity on {cfg.fidelity_tasks} tasks x {cfg.fidelity_samples} (shadow mode)")
        fid = arm_fidelity(cfg, models, seed, policy)
        out["fidelity"] = fid.summary
        keep = [
            t for t in fid.trajectories if any(s in ("rehearsed", "simulator") for st in t.steps for s in st.sources)
        ]
        out["examples"] = [t.to_dict(with_rows=False) for t in (keep or fid.trajectories)[: cfg.viewer_trajectories]]
    return out


def ood_n_tasks(cfg: ExperimentConfig) -> int:
    return cfg.ood_tasks or cfg.eval_tasks


def evaluate_split(cfg: ExperimentConfig, policy: Any, seed: int, label: str = "") -> list[dict[str, Any]]:
    """The evaluations of ``policy`` on ``cfg.ood_split``: N=0 on its first :func:`ood_n_tasks` tasks."""
    assert cfg.ood_split
    return evaluate_budgets(cfg, policy, seed, [(0, "none")], [], label, split=cfg.ood_split)


def missing_split(cfg: ExperimentConfig, rec: dict[str, Any]) -> bool:
    """Whether a finished (arm, seed) record lacks the ``ood_split`` evaluation this config asks for (absent, or
    made on another number of tasks): a rerun adds it, the arm's models being on disk."""
    if not cfg.ood_split:
        return False
    evals = rec.get("splits", {}).get(cfg.ood_split)
    return not evals or len(evals[0].get("per_task", [])) != ood_n_tasks(cfg)


def missing_budgets(cfg: ExperimentConfig, arm: str, seed: int, rec: dict[str, Any]) -> list[tuple[int, str]]:
    """The (N, mode) pairs :func:`budgets` asks of a finished (arm, seed) that its record has not evaluated: a
    rerun with more ``tts_seeds`` / ``tts_arms`` adds the sweep to arms trained before (their models are on disk)."""
    have = {(e["n"], e["mode"]) for e in rec.get("evals", [])}
    return [b for b in budgets(cfg, arm, seed) if b not in have]


def add_budgets(
    cfg: ExperimentConfig,
    rec: dict[str, Any],
    seed: int,
    todo: list[tuple[int, str]],
    label: str = "",
    save: Callable[[], None] | None = None,
    arm: str = "policy",
    policy: Any = None,
) -> None:
    """Evaluate the finished arm of ``rec`` at the budgets ``todo`` (in place: its record's ``evals`` extended),
    calling ``save`` after each one, so a sweep cut short keeps the evaluations it finished. ``policy``: the backend
    of the recorded policy if the caller holds one (loaded here otherwise)."""

    def keep(evals: list[dict[str, Any]]) -> None:
        rec["evals"] = evals
        if save is not None:
            save()

    if policy is None:
        policy = arm_backend(cfg, recorded_model(cfg, rec["models"]["policy"]))
    keep(evaluate_budgets(cfg, policy, seed, todo, rec["evals"], label, keep, arm=arm))


RUN_FOLDER = re.compile(r"(?:^|[/\\])(seed\d+[/\\].+)$")
"""A model path under an experiment's out_dir: the part from its ``seed<N>/`` folder on (group 1)."""


def recorded_model(cfg: ExperimentConfig, path: str) -> str:
    """A model path that results.json records, found again under ``cfg.out_dir``: a record holds the path as the
    run saw it (relative to its working directory, under its out_dir), so a rerun from another directory, or of a
    moved out_dir, finds ``<out_dir>/seed<N>/...`` instead. A name, a URL or a path that exists is kept."""
    if os.path.exists(path):
        return path
    m = RUN_FOLDER.search(path)
    if m and os.path.exists(moved := os.path.join(cfg.out_dir, m.group(1))):
        return moved
    return path


def model_gone(path: str) -> bool:
    """Whether a model path that results.json records (:func:`recorded_model`) was a run's folder that no longer
    exists (deleted, or the out_dir copied without its seed folders): a model name is never gone."""
    return not os.path.exists(path) and RUN_FOLDER.search(path) is not None


def evaluate_budgets(
    cfg: ExperimentConfig,
    policy: Any,
    seed: int,
    todo: list[tuple[int, str]],
    evals: list[dict[str, Any]],
    label: str = "",
    on_eval: Callable[[list[dict[str, Any]]], None] | None = None,
    arm: str = "policy",
    split: str | None = None,
) -> list[dict[str, Any]]:
    """``evals`` extended by the real-environment evaluation of ``policy`` at each (N, mode) of ``todo``, in order
    (the compute-matched plan budget is read from the rehearsal evaluation of the same N, in ``evals`` or done
    before it in ``todo``); ``on_eval`` gets the list so far after each one. At N > 0 the rehearsal records (what
    the model was told: attempts, reflections, memory, the real run; no token ids) go to
    ``<out_dir>/tts_records/seed<seed>/<arm>-N<n>-<mode>.jsonl``, named in the evaluation's ``records``. ``split``:
    the tasks of that split (``cfg.ood_split``, :func:`ood_n_tasks` of them) instead of ``eval_split``'s."""
    from .budget import evaluate_at_budget
    from ..envs import load_tasks
    from .policy import add_token_counts
    from .tts import REHEARSAL_MODES, TTSConfig, save_records

    evals = list(evals)
    n_tasks = cfg.eval_tasks if split is None else ood_n_tasks(cfg)
    tasks = load_tasks(cfg.suite, split or cfg.eval_split, n=n_tasks, seed=0)  # the same held-out tasks for every seed
    tts_tasks = tasks[: cfg.tts_tasks] if cfg.tts_tasks else tasks
    rc = dataclasses.replace(
        cfg.rollout, act=cfg.rollout.act.with_(temperature=cfg.eval_temperature), progress=cfg.progress
    )
    tts = TTSConfig(
        memory=cfg.tts_memory,
        reflect_sampling=SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=cfg.tts_max_new_tokens),
        memory_sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.tts_max_new_tokens),
        final_act=rc.act,
        tasks_in_flight=cfg.tts_tasks_in_flight,
    )
    attempts_rc = dataclasses.replace(rc, act=cfg.rollout.act)  # rehearsal attempts sample at the training temperature
    for n, mode in todo:
        ts = tasks if n == 0 else tts_tasks
        extra: dict[str, Any] = {}
        if (
            n > 0 and not REHEARSAL_MODES.get(mode).imagined
        ):  # the compute-matched baseline: as many tokens per plan as per attempt
            extra["plan_max_new_tokens"], extra["plan_budget_from"] = plan_budget(evals, n, cfg.tts_max_new_tokens)
        _say(
            f"{label}: evaluating at N={n}"
            + (f" ({mode})" if n else "")
            + f" on {len(ts)} {split or cfg.eval_split} tasks x {cfg.eval_samples}"
            + (f", {extra['plan_max_new_tokens']} tokens per plan" if extra else "")
        )
        at_n = dataclasses.replace(tts, plan_max_new_tokens=extra["plan_max_new_tokens"]) if extra else tts
        res = evaluate_at_budget(
            policy,
            ts,
            samples=cfg.eval_samples,
            rollout=rc if n == 0 else attempts_rc,
            n=n,
            mode=mode,
            tts=at_n,
            seed=seed,
        )
        policy.release_all()
        if n == 0:
            add_token_counts(res.per_task, res.trajectories)  # (N > 0: evaluate counted them, rehearsal included)
        if res.records:
            extra["records"] = os.path.join(cfg.out_dir, "tts_records", f"seed{seed}", f"{arm}-N{n}-{mode}.jsonl")
            save_records(extra["records"], res.records, with_rows=False)
        evals.append(
            {"n": n, "mode": mode, "metrics": res.metrics, "per_task": res.per_task, **extra}
        )  # per-task outcomes: paired comparisons
        if on_eval is not None:
            on_eval(list(evals))
    return evals


# --------------------------------------------------------------------------------------------------------
# The whole experiment
# --------------------------------------------------------------------------------------------------------


@dataclass
class ExperimentResult:
    out_dir: str
    results: dict[str, Any]
    """The content of results.json: config, and runs[arm][seed] = {curve, evals, fidelity, examples, ...}."""
    report: dict[str, str] = field(default_factory=dict)
    """Report file kind -> path (see envace.evaluation.report.write_report)."""


def _write_json(path: str, obj: Any) -> None:
    write_json(path, obj, default=str)


RESUMABLE = (
    "progress",
    "resume",
    "out_dir",
    "seeds",
    "arms",
    "tts_tasks_in_flight",
    "tts_seeds",
    "tts_arms",
    "tts_budgets",
    "tts_modes",
    "ood_split",
    "ood_tasks",
    "success_every",
)
"""Fields that do not change what any one (arm, seed) result measures: seeds and arms may be added (or reported as a
subset) by a rerun in the same out_dir (an added arm starts from the seed's warm-up on disk), the sweep may rehearse
fewer tasks at a time (memory; only the attempts' sampling stream differs), and more seeds / arms / budgets / modes
may get the sweep (a finished arm gets the (N, mode) pairs it lacks: :func:`missing_budgets`; evaluations already
made are kept, never redone; what one evaluation measures -- ``tts_tasks``, ``tts_memory``, ``tts_max_new_tokens``
-- may not change), and a finished arm gets the ``ood_split`` evaluation it lacks (:func:`missing_split`). A
``success_every`` curve is measured for the arms trained in the run that asks for it (a finished arm keeps none:
its intermediate checkpoints are gone)."""


def release_memory() -> None:
    """Between an arm's training and its evaluation, and between arms: collect reference cycles, then hand the C
    heap's free pages back to the OS (glibc's ``malloc_trim``; nothing elsewhere). One process runs every arm, and
    RSS only falls when memory is returned: an arm's smaller tensors (below glibc's mmap threshold, 32 MB at most)
    are freed into the heap, which keeps their pages (~55 MB per arm with the tiny model), and a model load's
    tokenizer and the chat format cached on it refer to each other, so they wait for a full collection (~9 MB per
    load). Measured on shop-world-decide (2 cores, 24 GiB): the process held 10-11 GB through an RL arm's training
    and was killed at 13.8-15.5 GB as the evaluation's vLLM engine started beside another job, hence the release
    before each evaluation too."""
    gc.collect()
    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except (OSError, TypeError):  # no C library to ask (TypeError: Windows takes no None)
        return
    if trim is not None:
        trim(0)


def complete_arm(
    cfg: ExperimentConfig, rec: dict[str, Any], arm: str, seed: int, label: str, save: Callable[[], None]
) -> bool:
    """Add to the finished record ``rec`` of (``arm``, ``seed``) the sweep evaluations and the ``ood_split``
    evaluation the config asks for and it lacks (:func:`missing_budgets`, :func:`missing_split`), on one engine;
    whether there was any."""
    todo, add_split = missing_budgets(cfg, arm, seed, rec), missing_split(cfg, rec)
    if not todo and not add_split:
        _say(f"{label}: done before, skipped")
        return False
    model = recorded_model(cfg, rec["models"]["policy"])
    if model_gone(model):
        what = " and ".join(
            ([f"{len(todo)} evaluations of the sweep"] if todo else [])
            + ([f"its evaluation on the {cfg.ood_split} split"] if add_split else [])
        )
        _say(
            f"{label}: done before, but its model {model} is gone: cannot add {what} (to get them, delete the "
            f"arm's seed {seed} record from results.json and rerun: it trains again); going on without"
        )
        return False
    t_add = time.perf_counter()
    policy = arm_backend(cfg, model)  # one engine for both
    if todo:
        _say(f"{label}: done before; adding {len(todo)} evaluations of the sweep")
        add_budgets(cfg, rec, seed, todo, label, save=save, arm=arm, policy=policy)
    if add_split:
        _say(f"{label}: done before; adding its evaluation on the {cfg.ood_split} split")
        rec.setdefault("splits", {})[cfg.ood_split] = evaluate_split(cfg, policy, seed, label)
    del policy  # not held through the next arm
    rec["eval_s"] = rec.get("eval_s", 0.0) + time.perf_counter() - t_add
    return True


def run_arm(
    cfg: ExperimentConfig,
    run: SeedRun,
    arm: str,
    label: str,
    results: dict[str, Any],
    save: Callable[[], None],
    elapsed: Callable[[], float],
) -> None:
    """Train ``arm`` for ``run``'s seed (:data:`ARMS`), evaluate it (N=0, the ``ood`` split, fidelity) and put its
    record (models, curves, evaluations, times) into ``results``; then its sweep on the same engine, each evaluation
    saved (``save``) as it finishes. ``elapsed``: the experiment's time so far, all runs into its out_dir together."""
    from .trials import rate_with_ci

    _say(f"{label}: {ARMS.get(arm).doc}")
    t_arm = time.perf_counter()
    models = ARMS.get(arm).build(run)
    t_train = time.perf_counter() - t_arm
    release_memory()  # the trainer's freed heap back to the OS before the evaluation engine starts
    policy = arm_backend(cfg, models.policy)  # one engine for the evaluation and the sweep after it
    rec = evaluate_arm(cfg, models, run.seed, label, arm=arm, policy=policy)
    rec |= {
        "models": {"policy": models.policy, "rehearser": models.rehearser, "simulator": models.simulator},
        "curve": models.curve,
        "train_s": t_train,
        "eval_s": time.perf_counter() - t_arm - t_train,
    }
    if models.fidelity_curve is not None:  # the start, every fidelity_every iterations, and the final fidelity
        rec["fidelity_curve"] = models.fidelity_curve + (
            [{"step": cfg.iterations, "summary": rec["fidelity"]}] if rec["fidelity"] else []
        )
    if models.success_curve is not None:  # the warm-up, every success_every iterations, the final evaluation
        final = next(e for e in rec["evals"] if e["n"] == 0)
        rec["success_curve"] = models.success_curve + [success_point(cfg.iterations, final)]
    results["runs"].setdefault(arm, {})[str(run.seed)] = rec
    if arm == "sft" and cfg.success_every > 0:
        run.success_start(rec)  # the success curves' start is this very evaluation
    results["elapsed_s"] = elapsed()
    save()  # the arm's N=0 evaluation is kept whatever happens to its sweep
    release_memory()
    if todo := missing_budgets(cfg, arm, run.seed, rec):  # the sweep, each evaluation saved as it finishes
        t_sweep = time.perf_counter()
        add_budgets(cfg, rec, run.seed, todo, label, save=save, arm=arm, policy=policy)
        rec["eval_s"] += time.perf_counter() - t_sweep
    del policy  # not held through the next arm's training
    head = next(e for e in rec["evals"] if e["n"] == 0)["metrics"]
    _say(f"{label}: success {rate_with_ci(head)}, tool F1 {head['tool_f1']:.3f} ({time.perf_counter() - t_arm:.0f}s)")


def run_experiment(cfg: ExperimentConfig) -> ExperimentResult:
    """Run every arm for every seed, evaluate, and write results.json and the report into ``cfg.out_dir``."""
    from .report import write_report

    os.makedirs(cfg.out_dir, exist_ok=True)
    path = os.path.join(cfg.out_dir, "results.json")
    conf = to_dict(cfg)
    results: dict[str, Any] = {
        "config": conf,
        "arms": list(cfg.arms),
        "docs": {a: ARMS.get(a).doc for a in cfg.arms},
        "runs": {},
    }
    if not cfg.resume:
        _say(f"resume=false: starting over in {cfg.out_dir}")
        for seed in cfg.seeds:
            shutil.rmtree(os.path.join(cfg.out_dir, f"seed{seed}"), ignore_errors=True)
    elif os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        saved = saved_config_dict(ExperimentConfig, old.get("config"))
        if diff := config_diff(saved, conf, ignore=RESUMABLE):
            raise ValueError(
                f"{cfg.out_dir} holds an experiment with another config ({describe_diff(diff)}); "
                "choose another out_dir, or set resume=false to start over there"
            )
        results["runs"] = old.get("runs", {})
        if "elapsed_s" in old:  # the time of the runs before this one; this run's is added to it
            results["elapsed_s"] = old["elapsed_s"]
    t0, before = time.perf_counter(), results.get("elapsed_s", 0.0)
    save = functools.partial(_write_json, path, results)  # after each evaluation of a sweep

    def elapsed() -> float:  # this run's time and the runs' before it
        return before + time.perf_counter() - t0

    total = len(cfg.seeds) * len(cfg.arms)
    done = 0
    for seed in cfg.seeds:
        run = SeedRun(cfg, seed)
        if cfg.success_every > 0 and (sft_rec := results["runs"].get("sft", {}).get(str(seed))):
            run.success_start(sft_rec)
        for arm in cfg.arms:
            done += 1
            label = f"[{done}/{total}] seed {seed} arm {arm}"
            if str(seed) in results["runs"].get(arm, {}):
                if not complete_arm(cfg, results["runs"][arm][str(seed)], arm, seed, label, save):
                    continue  # nothing to add
            else:
                run_arm(cfg, run, arm, label, results, save, elapsed)
            results["elapsed_s"] = elapsed()
            save()
            release_memory()
    _write_json(path, results)  # every seed ever run here; the report shows the config's seeds
    shown = {
        **results,
        "runs": {arm: {s: r for s, r in runs.items() if int(s) in cfg.seeds} for arm, runs in results["runs"].items()},
    }
    _say(f"writing the report (seeds {', '.join(map(str, cfg.seeds))})")
    files = write_report(shown, cfg.out_dir)
    _say(f"done in {time.perf_counter() - t0:.0f}s; report: {files['html']}")
    return ExperimentResult(cfg.out_dir, results, files)


def load_experiment_config(path: str | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    return load_config(ExperimentConfig, path, overrides)


__all__ = [
    "ExperimentConfig",
    "ArmModels",
    "Arm",
    "ARMS",
    "OPTION_ARMS",
    "OptionArm",
    "SeedRun",
    "budgets",
    "sweeps",
    "plan_budget",
    "rl_train_tasks",
    "sft_more_steps",
    "fidelity_steps",
    "success_steps",
    "success_point",
    "arm_backend",
    "arm_fidelity",
    "evaluate_arm",
    "evaluate_budgets",
    "missing_budgets",
    "missing_split",
    "evaluate_split",
    "ood_n_tasks",
    "add_budgets",
    "ExperimentResult",
    "complete_arm",
    "run_arm",
    "run_experiment",
    "release_memory",
    "load_experiment_config",
    "PLAN_MATCHES",
]
