"""A minimal HTTP/1.1 server on asyncio streams for the status pages (/healthz, /metrics, ...).

Only GET and HEAD, one request per connection, bounded header size and read time: these pages
are for operators and Prometheus, not for data, so simplicity beats features (and no
dependency is needed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nyala.errors import NetworkError
from nyala.rpc.errors import join_host_port, split_host_port

log = logging.getLogger(__name__)

request_head_bytes_max = 16 * 1024
request_read_timeout_ms = 5_000

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class HttpResponse:
    """What a route answers."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[], Awaitable[HttpResponse]]


class HttpServer:
    """Serves ``routes`` (exact paths; the query string is ignored) on ``bind``."""

    def __init__(self, bind: str, routes: dict[str, Route]) -> None:
        self._host, self._port = split_host_port(bind)
        self._routes = routes
        self._server: asyncio.Server | None = None
        self._closed = asyncio.Event()
        self.port = 0

    @property
    def address(self) -> str:
        """``host:port`` actually bound (after ``start``)."""
        return join_host_port(self._host, self.port)

    async def start(self) -> None:
        """Binds and starts accepting; ``NetworkError`` if the bind fails."""
        try:
            self._server = await asyncio.start_server(self._serve, self._host, self._port)
        except OSError as exc:
            target = join_host_port(self._host, self._port)
            raise NetworkError(f"cannot bind HTTP address {target}: {exc.strerror}") from None
        sockets: Any = self._server.sockets
        self.port = int(sockets[0].getsockname()[1])
        log.info("http server listening on %s", self.address)

    async def stop(self) -> None:
        """Stops accepting; connections in progress finish on their own (they are short)."""
        if self._server is not None:
            self._server.close()
        self._closed.set()

    async def wait_closed(self) -> None:
        """Returns once ``stop`` was called: the server's task in its owner's TaskGroup."""
        await self._closed.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(request_read_timeout_ms / 1000):
                head = await reader.readuntil(b"\r\n\r\n")
            response, head_only = await self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            response, head_only = HttpResponse(400, b"bad request\n"), False
        except Exception:  # a broken page must not take the server down
            log.exception("http handler failed")
            response, head_only = HttpResponse(500, b"internal error\n"), False
        try:
            writer.write(_encode(response, head_only))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _respond(self, head: bytes) -> tuple[HttpResponse, bool]:
        if len(head) > request_head_bytes_max:
            return HttpResponse(400, b"request head too large\n"), False
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3:
            return HttpResponse(400, b"bad request line\n"), False
        method, target, _version = parts
        if method not in ("GET", "HEAD"):
            return HttpResponse(405, b"only GET and HEAD\n"), False
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return HttpResponse(404, b"not found\n"), method == "HEAD"
        return await route(), method == "HEAD"


def _encode(response: HttpResponse, head_only: bool) -> bytes:
    reason = _REASONS.get(response.status, "Unknown")
    head = (
        f"HTTP/1.1 {response.status} {reason}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return head if head_only else head + response.body
