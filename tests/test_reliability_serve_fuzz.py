"""A fuzz and soak run of a live ``envace serve --model tiny-random`` on loopback (issue 32, item 9), bounded in count
and time: seeded random valid and invalid requests, clients that go away mid-request, concurrent streams. The
server stays up, answers every well-formed request (200, with every choice; a stream ends with ``[DONE]`` and holds
no error), refuses every malformed one with a 4xx and a JSON error (never a 5xx), and its memory comes back near
where it was once warm."""

import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from servers import envace_serve_process

ACTIONS = 100  # requests of the soak (about ten seconds on tiny-random)
THREADS = 8  # at once
VOCAB = 49152  # tiny-random's (the SmolLM2 tokenizer)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
WORDS = ["hello", "weather", "Paris", "tool", "<tool_call>", "é", "🙂", "\n", "{", '"', "\\", "<|im_end|>", "  "]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))


def _valid(rng: random.Random) -> tuple[str, dict, int]:
    """(path, a well-formed body, how many choices its answer has)."""
    common: dict = {"model": "tiny", "max_tokens": rng.randint(1, 4), "temperature": rng.choice([0, 0.7, 1.0])}
    common |= rng.choice([{}, {"stop": ["\n"]}, {"top_p": 0.9}, {"top_k": 5}, {"n": 2}, {"seed": rng.randint(0, 9)}])
    if rng.random() < 0.5:
        common |= {"stream": True} | rng.choice([{}, {"stream_options": {"include_usage": True}}])
    if rng.random() < 0.5:
        body = common | {"messages": [{"role": "user", "content": _text(rng)}]}
        body |= rng.choice([{}, {"tools": [WEATHER]}, {"logprobs": True}, {"return_token_ids": True}])
        return "/chat/completions", body, body.get("n", 1)
    prompt = rng.choice(
        [_text(rng), [rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))], [_text(rng), _text(rng)]]
    )
    body = common | {"prompt": prompt} | rng.choice([{}, {"logprobs": 0}, {"echo": False}])
    prompts = len(prompt) if isinstance(prompt, list) and isinstance(prompt[0], str) else 1
    return "/completions", body, body.get("n", 1) * prompts


BAD_FIELDS = [
    ("temperature", "hot"),
    ("temperature", -1),
    ("max_tokens", 0),
    ("max_tokens", "8"),
    ("max_tokens", 10**9),
    ("n", 0),
    ("n", 1.5),
    ("top_p", 0),
    ("stop", 123),
    ("stop", [""]),
    ("stream", "yes"),
    ("stream_options", {"include_usage": True}),  # without stream
    ("seed", "x"),
    ("frequency_penalty", 1),
    ("model", "someone-else"),
    ("frobnicate", 1),
    ("logit_bias", {"1": 5}),
]
BAD_MESSAGES = [
    [],
    "hi",
    [{"role": "robot", "content": "hi"}],
    [{"role": "user", "content": 5}],
    [{"role": "user"}],
    [{"role": "tool", "content": "x", "tool_call_id": "nope"}],
    [{"role": "user", "content": [{"type": "image_url"}]}],
    [{"role": "user", "content": "word " * 200_000}],  # beyond the context
]
BAD_PROMPTS = [[], [-1], [VOCAB + 5], {"a": 1}, [[1, 2], "x", 3], [True], "word " * 200_000]


def _invalid(rng: random.Random) -> tuple[str, str, bytes]:
    """(method, path, body) of a malformed request."""
    path, body, _ = _valid(rng)
    kind = rng.randrange(6)
    if kind == 0:
        key, value = rng.choice(BAD_FIELDS)
        body = body | {key: value}
        if key == "stream_options":
            body.pop("stream", None)
    elif kind == 1:
        path, body = "/chat/completions", body | {"messages": rng.choice(BAD_MESSAGES)}
        body.pop("prompt", None)
    elif kind == 2:
        path, body = "/completions", body | {"prompt": rng.choice(BAD_PROMPTS)}
        body.pop("messages", None)
    elif kind == 3:
        raw = rng.choice([b"", b"{", b"[1, 2]", b"null", b'"text"', bytes(rng.randrange(256) for _ in range(64))])
        return "POST", path, raw
    elif kind == 4:
        return rng.choice([("GET", path), ("POST", "/nowhere"), ("POST", "/health"), ("DELETE", "/models")]) + (b"",)
    else:
        body = {"tools": [{"type": "function", "function": {"name": ""}}], "tool_choice": "required"} | body
        path = "/chat/completions"
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
        body.pop("prompt", None)
    return "POST", path, json.dumps(body).encode()


def _check_answer(r: httpx.Response, body: dict, choices: int) -> None:
    assert r.status_code == 200, (body, r.status_code, r.text[:300])
    if not body.get("stream"):
        assert len(r.json()["choices"]) == choices, body
        return
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", body
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), (body, r.text[:300])
    assert {c["index"] for ch in chunks for c in ch["choices"] if c.get("finish_reason")} == set(range(choices))


def _check_refusal(r: httpx.Response, what: tuple) -> None:
    assert 400 <= r.status_code < 500, (what, r.status_code, r.text[:300])
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["code"] == r.status_code, what


def _walk_away(url: str, rng: random.Random) -> None:
    """A client that goes away: mid-body, right after its request, or once its answer has begun."""
    path, body, _ = _valid(rng)
    when = rng.randrange(3)
    body |= {"max_tokens": rng.randint(20, 200)} | ({"stream": True} if when == 2 else {})
    data = json.dumps(body).encode()
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        head = f"POST {u.path}{path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(data)}\r\n\r\n"
        s.sendall(head.encode() + (data[: len(data) // 2] if when == 0 else data))
        if when == 2:
            s.recv(1)
        else:
            time.sleep(rng.random() * 0.2)


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the server's memory from /proc")
def test_the_server_survives_random_valid_invalid_and_abandoned_requests_and_its_memory_settles():
    rng = random.Random(32)
    with (
        envace_serve_process(
            "--model", "tiny-random", "--served-model-name", "tiny", "--stream-segment-tokens", "4"
        ) as (
            url,
            proc,
        ),
        httpx.Client(base_url=url, timeout=120, trust_env=False) as client,
    ):
        plans = [(rng.random(), random.Random(rng.random())) for _ in range(ACTIONS)]

        def act(plan):
            p, r = plan
            if p < 0.45:
                path, body, choices = _valid(r)
                _check_answer(client.post(path, json=body), body, choices)
            elif p < 0.9:
                method, path, raw = _invalid(r)
                ok = client.request(method, path, content=raw, headers={"content-type": "application/json"})
                _check_refusal(ok, (method, path, raw[:200]))
            else:
                _walk_away(url, r)
            return p

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(act, plans[:24]))  # warm: caches, allocator pools, the parse thread
            baseline = _rss_mb(proc.pid)
            list(pool.map(act, plans[24:]))
        assert client.get(url.removesuffix("/v1") + "/health").json() == {"status": "ok"} and proc.poll() is None
        path, body, choices = _valid(random.Random(0))
        _check_answer(client.post(path, json=body), body, choices)  # still answering
        settled = _rss_mb(proc.pid)
    assert settled < baseline * 1.5 + 100, (baseline, settled)  # generous: no growth with the requests served
