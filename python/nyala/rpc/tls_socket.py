"""TLS on a socket for asyncio, done by the extension (``nyala._native.TlsSession``, rustls)
a frame at a time rather than a record at a time.

asyncio's own TLS transport (``loop.create_connection(ssl=...)``) runs Python's ``ssl`` on
memory buffers: each 16 KiB record is a call of its own, copied from the socket into a
buffer, into OpenSSL's, then decrypted into the protocol's, with a pure-Python state machine
around each step. On the peer channel, whose frames are the bulk of a replicated write's
bytes between servers, a secure cluster's servers spent more on that machinery than on the
encryption (docs/security.md, "Cost"). A ``TlsSession`` reads the socket in large chunks and
decrypts every whole record into the protocol's buffer in one call, and encrypts a whole
frame and writes its records with one ``writev``, with the GIL released.

``tls_handshake`` shakes hands on a connected socket; ``SocketTlsTransport`` then drives an
``asyncio.Protocol`` or ``asyncio.BufferedProtocol`` over it, with the transport calls a
stream or a protocol uses (write, writelines, pause and resume reading, flow control, close,
``get_extra_info`` with ``peercert`` in ``ssl.SSLSocket.getpeercert``'s shape). The socket
stays this module's: the session only borrows its descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from cryptography import x509

from nyala import _native

# Bytes read and handed to the protocol per readiness callback before the loop gets a turn.
_READ_BUDGET_BYTES = 1 << 20
_RECV_BYTES = 256 * 1024
# Write-buffer limits (asyncio's defaults for its transports), in plaintext bytes.
_HIGH_WATER = 64 * 1024
_LOW_WATER = 16 * 1024
# TlsSession.handshake's answers.
_DONE, _WANT_READ = 0, 1


def tls_config(
    ca_pem: bytes, cert_pem: bytes, key_pem: bytes, *, server: bool
) -> _native.TlsConfig:
    """One side's configuration: this side shows ``cert_pem`` and
    requires a certificate of ``ca_pem`` from the other. Made once: loading the keys is most
    of a connection's setup."""
    make = _native.TlsConfig.server if server else _native.TlsConfig.client
    return make(ca_pem, cert_pem, key_pem)


async def tls_handshake(
    sock: socket.socket, config: _native.TlsConfig, *, server_hostname: str | None = None
) -> _native.TlsSession:
    """Completes the handshake on a connected socket (non-blocking from here on) and returns
    its ``_native.TlsSession``; a client checks the server's certificate names
    ``server_hostname``. Raises ``ConnectionError`` (or ``OSError``) as the handshake fails,
    and closes the socket then (also when cancelled: the caller bounds how long it may
    take)."""
    loop = asyncio.get_running_loop()
    try:
        sock.setblocking(False)
        session = _native.TlsSession(config, sock.fileno(), server_hostname)
        while (step := session.handshake()) != _DONE:
            await _ready(loop, sock, write=step != _WANT_READ)
    except BaseException:
        sock.close()
        raise
    return session


async def _ready(loop: asyncio.AbstractEventLoop, sock: socket.socket, *, write: bool) -> None:
    """Until ``sock`` is readable (or writable)."""
    waiter: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await waiter
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


def peercert_of(der: bytes | None) -> dict[str, Any] | None:
    """A peer certificate (DER) in the shape ``ssl.SSLSocket.getpeercert`` gives: its subject
    alternative names, which is what the channel's checks read; plus ``not_before_ms``, the
    start of its validity in Unix ms (what a check of revoked users reads)."""
    if der is None:
        return None
    cert = x509.load_der_x509_certificate(der)
    not_before_ms = int(cert.not_valid_before_utc.timestamp() * 1000)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return {"subjectAltName": (), "not_before_ms": not_before_ms}
    names = [("DNS", name) for name in sans.get_values_for_type(x509.DNSName)]
    names += [("URI", uri) for uri in sans.get_values_for_type(x509.UniformResourceIdentifier)]
    return {"subjectAltName": tuple(names), "not_before_ms": not_before_ms}


