"""``envace serve``: an OpenAI-compatible HTTP server (Starlette on uvicorn) over any envace backend (HF by default).

    envace serve --model SmolLM2-135M-Instruct --port 8000          # http://127.0.0.1:8000/v1
    envace serve --model runs/train/checkpoints/latest-step/policy --served-model-name envace-8b --host 0.0.0.0

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``
(``prompt`` as text or as token ids, one prompt or a list).

Chat: the messages are rendered with :class:`envace.chat.prompts.ChatFormat` as Act sees them; ``tools`` (OpenAI
function tools) go into the system message the way Act's are (as the chat template renders ``tools=`` where Act's
are, ``RolloutConfig.native_tools`` at its default), assistant ``tool_calls`` and ``tool`` messages are
Act's ``<tool_call>`` blocks and observations, and a reply that is a well-formed call of one of the tools comes back
as ``tool_calls`` with finish_reason ``tool_calls`` (:mod:`envace.chat.openai_api`). ``tool_choice``: ``auto`` or
``none``; ``required`` and a named function are refused (400): the output is not constrained. The ``<think>`` blocks
of assistant messages before the last user message are dropped where the chat template drops them (Qwen3's) and
kept otherwise, as Act's context holds them (``ServerConfig.thinking_history``).

Both endpoints: ``stream`` (Server-Sent Events in OpenAI's chunk format, ending ``data: [DONE]``;
``stream_options.include_usage`` adds a usage chunk), ``n``, ``stop``, ``seed``, ``max_tokens`` (chat also
``max_completion_tokens``), ``temperature``, ``top_p`` and log-probs (chat ``logprobs: true``, completions
``logprobs: 0``): the sampled token's log-prob under the temperature-scaled distribution, the number the trainer
recomputes. The backend gives no alternatives, so ``top_logprobs`` > 0 (chat) and ``logprobs`` > 0 (completions)
are refused, naming the field. What :class:`envace.backends.http.HTTPBackend` needs beyond OpenAI's API follows
vLLM's extensions: ``top_k``, ``include_stop_str_in_output`` (default false: the stop string is cut from the text,
as OpenAI does; the token ids are never cut), ``return_token_ids`` (adds ``token_ids`` to each choice, and
``prompt_token_ids``), ``return_tokens_as_token_ids`` (log-prob tokens spelled ``token_id:N``) and ``stop_reason``
(the stop string that ended a choice, null otherwise).

Strict requests: a field not in :data:`CHAT_FIELDS` / :data:`COMPLETION_FIELDS` is a 400 naming it, never ignored;
OpenAI fields that would change the output and cannot be honoured here (penalties, ``logit_bias``, ``echo``,
``suffix``, ``best_of``, ``response_format`` other than text, ``parallel_tool_calls: false``) are accepted only at
their no-op value (:data:`NO_OP_ONLY`). Every request is validated (JSON object, types and ranges, known model
name, prompt + max_tokens within the context) and errors are JSON ``{"error": {"message", "type", "param",
"code"}}`` with a 4xx/5xx status.

Generation: one :class:`~envace.backends.worker.GenerationWorker` thread owns the backend; concurrent requests join
its running continuous-batching stream at its next decode step, whatever is running, streamed or not (a seeded
request runs alone, so its result does not depend on what else is running: it waits for the running requests, and
later ones wait for it). A request whose client goes away (disconnects, times out) is cancelled: its generation
stops at the next decode step. A body is decoded, validated and tokenized on a parse thread, never on the event
loop, and a prompt whose length in characters alone cannot fit the context is refused before it is tokenized
(:func:`fewest_tokens`).

Streaming: with a backend that has ``streams`` (HF), a streamed request is generated in pieces of
``stream_segment_tokens`` and each piece's new text is sent when it ends; with any other backend the text comes in
one chunk at the end. Text that may yet turn out to be part of a stop string (or, with tools, of a
``<tool_call>`` block, and trailing whitespace before one) is held back until it is known not to be, so the
chunks always concatenate to the non-streamed content; a reply's tool calls come in one chunk at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..backends.base import Backend, SamplingParams
from ..backends.worker import GenerationWorker, Job, Update
from ..chat.openai_api import RequestError, act_messages, openai_tool_calls, parses_calls, reply, tool_specs
from ..chat.parsing import tool_format_for
from ..chat.prompts import with_thinking_history
from ..core.types import Generation, ToolCall

MAX_BODY_BYTES = 16 << 20
ROUTES = "GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions"

COMMON_FIELDS = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "n",
        "stop",
        "seed",
        "max_tokens",
        "temperature",
        "top_p",
        "user",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "top_k",
        "include_stop_str_in_output",
        "return_token_ids",
        "return_tokens_as_token_ids",  # vLLM's extensions
    }
)
CHAT_FIELDS = COMMON_FIELDS | {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "top_logprobs",
    "max_completion_tokens",
    "response_format",
}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "suffix", "best_of"}


def _zero(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0)


NO_OP_ONLY: dict[str, tuple[Callable[[Any], bool], str]] = {
    "frequency_penalty": (_zero, "0"),
    "presence_penalty": (_zero, "0"),
    "logit_bias": (lambda v: v is None or v == {}, "{}"),
    "echo": (lambda v: v is None or v is False, "false"),
    "suffix": (lambda v: v is None or v == "", "null"),
    "best_of": (lambda v: v is None or (v == 1 and not isinstance(v, bool)), "1"),
    "response_format": (lambda v: v is None or v == {"type": "text"}, '{"type": "text"}'),
    "parallel_tool_calls": (lambda v: v is None or v is True, "true"),
    "top_logprobs": (_zero, "0: the backend gives only the sampled token's log-prob"),
}
"""Fields accepted only at the value that changes nothing: field -> (check, the accepted value)."""


class GenerationFailed(Exception):
    """The backend failed while generating a request (a 500 answer)."""


# -- request validation ------------------------------------------------------------------------------------


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or v > hi or (lo_open and v == lo):
        raise RequestError(f"'{key}' must be a number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}", key)
    return float(v)


def _integer(body: dict[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or v > hi:
        raise RequestError(f"'{key}' must be an integer in [{lo}, {hi}], got {v!r}", key)
    return v


def _flag(body: dict[str, Any], key: str) -> bool:
    v = body.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RequestError(f"'{key}' must be true or false, got {v!r}", key)
    return v


def check_fields(body: dict[str, Any], known: frozenset[str], endpoint: str) -> None:
    """Refuse a field this endpoint does not know (400 naming it) and a no-op-only field set to something else."""
    unknown = sorted(set(body) - known)
    if unknown:
        raise RequestError(
            f"unsupported field(s) {', '.join(map(repr, unknown))} "
            f"for {endpoint}; supported: {', '.join(sorted(known))}",
            unknown[0],
        )
    for key, (ok, accepted) in NO_OP_ONLY.items():
        if key in body and not ok(body[key]):
            raise RequestError(
                f"'{key}' = {json.dumps(body[key])[:80]} is not supported by this server (accepted: {accepted})", key
            )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError("'user' must be a string", "user")


@dataclass
class ServerConfig:
    """What ``envace serve`` serves and its limits."""

    model_name: str
    default_max_tokens: int = 256
    """max_tokens of a request that names none."""
    max_tokens_limit: int = 4096
    context_length: int | None = None
    """prompt + max_tokens must fit (None: unchecked)."""
    max_n: int = 16
    """Most choices (``n``) one request may ask for."""
    batch_wait_s: float = 0.005
    """How long the first request to an idle server waits for others to start with it."""
    stream_segment_tokens: int = 16
    """A streamed request's text is sent every this many tokens (backends with ``streams``; each piece costs a
    one-token prefill). 0: at the end."""
    verbose: bool = False
    thinking_history: str | None = None
    """How a chat's earlier thinking is rendered (``envace.chat.prompts.THINKING_HISTORY``): ``strip`` drops the
    ``<think>`` block of the assistant messages before the last user message, ``keep`` keeps it; None: as the chat
    template does (``ChatFormat.drops_thinking``), which is the rollout's default too."""


