"""A scripted backend: a Python function decides each completion from the prompt text.

It returns real token ids of the tokenizer (and log-probs of 0), so everything downstream of generation —
rows, contexts, training masks — is exercised exactly as with a model. Used by tests and for scripted
baselines (e.g. a gold-action policy).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..chat.prompts import ChatFormat
from ..core.types import Generation
from .base import Backend, SamplingParams


class ScriptedBackend(Backend):
    def __init__(self, tokenizer: Any, respond: Callable[[str], str]):
        self.tokenizer = tokenizer
        self.respond = respond
        self.prompts: list[str] = []  # every prompt seen, decoded (for tests)
        self.end_id = ChatFormat.for_tokenizer(tokenizer).end_id  # the tokenizer's own end of turn

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, sessions: Sequence[str | None] | None = None
    ) -> list[Generation]:
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p, skip_special_tokens=False)
            self.prompts.append(text)
            reply = self.respond(text)
            ids = self.tokenizer.encode(reply, add_special_tokens=False)
            finish = "eos"
            if len(ids) >= params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], "length"
            else:
                ids = ids + [self.end_id]
            out.append(
                Generation(
                    token_ids=ids,
                    logprobs=[0.0] * len(ids),
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason=finish,
                    prompt_tokens=len(p),
                )
            )
        return out
