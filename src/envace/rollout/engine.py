"""World-rehearsal rollouts: K trajectories for each of B tasks, batched continuously (default) or in lockstep rounds.

One loop serves every mode; the mode (an entry of ``envace.rollout.modes.MODES``) only decides where observations
come from (its :class:`Observer`, which also says whether it streams with the policy):

- ``rehearsal`` (EnvACE): the policy's own weights, in a separate Rehearse context, produce the observation;
  those generations are rows with role ``rehearse`` and are trained on.
- ``per_role``: a second model plays Rehearse (rows are still role ``rehearse``; the trainer routes them).
- ``simulator``: a separate frozen model produces observations (external-simulator baseline; no rows).
- ``real``: the task's real environment answers (real-env GRPO; observations are not trained on).

Scheduling (``RolloutConfig.schedule``): ``continuous`` (default, with a backend that batches continuously,
e.g. HF) lets every trajectory go on as soon as its own generation is done: its next Act or Rehearse generation
joins the running batch, so the batch stays full instead of waiting for the longest generation of each round.
``lockstep`` sends all Act generations of all live trajectories to the backend as one batch, then all pending
calls of all trajectories as one batch per call index. A format error (Act output that does not parse) is
answered by the parser's structured error; with ``validate_in_code`` unknown tools and schema violations are
too, else the Rehearse role must produce those errors itself (METHOD.md section 1). With ``reference_cache``
a call identical to a recorded reference call is answered from the record (counted) when the record was made
on this task's initial state (``envace.envs.references.cache_lookup``: references come from other tasks, so a
record of another world goes to Rehearse instead, counted as ``rehearse/cache_other_state``; as before, a hit
is the initial state's answer even if earlier calls of the trajectory changed the state). ``shadow`` executes
each rehearsed call in a copy of the real environment and records the real observation next to the rehearsed
one, with the top-level state fields that real call changed (``Step.shadow_changed``; for fidelity evaluation
only; never shown to the policy). Where a real environment ran a trajectory's calls
(real mode, shadow copy), its own success check is applied to it when the trajectory ends
(``Trajectory.env_outcome``), so scoring never executes those calls a second time.

Formats: Act and Rehearse contexts are built by appending the segments of the policy tokenizer's chat format
(``RolloutConfig.chat_format``, envace.chat.prompts); Act writes calls in its tool format (``tool_format``,
envace.chat.parsing.TOOL_FORMATS), which the system prompt describes; the system prompt lists the tools as the chat
template renders ``tools=`` where a ``template`` format can (``native_tools``; the trajectory then keeps them in
``Trajectory.tools``), else as envace's text. Thinking (``<think>...</think>``) stays in the
Act rows as generated, but is stripped before parsing and kept out of ``Trajectory.messages``, so
neither a user simulator nor the Rehearse transcript sees it (``Step.action_text`` keeps the whole output).
In Act's context it stays until the next user message; there ``thinking_history`` decides: ``keep`` leaves every
turn as sampled (the context only grows), ``strip`` rewrites the assistant turns of the user turn just ended as a
template like Qwen3's renders them, without their thinking, so the next prompts are the template's rendering of
the chat. Each Act generation is its own row either way (its prompt, its exact sampled completion), so advantages
and losses are unchanged; with ``strip`` the prompt of a user turn's first step no longer extends the previous one.

Context bound: before every Act generation and every Rehearse generation (the policy's, a second model's, or a
simulator's chat) the engine checks prompt + ``max_new_tokens`` against ``max_context_tokens``; a context that
does not fit is never generated from: the trajectory ends there, ``truncated`` says whose context it was
(``context:act`` / ``context:rehearse``) and the counters ``context/act`` / ``context/rehearse`` count it.
"""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from tqdm.auto import tqdm

from ..backends.base import Backend, Request, SamplingParams
from ..envs import USERS, Environment, UserSimulator, alive_bound, final_outcome, make_env, require_prepared
from ..envs.references import cache_lookup
from ..chat.parsing import (
    OBS_CLOSE,
    TOOL_FORMATS,
    format_observation,
    strip_thinking,
    tool_format_for,
    validate_call,
)
from ..chat.prompts import (
    CHAT_FORMATS,
    THINKING_HISTORY,
    ChatFormat,
    act_system,
    rehearse_system,
    tool_message_content,
)
from ..core.registry import Registry
from ..core.seeding import derive_seed
from ..core.types import Message, Row, Step, Task, ToolCall, Trajectory, error_obs
from .modes import MODES, Answer, Observer, RehearseContext