@dataclass
class GenRequest:
    """A validated generation request of either endpoint."""

    prompts: list[list[int]]
    params: SamplingParams
    n: int
    stream: bool
    usage_chunk: bool
    logprobs: bool
    as_ids: bool
    include_stop: bool
    with_ids: bool
    tools: list[str] | None = None
    """Names of the tools whose calls replies are parsed for (None: replies are plain text)."""


def streamable(text: str, holds: Sequence[str], hold_space: bool = False) -> str:
    """The prefix of a partial generation's ``text`` that is sure to begin its final text: ``text`` up to the
    first complete ``holds`` string, less any end that is the start of one of them (a stop string, the tool-call
    tag), less a trailing undecodable character (half of a UTF-8 sequence) and, with ``hold_space``, trailing
    whitespace (a call reply's content is stripped before its first tag)."""
    cut = min((i for i in (text.find(h) for h in holds if h) if i >= 0), default=len(text))
    text = text[:cut]
    keep = len(text)
    for h in holds:
        for k in range(min(len(h) - 1, len(text)), 0, -1):
            if text.endswith(h[:k]):
                keep = min(keep, len(text) - k)
                break
    text = text[:keep].rstrip("\ufffd")
    return text.rstrip() if hold_space else text


def longest_token(tokenizer: Any) -> int | None:
    """The most characters one token of ``tokenizer`` spells (its longest vocabulary entry, added tokens included:
    byte-level BPE spells each byte as one character, SentencePiece a space as one), or None where the vocabulary
    cannot be listed."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError, TypeError):
        return None
    return max(map(len, vocab), default=0) or None


def fewest_tokens(chars: int, token_chars: int | None) -> int:
    """The fewest tokens a text of ``chars`` characters can take when no token spells more than ``token_chars``
    of them (0 where that is unknown: no bound)."""
    return -(-chars // token_chars) if token_chars else 0


async def _until_gone(request: Request) -> None:
    """Return once the client of ``request`` (whose body has been read) has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def cut_stop(g: Generation, stop: list[str], include: bool) -> tuple[str, str | None]:
    """(text, the stop string that ended it or None): OpenAI leaves the stop string out, vLLM can keep it."""
    if g.finish_reason != "stop":
        return g.text, None
    hits = [(g.text.find(s), s) for s in stop if s and s in g.text]
    if not hits:
        return g.text, None
    at, s = min(hits)
    return (g.text[: at + len(s)] if include else g.text[:at]), s


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


