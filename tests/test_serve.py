"""``envace serve`` through the official ``openai`` client: a live ``envace serve --model tiny-random`` (a subprocess on
loopback) answers chat like the local backend, streams chunks that concatenate to the non-streamed answer, refuses
bad and unknown fields with a 400 naming them, answers concurrent requests as it answers them one at a time, and
gives a seeded request the same tokens whatever else runs. Tool calls go through a scripted backend served by the same
app in this process: rendered into the prompt exactly as Act sees them, parsed back into ``tool_calls``, a malformed
or unknown call returned as plain content. Below the HTTP layer: the generation worker's batching and the pure pieces
(prompt rendering, reply parsing, what a stream may send yet)."""

import json
import threading
import time

import openai
import pytest

from envace.backends.base import Backend, SamplingParams
from envace.backends.hf import HFBackend
from envace.backends.scripted import ScriptedBackend
from envace.backends.worker import STOP_WINDOW, GenerationWorker, Job, first_stop
from envace.chat.openai_api import RequestError, act_messages, reply
from envace.chat.prompts import ACT_INSTRUCTIONS, ChatFormat, act_system, render_tools
from envace.serving.serve import ServerConfig, serving, streamable
from envace.core.types import Generation, Message, Task, ToolCall, ToolSpec
from numerics import assert_logprobs_close
from servers import WEATHER, envace_serve

# the subprocess server streams every 3 tokens: a 24-token answer comes in 8 pieces (one ends between its newlines and
# its first word)
SEGMENT = 3


@pytest.fixture(scope="module")
def url():
    with envace_serve(
        "--model", "tiny-random", "--served-model-name", "tiny", "--stream-segment-tokens", str(SEGMENT)
    ) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)


def _chat(client, content, **kw):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], **kw)


def _streamed_chat(client, content, **kw):
    """(text, log-probs, finish_reason, usage) of a streamed chat answer, from its chunks."""
    text, lps, finish, usage = "", [], None, None
    for ch in _chat(client, content, stream=True, **kw):
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            text += c.delta.content or ""
            lps += [x.logprob for x in (c.logprobs.content or [])] if c.logprobs else []
            finish = c.finish_reason or finish
    return text, lps, finish, usage


def _spanning_stop(text):
    """A stop string that spans two tokens of ``text``: the whitespace character before its first word and the
    word's start (tiny-random's greedy answers are newline tokens, then words)."""
    k = len(text) - len(text.lstrip())
    assert 0 < k < len(text) - 3, f"tiny-random's greedy answer {text!r} has no word after whitespace to stop on"
    return text[k - 1 : k + 3]


# -- the live server (tiny-random) ---------------------------------------------------------------------------


def test_models_and_health_name_the_served_model(url, client):
    import httpx

    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(url.removesuffix("/v1") + "/health", trust_env=False).json() == {"status": "ok"}
    missing = httpx.get(url + "/nowhere", trust_env=False)
    assert missing.status_code == 404 and "routes" in missing.json()["error"]["message"]
    assert missing.json()["error"]["type"] == "invalid_request_error"


def test_plain_chat_answers_like_the_local_backend(client, tiny):
    model, tok = tiny
    r = _chat(client, "hello there", max_tokens=12, temperature=0)
    prompt = ChatFormat.for_tokenizer(tok).render([{"role": "user", "content": "hello there"}])
    local = HFBackend(model, tok).generate([prompt], SamplingParams(temperature=0, max_new_tokens=12))[0]
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == local.text
    assert (
        r.choices[0].finish_reason == ("length" if local.finish_reason == "length" else "stop")
        and r.choices[0].message.tool_calls is None
    )
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (
        len(prompt),
        len(local.token_ids),
    ) and r.model == "tiny"


