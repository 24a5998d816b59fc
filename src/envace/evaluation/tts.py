"""Test-time scaling by private rehearsal (METHOD.md section 3).

Before it touches the real environment, the policy rehearses the task N times in its own head, reflects on
each attempt, distills what it learnt into a bounded rehearsal memory m_x, and then, with m_x in its context,
runs the task **once** for real:

1. **Attempts** are rehearsal-mode rollouts (:class:`envace.rollout.engine.RolloutEngine`, mode ``rehearsal``): the
   policy's Rehearse role imagines every tool result. ``parallel``: the N attempts of all tasks are one
   rollout batch (group_size=N). ``sequential``: N batches of one attempt per task; attempt n's Act system
   prompt carries notes on attempts 1..n-1 (their lessons, or in the older formats their transcripts and
   reflections: step 3).
2. **Reflection** (role ``reflect``): after each attempt, one generation in its own chat (:data:`REFLECT_SYSTEM`;
   the task + the attempt transcript) says what worked, what failed, what to change.
3. **Memory**, in the memory format ``TTSConfig.memory`` (:data:`MEMORY_FORMATS`): ``lessons`` (the default)
   distills the attempts by rule (:func:`envace.rollout.memory.distill`): the calls made, each written in Act's
   own tool format with the value its rehearsed observation returned, the calls that erred, the reflections cut
   to a line; no dialogue is pasted, because the 135M model copied the ``name({json})`` calls of pasted
   transcripts and stopped calling tools (issue 29); ``calls`` is the lessons without reflections, ``agreed`` only
   the calls every attempt made (two attempts that ordered different things became two real orders),
   ``agreed-live`` the same with each read (a tool whose ToolSpec is ``read_only``) listed without its imagined
   result, to be made in the real run (the final Act took a quoted read's imagined order ids as done), and
   ``agreed-real`` the same with each call whose argument came from an imagined result said in words, without
   the invented value (the final Act copied an invented order id after the real read listed others). ``model``
   distills all attempts and reflections in one Memory-role generation (:data:`MEMORY_SYSTEM`); ``concat``
   concatenates the reflections (an equal share of the budget each). An empty model memory falls back to
   ``concat`` and is counted. m_x is capped at ``memory_max_tokens`` tokens. The format also says what a sequential
   attempt sees of the earlier ones: their lessons (the rule-based formats) or their
   transcripts and reflections (``model``, ``concat``: as before).
4. **The real execution**: :class:`Rehearsing`, the policy that :func:`envace.evaluation.trials.evaluate` runs
   at N > 0, acts as :class:`envace.evaluation.policy.Plain` does (real mode, memory={task.id: m_x}): each task
   once against its real environment, scored. Its records, ``tts/...`` metrics and private tokens come back with
   those trials; this module never calls ``evaluate`` (``envace.evaluation.budget`` does, above both).

**The compute-matched baseline** (mode ``plan``): the same pipeline without rehearsed observations. Step 1 is
replaced by N independent *plans* (role ``plan``): one generation each, in its own chat (:data:`PLAN_SYSTEM`; the
task, its tool schemas), listing the tool calls the model would make and what could go wrong -- no tool is
called and no tool result is imagined. Each plan gets a reflection, the same memory builder distills them, and
the real run is the same. Its cost is matched in generated tokens: a plan may use up to
``plan_max_new_tokens``, which envace.evaluation.experiment sets to the mean tokens (Act + Rehearse) one rehearsed
attempt of the same model generated at the same N; every record counts its tokens per role (``tokens/plan``,
``tokens/act``, ``tokens/rehearse``, ``tokens/reflect``, ``tokens/memory``) and the metrics report the mean
per task (``tts/attempt_tokens_per_task``, ``tts/rehearsal_tokens_per_task``), so whether the two paths were
matched is measured, not assumed. A gain of rehearsal over ``plan`` is then a gain of the imagined
observations, not of extra tokens.

**The firewall.** :func:`rehearse` (steps 1-3) receives only the policy, the tasks and the config; it builds
rehearsal-mode engines only (checked: the observer needs no environment, shadow is off; plans use no engine at
all, only ``policy.generate``) and this module never imports an environment factory. The real environment first
exists inside ``Plain.act``, after every attempt. (A task that needs episodes played before it can run at all,
BFCL's memory questions with ``writer=model``, is prepared by ``evaluate`` before the policy acts
(:func:`envace.evaluation.trials.prepare`), so before any attempt: those episodes are the task's setup, played in
their own real environments, and the attempts, like the real run, start from what they left.)

**Where things go in prompts.** The notes on earlier attempts (sequential) and m_x reach Act through the
"Notes from private rehearsal" block of its system prompt (:func:`envace.chat.prompts.act_system`), so N=0 (no
memory) is exactly plain acting. Reflect and Memory run in their own chats, like Rehearse, and see transcripts:
:func:`envace.chat.prompts.serialize_messages` of the attempt's Act chat, marked as imagined (with ``lessons``,
Act never does). :func:`save_records` writes the records as JSON lines, without token ids on request, so a
reader sees what the model was told.

**Caps.** Every variable part is capped in tokens (an attempt transcript, the sequential notes block, a whole
Reflect / Memory prompt, m_x); each cut is recorded in :attr:`RehearsalRecord.cuts` with the text removed.

Choices the paper leaves open: with ``samples`` K > 1, :class:`Rehearsing` rehearses once per task and
runs the K real trials with the same m_x (so pass^k measures the memory's reliability, not K rehearsals).
Attempts use seeds derived from ``TTSConfig.seed`` but distinct from the final run's, which uses that seed
itself (so the final run of N=0 is token for token the plain run with that seed).
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable

from ..backends.base import Backend, SamplingParams
from .policy import Acted, Plain, add_token_counts, real_tokens  # the last two: one-version aliases (issue 30)
from ..chat.prompts import ChatFormat, render_tools, serialize_messages
from ..core.registry import Registry
from ..chat.parsing import tool_format_for
from ..rollout.engine import RolloutConfig, RolloutEngine, format_trajectory
from ..rollout.memory import LESSONS_HEADER, RULE_FORMATS, cap_tokens, distill
from ..core.seeding import derive_seed
from ..core.types import JSONable, Row, Task, Trajectory, read_jsonl

REFLECT_SYSTEM = (
    "You review a private rehearsal of a tool-use task. The tool results in it were imagined by a simulator, "
    "not returned by the real tools, and nothing was executed. In a few short lines say: what worked, what "
    "went wrong, and what to change next time (which tools to call, in which order, with which arguments)."
)

MEMORY_SYSTEM = (
    "You distill private rehearsals of a tool-use task into a short memory for an agent that will now do the "
    "task for real, once. Write compact notes: the path that worked (tool calls in order, with arguments), "
    "pitfalls to avoid, and what must be checked because the rehearsed tool results were imagined. "
    "Do not address the user."
)

PLAN_SYSTEM = (
    "You plan a tool-use task before doing it for real. No tool will be called now and you will see no tool "
    "results. Write a short numbered plan: the tool calls you would make, in order, with their arguments, and "
    "for each what could go wrong and what you would then do. Do not invent tool results."
)

PLAN_REFLECT_SYSTEM = (
    "You check a plan for a tool-use task. Nothing was executed and no tool result is known. In a few short "
    "lines say: what in the plan is right, what is missing or wrong, and what to change (which tools to call, "
    "in which order, with which arguments)."
)

PLAN_MEMORY_SYSTEM = (
    "You distill private plans for a tool-use task into a short memory for an agent that will now do the task "
    "for real, once. Write compact notes: the path to follow (tool calls in order, with arguments), pitfalls to "
    "avoid, and what must be checked because no tool result is known yet. Do not address the user."
)

ATTEMPT_PRIME = 7919
"""Attempt batch ``a`` of a run seeded ``s`` rolls out with seed ``derive_seed(s + 1, a, prime=ATTEMPT_PRIME)``:
never ``s`` itself, which the final real run keeps (envace.core.seeding)."""
PRIVATE_SALT = 500_009
"""Plans, reflections and memories: generate call ``n`` samples with ``derive_seed(s, PRIVATE_SALT + n)``, apart
from the rollout's own calls (``derive_seed(s, n)``)."""

