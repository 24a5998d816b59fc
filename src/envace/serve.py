"""``envace serve``: an OpenAI-compatible HTTP server over any envace backend (HF by default).

    envace serve --model SmolLM2-135M-Instruct --port 8000          # http://127.0.0.1:8000/v1
    envace serve --model runs/train/checkpoints/latest-step/policy --served-model-name envace-8b --host 0.0.0.0

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``
(``prompt`` as text or as token ids, one prompt or a list; ``logprobs`` gives the sampled tokens' log-probs).
What a client of :class:`envace.backends.http.HTTPBackend` needs beyond OpenAI's API follows vLLM's extensions:
``top_k``, ``include_stop_str_in_output`` (default false: the stop string is cut from the text, as OpenAI does;
the token ids are never cut), ``return_token_ids`` (adds ``token_ids`` to each choice and ``prompt_token_ids``),
``return_tokens_as_token_ids`` (log-prob tokens spelled ``token_id:N``) and ``stop_reason`` (the stop string that
ended a choice, null for end-of-turn).

Every request is validated (JSON object, types and ranges, known model name, prompt + max_tokens within the
context) and errors are JSON ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.
Concurrent requests are batched: a single generation thread takes what arrived within ``batch_wait_s`` (up to
``max_batch`` prompts) and runs the prompts with equal sampling settings as one ``generate`` call; a request with
a ``seed`` runs alone, so its result does not depend on what else arrived.
"""
from __future__ import annotations

import json
import queue
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

from .backends.base import Backend, Generation, SamplingParams

MAX_BODY_BYTES = 16 << 20