def test_streamed_chat_concatenates_to_the_non_streamed_answer_under_greedy_decoding(client):
    kw = dict(max_tokens=24, temperature=0, logprobs=True)
    whole = _chat(client, "hi", **kw).choices[0]
    text, lps, finish, usage = _streamed_chat(client, "hi", stream_options={"include_usage": True}, **kw)
    assert text == whole.message.content and finish == whole.finish_reason == "length"
    assert len(lps) == 24 == usage.completion_tokens
    assert_logprobs_close(lps, [x.logprob for x in whole.logprobs.content])
    # a stop string inside the answer: neither answer shows it, and the stream never sent a piece of it
    stop = _spanning_stop(whole.message.content)
    cut = whole.message.content[: whole.message.content.index(stop)]
    for include in (False, True):
        kw_stop = kw | {"stop": [stop], "extra_body": {"include_stop_str_in_output": include}}
        expected = cut + (stop if include else "")
        stopped = _chat(client, "hi", **kw_stop).choices[0]
        assert stopped.message.content == expected and stopped.finish_reason == "stop"
        assert _streamed_chat(client, "hi", **kw_stop)[:1] == (expected,)


def test_streamed_completion_concatenates_to_the_non_streamed_text_and_token_ids(client):
    kw = dict(
        model="tiny", prompt="Once upon a time", max_tokens=14, temperature=0, extra_body={"return_token_ids": True}
    )
    whole = client.completions.create(**kw).choices[0]
    chunks = list(client.completions.create(stream=True, **kw))
    assert len(chunks) > 2  # several pieces (every SEGMENT tokens), then the finish
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert [t for c in chunks for t in (c.choices[0].model_extra.get("token_ids") or [])] == whole.model_extra[
        "token_ids"
    ]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