NOTES_HEADER = (
    "You already rehearsed this task privately (the tool results were imagined; nothing was executed). "
    "Your earlier attempts and your reflections on them:"
)
CONCAT_HEADER = "Lessons from private rehearsals (tool results were imagined):"
PLAN_CONCAT_HEADER = "Lessons from private plans (no tool was called):"


# --------------------------------------------------------------------------------------------------------
# Config and record
# --------------------------------------------------------------------------------------------------------


@dataclass
class TTSConfig:
    """Test-time scaling by private rehearsal (METHOD.md section 3)."""

    n: int = 2
    """N: rehearsed attempts per task before the one real run. 0 = plain acting (no rehearsal, no memory).
    The paper reports an inverted U over N=1..3: N=2 is best, N=3 dips as the context grows."""
    mode: str = "parallel"
    """parallel: N independent attempts | sequential: attempt n sees attempts < n and their reflections
    (paper, tau2 + BFCL: parallel +4.2, sequential +2.4 over the trained policy) | plan: the compute-matched
    baseline, N plans without any tool result (module docstring); see REHEARSAL_MODES."""
    memory: str = "lessons"
    """The memory format (MEMORY_FORMATS): what m_x and a sequential attempt's notes are. lessons (rule-based,
    envace.rollout.memory.distill: the calls made, written in Act's tool format, their rehearsed values, the
    errors, the reflections cut to a line; never a transcript) | calls (lessons without reflections) | agreed (the
    calls every attempt made) | agreed-live (agreed; reads without their imagined results) | agreed-real
    (agreed-live; values taken from imagined results said in words, not quoted) | model (a Memory-role generation)
    | concat."""
    memory_max_tokens: int = 256
    """Token cap of m_x as Act sees it; what is cut is recorded. Longer memory = longer real-run context."""
    transcript_max_tokens: int = 768
    """Token cap of one attempt's transcript wherever it is shown (Reflect, Memory, sequential notes); the
    middle is cut so the opening and the ending survive."""
    notes_max_tokens: int = 1536
    """Token cap of the notes block a sequential attempt sees (earlier attempts + reflections); the oldest
    part is cut first."""
    prompt_max_tokens: int = 3072
    """Token cap of the user message of a Reflect or Memory prompt (middle cut)."""
    reflect_sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=160)
    )
    """Sampling of each reflection (role reflect)."""
    memory_sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_new_tokens=256))
    """Sampling of the distillation (role memory; memory="model" only). Greedy by default: no exploration."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Limits and Act / Rehearse sampling of the attempts, and the limits of the final run. Its (deprecated) mode
    must be 'rehearsal' and shadow off (attempts never run the world); its group_size is ignored (from n)."""
    seed: int | None = None
    """Seed of the attempts, reflections and memories (each apart) and of the final run; None: ``rollout.seed``
    (deprecated there, one version)."""
    final_act: SamplingParams | None = None
    """Act sampling of the final real run; None = rollout.act (e.g. sample attempts at T=1, act greedily)."""
    tasks_in_flight: int | None = None
    """Rehearse at most this many tasks at a time (their N attempts each run together); None: every task at once.
    It bounds the attempts in flight, each keeping its contexts' keys and values (SmolLM2-135M: ~100 MB a 2k-token
    context). The attempts' sampling stream depends on the grouping, as it does on the batch elsewhere."""
    plan_max_new_tokens: int = 256
    """Token budget of one plan (mode plan; sampled at rollout.act's temperature and top-p). To match compute,
    set it to the mean generated tokens (Act + Rehearse) of one rehearsed attempt of the same model at the same
    N (envace.evaluation.experiment does); the tokens actually generated are counted (``tokens/plan``)."""

    def __post_init__(self) -> None:
        REHEARSAL_MODES.get(self.mode)  # unknown names raise, listing the valid ones
        if self.tasks_in_flight is not None and self.tasks_in_flight < 1:
            raise ValueError(f"TTSConfig.tasks_in_flight must be >= 1 or None, got {self.tasks_in_flight}")
        MEMORY_FORMATS.get(self.memory)
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")
        for name in ("memory_max_tokens", "transcript_max_tokens", "notes_max_tokens", "prompt_max_tokens"):
            if getattr(self, name) < 16:
                raise ValueError(f"{name} must be >= 16 tokens, got {getattr(self, name)}")
        if self.plan_max_new_tokens < 1:
            raise ValueError(f"plan_max_new_tokens must be >= 1, got {self.plan_max_new_tokens}")
        if self.rollout.mode != "rehearsal" or self.rollout.shadow:
            raise ValueError(
                "TTSConfig.rollout must have mode='rehearsal' and shadow=False: attempts are "
                "self-rehearsed and never touch the real environment (the final run is always real)"
            )

    @property
    def run_seed(self) -> int:
        """The seed of the run: ``seed``, or (None) the deprecated ``rollout.seed``."""
        return self.rollout.seed if self.seed is None else self.seed

    def attempt_seed(self, attempt: int) -> int:
        """The seed of one batch of attempts (``attempt`` numbers sequential batches; 0 for parallel)."""
        return derive_seed(self.run_seed + 1, attempt, prime=ATTEMPT_PRIME)

    def final_rollout(self) -> RolloutConfig:
        """The rollout config of the real execution (``final_act``'s Act sampling; evaluate runs it in real mode,
        ``samples`` per task, seeded ``run_seed``)."""
        return self.rollout if self.final_act is None else replace(self.rollout, act=self.final_act)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Cut(JSONable):
    """Text removed to respect a token cap."""

    where: str
    """transcript | notes | plan_prompt | reflect_prompt | memory_prompt | reflection | memory"""
    attempt: int | None
    """0-based index of the attempt the text belongs to (for notes: the attempt that was shown them; None for
    memory / memory_prompt)."""
    tokens_before: int
    tokens_after: int
    cut_text: str


