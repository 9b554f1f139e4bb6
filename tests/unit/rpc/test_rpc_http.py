"""The status-page HTTP server answers GET/HEAD on its routes, POST with a form on its post
routes, and refuses the rest."""

from __future__ import annotations

import asyncio

from nyala.rpc import HttpRequest, HttpResponse, HttpServer
from nyala.rpc.http import request_body_bytes_max


async def _request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    writer.write_eof()  # the request is complete or never will be
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def _exchange(requests: list[bytes]) -> list[bytes]:
    async def main() -> list[bytes]:
        async def hello(_request: HttpRequest) -> HttpResponse:
            return HttpResponse(200, b"hello\n")

        async def echo(request: HttpRequest) -> HttpResponse:
            said = f"{request.method} {request.param('id')} {request.headers.get('accept')}"
            return HttpResponse(303, said.encode(), headers=(("Location", "/hello"),))

        async def broken(_request: HttpRequest) -> HttpResponse:
            raise RuntimeError("page bug")

        server = HttpServer(
            "127.0.0.1:0",
            {"/hello": hello, "/broken": broken, "/echo": echo},
            {"/echo": echo},
        )
        await server.start()
        try:
            return [await _request(server.port, raw) for raw in requests]
        finally:
            await server.stop()
            await server.wait_closed()

    return asyncio.run(main())


def test_get_head_and_errors() -> None:
    get, head, missing, post, broken, garbage = _exchange(
        [
            b"GET /hello?x=1 HTTP/1.1\r\nHost: a\r\n\r\n",
            b"HEAD /hello HTTP/1.1\r\n\r\n",
            b"GET /nope HTTP/1.1\r\n\r\n",
            b"POST /hello HTTP/1.1\r\n\r\n",
            b"GET /broken HTTP/1.1\r\n\r\n",
            b"NONSENSE\r\n\r\n",
        ]
    )
    assert get.startswith(b"HTTP/1.1 200 OK\r\n")
    assert get.endswith(b"\r\n\r\nhello\n")
    assert b"Content-Length: 6\r\n" in get
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert head.endswith(b"\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 404 ")
    assert post.startswith(b"HTTP/1.1 405 ")
    assert broken.startswith(b"HTTP/1.1 500 ")
    assert garbage.startswith(b"HTTP/1.1 400 ")


def test_a_client_that_never_finishes_its_request_gets_400() -> None:
    (answer,) = _exchange([b"GET /hello HTTP/1.1\r\n"])  # EOF before the blank line
    assert answer.startswith(b"HTTP/1.1 400 ")


def test_query_headers_and_post_forms() -> None:
    too_big = request_body_bytes_max + 1
    query, form, unsized, oversized = _exchange(
        [
            b"GET /echo?id=a%20b HTTP/1.1\r\nAccept: text/html\r\n\r\n",
            b"POST /echo HTTP/1.1\r\nContent-Length: 7\r\n\r\nid=x%26",
            b"POST /echo HTTP/1.1\r\nContent-Length: many\r\n\r\nid=1",
            b"POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % too_big,
        ]
    )
    assert query.startswith(b"HTTP/1.1 303 See Other\r\n")
    assert b"Location: /hello\r\n" in query
    assert query.endswith(b"GET a b text/html")
    assert form.endswith(b"POST x& None")
    assert unsized.startswith(b"HTTP/1.1 400 ")
    assert oversized.startswith(b"HTTP/1.1 400 ")
