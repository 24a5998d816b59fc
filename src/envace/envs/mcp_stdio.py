"""The stdio transport to one MCP server process: the server dies with envace, and its exit is known.

The MCP SDK's ``stdio_client`` hides the server process, so a crash shows only as a closed stream
(``ClosedResourceError``) and a server outlives an ``envace`` that was killed (``kill -9``) while the server was
busy in a tool call (it never reads the end of its stdin). :func:`stdio_process` is that transport with the
process kept:

- the server runs in its own process group (``close`` ends the group: the server and whatever it started);
- on Linux it is started through a tiny launcher (:data:`LAUNCHER`, this interpreter with ``-I -S``) that asks
  the kernel to SIGKILL it when the thread that started it dies (``prctl(PR_SET_PDEATHSIG)``, kept across
  ``exec``), then ``exec``s the server: the server has the launcher's pid, and it dies with the client's event
  loop thread, whichever way the process ends;
- the process is yielded with the streams, so a failed call can say how the server ended
  (:func:`exit_reason`).

The message framing (one JSON-RPC message per line) is the SDK's own (``mcp.client.stdio``).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, TextIO

import anyio
import mcp.types as types
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

PR_SET_PDEATHSIG = 1  # linux/prctl.h
LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    f"    ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"  # the parent died before prctl: nobody will read this server
    "    os._exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
"""Run as ``python -I -S -c LAUNCHER <parent pid> <argv...>``: set the parent-death signal, then become the server."""
GRACE_S = 2.0
"""How long a closing server may take to exit after its stdin closes, and after SIGTERM, before the next signal."""


def launch_argv(argv: list[str], parent_pid: int, platform: str = sys.platform) -> list[str]:
    """The argv that starts ``argv`` so that it dies with its parent (Linux), else ``argv`` itself."""
    if not platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, str(parent_pid), *argv]


def check_program(program: str, env: dict[str, str], cwd: str | None = None) -> None:
    """Raise ``FileNotFoundError`` (as ``exec`` would) when ``program`` is neither a path that exists nor on the
    ``PATH`` of ``env``: through the launcher, a missing program would otherwise look like a server that exited."""
    if os.sep in program:
        found = os.path.exists(os.path.join(cwd or "", program))
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def exit_reason(returncode: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` (a negative return code is the signal that ended the process)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


async def end_process(process: Process, grace_s: float = GRACE_S) -> None:
    """Let the server exit on its own (its stdin is closed), then SIGTERM its process group, then SIGKILL it."""
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            try:
                os.killpg(process.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        with anyio.move_on_after(grace_s):
            await process.wait()
            break
    try:
        os.killpg(process.pid, signal.SIGKILL)  # what the server started in its group goes with it
    except (ProcessLookupError, PermissionError):
        pass


@asynccontextmanager
async def stdio_process(
    argv: list[str], env: dict[str, str] | None, cwd: str | None, errlog: TextIO
) -> AsyncIterator[tuple[Any, Any, Process]]:
    """Start the server; yield ``(read stream, write stream, process)`` for a ``ClientSession``; on exit close its
    stdin and end it (:func:`end_process`), even when cancelled."""
    full_env = {**get_default_environment(), **(env or {})}
    check_program(argv[0], full_env, cwd)
    process = await anyio.open_process(
        launch_argv(argv, os.getpid()), env=full_env, cwd=cwd, stderr=errlog, start_new_session=True
    )
    read_writer, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    gone = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)

    async def stdout_reader() -> None:
        try:
            async with read_writer:
                buffer = ""
                async for chunk in TextReceiveStream(process.stdout, encoding="utf-8", errors="replace"):
                    *lines, buffer = (buffer + chunk).split("\n")
                    for line in lines:
                        try:
                            message: Any = SessionMessage(types.jsonrpc_message_adapter.validate_json(line))
                        except Exception as exc:  # noqa: BLE001 - the session reports a line that is not JSON-RPC
                            message = exc
                        await read_writer.send(message)
        except gone:
            pass

    async def stdin_writer() -> None:
        try:
            async with write_reader:
                async for m in write_reader:
                    text = m.message.model_dump_json(by_alias=True, exclude_unset=True)  # as the SDK's stdio_client
                    await process.stdin.send((text + "\n").encode("utf-8"))
        except gone:
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream, process
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await process.stdin.aclose()
                except Exception:  # noqa: BLE001 - already closed
                    pass
                await end_process(process)
                tg.cancel_scope.cancel()
                for s in (read_stream, write_stream, read_writer, write_reader):
                    await s.aclose()
                await process.aclose()
