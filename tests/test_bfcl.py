"""BFCL-v4 multi-turn adapter: data conversion, gold replay through the adapter scored by the official checker,
corruption, and the guarantee that model text is never evaluated."""

from __future__ import annotations

import copy
import json
import os
from collections import Counter

import jsonschema
import pytest

from envace.chat.parsing import render_act
from envace.envs import check_env, load_tasks, make_env
from envace.envs.bfcl import multi_turn as bfcl
from envace.core.types import Step, Task, ToolCall, Trajectory, is_error_obs

CATEGORIES = bfcl.CATEGORIES


@pytest.fixture(scope="module")
def all_tasks() -> dict[str, list[Task]]:
    return {c: load_tasks(f"bfcl:{c}", "all") for c in CATEGORIES}


def run_turns(task: Task, turns: list[list[ToolCall]], reply: str = "Done.") -> tuple["bfcl.BFCLEnv", Trajectory]:
    """Play ``turns`` (one list of calls per user turn, each call its own step) through the task's real
    environment, closing every turn with a text reply; return the environment and the finished trajectory."""
    env = make_env(task)
    steps = []
    for i, calls in enumerate(turns):
        for c in calls:
            steps.append(
                Step(user_turn=i, action_text=render_act([c]), calls=[c], observations=[env.call(c)], sources=["real"])
            )
        steps.append(Step(user_turn=i, action_text=reply, reply=reply))
    return env, Trajectory(id=f"{task.id}-t", task_id=task.id, group_id="g", mode="real", steps=steps)


def score(task: Task, turns: list[list[ToolCall]]) -> "bfcl.Score":
    env, traj = run_turns(task, turns)
    return env.score(traj)


def test_each_category_has_200_tasks_with_valid_json_schemas(all_tasks):
    for category, tasks in all_tasks.items():
        assert len(tasks) == 200, category
        assert len({t.id for t in tasks}) == 200
        for t in tasks[:20]:
            assert t.env == f"bfcl:{category}"
            assert len(t.user_turns) == len(t.gold_actions) == len(t.env_config["ground_truth"])
            for spec in t.tools:
                jsonschema.Draft202012Validator.check_schema(spec.parameters)
                text = json.dumps(spec.parameters)
                for bfcl_type in ('"dict"', '"float"', '"tuple"', '"any"'):
                    assert f'"type": {bfcl_type}' not in text


def test_schema_normalisation_maps_bfcl_types():
    doc = {
        "type": "dict",
        "properties": {
            "a": {"type": "float"},
            "b": {"type": "tuple", "items": {"type": "integer"}},
            "c": {"type": "any"},
            "d": {"type": "dict", "properties": {"e": {"type": "boolean"}}},
        },
        "required": ["a"],
    }
    out = bfcl.normalize_schema(doc)
    assert out == {
        "type": "object",
        "properties": {
            "a": {"type": "number"},
            "b": {"type": "array", "items": {"type": "integer"}},
            "c": {},
            "d": {"type": "object", "properties": {"e": {"type": "boolean"}}},
        },
        "required": ["a"],
    }


@pytest.mark.parametrize("category", CATEGORIES)
def test_gold_replay_through_adapter_scores_200_of_200(all_tasks, category):
    tasks = all_tasks[category]
    failures = []
    for task in tasks:
        s = score(task, task.gold_actions)
        if not s.success:
            failures.append((task.id, s.details))
    assert not failures, failures[:3]
    assert sum(1 for _ in tasks) == 200


def test_positional_gold_arguments_are_named_from_the_signature(all_tasks):
    owners = bfcl._method_owners(["GorillaFileSystem", "VehicleControlAPI"])
    assert bfcl.parse_gold_call("sort('final_report.pdf')", owners) == ToolCall(
        "sort", {"file_name": "final_report.pdf"}
    )
    assert bfcl.parse_gold_call("fillFuelTank(15.0)", owners) == ToolCall("fillFuelTank", {"fuelAmount": 15.0})
    # the dataset's positional gold calls all arrive with named arguments (none dropped)
    n_positional = 0
    for task in all_tasks["multi_turn_base"]:
        for strings, calls in zip(task.env_config["ground_truth"], task.gold_actions):
            for s, c in zip(strings, calls):
                if "(" in s and "=" not in s.split("(", 1)[1] and s.split("(", 1)[1] != ")":
                    n_positional += 1
                    assert c.arguments, s
    assert n_positional > 10


