"""HTTP: a live ``envace serve`` (tiny model, loopback) answers chat and token-level completions like the local
backend; the client's errors are clear and bounded for a stopped server, a slow server and bad requests; retries
recover from a transient 503 and wait what a Retry-After asks; connections are kept alive; the concurrency limit
holds; without vLLM's extensions the client sends only OpenAI's fields."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envace.backends.base import BackendError, SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.http import HTTPBackend
from envace.chat.prompts import ChatFormat
from numerics import assert_logprobs_close
from servers import envace_serve


@pytest.fixture(scope="module")
def served():
    """``envace serve --model tiny-random --port 0`` in a subprocess: its /v1 URL."""
    with envace_serve("--model", "tiny-random", "--served-model-name", "tiny") as url:
        yield url


def _post(url, body, raw=None):
    req = urllib.request.Request(
        url,
        data=raw if raw is not None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_served_model_answers_chat_and_token_completions_like_the_local_backend(served, tiny):
    model, tok = tiny
    client = HTTPBackend(served, tokenizer=tok, timeout=60)
    assert client.model == "tiny"  # from GET /v1/models
    texts = client.chat(
        [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "list the tools"}]],
        SamplingParams(temperature=0.7, max_new_tokens=6, seed=3),
    )
    assert len(texts) == 2 and all(isinstance(t, str) and t for t in texts)
    fmt = ChatFormat.for_tokenizer(tok)
    prompts = [fmt.render([{"role": "user", "content": c}]) for c in ("check my balance", "transfer 5 to bob")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    remote, local = client.generate(prompts, greedy), HFBackend(model, tok).generate(prompts, greedy)
    for r, g in zip(remote, local):  # the same tokens, the same log-probs (up to batching numerics)
        assert r.token_ids == g.token_ids and r.finish_reason == g.finish_reason and r.prompt_tokens == g.prompt_tokens
        assert_logprobs_close(r.logprobs, g.logprobs)
        assert r.text == g.text
    assert client.stats["generated_tokens"] >= 16 and client.stats["retries"] == 0


def test_server_validates_requests_and_answers_json_errors(served, tokenizer):
    base = served
    status, body = _post(base + "/completions", None, raw=b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = _post(base + "/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and body["error"]["param"] == "model"
    status, body = _post(base + "/chat/completions", {"messages": []})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = _post(base + "/completions", {"prompt": [1, 2], "n": 0})
    assert status == 400 and body["error"]["param"] == "n"
    status, body = _post(base + "/completions", {"prompt": [10**9]})
    assert status == 400 and "token id" in body["error"]["message"]
    status, body = _post(base + "/completions", {"prompt": [1, 2], "max_tokens": 10**6})
    assert status == 400 and body["error"]["param"] == "max_tokens"
    status, body = _post(base + "/nowhere", {})
    assert status == 404 and "routes" in body["error"]["message"]
    with urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}
    status, body = _post(
        base + "/completions",
        {"prompt": "Hi", "max_tokens": 3, "logprobs": 0, "return_token_ids": True, "stop": ["\n"]},
    )
    assert status == 200 and len(body["choices"][0]["token_ids"]) == len(
        body["choices"][0]["logprobs"]["token_logprobs"]
    )
    # a client error is not retried: BackendError at once, with the server's message
    t0 = time.perf_counter()
    with pytest.raises(BackendError, match="HTTP 404.*not served here"):
        HTTPBackend(base, model="other", max_retries=3, backoff=1.0).chat(
            [[{"role": "user", "content": "x"}]], SamplingParams(max_new_tokens=2)
        )
    assert time.perf_counter() - t0 < 1.0


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stopped_server_raises_backend_error_after_bounded_retries():
    client = HTTPBackend(f"http://127.0.0.1:{_free_port()}/v1", model="m", timeout=1.0, max_retries=2, backoff=0.05)
    t0 = time.perf_counter()
    with pytest.raises(BackendError, match=r"failed after 3 attempt\(s\).*cannot connect"):
        client.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2))
    assert time.perf_counter() - t0 < 3.0 and client.stats["retries"] == 2 and client.stats["failures"] == 1


class _Stub(ThreadingHTTPServer):
    """A loopback HTTP/1.1 server whose handler is a function of (request number) -> (delay s, status, body[,
    headers]); it records each request's JSON body and counts the connections it accepted."""

    daemon_threads = True

    def __init__(self, answer):
        self.answer, self.n, self.inflight, self.max_inflight, self.lock = answer, 0, 0, 0, threading.Lock()
        self.bodies, self.connections = [], 0
        super().__init__(("127.0.0.1", 0), _StubHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def process_request(self, request, client_address):
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_POST(self):  # noqa: N802
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        s = self.server
        with s.lock:
            s.n += 1
            k = s.n
            s.inflight += 1
            s.max_inflight = max(s.max_inflight, s.inflight)
            s.bodies.append(json.loads(raw))
        delay, status, body, *headers = s.answer(k)
        time.sleep(delay)
        with s.lock:
            s.inflight -= 1
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers[0] if headers else {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            self.close_connection = True

    def log_message(self, *a):
        pass


CHAT_OK = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


def test_slow_server_times_out_with_backend_error():
    stub = _Stub(lambda k: (3.0, 200, CHAT_OK))
    client = HTTPBackend(stub.url, model="m", timeout=0.4, max_retries=1, backoff=0.05)
    t0 = time.perf_counter()
    with pytest.raises(BackendError, match=r"failed after 2 attempt\(s\).*no answer within 0.4s"):
        client.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2))
    assert time.perf_counter() - t0 < 2.5 and stub.n == 2
    stub.shutdown()