class RequestError(Exception):
    """A request the server refuses (a 4xx answer)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind


# -- batching ----------------------------------------------------------------------------------------------


@dataclass
class _Job:
    prompt: list[int]
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None


class Batcher:
    """One generation thread: jobs that arrive within ``wait_s`` of each other (at most ``max_batch``) and share
    sampling settings run as one batch; a seeded job runs alone."""

    def __init__(self, backend: Backend, max_batch: int = 32, wait_s: float = 0.005):
        self.backend, self.max_batch, self.wait_s = backend, max_batch, wait_s
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self.batches = 0  # generate calls made (for tests / logs)
        self._thread = threading.Thread(target=self._run, name="envace-serve-generate", daemon=True)
        self._thread.start()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        jobs = [_Job(p, params) for p in prompts]
        for j in jobs:
            self._queue.put(j)
        for j in jobs:
            j.done.wait()
            if j.error is not None:
                raise j.error
        return [j.result for j in jobs]  # type: ignore[misc]

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs, stop = [first], False
            deadline = time.monotonic() + self.wait_s
            while len(jobs) < self.max_batch:
                try:
                    j = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if j is None:
                    stop = True
                    break
                jobs.append(j)
            groups: dict[Any, list[_Job]] = {}
            for j in jobs:
                p = j.params
                key = ("seeded", id(j)) if p.seed is not None else (p.temperature, p.top_p, p.top_k, p.max_new_tokens, tuple(p.stop))
                groups.setdefault(key, []).append(j)
            for group in groups.values():
                self.batches += 1
                try:
                    gens = self.backend.generate([j.prompt for j in group], group[0].params)
                    for j, g in zip(group, gens):
                        j.result = g
                except BaseException as e:  # noqa: BLE001 - handed to the waiting request, which answers 500
                    for j in group:
                        j.error = e
                for j in group:
                    j.done.set()
            if stop:
                return


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
    if not isinstance(v, bool):
        raise RequestError(f"'{key}' must be true or false, got {v!r}", key)
    return v


@dataclass
class ServerConfig:
    """What ``envace serve`` serves and its limits."""

    model_name: str
    default_max_tokens: int = 256
    """max_tokens of a request that names none."""
    max_tokens_limit: int = 4096
    context_length: int | None = None
    """prompt + max_tokens must fit (None: unchecked)."""
    max_batch: int = 32
    batch_wait_s: float = 0.005
    verbose: bool = False


class EnvaceServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], backend: Backend, cfg: ServerConfig):
        self.backend, self.cfg = backend, cfg
        self.tokenizer = backend.tokenizer
        self.batcher = Batcher(backend, cfg.max_batch, cfg.batch_wait_s)
        vocab = getattr(self.tokenizer, "__len__", None)
        self.vocab_size = len(self.tokenizer) if vocab else None
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def server_close(self) -> None:
        self.batcher.close()
        super().server_close()

    # -- the two generation endpoints ----------------------------------------------------------------------
    def sampling(self, body: dict[str, Any]) -> SamplingParams:
        if body.get("n", 1) != 1:
            raise RequestError("only n=1 is supported", "n")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else (stop or [])
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise RequestError("'stop' must be a non-empty string or a list of them", "stop")
        top_k = _integer(body, "top_k", 0, -1, 1 << 30)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        return SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            top_k=max(0, top_k or 0),
            max_new_tokens=_integer({"max_tokens": max_tokens}, "max_tokens", self.cfg.default_max_tokens, 1, self.cfg.max_tokens_limit) or 1,
            stop=stop,
            seed=_integer(body, "seed", None, -(1 << 63), (1 << 63) - 1),
        )

    def check_context(self, prompts: list[list[int]], params: SamplingParams, param: str) -> None:
        n = self.cfg.context_length
        for p in prompts:
            if not p:
                raise RequestError("the prompt is empty", param)
            if n is not None and len(p) + params.max_new_tokens > n:
                raise RequestError(f"prompt ({len(p)} tokens) + max_tokens ({params.max_new_tokens}) exceeds the model's context length ({n})", param)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        from .prompts import ChatFormat

        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise RequestError("'messages' must be a non-empty list", "messages")
        conv = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
                raise RequestError(f"messages[{i}] must be an object with role system, user, assistant or tool", f"messages[{i}].role")
            content = m.get("content") or ""
            if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                if not all(isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str) for c in content):
                    raise RequestError(f"messages[{i}].content parts must be text parts", f"messages[{i}].content")
                content = "".join(c["text"] for c in content)
            if not isinstance(content, str):
                raise RequestError(f"messages[{i}].content must be a string", f"messages[{i}].content")
            conv.append({"role": m["role"], "content": content})
        params = self.sampling(body)
        want_lp = _flag(body, "logprobs")
        include_stop = _flag(body, "include_stop_str_in_output")
        prompt = ChatFormat.for_tokenizer(self.tokenizer).render(conv, add_generation_prompt=True)
        self.check_context([prompt], params, "messages")
        g = self.batcher.generate([prompt], params)[0]
        text, stop_reason = _cut_stop(g, params.stop, include_stop)
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": _finish(g), "stop_reason": stop_reason, "logprobs": None}
        if want_lp:
            choice["logprobs"] = {"content": [{"token": self._token(t, False), "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in zip(g.token_ids, g.logprobs)]}
        if _flag(body, "return_token_ids"):
            choice["token_ids"] = list(g.token_ids)
        return self._envelope("chat.completion", "chatcmpl", [choice], [g])

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts = self._prompts(body.get("prompt"))
        params = self.sampling(body)
        n_lp = _integer(body, "logprobs", None, 0, 20)
        include_stop = _flag(body, "include_stop_str_in_output")
        as_ids = _flag(body, "return_tokens_as_token_ids")
        with_ids = _flag(body, "return_token_ids")
        if _flag(body, "echo"):
            raise RequestError("echo is not supported", "echo")
        self.check_context(prompts, params, "prompt")
        gens = self.batcher.generate(prompts, params)
        choices = []
        for i, (p, g) in enumerate(zip(prompts, gens)):
            text, stop_reason = _cut_stop(g, params.stop, include_stop)
            c: dict[str, Any] = {"index": i, "text": text, "finish_reason": _finish(g), "stop_reason": stop_reason, "logprobs": None}
            if n_lp is not None:
                toks = [self._token(t, as_ids) for t in g.token_ids]
                offsets, off = [], 0
                for t in toks:
                    offsets.append(off)
                    off += len(t)
                c["logprobs"] = {"tokens": toks, "token_logprobs": list(g.logprobs), "top_logprobs": None, "text_offset": offsets}
            if with_ids:
                c["token_ids"] = list(g.token_ids)
                c["prompt_token_ids"] = list(p)
            choices.append(c)
        return self._envelope("text_completion", "cmpl", choices, gens)

    # -- helpers -------------------------------------------------------------------------------------------
    def _prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise RequestError("'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt")
        out = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                out.append(self.tokenizer.encode(p, add_special_tokens=True))
            elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                if self.vocab_size is not None and any(t < 0 or t >= self.vocab_size for t in p):
                    raise RequestError(f"prompt[{i}] holds a token id outside [0, {self.vocab_size})", "prompt")
                out.append(list(p))
            else:
                raise RequestError(f"prompt[{i}] must be a string or a list of token ids", "prompt")
        return out

    def _token(self, t: int, as_id: bool) -> str:
        return f"token_id:{t}" if as_id else self.tokenizer.decode([t], skip_special_tokens=False)

    def _envelope(self, obj: str, prefix: str, choices: list[dict[str, Any]], gens: list[Generation]) -> dict[str, Any]:
        p, c = sum(g.prompt_tokens for g in gens), sum(len(g.token_ids) for g in gens)
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()), "model": self.cfg.model_name, "choices": choices, "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}


def _finish(g: Generation) -> str:
    return "length" if g.finish_reason == "length" else "stop"


def _cut_stop(g: Generation, stop: list[str], include: bool) -> tuple[str, str | None]:
    """(text, the stop string that ended it or None): OpenAI leaves the stop string out, vLLM can keep it."""
    if g.finish_reason != "stop":
        return g.text, None
    hits = [(g.text.find(s), s) for s in stop if s in g.text]
    if not hits:
        return g.text, None
    at, s = min(hits)
    return (g.text[: at + len(s)] if include else g.text[:at]), s


class _Handler(BaseHTTPRequestHandler):
    server: EnvaceServer
    protocol_version = "HTTP/1.1"
    server_version = "envace-serve"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/health":
            self._send(200, {"status": "ok"})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server.cfg.model_name, "object": "model", "created": 0, "owned_by": "envace"}]})
        else:
            self._error(404, f"no route GET {path}; routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions", kind="not_found_error")

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        routes: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"/v1/chat/completions": self.server.chat, "/v1/completions": self.server.completions}
        if path not in routes:
            self._discard_body()
            self._error(404, f"no route POST {path}; routes: POST /v1/chat/completions, POST /v1/completions", kind="not_found_error")
            return
        try:
            body = self._body()
            name = body.get("model")
            if name is not None and name != self.server.cfg.model_name:
                raise RequestError(f"model {name!r} is not served here; this server serves {self.server.cfg.model_name!r}", "model", 404, "not_found_error")
            self._send(200, routes[path](body))
        except RequestError as e:
            self._error(e.status, e.message, e.param, e.kind)
        except Exception as e:  # noqa: BLE001 - a generation failure is the server's error, answered as JSON
            self._error(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")

    def do_PUT(self) -> None:  # noqa: N802
        self._discard_body()
        self._error(405, "method not allowed", kind="invalid_request_error")

    do_DELETE = do_PATCH = do_PUT  # noqa: N815

    def _body(self) -> dict[str, Any]:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise RequestError("bad Content-Length header") from None
        if n <= 0:
            raise RequestError("the request has no JSON body")
        if n > MAX_BODY_BYTES:
            raise RequestError(f"the body exceeds {MAX_BODY_BYTES} bytes", status=413)
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    def _discard_body(self) -> None:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = 0
        if 0 < n <= MAX_BODY_BYTES:
            self.rfile.read(n)

    def _error(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.cfg.verbose:
            super().log_message(format, *args)


def make_server(backend: Backend, cfg: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> EnvaceServer:
    """A server bound to (host, port) (port 0: a free one; see ``.url``); call ``serve_forever()``."""
    return EnvaceServer((host, port), backend, cfg)


def load_backend(model: str, backend: str = "hf", device: str = "cpu", bf16: bool | str = False) -> tuple[Backend, int | None]:
    """(backend, context length) for ``envace serve``: ``hf`` loads ``model`` here (a name, a model or LoRA
    adapter folder, a training checkpoint / run folder: :func:`envace.models.load`); any other name in BACKENDS
    gets the model folder (:func:`envace.models.resolve_model`) and its defaults."""
    from .backends.base import BACKENDS

    if backend == "hf":
        from .backends.hf import HFBackend
        from .models import context_length, load

        m, tok = load(model, device=device)
        try:
            n: int | None = context_length(m, tok)
        except ValueError:
            n = None
        return HFBackend(m, tok, bf16=bf16), n
    if backend not in BACKENDS:
        import importlib

        try:
            importlib.import_module(f"envace.backends.{backend}")
        except ModuleNotFoundError:
            pass
    from .models import is_adapter, resolve_model

    path = resolve_model(model)
    if is_adapter(path):
        raise ValueError(f"backend {backend!r} needs a full model folder, and {path!r} is a LoRA adapter; serve it with --backend hf (which merges it into its base)")
    return BACKENDS.get(backend)(model=path), None


def serve(model: str, name: str | None = None, host: str = "127.0.0.1", port: int = 8000, backend: str = "hf", device: str = "cpu", bf16: bool | str = False, **limits: Any) -> None:
    """Load ``model`` and serve it until interrupted; prints the URL (with the real port) first."""
    be, n = load_backend(model, backend, device, bf16)
    cfg = ServerConfig(model_name=name or model, context_length=n, **limits)
    server = make_server(be, cfg, host, port)
    print(f"envace serve: {cfg.model_name!r} at {server.url} (POST /chat/completions, /completions; GET /models, /health)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("envace serve: stopped", file=sys.stderr)
    finally:
        server.server_close()
