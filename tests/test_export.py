"""envace.evaluation.export / ``envace export``: trajectories as OpenAI / HF chat records (``tool_calls`` /
``tool_call_id``).

Hand-built trajectories (built message by message as the rollout engine builds them), trajectories of the real
rollout engine with a scripted policy (a malformed output, two calls in one step, three user turns), and gold
trajectories of 3 bank tasks with the tiny-random model's (SmolLM2's) tokenizer."""

import copy
import json
import re
import subprocess
import sys

import pytest

from envace.backends.base import SamplingParams
from envace.backends.scripted import ScriptedBackend
from envace.cli import main
from envace.envs import load_tasks
from envace.evaluation.export import (
    chat_messages,
    export_records,
    read_trajectories,
    tools_from_system,
    trajectory_record,
    world_of,
)
from envace.chat.parsing import parse_act, render_act
from envace.chat.prompts import ACT_INSTRUCTIONS, act_system, tool_message_content
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.training.sft import gold_trajectories
from envace.core.types import Message, Step, Task, ToolCall, ToolSpec, Trajectory, write_jsonl

TOOLS = [
    ToolSpec(
        "add", "add n to the counter", {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    ),
    ToolSpec("lookup", "look something up", {"type": "object", "properties": {"q": {"type": "string"}}}),
]
TASK = Task(
    id="t1", env="counter", system_prompt="You count.", user_turns=["add 2 and 3", "now look up ü"], tools=TOOLS
)


class Chat:
    """A trajectory built message by message the way envace.rollout.engine builds one."""

    def __init__(self, mode: str = "rehearsal", memory: str | None = None):
        self.traj = Trajectory(
            id="tr", task_id=TASK.id, group_id="g", mode=mode, messages=[Message("system", act_system(TASK, memory))]
        )
        self.turn = 0

    def user(self, text: str) -> "Chat":
        self.traj.messages.append(Message("user", text))
        return self

    def act(self, text: str, observations: list = (), sources: list = ()) -> "Chat":
        p = parse_act(text)
        step = Step(user_turn=self.turn, action_text=text, calls=p.calls, reply=p.reply, parse_error=p.error)
        self.traj.steps.append(step)
        self.traj.messages.append(Message("assistant", text if p.calls or p.error else p.reply, tool_calls=p.calls))
        if p.error:
            observations, sources = [p.error], ["validation"]
        for obs, src in zip(observations, sources):
            step.observations.append(obs)
            step.sources.append(src)
            self.traj.messages.append(Message("tool", tool_message_content(obs)))
        if p.reply is not None:
            self.turn += 1
        return self


def hand_built(mode: str = "rehearsal") -> Trajectory:
    return (
        Chat(mode)
        .user(TASK.user_turns[0])
        .act('<tool_call>{"name": "add", "arguments": {"n": 2}</tool_call>')  # malformed: no call runs
        .act(
            "First 2, then 3. " + render_act([ToolCall("add", {"n": 2}), ToolCall("add", {"n": 3})]),
            [{"total": 2}, {"total": 5}],
            ["rehearsed", "cache"],
        )
        .act("The total is 5.")
        .user(TASK.user_turns[1])
        .act(
            render_act([ToolCall("lookup", {"q": "ü"})]),
            [{"error": {"kind": "tool_error", "message": "none"}}],
            ["rehearsed"],
        )
        .act("Nothing found for ü.")
    ).traj


def check_record(rec: dict, traj: Trajectory, target: str = "hf") -> None:
    """The invariants every record keeps: each tool message answers a call made before it (once); arguments are
    the call's arguments as the target writes them (an object, or JSON text for ``openai``); user turns are the
    trajectory's, in order; the record is JSON."""
    made, answered = {}, set()
    for m in rec["messages"]:
        assert set(m) <= {"role", "content", "tool_calls", "tool_call_id"}
        for c in m.get("tool_calls", []):
            assert c["type"] == "function" and c["id"].startswith("call_") and c["id"] not in made
            made[c["id"]] = c["function"]
        if m["role"] == "tool":
            assert m["tool_call_id"] in made and m["tool_call_id"] not in answered
            answered.add(m["tool_call_id"])
            json.loads(m["content"])
    calls = [c for s in traj.steps for c in s.calls]
    assert [arguments_of(f) for f in made.values()] == [c.arguments for c in calls]
    assert [f["name"] for f in made.values()] == [c.name for c in calls]
    assert all(isinstance(f["arguments"], str if target == "openai" else dict) for f in made.values())
    assert [m["content"] for m in rec["messages"] if m["role"] == "user" and not _is_error(m["content"])] == [
        m.content for m in traj.messages if m.role == "user"
    ]
    assert json.loads(json.dumps(rec)) == rec


def arguments_of(function: dict) -> dict:
    """A call's arguments from either target's ``function`` (JSON text or the object)."""
    args = function["arguments"]
    return json.loads(args) if isinstance(args, str) else args


def _is_error(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


@pytest.fixture(scope="module")
def bank3():
    return load_tasks("bank", "train", n=3)


@pytest.fixture(scope="module")
def gold(tokenizer, bank3):
    return gold_trajectories(tokenizer, bank3)


@pytest.fixture(scope="module")
def engine_traj(tokenizer, bank3):
    """A real-mode rollout of the 3-turn bank task by a scripted policy: a malformed call, two calls in one step,
    then a reply per user turn."""
    task = bank3[0]
    assert len(task.user_turns) == 3
    script = [
        "<tool_call>{not json}</tool_call>",
        render_act([ToolCall("get_balance", {"account": "emergency"}), ToolCall("list_accounts", {})]),
        "Done one.",
        "Done two.",
        "Done three.",
    ]
    cfg = RolloutConfig(
        max_steps=8,
        max_steps_per_turn=4,
        schedule="lockstep",
        act=SamplingParams(max_new_tokens=200),
    )
    return RolloutEngine(ScriptedBackend(tokenizer, lambda prompt: script.pop(0)), cfg, mode="real").run(
        [task], group_size=1
    )[0]


def test_hand_built_record_pairs_every_tool_message_with_a_preceding_call():
    traj = hand_built()
    rec = trajectory_record(traj, target="openai")
    check_record(rec, traj, "openai")
    roles = [m["role"] for m in rec["messages"]]
    assert roles == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    two = rec["messages"][4]
    assert two["content"] == "First 2, then 3." and [c["id"] for c in two["tool_calls"]] == ["call_1_0", "call_1_1"]
    assert [m["tool_call_id"] for m in rec["messages"] if m["role"] == "tool"] == ["call_1_0", "call_1_1", "call_3_0"]
    assert json.loads(rec["messages"][10]["content"]) == {"error": {"kind": "tool_error", "message": "none"}}
    assert rec["messages"][9]["content"] is None and json.loads(
        rec["messages"][9]["tool_calls"][0]["function"]["arguments"]
    ) == {"q": "ü"}
    assert rec["observation_sources"] == ["rehearsed", "cache", "rehearsed"]
    assert (rec["task_id"], rec["mode"], rec["world"], rec["parse_errors"], rec["reward"]) == (
        "t1",
        "rehearsal",
        "imagined",
        1,
        None,
    )


def test_a_malformed_act_output_is_assistant_text_then_the_parser_error_as_a_user_message():
    rec = trajectory_record(hand_built())
    bad, feedback = rec["messages"][2], rec["messages"][3]
    assert bad == {"role": "assistant", "content": '<tool_call>{"name": "add", "arguments": {"n": 2}</tool_call>'}
    assert feedback["role"] == "user" and json.loads(feedback["content"])["error"]["kind"] == "bad_format"


def test_the_tools_are_read_back_from_the_system_message_as_openai_schemas():
    assert tools_from_system(act_system(TASK)) == [t.to_openai() for t in TOOLS]
    assert tools_from_system("You count.") == []
    with pytest.raises(ValueError, match="not a tool"):
        tools_from_system('x\n\n# Tools\n{"name": "add"}\nnot json')


def test_a_native_tools_trajectory_exports_its_own_tools_and_its_system_message_without_them(tmp_path):
    """A chat template rendered the tools (RolloutConfig.native_tools): the system message lists none, the
    trajectory keeps them; through a trajectories file, the record's ``tools`` are still the task's."""
    chat = Chat(memory="remember 5")
    chat.traj.messages[0] = Message("system", act_system(TASK, "remember 5", tool_list=False))
    chat.traj.tools = list(TOOLS)
    traj = chat.user("hi").act(render_act([ToolCall("add", {"n": 1})]), [{"total": 1}], ["rehearsed"]).traj
    assert tools_from_system(traj.messages[0].content) == []  # nothing to read back from the text
    path = tmp_path / "t.jsonl"
    write_jsonl(str(path), [traj.to_dict(with_rows=False)])
    ((back, _),) = read_trajectories([str(path)]).items
    assert back.tools == TOOLS
    rec = trajectory_record(back, system="task")
    assert rec["tools"] == [t.to_openai() for t in TOOLS]
    assert rec["messages"][0]["content"] == "You count.\n\n# Notes from private rehearsal\nremember 5"
    assert trajectory_record(back)["messages"][0]["content"] == act_system(TASK, "remember 5", tool_list=False)
    assert trajectory_record(Chat().traj)["tools"] == [t.to_openai() for t in TOOLS]  # envace's text: read back


def test_content_raw_keeps_the_act_output_and_system_task_drops_envaces_tool_instructions():
    traj = (
        Chat(memory="remember 5")
        .user("hi")
        .act(render_act([ToolCall("add", {"n": 1})]), [{"total": 1}], ["rehearsed"])
        .traj
    )
    text = chat_messages(traj)[0]
    raw = chat_messages(traj, content="raw", system="task")[0]
    assert text[2]["content"] == "" and raw[2]["content"] == render_act([ToolCall("add", {"n": 1})])
    assert raw[2]["tool_calls"] == text[2]["tool_calls"]
    assert text[0]["content"] == act_system(TASK, "remember 5")
    assert raw[0]["content"] == "You count.\n\n# Notes from private rehearsal\nremember 5"
    assert "# Tools" not in raw[0]["content"] and ACT_INSTRUCTIONS not in raw[0]["content"]


def test_a_trajectory_cut_inside_a_step_ends_on_its_unanswered_calls():
    traj = (
        Chat()
        .user("hi")
        .act(
            render_act([ToolCall("add", {"n": 1}), ToolCall("add", {"n": 2})]),
            [{"total": 1}],
            ["rehearsed"],
        )
        .traj
    )
    traj.truncated = "context:rehearse"
    rec = trajectory_record(traj)
    check_record(rec, traj)
    assert [m["role"] for m in rec["messages"]][-2:] == ["assistant", "tool"] and rec["truncated"] == "context:rehearse"


def test_messages_that_do_not_match_the_steps_are_an_error():
    traj = hand_built()
    traj.steps.pop()
    with pytest.raises(ValueError, match="more assistant messages than its 4 steps"):
        trajectory_record(traj)
    traj = hand_built()
    traj.messages.insert(2, Message("tool", "{}"))
    with pytest.raises(ValueError, match="answers no call"):
        trajectory_record(traj)
    with pytest.raises(ValueError, match="no messages"):
        trajectory_record(
            Trajectory(id="x", task_id="t1", group_id="g", mode="real", steps=[Step(0, "hi", reply="hi")])
        )


def test_engine_trajectory_with_user_turns_in_order(engine_traj, bank3):
    rec = trajectory_record(engine_traj)
    check_record(rec, engine_traj)
    users = [m["content"] for m in rec["messages"] if m["role"] == "user"]
    assert users[0] == bank3[0].user_turns[0] and _is_error(users[1])  # the parser's answer to the malformed output
    assert users[:1] + users[2:] == bank3[0].user_turns
    assert rec["parse_errors"] == 1 and rec["world"] == "real" and rec["observation_sources"] == ["real", "real"]
    assert len(rec["messages"][4]["tool_calls"]) == 2 and rec["success"] is not None
    assert rec["tools"] == [t.to_openai() for t in bank3[0].tools]


def test_gold_trajectories_of_three_bank_tasks(gold, bank3):
    assert len(gold) == 3
    for traj, task in zip(gold, bank3):
        rec = trajectory_record(traj, world="real")
        check_record(rec, traj)
        assert [m["content"] for m in rec["messages"] if m["role"] == "user"] == task.user_turns
        made = [arguments_of(c["function"]) for m in rec["messages"] for c in m.get("tool_calls", [])]
        assert made == [c.arguments for c in task.flat_gold()] and rec["parse_errors"] == 0
        assert rec["tools"] == [t.to_openai() for t in task.tools] and rec["world"] == "real"
        assert (
            world_of(traj) == "imagined"
        )  # a rehearsal-mode rollout, but GoldTeacher's observations are real: hence world="real"


def test_real_only_leaves_out_imagined_trajectories_and_counts_them():
    items = [(hand_built("rehearsal"), {}), (hand_built("real"), {"iteration": 3}), (hand_built("simulator"), {})]
    records, errors, imagined = export_records(items, real_only=True)
    assert [r["mode"] for r in records] == ["real"] and records[0]["iteration"] == 3 and imagined == 2 and errors == []
    assert [r["world"] for r in export_records(items)[0]] == ["imagined", "real", "imagined"]
    assert [r["world"] for r in export_records(items, real_only=True, world="real")[0]] == ["real"] * 3


def _write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def test_read_trajectories_keeps_every_valid_line_and_names_the_bad_ones(tmp_path):
    good = json.dumps(hand_built().to_dict(with_rows=False) | {"iteration": 0})
    path = tmp_path / "trajectories.jsonl"
    _write_jsonl(path, [good, '{"id": "torn', "", json.dumps({"no": "trajectory"}), good])
    res = read_trajectories([str(path)])
    assert len(res.items) == 2 and res.items[0][1] == {"iteration": 0}
    assert len(res.errors) == 2
    assert res.errors[0].startswith(f"{path}:2: not a JSON line") and res.errors[1].startswith(
        f"{path}:4: not a trajectory (KeyError"
    )
    # a malformed first line does not hide the rest
    _write_jsonl(path, ["garbage", good])
    res = read_trajectories([str(tmp_path)])  # a run folder means its trajectories.jsonl
    assert len(res.items) == 1 and res.errors[0].startswith(f"{path}:1:")
    # an eval result (indented JSON) with trajectories, and one without
    doc = tmp_path / "eval.json"
    doc.write_text(
        json.dumps({"metrics": {}, "trajectories": [hand_built().to_dict(with_rows=False), {"id": 1}]}, indent=1)
    )
    res = read_trajectories([str(doc)])
    assert len(res.items) == 1 and res.errors[0].startswith(f"{doc}: trajectories[1]: not a trajectory")
    doc.write_text(json.dumps({"metrics": {}, "per_task": []}, indent=1))
    assert "without a 'trajectories' list" in read_trajectories([str(doc)]).errors[0]
    with pytest.raises(FileNotFoundError):
        read_trajectories([str(tmp_path / "nope.jsonl")])


def test_export_cli_skips_a_bad_line_with_one_error_line_and_writes_the_rest(tmp_path, capsys):
    src = tmp_path / "t.jsonl"
    _write_jsonl(src, [json.dumps(hand_built("real").to_dict()), "{oops", json.dumps(hand_built().to_dict())])
    out = tmp_path / "out" / "records.jsonl"
    assert main(["export", str(src), "--real-only", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert printed.err.strip().splitlines() == [
        f"envace export: skipped {src}:2: not a JSON line (Expecting "
        "property name enclosed in double quotes: line 1 column 2 (char 1))"
    ]
    assert "wrote 1 records" in printed.out and "skipped 1 malformed, 1 imagined" in printed.out
    assert [json.loads(line)["world"] for line in out.read_text().splitlines()] == ["real"]
    assert main(["export", "--out", str(out)]) == 2 and "nothing to export" in capsys.readouterr().err
    assert main(["export", str(src), "--content", "nope"]) == 2 and "valid names: raw, text" in capsys.readouterr().err


def test_export_cli_round_trip_writes_json_lines_of_gold_and_trajectory_records(tmp_path, bank3):
    src = tmp_path / "t.jsonl"
    _write_jsonl(src, [json.dumps(hand_built().to_dict())])
    out = tmp_path / "gold.jsonl"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "envace.cli",
            "export",
            str(src),
            "--gold",
            "--suite",
            "bank",
            "--split",
            "train",
            "-n",
            "3",
            "--model",
            "tiny-random",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"wrote 4 records to {out}" in p.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["t1"] + [t.id for t in bank3]
    assert [r["world"] for r in records] == ["imagined", "real", "real", "real"]
    check_record(records[0], hand_built())


@pytest.mark.parametrize("target", ["hf", "openai"])
def test_datasets_loads_the_records_of_either_target_as_written(tmp_path, gold, target):
    """Arguments of differing keys (objects, for ``hf``) come back from ``datasets`` exactly, not merged into one
    struct with nulls for the keys a call lacks."""
    import datasets  # a test dependency (pyproject [test]): the export must load where users load it
    from envace.evaluation.export import write_records

    path = tmp_path / "gold.jsonl"
    records = [trajectory_record(t, world="real", target=target) for t in gold]
    records.append(trajectory_record(hand_built(), target=target))
    write_records(str(path), records)
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    assert len(ds) == 4 and {"messages", "tools", "task_id", "world", "reward"} <= set(ds.column_names)
    for row, rec in zip(ds, records):
        ids = [c["id"] for m in row["messages"] for c in (m.get("tool_calls") or [])]
        assert [m["tool_call_id"] for m in row["messages"] if m["role"] == "tool"] == [
            m["tool_call_id"] for m in rec["messages"] if m["role"] == "tool"
        ]
        assert all(m["tool_call_id"] in ids for m in row["messages"] if m["role"] == "tool")
        args = [c["function"]["arguments"] for m in row["messages"] for c in (m.get("tool_calls") or [])]
        assert args == [c["function"]["arguments"] for m in rec["messages"] for c in m.get("tool_calls", [])]
        assert [t["function"]["name"] for t in row["tools"]] == [t["function"]["name"] for t in rec["tools"]]


def test_smollm2_chat_template_ignores_tool_calls_so_raw_content_renders_envaces_own_act_context(tokenizer, gold):
    """What is true of SmolLM2's template (tiny-random has its tokenizer): it renders role and content only. It
    ignores ``tools`` and ``tool_calls`` and cannot render the OpenAI null content (``target="hf"`` writes ``""``);
    with ``content="raw"`` it renders exactly the ChatML context envace's Act role was trained on."""
    traj = gold[0]
    raw = trajectory_record(traj, world="real", content="raw")
    rendered = tokenizer.apply_chat_template(raw["messages"], tools=raw["tools"], tokenize=False)
    assert rendered == "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in traj.messages)
    openai = trajectory_record(traj, world="real", system="task", target="openai")
    with pytest.raises(Exception, match="content|NoneType"):  # assistant messages that only call tools: content null
        tokenizer.apply_chat_template(openai["messages"], tools=openai["tools"], tokenize=False)
    text = trajectory_record(traj, world="real", system="task")
    rendered = tokenizer.apply_chat_template(text["messages"], tools=text["tools"], tokenize=False)
    assert "Deposit" in rendered and "756.50" in rendered  # user turns and tool results are there
    assert "deposit" not in rendered and "<tool_call>" not in rendered  # the calls and the tool list are not


# ------------------------------------------------------------------ export targets rendered by chat templates

# Qwen2.5's tool template, shortened: tools as JSON lines in the system turn, each call as a <tool_call> block
# whose arguments are ``| tojson``, runs of tool messages as one user turn of <tool_response> blocks.
QWEN25 = """
{%- if tools %}
{{- '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}{{- messages[0].content }}{% endif %}
{{- '\\n\\n# Tools\\n\\n<tools>' }}{% for tool in tools %}{{- '\\n' + tool | tojson }}{% endfor %}{{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}{% if message.content %}{{- '\\n' + message.content }}{% endif %}
{%- for tool_call in message.tool_calls %}{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{% endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{% endif %}
{%- endif %}
{%- endfor %}
"""  # noqa: E501

# Llama-3.1's tool template, shortened: one call per assistant message as {"name", "parameters": args | tojson};
# a tool message is an ipython turn (its content is ``| tojson``'d when it is a mapping or iterable: strings too).
LLAMA31 = """
{{- '<|begin_of_text|>' }}
{%- if messages[0].role == 'system' %}{% set system_message = messages[0].content | trim %}{% set messages = messages[1:] %}
{%- else %}{% set system_message = '' %}{% endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system_message }}
{%- if tools %}{{- '\\n\\nYou have access to the following functions:\\n' }}{% for t in tools %}{{- '\\n' + t | tojson(indent=4) }}{% endfor %}{% endif %}
{{- '<|eot_id|>' }}
{%- for message in messages %}
{%- if 'tool_calls' in message %}
{%- if not message.tool_calls | length == 1 %}{{- raise_exception('This model only supports single tool-calls at once!') }}{% endif %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{"name": "' + tool_call.name + '", "parameters": ' }}
{{- tool_call.arguments | tojson }}{{- '}<|eot_id|>' }}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}
{%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}{% else %}{{- message.content }}{% endif %}
{{- '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
"""  # noqa: E501


@pytest.fixture(scope="module")
def family(tokenizer):
    """A tokenizer of a family built locally: SmolLM2's vocabulary with that family's chat template."""

    def build(template: str):
        tok = copy.deepcopy(tokenizer)
        tok.chat_template = template
        return tok

    return build


def one_call_per_step() -> Trajectory:
    """A trajectory Llama-3.1's template can render: one call per assistant message, no malformed output."""
    return (
        Chat()
        .user("add 2")
        .act(render_act([ToolCall("add", {"n": 2})]), [{"total": 2}], ["rehearsed"])
        .act("The total is 2.")
        .user("now look up ü")
        .act(render_act([ToolCall("lookup", {"q": 'ü "quoted"'})]), [{"hits": []}], ["rehearsed"])
        .act("Nothing found.")
    ).traj


def rendered_calls(text: str, pattern: str) -> list[tuple[str, object]]:
    """``(name, arguments)`` of every call a template rendered: ``pattern`` finds each call's JSON text."""
    calls = [json.loads(m) for m in re.findall(pattern, text, flags=re.S)]
    return [(c["name"], c.get("arguments", c.get("parameters"))) for c in calls]


def test_export_targets_write_arguments_as_objects_for_hf_and_as_json_text_for_openai():
    traj = hand_built()
    hf, openai = trajectory_record(traj), trajectory_record(traj, target="openai")
    check_record(hf, traj, "hf")
    check_record(openai, traj, "openai")
    assert hf["messages"][9]["tool_calls"][0]["function"]["arguments"] == {"q": "ü"}
    assert openai["messages"][9]["tool_calls"][0]["function"]["arguments"] == '{"q": "ü"}'
    assert (hf["messages"][9]["content"], openai["messages"][9]["content"]) == ("", None)  # a call and no text
    assert hf["messages"][4]["content"] == openai["messages"][4]["content"] == "First 2, then 3."
    with pytest.raises(KeyError, match="valid names: hf, openai"):
        trajectory_record(traj, target="trl")


def test_a_qwen25_style_template_renders_hf_arguments_once_and_openai_ones_as_an_escaped_string(family):
    tok, traj = family(QWEN25), hand_built()
    calls = [(c.name, c.arguments) for s in traj.steps for c in s.calls]
    block = r"<tool_call>\n(.*?)\n</tool_call>"
    hf = trajectory_record(traj, system="task")
    rendered = tok.apply_chat_template(hf["messages"], tools=hf["tools"], tokenize=False)
    assert rendered_calls(rendered, block) == calls
    assert '"arguments": {"n": 2}' in rendered and '<|im_start|>assistant\n<tool_call>\n{"name": "lookup"' in rendered
    openai = trajectory_record(traj, system="task", target="openai")
    rendered = tok.apply_chat_template(openai["messages"], tools=openai["tools"], tokenize=False)
    assert rendered_calls(rendered, block) == [(name, json.dumps(args, ensure_ascii=False)) for name, args in calls]
    assert '"arguments": "{\\"n\\": 2}"' in rendered  # the double encoding the hf target avoids


def test_a_llama31_style_template_renders_hf_parameters_once_and_openai_ones_as_an_escaped_string(family):
    tok, traj = family(LLAMA31), one_call_per_step()
    calls = [(c.name, c.arguments) for s in traj.steps for c in s.calls]
    turn = r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(\{\"name\".*?)<\|eot_id\|>"
    hf = trajectory_record(traj, system="task")
    rendered = tok.apply_chat_template(hf["messages"], tools=hf["tools"], tokenize=False)
    assert rendered_calls(rendered, turn) == calls == [("add", {"n": 2}), ("lookup", {"q": 'ü "quoted"'})]
    assert '"parameters": {"n": 2}}' in rendered
    openai = trajectory_record(traj, system="task", target="openai")
    rendered = tok.apply_chat_template(openai["messages"], tools=openai["tools"], tokenize=False)
    assert '"parameters": "{\\"n\\": 2}"}' in rendered


def test_smollm2s_own_template_renders_every_hf_record_of_the_gold_and_engine_trajectories(
    tokenizer, gold, engine_traj
):
    """SmolLM2's template raises on OpenAI's null content; the hf target's ``""`` renders, the calls left out."""
    for traj in [*gold, engine_traj, hand_built()]:
        rec = trajectory_record(traj, world="real")
        rendered = tokenizer.apply_chat_template(rec["messages"], tools=rec["tools"], tokenize=False)
        assert rendered.count("<|im_start|>") == len(rec["messages"])


def test_export_cli_writes_hf_records_by_default_and_openai_ones_with_target_openai(tmp_path, capsys):
    src, out = tmp_path / "t.jsonl", tmp_path / "records.jsonl"
    _write_jsonl(src, [json.dumps(hand_built().to_dict())])
    for flags, arguments in [([], {"q": "ü"}), (["--target", "openai"], '{"q": "ü"}')]:
        assert main(["export", str(src), *flags, "--out", str(out)]) == 0
        (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert rec["messages"][9]["tool_calls"][0]["function"]["arguments"] == arguments


def test_export_cli_unknown_target_is_one_line_naming_the_valid_targets(tmp_path, capsys):
    src, out = tmp_path / "t.jsonl", tmp_path / "records.jsonl"
    _write_jsonl(src, [json.dumps(hand_built().to_dict())])
    assert main(["export", str(src), "--target", "trl", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "envace export: error: unknown export target 'trl'; valid names: hf, openai"
    ]
    assert not out.exists()


def test_export_cli_real_only_on_a_rehearsed_run_says_nothing_real_was_found_and_writes_no_file(tmp_path, capsys):
    src, out = tmp_path / "trajectories.jsonl", tmp_path / "real.jsonl"
    _write_jsonl(src, [json.dumps(hand_built("rehearsal").to_dict() | {"iteration": i}) for i in range(2)])
    assert main(["export", str(tmp_path), "--real-only", "--out", str(out)]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.strip().splitlines() == [
        "envace export: error: nothing real found: 2 of the 2 trajectories read were imagined (rehearsed or "
        f"simulated) and --real-only keeps only mode 'real'; {out} not written"
    ]
    assert not out.exists()
