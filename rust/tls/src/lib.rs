//! TLS 1.3 sessions over a caller's non-blocking socket.
//!
//! The consensus peer channel of a secure cluster carries most of a replicated write's bytes
//! between servers, under mutual TLS. Python's `ssl` module does one record (16 KiB at
//! most) per call, with two `read`s from the socket for each record it receives and one
//! `write` for each it sends, and the event loop runs Python around every call. Here a
//! `Session` reads the socket in large chunks, decrypts every whole record that came, and
//! hands the caller as much plaintext as its buffer takes; and it encrypts all that it is
//! given in one call, writing the records with one `writev`. The socket stays the caller's:
//! a session borrows its descriptor, and the caller's event loop waits for it to be readable
//! or writable as the session asks.
//!
//! Both sides show a certificate of the cluster CA and check the other's against it (the
//! client also checks that the server's names `server_name`); TLS 1.3 only; no session
//! resumption (a channel lives as long as its two servers do). Which nyala identity a peer
//! certificate carries is the caller's business (`peer_certificate`).

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::RawFd;
use std::sync::Arc;

use rustls::crypto::ring::cipher_suite;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use rustls::{ServerConnection, SupportedCipherSuite};

/// Bytes read from the socket in one call (several records' worth).
const READ_CHUNK_BYTES: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("the peer closed the connection during the TLS handshake")]
    ClosedInHandshake,
}

/// One side's configuration: its certificate chain and key, and the CA it checks peers
/// against. Made once per server (loading the keys is most of a connection's setup).
#[derive(Clone)]
pub enum TlsConfig {
    Server(Arc<ServerConfig>),
    Client(Arc<ClientConfig>),
}

// ring has no post-quantum key exchange (aws-lc-rs has, at the cost of building aws-lc);
// the channel joins servers of one cluster, and the deprecation is about that alone.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    // AES-128-GCM first: TLS 1.3's mandatory suite, and faster than AES-256 per byte.
    let suites: [SupportedCipherSuite; 3] = [
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    provider.cipher_suites = suites.to_vec();
    Arc::new(provider)
}

fn roots(ca_pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
        roots.add(cert)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Config(
            "no CA certificate in the PEM given".into(),
        ));
    }
    Ok(roots)
}

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn identity(cert_pem: &[u8], key_pem: &[u8]) -> Result<Identity, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Config(format!("certificate: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::Config("no certificate in the PEM given".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::Config(format!("private key: {e}")))?;
    Ok((chain, key))
}

impl TlsConfig {
    /// A server's side: shows `cert_pem` (with `key_pem`) and requires a client certificate
    /// of `ca_pem`.
    pub fn server(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let provider = provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca_pem)?), provider.clone())
                .build()
                .map_err(|e| TlsError::Config(format!("client verifier: {e}")))?;
        let (chain, key) = identity(cert_pem, key_pem)?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)?;
        config.send_tls13_tickets = 0;
        config.ignore_client_order = true;
        Ok(TlsConfig::Server(Arc::new(config)))
    }

    /// A client's side: shows `cert_pem` (with `key_pem`) and checks the server's
    /// certificate against `ca_pem` and the name the session is given.
    pub fn client(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let (chain, key) = identity(cert_pem, key_pem)?;
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots(ca_pem)?)
            .with_client_auth_cert(chain, key)?;
        config.resumption = rustls::client::Resumption::disabled();
        Ok(TlsConfig::Client(Arc::new(config)))
    }
}

/// What a handshake step needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Done,
    /// Call again once the socket is readable.
    WantRead,
    /// Call again once the socket is writable.
    WantWrite,
}

/// What a read gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// This many bytes of plaintext.
    Data(usize),
    /// Nothing yet: call again once the socket is readable.
    WouldBlock,
    /// The peer ended the connection (with or without TLS's close_notify; a protocol on top
    /// that frames its messages sees a cut inside one).
    Eof,
}

/// A socket descriptor the session reads and writes but does not own.
struct Fd(RawFd);

