"""MCP over streamable HTTP: the test server of tests/test_mcp.py (MCPServer) served on a free loopback port, and a
stub HTTP server for answers that are not MCP. The same observations, timeouts and faults as over stdio."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from envace.core.types import Step, ToolCall, Trajectory
from envace.envs import load_tasks, make_env
from envace.envs.base import MAX_OBS_CHARS
from envace.envs.mcp import MCPClient, MCPStartupError

SERVER = Path(__file__).parent / "fixtures" / "mcp_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def http_server(**env: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """The MCPServer test server on a free loopback port: (its process, its URL), stopped on exit."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "the HTTP test server did not start"
                time.sleep(0.1)
        yield proc, f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with http_server(MCP_TEST_HAZARDS="1") as (_, url):
        yield url


def _client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mcp-client"]


def test_an_http_server_lists_its_tools_answers_calls_and_tool_errors_are_observations(url):
    (task,) = load_tasks(f"mcp:{url}", "train")
    assert task.env == f"mcp:{url}" and task.env_config == {"url": url}
    assert {"increment", "fail", "slow", "big"} <= {t.name for t in task.tools}
    env = make_env(task)
    try:
        assert env.call(ToolCall("increment", {"by": 2})) == {"result": 2}
        assert env.call(ToolCall("get_count", {})) == {"result": 2}
        obs = env.call(ToolCall("fail", {"reason": "broken on purpose"}))
        assert obs["error"]["kind"] == "tool_error" and "broken on purpose" in obs["error"]["message"]
        assert env.call(ToolCall("increment", {"by": "two"}))["error"]["kind"] == "bad_arguments"
        obs = env.call(ToolCall("big", {"chars": MAX_OBS_CHARS + 10}))
        assert obs["error"]["kind"] == "too_large"
        assert env.state()["url"] == url and len(env.state()["history"]) == 4
    finally:
        env.close()
    assert env.faults == {"too_large": 1}
    assert _client_threads() == []
    assert env.call(ToolCall("get_count", {}))["error"]["kind"] == "tool_exception"  # closed: still no exception


def test_a_slow_http_call_times_out_and_the_session_stays_usable(url):
    client = MCPClient(url, call_timeout_s=0.5)
    try:
        t0 = time.time()
        obs, fault = client.call("slow", {"seconds": 5})
        assert obs["error"]["kind"] == "timeout" and fault == "timeout" and time.time() - t0 < 3.0
        assert client.call_tool("get_count", {})["result"] >= 0
    finally:
        client.close()


def test_an_http_server_that_stops_mid_run_gives_a_clear_error_observation_and_fails_the_task(tmp_path):
    with http_server() as (proc, url):
        path = tmp_path / "tasks.json"
        gold = [{"name": "increment", "arguments": {"by": 1}}, {"name": "increment", "arguments": {"by": 2}}]
        path.write_text(
            json.dumps({"url": url, "tasks": [{"id": "count", "user_turns": ["x"], "gold_actions": [gold]}]})
        )
        (task,) = load_tasks(f"mcp:{path}", "all")
        assert task.env_config["url"] == url
        env = make_env(task)
        try:
            first, second = task.flat_gold()
            assert env.call(first) == {"result": 1}
            proc.kill()
            proc.wait(10)
            t0 = time.time()
            obs = [env.call(second), env.call(second)]
            assert time.time() - t0 < 10.0
            steps = [Step(user_turn=0, action_text="", calls=[c], observations=[o]) for c, o in zip([first], obs)]
            score = env.score(Trajectory(id="t", task_id=task.id, group_id="g", mode="real", steps=steps))
        finally:
            env.close()
    for o in obs:
        assert o["error"]["kind"] == "tool_exception", o
        assert f"the MCP server at {url} stopped answering: nothing answers there" in o["error"]["message"], o
    assert env.faults == {"tool_exception": 2} and not score.success
    assert _client_threads() == []


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, timeout=120)


def test_nothing_listening_at_the_url_is_a_one_line_cli_error():
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    p = _cli("tasks", "--suite", f"mcp:{url}")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.stderr.strip().splitlines() == [
        f"envace tasks: error: MCP server at {url} did not start: nothing answers there "
        "(ConnectError: All connection attempts failed)"
    ]


class StubMCP(BaseHTTPRequestHandler):
    """Answers the MCP handshake in JSON (or, with ``server.html``, everything with a web page) and every tool
    call with a body that is not JSON."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in body:  # a notification
            self.send_response(202)
            self.end_headers()
            return
        if self.server.html:  # type: ignore[attr-defined]
            return self._send("text/html", b"<html><body>It works!</body></html>")
        result = {
            "initialize": {
                "protocolVersion": body.get("params", {}).get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "stub", "version": "0"},
            },
            "tools/list": {"tools": [{"name": "echo", "inputSchema": {"type": "object", "properties": {}}}]},
        }.get(body["method"])
        if result is None:
            return self._send("application/json", b"this is not json")
        self._send("application/json", json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode())

    def do_GET(self) -> None:
        self.send_response(405)
        self.end_headers()

    do_DELETE = do_GET

    def _send(self, content_type: str, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def stub_server(html: bool) -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StubMCP)
    httpd.html = html  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/mcp"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_url_that_is_not_an_mcp_server_fails_at_once_saying_what_answered():
    with stub_server(html=True) as url:
        t0 = time.time()
        with pytest.raises(MCPStartupError) as err:
            MCPClient(url)
        assert time.time() - t0 < 5.0  # not the startup timeout
    assert str(err.value) == (
        f"MCP server at {url} did not start: its answer is not MCP JSON-RPC (Unexpected content type: text/html)"
    )
    assert _client_threads() == []


def test_an_answer_that_is_not_json_rpc_is_a_non_json_fault_observation_at_once():
    with stub_server(html=False) as url:
        (task,) = load_tasks(f"mcp:{url}", "train")
        env = make_env(task)
        try:
            t0 = time.time()
            obs = env.call(ToolCall("echo", {}))
            assert time.time() - t0 < 5.0  # not the call timeout
        finally:
            env.close()
    assert obs["error"]["kind"] == "tool_exception" and env.faults == {"non_json": 1}
    message = obs["error"]["message"]
    assert message.startswith(f"tool 'echo' failed: the MCP server at {url} answered with something that is not MCP")
    assert "(Failed to parse JSON response: " in message and "json_invalid" in message, message


@pytest.mark.parametrize(
    "doc,message",
    [
        (
            {"url": "ftp://127.0.0.1/mcp"},
            "MCP server URL 'ftp://127.0.0.1/mcp' is not an http(s)://host[:port]/path URL",
        ),
        ({"url": "http://127.0.0.1:99999/mcp"}, "MCP server URL 'http://127.0.0.1:99999/mcp' has a bad port"),
        ({"url": "http://x/mcp", "command": "python s.py"}, "give exactly one of 'command'"),
        ({}, "got neither"),
    ],
    ids=["not_http", "bad_port", "both_url_and_command", "no_server"],
)
def test_a_bad_server_in_a_tasks_file_is_a_one_line_error(tmp_path, doc, message):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({**doc, "tasks": [{"user_turns": ["x"]}]}))
    with pytest.raises(ValueError) as err:
        load_tasks(f"mcp:{path}", "all")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_suite_url_without_a_host_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"MCP server URL 'http://' is not an http\(s\)://host\[:port\]/path URL"):
        load_tasks("mcp:http://", "train")
