"""The generation backend protocol.

A backend generates completions for a batch of prompts given as token ids (so the rows a trainer sees hold
exactly the tokens that were sampled) and returns token ids with per-token log-probs. Backends that serve a
frozen model (an external simulator, an LLM judge, a user simulator) are also asked for plain chat replies
with :meth:`Backend.chat`.

``sessions`` lets a caller say that a prompt continues an earlier one (one Act or Rehearse context of one
trajectory): a backend may keep that context's KV cache and only encode the new tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..core.seeding import derive_seed
from ..core.types import Generation  # (defined in envace.core.types; still importable from here for one version)


@dataclass
class SamplingParams:
    """Sampling settings of one generation call."""

    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: only the most likely tokens whose probabilities add up to this are sampled (1.0: off)."""
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 256
    """Most tokens of one generation (one cut there ends with finish_reason ``length``)."""
    stop: list[str] = field(default_factory=list)
    """Generation stops after the first completed occurrence of any of these strings (it is kept in the output)."""
    seed: int | None = None
    """Seed of this call's sampling; with the same seed, prompts and weights a CPU backend is deterministic."""

    def with_(self, **kw: Any) -> "SamplingParams":
        return replace(self, **kw)

    def sampling_key(self) -> str:
        """Equal for settings that sample alike whatever their seed (requests that can share one draw)."""
        return repr(self.with_(seed=None))


@dataclass
class Request:
    """One generation of a stream (:meth:`Backend.generate_stream`): a prompt (token ids), its sampling settings
    (their ``seed`` is ignored: the stream has one), the context session it continues, and ``tag``, the caller's
    handle, handed back with the result."""

    prompt: list[int]
    params: SamplingParams
    session: str | None = None
    tag: Any = None
    cancelled: Callable[[], bool] | None = None
    """Asked between decode steps (``HFBackend``): once it returns True the request ends where it is, finish_reason
    "abort" (its client has gone: ``envace serve``). None: never cancelled."""


OnDone = Callable[[Request, Generation], Sequence[Request]]
"""Called as each request of a stream finishes; returns the follow-up requests, which join the stream."""

Poll = Callable[[], Sequence[Request]]
"""Called between the steps of a stream: the requests that arrived since (``envace serve``'s new clients), which
join."""


class BackendError(RuntimeError):
    """A backend could not produce a generation (server down, retries exhausted, ...)."""


class Backend(ABC):
    tokenizer: Any = None

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[list[int]],
        params: SamplingParams,
        sessions: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        """Generate one completion per prompt (token ids). All prompts step together in one batch."""

    streams: bool = False
    """True if :meth:`generate_stream` admits requests into a running batch (continuous batching); rollouts then
    let every trajectory advance as soon as its own generation is done instead of waiting for the batch."""

    def generate_stream(
        self, requests: Sequence[Request], on_done: OnDone, seed: int | None = None, poll: Poll | None = None
    ) -> None:
        """Run ``requests``, every follow-up ``on_done`` returns and every request ``poll`` hands in, until none is
        left.

        Default (backends without continuous batching): rounds of :meth:`generate`, one call per distinct sampling
        setting of the pending requests, call ``n`` of the stream seeded ``seed * 1_000_003 + n``; ``poll`` is
        asked before each round, and a cancelled request is not generated (it ends at once, "abort")."""
        pending, n = list(requests), 0
        while pending := pending + list(poll() if poll else []):
            groups: dict[str, list[Request]] = {}
            follow: list[Request] = []
            for r in pending:
                if r.cancelled is not None and r.cancelled():
                    follow += on_done(r, Generation([], [], "", "abort", prompt_tokens=len(r.prompt)))
                else:
                    groups.setdefault(r.params.sampling_key(), []).append(r)
            pending = follow
            for rs in groups.values():
                n += 1
                params = rs[0].params.with_(seed=None if seed is None else derive_seed(seed, n))
                for r, g in zip(rs, self.generate([r.prompt for r in rs], params, [r.session for r in rs])):
                    pending += on_done(r, g)

    def chat(self, conversations: Sequence[list[dict[str, str]]], params: SamplingParams) -> list[str]:
        """Reply to each chat (a list of ``{"role", "content"}``); default: apply the chat template, generate."""
        from ..chat.prompts import ChatFormat

        fmt = ChatFormat.for_tokenizer(self.tokenizer)
        prompts = [fmt.render(conv, add_generation_prompt=True) for conv in conversations]
        return [g.text for g in self.generate(prompts, params)]

    def release(self, sessions: Sequence[str]) -> None:
        """Forget kept caches of these sessions (no-op by default)."""

    def sync_weights(self, model: Any) -> None:
        """Load new policy weights (for backends that do not share the trainer's model object)."""


def __getattr__(name: str) -> Any:
    """``BACKENDS``, the second registry of backend factories, is gone: its entries took other arguments than the
    one registry that replaced it, :data:`envace.backends.loaders.LOADERS` (``open_backend``), so the old name
    says where to go instead of handing back something that cannot be called the old way."""
    if name == "BACKENDS":
        raise AttributeError(
            "envace.backends.base.BACKENDS is gone: models open through envace.backends.loaders.LOADERS / "
            "open_backend (entries take (model, /, device=, bf16=, **options))"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
