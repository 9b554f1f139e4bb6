"""What a message costs on a gRPC asyncio stream, the consensus transport
(``ConsensusPeerStream``), next to the same messages over a plain asyncio TCP connection with a
4-byte length prefix, measured in the same run on loopback.

Each case sends ``N`` messages of one size from a client process to a server process that reads
them and answers each with 2 bytes; the client writes on without waiting for the answers (as a
leader pipelines AppendEntries). The plain server reads each message straight into a buffer of
its size (``asyncio.BufferedProtocol``), as a transport written for this would. Reported per
side: CPU microseconds per message (``getrusage`` of the whole process, gRPC's own threads
included) and, both sides together, CPU nanoseconds per payload byte, for 100-byte messages
(heartbeats, answers) and 1 MiB messages (a bulk load's AppendEntries). ``grpc_vs_raw_*`` = gRPC
CPU / plain CPU, both sides together. It is the figure behind docs/performance.md, "What a
consensus message costs": what a transport outside grpc.aio could save.

Usage: ``python benches/rpc_stream_bench.py [--quick]``; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import statistics
import struct
import time
from typing import Any

import grpc

SMALL_BYTES = 100
LARGE_BYTES = 1 << 20
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]
METHOD = "/bench.Stream/Echo"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- servers (child process): read every message, answer each with 2 bytes -------------------


async def grpc_server(ready: Any, done: Any) -> None:
    async def echo(requests: Any, context: Any) -> Any:
        started = cpu_s()
        async for _ in requests:
            yield b"ok"
        done.put(cpu_s() - started)

    server = grpc.aio.server(options=OPTIONS)
    handler = grpc.method_handlers_generic_handler(
        "bench.Stream", {"Echo": grpc.stream_stream_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    ready.put(server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    await server.wait_for_termination()


class _Frames(asyncio.BufferedProtocol):
    """Reads length-prefixed messages straight into one buffer per message (no copy after the
    kernel's) and answers each with 2 bytes: how a transport outside gRPC would read."""

    def __init__(self, done: Any) -> None:
        self.done = done
        self.head = bytearray(4)
        self.body = bytearray()
        self.filled = 0
        self.in_head = True
        self.started = cpu_s()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        target = self.head if self.in_head else self.body
        return memoryview(target)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.in_head and self.filled == 4:
            self.body = bytearray(struct.unpack("<I", self.head)[0])
            self.in_head, self.filled = False, 0
        elif not self.in_head and self.filled == len(self.body):
            self.transport.write(b"\x02\x00\x00\x00ok")
            self.in_head, self.filled = True, 0

    def eof_received(self) -> None:
        self.done.put(cpu_s() - self.started)


async def raw_server(ready: Any, done: Any) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Frames(done), "127.0.0.1", 0)
    ready.put(server.sockets[0].getsockname()[1])
    await server.serve_forever()


def serve(kind: str, ready: Any, done: Any) -> None:
    asyncio.run(grpc_server(ready, done) if kind == "grpc" else raw_server(ready, done))


# --- clients (this process) ------------------------------------------------------------------


async def grpc_client(port: int, size: int, count: int) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as channel:
        call = channel.stream_stream(METHOD)()
        payload = os.urandom(size)
        started = cpu_s()

        async def answers() -> None:
            seen = 0
            async for _ in call:
                seen += 1
                if seen == count:
                    return

        reading = asyncio.create_task(answers())
        for _ in range(count):
            await call.write(payload)
        await reading
        await call.done_writing()
        return cpu_s() - started


async def raw_client(port: int, size: int, count: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload, head = os.urandom(size), struct.pack("<I", size)
    started = cpu_s()

    async def answers() -> None:
        for _ in range(count):
            length = struct.unpack("<I", await reader.readexactly(4))[0]
            await reader.readexactly(length)

    reading = asyncio.create_task(answers())
    for _ in range(count):
        writer.write(head)
        writer.write(payload)
        await writer.drain()
    await reading
    elapsed = cpu_s() - started
    writer.close()
    await writer.wait_closed()
    return elapsed


def one_case(kind: str, size: int, count: int) -> tuple[float, float]:
    """(client CPU s, server CPU s) of ``count`` messages of ``size`` bytes."""
    context = multiprocessing.get_context("spawn")
    ready, done = context.Queue(), context.Queue()
    server = context.Process(target=serve, args=(kind, ready, done), daemon=True)
    server.start()
    try:
        port = ready.get(timeout=60)
        client = grpc_client if kind == "grpc" else raw_client
        client_s = asyncio.run(client(port, size, count))
        return client_s, done.get(timeout=60)
    finally:
        server.terminate()
        server.join()


def figures(size: int, count: int, repeats: int) -> dict[str, float]:
    out: dict[str, float] = {}
    label = "small" if size == SMALL_BYTES else "1mib"
    for kind in ("grpc", "raw"):
        runs = [one_case(kind, size, count) for _ in range(repeats)]
        client_s = statistics.median(r[0] for r in runs)
        server_s = statistics.median(r[1] for r in runs)
        out[f"{kind}_client_us_per_msg_{label}"] = client_s / count * 1e6
        out[f"{kind}_server_us_per_msg_{label}"] = server_s / count * 1e6
        out[f"{kind}_ns_per_byte_{label}"] = (client_s + server_s) / (count * size) * 1e9
        print(
            f"{kind:4} {size:>8} B x {count}: client {client_s / count * 1e6:7.1f} us/msg, "
            f"server {server_s / count * 1e6:7.1f} us/msg, "
            f"{(client_s + server_s) / (count * size) * 1e9:7.2f} ns/B both sides",
            flush=True,
        )
    grpc_total = out[f"grpc_client_us_per_msg_{label}"] + out[f"grpc_server_us_per_msg_{label}"]
    raw_total = out[f"raw_client_us_per_msg_{label}"] + out[f"raw_server_us_per_msg_{label}"]
    out[f"grpc_vs_raw_{label}"] = grpc_total / raw_total
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (< 1 minute)")
    args = parser.parse_args()
    scale = 1 if args.quick else 4
    started = time.perf_counter()
    results: dict[str, float] = {}
    results.update(figures(SMALL_BYTES, 5_000 * scale, 3))
    results.update(figures(LARGE_BYTES, 200 * scale, 3))
    results["elapsed_s"] = time.perf_counter() - started
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()