def test_gold_parsing_accepts_literals_only():
    owners = bfcl._method_owners(["GorillaFileSystem"])
    for text in [
        "cd(folder=__import__('os').getcwd())",
        "cd(folder=open('x').read())",
        "os.system('ls')",
        "cd(**{'folder': 'a'})",
    ]:
        with pytest.raises(ValueError):
            bfcl.parse_gold_call(text, owners)


def test_corrupted_write_call_scores_zero(all_tasks):
    task = all_tasks["multi_turn_base"][0]  # cd, mkdir temp, mv final_report.pdf -> temp, ...
    gold = copy.deepcopy(task.gold_actions)
    assert gold[0][2].name == "mv"
    gold[0][2].arguments["destination"] = "elsewhere"
    s = score(task, gold)
    assert not s.success and s.reward == 0.0
    assert s.details["error_type"] == "multi_turn:instance_state_mismatch"


def test_a_turn_without_calls_or_a_cut_episode_fails(all_tasks):
    task = all_tasks["multi_turn_base"][1]
    turns = copy.deepcopy(task.gold_actions)
    turns[1] = []
    assert score(task, turns).details["error_type"] == "multi_turn:empty_turn_model_response"
    env, traj = run_turns(task, task.gold_actions)
    traj.truncated = "max_steps"
    assert env.score(traj).details["error_type"] == "multi_turn:force_terminated"
    env, short = run_turns(task, task.gold_actions[:-1])
    assert env.score(short).details["error_type"] == "multi_turn:force_terminated"


