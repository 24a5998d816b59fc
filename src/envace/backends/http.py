"""A frozen model behind an OpenAI-compatible HTTP server (``envace serve``, vLLM's ``vllm serve``, ...).

For everything that uses a model without training it: the external simulator (``TrainConfig.simulator_model:
http://host:8000/v1``), an LLM judge, a user simulator, test-time rehearsal and evaluation of served models::

    from envace.backends.http import HTTPBackend
    judge = HTTPBackend("http://127.0.0.1:8000/v1", timeout=60, max_retries=3, max_concurrency=8)
    judge.chat([[{"role": "user", "content": "..."}]], SamplingParams(temperature=0))

- :meth:`HTTPBackend.chat` posts each conversation to ``/v1/chat/completions``.
- :meth:`HTTPBackend.generate` posts each token-id prompt to ``/v1/completions`` (``prompt`` as a list of token
  ids, ``logprobs``) and needs the completion's token ids back: it asks with vLLM's extensions
  (``return_token_ids``, ``return_tokens_as_token_ids``), which ``envace serve`` and vLLM honour; a server that
  returns neither raises :class:`BackendError` (there is no silent re-tokenisation of the text).
- ``vllm_extensions`` (default on) also sends ``top_k`` and ``include_stop_str_in_output`` (the Backend protocol
  keeps the stop string in the output); turn it off for servers that reject unknown fields (OpenAI itself):
  stop strings are then cut from the text by the server.

Reliability: requests go through one keep-alive connection pool (``httpx.Client``, at most ``max_concurrency``
connections). Each request has a ``timeout`` (seconds without a byte from the server), is retried on connection
errors, timeouts and HTTP 408/425/429/5xx up to ``max_retries`` times with exponential backoff (``backoff`` *
2^attempt, capped at ``max_backoff``, with jitter), never on other 4xx (a bad request stays bad). A 429 or 503 that
says ``Retry-After`` (seconds or an HTTP date) is retried after that long instead; one asking for more than
``max_retry_after`` seconds is not waited for (the error says what the server asked). When retries are exhausted
a :class:`BackendError` says what failed, where, and how often it was tried. At most ``max_concurrency`` requests
of one backend are in flight, across threads. ``sessions`` are ignored (servers cache prefixes themselves).
Proxies from the environment are honoured except for loopback addresses. :meth:`HTTPBackend.close` closes the
connections.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import httpx

from ..core.types import Generation
from .base import Backend, BackendError, SamplingParams

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
RETRY_AFTER_STATUS = {429, 503}


class _Retryable(Exception):
    """A failure worth another attempt (connection refused/reset, timeout, 429, 5xx); ``wait``: how long the
    server asked to wait first (Retry-After), or None."""

    def __init__(self, message: str, wait: float | None = None):
        super().__init__(message)
        self.wait = wait


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (a number of seconds or an HTTP date; a past date is 0), or
    None if it is missing or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


class HTTPBackend(Backend):
    """An OpenAI-compatible server as a :class:`Backend` (frozen weights: ``sync_weights`` is an error)."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        tokenizer: Any = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        max_concurrency: int = 8,
        api_key: str | None = None,
        vllm_extensions: bool = True,
        max_retry_after: float = 60.0,
    ):
        """``base_url``: the server's root or its ``/v1`` (``http://127.0.0.1:8000`` and ``.../v1`` both work).
        ``model``: the served model name (None: the first of ``GET /v1/models``, asked on first use).
        ``tokenizer``: a tokenizer object or a model name for :func:`envace.backends.models.load_tokenizer`; only needed
        where callers build token prompts (e.g. a rollout policy), not for ``chat``. ``api_key``: sent as a
        bearer token (default: ``$ENVACE_API_KEY``, else ``$OPENAI_API_KEY``, else none). ``vllm_extensions``:
        send vLLM's request fields (module docstring); off for servers that refuse unknown fields.
        ``max_retry_after``: the longest ``Retry-After`` waited for."""
        if timeout <= 0 or max_retries < 0 or max_concurrency < 1:
            raise ValueError("timeout > 0, max_retries >= 0 and max_concurrency >= 1 are required")
        url = base_url.rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self._model = model
        if isinstance(tokenizer, str):
            from .models import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        self._tokenizer = tokenizer
        self.timeout, self.max_retries, self.backoff, self.max_backoff = (
            float(timeout),
            int(max_retries),
            float(backoff),
            float(max_backoff),
        )
        self.max_retry_after = float(max_retry_after)
        self.max_concurrency = int(max_concurrency)
        self.vllm_extensions = vllm_extensions
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()
        key = api_key if api_key is not None else os.environ.get("ENVACE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            **({"Authorization": f"Bearer {key}"} if key else {}),
        }
        loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        self._client = httpx.Client(
            headers=self._headers, timeout=httpx.Timeout(self.timeout), limits=limits, trust_env=not loopback
        )
        self.stats = {
            "requests": 0,
            "retries": 0,
            "failures": 0,
            "prompt_tokens": 0,
            "generated_tokens": 0,
            "cached_tokens": 0,
            "forward_calls": 0,
        }

    # -- the Backend protocol ------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer, for callers that build token prompts (a rollout policy; ``chat`` needs
        none): the one given, else found on first use by the served model's name (``GET /v1/models``)."""
        if self._tokenizer is None:
            self._tokenizer = served_tokenizer(self.model)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    @property
    def model(self) -> str:
        if self._model is None:
            data = self._call("GET", "/models", None).get("data") or []
            if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                raise BackendError(f"{self.base_url}/models lists no model; pass model=... explicitly")
            self._model = str(data[0]["id"])
        return self._model

    def chat(self, conversations: Sequence[list[dict[str, str]]], params: SamplingParams) -> list[str]:
        bodies = [
            {"model": self.model, "messages": list(conv), **self._sampling(params, i)}
            for i, conv in enumerate(conversations)
        ]
        outs = self._map(lambda b: self._call("POST", "/chat/completions", b), bodies)
        texts = []
        for o in outs:
            msg = self._choice(o, "/chat/completions").get("message") or {}
            texts.append(msg.get("content") or "")
            self._count(o)
        return texts

    def generate(
        self, prompts: Sequence[list[int]], params: SamplingParams, sessions: Sequence[str | None] | None = None
    ) -> list[Generation]:
        ext = {"return_token_ids": True, "return_tokens_as_token_ids": True} if self.vllm_extensions else {}
        bodies = [
            {"model": self.model, "prompt": list(p), "logprobs": 0, **self._sampling(params, i), **ext}
            for i, p in enumerate(prompts)
        ]
        outs = self._map(lambda b: self._call("POST", "/completions", b), bodies)
        return [self._generation(o, list(p), params) for o, p in zip(outs, prompts)]

    def sync_weights(self, model: Any) -> None:
        raise BackendError(
            f"{self.base_url} serves a frozen model: an HTTP backend cannot "
            "receive trainer weights (use rollout_backend hf or vllm for training)"
        )

    def release_all(self) -> None:
        """Nothing is kept client-side."""

    def close(self) -> None:
        """Close the kept-alive connections (a later request opens new ones)."""
        self._client.close()

    # -- requests ------------------------------------------------------------------------------------------
    def _sampling(self, p: SamplingParams, index: int) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_new_tokens}
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = (p.seed + index) % (2**63)  # one seed per prompt of the call
        if self.vllm_extensions:
            body["include_stop_str_in_output"] = True
            if p.top_k > 0:
                body["top_k"] = p.top_k
        return body

    def _map(
        self, fn: Callable[[dict[str, Any]], dict[str, Any]], bodies: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        if len(bodies) <= 1:
            return [fn(b) for b in bodies]
        with ThreadPoolExecutor(
            max_workers=min(len(bodies), self.max_concurrency), thread_name_prefix="envace-http"
        ) as pool:
            return list(pool.map(fn, bodies))

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """One request with bounded retries; a dict from the server's JSON, or BackendError."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        url = self.base_url + path
        failures: list[str] = []
        wait: float | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(
                    wait
                    if wait is not None
                    else min(self.max_backoff, self.backoff * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                )
                with self._lock:
                    self.stats["retries"] += 1
            try:
                with self._slots:
                    with self._lock:
                        self.stats["requests"] += 1
                    return self._once(method, url, data)
            except _Retryable as e:
                failures.append(str(e))
                wait = e.wait
                if wait is not None and wait > self.max_retry_after:
                    failures[-1] += (
                        f" (the server asks to retry after {wait:g}s, more "
                        f"than max_retry_after {self.max_retry_after:g}s)"
                    )
                    break
        with self._lock:
            self.stats["failures"] += 1
        raise BackendError(
            f"{method} {url} failed after {len(failures)} attempt(s) (timeout {self.timeout:g}s each): {failures[-1]}"
            + (f"; earlier: {'; '.join(sorted(set(failures[:-1])))}" if len(failures) > 1 else "")
        )

    def _once(self, method: str, url: str, data: bytes | None) -> dict[str, Any]:
        try:
            resp = self._client.request(method, url, content=data)
        except httpx.TimeoutException:
            raise _Retryable(f"no answer within {self.timeout:g}s") from None
        except httpx.ConnectError as e:
            raise _Retryable(f"cannot connect ({e})") from None
        except httpx.TransportError as e:  # reset, remote closed, torn response
            raise _Retryable(f"connection failed ({type(e).__name__}: {e})") from None
        raw = resp.content
        if resp.status_code >= 400:
            msg = _error_message(raw, resp.reason_phrase)
            if resp.status_code in RETRY_STATUS:
                wait = retry_after(resp.headers.get("Retry-After")) if resp.status_code in RETRY_AFTER_STATUS else None
                raise _Retryable(f"HTTP {resp.status_code}: {msg}", wait) from None
            raise BackendError(f"{method} {url}: HTTP {resp.status_code}: {msg}") from None
        try:
            out = json.loads(raw)
        except ValueError:
            raise BackendError(f"{method} {url}: the answer is not JSON: {raw[:200]!r}") from None
        if not isinstance(out, dict):
            raise BackendError(f"{method} {url}: the answer is not a JSON object: {raw[:200]!r}")
        return out

    # -- answers -------------------------------------------------------------------------------------------
    def _choice(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        choices = out.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise BackendError(f"{self.base_url}{path}: the answer has no choices: {json.dumps(out)[:300]}")
        return choices[0]

    def _count(self, out: dict[str, Any]) -> None:
        usage = out.get("usage") or {}
        with self._lock:
            self.stats["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
            self.stats["generated_tokens"] += int(usage.get("completion_tokens") or 0)

    def _generation(self, out: dict[str, Any], prompt: list[int], params: SamplingParams) -> Generation:
        c = self._choice(out, "/completions")
        lp = c.get("logprobs") or {}
        ids = c.get("token_ids")
        if (
            ids is None
            and isinstance(lp.get("tokens"), list)
            and all(isinstance(t, str) and t.startswith("token_id:") for t in lp["tokens"])
        ):
            ids = [int(t.split(":", 1)[1]) for t in lp["tokens"]]
        if ids is None:
            raise BackendError(
                f"{self.base_url}/completions returned no completion token ids: "
                "token-level generation needs a server that honours return_token_ids or "
                "return_tokens_as_token_ids (envace serve, vLLM with vllm_extensions on)"
            )
        logprobs = lp.get("token_logprobs")
        if not isinstance(logprobs, list) or len(logprobs) != len(ids) or any(x is None for x in logprobs):
            raise BackendError(
                f"{self.base_url}/completions returned log-probs {str(logprobs)[:100]} "
                f"for {len(ids)} tokens (one number per completion token is needed)"
            )
        text = c.get("text") or ""
        reason = c.get("finish_reason")
        if reason == "length":
            finish = "length"
        elif "stop_reason" in c:  # vLLM / envace serve: the matched stop string, or null / a token id for end-of-turn
            finish = "stop" if isinstance(c["stop_reason"], str) else "eos"
        else:
            finish = "stop" if any(s in text for s in params.stop) else "eos"
        self._count(out)
        return Generation(
            token_ids=[int(t) for t in ids],
            logprobs=[float(x) for x in logprobs],
            text=text,
            finish_reason=finish,
            prompt_tokens=len(prompt),
        )


def _error_message(raw: bytes, reason: str) -> str:
    """The message of an error answer: its JSON ``error.message``, else its start, else the status's reason."""
    try:
        err = json.loads(raw).get("error")
        return str(err.get("message") if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        return raw[:300].decode("utf-8", "replace") or reason


def served_tokenizer(name: str) -> Any:
    """The local tokenizer of the served model ``name`` (a model name or folder); a ValueError that says how to
    name one where there is none."""
    from .models import ModelNotFoundError, load_tokenizer

    try:
        return load_tokenizer(name)
    except ModelNotFoundError as e:
        raise ValueError(
            f"backend http: no local tokenizer for the served model {name!r} ({e}); "
            "set backend_options.tokenizer to its model name or folder"
        ) from None