@pytest.mark.parametrize(
    "kw,param",
    [
        (dict(temperature=5), "temperature"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(n=100), "n"),
        (dict(logprobs=True, top_logprobs=3), "top_logprobs"),
        (dict(frequency_penalty=0.5), "frequency_penalty"),
        (dict(tool_choice="required", tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice"),
        (dict(extra_body={"frobnicate": 1}), "frobnicate"),
        (dict(extra_body={"max_tokens": 4000, "messages": [{"role": "user", "content": "word " * 5000}]}), "messages"),
    ],
)
def test_a_bad_or_unknown_field_is_a_400_naming_it(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, "x", **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param and param in e.value.body["message"]


def test_a_bad_completion_field_and_an_unanswerable_tool_message_are_400s_naming_them(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", logprobs=2)
    assert e.value.body["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "{}"}],
        )
    assert e.value.body["param"] == "messages[1].tool_call_id"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["param"] == "model" and e.value.body["type"] == "invalid_request_error"  # as OpenAI's 404


def test_concurrent_requests_are_all_answered_as_they_are_one_at_a_time(client):
    prompts = [f"question number {i}: {'why ' * i}" for i in range(8)]
    kw = dict(max_tokens=10 + 2 * (len(prompts) % 3), temperature=0)
    sequential = [_chat(client, p, **kw).choices[0].message.content for p in prompts]
    results, barrier = {}, threading.Barrier(len(prompts))

    def ask(i):
        barrier.wait()
        results[i] = (
            _streamed_chat(client, prompts[i], **kw)[0]
            if i % 2
            else _chat(client, prompts[i], **kw).choices[0].message.content
        )

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results.get(i) for i in range(len(prompts))] == sequential


def test_a_seeded_request_gives_the_same_tokens_whatever_else_runs(client):
    kw = dict(
        model="tiny",
        prompt="The weather today",
        max_tokens=12,
        temperature=1.0,
        seed=7,
        extra_body={"return_token_ids": True},
    )
    alone = client.completions.create(**kw).choices[0].model_extra["token_ids"]
    others = [
        threading.Thread(
            target=lambda i=i: client.completions.create(
                model="tiny", prompt=f"noise {i}", max_tokens=40, temperature=1.0
            )
        )
        for i in range(4)
    ]
    for t in others:
        t.start()
    time.sleep(0.2)  # the unseeded requests are generating
    busy = client.completions.create(**kw).choices[0].model_extra["token_ids"]
    for t in others:
        t.join(120)
    assert busy == alone and len(alone) == 12
    assert (
        client.completions.create(**(kw | {"seed": 8})).choices[0].model_extra["token_ids"] != alone
    )  # the seed matters


# -- tools, through a scripted backend served by the same app --------------------------------------------------

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture()
def scripted(tokenizer):
    """(openai client, backend) of a ScriptedBackend served in this process; ``backend.answer`` is its next output."""
    backend = ScriptedBackend(tokenizer, lambda prompt: backend.answer(prompt))
    backend.answer = lambda prompt: "It is 21 degrees in Paris." if "<|im_start|>tool" in prompt else CALL
    with serving(backend, ServerConfig(model_name="scripted")) as server:
        yield openai.OpenAI(base_url=server.url, api_key="none", max_retries=0), backend


def test_tools_round_trip_rendered_as_act_sees_them_and_parsed_into_tool_calls(scripted, tokenizer):
    client, backend = scripted
    messages = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    r = client.chat.completions.create(model="scripted", messages=messages, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (
        call.type == "function"
        and call.function.name == "get_weather"
        and json.loads(call.function.arguments) == {"city": "Paris"}
    )
    fmt = ChatFormat.for_tokenizer(tokenizer)
    task = Task(
        id="t", env="", system_prompt="You are a weather bot.", user_turns=[], tools=[ToolSpec.from_dict(WEATHER)]
    )
    act = [Message("system", act_system(task)), Message("user", "Weather in Paris?")]
    assert backend.prompts[-1] == tokenizer.decode(fmt.render(act), skip_special_tokens=False)  # Act's very prompt
    # the call's result goes back as a tool message; the assistant message is sent back as the client got it
    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    r2 = client.chat.completions.create(model="scripted", messages=messages, tools=[WEATHER])
    assert (r2.choices[0].message.content, r2.choices[0].finish_reason, r2.choices[0].message.tool_calls) == (
        "It is 21 degrees in Paris.",
        "stop",
        None,
    )
    act += [Message("assistant", CALL), Message("tool", '{"temp": 21}')]
    assert backend.prompts[-1] == tokenizer.decode(fmt.render(act), skip_special_tokens=False)


def test_a_streamed_tool_call_comes_as_a_tool_calls_chunk(scripted):
    client, backend = scripted
    backend.answer = lambda prompt: "Let me look.\n" + CALL
    chunks = list(
        client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "Paris?"}], tools=[WEATHER], stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert text == "Let me look." and [
        (tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls
    ] == [(0, "get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "answer,tool_choice",
    [
        ('<tool_call>{"name": "get_weather", "arguments": </tool_call>', None),  # not JSON
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', None),  # unterminated
        (
            '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',
            None,
        ),  # not one of the request's tools
        (CALL, "none"),  # tool_choice none: never parsed
    ],
)
def test_a_malformed_or_unknown_call_comes_back_as_plain_content(scripted, answer, tool_choice):
    client, backend = scripted
    backend.answer = lambda prompt: answer
    r = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Paris?"}],
        tools=[WEATHER],
        **({"tool_choice": tool_choice} if tool_choice else {}),
    )
    assert (r.choices[0].message.content, r.choices[0].message.tool_calls, r.choices[0].finish_reason) == (
        answer,
        None,
        "stop",
    )


def test_a_backend_failure_is_a_json_500_and_the_server_goes_on(scripted):
    client, backend = scripted

    def answer(prompt):
        if "boom" in prompt:
            raise RuntimeError("the model fell over")
        return "fine"

    backend.answer = answer
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "boom"}])
    assert e.value.status_code == 500 and "the model fell over" in e.value.body["message"]
    assert (
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "ok?"}])
        .choices[0]
        .message.content
        == "fine"
    )


# -- the generation worker -----------------------------------------------------------------------------------


def _collect(worker, prompts, params, segment=0):
    """Submit a job; a function that waits for it and returns (its generations, the order the sequences ended in)."""
    done, ended, ev = {}, [], threading.Event()

    def emit(u):
        if u.done:
            done[u.index] = u.generation
            ended.append(u.index)
            if len(done) == len(prompts):
                ev.set()

    worker.submit(Job(prompts, params, emit, segment=segment))

    def wait():
        assert ev.wait(120)
        return [done[i] for i in range(len(prompts))], ended

    return wait


