"""Any MCP server, over stdio or streamable HTTP (official ``mcp`` SDK), as a real environment.

``task.env`` is ``"mcp:<command line>"`` (e.g. ``"mcp:python tests/fixtures/mcp_server.py"``; a leading
``python`` / ``python3`` means this interpreter) or ``"mcp:http(s)://host:port/path"`` (a server that runs
elsewhere, :mod:`envace.envs.mcp_http`). Each environment starts its own server subprocess (or opens its own
session on the HTTP server, whose state the sessions may share: that is the server's), lists its tools and calls
them through an MCP ``ClientSession``. The async client runs in a background event-loop
thread behind a synchronous facade (:class:`MCPClient`); every call has a timeout. A tool result with
``isError`` becomes a ``tool_error`` observation; a server that cannot be started (no such program, it exits at
once, no handshake in time) raises :class:`MCPStartupError`, a one-line message with the command, the reason and
the last lines of its stderr. :meth:`MCPEnv.close` ends the
subprocess.

Suites: ``load_tasks("mcp:<command line>")`` gives one "explore" task (the server's tools, no gold, no
success check); ``load_tasks("mcp:<tasks.json>")`` reads tasks from a JSON file
``{"command": "<command line>", "tasks": [{"id": ..., "user_turns": [...], "gold_actions": [[...]],
"expected_outputs": [...], "split": ...}, ...]}`` (missing tools are taken from the server); ``"url":
"http(s)://..."`` (with optional ``"headers"``) instead of ``"command"`` names an HTTP server. Over HTTP the same
timeouts and observations hold; a server that stops answers the pending and every later call with ``tool 'x'
failed: the MCP server at URL stopped answering: ...``, and an answer that is not MCP JSON-RPC ends its call at once
(fault ``non_json``). Such tasks are
scored by a generic check: the gold calls appear in order among the calls the server ran that returned
without an error (an error answer, a crashed server's included, never counts as done) and every expected output
appears in the trajectory's replies. A call that finds its server gone says how the server ended (exit code or
signal) and the last lines of its stderr. The server process dies with envace, even on ``kill -9``
(:mod:`envace.envs.mcp_stdio`).

**One server per trajectory, a few at a time.** Each trajectory gets a fresh server, started when the trajectory
starts and closed as soon as it ends; a rollout keeps at most ``MCPEnv.max_alive`` (:data:`MAX_SERVERS`; a tasks
file may set ``"max_alive"``) alive at once, the other trajectories waiting for one to end
(``envace.rollout.engine``), and closes every one still open when it stops early.

The server's state is not visible from outside, so :meth:`MCPEnv.state` is the command and the history of
calls with their observations (what the environment knows), which is what determinism checks compare.

**No second execution.** A server's tools may act on the world, so nothing here runs a trajectory's calls twice:
a trajectory that ran against the server (real mode, or a shadow copy) is scored from that very run (the rollout
records the outcome when it ends). Scoring a *rehearsed* trajectory with the ``grounded`` reward would need a
replay of its calls on a fresh server; that is refused (:class:`envace.envs.ReplayNotAllowedError`) unless the
tasks file opts in with ``"allow_replay": true`` (top level or per task ``env_config``), for servers where
re-running calls is harmless (read-only, sandboxed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import random
import shlex
import sys
import logging
import tempfile
import threading
import weakref
from typing import Any, Sequence
from urllib.parse import urlsplit

from mcp import ClientSession

from ..core.types import Task, ToolCall, ToolSpec, Trajectory, error_obs, is_error_obs, states_fact
from ..backends.loaders import is_url
from .base import EnvStartupError, Environment, Score
from .mcp_http import check_url, http_transport
from .registry import ENVS, SUITES
from .mcp_stdio import exit_reason, stdio_process


def _not_a_reaped_child(record: logging.LogRecord) -> bool:
    """asyncio's child watcher warns ``Unknown child process pid N`` when a server that exits at once was reaped
    before it looked (a race under load): the start's own error already says the server exited."""
    return not str(record.msg).startswith("Unknown child process pid")


logging.getLogger("asyncio").addFilter(_not_a_reaped_child)

STARTUP_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0
MAX_SERVERS = 4  # MCPEnv.max_alive: servers a rollout keeps alive at once, one per running trajectory
EXIT_WAIT_S = 2.0  # how long a call that lost its server waits for the server's exit status
SPLITS: tuple[str, ...] = ("train", "test", "all")
EXPLORE_PROMPT = (
    "Explore the tools of this server: call them to learn what they do and what they return, "
    "then reply with a short summary of what you found."
)


