"""The data model's JSON: one key per field in field order, nested dataclasses by their own methods, the same
bytes as the hand-written methods wrote before (a golden line), and a missing required key named."""

import json
from dataclasses import dataclass

import pytest

from envace.core.config import JSONable, fields_from_dict, from_dict
from envace.core.types import Message, Row, Step, Task, ToolCall, ToolSpec, Trajectory, UserStep


def _traj() -> Trajectory:
    call = ToolCall("get", {"id": 1})
    return Trajectory(
        id="g0:t/0",
        task_id="t",
        group_id="g0:t",
        mode="rehearsal",
        reward=0.5,
        reward_info={"f1": 0.5},
        counters={"act/steps": 1},
        messages=[Message("user", "hi"), Message("assistant", "", tool_calls=[call])],
        steps=[
            Step(
                user_turn=0,
                action_text="x",
                calls=[call],
                observations=[{"ok": True}],
                sources=["rehearsed"],
                shadow=[None],
                shadow_changed=[None],
            )
        ],
        user_steps=[UserStep(turn=0, text=None, calls=[call], observations=[1], sources=["unexecuted"])],
        rows=[Row("act", [1, 2], [3], [-0.5], "t", "g0:t/0", "g0:t", 0, False)],
    )


GOLDEN = (
    '{"id": "g0:t/0", "task_id": "t", "group_id": "g0:t", "mode": "rehearsal", "reward": 0.5, "reward_info": '
    '{"f1": 0.5}, "truncated": null, "counters": {"act/steps": 1}, "env_outcome": null, "messages": [{"role": '
    '"user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"name": "get", "arguments": '
    '{"id": 1}}]}], "steps": [{"user_turn": 0, "action_text": "x", "calls": [{"name": "get", "arguments": {"id": '
    '1}}], "reply": null, "parse_error": null, "observations": [{"ok": true}], "sources": ["rehearsed"], '
    '"shadow": [null], "shadow_changed": [null], "rehearse_texts": []}], "user_steps": [{"turn": 0, "text": null, '
    '"calls": [{"name": "get", "arguments": {"id": 1}}], "observations": [1], "sources": ["unexecuted"], '
    '"parse_error": null}], "rows": [{"role": "act", "prompt_ids": [1, 2], "completion_ids": [3], "old_logprobs": '
    '[-0.5], "task_id": "t", "traj_id": "g0:t/0", "group_id": "g0:t", "step": 0, "truncated": false}]}'
)


def test_a_trajectory_is_written_as_the_golden_line_and_read_back_equal():
    t = _traj()
    assert json.dumps(t.to_dict()) == GOLDEN
    assert Trajectory.from_dict(json.loads(GOLDEN)) == t
    assert t.to_dict(with_rows=False)["rows"] == [] and list(t.to_dict(with_rows=False)) == list(t.to_dict())


def test_reading_leaves_the_written_objects_alone_and_ignores_extra_keys():
    d = _traj().to_dict() | {"iteration": 3}  # trajectories.jsonl lines carry their iteration
    t = Trajectory.from_dict(d)
    t.steps[0].observations.append("more")
    assert d["steps"][0]["observations"] == [{"ok": True}] and isinstance(t.steps[0].calls[0], ToolCall)
    assert isinstance(t.user_steps[0], UserStep) and isinstance(t.rows[0], Row) and t.rows[0].prompt_ids == [1, 2]


def test_a_missing_required_key_is_a_key_error_naming_it_and_defaults_fill_the_rest():
    with pytest.raises(KeyError, match="id"):
        Trajectory.from_dict({"no": "trajectory"})
    t = Trajectory.from_dict({"id": "a", "task_id": "t", "group_id": "g", "mode": "real"})
    assert t == Trajectory(id="a", task_id="t", group_id="g", mode="real")
    task = Task.from_dict({"id": "x", "env": "bank"})  # a task file may leave the prompt, turns and tools out
    assert (task.system_prompt, task.user_turns, task.tools, task.split) == ("", [], [], "train")


def test_the_methods_that_write_another_shape_keep_it():
    assert Message("user", "hi").to_dict() == {"role": "user", "content": "hi"}  # no empty tool_calls
    wrapped = {"type": "function", "function": {"name": "f", "description": "d"}}
    assert (
        ToolSpec.from_dict(wrapped) == ToolSpec("f", "d")
        and ToolCall.from_dict({"name": "f", "arguments": None}).arguments == {}
    )


def test_a_tool_specs_read_only_flag_round_trips_and_is_written_only_where_known_and_never_shown_to_the_model():
    unknown, read = ToolSpec("f", "d"), ToolSpec("g", "d", read_only=True)
    assert "read_only" not in unknown.to_dict()  # files written before the flag read back the same
    assert ToolSpec.from_dict(unknown.to_dict()) == unknown and ToolSpec.from_dict(read.to_dict()) == read
    assert ToolSpec.from_dict(ToolSpec("h", "d", read_only=False).to_dict()).read_only is False
    assert "read_only" not in json.dumps(read.to_openai())
    task = Task("t", "bank", "", ["hi"], [unknown, read, ToolSpec("w", "d", read_only=False)])
    assert task.read_only_tools() == {"g"}  # only where known to be read only


def test_a_trajectory_keeps_its_tools_only_where_it_has_them():
    t = _traj()
    assert "tools" not in t.to_dict()  # the system message lists them: written as before
    t.tools = [ToolSpec("get", "read", {"type": "object", "properties": {}})]
    d = json.loads(json.dumps(t.to_dict()))
    assert d["tools"][0]["name"] == "get" and list(d) == list(t.to_dict(with_rows=False))
    assert Trajectory.from_dict(d) == t


@dataclass
class _Record(JSONable):
    name: str
    note: str | None = None


def test_one_reader_strict_for_configs_and_lenient_for_records():
    """envace.core.config.read_fields reads both: a config's strings from the command line are coerced and an
    unknown key is an error; a record's values stay as written (the text "none" is text), an unknown key (a later
    version's) is skipped and an absent field without a default is a KeyError naming it."""
    assert from_dict(_Record, {"name": "a", "note": "none"}) == _Record("a", None)
    with pytest.raises(ValueError, match=r"unknown _Record field\(s\) \['later'\]; valid: \['name', 'note'\]"):
        from_dict(_Record, {"name": "a", "later": 1})
    with pytest.raises(ValueError, match=r"_Record.name: bad value \[1\]: expected str"):
        from_dict(_Record, {"name": [1]})
    assert from_dict(_Record, {"name": 3}) == _Record("3") and _Record.from_dict({"name": 3}) == _Record(3)
    assert _Record.from_dict({"name": "a", "note": "none", "later": 1}) == _Record("a", "none")
    assert fields_from_dict(_Record, {}, name="x") == _Record("x")
    with pytest.raises(KeyError, match="name"):
        _Record.from_dict({"note": "n"})


def test_read_jsonl_reads_a_gzipped_copy_as_the_file_itself(tmp_path):
    import gzip

    from envace.core.types import read_jsonl, write_jsonl

    rows = [{"a": 1}, {"b": [2, 3]}]
    write_jsonl(str(tmp_path / "r.jsonl"), rows)
    (tmp_path / "r.jsonl.gz").write_bytes(gzip.compress((tmp_path / "r.jsonl").read_bytes()))
    assert read_jsonl(str(tmp_path / "r.jsonl.gz")) == read_jsonl(str(tmp_path / "r.jsonl")) == rows