class SocketTlsTransport(asyncio.Transport):
    """A transport over a socket whose TLS session's handshake is done (module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        session: _native.TlsSession,
        protocol: asyncio.BaseProtocol,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._session = session
        self._protocol = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)
        self._chunk = bytearray()  # an unbuffered protocol's reads (made at the first)
        self._extra: dict[str, Any] = {
            "socket": sock,
            "peercert": peercert_of(session.peer_certificate()),
            "cipher": session.cipher(),
        }
        with contextlib.suppress(OSError):
            self._extra["peername"] = sock.getpeername()
            self._extra["sockname"] = sock.getsockname()
        self._unsent = 0  # plaintext bytes whose records wait for the socket
        self._writing_paused = False
        self._reading = True
        self._reader_added = False
        self._writer_added = False
        self._closing = False
        self._closed = False
        loop.call_soon(self._start)

    # --- life -----------------------------------------------------------------------------

    def _start(self) -> None:
        if self._closed:
            return
        self._protocol.connection_made(self)
        if self._session.wants_write():
            self._flush()  # what the handshake left queued
        if self._reading and not self._closing:
            self._add_reader()
            # Records that came with the handshake's last ones wait in the session, where
            # the socket's readiness does not show them.
            self._loop.call_soon(self._on_readable)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Closes once what was written is sent."""
        if self._closing:
            return
        self._closing = True
        self._remove_reader()
        if not self._unsent:
            self._loop.call_soon(self._finish, None)

    def abort(self) -> None:
        self._closing = True
        self._finish(None)

    def _finish(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = self._closing = True
        self._remove_reader()
        self._remove_writer()
        self._unsent = 0
        if exc is None:
            with contextlib.suppress(OSError):
                self._session.close_notify()  # the peer's is not waited for
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # --- reading --------------------------------------------------------------------------

    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        self._reading = False
        self._remove_reader()

    def resume_reading(self) -> None:
        if self._reading or self._closing:
            return
        self._reading = True
        self._add_reader()
        self._loop.call_soon(self._on_readable)  # plaintext may wait in the session

    def _add_reader(self) -> None:
        if not self._reader_added:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reader_added = True

    def _remove_reader(self) -> None:
        if self._reader_added:
            self._loop.remove_reader(self._fd)
            self._reader_added = False

    def _on_readable(self) -> None:
        budget = _READ_BUDGET_BYTES
        protocol: Any = self._protocol
        while self._reading and not self._closing and budget > 0:
            try:
                if self._buffered:
                    buffer = protocol.get_buffer(-1)
                    if not len(buffer):
                        raise RuntimeError("get_buffer() returned an empty buffer")
                    n = self._session.recv_into(buffer)
                    if n > 0:
                        protocol.buffer_updated(n)
                else:
                    if not self._chunk:
                        self._chunk = bytearray(_RECV_BYTES)
                    n = self._session.recv_into(self._chunk)
                    if n > 0:
                        protocol.data_received(bytes(memoryview(self._chunk)[:n]))
            except (OSError, RuntimeError) as exc:  # ConnectionError: TLS failed
                self._finish(exc)
                return
            if n < 0:
                return  # nothing more until the socket is readable
            if n == 0:
                self._on_eof()
                return
            budget -= n
        if budget <= 0 and self._reading and not self._closing:
            self._loop.call_soon(self._on_readable)  # more may wait in the session

    def _on_eof(self) -> None:
        self._remove_reader()
        if not self._protocol.eof_received():  # type: ignore[attr-defined]
            self.close()

    # --- writing --------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypts ``data`` at once (the session keeps the records the socket has no room
        for, so the caller may reuse its buffer)."""
        if self._closing or not data:
            return
        try:
            self._unsent = self._session.send(data)
        except OSError as exc:
            self._finish(exc)
            return
        if self._reading and self._session.has_buffered():
            # Records that had come were decrypted on the way (rustls takes them first).
            self._loop.call_soon(self._on_readable)
        if self._unsent:
            self._add_writer()
            if not self._writing_paused and self._unsent > _HIGH_WATER:
                self._writing_paused = True
                self._protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _on_writable(self) -> None:
        self._flush()

    def _flush(self) -> None:
        try:
            self._unsent = self._session.flush()
        except OSError as exc:
            self._finish(exc)
            return
        if self._unsent:
            self._add_writer()
            return
        self._remove_writer()
        if self._writing_paused:
            self._writing_paused = False
            self._protocol.resume_writing()
        if self._closing:
            self._finish(None)

    def _add_writer(self) -> None:
        if not self._writer_added:
            self._loop.add_writer(self._fd, self._on_writable)
            self._writer_added = True

    def _remove_writer(self) -> None:
        if self._writer_added:
            self._loop.remove_writer(self._fd)
            self._writer_added = False

    def get_write_buffer_size(self) -> int:
        return self._unsent

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (_LOW_WATER, _HIGH_WATER)

    def can_write_eof(self) -> bool:
        return False