class MCPStartupError(EnvStartupError):
    """The MCP server could not be started or did not complete the MCP handshake."""


class NotMCPError(ConnectionError):
    """What answers at an MCP server's URL does not speak MCP JSON-RPC (the message says what came back)."""


NOT_MCP_ANSWERS = ("Unexpected content type:", "Failed to parse JSON response:")
"""How the SDK's streamable HTTP transport (``mcp`` 2.x) answers a request whose HTTP answer is not MCP JSON-RPC
(another content type, a body that is not JSON-RPC): a JSON-RPC error it makes up itself, with a message that starts
so."""


def not_mcp_answer(e: BaseException) -> str | None:
    """What came back, in one line, when ``e`` is the SDK's error for an HTTP answer that is not MCP JSON-RPC
    (:data:`NOT_MCP_ANSWERS`); else None."""
    message = getattr(getattr(e, "error", None), "message", None)
    if not isinstance(message, str) or not message.startswith(NOT_MCP_ANSWERS):
        return None
    return " ".join(message.split())[:300]


STDERR_TAIL_CHARS = 300


def _one_line(text: str, limit: int = STDERR_TAIL_CHARS) -> str:
    """The last non-empty lines of ``text`` joined by `` | ``, at most ``limit`` characters (the end kept)."""
    joined = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return joined if len(joined) <= limit else "..." + joined[-limit:]


_CLOSED = (
    "BrokenResourceError",
    "ClosedResourceError",
    "EndOfStream",
    "BrokenPipeError",
)  # anyio / OS: the pipe is gone


def _startup_reason(e: BaseException) -> str:
    """Why the start failed, from the leaf exceptions: a missing program, a server that closed the connection."""
    reasons = []
    for x in _leaves(e):
        what = f"{type(x).__name__}: {x}" if str(x) else type(x).__name__
        if isinstance(x, NotMCPError):
            reasons.append(str(x))
        elif type(x).__name__ == "ConnectError":
            reasons.append(f"nothing answers there ({what})")
        elif isinstance(x, FileNotFoundError):
            reasons.append(
                f"no such program ({x.strerror}: {x.filename!r})" if x.filename else f"no such program ({x})"
            )
        elif type(x).__name__ in _CLOSED or "connection closed" in str(x).lower():
            reasons.append(f"the server closed the connection before the MCP handshake (it exited?) ({what})")
        else:
            reasons.append(what)
    return _one_line("; ".join(dict.fromkeys(reasons)), 500)


def parse_command(command: str | list[str]) -> list[str]:
    """A command line (string, split like a shell) or argv list; ``python`` / ``python3`` -> this interpreter."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise ValueError("empty MCP server command")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def _leaves(e: BaseException) -> list[BaseException]:
    """The leaf exceptions of (nested) exception groups, so that a startup error names the real cause."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in _leaves(sub)]
    return [e]


def _shutdown(
    loop: asyncio.AbstractEventLoop,
    thread: threading.Thread,
    closing: asyncio.Event | None,
    owner: concurrent.futures.Future | None,
    errfile: Any,
) -> None:
    """Ask the owner task to leave its contexts (which ends the subprocess), then stop the loop thread."""
    if loop.is_closed():
        return
    if closing is not None and owner is not None and not owner.done():
        loop.call_soon_threadsafe(closing.set)
        try:
            owner.result(CLOSE_TIMEOUT_S)
        except BaseException:  # noqa: BLE001 - closing must not raise
            owner.cancel()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(CLOSE_TIMEOUT_S)
    if not thread.is_alive():
        loop.close()
    if errfile is not None:
        try:
            errfile.close()
        except Exception:  # noqa: BLE001
            pass


