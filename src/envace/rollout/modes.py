"""Rollout modes: one entry per mode says who plays Rehearse and builds the observer that answers Act's calls.

An entry of :data:`MODES` (the value of ``RolloutConfig.mode``) says

- who plays Rehearse (:attr:`RolloutMode.rehearsed_by`): the policy's own weights (``rehearsal``), the task's real
  environment (``real``), a second model of its own (``per_role``: trained on the Rehearse rows and saved beside
  the policy in every checkpoint) or a frozen external model (``simulator``);
- which models training updates (:attr:`RolloutMode.trained_models`);
- whether a real environment is needed (:attr:`RolloutMode.needs_env`);
- and builds the :class:`Observer` from the policy and the helper's backend (:meth:`RolloutMode.build`).

A model that answers besides the policy is a *helper*, handed to ``RolloutEngine`` under its name (``rehearser=``,
``simulator=``). The trainer, the CLI and the experiment ask the entry which models play and where a checkpoint
keeps them (:meth:`RolloutMode.helpers`) instead of branching on mode names; the engine asks the observer whether
it streams with the policy, never its class.

Rehearse's side of a trajectory is one object, :class:`RehearseContext`: its token ids, the same context as chat
messages, the transcript lines Act's side added since Rehearse last saw it (and the real environment, in a mode
that needs one). An observer answers ``(context, call)`` pairs with :class:`Answer` s, which the engine records.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ..backends.base import Backend, Request, SamplingParams
from ..chat.parsing import parse_observation
from ..chat.prompts import ChatFormat, rehearse_user_message
from ..core.registry import Registry
from ..core.types import Generation, ToolCall, ToolSpec
from ..envs import Environment


class Engine(Protocol):
    """What an observer uses of the rollout engine that asks it (``envace.rollout.engine.RolloutEngine``, which
    imports this module): its rollout config, its chat format and the sampling parameters of a role."""

    cfg: Any
    fmt: ChatFormat

    def params(self, role: str) -> SamplingParams: ...


@dataclass
class RehearseContext:
    """What answers Act's calls sees of one trajectory: Rehearse's context as token ids and as chat messages (a
    model answering through ``chat`` sees the messages), the transcript lines Act's side added since Rehearse last
    saw it, the prompt of the call being asked, and, in a mode that needs one, the real environment."""

    ids: list[int]
    messages: list[dict[str, str]]
    session: str
    """The backends' session of Rehearse's context (its kept keys/values)."""
    pending: list[str] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    """The prompt of the last :meth:`ask` (the call being answered)."""
    env: Environment | None = None
    """The real environment where Act's calls run (a mode that ``needs_env``), else None."""

    @classmethod
    def opening(cls, fmt: ChatFormat, system: str, session: str, env: Environment | None) -> "RehearseContext":
        """The context of a new trajectory: Rehearse's system turn."""
        ids = fmt.message("system", system, first=True)
        return cls(ids=ids, messages=[{"role": "system", "content": system}], session=session, env=env)

    def note(self, *lines: str) -> None:
        """Transcript lines (``[user] ...``, ``[assistant] ...``, ``[tool] ...``) shown with the next call."""
        self.pending += lines

    def ask(self, fmt: ChatFormat, call: ToolCall, tool: ToolSpec | None) -> list[int]:
        """The prompt that asks Rehearse for ``call``'s observation: the context, the transcript since the last
        call and the call as a user turn (also appended to the messages), and the generation prompt."""
        content = rehearse_user_message(self.pending, call, tool)
        self.pending = []
        self.messages.append({"role": "user", "content": content})
        self.prompt = self.ids + fmt.message("user", content) + fmt.generation_prompt()
        return self.prompt

    def answered(self, ids: list[int], text: str) -> None:
        """Rehearse's answer taken: ``ids`` is the context up to and including it."""
        self.ids = ids
        self.messages.append({"role": "assistant", "content": text})


@dataclass(frozen=True)
class Answer:
    """An observer's answer to one call; the engine records it in the trajectory."""

    observation: Any
    source: str
    """Who answered, as the step records it (``rehearsed``, ``simulator``, ``real``, ...)."""
    text: str | None = None
    """What Rehearse wrote (kept in the step's ``rehearse_texts``), None where nothing was written."""
    generation: Generation | None = None
    """A token-level Rehearse generation: recorded as a row of role ``rehearse`` (from the context's prompt)."""
    counts: tuple[str, ...] = ()
    """Counters to add to the trajectory, in order."""


class Observer(ABC):
    """Answers Act's calls, each from ``(context, call)``: the trajectory's :class:`RehearseContext` and the call."""

    rehearses = False
    """Answers from the context's prompt (:meth:`RehearseContext.ask`), which the engine builds and bounds first."""
    streams_with_policy = False
    """Can join the policy's continuous batch: answers at once without a model (:meth:`request` is None), or
    generates with the policy's own backend (:meth:`request` / :meth:`receive`)."""

    @abstractmethod
    def observe(self, engine: Engine, asks: list[tuple[RehearseContext, ToolCall]]) -> list[Answer]:
        """One answer per ``(context, call)``, in order (a batch: one generation call at most)."""

    def request(self, engine: Engine, context: RehearseContext, call: ToolCall) -> Request | None:
        """The policy generation that answers the call (continuous batching; its ``tag`` is the engine's to set),
        or None: :meth:`observe` answers."""
        return None

    def receive(self, engine: Engine, context: RehearseContext, g: Generation) -> Answer:
        """The answer of a finished :meth:`request`."""
        raise NotImplementedError(f"{type(self).__name__} makes no requests")

    def release(self, sessions: list[str]) -> None:
        """Drop the kept contexts of these sessions from a backend of the observer's own (not the policy's)."""


