"""The status-page HTTP server answers GET/HEAD on its routes and refuses the rest."""

from __future__ import annotations

import asyncio

from nyala.rpc import HttpResponse, HttpServer


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
        async def hello() -> HttpResponse:
            return HttpResponse(200, b"hello\n")

        async def broken() -> HttpResponse:
            raise RuntimeError("page bug")

        server = HttpServer("127.0.0.1:0", {"/hello": hello, "/broken": broken})
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