def test_scores_agree_with_bfcl_s_own_eval_executor(all_tasks):
    """The official checker with BFCL's own eval-based executor, run on the dataset's gold strings (trusted
    text) and a hand-corrupted variant, agrees with this adapter's score; its instance cache is purged."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    name = "envace_crosscheck"
    try:
        for task in all_tasks["multi_turn_base"][:6]:
            strings = task.env_config["ground_truth"]
            entry = {
                "id": task.id,
                "initial_config": task.env_config["initial_config"],
                "involved_classes": task.env_config["involved_classes"],
            }
            official = multi_turn_checker(
                [[turn] if turn else [] for turn in strings], strings, entry, "multi_turn_base", name
            )
            assert official["valid"] and score(task, task.gold_actions).success
            # corrupt: drop the last call of the first non-empty turn
            t = next(i for i, turn in enumerate(strings) if turn)
            bad_strings = copy.deepcopy(strings)
            bad_strings[t] = bad_strings[t][:-1]
            bad_calls = copy.deepcopy(task.gold_actions)
            bad_calls[t] = bad_calls[t][:-1]
            official_bad = multi_turn_checker(
                [[turn] if turn else [] for turn in bad_strings], strings, entry, "multi_turn_base", name + "_bad"
            )
            assert official_bad["valid"] == score(task, bad_calls).success, task.id
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]


def test_adapter_leaves_no_instances_in_bfcl_module_globals(all_tasks):
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    before = {k for k in vars(multi_turn_utils) if k.endswith("_instance")}
    for task in all_tasks["multi_turn_base"][:5]:
        assert score(task, task.gold_actions).success
    after = {k for k in vars(multi_turn_utils) if k.endswith("_instance")}
    assert after == before


def test_model_text_is_never_executed(all_tasks, tmp_path):
    marker = tmp_path / "pwned"
    code = f"__import__('os').system('touch {marker}')"
    task = next(
        t
        for t in all_tasks["multi_turn_base"]
        if "GorillaFileSystem" in t.env_config["involved_classes"]
        and t.tool("echo") is not None
        and t.tool("touch") is not None
    )
    env = make_env(task)

    # code as a tool name: an unknown tool, through the env and through the adapter's invoker
    obs = env.call(ToolCall(name=code, arguments={}))
    assert is_error_obs(obs) and obs["error"]["kind"] == "unknown_tool"
    with pytest.raises(Exception):
        bfcl.invoke(env.instances, ToolCall(name=code, arguments={}))
    # code as an argument: stored and returned as a literal string
    assert not is_error_obs(env.call(ToolCall("touch", {"file_name": "note.txt"})))
    obs = env.call(ToolCall("echo", {"content": code, "file_name": "note.txt"}))
    assert not is_error_obs(obs)
    assert env.call(ToolCall("cat", {"file_name": "note.txt"})) == {"file_content": code}
    # code as an argument name
    obs = env.call(ToolCall("cat", {code: "x"}))
    assert is_error_obs(obs)

    # scoring re-executes every call of the trajectory: still no evaluation
    turns = copy.deepcopy(task.gold_actions)
    turns[0] = [
        ToolCall(name=code, arguments={}),
        ToolCall("touch", {"file_name": code}),
        ToolCall("echo", {"content": code, "file_name": code}),
        ToolCall("cat", {code: code}),
    ] + turns[0]
    s = score(task, turns)
    assert isinstance(s.success, bool)
    assert not marker.exists()


def test_miss_func_tasks_announce_held_out_tools_in_a_later_turn(all_tasks):
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    for task in all_tasks["multi_turn_miss_func"][:20]:
        (held,) = task.metadata["held_out_tools"]
        turn, names = held["turn"], held["tools"]
        assert turn > 0 and names
        assert task.user_turns[turn] == DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        by_turn = task.metadata["tools_by_turn"]
        assert len(by_turn) == len(task.user_turns)
        for name in names:
            assert task.tool(name) is not None  # task.tools holds every tool
            assert name not in by_turn[turn - 1] and name in by_turn[turn]


def test_splits_are_hash_based_and_shared_by_the_four_categories(all_tasks):
    splits = Counter(t.split for t in all_tasks["multi_turn_base"])
    assert set(splits) == {"train", "test"} and 40 <= splits["test"] <= 80
    for c in CATEGORIES[1:]:
        assert [t.split for t in all_tasks[c]] == [t.split for t in all_tasks["multi_turn_base"]]
    test = load_tasks("bfcl:multi_turn_base", "test")
    assert len(test) == splits["test"] and all(t.split == "test" for t in test)
    a = load_tasks("bfcl:multi_turn_base", "train", n=7, seed=3)
    b = load_tasks("bfcl:multi_turn_base", "train", n=7, seed=3)
    assert [t.id for t in a] == [t.id for t in b] and len(a) == 7
    assert len(load_tasks("bfcl", "all", n=5)) == 5
    with pytest.raises(ValueError):
        load_tasks("bfcl:multi_turn_nope", "all")


def test_tasks_round_trip_through_json(all_tasks):
    task = all_tasks["multi_turn_miss_func"][5]
    again = Task.from_dict(json.loads(json.dumps(task.to_dict())))
    assert again.to_dict() == task.to_dict()
    assert score(again, again.gold_actions).success


def test_references_are_real_gold_results_of_other_train_tasks(all_tasks):
    by_id = {t.id: t for ts in all_tasks.values() for t in ts}
    tests = [t for t in all_tasks["multi_turn_base"] if t.split == "test"][:10]
    for task in tests:
        assert 1 <= len(task.references) <= 3
        gold = {c.key() for c in task.flat_gold()}
        for ref in task.references:
            source = by_id[ref.source]
            assert source.split == "train" and source.id != task.id and ref.call.key() not in gold
            env = make_env(source)  # the source's gold calls, in order, in a fresh environment
            assert (ref.call, ref.result) in [(c, env.call(c)) for c in source.flat_gold()]


def test_oracle_references_are_the_tasks_own_gold_results():
    task = load_tasks("bfcl:multi_turn_base@oracle-references", "all", n=3)[0]
    assert task.metadata["references"] == "oracle" and [r.call for r in task.references] == task.flat_gold()
    env = make_env(task)
    for ref in task.references[:3]:
        assert env.call(ref.call) == ref.result


@pytest.mark.parametrize("category", CATEGORIES)
def test_check_env_passes(all_tasks, category):
    for task in all_tasks[category][:3]:
        report = check_env(task)
        assert report.ok, report.problems
        json.dumps(make_env(task).state())


def test_bfcl_writes_outside_site_packages():
    from bfcl_eval.constants import eval_config

    site = os.path.dirname(os.path.dirname(eval_config.__file__))
    assert not str(eval_config.PROJECT_ROOT).startswith(os.path.dirname(site))


def test_the_bfcl_package_keeps_the_multi_turn_modules_public_names():
    import envace.envs.bfcl as package

    public = {
        n for n, v in vars(bfcl).items() if not n.startswith("_") and getattr(v, "__module__", "") == bfcl.__name__
    }
    assert public <= set(package.__all__)
    assert all(getattr(package, n) is getattr(bfcl, n) for n in package.__all__)