def test_transient_503_is_retried_and_then_answered():
    stub = _Stub(lambda k: (0.0, 503, {"error": {"message": "warming up"}}) if k == 1 else (0.0, 200, CHAT_OK))
    client = HTTPBackend(stub.url, model="m", max_retries=2, backoff=0.01)
    assert client.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2)) == ["ok"]
    assert client.stats["retries"] == 1 and stub.n == 2
    stub.shutdown()


def test_concurrency_limit_bounds_requests_in_flight():
    stub = _Stub(lambda k: (0.2, 200, CHAT_OK))
    client = HTTPBackend(stub.url, model="m", max_concurrency=2)
    assert (
        client.chat([[{"role": "user", "content": str(i)}] for i in range(6)], SamplingParams(max_new_tokens=2))
        == ["ok"] * 6
    )
    assert stub.max_inflight == 2 and stub.n == 6
    stub.shutdown()


def test_a_429_with_retry_after_is_retried_after_the_asked_wait_and_a_long_one_is_not_waited_for():
    stub = _Stub(
        lambda k: (
            (0.0, 429, {"error": {"message": "slow down"}}, {"Retry-After": "1"}) if k == 1 else (0.0, 200, CHAT_OK)
        )
    )
    client = HTTPBackend(stub.url, model="m", max_retries=2, backoff=0.01)
    t0 = time.perf_counter()
    assert client.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2)) == ["ok"]
    assert 1.0 <= time.perf_counter() - t0 < 3.0 and stub.n == 2  # the backoff alone would have waited ~0.01 s
    stub.shutdown()
    stub = _Stub(lambda k: (0.0, 503, {"error": {"message": "maintenance"}}, {"Retry-After": "3600"}))
    client = HTTPBackend(stub.url, model="m", max_retries=3, backoff=0.01, max_retry_after=5)
    t0 = time.perf_counter()
    with pytest.raises(
        BackendError,
        match=r"failed after 1 attempt\(s\).*HTTP 503: maintenance.*retry after 3600s, more than max_retry_after 5s",
    ):
        client.chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2))
    assert time.perf_counter() - t0 < 1.0 and stub.n == 1
    stub.shutdown()


def test_retry_after_reads_seconds_and_http_dates():
    from datetime import datetime, timezone

    from envace.backends.http import retry_after

    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert retry_after("2", now) == 2.0 and retry_after(" 0.5 ", now) == 0.5 and retry_after("-3", now) == 0.0
    assert (
        retry_after("Wed, 01 Jan 2025 12:00:30 GMT", now) == 30.0
        and retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now) == 0.0
    )
    assert retry_after(None, now) is None and retry_after("soon", now) is None


def test_sequential_requests_reuse_one_kept_alive_connection():
    stub = _Stub(lambda k: (0.0, 200, CHAT_OK))
    client = HTTPBackend(stub.url, model="m")
    for i in range(4):
        assert client.chat([[{"role": "user", "content": str(i)}]], SamplingParams(max_new_tokens=2)) == ["ok"]
    assert stub.n == 4 and stub.connections == 1
    client.close()
    stub.shutdown()


OPENAI_CHAT_FIELDS = {"model", "messages", "temperature", "top_p", "max_tokens", "stop", "seed"}
OPENAI_COMPLETION_FIELDS = {"model", "prompt", "logprobs", "temperature", "top_p", "max_tokens", "stop", "seed"}


def test_without_vllm_extensions_the_client_sends_only_openai_fields():
    gen_ok = {
        "choices": [
            {
                "index": 0,
                "text": "ok",
                "token_ids": [5],
                "logprobs": {"token_logprobs": [-0.5]},
                "finish_reason": "stop",
            }
        ],
        "usage": {},
    }
    stub = _Stub(lambda k: (0.0, 200, CHAT_OK if k == 1 else gen_ok))
    sampling = SamplingParams(max_new_tokens=2, top_k=5, stop=["\n"], seed=1)
    HTTPBackend(stub.url, model="m", vllm_extensions=False).chat([[{"role": "user", "content": "x"}]], sampling)
    HTTPBackend(stub.url, model="m", vllm_extensions=False).generate([[1, 2]], sampling)
    assert set(stub.bodies[0]) == OPENAI_CHAT_FIELDS and set(stub.bodies[1]) == OPENAI_COMPLETION_FIELDS
    HTTPBackend(stub.url, model="m").chat(
        [[{"role": "user", "content": "x"}]], sampling
    )  # on (the default): vLLM's fields too
    assert set(stub.bodies[2]) - OPENAI_CHAT_FIELDS == {"top_k", "include_stop_str_in_output"}
    stub.shutdown()


def test_a_strict_server_accepts_every_field_the_client_sends(served, tokenizer):
    """envace serve refuses unknown fields: both client modes' requests (chat and token generation) pass."""
    sampling = SamplingParams(temperature=0.5, top_p=0.9, top_k=5, max_new_tokens=3, stop=["\n\n"], seed=2)
    for ext in (True, False):
        client = HTTPBackend(served, tokenizer=tokenizer, vllm_extensions=ext)
        assert len(client.chat([[{"role": "user", "content": "hi"}]], sampling)) == 1
    gens = HTTPBackend(served, tokenizer=tokenizer).generate([[1, 2, 3]], sampling)
    assert len(gens[0].token_ids) == len(gens[0].logprobs) >= 1
