"""Changing a service's method handlers while it registers, once, instead of on every call.

A generated ``add_<Service>Servicer_to_server`` calls two methods of the server it is given:
``add_generic_rpc_handlers`` and ``add_registered_method_handlers``. ``HandlerStandIn`` takes
the server's place and passes every method handler through ``replace`` before handing it on.
gRPC serves a method through its registered handler when there is one; the generic handler
registered next to it is a fallback, replaced too when ``generic`` is set (a check must be;
replaced serializers need not, as handlers accept the generated ones as well). Stand-ins
chain: one can stand in for another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias, cast

import grpc

_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
#: (``/package.Service/Method``, its handler) -> the handler to register instead.
Replace: TypeAlias = Callable[[str, _Handler], _Handler]


class _ReplacedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose method handlers are replaced (once per method)."""

    def __init__(self, inner: grpc.GenericRpcHandler, replace: Replace) -> None:
        self._inner = inner
        self._replace = replace
        self._replaced: dict[str, _Handler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> _Handler | None:
        method = handler_call_details.method
        replaced = self._replaced.get(method)
        if replaced is None:
            handler = self._inner.service(handler_call_details)
            if handler is None:
                return None
            replaced = self._replaced[method] = self._replace(method, handler)
        return replaced


class HandlerStandIn:
    """Stands in for ``server`` while a service registers (module docstring)."""

    def __init__(self, server: grpc.aio.Server, replace: Replace, *, generic: bool) -> None:
        self._server = server
        self._replace = replace
        self._generic = generic

    def as_server(self) -> grpc.aio.Server:
        """This stand-in, typed as what ``add_<Service>Servicer_to_server`` takes."""
        return cast(grpc.aio.Server, self)

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        if self._generic:
            handlers = tuple(_ReplacedGeneric(h, self._replace) for h in handlers)
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, _Handler]
    ) -> None:
        replaced = {
            name: self._replace(f"/{service}/{name}", handler) for name, handler in handlers.items()
        }
        self._server.add_registered_method_handlers(service, replaced)
