"""A minimal HTTP/1.1 server on asyncio streams for the status pages (/healthz, /metrics, the
web UI). A secure server serves them over TLS (``tls``: an ``ssl.SSLContext`` that asks for a
client certificate without requiring one) and passes every request with the client's
certificate, if any, to ``authorize``, which may refuse it (docs/security.md).

GET and HEAD, and POST with a small form body (the web UI's few actions, such as cancelling a
tablet copy); one request per connection, bounded head and body size and read time: these
pages are for operators and Prometheus, not for data, so simplicity beats features (and no
dependency is needed).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from nyala.errors import NetworkError
from nyala.rpc.errors import join_host_port, split_host_port

log = logging.getLogger(__name__)

request_head_bytes_max = 16 * 1024
request_body_bytes_max = 64 * 1024
request_read_timeout_ms = 5_000

_REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class HttpResponse:
    """What a route answers."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    # Extra header lines (e.g. ``Location`` of a redirect).
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class HttpRequest:
    """What a route is asked: the method, the path, the query and (POST) form parameters, and
    the request's headers (names in lower case)."""

    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    form: dict[str, list[str]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def param(self, name: str, default: str = "") -> str:
        """The first value of ``name`` in the form or, failing that, the query."""
        values = self.form.get(name) or self.query.get(name)
        return values[0] if values else default


Route = Callable[[HttpRequest], Awaitable[HttpResponse]]
#: A secure server's check of a request: the request and the client certificate (DER) it
#: presented, if any; returns the refusal, or None to serve it.
Authorize = Callable[[HttpRequest, bytes | None], HttpResponse | None]


class HttpServer:
    """Serves ``routes`` (exact paths; the query string goes to the route) on ``bind``.
    ``post_routes`` are the paths that accept POST (a form body)."""

    def __init__(
        self,
        bind: str,
        routes: dict[str, Route],
        post_routes: dict[str, Route] | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        authorize: Authorize | None = None,
    ) -> None:
        self._host, self._port = split_host_port(bind)
        self._routes = routes
        self._post_routes = post_routes or {}
        self._tls = tls
        self._authorize = authorize
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
            self._server = await asyncio.start_server(
                self._serve,
                self._host,
                self._port,
                ssl=self._tls,
                ssl_handshake_timeout=None if self._tls is None else request_read_timeout_ms / 1000,
            )
        except OSError as exc:
            target = join_host_port(self._host, self._port)
            raise NetworkError(f"cannot bind HTTP address {target}: {exc.strerror}") from None
        sockets: Any = self._server.sockets
        self.port = int(sockets[0].getsockname()[1])
        log.info("http%s server listening on %s", "s" if self._tls else "", self.address)

    @property
    def scheme(self) -> str:
        """``https`` for a secure server, else ``http``."""
        return "https" if self._tls is not None else "http"

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
                request = _parse_head(head)
                if isinstance(request, HttpRequest) and request.method == "POST":
                    request = await _read_form(reader, request)
            if isinstance(request, HttpResponse):
                response, head_only = request, False
            else:
                refusal = self._refusal(request, writer)
                if refusal is not None:
                    response, head_only = refusal, False
                else:
                    response, head_only = await self._respond(request)
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

    def _refusal(self, request: HttpRequest, writer: asyncio.StreamWriter) -> HttpResponse | None:
        if self._authorize is None:
            return None
        ssl_object = writer.get_extra_info("ssl_object")
        der = None if ssl_object is None else ssl_object.getpeercert(binary_form=True)
        return self._authorize(request, der)

    async def _respond(self, request: HttpRequest) -> tuple[HttpResponse, bool]:
        routes = self._post_routes if request.method == "POST" else self._routes
        route = routes.get(request.path)
        if route is None:
            if request.method == "POST" and request.path in self._routes:
                return HttpResponse(405, b"only GET and HEAD here\n"), False
            return HttpResponse(404, b"not found\n"), request.method == "HEAD"
        return await route(request), request.method == "HEAD"


def _parse_head(head: bytes) -> HttpRequest | HttpResponse:
    """The request of ``head`` (request line and headers), or the error to answer."""
    if len(head) > request_head_bytes_max:
        return HttpResponse(400, b"request head too large\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return HttpResponse(400, b"bad request line\n")
    method, target, _version = parts
    if method not in ("GET", "HEAD", "POST"):
        return HttpResponse(405, b"only GET, HEAD and POST\n")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    url = urlsplit(target)
    return HttpRequest(method, url.path, parse_qs(url.query), {}, headers)


async def _read_form(reader: asyncio.StreamReader, request: HttpRequest) -> HttpRequest:
    """``request`` with its form body (``application/x-www-form-urlencoded``) read."""
    try:
        length = int(request.headers.get("content-length", "0"))
    except ValueError:
        length = -1
    if not 0 <= length <= request_body_bytes_max:
        raise asyncio.LimitOverrunError("request body too large or unsized", 0)
    body = await reader.readexactly(length) if length else b""
    form = parse_qs(body.decode("latin-1"))
    return HttpRequest(request.method, request.path, request.query, form, request.headers)


def _encode(response: HttpResponse, head_only: bool) -> bytes:
    reason = _REASONS.get(response.status, "Unknown")
    head = (
        f"HTTP/1.1 {response.status} {reason}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in response.headers)
        + "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return head if head_only else head + response.body