def test_concurrent_unseeded_jobs_share_one_generate_call_and_a_seeded_one_runs_alone():
    class Recorder(Backend):  # no streams: the base class's rounds of generate
        def __init__(self):
            self.calls = []

        def generate(self, prompts, params, sessions=None):
            self.calls.append(len(prompts))
            time.sleep(0.05)
            return [Generation(token_ids=[p[0]], logprobs=[0.0], text=str(p[0]), finish_reason="eos") for p in prompts]

    rec = Recorder()
    worker = GenerationWorker(rec, wait_s=1.0)  # generous: the six jobs must all arrive within it
    waits = [_collect(worker, [[i]], SamplingParams(max_new_tokens=4, seed=1 if i >= 4 else None)) for i in range(6)]
    assert [w()[0][0].token_ids for w in waits] == [[i] for i in range(6)]  # every job gets its own answer
    worker.close()
    assert sorted(rec.calls) == [1, 1, 4]  # four unseeded jobs in one call; each seeded one alone
    assert worker.stats["streams"] == 3


def test_a_job_submitted_while_a_stream_runs_joins_it_and_ends_first(tiny):
    model, tok = tiny
    worker = GenerationWorker(HFBackend(model, tok), wait_s=0.0)
    greedy = SamplingParams(temperature=0, max_new_tokens=60)
    first = threading.Event()
    long_done = {}
    worker.submit(
        Job(
            [tok.encode("a long story")],
            greedy,
            lambda u: first.set() if not u.done else long_done.setdefault("g", u.generation),
            segment=4,
        )
    )
    assert first.wait(60)  # the long job's first piece has ended: its stream is running
    short = _collect(worker, [tok.encode("short")], greedy.with_(max_new_tokens=2))
    (g,), _ = short()
    assert len(g.token_ids) == 2 and "g" not in long_done  # answered while the long job still runs
    time.sleep(0.1)
    while "g" not in long_done:
        time.sleep(0.05)
    worker.close()
    assert worker.stats["streams"] == 1 and len(long_done["g"].token_ids) == 60


def test_a_generation_in_pieces_ends_where_a_whole_one_would(tiny):
    model, tok = tiny
    backend = HFBackend(model, tok)
    worker = GenerationWorker(backend, wait_s=0.0)
    prompt = ChatFormat.for_tokenizer(tok).render([{"role": "user", "content": "hi"}])
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    (whole,), _ = _collect(worker, [prompt], greedy)()
    stop = _spanning_stop(whole.text)  # pieces of one token each never see it whole
    (whole_stopped,), _ = _collect(worker, [prompt], greedy.with_(stop=[stop]))()
    for segment in (1, 5):
        (pieces,), _ = _collect(worker, [prompt], greedy, segment=segment)()
        assert (pieces.token_ids, pieces.text, pieces.finish_reason) == (whole.token_ids, whole.text, "length")
        (stopped,), _ = _collect(worker, [prompt], greedy.with_(stop=[stop]), segment=segment)()
        assert (stopped.token_ids, stopped.finish_reason) == (whole_stopped.token_ids, "stop") and len(
            stopped.token_ids
        ) < 24
    worker.close()
    assert not backend._kept  # every piece's kept session was released


# -- the pure pieces -----------------------------------------------------------------------------------------


def test_first_stop_finds_stop_strings_only_in_windows_reaching_back_before_the_piece():
    def decode(ids):  # 1 -> a, 2 -> b, ...
        return "".join(chr(96 + t) for t in ids)

    toks = [1, 2, 3, 4, 5]  # "abcde"; a piece started at index 2 ("cde")
    assert first_stop(decode, toks, ["bc"], 2, 5) == 2 and first_stop(decode, toks, ["cd"], 2, 5) == 3
    assert first_stop(decode, toks, ["de"], 2, 4) is None  # the end bound: the last token is not looked at
    assert first_stop(decode, toks, ["ab"], 2, 5) == 2  # ended before the piece: the first window holding it
    far = list(range(1, 21))  # windows from index start + STOP_WINDOW - 1 on lie inside the piece: the backend saw them
    assert (
        first_stop(decode, far + [1, 2], ["ab"], 20, 22) == 21
        and first_stop(decode, far + [1] * STOP_WINDOW + [2, 3], ["bc"], 20, 38) is None
    )