impl Read for Fd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(self.0, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl Write for Fd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for reads of its length.
        let n = unsafe { libc::write(self.0, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let count = bufs.len().min(1024) as libc::c_int; // IOV_MAX
                                                         // SAFETY: IoSlice is ABI-compatible with iovec, and each slice is valid for reads.
        let n = unsafe { libc::writev(self.0, bufs.as_ptr().cast(), count) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// One TLS connection over a non-blocking socket (module docs).
pub struct Session {
    conn: Connection,
    fd: Fd,
    // Ciphertext read from the socket and not yet given to rustls: [start, end).
    incoming: Vec<u8>,
    start: usize,
    end: usize,
    socket_eof: bool,
    // Plaintext given to `send` since all ciphertext was last written (for flow control).
    unsent: usize,
}

impl Session {
    /// A session over the connected socket `fd` (which must stay open while the session is
    /// used); `server_name` is the name a client requires in the server's certificate.
    pub fn new(config: &TlsConfig, fd: RawFd, server_name: Option<&str>) -> Result<Self, TlsError> {
        let mut conn: Connection = match config {
            TlsConfig::Server(config) => ServerConnection::new(config.clone())?.into(),
            TlsConfig::Client(config) => {
                let name = server_name.ok_or_else(|| {
                    TlsError::Config("a client session needs a server name".into())
                })?;
                let name = ServerName::try_from(name.to_owned())
                    .map_err(|e| TlsError::Config(format!("server name {name:?}: {e}")))?;
                ClientConnection::new(config.clone(), name)?.into()
            }
        };
        // The caller's transport bounds what it writes ahead (its write-buffer limits).
        conn.set_buffer_limit(None);
        Ok(Session {
            conn,
            fd: Fd(fd),
            incoming: vec![0; READ_CHUNK_BYTES],
            start: 0,
            end: 0,
            socket_eof: false,
            unsent: 0,
        })
    }

    /// Advances the handshake as far as the socket allows.
    pub fn handshake(&mut self) -> Result<Progress, TlsError> {
        loop {
            if self.write_pending()? {
                return Ok(Progress::WantWrite);
            }
            if !self.conn.is_handshaking() {
                return Ok(Progress::Done);
            }
            if self.start < self.end {
                self.feed()?;
                continue;
            }
            match self.fill() {
                Ok(0) => return Err(TlsError::ClosedInHandshake),
                Ok(_) => continue,
                Err(e) if would_block(&e) => return Ok(Progress::WantRead),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Up to `out.len()` bytes of plaintext: what is already decrypted, then what whole
    /// records the socket has.
    pub fn recv_into(&mut self, out: &mut [u8]) -> Result<Received, TlsError> {
        let mut filled = 0;
        loop {
            match self.conn.reader().read(&mut out[filled..]) {
                Ok(0) if !out[filled..].is_empty() => {
                    // close_notify received.
                    return Ok(if filled > 0 {
                        Received::Data(filled)
                    } else {
                        Received::Eof
                    });
                }
                Ok(n) => {
                    filled += n;
                    if filled == out.len() {
                        return Ok(Received::Data(filled));
                    }
                    continue;
                }
                Err(e) if would_block(&e) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    return Ok(if filled > 0 {
                        Received::Data(filled)
                    } else {
                        Received::Eof
                    });
                }
                Err(e) => return Err(e.into()),
            }
            if self.start < self.end {
                self.feed()?;
                continue;
            }
            if self.socket_eof {
                return Ok(if filled > 0 {
                    Received::Data(filled)
                } else {
                    Received::Eof
                });
            }
            match self.fill() {
                Ok(0) => {
                    self.socket_eof = true;
                    self.conn.read_tls(&mut io::empty())?; // tells rustls the stream ended
                    continue;
                }
                Ok(_) => continue,
                Err(e) if would_block(&e) => {
                    // Answers TLS itself owes (a key update's) go out with the next write.
                    return Ok(if filled > 0 {
                        Received::Data(filled)
                    } else {
                        Received::WouldBlock
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Encrypts all of `data` and writes what the socket takes; returns the plaintext bytes
    /// whose records still wait to be written (0: all written). Call `flush` once the socket
    /// is writable while that is not 0.
    pub fn send(&mut self, data: &[u8]) -> Result<usize, TlsError> {
        self.conn.writer().write_all(data)?;
        self.unsent += data.len();
        self.flush()
    }

    /// Writes waiting records; returns what `send` does.
    pub fn flush(&mut self) -> Result<usize, TlsError> {
        if !self.write_pending()? {
            self.unsent = 0;
        }
        Ok(self.unsent)
    }

    /// Whether records still wait to be written.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// The peer's certificate (DER), once the handshake is done.
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        self.conn
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|c| c.as_ref())
    }

    /// The negotiated cipher suite's name.
    pub fn cipher(&self) -> Option<String> {
        self.conn
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()))
    }

    /// Queues TLS's close_notify and writes what the socket takes (best effort: the caller
    /// closes the socket next).
    pub fn close_notify(&mut self) {
        self.conn.send_close_notify();
        let _ = self.write_pending();
    }

    /// Writes queued records until done (false) or the socket is full (true).
    fn write_pending(&mut self) -> Result<bool, TlsError> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.fd) {
                Ok(_) => {}
                Err(e) if would_block(&e) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }

    /// Reads the socket into `incoming` (which is empty).
    fn fill(&mut self) -> io::Result<usize> {
        loop {
            match self.fd.read(&mut self.incoming) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(n) => {
                    self.start = 0;
                    self.end = n;
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives rustls ciphertext from `incoming` and decrypts what whole records it makes.
    fn feed(&mut self) -> Result<(), TlsError> {
        let mut pending = &self.incoming[self.start..self.end];
        let n = self.conn.read_tls(&mut pending)?;
        self.start += n;
        if let Err(e) = self.conn.process_new_packets() {
            let _ = self.write_pending(); // the alert that tells the peer why
            return Err(e.into());
        }
        Ok(())
    }
}