class RealObserver(Observer):
    """The task's real environment answers."""

    streams_with_policy = True

    def observe(self, engine, asks):
        return [Answer(context.env.call(call), "real") for context, call in asks]


class RehearseObserver(Observer):
    """The Rehearse role of a token-level backend: the policy itself, or a second model (per_role)."""

    rehearses = True

    def __init__(self, backend: Backend, policy: Backend):
        self.backend = backend
        self.streams_with_policy = backend is policy  # its generations join the policy's continuous batch

    def observe(self, engine, asks):
        prompts, sessions = [c.prompt for c, _ in asks], [c.session for c, _ in asks]
        gens = self.backend.generate(prompts, engine.params("rehearse"), sessions)
        return [self.receive(engine, context, g) for (context, _), g in zip(asks, gens)]

    def request(self, engine, context, call):
        if not self.streams_with_policy:
            return None
        return Request(prompt=context.prompt, params=engine.cfg.rehearse, session=context.session)

    def receive(self, engine, context, g):
        """Parse a Rehearse generation into the observation; the context goes on after it."""
        obs, err = parse_observation(g.text)
        counts = ("rehearse/parse_errors",) * bool(err) + ("rehearse/truncated",) * (g.finish_reason == "length")
        context.answered(context.prompt + g.token_ids + engine.fmt.close_completion(g.token_ids), g.text)
        return Answer(obs, "rehearsed", text=g.text, generation=g, counts=counts)

    def release(self, sessions):
        if not self.streams_with_policy:  # the policy's own sessions the engine releases itself
            self.backend.release(sessions)


class SimulatorObserver(Observer):
    """A separate frozen model answers through ``chat`` (any backend: HF, HTTP ...). No rows. It sees the
    Rehearse context as a chat (:attr:`RehearseContext.messages`, which asking extended by the call)."""

    rehearses = True

    def __init__(self, backend: Backend):
        self.backend = backend

    def observe(self, engine, asks):
        texts = self.backend.chat([list(context.messages) for context, _ in asks], engine.params("rehearse"))
        n_gen = len(engine.fmt.generation_prompt())
        out = []
        for (context, _), text in zip(asks, texts):
            obs, err = parse_observation(text)
            # the chat, as the context bound counts it
            context.answered(
                context.prompt[: len(context.prompt) - n_gen] + engine.fmt.message("assistant", text), text
            )
            out.append(Answer(obs, "simulator", text=text, counts=("simulator/parse_errors",) * bool(err)))
        return out


@dataclass(frozen=True)
class RolloutMode:
    """A rollout mode: who answers Act's calls, which models are trained, and the observer that answers."""

    doc: str
    observer: Callable[[Backend, Backend | None], Observer]
    """Builds the observer from the policy's backend and the helper's (None without a helper)."""
    helper: str | None = None
    """The ``RolloutEngine`` keyword of the model that answers besides the policy (``rehearser``, ``simulator``);
    None where the policy itself rehearses or the real environment answers."""
    trained: bool = False
    """Whether the helper is trained (on the Rehearse rows) and saved in each checkpoint as ``<helper>/``; else it is
    frozen, never trained nor saved."""
    needs_env: bool = False
    """Act's calls run in the task's real environment (the user acts there too)."""

    @property
    def rehearsed_by(self) -> str:
        """Who plays Rehearse: ``policy``, the helper's name, or ``environment``."""
        return "environment" if self.needs_env else self.helper or "policy"

    @property
    def trained_models(self) -> tuple[str, ...]:
        """The models training updates and every checkpoint saves (its sub-folders): ``policy``, a trained helper."""
        return ("policy", self.helper) if self.trained and self.helper else ("policy",)

    @property
    def checkpoint_role(self) -> str:
        """The model of a training checkpoint that plays the helper (``envace.backends.models.resolve_model``'s role):
        its own sub-folder for a trained helper, else the checkpoint's policy."""
        return self.helper if self.trained and self.helper else "policy"

    def helpers(self, open_model: Callable[[str, str], Any]) -> dict[str, Any]:
        """The engine keywords of a rollout in this mode: ``{helper: open_model(helper, checkpoint_role)}``, or {}."""
        return {} if self.helper is None else {self.helper: open_model(self.helper, self.checkpoint_role)}

    def build(self, name: str, policy: Backend, helpers: dict[str, Backend | None]) -> Observer:
        """The observer of a rollout in this mode (``name``), given the engine's helper keywords."""
        backend = helpers.get(self.helper) if self.helper else None
        if self.helper and backend is None:
            raise ValueError(f"mode {name!r} needs a backend for {self.rehearsed_by!r} ({self.helper}=...)")
        return self.observer(policy, backend)


MODES: Registry[RolloutMode] = Registry("rollout mode")
MODES.add(
    "rehearsal",
    RolloutMode(
        "the policy's own weights, in a Rehearse context of their own",
        lambda policy, helper: RehearseObserver(policy, policy),
    ),
)
MODES.add("real", RolloutMode("the task's real environment", lambda policy, helper: RealObserver(), needs_env=True))
MODES.add(
    "per_role",
    RolloutMode(
        "a second model of its own, trained on the Rehearse rows",
        lambda policy, helper: RehearseObserver(helper, policy),
        helper="rehearser",
        trained=True,
    ),
)
MODES.add(
    "simulator",
    RolloutMode(
        "a frozen external model, never trained", lambda policy, helper: SimulatorObserver(helper), helper="simulator"
    ),
)

__all__ = [
    "MODES",
    "Answer",
    "Observer",
    "RealObserver",
    "RehearseContext",
    "RehearseObserver",
    "RolloutMode",
    "SimulatorObserver",
]
