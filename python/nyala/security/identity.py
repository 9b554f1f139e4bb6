"""Who is on the other end of a connection: the identity a certificate of the cluster CA
names, and what it may do.

A certificate names its holder in one URI subject alternative name, ``nyala://<kind>/<name>``:
``server`` (a master or tablet server, ``name`` its UUID), ``admin`` or ``user`` (a person or
program, ``name`` the user name), or ``join`` (a join credential: it may only ask a master to
sign a tablet server's certificate). The kinds are ordered by what they may do (``Role``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from nyala.errors import InvalidArgumentError

URI_SCHEME = "nyala://"
#: The DNS name a server's certificate carries for its UUID: a peer that knows the UUID it
#: wants (``dest_uuid``) checks the certificate against it (``grpc.ssl_target_name_override``).
SERVER_DNS_SUFFIX = ".server.nyala"
#: A second URI subject alternative name that marks session credentials (short-lived, issued by
#: a master to a user for itself: they may not be used to get more of them).
SESSION_URI = "nyala://session"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,127}$")


class Role(enum.IntEnum):
    """What an RPC requires of its caller; a caller of a higher role may call it too."""

    NONE = 0  # anyone with a certificate of this cluster (a join credential included)
    USER = 1  # clients: reads, writes, DDL
    ADMIN = 2  # operators: replica moves, config changes, tombstones, unsafe recovery
    SERVER = 3  # masters and tablet servers: Raft, heartbeats, tablet copy, tablet creation


class Kind(enum.StrEnum):
    """The kind of holder a certificate names."""

    JOIN = "join"
    USER = "user"
    ADMIN = "admin"
    SERVER = "server"


_ROLE_OF_KIND = {
    Kind.JOIN: Role.NONE,
    Kind.USER: Role.USER,
    Kind.ADMIN: Role.ADMIN,
    Kind.SERVER: Role.SERVER,
}


@dataclass(frozen=True)
class Identity:
    """The holder of a certificate: its kind and name (a server's name is its UUID)."""

    kind: Kind
    name: str

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidArgumentError(
                f"name {self.name!r} must be 1-128 letters, digits or _.@- (not starting with "
                f"one of .@-)"
            )

    @property
    def role(self) -> Role:
        """What this holder may call."""
        return _ROLE_OF_KIND[self.kind]

    @property
    def uri(self) -> str:
        """The URI subject alternative name that carries this identity."""
        return f"{URI_SCHEME}{self.kind.value}/{self.name}"

    @classmethod
    def from_uri(cls, uri: str) -> Identity:
        """Parses ``nyala://<kind>/<name>``; ``InvalidArgumentError`` for anything else."""
        if not uri.startswith(URI_SCHEME):
            raise InvalidArgumentError(f"not a nyala identity: {uri!r}")
        kind, sep, name = uri[len(URI_SCHEME) :].partition("/")
        if not sep or kind not in Kind._value2member_map_:
            raise InvalidArgumentError(f"not a nyala identity: {uri!r}")
        return cls(Kind(kind), name)

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name}"


def server_dns_name(server_uuid: str) -> str:
    """The DNS name in a server's certificate that binds it to its UUID."""
    return f"{server_uuid}{SERVER_DNS_SUFFIX}"
