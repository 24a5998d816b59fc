"""``envace serve`` and ``vllm serve`` answer the same ``openai`` client calls (issue 28, item 5).

Both serve conftest's ``small_folder`` (a random-init Llama, head size 64, float32) from subprocesses on loopback, one
of each per module, vLLM with hermes tool calling on. What must agree does, whatever the random model writes: the
model list; the reply's keys (envace's are a subset of vLLM's), roles, finish reasons and usage; ``n``; ``max_tokens``
(``length``, as many tokens as asked); streamed chunks that concatenate to the whole answer; one log-prob per token with
``top_logprobs=0``; an assistant ``tool_calls`` message and its ``tool`` answer in the history; a completion of a text
prompt; a refused request's error body (``message``, ``type``, ``param``, ``code``). Where the prompt is the same tokens
(a completion, a chat that opens with a system message) the greedy answers are the same text and log-probs.

Where they differ, asserted below so that a change on either side shows:

- a chat without a system message: vLLM renders the tokenizer's chat template, which adds SmolLM2's default system
  prompt; envace renders Act's ChatML, which adds none (the context a policy trained by envace saw);
- a chat with tools: envace writes them into the system message as Act's ``# Tools`` block and instructions; vLLM
  hands them to the chat template, and SmolLM2's drops them. So a hermes tool call's parse is not compared on model
  text: the two prompts differ, and a random model never writes ``<tool_call>`` (the parse of a call is tested on
  envace's side with a scripted backend, ``tests/test_serve.py``);
- requests (``DIFFERENCES``): envace refuses an unknown field, ``top_logprobs`` > 0 and a ``tool`` message that answers
  no call with a 400 naming the field, where vLLM ignores the field or answers; vLLM refuses ``n`` > 1 under greedy
  decoding, where envace (as OpenAI) answers equal choices; a refusal's ``type`` is OpenAI's
  ``invalid_request_error`` from envace, the exception's class name (``BadRequestError``) from vLLM.
"""

import httpx
import openai
import pytest

from envace.backends.vllm import vllm_probe
from numerics import assert_logprobs_close
from servers import WEATHER, envace_serve, vllm_serve

PROBE = vllm_probe()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not PROBE.runs, reason=f"vLLM cannot run here: {PROBE.problem}"),
]

NAME = "small"
SYSTEM = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
"""A chat both servers render as the same tokens (it opens with a system message)."""
FINISHES = {"stop", "length", "tool_calls"}


