"""A live ``envace serve`` for tests: started in a subprocess on a free loopback port, stopped on exit."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import IO, Iterator


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