def test_streamable_holds_back_what_may_still_become_a_stop_string_or_a_call():
    assert streamable("Hello wor", ["world!"]) == "Hello "
    assert streamable("Hello", ["\n\n"]) == "Hello" and streamable("Hello\n", ["\n\n"]) == "Hello"
    assert streamable("Sure <tool", ["<tool_call>"], hold_space=True) == "Sure"
    assert streamable('Sure <tool_call>{"name"', ["<tool_call>"], hold_space=True) == "Sure"
    assert streamable("caf\ufffd", []) == "caf" and streamable("plain text ", []) == "plain text "


def test_a_participant_name_on_user_assistant_and_system_messages_is_accepted_and_not_rendered():
    """Multi-agent frameworks name the participants (OpenAI accepts ``name`` on these roles)."""
    plain = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Sunny."},
    ]
    named = [dict(m, name=n) for m, n in zip(plain, ["rules", "alice_1", "weather-bot"])]
    assert act_messages(named, [ToolSpec.from_dict(WEATHER)]) == act_messages(plain, [ToolSpec.from_dict(WEATHER)])


def test_act_messages_render_tools_calls_and_results_as_act_does():
    spec = ToolSpec.from_dict(WEATHER)
    msgs = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    ]
    out = act_messages(msgs, [spec])
    assert out[0].content == "Be brief.\n\n# Tools\n" + render_tools([spec]) + "\n\n" + ACT_INSTRUCTIONS
    assert [(m.role, m.content) for m in out[1:]] == [("user", "Paris?"), ("assistant", CALL), ("tool", '{"temp": 21}')]
    assert out[2].tool_calls == [ToolCall("get_weather", {"city": "Paris"})]
    assert act_messages([{"role": "user", "content": "x"}], [])[0].content == "x"  # no tools: as sent
    assert act_messages([{"role": "user", "content": "x"}], [spec])[0].content.startswith(
        "# Tools\n"
    )  # no system message: an empty prompt
    for bad, param in [
        (msgs[:3] + [dict(msgs[3], tool_call_id="c2")], "messages[3].tool_call_id"),
        ([dict(msgs[1], name="bob smith")], "messages[0].name"),  # OpenAI's pattern: no spaces
        ([dict(msgs[1], name=7)], "messages[0].name"),
        (msgs[:3] + [dict(msgs[3], name="get_weather")], "messages[3].name"),  # tool messages carry no name
        (
            [
                msgs[2]
                | {"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}
            ],
            "messages[0].tool_calls[0].function.arguments",
        ),
    ]:
        with pytest.raises(RequestError) as e:
            act_messages(bad, [spec])
        assert e.value.param == param


@pytest.mark.parametrize("name", ["mistral", "llama3_json"])
def test_chat_tools_follow_the_models_own_tool_format(name):
    """A model that writes calls another way (chosen from its template, as the rollout chooses) is shown its
    history in that format, told how to call in it, and its replies are parsed by it."""
    from envace.chat.parsing import TOOL_FORMATS

    fmt, spec = TOOL_FORMATS.get(name), ToolSpec.from_dict(WEATHER)
    call = ToolCall("get_weather", {"city": "Paris"})
    msgs = [
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    out = act_messages(msgs, [spec], fmt)
    assert out[0].content.endswith(fmt.instructions) and out[2].content == fmt.render([call])
    assert reply(fmt.render([call]), ["get_weather"], fmt) == (None, [call])
    assert reply(fmt.render([call]), ["other"], fmt)[1] == [] and reply("Sunny.", ["get_weather"], fmt) == (
        "Sunny.",
        [],
    )


def test_reply_parses_only_well_formed_calls_of_known_tools():
    assert reply("Looking.\n" + CALL + "\nmore", ["get_weather"]) == (
        "Looking.",
        [ToolCall("get_weather", {"city": "Paris"})],
    )
    assert reply(CALL, ["get_weather"]) == (None, [ToolCall("get_weather", {"city": "Paris"})])
    assert reply(CALL, None) == (CALL, []) and reply(CALL, ["other"]) == (CALL, [])
    assert reply("<tool_call>{oops}</tool_call>", ["get_weather"]) == ("<tool_call>{oops}</tool_call>", [])
