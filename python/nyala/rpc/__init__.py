"""The RPC layer: gRPC servers and channels, the HTTP status server, and the wire <-> exception
mapping. It is the only package that opens sockets (STYLE.md 6); everything above it talks
through ``ServerProxy``/``RpcServer``/``HttpServer``.
"""

from __future__ import annotations

from nyala.rpc.channel import BlockingServerProxy, ServerProxy
from nyala.rpc.errors import error_from_pb, error_to_pb, join_host_port, split_host_port
from nyala.rpc.http import HttpRequest, HttpResponse, HttpServer
from nyala.rpc.server import RpcServer
from nyala.rpc.service import (
    Context,
    RpcMetrics,
    ServiceBase,
    bidi_stream,
    check_dest_uuid,
    server_stream,
    unary,
)
from nyala.rpc.settings import RpcSettings

__all__ = [
    "BlockingServerProxy",
    "Context",
    "HttpRequest",
    "HttpResponse",
    "HttpServer",
    "RpcMetrics",
    "RpcServer",
    "RpcSettings",
    "ServerProxy",
    "ServiceBase",
    "bidi_stream",
    "check_dest_uuid",
    "error_from_pb",
    "error_to_pb",
    "join_host_port",
    "server_stream",
    "split_host_port",
    "unary",
]