@pytest.fixture(scope="module")
def clients(small_folder):
    """{"vllm": client, "envace": client}: the official client of each live server."""
    vllm_args = ["--served-model-name", NAME, "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096"]
    vllm_args += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with (
        vllm_serve(small_folder, *vllm_args, env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as v,
        envace_serve("--model", small_folder, "--served-model-name", NAME, "--stream-segment-tokens", "3") as e,
    ):
        yield {
            k: openai.OpenAI(base_url=u, api_key="none", max_retries=0, timeout=120)
            for k, u in (("vllm", v), ("envace", e))
        }


def chat(clients, **kw) -> dict[str, dict]:
    """Each server's JSON answer to the same chat request, as it came over the wire."""
    return {
        k: c.chat.completions.with_raw_response.create(model=NAME, **kw).http_response.json()
        for k, c in clients.items()
    }


def check_reply(body: dict, n: int = 1, max_tokens: int | None = None, obj: str = "chat.completion") -> None:
    """An OpenAI reply: its keys, ``n`` choices in order, the assistant's role, a known finish reason, usage that
    adds up, and ``max_tokens`` honoured (a choice that ran out has exactly that many tokens)."""
    assert {"id", "object", "created", "model", "choices", "usage"} <= set(body)
    assert body["object"] == obj and body["model"] == NAME and [c["index"] for c in body["choices"]] == list(range(n))
    for c in body["choices"]:
        assert {"index", "finish_reason", "logprobs"} <= set(c) and c["finish_reason"] in FINISHES
        if obj == "chat.completion":
            assert c["message"]["role"] == "assistant" and "content" in c["message"]
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["prompt_tokens"] > 0
    if max_tokens is not None:
        assert u["completion_tokens"] <= n * max_tokens
        if all(c["finish_reason"] == "length" for c in body["choices"]):
            assert u["completion_tokens"] == n * max_tokens


def subset_keys(small: dict, big: dict, where: str = "") -> None:
    """Every key of envace's reply is in vLLM's, at every level of the first choice."""
    assert set(small) <= set(big), f"{where}: envace's {sorted(set(small) - set(big))} are not vLLM's"
    for k, v in small.items():
        if isinstance(v, dict) and isinstance(big.get(k), dict):
            subset_keys(v, big[k], f"{where}.{k}")


def test_both_list_the_served_model(clients):
    for c in clients.values():
        (m,) = c.models.list().data
        assert m.id == NAME and m.object == "model"


def test_a_greedy_chat_that_opens_with_a_system_message_is_the_same_answer_and_log_probs(clients):
    bodies = chat(clients, messages=SYSTEM, max_tokens=8, temperature=0, logprobs=True, top_logprobs=0)
    for b in bodies.values():
        check_reply(b, max_tokens=8)
        (c,) = b["choices"]
        assert c["finish_reason"] == "length" and not c["message"].get("tool_calls")
        assert len(c["logprobs"]["content"]) == 8 and all(x["top_logprobs"] == [] for x in c["logprobs"]["content"])
    v, e = bodies["vllm"], bodies["envace"]
    subset_keys(e["choices"][0], v["choices"][0], "choices[0]")
    assert e["usage"] == {k: v["usage"][k] for k in e["usage"]}  # the same prompt tokens, as many generated
    assert e["choices"][0]["message"]["content"] == v["choices"][0]["message"]["content"]
    assert [x["token"] for x in e["choices"][0]["logprobs"]["content"]] == [
        x["token"] for x in v["choices"][0]["logprobs"]["content"]
    ]
    assert_logprobs_close(
        [x["logprob"] for x in e["choices"][0]["logprobs"]["content"]],
        [x["logprob"] for x in v["choices"][0]["logprobs"]["content"]],
        rel=1e-4,
        elem=1e-4,
    )


def test_a_chat_with_tools_or_without_a_system_message_has_the_same_shape_but_another_prompt(clients):
    user = [{"role": "user", "content": "Weather in Paris?"}]
    tools = chat(clients, messages=user, tools=[WEATHER], max_tokens=6, temperature=0)
    plain = chat(clients, messages=user, max_tokens=6, temperature=0)
    for b in [*tools.values(), *plain.values()]:
        check_reply(b, max_tokens=6)
        (c,) = b["choices"]  # the random model writes no call: plain content on both
        assert c["finish_reason"] == "length" and isinstance(c["message"]["content"], str)
        assert not c["message"].get("tool_calls")
    subset_keys(tools["envace"]["choices"][0], tools["vllm"]["choices"][0], "choices[0]")
    prompt = {k: (tools[k]["usage"]["prompt_tokens"], plain[k]["usage"]["prompt_tokens"]) for k in tools}
    assert prompt["vllm"][0] == prompt["vllm"][1]  # SmolLM2's template drops the tools
    assert prompt["envace"][0] > prompt["envace"][1]  # Act's system message lists them
    assert prompt["vllm"][1] > prompt["envace"][1]  # the template's default system prompt


def test_n_choices_and_max_tokens(clients):
    for b in chat(clients, messages=SYSTEM, max_tokens=5, temperature=1.0, n=2).values():
        check_reply(b, n=2, max_tokens=5)
        a, b2 = (c["message"]["content"] for c in b["choices"])
        assert a != b2  # sampled apart


def test_streamed_chunks_concatenate_to_the_non_streamed_answer(clients):
    kw = dict(messages=SYSTEM, max_tokens=7, temperature=0)
    whole = chat(clients, **kw)
    texts = {}
    for k, c in clients.items():
        chunks = list(c.chat.completions.create(model=NAME, stream=True, stream_options={"include_usage": True}, **kw))
        assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        *answer, usage = chunks
        assert usage.choices == [] and usage.usage.completion_tokens == 7
        texts[k] = "".join(ch.choices[0].delta.content or "" for ch in answer)
        assert texts[k] == whole[k]["choices"][0]["message"]["content"]
        assert [ch.choices[0].finish_reason for ch in answer if ch.choices[0].finish_reason] == ["length"]
    assert texts["envace"] == texts["vllm"]


def test_an_assistant_tool_call_and_its_tool_answer_are_accepted_by_both(clients):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *SYSTEM,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    bodies = chat(clients, messages=messages, tools=[WEATHER], max_tokens=4, temperature=0)
    for b in bodies.values():
        check_reply(b, max_tokens=4)
    subset_keys(bodies["envace"]["choices"][0], bodies["vllm"]["choices"][0], "choices[0]")


def test_a_completion_of_a_text_prompt_is_the_same_greedy_text(clients):
    bodies = {
        k: c.completions.with_raw_response.create(
            model=NAME, prompt="Once upon a time", max_tokens=6, temperature=0
        ).http_response.json()
        for k, c in clients.items()
    }
    for b in bodies.values():
        check_reply(b, max_tokens=6, obj="text_completion")
        assert b["choices"][0]["finish_reason"] == "length"
    v, e = bodies["vllm"], bodies["envace"]
    subset_keys(e["choices"][0], v["choices"][0], "choices[0]")
    assert e["choices"][0]["text"] == v["choices"][0]["text"] and e["usage"] == {k: v["usage"][k] for k in e["usage"]}


USER = [{"role": "user", "content": "x"}]
DIFFERENCES = [  # (request, vLLM's status, envace's status, the param a refusal names)
    (dict(temperature=5), 400, 400, "temperature"),
    (dict(max_tokens=0), 400, 400, "max_tokens"),
    (dict(model="other"), 404, 404, "model"),
    (dict(extra_body={"frobnicate": 1}), 200, 400, "frobnicate"),  # vLLM ignores a field it does not know
    (dict(logprobs=True, top_logprobs=3), 200, 400, "top_logprobs"),  # envace gives the sampled token's only
    (  # vLLM does not check that a tool message answers a call
        dict(messages=[*USER, {"role": "tool", "tool_call_id": "call_9", "content": "{}"}]),
        200,
        400,
        "messages[1].tool_call_id",
    ),
    (dict(n=2, temperature=0), 400, 200, None),  # vLLM refuses n > 1 under greedy decoding; OpenAI answers
]


@pytest.mark.parametrize("kw,vllm_status,envace_status,param", DIFFERENCES)
def test_what_each_refuses_and_how(clients, kw, vllm_status, envace_status, param):
    for k, status in (("vllm", vllm_status), ("envace", envace_status)):
        request = {"model": NAME, "messages": USER, "max_tokens": 3} | kw
        if status == 200:
            assert clients[k].chat.completions.create(**request).choices
            continue
        with pytest.raises(openai.APIStatusError) as e:
            clients[k].chat.completions.create(**request)
        body = e.value.body
        assert e.value.status_code == status and set(body) == {"message", "type", "param", "code"}
        assert body["code"] == status and body["message"]
        if k == "envace":
            assert body["type"] == "invalid_request_error" and body["param"] == param and param in body["message"]
        else:
            assert body["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
            assert body["param"] == param


def test_both_answer_health(clients):
    for c in clients.values():
        assert httpx.get(str(c.base_url).removesuffix("/v1/") + "/health", trust_env=False).status_code == 200