class MCPClient:
    """A synchronous facade over an MCP ``ClientSession`` to one server: a subprocess over stdio (``server`` a
    command line or argv) or a running server over streamable HTTP (``server`` an ``http(s)://`` URL).

    One owner task, on an event loop in a daemon thread, enters the transport (:func:`.mcp_stdio.stdio_process`,
    :func:`.mcp_http.http_transport`) and ``ClientSession`` and waits until :meth:`close` (anyio needs the same task
    to enter and leave them); calls are submitted to that loop and waited on with a timeout. A call that fails
    because the server is gone says so: how a subprocess ended (exit code or signal) and the last lines of its
    stderr, or why an HTTP server stopped answering. Over HTTP an answer that is not MCP JSON-RPC ends the call it
    answered at once (one call at a time, as an environment makes them); ``env`` and ``cwd`` are a subprocess's,
    ``headers`` (an ``Authorization``, say) an HTTP server's."""

    def __init__(
        self,
        server: str | list[str],
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        call_timeout_s: float = CALL_TIMEOUT_S,
        headers: dict[str, str] | None = None,
    ):
        self.url = check_url(server.strip()) if isinstance(server, str) and is_url(server.strip()) else None
        self.argv = [] if self.url else parse_command(server)
        self.headers = headers
        self.call_timeout_s = call_timeout_s
        self.lost: BaseException | None = None  # what ended the transport after the start (an HTTP server gone)
        self._garbled: concurrent.futures.Future = concurrent.futures.Future()  # set by an answer that is not MCP
        self._startup: Any = None  # the cancel scope of the handshake (an HTTP answer that is not MCP ends it)
        self.session: ClientSession | None = None
        self.process: Any = None  # the server's anyio Process once started (its pid, its return code)
        self.tools_raw: list[Any] = []
        self._errfile = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._closing: asyncio.Event | None = None
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._owner = asyncio.run_coroutine_threadsafe(self._own(env, cwd), self._loop)
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._thread, None, None, self._errfile)
        try:
            self._ready.result(startup_timeout_s)
        except BaseException as e:  # noqa: BLE001 - re-raised as a startup error with the server's stderr
            timed_out = isinstance(e, concurrent.futures.TimeoutError)
            reason = f"no MCP handshake within {startup_timeout_s:g}s" if timed_out else _startup_reason(e)
            tail = _one_line(self._stderr_tail())
            self.close()
            said = "" if self.url else f"; its stderr ends: {tail or '(nothing)'}"
            raise MCPStartupError(f"MCP server {self.where} did not start: {reason}{said}") from (
                None if timed_out else e
            )
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _shutdown, self._loop, self._thread, self._closing, self._owner, self._errfile
        )

    @property
    def where(self) -> str:
        """The server as messages name it: ``at http://host/mcp`` or the command line in backquotes."""
        return f"at {self.url}" if self.url else f"`{shlex.join(self.argv)}`"

    def _transport(self, env: dict[str, str] | None, cwd: str | None) -> Any:
        if self.url:
            return http_transport(self.url, self.headers)
        return stdio_process(self.argv, env, cwd, self._errfile)

    async def _on_message(self, message: Any) -> None:
        """The session's handler of what is neither a request nor a reply: an exception is a transport's answer
        that is not MCP JSON-RPC. Over HTTP it was the answer to the pending request, which will get no other."""
        if isinstance(message, Exception) and self.url:
            if not self._garbled.done():
                self._garbled.set_result(f"{type(message).__name__}: {' '.join(str(message).split())[:300]}")
            if self._startup is not None:
                self._startup.cancel()

    async def _own(self, env: dict[str, str] | None, cwd: str | None) -> None:
        import anyio

        self._closing = asyncio.Event()
        try:
            async with self._transport(env, cwd) as (read, write, process):
                self.process = process
                async with ClientSession(read, write, message_handler=self._on_message) as session:
                    with anyio.CancelScope() as self._startup:
                        try:
                            await session.initialize()
                            self.tools_raw = list((await session.list_tools()).tools)
                        except Exception as e:
                            garbled = not_mcp_answer(e) if self.url else None
                            if garbled is None:
                                raise
                            raise NotMCPError(f"its answer is not MCP JSON-RPC ({garbled})") from e
                    if self._startup.cancelled_caught:
                        raise NotMCPError(f"its answer is not MCP JSON-RPC ({self._garbled.result()})")
                    self._startup = None
                    self.session = session
                    self._ready.set_result(True)
                    await self._closing.wait()
        except BaseException as e:  # noqa: BLE001
            if not self._ready.done():
                self._ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            elif not isinstance(e, (asyncio.CancelledError, GeneratorExit)):
                self.lost = e
                raise
        finally:
            self.session = None
            if not self._ready.done():
                self._ready.set_exception(RuntimeError("the server closed the connection during startup"))

    def _stderr_tail(self, n: int = 2000) -> str:
        try:
            self._errfile.flush()
            self._errfile.seek(0)
            return self._errfile.read()[-n:]
        except Exception:  # noqa: BLE001
            return ""

    @property
    def alive(self) -> bool:
        exited = self.process is not None and self.process.returncode is not None
        return self.session is not None and not self._owner.done() and not exited

    def returncode(self, wait_s: float = 0.0) -> int | None:
        """The server's return code once it has exited (waiting up to ``wait_s`` for it), else None."""
        process = self.process
        if process is None or process.returncode is not None or wait_s <= 0 or self._loop.is_closed():
            return None if process is None else process.returncode
        waiting = asyncio.run_coroutine_threadsafe(asyncio.wait_for(process.wait(), wait_s), self._loop)
        try:
            waiting.result(wait_s + 1.0)
        except BaseException:  # noqa: BLE001 - still running (or the loop is gone): no return code
            waiting.cancel()
        return process.returncode

    def exited_note(self, wait_s: float = 0.0) -> str | None:
        """``the MCP server exited (exit code 3); its stderr ends: ...`` once it has (an HTTP server: ``the MCP
        server at URL stopped answering (why)`` once its transport has ended), else None."""
        if self.url:
            if not self._owner.done() and wait_s > 0:
                concurrent.futures.wait([self._owner], wait_s)
            if self.lost is None:
                return None
            return f"the MCP server {self.where} stopped answering: {_startup_reason(self.lost)}"
        code = self.returncode(wait_s)
        if code is None:
            return None
        return (
            f"the MCP server exited ({exit_reason(code)}); its stderr "
            f"ends: {_one_line(self._stderr_tail()) or '(nothing)'}"
        )

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name=t.name,
                description=t.description or "",
                parameters=dict(t.input_schema or {"type": "object", "properties": {}}),
                read_only=getattr(t.annotations, "read_only_hint", None),  # the server's readOnlyHint, if any
            )
            for t in self.tools_raw
        ]

    def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Call a tool and return an observation (JSON value or error observation); never raises."""
        return self.call(name, arguments, timeout_s)[0]

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float | None = None) -> tuple[Any, str | None]:
        """``(observation, fault)`` of a tool call: the fault (``timeout``, ``tool_exception``, ``non_json``: an
        answer that is not MCP JSON-RPC) is None when the server answered, with a result or a tool error."""
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        session = self.session
        if session is None or self._owner.done() or not self.alive:
            return error_obs("tool_exception", self.exited_note() or "the MCP server is not running"), "tool_exception"
        self._garbled = concurrent.futures.Future()
        fut = asyncio.run_coroutine_threadsafe(
            session.call_tool(name, arguments, read_timeout_seconds=timeout_s), self._loop
        )
        # the answer, or an answer that is not MCP, or the end of the session (an HTTP server gone: no answer comes)
        concurrent.futures.wait([fut, self._garbled, self._owner], timeout_s + 1.0, concurrent.futures.FIRST_COMPLETED)
        if self._garbled.done() and not fut.done():
            fut.cancel()
            why = f"the MCP server {self.where} answered with something that is not MCP JSON-RPC"
            return error_obs("tool_exception", f"tool {name!r} failed: {why} ({self._garbled.result()})"), "non_json"
        if self._owner.done() and not fut.done():
            fut.cancel()
            why = self.exited_note(EXIT_WAIT_S) or "the MCP session ended"
            return error_obs("tool_exception", f"tool {name!r} failed: {why}"), "tool_exception"
        try:
            result = fut.result(0)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return error_obs("timeout", f"tool {name!r} did not return within {timeout_s:g}s"), "timeout"
        except Exception as e:  # noqa: BLE001 - protocol errors (bad request, server gone, read timeout)
            garbled = not_mcp_answer(e) if self.url else None
            if garbled is not None:
                why = f"the MCP server {self.where} answered with something that is not MCP JSON-RPC"
                return error_obs("tool_exception", f"tool {name!r} failed: {why} ({garbled})"), "non_json"
            msg = str(getattr(getattr(e, "error", None), "message", "") or e)
            gone = type(e).__name__ in _CLOSED or "connection closed" in msg.lower()
            exited = self.exited_note(EXIT_WAIT_S if gone else 0.0)
            if exited is not None:
                return error_obs("tool_exception", f"tool {name!r} failed: {exited}"), "tool_exception"
            if "timed out" in msg.lower() or "timeout" in type(e).__name__.lower():
                return error_obs("timeout", f"tool {name!r} did not return within {timeout_s:g}s"), "timeout"
            return error_obs("tool_exception", f"{type(e).__name__}: {msg[:300]}"), "tool_exception"
        return result_observation(result), None

    def close(self) -> None:
        self._finalizer.detach()
        _shutdown(self._loop, self._thread, self._closing, self._owner, self._errfile)


def _content_value(block: Any) -> Any:
    kind = getattr(block, "type", None)
    if kind == "text":
        try:
            return json.loads(block.text)
        except (ValueError, TypeError):
            return block.text
    if kind in ("image", "audio"):
        return {
            "type": kind,
            "mimeType": getattr(block, "mime_type", None),
            "data_chars": len(getattr(block, "data", "") or ""),
        }
    if hasattr(block, "model_dump"):
        return block.model_dump(mode="json", exclude_none=True)
    return str(block)


def result_observation(result: Any) -> Any:
    """An MCP ``CallToolResult`` as an observation: ``is_error`` -> ``tool_error``; else the structured
    content if the tool declared one, else the content blocks (text parsed as JSON where it is JSON)."""
    if result.is_error:
        texts = [b.text for b in (result.content or []) if getattr(b, "type", None) == "text"]
        return error_obs("tool_error", "\n".join(texts) or "the tool reported an error")
    structured = result.structured_content
    if structured is not None:
        return structured
    values = [_content_value(b) for b in (result.content or [])]
    return values[0] if len(values) == 1 else values


# ---------------------------------------------------------------------------------- environment


def _server_config(task: Task) -> dict[str, Any]:
    """The task's server: ``env_config``'s ``command`` or ``url``, else the part of ``task.env`` after ``mcp:``."""
    cfg = dict(task.env_config)
    if "command" not in cfg and "url" not in cfg:
        server = task.env.split(":", 1)[1].strip() if ":" in task.env else ""
        if not server:
            raise ValueError(
                f"task {task.id!r}: env {task.env!r} names no MCP server "
                "(expected 'mcp:<command line>' or 'mcp:http(s)://host:port/path')"
            )
        cfg["url" if is_url(server) else "command"] = server
    return cfg


def open_client(cfg: dict[str, Any], **kw: Any) -> MCPClient:
    """The client of a server config (a task's ``env_config``, a tasks file's top level): ``url`` (with
    ``headers``) or ``command`` (with ``env`` and ``cwd``)."""
    if "url" in cfg:
        return MCPClient(cfg["url"], headers=cfg.get("headers"), **kw)
    return MCPClient(cfg["command"], env=cfg.get("env"), cwd=cfg.get("cwd"), **kw)


class MCPEnv(Environment):
    """One task against a fresh MCP server subprocess, or a new session on an HTTP server."""

    replay_safe = False  # the server's tools may reach the world: a replay needs env_config["allow_replay"]
    max_alive = MAX_SERVERS  # servers alive at once in a rollout (a tasks file may set "max_alive")

    def __init__(self, task: Task):
        super().__init__(task)
        cfg = _server_config(task)
        self.client = open_client(cfg, call_timeout_s=float(cfg.get("call_timeout_s", CALL_TIMEOUT_S)))
        self.history: list[dict[str, Any]] = []

    @property
    def tools(self) -> list[ToolSpec]:
        return self.task.tools or self.client.tool_specs()

    def call(self, call: ToolCall) -> Any:
        ran = len(self.history)
        obs = super().call(call)
        if len(self.history) > ran:  # it reached the server: keep what the agent was answered (too_large ...)
            self.history[-1]["observation"] = obs
        return obs

    def _execute(self, call: ToolCall) -> Any:
        obs, fault = self.client.call(call.name, call.arguments)
        if fault is not None:
            self._fault(fault)
        self.history.append({"call": call.to_dict(), "observation": obs})
        return obs

    def state(self) -> dict[str, Any]:
        server = {"url": self.client.url} if self.client.url else {"command": shlex.join(self.client.argv)}
        return {**server, "history": json.loads(json.dumps(self.history, default=str))}

    def done_calls(self) -> list[ToolCall]:
        """The calls this server ran that returned without an error, in order."""
        return [ToolCall.from_dict(h["call"]) for h in self.history if not is_error_obs(h["observation"])]

    def score(self, traj: Trajectory) -> Score:
        return check_trajectory(self.task, self.done_calls(), traj.replies())

    def close(self) -> None:
        self.client.close()


ENVS.add("mcp", MCPEnv)


def check_trajectory(task: Task, done: Sequence[ToolCall], replies: Sequence[str]) -> Score:
    """Generic success check: the gold calls in order among the calls ``done`` (those that ran on the server and
    returned without an error: a call answered by an error, a crashed server's included, never counts);
    expected outputs stated in the ``replies``."""
    details: dict[str, Any] = {}
    checks: list[bool] = []
    gold = task.flat_gold()
    if gold:
        calls = iter(c.key() for c in done)
        ok = all(g.key() in calls for g in gold)  # subsequence test (consumes the iterator)
        details["gold_calls_in_order"] = ok
        checks.append(ok)
    if task.expected_outputs:
        text = "\n".join(replies).lower()
        found = [states_fact(text, o) for o in task.expected_outputs]
        details["expected_outputs"] = found
        checks.extend(found)
    if not checks:
        return Score(False, 0.0, {"note": "the task has no success check (explore task)"})
    reward = sum(checks) / len(checks)
    return Score(all(checks), reward, details)


# ---------------------------------------------------------------------------------- tasks


def _list_tools(cfg: dict[str, Any]) -> list[ToolSpec]:
    client = open_client(cfg)
    try:
        return client.tool_specs()
    finally:
        client.close()


def _server_of(server: str) -> dict[str, Any]:
    return {"url": check_url(server)} if is_url(server) else {"command": server}


def explore_task(server: str, split: str = "train") -> Task:
    """One task with the server's tools (``server`` a command line or an http(s) URL), an exploration prompt, no
    gold and no success check."""
    cfg = _server_of(server)
    words = [urlsplit(server).netloc, urlsplit(server).path] if "url" in cfg else shlex.split(server)
    return Task(
        id="mcp_explore_" + "_".join(os.path.basename(w.rstrip("/")) or w for w in words if w)[:80],
        env=f"mcp:{server}",
        system_prompt="You are a helpful assistant that uses the tools of an MCP server.",
        user_turns=[EXPLORE_PROMPT],
        tools=_list_tools(cfg),
        env_config=cfg,
        split=split,
        metadata={"source": "mcp", "kind": "explore"},
    )


SERVER_KEYS = ("command", "url")
FILE_KEYS = ("env", "cwd", "headers", "call_timeout_s", "allow_replay", "max_alive")
"""What a tasks file's top level may set for every task's server, beside its one server (:data:`SERVER_KEYS`)."""


def tasks_from_file(path: str) -> list[Task]:
    """Tasks from a JSON file ``{"command": ... or "url": ..., "tasks": [...]}`` (see the module docstring)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    given = [k for k in SERVER_KEYS if k in doc]
    if len(given) != 1:
        raise ValueError(
            f"MCP tasks file {path}: give exactly one of 'command' (a server started over stdio) or 'url' (an "
            f"http(s) server), got {' and '.join(map(repr, given)) or 'neither'}"
        )
    server = check_url(doc["url"]) if given[0] == "url" else doc["command"]
    server_cfg = {given[0]: server, **{k: doc[k] for k in FILE_KEYS if k in doc}}
    tools: list[ToolSpec] | None = None
    out = []
    for i, d in enumerate(doc["tasks"]):
        d = dict(d)
        d.setdefault("id", f"{os.path.splitext(os.path.basename(path))[0]}_{i}")
        d.setdefault("env", f"mcp:{server}")
        d.setdefault(
            "system_prompt",
            doc.get("system_prompt", "You are a helpful assistant that uses the tools of an MCP server."),
        )
        d["env_config"] = {**server_cfg, **d.get("env_config", {})}
        if not d.get("tools"):
            if tools is None:
                tools = _list_tools(server_cfg)
            d["tools"] = [t.to_dict() for t in tools]
        d.setdefault("metadata", {}).setdefault("source", "mcp")
        out.append(Task.from_dict(d))
    return out


def load_mcp_tasks(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
    """``mcp:<tasks.json>`` (tasks from a file), ``mcp:<command line>`` or ``mcp:http(s)://host:port/path`` (one
    explore task, in any split)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} for mcp; valid: {', '.join(SPLITS)}")
    rest = spec.split(":", 1)[1].strip() if ":" in spec else ""
    if not rest:
        raise ValueError("mcp suite needs 'mcp:<command line>', 'mcp:http(s)://host:port/path' or 'mcp:<tasks.json>'")
    if not is_url(rest) and rest.endswith(".json") and os.path.isfile(rest):
        tasks = [t for t in tasks_from_file(rest) if split == "all" or t.split == split]
    else:
        tasks = [explore_task(rest, split="train" if split == "all" else split)]
    if n is not None and n < len(tasks):
        keep = sorted(random.Random(seed).sample(range(len(tasks)), n))
        tasks = [tasks[i] for i in keep]
    return tasks


SUITES.add("mcp", load_mcp_tasks)
