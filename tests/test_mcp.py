"""MCP adapter: a real MCP server (tests/fixtures/mcp_server.py, the SDK's MCPServer over stdio) as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace.chat.parsing import render_act
from envace.envs import check_env, load_tasks, make_env
from envace.envs.mcp import MCPClient, MCPStartupError
from envace.core.types import Step, ToolCall, Trajectory, is_error_obs

SERVER = Path(__file__).parent / "fixtures" / "mcp_server.py"
COMMAND = f"{sys.executable} {SERVER}"


@pytest.fixture(scope="module")
def explore_task():
    (task,) = load_tasks(f"mcp:python {SERVER}", "train")  # "python" means this interpreter
    return task


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_explore_task_lists_the_server_tools(explore_task):
    names = {t.name for t in explore_task.tools}
    assert {"increment", "get_count", "add_note", "read_note", "fail", "slow", "server_pid"} <= names
    assert explore_task.env.startswith("mcp:") and not explore_task.gold_actions
    inc = explore_task.tool("increment")
    assert inc.parameters["type"] == "object" and inc.parameters["properties"]["by"]["type"] == "integer"


def test_a_servers_read_only_hint_marks_its_tool_read_only_and_no_hint_leaves_it_unknown(explore_task):
    assert explore_task.tool("get_count").read_only is True  # the fixture's readOnlyHint
    assert explore_task.tool("increment").read_only is None  # no annotation: not known, never assumed


def test_round_trip_errors_and_close(explore_task):
    env = make_env(explore_task)
    try:
        assert env.call(ToolCall("increment", {"by": 2})) == {"result": 2}
        assert env.call(ToolCall("increment", {})) == {"result": 3}
        assert env.call(ToolCall("get_count", {})) == {"result": 3}
        assert env.call(ToolCall("add_note", {"title": "t", "text": "hello"}))["n_notes"] == 1
        assert env.call(ToolCall("read_note", {"title": "t"})) == {"result": "hello"}
        # a tool that reports an error (isError) is an error observation, not an exception
        obs = env.call(ToolCall("fail", {"reason": "broken on purpose"}))
        assert (
            is_error_obs(obs)
            and obs["error"]["kind"] == "tool_error"
            and "broken on purpose" in obs["error"]["message"]
        )
        obs = env.call(ToolCall("read_note", {"title": "missing"}))
        assert obs["error"]["kind"] == "tool_error"
        # arguments are checked against the server's inputSchema before the call
        assert env.call(ToolCall("increment", {"by": "two"}))["error"]["kind"] == "bad_arguments"
        assert env.call(ToolCall("no_such_tool", {}))["error"]["kind"] == "unknown_tool"
        pid = env.call(ToolCall("server_pid", {}))["result"]
        assert pid != os.getpid()
        assert json.dumps(env.state())
    finally:
        env.close()
    assert _gone(pid), "the MCP server subprocess outlived env.close()"
    assert env.call(ToolCall("get_count", {}))["error"]["kind"] == "tool_exception"  # closed: still no exception


def test_a_slow_call_times_out_and_the_server_stays_usable(explore_task):
    client = MCPClient(COMMAND, call_timeout_s=0.5)
    try:
        t0 = time.time()
        obs = client.call_tool("slow", {"seconds": 5})
        assert obs["error"]["kind"] == "timeout" and time.time() - t0 < 3.0
        assert client.call_tool("increment", {"by": 5}) == {"result": 5}
    finally:
        client.close()


def test_a_server_that_cannot_start_raises_a_clear_error():
    with pytest.raises(MCPStartupError) as err:
        MCPClient([sys.executable, "-c", "import sys; print('boom on startup', file=sys.stderr); sys.exit(3)"])
    assert "did not start" in str(err.value) and "boom on startup" in str(err.value)
    with pytest.raises(MCPStartupError, match="No such file"):
        load_tasks("mcp:/nonexistent/mcp-server --flag")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "server,reason",
    [
        ("/nonexistent/mcp-server --flag", "no such program (No such file or directory: '/nonexistent/mcp-server')"),
        (
            "python -c \"import sys; sys.exit('cannot read config.toml')\"",
            "closed the connection before the MCP handshake",
        ),
        ("true", "closed the connection before the MCP handshake"),
    ],
    ids=["missing_program", "exits_with_a_message", "exits_silently"],
)
def test_a_failing_server_start_is_a_one_line_cli_error(server, reason):
    p = _cli("tasks", "--suite", f"mcp:{server}")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert (
        lines[0].startswith("envace tasks: error: MCP server `")
        and " did not start: " in lines[0]
        and reason in lines[0]
    )
    if "config.toml" in server:
        assert lines[0].endswith("its stderr ends: cannot read config.toml")  # what the server said, last


def test_rollout_against_a_server_that_cannot_start_ends_with_the_one_line_error():
    p = _cli("rollout", "--model", "tiny-random", "--suite", "mcp:/nonexistent/mcp-server", "-n", "1", "-k", "1")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if "error" in line.lower()]
    assert errors == [p.stderr.strip().splitlines()[-1]] and errors[0].startswith(
        "envace rollout: error: MCP server `/nonexistent/mcp-server`"
    )


def test_tasks_from_a_json_file_are_scored_by_gold_calls_and_outputs(tmp_path):
    spec = {
        "command": COMMAND,
        "tasks": [
            {
                "id": "count_to_3",
                "user_turns": ["Add 1 and then 2 to the counter and tell me the total."],
                "gold_actions": [
                    [{"name": "increment", "arguments": {"by": 1}}, {"name": "increment", "arguments": {"by": 2}}]
                ],
                "expected_outputs": ["3"],
                "split": "test",
            },
            {
                "id": "note",
                "user_turns": ["Save a note 'a' saying 'b'."],
                "split": "train",
                "gold_actions": [[{"name": "add_note", "arguments": {"title": "a", "text": "b"}}]],
            },
        ],
    }
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(spec))
    (task,) = load_tasks(f"mcp:{path}", "test")
    assert task.id == "count_to_3" and task.tool("increment") is not None
    assert len(load_tasks(f"mcp:{path}", "all")) == 2

    def play(calls, reply):
        env = make_env(task)
        try:
            steps = [Step(user_turn=0, action_text="", calls=[c], observations=[env.call(c)]) for c in calls]
            steps.append(Step(user_turn=0, action_text=reply, reply=reply))
            return env.score(Trajectory(id="t", task_id=task.id, group_id="g", mode="real", steps=steps))
        finally:
            env.close()

    good = play(task.flat_gold(), "The counter is at 3.")
    assert good.success and good.reward == 1.0
    bad = play([ToolCall("increment", {"by": 3})], "The counter is at 3.")
    assert not bad.success and bad.details["gold_calls_in_order"] is False


def test_check_env_passes(explore_task):
    calls = [ToolCall("increment", {"by": 2}), ToolCall("add_note", {"title": "x", "text": "y"}), ToolCall("fail", {})]
    report = check_env(explore_task, calls=calls)
    assert report.ok, report.problems


def _side_effect_tasks(tmp_path, **extra):
    """The count_to_3 task on a server whose ``increment`` appends to a file (a real side effect)."""
    log = tmp_path / "side_effects.txt"
    spec = {
        "command": COMMAND,
        "env": {"MCP_TEST_SIDE_EFFECTS": str(log)},
        **extra,
        "tasks": [
            {
                "id": "count_to_3",
                "user_turns": ["Add 1 and then 2 to the counter and tell me the total."],
                "gold_actions": [
                    [{"name": "increment", "arguments": {"by": 1}}, {"name": "increment", "arguments": {"by": 2}}]
                ],
                "expected_outputs": ["3"],
                "split": "test",
            }
        ],
    }
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(spec))
    return load_tasks(f"mcp:{path}", "test"), log


def _gold_then_reply(task):
    def respond(prompt: str) -> str:
        if "tool simulator" in prompt:
            return '<observation>{"result": 0}</observation>'
        n = prompt.count("<|im_start|>tool")
        return render_act([task.flat_gold()[n]]) if n < len(task.flat_gold()) else "The counter is at 3."

    return respond


def _ran(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_evaluating_on_an_mcp_server_runs_each_call_once(tokenizer, tmp_path):
    from envace.backends.scripted import ScriptedBackend
    from envace.evaluation.trials import evaluate
    from envace.rollout.engine import RolloutConfig

    (task,), log = _side_effect_tasks(tmp_path)
    res = evaluate(
        ScriptedBackend(tokenizer, _gold_then_reply(task)), [task], samples=1, rollout=RolloutConfig(max_steps=4)
    )
    assert _ran(log) == ["increment 1", "increment 2"]  # the single real execution, not replayed for scoring
    assert res.metrics["success_rate"] == 1.0 and res.trajectories[0].reward_info["scored_in"] == "rollout"


def test_scoring_a_rehearsed_trajectory_on_an_mcp_server_needs_the_replay_opt_in(tokenizer, tmp_path):
    from envace.backends.scripted import ScriptedBackend
    from envace.envs import ReplayNotAllowedError
    from envace.rewards.functions import REWARDS, RewardContext
    from envace.rollout.engine import RolloutConfig, RolloutEngine

    (task,), log = _side_effect_tasks(tmp_path)
    rc = RolloutConfig(max_steps=4)
    (traj,) = RolloutEngine(ScriptedBackend(tokenizer, _gold_then_reply(task)), rc, mode="rehearsal").run(
        [task], group_size=1
    )
    assert traj.env_outcome is None and len(traj.calls()) == 2
    with pytest.raises(ReplayNotAllowedError, match="allow_replay"):
        REWARDS.get("grounded")(task, traj, RewardContext())
    assert _ran(log) == []  # refused before anything ran
    (task,), log = _side_effect_tasks(tmp_path, allow_replay=True)  # explicit opt-in: the calls run once, now
    res = REWARDS.get("grounded")(task, traj, RewardContext())
    assert res.value == 1.0 and res.info["scored_in"] == "replay" and res.info["n_replayed"] == 2
    assert _ran(log) == ["increment 1", "increment 2"]


def test_asyncios_warning_about_an_already_reaped_server_is_dropped_and_its_other_warnings_kept(caplog):
    import logging

    import envace.envs.mcp  # noqa: F401 - installs the filter

    log = logging.getLogger("asyncio")
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        log.warning("Unknown child process pid %d, will report returncode 255", 13434)
        log.warning("Executing <Task> took 0.2 seconds")
    assert [r.getMessage() for r in caplog.records] == ["Executing <Task> took 0.2 seconds"]


def _tasks_file(tmp_path, tasks, **top) -> str:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"command": COMMAND, **top, "tasks": tasks}))
    return f"mcp:{path}"


def _play(task, calls, reply):
    """Run ``calls`` on a fresh server of ``task``, then reply; (observations, score, faults)."""
    env = make_env(task)
    try:
        obs = [env.call(c) for c in calls]
        steps = [Step(user_turn=0, action_text="", calls=[c], observations=[o]) for c, o in zip(calls, obs)]
        steps.append(Step(user_turn=0, action_text=reply, reply=reply))
        return obs, env.score(Trajectory(id="t", task_id=task.id, group_id="g", mode="real", steps=steps)), env.faults
    finally:
        env.close()


def test_a_gold_call_answered_by_an_error_does_not_count_as_done(tmp_path):
    gold = [{"name": "increment", "arguments": {"by": 1}}, {"name": "read_note", "arguments": {"title": "t"}}]
    (task,) = load_tasks(_tasks_file(tmp_path, [{"id": "read", "user_turns": ["x"], "gold_actions": [gold]}]), "all")
    obs, score, _ = _play(task, task.flat_gold(), "done")
    assert obs[1]["error"]["kind"] == "tool_error"  # no note titled 't': the gold call ran and failed
    assert not score.success and score.details["gold_calls_in_order"] is False


def test_after_a_server_crash_calls_say_it_exited_and_none_counts_as_done(tmp_path):
    gold = [{"name": "increment", "arguments": {"by": 1}}, {"name": "increment", "arguments": {"by": 2}}]
    spec = _tasks_file(
        tmp_path,
        [{"id": "count", "user_turns": ["x"], "gold_actions": [gold], "expected_outputs": ["3"]}],
        env={"MCP_TEST_HAZARDS": "1"},
    )
    (task,) = load_tasks(spec, "all")
    first, second = task.flat_gold()
    obs, score, faults = _play(task, [first, ToolCall("crash", {"code": 3}), second], "The counter is at 3.")
    assert obs[0] == {"result": 1}
    for o in obs[1:]:  # the crashing call itself, and a gold call made after the crash
        assert o["error"]["kind"] == "tool_exception", o
        message = o["error"]["message"]
        assert "the MCP server exited (exit code 3)" in message and "crashing on purpose" in message, message
        assert "ClosedResourceError" not in message
    assert not score.success and score.details["gold_calls_in_order"] is False
    assert faults == {"tool_exception": 2}


def _ended(pid: int, within_s: float) -> bool:
    """Whether process ``pid`` is gone or a zombie (an orphan's zombie waits for an init that may never reap it)."""
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


CLIENT_STUCK_IN_A_CALL = """
import sys
from envace.envs.mcp import MCPClient
client = MCPClient(sys.argv[1], env={"MCP_TEST_HAZARDS": "1"})
print(client.call_tool("server_pid", {})["result"], flush=True)
client.call_tool("block", {"seconds": 60}, timeout_s=120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_stuck_in_a_call_dies_when_its_client_is_killed_9():
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT_STUCK_IN_A_CALL, COMMAND], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    server = int(client.stdout.readline())
    try:
        time.sleep(0.5)  # the block call is under way: the server reads nothing more, its stdin's end included
        client.kill()
        client.wait(10)
        assert _ended(server, within_s=5.0), "the MCP server outlived its killed client"
    finally:
        if not _ended(server, 0):
            os.kill(server, 9)


def _servers_alive() -> list[int]:
    """The pids of this process's children running the test server (zombies left out)."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(ppid) == os.getpid() and state != "Z" and str(SERVER).encode() in cmdline:
            alive.append(int(pid))
    return alive


def _count_tasks(tmp_path, n, **top):
    tasks = [
        {"id": f"count{i}", "user_turns": ["What is the counter?"], "gold_actions": [[{"name": "get_count"}]]}
        for i in range(n)
    ]
    return load_tasks(_tasks_file(tmp_path, tasks, **top), "all")


def _call_then_reply(call: ToolCall, seen: list[int]):
    """A scripted policy: ``call``, then a reply; records how many test servers are alive at each generation."""

    def respond(prompt: str) -> str:
        seen.append(len(_servers_alive()))
        return render_act([call]) if prompt.count("<|im_start|>tool") == 0 else "The counter is 0."

    return respond


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts servers in /proc")
@pytest.mark.parametrize("schedule", ["lockstep", "continuous"])
def test_a_rollout_keeps_at_most_max_alive_servers_and_closes_each_when_its_trajectory_ends(
    tokenizer, tmp_path, schedule
):
    from envace.backends.scripted import ScriptedBackend
    from envace.rollout.engine import RolloutConfig, RolloutEngine

    class Streaming(ScriptedBackend):
        streams = True  # the base class's generate_stream: the engine's continuous schedule

    tasks = _count_tasks(tmp_path, 3, max_alive=2)
    seen: list[int] = []
    backend = (Streaming if schedule == "continuous" else ScriptedBackend)(
        tokenizer, _call_then_reply(ToolCall("get_count", {}), seen)
    )
    cfg = RolloutConfig(max_steps=3, schedule=schedule)
    trajs = RolloutEngine(backend, cfg, mode="real").run(tasks, group_size=1)
    assert [t.task_id for t in trajs] == ["count0", "count1", "count2"]
    assert all(t.env_outcome["success"] for t in trajs)
    assert max(seen) == 2, seen  # two at once (the bound, reached), never three
    assert _servers_alive() == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts servers in /proc")
def test_a_rollout_stopped_by_an_exception_closes_every_server(tokenizer, tmp_path):
    from envace.backends.scripted import ScriptedBackend
    from envace.rollout.engine import RolloutConfig, RolloutEngine

    seen: list[int] = []
    policy = _call_then_reply(ToolCall("get_count", {}), seen)

    def respond(prompt: str) -> str:
        if len(seen) == 3:
            raise RuntimeError("the backend died")
        return policy(prompt)

    with pytest.raises(RuntimeError, match="the backend died") as err:
        RolloutEngine(ScriptedBackend(tokenizer, respond), RolloutConfig(), mode="real").run(
            _count_tasks(tmp_path, 2), group_size=2
        )
    assert max(seen) == 4  # every trajectory had its server when the backend failed
    assert _servers_alive() == [], "servers outlived the failed rollout"
    del err


def test_mcp_faults_are_counted_in_the_evaluation_metrics_table_and_saved_result(tokenizer, tmp_path):
    from envace.backends.scripted import ScriptedBackend
    from envace.evaluation.trials import evaluate, save_result
    from envace.rollout.engine import RolloutConfig

    gold = [{"name": "increment", "arguments": {"by": 1}}]
    spec = _tasks_file(
        tmp_path,
        [{"id": "hang_then_crash", "user_turns": ["x"], "gold_actions": [gold]}],
        env={"MCP_TEST_HAZARDS": "1"},
        call_timeout_s=0.5,
    )
    calls = [ToolCall("slow", {"seconds": 5}), ToolCall("crash", {"code": 3}), ToolCall("increment", {"by": 1})]

    def respond(prompt: str) -> str:
        n = prompt.count("<|im_start|>tool")
        return render_act([calls[n]]) if n < len(calls) else "done"

    res = evaluate(ScriptedBackend(tokenizer, respond), load_tasks(spec, "all"), rollout=RolloutConfig(max_steps=5))
    assert res.metrics["env/timeout"] == 1 and res.metrics["env/tool_exception"] == 2
    assert res.metrics["env/non_json"] == 0 and res.metrics["success_rate"] == 0.0
    table = dict(line.split(None, 1) for line in res.table().splitlines())
    assert table["env/timeout"] == "1" and table["env/tool_exception"] == "2"
    save_result(res, str(tmp_path / "out.json"))
    saved = json.loads((tmp_path / "out.json").read_text())["metrics"]
    assert saved["env/timeout"] == 1 and saved["env/tool_exception"] == 2
