"""The streamable HTTP transport to an MCP server that runs elsewhere (``mcp:http://host:port/mcp``).

The server is not envace's: nothing is started or ended here. :func:`http_transport` opens the MCP SDK's
``streamable_http_client`` on one ``httpx2`` client (the HTTP client of ``mcp`` 2.x) and yields the same
``(read, write, process)`` triple as :func:`.mcp_stdio.stdio_process`, with no process. On leaving it the session
is ended (an HTTP ``DELETE``, where the server gave one) and the client closed, so no connection or task outlives
:meth:`envace.envs.mcp.MCPClient.close`.

How the failures look to :class:`~envace.envs.mcp.MCPClient` (which turns them into one-line errors):

- nothing listens at the URL: the first request fails (``httpx2.ConnectError``) and ends the transport;
- the server stops mid-run: the next call's request fails the same way, and the pending call is answered
  ``Connection closed`` by the session;
- an answer that is not MCP JSON-RPC (another content type, a body that is not JSON): the SDK answers the request
  with a JSON-RPC error of its own (``Unexpected content type: ...``, ``Failed to parse JSON response: ...``), which
  the client tells from a server's error (:data:`envace.envs.mcp.NOT_MCP_ANSWERS`); an exception the transport hands
  to the session instead of a message (older SDKs) reaches the client's message handler;
- a status that is not 2xx (a 500, a redirect off the server's origin): ``httpx2.HTTPStatusError`` ends the transport.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

SCHEMES = ("http", "https")
REQUEST_TIMEOUT_S = 30.0  # connect / write / pool; a call's wait for its answer is the session's read timeout
STREAM_READ_TIMEOUT_S = 300.0  # an idle server-sent event stream (the SDK's default)


def check_url(url: str) -> str:
    """``url`` itself if it is an ``http(s)://host[:port][/path]`` URL, else a one-line ``ValueError`` saying why."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(
            f"MCP server URL {url!r} is not an http(s)://host[:port]/path URL (valid schemes: {', '.join(SCHEMES)})"
        )
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number or out of range
    except ValueError as e:
        raise ValueError(f"MCP server URL {url!r} has a bad port: {e}") from None
    return url


@asynccontextmanager
async def http_transport(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[tuple[Any, Any, None]]:
    """Yield ``(read stream, write stream, None)`` for a ``ClientSession`` to the server at ``url``; on exit end
    the session and close the HTTP client, even when cancelled."""
    timeout = httpx2.Timeout(REQUEST_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
    async with create_mcp_http_client(headers=headers, timeout=timeout) as client:
        async with streamable_http_client(check_url(url), http_client=client) as (read, write):
            yield read, write, None