def rehearse_sampling(max_new_tokens: int = 160) -> SamplingParams:
    """Rehearse's sampling defaults: temperature 0.6, top-p 0.8, stopped right after its observation block."""
    return SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=max_new_tokens, stop=[OBS_CLOSE])


PER_CALL_DEFAULTS: dict[str, Any] = {"mode": "rehearsal", "group_size": 4, "shadow": False, "seed": 0}
"""The per-call fields of :class:`RolloutConfig` (deprecated there: arguments of the engine and of ``run`` now) and
their defaults; a value other than these set on a RolloutConfig warns (DeprecationWarning) and still applies."""


@dataclass
class RolloutConfig:
    """How trajectories are unrolled."""

    mode: str = "rehearsal"
    """Deprecated (one version): ``RolloutEngine(mode=...)``. Where observations come from: rehearsal | real |
    simulator | per_role (see module docstring); the engine's default when it is given none."""
    group_size: int = 4
    """Deprecated (one version): ``RolloutEngine.run(group_size=...)`` (``TrainConfig.group_size`` for training).
    K, trajectories per task (one GRPO group); ``run``'s default when it is given none."""
    max_steps: int = 8
    """Act generations per trajectory in total; past it the trajectory is truncated ("max_steps")."""
    max_steps_per_turn: int = 5
    """Act generations within one user turn before it is truncated ("max_steps_per_turn")."""
    max_context_tokens: int = 4096
    """An Act or Rehearse context that would exceed this (prompt + max_new_tokens) truncates the trajectory before
    that generation (``truncated`` = ``context:act`` / ``context:rehearse``, counters ``truncated/context`` and
    ``context/act`` / ``context/rehearse``). The Rehearse context is usually the longer one."""
    act: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=160))
    rehearse: SamplingParams = field(default_factory=rehearse_sampling)
    validate_in_code: bool = False
    """Answer unknown-tool / schema errors by code instead of asking Rehearse (format errors always are)."""
    reference_cache: bool = False
    """Answer a call identical to a recorded reference call from the record (counted as rehearse/cache_hits),
    when the record was made on this task's initial state (else rehearsed, counted as rehearse/cache_other_state)."""
    shadow: bool = False
    """Deprecated (one version): ``RolloutEngine(shadow=...)``. Also run each rehearsed call in a real environment
    copy and record its observation (evaluation only); the engine's default when it is given none."""
    user: str = "scripted"
    """User simulator name (envace.envs.USERS). Its factory gets the real environment (real mode only) for the
    user's own tool calls, the trajectory for its record (``user_steps``) and ``RolloutEngine(user_backend=...)``."""
    user_model: str | None = None
    """The model playing the user when ``user`` is ``llm`` (tau2): a model name or folder (loaded here, frozen),
    or a served model's ``http(s)://host:port/v1`` URL (the HTTP backend); opened once per process and never
    trained. None: the engine's ``user_backend``."""
    schedule: str = "continuous"
    """How generations are batched (SCHEDULES): ``continuous`` lets each trajectory go on as soon as its own
    generation is done, its next one joining the running batch (backends with continuous batching, with the
    policy's own Rehearse or the real environment; otherwise it falls back to) ``lockstep``: every live
    trajectory's Act in one batch, then every pending call's observation, step by step."""
    chat_format: str | None = None
    """How chats become tokens (envace.chat.prompts.CHAT_FORMATS): ``chatml``, or ``template`` (segments derived from
    the tokenizer's own chat template and verified on a probe chat; a template that fails falls back to ChatML with
    a one-line notice). None: ``chatml`` for a ChatML vocabulary (SmolLM2, Qwen), else ``template`` (Llama, ...)."""
    tool_format: str | None = None
    """How Act writes tool calls (envace.chat.parsing.TOOL_FORMATS): ``hermes`` (``<tool_call>`` blocks),
    ``llama3_json`` or ``mistral``; None: the one the tokenizer's chat template hints at, else hermes. The system
    prompt's calling instructions and SFT's gold calls follow it."""
    native_tools: bool = True
    """With the ``template`` chat format, Act's system turn carries the tools as the tokenizer's chat template
    renders ``tools=`` (the model's own tool prompt, e.g. Qwen's ``<tools>`` block), where the template writes them
    inside the system turn (verified on a probe chat: the appended context stays the template's tokenization of
    the chat with ``tools=``), else envace's text list, with a notice (envace.chat.prompts); False: the text list."""
    thinking: bool | None = None
    """Reasoning models' thinking (Qwen3's ``enable_thinking``): True / False is passed to the chat template where
    the generation prompt is derived (False: an empty ``<think>`` block); None: the template's default. Any
    ``<think>`` text of an Act output is stripped before parsing and never shown to a user or to Rehearse."""
    thinking_history: str | None = None
    """What Act's context keeps of its earlier thinking once a new user message comes (envace.chat.prompts.
    THINKING_HISTORY): ``keep`` (append-only, every turn as sampled) or ``strip`` (as Qwen3's template renders it:
    earlier turns lose their ``<think>`` block). None: what the chat template does (``ChatFormat.drops_thinking``)."""
    seed: int = 0
    """Deprecated (one version): ``RolloutEngine.run(seed=...)``; ``run``'s default when it is given none."""
    progress: bool = False
    """Show a progress bar over the trajectories of each run."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            MODES.get(self.mode)  # raises with the valid names
        if self.schedule not in SCHEDULES:
            SCHEDULES.get(self.schedule)
        if self.chat_format is not None and self.chat_format not in CHAT_FORMATS:
            CHAT_FORMATS.get(self.chat_format)
        if self.tool_format is not None and self.tool_format not in TOOL_FORMATS:
            TOOL_FORMATS.get(self.tool_format)
        if self.thinking_history is not None and self.thinking_history not in THINKING_HISTORY:
            THINKING_HISTORY.get(self.thinking_history)
        for name in ("group_size", "max_steps", "max_steps_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name}: bad value {getattr(self, name)!r}: at least 1")
        per_call = [f"{k}={getattr(self, k)!r}" for k, v in PER_CALL_DEFAULTS.items() if getattr(self, k) != v]
        if per_call:
            warnings.warn(
                f"RolloutConfig({', '.join(per_call)}): mode and shadow are arguments of RolloutEngine, group_size "
                "and seed of RolloutEngine.run (TrainConfig.group_size for training); these RolloutConfig fields "
                "go in the next version",
                DeprecationWarning,
                stacklevel=3,
            )


@dataclass
class _Live:
    """The state of one trajectory being unrolled."""

    task: Task
    traj: Trajectory
    act_ids: list[int]
    rehearse: RehearseContext  # what the observer answers Act's calls from
    user: UserSimulator
    env: Environment | None = None  # real env (real mode) or shadow copy
    turn: int = 0
    steps_in_turn: int = 0
    done: bool = False
    calls: list[ToolCall] = field(default_factory=list)  # calls of the current step awaiting observations
    results: list[tuple[ToolCall, Any, str, Any]] = field(default_factory=list)  # their answers so far
    open_step: bool = False  # an Act generation was taken and its step is not closed yet (continuous)
    act_turns: list[tuple[int, int, str]] = field(default_factory=list)  # Act's turns since the last user message:
    # (start, end) of each in act_ids and its content as the template is given it (ChatFormat.opened + the text)


class _Runs:
    """The trajectories of one :meth:`RolloutEngine.run`: started in order, each as soon as its environment kind
    has room (:func:`envace.envs.alive_bound`; none needed without a real environment), ended as it finishes."""

    def __init__(self, engine: "RolloutEngine", slots: list[tuple[Task, int, str]]):
        self.engine = engine
        self.waiting = list(slots)  # (task, k, group id) not started yet, in order
        self.lives: list[_Live] = []  # started, in order
        self.ended: set[int] = set()  # id() of the ended ones
        self.alive: dict[str, int] = {}  # environment kind -> environments open
        self.needs_env = engine.rollout_mode.needs_env or engine.shadow

    def _kind(self, task: Task) -> tuple[str, int | None]:
        return task.env.split(":", 1)[0], alive_bound(task) if self.needs_env else None

    def admit(self) -> list[_Live]:
        """Start every waiting trajectory whose environment kind is below its bound, in order; return them."""
        started, waiting = [], self.waiting
        self.waiting = []
        for task, k, group_id in waiting:
            kind, bound = self._kind(task)
            if bound is not None and self.alive.get(kind, 0) >= bound:
                self.waiting.append((task, k, group_id))
                continue
            self.alive[kind] = self.alive.get(kind, 0) + 1
            started.append(self.engine._start(task, k, group_id))
            self.lives.append(started[-1])
        return started

    def running(self) -> list[_Live]:
        """The started trajectories not ended yet, in order."""
        return [lv for lv in self.lives if id(lv) not in self.ended]

    def end(self, lv: _Live) -> None:
        self.ended.add(id(lv))
        kind, _ = self._kind(lv.task)
        self.alive[kind] -= 1
        self.engine._end(lv)

    def settle(self, bar: Any) -> list[_Live]:
        """End the trajectories that are done (after the context guard) and start waiting ones in their place,
        until every running one has a next Act generation; return those (none: the run is over)."""
        while True:
            running = self.running()
            for lv in running:
                if not lv.done:
                    self.engine._guard(lv)
            done = [lv for lv in running if lv.done]
            for lv in done:
                self.end(lv)
                bar.update(1)
            if not done and not self.admit():
                return running

    def close(self) -> None:
        """Close the environment of every trajectory started and not ended (a run stopped by an exception)."""
        for lv in self.running():
            self.ended.add(id(lv))
            if lv.env is not None:
                try:
                    lv.env.close()
                except Exception:  # noqa: BLE001 - the others are closed all the same; the run's error stands
                    pass


# name -> fn(engine, runs, progress bar): drives the trajectories of a run (_Runs) to the end (see
# RolloutConfig.schedule)
SCHEDULES: Registry[Callable[..., None]] = Registry("rollout schedule")
SCHEDULES.add("lockstep", lambda engine, runs, bar: engine._run_lockstep(runs, bar))
SCHEDULES.add("continuous", lambda engine, runs, bar: engine._run_continuous(runs, bar))


@functools.lru_cache(maxsize=4)
def user_backend_for(model: str) -> Backend:
    """The backend of ``RolloutConfig.user_model`` (one per process and model): a served model for an http(s) URL,
    else loaded here (envace.backends.loaders.frozen_backend)."""
    from ..backends.loaders import frozen_backend

    return frozen_backend(model)


class RolloutEngine:
    """Unrolls trajectories for a batch of tasks. ``policy`` plays Act (and Rehearse in rehearsal mode). ``cfg`` says
    how; ``mode`` (where observations come from, MODES) and ``shadow`` are this engine's, the number of trajectories
    per task and the seed each :meth:`run`'s (None: the deprecated fields of ``cfg``, for one version)."""

    def __init__(
        self,
        policy: Backend,
        cfg: RolloutConfig,
        rehearser: Backend | None = None,
        simulator: Backend | None = None,
        memory: dict[str, str] | None = None,
        user_backend: Backend | None = None,
        *,
        mode: str | None = None,
        shadow: bool | None = None,
    ):
        self.policy = policy
        self.mode = cfg.mode if mode is None else mode
        self.shadow = cfg.shadow if shadow is None else shadow
        self.seed = cfg.seed  # the current run's (run(seed=...))
        # a frozen model playing the user (cfg.user "llm"); never trained
        self.user_backend = user_backend or (user_backend_for(cfg.user_model) if cfg.user_model else None)
        self.cfg = cfg
        self.fmt = ChatFormat.for_tokenizer(policy.tokenizer, cfg.chat_format, cfg.thinking)
        self.tools = tool_format_for(policy.tokenizer, cfg.tool_format)
        self.native_tools = self.fmt.uses_native_tools(cfg.native_tools)  # the template renders Act's tools
        self.thinking_history = self.fmt.thinking_history(cfg.thinking_history)  # keep | strip (None: the template's)
        self._earlier = THINKING_HISTORY.get(self.thinking_history)  # content -> as written once a user follows
        self.rollout_mode = MODES.get(self.mode)  # who answers Act's calls; needs a real environment or not
        self.observer = self.rollout_mode.build(self.mode, policy, {"rehearser": rehearser, "simulator": simulator})
        self.memory = memory or {}  # task id -> rehearsal memory shown to Act (test-time scaling)
        self._calls = 0

    # -- sampling seeds: each generate call gets its own, derived from the run seed ------------------------
    def params(self, role: str) -> SamplingParams:
        self._calls += 1
        base = self.cfg.act if role == "act" else self.cfg.rehearse
        return base.with_(seed=derive_seed(self.seed, self._calls))

    def row(self, role: str, lv: _Live, prompt: list[int], g: Any) -> Row:
        """The row of a generation of ``role`` for trajectory ``lv`` at its current step."""
        return Row.from_generation(
            role, prompt, g, lv.task.id, lv.traj.id, lv.traj.group_id, step=len(lv.traj.steps) - 1
        )

    # -- contexts ---------------------------------------------------------------------------------------------
    def _start(self, task: Task, k: int, group_id: str) -> _Live:
        traj = Trajectory(id=f"{group_id}/{k}", task_id=task.id, group_id=group_id, mode=self.mode)
        system = act_system(task, self.memory.get(task.id), self.tools, tool_list=not self.native_tools)
        traj.messages.append(Message("system", system))
        if self.native_tools:  # the system message does not list them: the template renders them
            traj.tools = list(task.tools)
        rsys = rehearse_system(task)
        env = make_env(task) if self.rollout_mode.needs_env or self.shadow else None
        try:
            # the user acts in the real environment only where Act's calls do (never in a shadow copy); its side is
            # recorded in the trajectory (Trajectory.user_steps), never as rows
            user = USERS.get(self.cfg.user)(
                task, env=env if self.rollout_mode.needs_env else None, traj=traj, backend=self.user_backend
            )
            lv = _Live(
                task=task,
                traj=traj,
                act_ids=self.fmt.opening(system, task.tools if self.native_tools else None),
                rehearse=RehearseContext.opening(
                    self.fmt, rsys, traj.id + "/rehearse", env if self.rollout_mode.needs_env else None
                ),
                user=user,
                env=env,
            )
            self._next_user_turn(lv)
        except BaseException:  # no trajectory holds the environment yet: close it here
            if env is not None:
                env.close()
            raise
        return lv

    def _next_user_turn(self, lv: _Live) -> None:
        text = lv.user.reply(lv.task, lv.traj.messages, lv.turn)
        if text is None:
            lv.done = True
            return
        self._write_earlier_turns(lv)
        lv.traj.messages.append(Message("user", text))
        lv.act_ids += self.fmt.message("user", text)
        lv.rehearse.note(f"[user] {text.strip()}")
        lv.steps_in_turn = 0

    def _write_earlier_turns(self, lv: _Live) -> None:
        """A user message comes: Act's turns since the last one are written as ``thinking_history`` says (``strip``:
        a turn with thinking becomes the assistant message of its content without it; ``keep``: as sampled)."""
        for start, end, content in reversed(lv.act_turns):  # from the end: earlier spans keep their offsets
            written = self._earlier(content)
            if written != content:
                lv.act_ids[start:end] = self.fmt.message("assistant", written)
        lv.act_turns = []

    def rehearse_prompt(self, lv: _Live, call: ToolCall) -> list[int]:
        """The prompt asking Rehearse for ``call``'s observation (:meth:`RehearseContext.ask`)."""
        return lv.rehearse.ask(self.fmt, call, lv.task.tool(call.name))

    def _truncate(self, lv: _Live, why: str, role: str | None = None) -> None:
        """End the trajectory; ``role`` says whose generation did not fit (``truncated`` = ``why:role``)."""
        lv.traj.truncated = why if role is None else f"{why}:{role}"
        lv.traj.count(f"truncated/{why}")
        if role is not None:
            lv.traj.count(f"{why}/{role}")
        lv.done = True

    # -- the loop ---------------------------------------------------------------------------------------------
    def run(
        self,
        tasks: list[Task],
        group_prefix: str = "g",
        desc: str | None = None,
        first: int = 0,
        *,
        group_size: int | None = None,
        seed: int | None = None,
    ) -> list[Trajectory]:
        """Roll out ``group_size`` trajectories for each task (K; None: ``cfg.group_size``, deprecated), sampled from
        ``seed`` (None: ``cfg.seed``, deprecated); returns them grouped task by task. A task that needs
        its environment's ``prepare`` first is refused (:func:`envace.envs.require_prepared`). ``desc``: the
        progress bar's label (default ``rollout[<mode>]``). ``first``: the index of each group's first trajectory
        (ids ``<group>/<first>`` ...), for a group whose other trajectories another engine rolls out.

        Where trajectories need real environments (real mode, shadow), at most ``envace.envs.alive_bound(task)``
        of one kind are alive at once (MCP servers: ``MCPEnv.max_alive``): a trajectory starts when one of its kind
        has ended. Each environment is closed as soon as its trajectory ends, and every one still open is closed
        when the run stops early (an exception, Ctrl-C)."""
        require_prepared(tasks)
        group_size = self.cfg.group_size if group_size is None else group_size
        if group_size < 1:
            raise ValueError(f"RolloutEngine.run: group_size must be >= 1, got {group_size}")
        self.seed = self.cfg.seed if seed is None else seed
        slots = [
            (t, k, f"{group_prefix}{i}:{t.id}") for i, t in enumerate(tasks) for k in range(first, first + group_size)
        ]
        runs = _Runs(self, slots)
        desc = desc or f"rollout[{self.mode}]"
        bar = tqdm(total=len(slots), desc=desc, disable=not self.cfg.progress, leave=False)
        schedule = self.cfg.schedule if self.cfg.schedule != "continuous" or self.can_stream() else "lockstep"
        try:
            SCHEDULES.get(schedule)(self, runs, bar)
            for lv in runs.running():  # (each ended as it finished; this catches any that a schedule did not)
                runs.end(lv)
        finally:
            bar.close()
            runs.close()
        return [lv.traj for lv in runs.lives]

    def _end(self, lv: _Live) -> None:
        """A finished trajectory: its kept contexts dropped; in its real environment, its own success check and
        fault counts recorded (so scoring never runs its calls again), then the environment closed."""
        self._release([lv])
        if lv.env is None:
            return
        try:
            lv.traj.env_outcome = final_outcome(lv.env, lv.traj)
            for kind, n in lv.env.faults.items():  # tool exceptions, timeouts, ... are counted, not silent
                lv.traj.count(f"env/{kind}", n)
        finally:
            lv.env.close()

    def _release(self, lives: list[_Live]) -> None:
        """Drop the backends' kept contexts (keys/values) of these trajectories: called as soon as each one is done,
        so that memory follows the trajectories still running, not every trajectory of the call (100 finished
        2k-token contexts of SmolLM2-135M hold ~9 GB)."""
        sessions = [s for lv in lives for s in (lv.traj.id + "/act", lv.rehearse.session)]
        self.policy.release(sessions)
        self.observer.release(sessions)

    def can_stream(self) -> bool:
        """Continuous batching needs a streaming policy backend and an observer that streams with it (the policy's
        own Rehearse, or the real environment)."""
        return bool(getattr(self.policy, "streams", False)) and self.observer.streams_with_policy

    def _fits(self, n_prompt: int, params: SamplingParams) -> bool:
        """Whether a prompt of ``n_prompt`` tokens and its completion (+ the closing tokens) fit the context."""
        return n_prompt + params.max_new_tokens + 2 <= self.cfg.max_context_tokens

    def _guard(self, lv: _Live) -> None:
        """Context guard before an Act generation."""
        if not self._fits(len(lv.act_ids), self.cfg.act):
            self._truncate(lv, "context", "act")

    def _ask(self, lv: _Live, call: ToolCall) -> bool:
        """Ready the Rehearse context to be asked ``call`` (its prompt, when the observer rehearses); False, with the
        trajectory truncated (``context:rehearse``), when that prompt does not fit."""
        if not self.observer.rehearses:
            return True
        if not self._fits(len(self.rehearse_prompt(lv, call)), self.cfg.rehearse):
            self._truncate(lv, "context", "rehearse")
            return False
        return True

    def _close_step(self, lv: _Live) -> None:
        own = lv.task.metadata.get("max_steps")  # the task's own protocol (BFCL single-turn: one response), not a cut
        if not lv.done and own is not None and len(lv.traj.steps) >= own:
            lv.done = True
            lv.traj.count("ended/task_max_steps")
        elif not lv.done and len(lv.traj.steps) >= self.cfg.max_steps:
            self._truncate(lv, "max_steps")
        elif not lv.done and lv.steps_in_turn >= self.cfg.max_steps_per_turn:
            self._truncate(lv, "max_steps_per_turn")

    def _shadow(self, lv: _Live, call: ToolCall) -> tuple[Any, list[str]] | None:
        """Shadow mode: (the real observation of ``call``, the top-level state fields it changed); else None."""
        if not (self.shadow and lv.env is not None and not self.rollout_mode.needs_env):
            return None
        before = lv.env.state()
        obs = lv.env.call(call)
        return obs, changed_fields(before, lv.env.state())

    # -- lockstep: all live trajectories' Act in one batch, then their observations call index by call index -----
    def _run_lockstep(self, runs: _Runs, bar: Any) -> None:
        while live := runs.settle(bar):
            self._act(live)
            self._observe([lv for lv in live if lv.calls])
            for lv in live:
                self._close_step(lv)

    # -- continuous: each trajectory's next generation joins the running batch as soon as its last one is done ---
    def _run_continuous(self, runs: _Runs, bar: Any) -> None:
        def on_done(req: Request, g: Any) -> list[Request]:
            lv, kind = req.tag
            if kind == "act":
                self._take_act(lv, req.prompt, g)
            else:
                self._take(lv, lv.calls[len(lv.results)], self.observer.receive(self, lv.rehearse, g))
            nxt = self._next_request(lv)
            return ([nxt] if nxt is not None else []) + (self._start_requests(runs, bar) if lv.done else [])

        self.policy.generate_stream(self._start_requests(runs, bar), on_done, seed=derive_seed(self.seed, 1))

    def _start_requests(self, runs: _Runs, bar: Any) -> list[Request]:
        """End the trajectories that are done and start waiting ones in their place: the first requests of those
        started (a trajectory done before its first generation is ended at once, and another one started)."""
        out: list[Request] = []
        while True:
            for lv in runs.running():
                if lv.done:
                    runs.end(lv)
                    bar.update(1)
            started = runs.admit()
            if not started:
                return out
            out += [r for r in (self._next_request(lv) for lv in started) if r is not None]

    def _next_request(self, lv: _Live) -> Request | None:
        """Advance one trajectory as far as it goes without a model: answer the current step's calls that need no
        model (validation, reference cache, real environment), close the step, guard the context; return the
        next generation it waits for (a Rehearse or an Act request), or None once it is done."""
        if lv.open_step:
            while not lv.done and len(lv.results) < len(lv.calls):
                call = lv.calls[len(lv.results)]
                if self._answer_locally(lv, call):
                    continue
                if not self._ask(lv, call):  # the Rehearse context does not fit: truncated
                    break
                req = self.observer.request(self, lv.rehearse, call)
                if req is not None:  # a generation joining the running batch
                    req.tag = (lv, "rehearse")
                    return req
                (answer,) = self.observer.observe(self, [(lv.rehearse, call)])
                self._take(lv, call, answer)
            self._finish_calls(lv)
            lv.open_step = False
            self._close_step(lv)
        if not lv.done:
            self._guard(lv)
        if lv.done:
            return None
        return Request(
            prompt=lv.act_ids + self.fmt.generation_prompt(),
            params=self.cfg.act,
            session=lv.traj.id + "/act",
            tag=(lv, "act"),
        )

    def _act(self, live: list[_Live]) -> None:
        prompts = [lv.act_ids + self.fmt.generation_prompt() for lv in live]
        gens = self.policy.generate(prompts, self.params("act"), [lv.traj.id + "/act" for lv in live])
        for lv, prompt, g in zip(live, prompts, gens):
            self._take_act(lv, prompt, g)

    def _take_act(self, lv: _Live, prompt: list[int], g: Any) -> None:
        """Record an Act generation: its row, the step (calls, reply or parse error), the Act context."""
        lv.open_step = True
        tr = lv.traj
        tr.rows.append(Row.from_generation("act", prompt, g, lv.task.id, tr.id, tr.group_id, step=len(tr.steps)))
        start = len(lv.act_ids)  # the prompt is the context and the generation prompt
        lv.act_ids = prompt + g.token_ids + self.fmt.close_completion(g.token_ids)
        if isinstance(g.text, str):  # (a turn without text is never rewritten)
            lv.act_turns.append((start, len(lv.act_ids), self.fmt.opened + g.text))
        lv.steps_in_turn += 1
        tr.count("act/steps")
        if g.finish_reason == "length":
            tr.count("act/truncated")
        parsed = self.tools.parse(g.text)
        step = Step(
            user_turn=lv.turn, action_text=g.text, calls=parsed.calls, reply=parsed.reply, parse_error=parsed.error
        )
        tr.steps.append(step)
        lv.calls = []
        shown = strip_thinking(g.text)[0] if isinstance(g.text, str) else ""  # the chat never holds thinking
        if parsed.thinking is not None:
            tr.count("act/thinking")
        if parsed.error is not None:
            tr.count("act/parse_errors")
            tr.messages.append(Message("assistant", shown))
            self._feed(lv, [(ToolCall(name="(unparsed)"), parsed.error, "validation", None)], raw=True)
        elif parsed.calls:
            tr.count("act/tool_calls", len(parsed.calls))
            tr.messages.append(Message("assistant", shown, tool_calls=parsed.calls))
            lv.calls = parsed.calls
        else:
            tr.count("act/replies")
            tr.messages.append(Message("assistant", parsed.reply or ""))
            lv.rehearse.note(f"[assistant] {(parsed.reply or '').strip()}")
            lv.turn += 1
            self._next_user_turn(lv)

    def _observe(self, live: list[_Live]) -> None:
        width = max((len(lv.calls) for lv in live), default=0)
        for j in range(width):  # call j of every trajectory, batched; calls of one step stay in order
            todo = []
            for lv in live:
                if lv.done or j >= len(lv.calls) or self._answer_locally(lv, lv.calls[j]):
                    continue
                if self._ask(lv, lv.calls[j]):  # else truncated: its Rehearse context does not fit
                    todo.append(lv)
            if todo:
                answers = self.observer.observe(self, [(lv.rehearse, lv.calls[j]) for lv in todo])
                for lv, answer in zip(todo, answers):
                    self._take(lv, lv.calls[j], answer)
        for lv in live:
            self._finish_calls(lv)

    def _take(self, lv: _Live, call: ToolCall, answer: Answer) -> None:
        """An observer's answer: its Rehearse generation as a row, its counters and text in the trajectory."""
        if answer.generation is not None:
            lv.traj.rows.append(self.row("rehearse", lv, lv.rehearse.prompt, answer.generation))
        for name in answer.counts:
            lv.traj.count(name)
        if answer.text is not None:
            lv.traj.steps[-1].rehearse_texts.append(answer.text)
        self._record(lv, call, answer.observation, answer.source)

    def _record(self, lv: _Live, call: ToolCall, obs: Any, source: str) -> None:
        """One answered call of the current step (with its shadow observation, in shadow mode)."""
        lv.results.append((call, obs, source, self._shadow(lv, call)))

    def _answer_locally(self, lv: _Live, call: ToolCall) -> bool:
        """Answer ``call`` without a model if it can be (validation error, reference cache); True if it was."""
        obs, source = self._answer_without_model(lv, call)
        if obs is None:
            return False
        self._record(lv, call, obs, source)
        lv.rehearse.note(f"[assistant] {call.key()}", f"[tool] {tool_message_content(obs)}")
        return True

    def _finish_calls(self, lv: _Live) -> None:
        """Show the current step's answered calls to Act."""
        self._feed(lv, lv.results)
        lv.calls, lv.results = [], []

    def _answer_without_model(self, lv: _Live, call: ToolCall) -> tuple[Any, str]:
        if self.rollout_mode.needs_env:
            return None, ""  # the real environment validates and answers itself
        if self.cfg.validate_in_code:
            err = validate_call(call, lv.task.tools)
            if err is not None:
                lv.traj.count("rehearse/validation_errors")
                return err, "validation"
        if self.cfg.reference_cache:
            found, ref = cache_lookup(lv.task, call)
            if found != "miss":
                lv.traj.count("rehearse/cache_hits" if ref is not None else "rehearse/cache_other_state")
            if ref is not None:
                return ref.result, "cache"
        return None, ""

    def _feed(self, lv: _Live, results: list[tuple[ToolCall, Any, str, Any]], raw: bool = False) -> None:
        """Append observations as tool messages to the Act chat and context."""
        step = lv.traj.steps[-1]
        for call, obs, source, shadow in results:
            step.observations.append(obs)
            step.sources.append(source)
            step.shadow.append(None if shadow is None else shadow[0])
            step.shadow_changed.append(None if shadow is None else shadow[1])
            content = tool_message_content(obs)
            lv.traj.messages.append(Message("tool", content))
            lv.act_ids += self.fmt.message("tool", content)
            if raw:
                lv.rehearse.note("[assistant] (malformed tool call)", f"[tool] {content}")