async def _read_body(request: Request) -> bytes:
    """The request's body, refused (413) past :data:`MAX_BODY_BYTES` as soon as it is known to be."""
    n = request.headers.get("content-length")
    if n is not None:
        if not n.isdigit():
            raise RequestError("bad Content-Length header")
        if int(n) > MAX_BODY_BYTES:
            raise RequestError(f"the body exceeds {MAX_BODY_BYTES} bytes", status=413)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise RequestError(f"the body exceeds {MAX_BODY_BYTES} bytes", status=413)
    return bytes(raw)


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object (a 400 for anything else)."""
    if not raw:
        raise RequestError("the request has no JSON body")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return body


class EnvaceServer:
    """The served backend: request validation, generation through its worker, OpenAI-shaped answers; ``app`` is
    the Starlette app (run it with :meth:`run`, or :func:`serving` in a background thread)."""

    def __init__(self, backend: Backend, cfg: ServerConfig):
        from ..chat.prompts import ChatFormat

        self.backend, self.cfg = backend, cfg
        self.tokenizer = backend.tokenizer
        try:
            self.fmt: Any = ChatFormat.for_tokenizer(self.tokenizer)
        except (ValueError, AttributeError) as e:  # completions still work
            self.fmt, self._no_chat = None, str(e)
        self.native_tools = self.fmt is not None and self.fmt.uses_native_tools(True)  # as the rollout's default
        self.thinking_history = self.fmt.thinking_history(cfg.thinking_history) if self.fmt is not None else "keep"
        self.tools = tool_format_for(self.tokenizer)  # how the model writes calls (as the rollout chooses it)
        self.vocab_size = len(self.tokenizer) if hasattr(self.tokenizer, "__len__") else None
        self.token_chars = longest_token(self.tokenizer)
        self._parser = ThreadPoolExecutor(1, thread_name_prefix="envace-parse")  # bodies are tokenized here
        self.worker = GenerationWorker(backend, cfg.batch_wait_s)
        self.url: str | None = None
        self._socket: socket.socket | None = None
        self._uvicorn: Any = None
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
            ],
            exception_handlers={
                RequestError: self._request_error,
                GenerationFailed: self._generation_failed,
                HTTPException: self._http_error,
            },
        )

    # -- endpoints -----------------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        if not self.worker.alive:
            return _error(503, "the generation worker has stopped", kind="server_error")
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.cfg.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "envace",
                        "max_model_len": self.cfg.context_length,
                    }
                ],
            }
        )

    async def chat(self, request: Request) -> Response:
        return await self._answer(await self._parsed(request, self.parse_chat), request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._answer(await self._parsed(request, self.parse_completion), request, chat=False)

    async def _parsed(self, request: Request, parse: Callable[[dict[str, Any]], GenRequest]) -> GenRequest:
        """The request's body, read here, then decoded, validated and tokenized on the parse thread: never on the
        event loop, which meanwhile goes on serving the other clients."""
        raw = await _read_body(request)
        return await asyncio.get_running_loop().run_in_executor(self._parser, lambda: parse(self._body(raw)))

    def _body(self, raw: bytes) -> dict[str, Any]:
        body = json_object(raw)
        name = body.get("model")
        if name is not None and name != self.cfg.model_name:
            raise RequestError(
                f"model {name!r} is not served here; this server serves {self.cfg.model_name!r}",
                "model",
                404,
            )
        return body

    # -- validation ----------------------------------------------------------------------------------------
    def sampling(self, body: dict[str, Any]) -> SamplingParams:
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else ([] if stop is None else stop)
        if not isinstance(stop, list) or len(stop) > 16 or not all(isinstance(s, str) and s for s in stop):
            raise RequestError("'stop' must be a non-empty string or a list of at most 16 of them", "stop")
        top_k = _integer(body, "top_k", 0, -1, 1 << 30)
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        return SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            top_k=max(0, top_k or 0),
            max_new_tokens=_integer(body, key, self.cfg.default_max_tokens, 1, self.cfg.max_tokens_limit) or 1,
            stop=stop,
            seed=_integer(body, "seed", None, -(1 << 63), (1 << 63) - 1),
        )

    def _check_chars(self, chars: int, params: SamplingParams, param: str) -> None:
        """Refuse, before tokenizing it, a prompt of ``chars`` characters that cannot fit the context (a 400), by
        the fewest tokens it can be (:func:`fewest_tokens`): a 5 MB body is not tokenized to be refused."""
        n, least = self.cfg.context_length, fewest_tokens(chars, self.token_chars)
        if n is not None and least + params.max_new_tokens > n:
            raise RequestError(
                f"'{param}': the prompt ({chars} characters: at least {least} tokens) + "
                f"max_tokens ({params.max_new_tokens}) exceeds the model's context length ({n})",
                param,
            )

    def _request(
        self,
        body: dict[str, Any],
        params: SamplingParams,
        prompts: list[list[int]],
        param: str,
        logprobs: bool,
        tools: list[str] | None = None,
    ) -> GenRequest:
        n = self.cfg.context_length
        for p in prompts:
            if not p:
                raise RequestError(f"'{param}': the prompt is empty", param)
            if n is not None and len(p) + params.max_new_tokens > n:
                raise RequestError(
                    f"'{param}': the prompt ({len(p)} tokens) + max_tokens "
                    f"({params.max_new_tokens}) exceeds the model's context length ({n})",
                    param,
                )
        opts = body.get("stream_options")
        stream = _flag(body, "stream")
        if opts is not None and (not stream or not isinstance(opts, dict) or set(opts) - {"include_usage"}):
            raise RequestError(
                "'stream_options' must be {\"include_usage\": true|false}, with stream: true", "stream_options"
            )
        return GenRequest(
            prompts=prompts,
            params=params,
            n=_integer(body, "n", 1, 1, self.cfg.max_n) or 1,
            stream=stream,
            usage_chunk=_flag(opts or {}, "include_usage"),
            logprobs=logprobs,
            as_ids=_flag(body, "return_tokens_as_token_ids"),
            include_stop=_flag(body, "include_stop_str_in_output"),
            with_ids=_flag(body, "return_token_ids"),
            tools=tools,
        )

    def parse_chat(self, body: dict[str, Any]) -> GenRequest:
        check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
        if self.fmt is None:
            raise RequestError(f"this model has no chat format ({self._no_chat}); use /v1/completions", "messages")
        params = self.sampling(body)
        specs = tool_specs(body.get("tools"))
        parse = parses_calls(body.get("tool_choice"), specs)
        messages = act_messages(body.get("messages"), specs, self.tools, tool_list=not self.native_tools)
        messages = with_thinking_history(messages, self.thinking_history)  # earlier thinking, as Act's context has it
        self._check_chars(sum(len(m.content) for m in messages), params, "messages")
        prompt = self.fmt.render(messages, add_generation_prompt=True, tools=specs if self.native_tools else None)
        return self._request(
            body, params, [prompt], "messages", _flag(body, "logprobs"), [s.name for s in specs] if parse else None
        )

    def parse_completion(self, body: dict[str, Any]) -> GenRequest:
        check_fields(body, COMPLETION_FIELDS, "/v1/completions")
        lp = body.get("logprobs")
        if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or lp != 0):
            raise RequestError(
                "'logprobs' must be 0 (the sampled tokens' log-probs; "
                f"the backend gives no alternatives) or null, got {lp!r}",
                "logprobs",
            )
        params = self.sampling(body)
        return self._request(body, params, self._prompts(body.get("prompt"), params), "prompt", lp is not None)

    def _prompts(self, prompt: Any, params: SamplingParams) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise RequestError(
                "'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt"
            )
        out = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                self._check_chars(len(p), params, "prompt")
                out.append(self.tokenizer.encode(p, add_special_tokens=True))
            elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                if self.vocab_size is not None and any(t < 0 or t >= self.vocab_size for t in p):
                    raise RequestError(f"prompt[{i}] holds a token id outside [0, {self.vocab_size})", "prompt")
                out.append(list(p))
            else:
                raise RequestError(f"prompt[{i}] must be a string or a list of token ids", "prompt")
        return out

    # -- generation ----------------------------------------------------------------------------------------
    async def _updates(self, req: GenRequest, request: Request) -> AsyncIterator[Update]:
        """Every update of the request's sequences (prompt i's choice j is sequence i * n + j), until all are done.
        The job is cancelled as soon as the client goes away (the backend then stops generating it) or stops
        reading the updates."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Update] = asyncio.Queue()
        job = Job(
            [p for p in req.prompts for _ in range(req.n)],
            req.params,
            lambda u: loop.call_soon_threadsafe(queue.put_nowait, u),
            segment=self.cfg.stream_segment_tokens if req.stream else 0,
        )
        try:
            self.worker.submit(job)
        except RuntimeError as e:
            raise RequestError(str(e), status=503, kind="server_error") from None
        left = len(job.prompts)
        watch = asyncio.ensure_future(_until_gone(request))
        watch.add_done_callback(lambda w: w.cancelled() or setattr(job, "cancelled", True))
        try:
            while left:
                u = await queue.get()
                if u.error is not None:
                    raise GenerationFailed(f"generation failed: {u.error}")
                left -= u.done
                yield u
        finally:
            watch.cancel()
            if left:
                job.cancelled = True

    async def _answer(self, req: GenRequest, request: Request, chat: bool) -> Response:
        if req.stream:
            return StreamingResponse(
                self._sse(req, request, chat),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        gens: dict[int, Generation] = {}
        async for u in self._updates(req, request):
            if u.done and u.generation is not None:
                gens[u.index] = u.generation
        out = [gens[k] for k in range(len(gens))]
        choices = [
            self._chat_choice(k, g, req) if chat else self._completion_choice(k, g, req) for k, g in enumerate(out)
        ]
        return JSONResponse(
            self._envelope("chat.completion" if chat else "text_completion", "chatcmpl" if chat else "cmpl", choices)
            | {"usage": self._usage(req, out)}
        )

    def _final(self, g: Generation, req: GenRequest) -> tuple[str | None, list[ToolCall], str, str | None]:
        """(content, tool calls, finish_reason, stop_reason) of a finished choice (completions: no tools, so the
        content is the text)."""
        text, stop_reason = cut_stop(g, req.params.stop, req.include_stop)
        content, calls = reply(text, req.tools, self.tools)
        finish = "length" if g.finish_reason == "length" else ("tool_calls" if calls else "stop")
        return content, calls, finish, stop_reason

    def _chat_choice(self, k: int, g: Generation, req: GenRequest) -> dict[str, Any]:
        content, calls, finish, stop_reason = self._final(g, req)
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = openai_tool_calls(calls)
        c: dict[str, Any] = {
            "index": k,
            "message": msg,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "logprobs": self._chat_logprobs(g.token_ids, g.logprobs, req),
        }
        if req.with_ids:
            c["token_ids"], c["prompt_token_ids"] = list(g.token_ids), list(req.prompts[k // req.n])
        return c

    def _completion_choice(self, k: int, g: Generation, req: GenRequest) -> dict[str, Any]:
        text, _, finish, stop_reason = self._final(g, req)
        c: dict[str, Any] = {
            "index": k,
            "text": text,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "logprobs": self._completion_logprobs(g.token_ids, g.logprobs, req, 0),
        }
        if req.with_ids:
            c["token_ids"], c["prompt_token_ids"] = list(g.token_ids), list(req.prompts[k // req.n])
        return c

    def _token(self, t: int, as_id: bool) -> str:
        return f"token_id:{t}" if as_id else self.tokenizer.decode([t], skip_special_tokens=False)

    def _chat_logprobs(self, ids: list[int], lps: list[float], req: GenRequest) -> dict[str, Any] | None:
        if not req.logprobs:
            return None
        toks = [self._token(t, req.as_ids) for t in ids]
        return {
            "content": [
                {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")), "top_logprobs": []}
                for s, lp in zip(toks, lps)
            ]
        }

    def _completion_logprobs(
        self, ids: list[int], lps: list[float], req: GenRequest, offset: int
    ) -> dict[str, Any] | None:
        if not req.logprobs:
            return None
        toks = [self._token(t, req.as_ids) for t in ids]
        offsets = []
        for t in toks:
            offsets.append(offset)
            offset += len(t)
        return {"tokens": toks, "token_logprobs": list(lps), "top_logprobs": None, "text_offset": offsets}

    def _envelope(
        self, obj: str, prefix: str, choices: list[dict[str, Any]], rid: str | None = None, created: int | None = None
    ) -> dict[str, Any]:
        return {
            "id": rid or f"{prefix}-{uuid.uuid4().hex}",
            "object": obj,
            "created": created or int(time.time()),
            "model": self.cfg.model_name,
            "choices": choices,
        }

    def _usage(self, req: GenRequest, gens: list[Generation]) -> dict[str, int]:
        p, c = sum(len(x) for x in req.prompts), sum(len(g.token_ids) for g in gens)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    async def _sse(self, req: GenRequest, request: Request, chat: bool) -> AsyncIterator[str]:
        """The streamed answer: per choice, the text as it becomes sure (see :func:`streamable`), its tool calls
        and finish reason at the end; with each text chunk the log-probs (and token ids) of the tokens since the
        last."""
        obj, prefix = ("chat.completion.chunk", "chatcmpl") if chat else ("text_completion", "cmpl")
        rid, created = f"{prefix}-{uuid.uuid4().hex}", int(time.time())

        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            data = json.dumps(self._envelope(obj, prefix, choices, rid, created) | extra, ensure_ascii=False)
            return f"data: {data}\n\n"

        k_all = len(req.prompts) * req.n
        holds = [s for s in req.params.stop if s] + (list(self.tools.openers) if req.tools else [])
        sent_text, sent_toks, offsets = [0] * k_all, [0] * k_all, [0] * k_all
        done: dict[int, Generation] = {}
        if chat:
            yield event(
                [
                    {"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                    for k in range(k_all)
                ]
            )
        try:
            async for u in self._updates(req, request):
                k, g = u.index, u.generation
                assert g is not None
                if u.done:
                    content, calls, finish, stop_reason = self._final(g, req)
                    text = content or ""
                else:
                    text, calls = streamable(g.text, holds, hold_space=bool(req.tools)), []
                new_text, ids, lps = text[sent_text[k] :], g.token_ids[sent_toks[k] :], g.logprobs[sent_toks[k] :]
                if new_text or ids:
                    c: dict[str, Any] = {"index": k, "finish_reason": None}
                    if chat:
                        c |= {"delta": {"content": new_text}, "logprobs": self._chat_logprobs(ids, lps, req)}
                    else:
                        c |= {"text": new_text, "logprobs": self._completion_logprobs(ids, lps, req, offsets[k])}
                        offsets[k] += sum(len(self._token(t, req.as_ids)) for t in ids) if req.logprobs else 0
                    if req.with_ids:
                        c["token_ids"] = list(ids)
                    yield event([c])
                    sent_text[k], sent_toks[k] = len(text), len(g.token_ids)
                if u.done:
                    done[k] = g
                    if calls:
                        tc = [dict(c, index=j) for j, c in enumerate(openai_tool_calls(calls))]
                        yield event(
                            [{"index": k, "delta": {"tool_calls": tc}, "logprobs": None, "finish_reason": None}]
                        )
                    end: dict[str, Any] = {
                        "index": k,
                        "finish_reason": finish,
                        "stop_reason": stop_reason,
                        "logprobs": None,
                    }
                    end |= {"delta": {}} if chat else {"text": ""}
                    yield event([end])
            if req.usage_chunk:
                yield event([], usage=self._usage(req, [done[k] for k in sorted(done)]))
        except (GenerationFailed, RequestError) as e:  # after the answer began: an error event, then the end
            code, kind = (e.status, e.kind) if isinstance(e, RequestError) else (500, "server_error")
            yield f"data: {json.dumps({'error': {'message': str(e), 'type': kind, 'param': None, 'code': code}})}\n\n"
        yield "data: [DONE]\n\n"

    # -- errors --------------------------------------------------------------------------------------------
    async def _request_error(self, request: Request, e: Exception) -> Response:
        assert isinstance(e, RequestError)
        return _error(e.status, e.message, e.param, e.kind)

    async def _generation_failed(self, request: Request, e: Exception) -> Response:
        return _error(500, str(e), kind="server_error")

    async def _http_error(self, request: Request, e: Exception) -> Response:
        assert isinstance(e, HTTPException)
        what = {404: "no route", 405: "method not allowed:"}.get(e.status_code, str(e.detail))
        return _error(e.status_code, f"{what} {request.method} {request.url.path}; routes: {ROUTES}")

    # -- running -------------------------------------------------------------------------------------------
    def bind(self, host: str = "127.0.0.1", port: int = 8000) -> str:
        """Listen on (host, port) (port 0: a free one); returns the ``http://host:port/v1`` URL, which clients can
        use at once (connections wait in the backlog until :meth:`run` serves them)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            raise ValueError(f"cannot listen on {host}:{port}: {e}") from None
        sock.listen(1024)
        self._socket = sock
        bound = sock.getsockname()[1]
        self.url = f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{bound}/v1"
        return self.url

    def run(self) -> None:
        """Serve on the bound socket until SIGINT/SIGTERM (in the main thread) or :meth:`stop`."""
        import uvicorn
        from uvicorn.config import LOGGING_CONFIG

        if self._socket is None:
            raise RuntimeError("bind() the server first")
        log = copy.deepcopy(LOGGING_CONFIG)
        log["handlers"]["access"]["stream"] = "ext://sys.stderr"  # stdout is the server's own (its URL)
        config = uvicorn.Config(
            self.app,
            log_config=log,
            log_level="info" if self.cfg.verbose else "warning",
            access_log=self.cfg.verbose,
            timeout_graceful_shutdown=5,
            lifespan="off",
        )
        self._uvicorn = uvicorn.Server(config)
        self._uvicorn.run(sockets=[self._socket])

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    def close(self) -> None:
        """Stop serving and stop the worker (after its running stream)."""
        self.stop()
        self.worker.close()
        self._parser.shutdown(wait=False)
        if self._socket is not None:
            self._socket.close()


@contextlib.contextmanager
def serving(backend: Backend, cfg: ServerConfig, host: str = "127.0.0.1", port: int = 0) -> Iterator[EnvaceServer]:
    """``backend`` served from a background thread of this process (tests, notebooks): yields the server (``.url``,
    ``.worker``) once it accepts requests; stops it on exit."""
    server = EnvaceServer(backend, cfg)
    server.bind(host, port)
    thread = threading.Thread(target=server.run, name="envace-serve", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (server._uvicorn is not None and server._uvicorn.started):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        yield server
    finally:
        server.stop()
        thread.join(30)
        server.close()


def context_of(backend: Backend) -> int | None:
    """The context length of a backend's model (prompt + completion tokens), or None where it cannot be told."""
    from ..backends.models import context_length

    model = getattr(backend, "model", None)
    if not hasattr(model, "config"):
        return None
    try:
        return context_length(model, backend.tokenizer)
    except ValueError:
        return None


def serve(cfg: Any) -> None:
    """``envace serve``: load ``cfg.model`` (:class:`envace.config.ServeConfig`) with its backend
    (:func:`envace.backends.loaders.open_backend`) and serve it until interrupted; prints the URL (with the real
    port) first."""
    from ..backends.loaders import open_backend

    backend = open_backend(
        cfg.model,
        cfg.backend,
        {"max_batch": cfg.max_batch} if cfg.backend == "hf" else None,
        device=cfg.device,
        bf16=cfg.bf16,
    )
    scfg = ServerConfig(
        model_name=cfg.served_model_name or cfg.model,
        default_max_tokens=cfg.default_max_tokens,
        max_tokens_limit=cfg.max_tokens_limit,
        context_length=context_of(backend),
        batch_wait_s=cfg.batch_wait_ms / 1000,
        stream_segment_tokens=cfg.stream_segment_tokens,
        verbose=cfg.verbose,
        thinking_history=cfg.thinking_history,
    )
    server = EnvaceServer(backend, scfg)
    url = server.bind(cfg.host, cfg.port)
    print(
        f"envace serve: {scfg.model_name!r} at {url} (POST /chat/completions, /completions; GET /models, /health)",
        flush=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        print("envace serve: stopped", file=sys.stderr)