@dataclass
class RehearsalRecord(JSONable):
    """Everything test-time scaling did for one task: attempts, reflections, memory, the real run, counters (one
    JSON line of :func:`save_records` per record, its keys in field order)."""

    task_id: str
    n: int
    mode: str
    memory_mode: str
    attempts: list[Trajectory] = field(default_factory=list)
    """Self-rehearsed attempts (modes that imagine tool results; empty for plan)."""
    plans: list[str] = field(default_factory=list)
    """The plans of mode plan (no tool called, no tool result imagined; empty for the other modes)."""
    plan_rows: list[Row] = field(default_factory=list)
    reflections: list[str] = field(default_factory=list)
    reflect_rows: list[Row] = field(default_factory=list)
    memory: str = ""
    """m_x exactly as shown to Act ("" for N=0)."""
    memory_raw: str = ""
    """The memory before the token cap (model output, or the concatenation)."""
    memory_source: str = "none"
    """none (N=0) | model | concat | concat_fallback (the model's memory was empty)."""
    memory_row: Row | None = None
    final: Trajectory | None = None
    """The single real execution (None until the real phase ran)."""
    success: bool | None = None
    counters: dict[str, int] = field(default_factory=dict)
    cuts: list[Cut] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    @property
    def n_done(self) -> int:
        """Private attempts made so far: rehearsed attempts or plans."""
        return len(self.attempts) + len(self.plans)


RECORD_FIELDS = tuple(f.name for f in fields(RehearsalRecord))


# --------------------------------------------------------------------------------------------------------
# The rehearsal phase (no environment anywhere below this line until the real phase)
# --------------------------------------------------------------------------------------------------------


def _record_generation(
    rec: RehearsalRecord, rows: list[Row], role: str, prompt: list[int], g: Any, traj_id: str, group_id: str, step: int
) -> None:
    """Keep one private generation (a plan or a reflection) as a row of ``role`` and count it: ``<role>/rows``,
    ``<role>/truncated`` (cut at its token budget) and ``<role>/empty``."""
    rows.append(Row.from_generation(role, prompt, g, rec.task_id, traj_id, group_id, step))
    rec.count(f"{role}/rows")
    if rows[-1].truncated:
        rec.count(f"{role}/truncated")
    if not g.text.strip():
        rec.count(f"{role}/empty")


