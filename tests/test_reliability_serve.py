"""``envace serve`` stays responsive (issue 32, items 1-3), on a real server on loopback over tiny-random: a long
request, streamed or not, does not hold back a short one sent after it (both run in one continuous batch); a request
whose client goes away stops generating at once; a body far beyond the context is refused before it is tokenized,
and tokenizing a body never stalls the other clients."""

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from envace.backends.hf import HFBackend
from envace.serving.serve import ServerConfig, fewest_tokens, longest_token, serving

CONTEXT = 8192  # tiny-random's


@pytest.fixture()
def live(tiny):
    """(server, its HFBackend): a fresh backend per test, so its stats count this test's tokens only."""
    model, tok = tiny
    backend = HFBackend(model, tok)
    with serving(backend, ServerConfig(model_name="tiny", context_length=CONTEXT)) as server:
        yield server, backend


def _until(cond, what, timeout=60.0):
    """Wait for ``cond()`` (a generous deadline: only a hang fails it)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def _post(url, path, body, timeout=120):
    return httpx.post(url + path, json=body, timeout=timeout, trust_env=False)


def _completion(prompt, max_tokens, stream=False):
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def _raw_post(url, path, body):
    """A POST on a raw socket (so the test decides when the client goes away); returns the socket."""
    u = urlsplit(url)
    data = json.dumps(body).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    head = f"POST {u.path}{path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
    s.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


# -- 1. head-of-line blocking ---------------------------------------------------------------------------------


@pytest.mark.parametrize("long_stream", [False, True])
def test_a_short_request_sent_while_a_long_one_generates_ends_first(live, long_stream):
    server, backend = live
    ended: list[str] = []
    answers: dict[str, httpx.Response] = {}

    def ask(name, body):
        answers[name] = _post(server.url, "/completions", body)
        ended.append(name)

    long = threading.Thread(target=ask, args=("long", _completion("a long story", 200, long_stream)))
    long.start()
    _until(lambda: backend.stats["decode_steps"] > 0, "the long request to generate")
    ask("short", _completion("short", 4))
    long.join(120)
    assert ended == ["short", "long"]
    assert answers["short"].json()["usage"]["completion_tokens"] == 4
    assert server.worker.stats["streams"] == 1  # the short one joined the long one's running batch
    if not long_stream:
        assert answers["long"].json()["usage"]["completion_tokens"] == 200  # it did not end early either


# -- 2. abandoned requests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_client_disconnects_mid_generation_stops_generating(live, stream):
    server, backend = live
    max_tokens = 2000
    s = _raw_post(server.url, "/completions", _completion("tell me everything", max_tokens, stream))
    _until(lambda: backend.stats["decode_steps"] > 5, "the request to generate")
    got = b""
    while stream and b"data: " not in got:  # the stream has begun
        got += s.recv(65536)
    s.close()
    _until(lambda: server.worker.stats["aborted"] + server.worker.stats["pieces"] * (not stream) > 0, "its end")
    assert server.worker.stats["aborted"] == 1
    assert backend.stats["generated_tokens"] < max_tokens / 4  # stopped soon after the client went away
    ok = _post(server.url, "/completions", _completion("next", 4))  # and the server goes on
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_a_request_abandoned_by_a_client_timeout_stops_generating(live):
    server, backend = live
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/completions",
            json=_completion("tell me everything", 2000),
            timeout=httpx.Timeout(30, read=0.5),
            trust_env=False,
        )
    _until(lambda: server.worker.stats["aborted"] + server.worker.stats["pieces"] > 0, "its end")
    assert server.worker.stats["aborted"] == 1 and backend.stats["generated_tokens"] < 500


# -- 3. huge bodies ---------------------------------------------------------------------------------------------


def test_fewest_tokens_bounds_the_token_count_from_below(tokenizer):
    longest = longest_token(tokenizer)
    assert longest is not None and longest >= len("<|im_start|>")
    for text in ["", "hello", "word " * 3000, "#" * 5000, "\n" + " " * 999, "héllo wörld 🙂" * 50]:
        assert fewest_tokens(len(text), longest) <= len(tokenizer.encode(text))
    assert fewest_tokens(10, None) == 0 and fewest_tokens(10, 3) == 4


@pytest.mark.parametrize("endpoint", ["/completions", "/chat/completions"])
def test_a_body_far_beyond_the_context_is_refused_before_it_is_tokenized(live, endpoint, monkeypatch):
    server, _ = live
    tokenized: list[int] = []
    encode, render = server.tokenizer.encode, server.fmt.render
    monkeypatch.setattr(
        server.tokenizer, "encode", lambda text, **kw: tokenized.append(len(text)) or encode(text, **kw)
    )
    monkeypatch.setattr(server.fmt, "render", lambda ms, **kw: tokenized.append(len(ms)) or render(ms, **kw))
    text = "word " * 1_000_000  # 5 MB: 1 M tokens
    body = {"prompt": text} if endpoint == "/completions" else {"messages": [{"role": "user", "content": text}]}
    r = _post(server.url, endpoint, {"model": "tiny", "max_tokens": 8} | body)
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == ("prompt" if endpoint == "/completions" else "messages")
    assert tokenized == []  # refused on its length alone


def test_health_answers_while_a_body_is_being_tokenized(live, monkeypatch):
    server, _ = live
    entered, release = threading.Event(), threading.Event()
    encode = server.tokenizer.encode

    def slow_encode(text, **kw):  # a tokenization that lasts until the test has seen /health answered
        entered.set()
        release.wait(30)
        return encode(text, **kw)

    monkeypatch.setattr(server.tokenizer, "encode", slow_encode)
    answer: dict[str, httpx.Response] = {}
    asking = threading.Thread(
        target=lambda: answer.setdefault("r", _post(server.url, "/completions", _completion("hi", 2)))
    )
    asking.start()
    assert entered.wait(30)
    try:
        health = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=20, trust_env=False)
        still_tokenizing = not release.is_set() and "r" not in answer
    finally:
        release.set()
        asking.join(60)
    assert health.json() == {"status": "ok"} and still_tokenizing
    assert answer["r"].status_code == 200