def changed_fields(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The top-level keys of two ``state()`` snapshots whose values differ (added and removed keys too), sorted."""
    return sorted(k for k in set(before) | set(after) if k not in before or k not in after or before[k] != after[k])


def rollout(
    policy: Backend,
    tasks: list[Task],
    cfg: RolloutConfig,
    *,
    group_size: int | None = None,
    seed: int | None = None,
    **kw: Any,
) -> list[Trajectory]:
    """Convenience wrapper: one :class:`RolloutEngine` run (``kw``: the engine's keywords, ``mode`` and ``shadow``
    among them)."""
    return RolloutEngine(policy, cfg, **kw).run(tasks, group_size=group_size, seed=seed)


def format_trajectory(traj: Trajectory) -> str:
    """A readable transcript of a trajectory (Act chat with observation sources and shadow observations)."""
    lines = [
        f"# trajectory {traj.id}  task={traj.task_id}  mode={traj.mode}  "
        f"reward={traj.reward}  truncated={traj.truncated}"
    ]
    for s in traj.steps:
        lines.append(f"[act] {s.action_text.strip()}")
        for i, obs in enumerate(s.observations):
            src = s.sources[i] if i < len(s.sources) else "?"
            lines.append(f"  [{src}] {json.dumps(obs, ensure_ascii=False)[:500]}")
            if i < len(s.shadow) and s.shadow[i] is not None:
                lines.append(f"  [real ] {json.dumps(s.shadow[i], ensure_ascii=False)[:500]}")
    if traj.counters:
        lines.append("counters: " + json.dumps(traj.counters, sort_keys=True))
    return "\n".join(lines)


__all__ = [
    "RolloutConfig",
    "RolloutEngine",
    "rehearse_sampling",
    "Observer",
    "MODES",
    "SCHEDULES",
    "rollout",
    "format_trajectory",
    "format_observation",
    "error_obs",
]