class _Rehearsal:
    """State of one rehearsal phase: the policy, the config and a seed counter. Holds no environment."""

    def __init__(self, policy: Backend, cfg: TTSConfig):
        self.policy = policy
        self.cfg = cfg
        self.mode = REHEARSAL_MODES.get(cfg.mode)
        self.fmt = ChatFormat.for_tokenizer(policy.tokenizer, cfg.rollout.chat_format, cfg.rollout.thinking)
        self.tools = tool_format_for(policy.tokenizer, cfg.rollout.tool_format)  # Act's own (as the engine's)
        self._calls = 0
        self._transcripts: dict[tuple[str, int], str] = {}
        self.read_only: dict[str, frozenset[str]] = {}
        """Task id -> its tools known to change nothing (ToolSpec.read_only), for the memory formats."""

    def params(self, base: SamplingParams) -> SamplingParams:
        self._calls += 1
        return base.with_(seed=derive_seed(self.cfg.run_seed, PRIVATE_SALT + self._calls))

    def cap(self, rec: RehearsalRecord, where: str, attempt: int | None, text: str, max_tokens: int, keep: str) -> str:
        kept, cut = cap_tokens(text, max_tokens, self.fmt, keep)
        if cut is not None:
            rec.cuts.append(Cut(where=where, attempt=attempt, **cut))
        return kept

    def run_attempts(
        self, tasks: list[Task], group_size: int, attempt: int, memory: dict[str, str]
    ) -> list[Trajectory]:
        """One rollout batch of self-rehearsed attempts for all tasks (grouped task by task)."""
        engine = RolloutEngine(self.policy, self.cfg.rollout, memory=memory, mode="rehearsal", shadow=False)
        if engine.rollout_mode.needs_env or engine.shadow:  # the firewall, checked at run time too
            raise RuntimeError("rehearsal attempts must not use a real environment")
        return engine.run(
            tasks, group_prefix=f"tts{attempt}-", group_size=group_size, seed=self.cfg.attempt_seed(attempt)
        )

    def write_plans(self, tasks: list[Task], recs: list[RehearsalRecord], n: int) -> None:
        """``n`` plans per task, all in one generation batch (no engine, no environment: text only)."""
        prompts = []
        for task, rec in zip(tasks, recs):
            user = self.cap(
                rec,
                "plan_prompt",
                None,
                task_header(task) + "\n\n# Tools\n" + render_tools(task.tools),
                self.cfg.prompt_max_tokens,
                "middle",
            )
            prompt = self.fmt.render(
                [{"role": "system", "content": PLAN_SYSTEM}, {"role": "user", "content": user + "\n\nWrite your plan."}]
            )
            prompts += [prompt] * n
        if not prompts:
            return
        act = self.cfg.rollout.act
        gens = self.policy.generate(
            prompts,
            self.params(
                SamplingParams(
                    temperature=act.temperature, top_p=act.top_p, max_new_tokens=self.cfg.plan_max_new_tokens
                )
            ),
        )
        for i, (prompt, g) in enumerate(zip(prompts, gens)):
            rec, k = recs[i // n], i % n
            _record_generation(
                rec, rec.plan_rows, "plan", prompt, g, self.attempt_id(rec, k), f"tts-plan:{rec.task_id}", k
            )
            rec.plans.append(g.text.strip())

    def attempt_id(self, rec: RehearsalRecord, k: int) -> str:
        return rec.attempts[k].id if k < len(rec.attempts) else f"tts-plan:{rec.task_id}:{k}"

    # -- text shown to Reflect / Memory / later attempts ------------------------------------------------------
    def transcript(self, rec: RehearsalRecord, k: int) -> str:
        """Attempt ``k`` as text: a rehearsed trajectory's transcript, or a plan (capped either way)."""
        if (rec.task_id, k) not in self._transcripts:
            if k < len(rec.attempts):
                traj = rec.attempts[k]
                text = (
                    serialize_messages(traj.messages)
                    + "\n"
                    + (f"(cut off: {traj.truncated})" if traj.truncated else "(the attempt ended)")
                )
            else:
                text = rec.plans[k] or "(empty plan)"
            self._transcripts[rec.task_id, k] = self.cap(
                rec, "transcript", k, text, self.cfg.transcript_max_tokens, "middle"
            )
        return self._transcripts[rec.task_id, k]

    def attempt_block(self, rec: RehearsalRecord, k: int, with_reflection: bool = True) -> str:
        text = f"## {self.mode.title} {k + 1} ({self.mode.note})\n{self.transcript(rec, k)}"
        if with_reflection:
            text += f"\n### Reflection on {self.mode.title.lower()} {k + 1}\n{rec.reflections[k].strip() or '(empty)'}"
        return text

    def notes(self, rec: RehearsalRecord) -> str:
        """The notes block a sequential attempt sees of the attempts before it (the memory format's)."""
        return MEMORY_FORMATS.get(self.cfg.memory).notes(self, rec)

    def prompt(
        self, rec: RehearsalRecord, where: str, attempt: int | None, system: str, task: Task, body: str, ask: str
    ) -> list[int]:
        user = (
            self.cap(rec, where, attempt, task_header(task) + "\n\n" + body, self.cfg.prompt_max_tokens, "middle")
            + "\n\n"
            + ask
        )
        return self.fmt.render([{"role": "system", "content": system}, {"role": "user", "content": user}])

    # -- generations ------------------------------------------------------------------------------------------
    def reflect(self, tasks: list[Task], recs: list[RehearsalRecord], ks: list[int]) -> None:
        """Reflect on attempt ``ks[i]`` of ``recs[i]``: one batch over all tasks."""
        prompts = [
            self.prompt(
                rec,
                "reflect_prompt",
                k,
                self.mode.reflect_system,
                task,
                self.attempt_block(rec, k, with_reflection=False),
                self.mode.reflect_ask,
            )
            for task, rec, k in zip(tasks, recs, ks)
        ]
        if not prompts:
            return
        gens = self.policy.generate(prompts, self.params(self.cfg.reflect_sampling))
        for rec, k, prompt, g in zip(recs, ks, prompts, gens):
            aid = self.attempt_id(rec, k)
            group = rec.attempts[k].group_id if k < len(rec.attempts) else f"tts-plan:{rec.task_id}"
            _record_generation(rec, rec.reflect_rows, "reflect", prompt, g, aid + "/reflect", group, k)
            rec.reflections.append(g.text.strip())


@dataclass(frozen=True)
class RehearsalMode:
    """A way to spend the private budget N: ``run(ctx, tasks, records)`` fills every record's attempts (or plans)
    and one reflection per attempt; the texts say what Reflect and Memory are looking at."""

    run: Callable[[_Rehearsal, list[Task], list[RehearsalRecord]], None]
    imagined: bool
    """True: the attempts are self-rehearsed trajectories (tool results imagined by Rehearse); False: no tool
    result exists (plans), the compute-matched baseline of the rehearsal modes."""
    doc: str
    title: str = "Attempt"
    note: str = "tool results imagined"
    reflect_system: str = REFLECT_SYSTEM
    reflect_ask: str = "Reflect: what worked, what failed, what to change."
    memory_system: str = MEMORY_SYSTEM
    concat_header: str = CONCAT_HEADER


REHEARSAL_MODES: Registry[RehearsalMode] = Registry("rehearsal mode")


def _parallel(ctx: _Rehearsal, tasks: list[Task], recs: list[RehearsalRecord]) -> None:
    n = ctx.cfg.n
    trajs = ctx.run_attempts(tasks, n, 0, memory={})
    for i, rec in enumerate(recs):
        rec.attempts = trajs[i * n : (i + 1) * n]
    for k in range(n):  # one reflection per attempt; all tasks' k-th reflections in one batch
        ctx.reflect(tasks, recs, [k] * len(recs))


def _sequential(ctx: _Rehearsal, tasks: list[Task], recs: list[RehearsalRecord]) -> None:
    for k in range(ctx.cfg.n):
        notes = {task.id: ctx.notes(rec) for task, rec in zip(tasks, recs) if rec.attempts}
        trajs = ctx.run_attempts(tasks, 1, k, memory=notes)
        for rec, traj in zip(recs, trajs):
            rec.attempts.append(traj)
        ctx.reflect(tasks, recs, [k] * len(recs))


def _plan(ctx: _Rehearsal, tasks: list[Task], recs: list[RehearsalRecord]) -> None:
    ctx.write_plans(tasks, recs, ctx.cfg.n)
    for k in range(ctx.cfg.n):  # one reflection per plan, as parallel reflects on each attempt
        ctx.reflect(tasks, recs, [k] * len(recs))


REHEARSAL_MODES.add("parallel", RehearsalMode(_parallel, True, "N independent self-rehearsed attempts"))
REHEARSAL_MODES.add("sequential", RehearsalMode(_sequential, True, "attempt n sees attempts < n and their reflections"))
REHEARSAL_MODES.add(
    "plan",
    RehearsalMode(
        _plan,
        False,
        "compute-matched baseline: N independent plans without tool results, each reflected on, the same memory",
        title="Plan",
        note="nothing executed, no tool results",
        reflect_system=PLAN_REFLECT_SYSTEM,
        reflect_ask="Check the plan: what is right, what is missing, what to change.",
        memory_system=PLAN_MEMORY_SYSTEM,
        concat_header=PLAN_CONCAT_HEADER,
    ),
)


def _concat(ctx: _Rehearsal, rec: RehearsalRecord) -> str:
    share = max(16, ctx.cfg.memory_max_tokens // max(1, len(rec.reflections)))
    lines = [ctx.mode.concat_header]
    for k, r in enumerate(rec.reflections):
        lines.append(
            f"- {ctx.mode.title} {k + 1}: " + ctx.cap(rec, "reflection", k, r.strip() or "(empty)", share, "head")
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class MemoryFormat:
    """What the private attempts become where Act sees them (the "memory format", ``TTSConfig.memory``):
    ``build(ctx, tasks, records)`` sets ``memory_raw`` / ``memory_source`` (and ``memory_row``) of every record
    with attempts; ``notes(ctx, record)`` is the notes block a sequential attempt sees of the attempts before it."""

    build: Callable[[_Rehearsal, list[Task], list[RehearsalRecord]], None]
    notes: Callable[[_Rehearsal, RehearsalRecord], str]
    doc: str
    keep: str = "head"
    """How m_x is cut to memory_max_tokens (cap_tokens): head, or lines (whole lines, never half a call)."""


MEMORY_FORMATS: Registry[MemoryFormat] = Registry("memory format")


def _transcript_notes(ctx: _Rehearsal, rec: RehearsalRecord) -> str:
    """Every earlier attempt's transcript and reflection (the format before issue 29)."""
    body = "\n\n".join(ctx.attempt_block(rec, k) for k in range(rec.n_done))
    return NOTES_HEADER + "\n\n" + ctx.cap(rec, "notes", rec.n_done, body, ctx.cfg.notes_max_tokens, "tail")


def _lessons(ctx: _Rehearsal, rec: RehearsalRecord, reflections: bool, rule: str) -> str:
    """:func:`distill` of the record's attempts with the options of the rule-based format ``rule``
    (:data:`~envace.rollout.memory.RULE_FORMATS`), and the reflections where ``reflections``."""
    header = LESSONS_HEADER if ctx.mode.imagined else ctx.mode.concat_header  # plans: no tool result exists
    return distill(
        rec.attempts,
        ctx.tools,
        rec.reflections if reflections else (),
        rec.plans,
        header=header,
        read_only=ctx.read_only.get(rec.task_id, frozenset()),
        **RULE_FORMATS[rule],
    )


def _lesson_notes(ctx: _Rehearsal, rec: RehearsalRecord, reflections: bool, rule: str) -> str:
    """The lessons of the earlier attempts (no transcript), capped from the end (the calls come first)."""
    notes = _lessons(ctx, rec, reflections, rule)
    return ctx.cap(rec, "notes", rec.n_done, notes, ctx.cfg.notes_max_tokens, "lines")


def _memory_lessons(
    ctx: _Rehearsal, tasks: list[Task], recs: list[RehearsalRecord], reflections: bool, rule: str, source: str
) -> None:
    for rec in recs:
        rec.memory_raw, rec.memory_source = _lessons(ctx, rec, reflections, rule), source


def _rule_format(name: str, doc: str, reflections: bool = False, rule: str | None = None) -> MemoryFormat:
    """The memory format ``name`` made by :func:`distill`: its options are those of :data:`RULE_FORMATS` ``rule``
    (default: ``name``), with the reflections where ``reflections``."""
    rule = rule or name
    return MemoryFormat(
        functools.partial(_memory_lessons, reflections=reflections, rule=rule, source=name),
        functools.partial(_lesson_notes, reflections=reflections, rule=rule),
        doc,
        keep="lines",
    )


def _memory_concat(ctx: _Rehearsal, tasks: list[Task], recs: list[RehearsalRecord]) -> None:
    for rec in recs:
        rec.memory_raw, rec.memory_source = _concat(ctx, rec), "concat"


def _memory_model(ctx: _Rehearsal, tasks: list[Task], recs: list[RehearsalRecord]) -> None:
    prompts = []
    for task, rec in zip(tasks, recs):
        body = "\n\n".join(ctx.attempt_block(rec, k) for k in range(rec.n_done))
        prompts.append(
            ctx.prompt(
                rec,
                "memory_prompt",
                None,
                ctx.mode.memory_system,
                task,
                body,
                f"Write the memory now (at most about {int(ctx.cfg.memory_max_tokens * 0.7)} words).",
            )
        )
    gens = ctx.policy.generate(prompts, ctx.params(ctx.cfg.memory_sampling))
    for task, rec, prompt, g in zip(tasks, recs, prompts, gens):
        rec.memory_row = Row.from_generation(
            "memory", prompt, g, rec.task_id, f"tts-memory:{task.id}", f"tts-memory:{task.id}"
        )
        if g.finish_reason == "length":
            rec.count("memory/truncated")
        if g.text.strip():
            rec.memory_raw, rec.memory_source = g.text.strip(), "model"
        else:  # counted, never silent
            rec.count("memory/fallback")
            rec.memory_raw, rec.memory_source = _concat(ctx, rec), "concat_fallback"


MEMORY_FORMATS.add(
    "lessons",
    _rule_format(
        "lessons",
        "rule-based lessons (rollout.memory.distill): the calls made, in Act's tool format, with their rehearsed "
        "values; the calls that erred; the reflections cut to a line. No transcript, for m_x and sequential notes",
        reflections=True,
        rule="calls",
    ),
)
MEMORY_FORMATS.add(
    "calls",
    _rule_format(
        "calls",
        "the lessons without the reflections: the calls made, in Act's tool format, with their rehearsed values, "
        "and the calls that erred (plans, in plan mode). Nothing the model wrote about its attempts",
    ),
)
MEMORY_FORMATS.add(
    "agreed",
    _rule_format(
        "agreed",
        "the calls every attempt made (a consensus), in Act's tool format, with their rehearsed values, and a line "
        "counting the calls left out; no reflection. With N = 1, the calls of the one attempt",
    ),
)
MEMORY_FORMATS.add(
    "agreed-live",
    _rule_format(
        "agreed-live",
        "agreed, but a call to a read-only tool (ToolSpec.read_only) is listed without its imagined result, as a "
        "read to make in the real run; the other calls keep their rehearsed results (a quoted read's imagined "
        "result was taken as done: invented order ids, shop-world-decide val)",
    ),
)
MEMORY_FORMATS.add(
    "agreed-real",
    _rule_format(
        "agreed-real",
        "agreed-live, and a call whose argument the attempt took from an imagined result is said in words, naming "
        "the tool whose real result holds the value, without the invented value or call markup (the final Act "
        "cancelled an order id a rehearsal had invented after the real read listed others, shop-world-decide test)",
    ),
)
MEMORY_FORMATS.add(
    "model",
    MemoryFormat(
        _memory_model,
        _transcript_notes,
        "a Memory-role generation distills the transcripts and reflections; sequential notes are transcripts",
    ),
)
MEMORY_FORMATS.add(
    "concat",
    MemoryFormat(
        _memory_concat,
        _transcript_notes,
        "the reflections concatenated (an equal share each); sequential notes are transcripts",
    ),
)


def task_header(task: Task) -> str:
    """The task as Reflect and Memory see it: the agent's instructions, the user turns and the tool names."""
    users = "\n".join(f"User turn {i + 1}: {u.strip()}" for i, u in enumerate(task.user_turns))
    return f"## Task\n{task.system_prompt.strip()}\n{users}\nTools: {', '.join(t.name for t in task.tools)}"


def rehearse(policy: Backend, tasks: list[Task], cfg: TTSConfig) -> list[RehearsalRecord]:
    """The private phase: attempts, reflections and the bounded memory m_x for every task, batched across tasks.

    Receives no environment and builds none: attempts are rehearsal-mode rollouts (observations imagined by
    the policy's Rehearse role). The records come back with ``final`` unset.
    """
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids must be unique (the memory is keyed by task id)")
    t0 = time.perf_counter()
    ctx = _Rehearsal(policy, cfg)
    ctx.read_only = {t.id: t.read_only_tools() for t in tasks}
    recs = [
        RehearsalRecord(task_id=t.id, n=cfg.n, mode=cfg.mode, memory_mode=cfg.memory, config=cfg.to_dict())
        for t in tasks
    ]
    if cfg.n > 0 and tasks:
        ctx.mode.run(ctx, tasks, recs)
        MEMORY_FORMATS.get(cfg.memory).build(ctx, tasks, recs)
    for rec in recs:
        rec.memory = (
            ctx.cap(rec, "memory", None, rec.memory_raw, cfg.memory_max_tokens, MEMORY_FORMATS.get(cfg.memory).keep)
            if rec.memory_raw
            else ""
        )
        _count_rehearsal(rec, ctx.fmt)
        rec.timing["rehearsal_s"] = time.perf_counter() - t0  # the phase is batched: shared wall time
    return recs


ATTEMPT_ROLES = ("act", "rehearse", "plan")
"""Roles of the private attempts' generations (rehearsed trajectories: act + rehearse; plans: plan)."""
PRIVATE_ROLES = ATTEMPT_ROLES + ("reflect", "memory")
"""Every role that generates before the real run."""


def _count_rehearsal(rec: RehearsalRecord, fmt: ChatFormat) -> None:
    rec.count("rehearsal/attempts", rec.n_done)
    rec.count(
        "rehearsal/truncated_attempts",
        sum(t.truncated is not None for t in rec.attempts) + sum(r.truncated for r in rec.plan_rows),
    )
    for t in rec.attempts:
        for key, v in t.counters.items():
            rec.count(f"rehearsal/{key}", v)
    rows = (
        [r for t in rec.attempts for r in t.rows]
        + rec.plan_rows
        + rec.reflect_rows
        + ([rec.memory_row] if rec.memory_row else [])
    )
    for role in PRIVATE_ROLES:
        rec.count(f"tokens/{role}", sum(len(r.completion_ids) for r in rows if r.role == role))
    rec.count("memory/raw_tokens", len(fmt.encode(rec.memory_raw)) if rec.memory_raw else 0)
    rec.count("memory/tokens", len(fmt.encode(rec.memory)) if rec.memory else 0)
    rec.count("cuts", len(rec.cuts))
    rec.count("cut_tokens", sum(c.tokens_before - c.tokens_after for c in rec.cuts))


def attempt_tokens(rec: RehearsalRecord) -> int:
    """Tokens the private attempts generated (Act + Rehearse of rehearsed attempts, or the plans)."""
    return sum(rec.counters.get(f"tokens/{role}", 0) for role in ATTEMPT_ROLES)


def private_tokens(rec: RehearsalRecord) -> int:
    """Every token generated before the real run: attempts, reflections and the memory."""
    return sum(rec.counters.get(f"tokens/{role}", 0) for role in PRIVATE_ROLES)


# --------------------------------------------------------------------------------------------------------
# The policy: rehearse privately, then act
# --------------------------------------------------------------------------------------------------------


@dataclass
class Rehearsing:
    """Test-time rehearsal as a policy (:class:`envace.evaluation.policy.Policy`): what
    :func:`envace.evaluation.trials.evaluate` runs at a budget N > 0. ``act`` rehearses every task privately
    (:func:`rehearse` with ``cfg``, ``cfg.tasks_in_flight`` tasks at a time), then acts as
    :class:`envace.evaluation.policy.Plain` does with the memory m_x of each task: ``samples`` real
    trials per task, all with the same m_x. The records (``final``: the task's first real trial),
    the ``tts/...`` metrics and each task's private tokens come back with the trials."""

    backend: Backend
    cfg: TTSConfig

    def act(self, tasks: list[Task], rollout: RolloutConfig, *, samples: int = 1, seed: int = 0) -> Acted:
        step = self.cfg.tasks_in_flight or max(1, len(tasks))
        records: list[RehearsalRecord] = []
        for i in range(0, len(tasks), step):
            records += rehearse(self.backend, tasks[i : i + step], self.cfg)
            if step < len(tasks) and hasattr(self.backend, "release_all"):
                self.backend.release_all()  # kept contexts and shared prefixes of finished tasks: memory, not results
        # ---------------- nothing above touched a real environment; the real phase starts here ----------------
        memory = {r.task_id: r.memory for r in records if r.memory}
        acted = Plain(self.backend, memory).act(tasks, rollout, samples=samples, seed=seed)
        for i, rec in enumerate(records):
            final = acted.trajectories[i * samples]
            rec.final = final
            rec.success = None if final.reward is None else bool(final.reward)
            for key, v in final.counters.items():
                rec.count(f"final/{key}", v)
            rec.timing["real_s"] = acted.wall_s
        private = {r.task_id: (attempt_tokens(r), private_tokens(r)) for r in records}
        return replace(acted, private_tokens=private, records=records, metrics=tts_metrics(records))


def tts_metrics(records: list[RehearsalRecord]) -> dict[str, float]:
    n = max(1, len(records))

    def mean(key: str) -> float:
        return sum(r.counters.get(key, 0) for r in records) / n

    attempts = max(1, sum(r.n_done for r in records))
    return {
        "tts/n": float(records[0].n) if records else 0.0,
        "tts/memory_tokens": mean("memory/tokens"),
        "tts/memory_cut_rate": sum(any(c.where == "memory" for c in r.cuts) for r in records) / n,
        "tts/memory_fallback_rate": mean("memory/fallback"),
        "tts/cuts_per_task": mean("cuts"),
        "tts/attempt_truncated_rate": sum(r.counters.get("rehearsal/truncated_attempts", 0) for r in records)
        / attempts,
        "tts/attempt_tool_calls": sum(r.counters.get("rehearsal/act/tool_calls", 0) for r in records) / attempts,
        "tts/final_tool_calls": mean("final/act/tool_calls"),
        "tts/final_no_call_rate": sum(r.counters.get("final/act/tool_calls", 0) == 0 for r in records) / n,
        "tts/attempt_tokens_per_task": sum(attempt_tokens(r) for r in records) / n,
        "tts/attempt_tokens_per_attempt": sum(attempt_tokens(r) for r in records) / attempts,
        "tts/rehearsal_tokens_per_task": sum(private_tokens(r) for r in records) / n,
        "tts/rehearsal_wall_s": max((r.timing.get("rehearsal_s", 0.0) for r in records), default=0.0),
    }


# --------------------------------------------------------------------------------------------------------
# Reading and writing
# --------------------------------------------------------------------------------------------------------


def format_record(rec: RehearsalRecord) -> str:
    """A readable account: each attempt (transcript and reflection), the memory, cuts and the real run."""
    out = [f"=== task {rec.task_id}: N={rec.n} {rec.mode} rehearsal, memory={rec.memory_mode} ==="]
    for k, traj in enumerate(rec.attempts):
        out += [f"--- attempt {k + 1} (private; tool results imagined) ---", format_trajectory(traj)]
        if k < len(rec.reflections):
            out += [f"--- reflection {k + 1} ---", rec.reflections[k] or "(empty)"]
    for k, plan in enumerate(rec.plans):
        out += [f"--- plan {k + 1} (private; no tool called) ---", plan or "(empty)"]
        if k < len(rec.reflections):
            out += [f"--- reflection {k + 1} ---", rec.reflections[k] or "(empty)"]
    out += [
        f"--- memory ({rec.memory_source}, {rec.counters.get('memory/tokens', 0)} tokens) ---",
        rec.memory or "(none)",
    ]
    for c in rec.cuts:
        where = c.where + (f" of attempt {c.attempt + 1}" if c.attempt is not None else "")
        out.append(f"[cut] {where}: {c.tokens_before} -> {c.tokens_after} tokens")
    out.append("--- real execution (once) ---")
    out.append(format_trajectory(rec.final) if rec.final else "(not run)")
    out.append(f"success: {rec.success}")
    return "\n".join(out)


def record_dict(rec: RehearsalRecord, with_rows: bool = True) -> dict[str, Any]:
    """``rec`` as a JSON object; ``with_rows=False`` drops the token-id rows (of attempts, plans, reflections, the
    memory and the real run), keeping every text a reader needs: the chats (Act's system prompts hold the notes
    and m_x as shown), the steps, the reflections, the memory, the counters."""
    d = rec.to_dict()
    if not with_rows:
        for t in d["attempts"] + ([d["final"]] if d["final"] else []):
            t["rows"] = []
        d["plan_rows"], d["reflect_rows"], d["memory_row"] = [], [], None
    return d


def save_records(path: str, records: list[RehearsalRecord], with_rows: bool = True) -> None:
    """One JSON line per record (:func:`record_dict`); the folder is made if needed."""
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(record_dict(r, with_rows), ensure_ascii=False) + "\n")


def load_records(path: str) -> list[RehearsalRecord]:
    """The records :func:`save_records` wrote (or their gzipped copy)."""
    return [RehearsalRecord.from_dict(d) for d in read_jsonl(path)]


__all__ = [
    "TTSConfig",
    "RehearsalRecord",
    "RehearsalMode",
    "Cut",
    "Rehearsing",
    "REHEARSAL_MODES",
    "MEMORY_FORMATS",
    "MemoryFormat",
    "REFLECT_SYSTEM",
    "MEMORY_SYSTEM",
    "PLAN_SYSTEM",
    "PLAN_REFLECT_SYSTEM",
    "PLAN_MEMORY_SYSTEM",
    "ATTEMPT_ROLES",
    "PRIVATE_ROLES",
    "attempt_tokens",
    "private_tokens",
    "real_tokens",
    "add_token_counts",
    "cap_tokens",
    "rehearse",
    "tts_metrics",
    "format_record",
    "save_records",
    "record_dict",
    "load_records",
    "task_header",
]

MOVED = {"evaluate_with_tts": "budget", "run_tts": "budget", "TTSEvalResult": "trials (EvalResult, with records)"}
"""Names that left this module (issue 30): test-time rehearsal is now a policy that ``evaluate`` runs, and what
runs it lives above both (``envace.evaluation.budget``). Not re-exported, so this module never imports upward."""


def __getattr__(name: str) -> Any:
    if name in MOVED:
        raise AttributeError(f"envace.evaluation.tts.{name} moved to envace.evaluation.{MOVED[name]} (issue 30)")
    raise AttributeError(f"module 'envace.evaluation.tts' has no attribute {name!r}")
