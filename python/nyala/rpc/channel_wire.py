"""The framing of a server's peer channel, shared by its server side
(``nyala.consensus.runtime.peer_channel``) and the client's write calls
(``nyala.client.write_pipe``): a connection opens with one of the magics below, then each side
writes frames, a 4-byte big-endian length and that many bytes."""

from __future__ import annotations

import struct

#: What a peer that sends consensus batches writes first: the channel's name and its version.
MAGIC = b"NYPC\x00\x00\x00\x01"
#: What a client that sends write calls writes first (the same length as ``MAGIC``).
WRITE_MAGIC = b"NYWC\x00\x00\x00\x01"
#: A frame's length prefix.
LENGTH = struct.Struct(">I")

__all__ = ["LENGTH", "MAGIC", "WRITE_MAGIC"]
