"""What the RPC layer assumes of nyala's request and response messages (the generated
``nyala._proto`` classes): every request names its server (``dest_uuid``) and every response
may carry an ``ErrorPB`` (``error``). Type-checking only; the messages need no base class."""

from __future__ import annotations

from typing import Literal, Protocol

from nyala._proto import common_pb2


class Addressed(Protocol):
    """A request as a server receives it: it names the server it is for."""

    @property
    def dest_uuid(self) -> str: ...


class Addressable(Protocol):
    """A request whose ``dest_uuid`` the caller fills in once it knows the server."""

    dest_uuid: str


class Answer(Protocol):
    """A response: its ``error`` is set when the server refused the call."""

    @property
    def error(self) -> common_pb2.ErrorPB: ...

    def HasField(self, field_name: Literal["error"]) -> bool: ...

    def SerializeToString(self) -> bytes: ...


__all__ = ["Addressable", "Addressed", "Answer"]
