//! TLS 1.3 sessions over a caller's non-blocking socket.
//!
//! The consensus peer channel of a secure cluster carries most of a replicated write's bytes
//! between servers, under mutual TLS. Python's `ssl` module does one record (16 KiB at
//! most) per call, through memory buffers, and the event loop runs Python around every call.
//! Here a `Session` (on rustls's unbuffered API) reads the socket in large chunks, decrypts
//! every whole record where it was read and copies the plaintext once, into the caller's
//! buffer, as much as that takes; and it encrypts all it is given, in one call, into one
//! buffer that it writes from. The socket stays the caller's: a session borrows its
//! descriptor, and the caller's event loop waits for it to be readable or writable as the
//! session asks.
//!
//! Both sides show a certificate of the cluster CA and check the other's against it (the
//! client also checks that the server's names `server_name`); TLS 1.3 only; no session
//! resumption (a channel lives as long as its two servers do). Which nyala identity a peer
//! certificate carries is the caller's business (`peer_certificate`).

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::sync::Arc;

use rustls::client::UnbufferedClientConnection;
use rustls::crypto::ring::cipher_suite;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::server::WebPkiClientVerifier;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};
use rustls::{ClientConfig, CommonState, RootCertStore, ServerConfig, SupportedCipherSuite};

/// Bytes read from the socket in one call (several records' worth).
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// The outgoing buffer kept once written (a larger one, grown for a large frame, is freed).
const OUTGOING_KEEP_BYTES: usize = 4 << 20;
/// A TLS record's largest size on the wire (16 KiB of data, its header, tag and padding).
const MAX_RECORD_BYTES: usize = 16 * 1024 + 2048 + 5;

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
    #[error("the TLS session failed earlier")]
    Failed,
    #[error("TLS: {0}")]
    State(&'static str),
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

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// The two kinds of connection, which rustls's unbuffered API keeps apart.
enum Conn {
    Client(UnbufferedClientConnection),
    Server(UnbufferedServerConnection),
}

impl Conn {
    fn common(&self) -> &CommonState {
        match self {
            Conn::Client(c) => c,
            Conn::Server(s) => s,
        }
    }
}

/// Ciphertext waiting for the socket: `buf[start..end]`. `buf` keeps its length (its
/// capacity in use) so that encrypting into it never zero-fills.
struct Outgoing {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Outgoing {
    fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Room for at least `at_least` more bytes at the end.
    fn spare(&mut self, at_least: usize) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.buf.len() - self.end < at_least && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < at_least {
            self.buf.resize(self.end + at_least, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Appends what `encode` writes, growing the room to what it says it needs.
    fn append(
        &mut self,
        mut want: usize,
        mut encode: impl FnMut(&mut [u8]) -> Result<usize, Option<usize>>,
    ) -> Result<(), TlsError> {
        loop {
            match encode(self.spare(want)) {
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(Some(required)) if required > want => want = required,
                Err(_) => return Err(TlsError::State("a record could not be encoded")),
            }
        }
    }
}

/// What one `process` call asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Call again.
    Again,
    /// Records were encoded: write them, then call again.
    Transmit,
    /// The handshake needs bytes from the socket.
    NeedRead,
    /// The handshake is done and nothing more can be decrypted from what was read.
    Traffic,
    /// Application data waits to be decrypted, and there is no room to put it.
    Readable,
    /// The peer closed the connection (close_notify).
    Closed,
}

/// What a `process` call does with application data: plaintext received goes to `out` (and
/// what does not fit to `leftover`); `send` is encrypted; `close` queues close_notify. With
/// `absorb` every record ready is taken (to `leftover`): rustls answers nothing else until
/// they are.
struct Job<'a> {
    out: &'a mut [u8],
    filled: usize,
    leftover: &'a mut Vec<u8>,
    send: Option<&'a [u8]>,
    close: bool,
    absorb: bool,
}

impl Job<'_> {
    fn full(&self) -> bool {
        self.filled == self.out.len()
    }

    fn deliver(&mut self, payload: &[u8]) {
        let n = payload.len().min(self.out.len() - self.filled);
        self.out[self.filled..self.filled + n].copy_from_slice(&payload[..n]);
        self.filled += n;
        self.leftover.extend_from_slice(&payload[n..]);
    }
}

/// The room an encoding that failed needs (None: more room would not help).
fn encode_room(e: EncodeError) -> Option<usize> {
    match e {
        EncodeError::InsufficientSize(e) => Some(e.required_size),
        _ => None,
    }
}

/// The room an encryption that failed needs (None: more room would not help).
fn encrypt_room(e: EncryptError) -> Option<usize> {
    match e {
        EncryptError::InsufficientSize(e) => Some(e.required_size),
        _ => None,
    }
}

/// Bytes of ciphertext `data` becomes (its records' headers and tags included).
fn sealed_len(data: usize) -> usize {
    let records = data.div_ceil(16 * 1024).max(1);
    data + records * 32 + 64
}

/// Acts on one state rustls reached: the bytes of `incoming` to discard (also when it
/// failed: rustls may still refer to what follows), and what to do next.
fn handle<Data>(
    status: UnbufferedStatus<'_, '_, Data>,
    outgoing: &mut Outgoing,
    job: &mut Job<'_>,
) -> (usize, Result<Step, TlsError>) {
    let mut discard = status.discard;
    let step = act(status.state, &mut discard, outgoing, job);
    (discard, step)
}

fn act<Data>(
    state: Result<ConnectionState<'_, '_, Data>, rustls::Error>,
    discard: &mut usize,
    outgoing: &mut Outgoing,
    job: &mut Job<'_>,
) -> Result<Step, TlsError> {
    let step = match state? {
        ConnectionState::ReadTraffic(_) if job.full() && !job.absorb => Step::Readable,
        ConnectionState::ReadTraffic(mut traffic) => {
            // Records left undecrypted once `out` is full stay for the next call (rustls
            // keeps those it decrypted with the handshake until they are taken: `absorb`).
            while !job.full() || job.absorb {
                let Some(record) = traffic.next_record() else {
                    break;
                };
                let record = record?;
                *discard += record.discard;
                job.deliver(record.payload);
            }
            Step::Again
        }
        ConnectionState::PeerClosed | ConnectionState::Closed => Step::Closed,
        ConnectionState::EncodeTlsData(mut encode) => {
            outgoing.append(4096, |buf| encode.encode(buf).map_err(encode_room))?;
            Step::Again
        }
        ConnectionState::TransmitTlsData(transmit) => {
            // Taken: `outgoing` writes them before anything encoded later.
            transmit.done();
            Step::Transmit
        }
        ConnectionState::BlockedHandshake => Step::NeedRead,
        ConnectionState::WriteTraffic(mut write) => {
            if let Some(data) = job.send.take() {
                outgoing.append(sealed_len(data.len()), |buf| {
                    write.encrypt(data, buf).map_err(encrypt_room)
                })?;
            }
            if job.close {
                job.close = false;
                outgoing.append(256, |buf| {
                    write.queue_close_notify(buf).map_err(encrypt_room)
                })?;
            }
            Step::Traffic
        }
        _ => return Err(TlsError::State("early data is not accepted")),
    };
    Ok(step)
}

/// Encodes the record rustls queued as it failed (its alert), if it did.
fn encode_alert<Data>(status: UnbufferedStatus<'_, '_, Data>, outgoing: &mut Outgoing) -> bool {
    match status.state {
        Ok(ConnectionState::EncodeTlsData(mut encode)) => outgoing
            .append(64, |buf| encode.encode(buf).map_err(encode_room))
            .is_ok(),
        _ => false,
    }
}

/// One TLS connection over a non-blocking socket (module docs).
///
/// Built on rustls's unbuffered API: records are decrypted where they were read, in
/// `incoming`, and copied once, into the caller's buffer; a frame is encrypted straight into
/// `outgoing` and written from there.
pub struct Session {
    conn: Conn,
    fd: Fd,
    // Ciphertext read from the socket and not yet processed: incoming[start..end].
    incoming: Vec<u8>,
    start: usize,
    end: usize,
    // Plaintext decrypted and not yet delivered (a record larger than the caller's buffer).
    leftover: Vec<u8>,
    leftover_at: usize,
    outgoing: Outgoing,
    peer_closed: bool,
    socket_eof: bool,
    failed: bool,
    // Plaintext given to `send` since all ciphertext was last written (for flow control).
    unsent: usize,
}

/// What a socket read gave.
enum Fill {
    Read,
    WouldBlock,
    Eof,
}

impl Session {
    /// A session over the connected socket `fd` (which must stay open while the session is
    /// used); `server_name` is the name a client requires in the server's certificate.
    pub fn new(config: &TlsConfig, fd: RawFd, server_name: Option<&str>) -> Result<Self, TlsError> {
        let conn = match config {
            TlsConfig::Server(config) => {
                Conn::Server(UnbufferedServerConnection::new(config.clone())?)
            }
            TlsConfig::Client(config) => {
                let name = server_name.ok_or_else(|| {
                    TlsError::Config("a client session needs a server name".into())
                })?;
                let name = ServerName::try_from(name.to_owned())
                    .map_err(|e| TlsError::Config(format!("server name {name:?}: {e}")))?;
                Conn::Client(UnbufferedClientConnection::new(config.clone(), name)?)
            }
        };
        Ok(Session {
            conn,
            fd: Fd(fd),
            incoming: vec![0; READ_CHUNK_BYTES],
            start: 0,
            end: 0,
            leftover: Vec::new(),
            leftover_at: 0,
            outgoing: Outgoing {
                buf: Vec::new(),
                start: 0,
                end: 0,
            },
            peer_closed: false,
            socket_eof: false,
            failed: false,
            unsent: 0,
        })
    }

    /// Runs rustls over what was read and not yet processed.
    fn process(&mut self, job: &mut Job<'_>) -> Result<Step, TlsError> {
        if self.failed {
            return Err(TlsError::Failed); // rustls must not see the same bytes again
        }
        let incoming = &mut self.incoming[self.start..self.end];
        let (discard, step) = match &mut self.conn {
            Conn::Client(c) => handle(c.process_tls_records(incoming), &mut self.outgoing, job),
            Conn::Server(s) => handle(s.process_tls_records(incoming), &mut self.outgoing, job),
        };
        self.start += discard;
        if step.is_err() {
            self.failed = true;
            self.send_alert();
        }
        step
    }

    /// Writes the alert rustls queued when it failed (best effort), so that the peer learns
    /// why (a certificate it does not trust, say) rather than seeing the connection drop.
    fn send_alert(&mut self) {
        // Only when one is queued (it comes first), and once: rustls would otherwise process
        // the bytes that failed again.
        if !self.conn.common().wants_write() {
            return;
        }
        let incoming = &mut self.incoming[self.start..self.end];
        let encoded = match &mut self.conn {
            Conn::Client(c) => encode_alert(c.process_tls_records(incoming), &mut self.outgoing),
            Conn::Server(s) => encode_alert(s.process_tls_records(incoming), &mut self.outgoing),
        };
        if encoded {
            let _ = self.write_pending();
        }
    }

    /// Advances the handshake as far as the socket allows.
    pub fn handshake(&mut self) -> Result<Progress, TlsError> {
        let mut leftover = std::mem::take(&mut self.leftover);
        let progress = self.shake(&mut leftover);
        self.restore(leftover);
        progress
    }

    /// Puts back the plaintext taken out of `self.leftover` for a `Job` (and what it added).
    fn restore(&mut self, leftover: Vec<u8>) {
        if self.leftover.is_empty() {
            self.leftover = leftover;
        } else {
            let added = std::mem::replace(&mut self.leftover, leftover);
            self.leftover.extend_from_slice(&added);
        }
    }

    /// Whether decrypted plaintext waits here (taken on the way by a handshake or a send),
    /// which the socket's readiness does not show: the caller reads (`recv_into`) without
    /// waiting for it. (Whole records a full buffer left undecrypted the caller knows of.)
    pub fn has_buffered(&self) -> bool {
        self.leftover_at < self.leftover.len()
    }

    fn shake(&mut self, leftover: &mut Vec<u8>) -> Result<Progress, TlsError> {
        loop {
            if self.write_pending()? {
                return Ok(Progress::WantWrite);
            }
            let mut job = Job {
                out: &mut [],
                filled: 0,
                leftover,
                send: None,
                close: false,
                absorb: true,
            };
            match self.process(&mut job)? {
                Step::Again | Step::Transmit => continue,
                Step::Traffic | Step::Readable => {
                    // Application data that came with the last flight waits in `incoming`.
                    return Ok(if self.write_pending()? {
                        Progress::WantWrite
                    } else {
                        Progress::Done
                    });
                }
                Step::Closed => return Err(TlsError::ClosedInHandshake),
                Step::NeedRead => match self.fill()? {
                    Fill::Read => continue,
                    Fill::WouldBlock => return Ok(Progress::WantRead),
                    Fill::Eof => return Err(TlsError::ClosedInHandshake),
                },
            }
        }
    }

    /// Up to `out.len()` bytes of plaintext: what is already decrypted, then what whole
    /// records the socket has.
    pub fn recv_into(&mut self, out: &mut [u8]) -> Result<Received, TlsError> {
        let mut filled = 0;
        if self.leftover_at < self.leftover.len() {
            let n = (self.leftover.len() - self.leftover_at).min(out.len());
            out[..n].copy_from_slice(&self.leftover[self.leftover_at..self.leftover_at + n]);
            self.leftover_at += n;
            filled = n;
            if self.leftover_at == self.leftover.len() {
                self.leftover.clear();
                self.leftover_at = 0;
            }
        }
        let mut leftover = std::mem::take(&mut self.leftover);
        let result = self.receive(out, filled, &mut leftover);
        self.restore(leftover);
        result
    }

    fn receive(
        &mut self,
        out: &mut [u8],
        filled: usize,
        leftover: &mut Vec<u8>,
    ) -> Result<Received, TlsError> {
        let mut job = Job {
            out,
            filled,
            leftover,
            send: None,
            close: false,
            absorb: false,
        };
        let done = |job: &Job<'_>, end: Received| {
            if job.filled > 0 {
                Received::Data(job.filled)
            } else {
                end
            }
        };
        loop {
            if job.full() || !job.leftover.is_empty() {
                return Ok(Received::Data(job.filled));
            }
            if self.peer_closed {
                return Ok(done(&job, Received::Eof));
            }
            match self.process(&mut job)? {
                Step::Again | Step::Readable => continue,
                Step::Transmit => {
                    self.write_pending()?; // TLS's own answers (a key update's)
                    continue;
                }
                Step::Closed => {
                    self.peer_closed = true;
                    continue;
                }
                Step::Traffic | Step::NeedRead => {
                    if self.socket_eof {
                        return Ok(done(&job, Received::Eof));
                    }
                    match self.fill()? {
                        Fill::Read => continue,
                        Fill::WouldBlock => return Ok(done(&job, Received::WouldBlock)),
                        Fill::Eof => {
                            // Without close_notify: the protocol on top sees any cut frame.
                            self.socket_eof = true;
                            return Ok(done(&job, Received::Eof));
                        }
                    }
                }
            }
        }
    }

    /// Encrypts all of `data` and writes what the socket takes; returns the plaintext bytes
    /// whose records still wait to be written (0: all written). Call `flush` once the socket
    /// is writable while that is not 0.
    pub fn send(&mut self, data: &[u8]) -> Result<usize, TlsError> {
        self.encode(Some(data), false)?;
        self.unsent += data.len();
        self.flush()
    }

    /// Runs rustls until `data` is encrypted (and close_notify queued). Records already read
    /// are decrypted on the way, into `leftover` (`has_buffered` tells the caller).
    fn encode(&mut self, data: Option<&[u8]>, close: bool) -> Result<(), TlsError> {
        let mut leftover = std::mem::take(&mut self.leftover);
        let mut job = Job {
            out: &mut [],
            filled: 0,
            leftover: &mut leftover,
            send: data,
            close,
            absorb: true,
        };
        let mut result = Err(TlsError::State(
            "the session did not become ready to encrypt",
        ));
        for _ in 0..64 {
            match self.process(&mut job) {
                Ok(Step::Traffic) if job.send.is_none() && !job.close => {
                    result = Ok(());
                    break;
                }
                Ok(Step::NeedRead) => {
                    result = Err(TlsError::State("the handshake is not done"));
                    break;
                }
                Ok(Step::Closed) => {
                    self.peer_closed = true; // the edge rustls reports once
                    if job.send.is_none() && !job.close {
                        result = Ok(());
                        break;
                    }
                }
                Ok(_) => continue,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.restore(leftover);
        result
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
        self.outgoing.pending() > 0
    }

    /// The peer's certificate (DER), once the handshake is done.
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        self.conn
            .common()
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|c| c.as_ref())
    }

    /// The negotiated cipher suite's name.
    pub fn cipher(&self) -> Option<String> {
        self.conn
            .common()
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()))
    }

    /// Queues TLS's close_notify and writes what the socket takes (best effort: the caller
    /// closes the socket next).
    pub fn close_notify(&mut self) {
        if self.encode(None, true).is_ok() {
            let _ = self.write_pending();
        }
    }

    /// Writes queued records until done (false) or the socket is full (true).
    fn write_pending(&mut self) -> Result<bool, TlsError> {
        while self.outgoing.pending() > 0 {
            let out = &self.outgoing;
            match self.fd.write(&out.buf[out.start..out.end]) {
                Ok(n) => self.outgoing.start += n,
                Err(e) if would_block(&e) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        if self.outgoing.buf.len() > OUTGOING_KEEP_BYTES {
            // A large frame's room, not kept for every frame after it.
            self.outgoing = Outgoing {
                buf: Vec::new(),
                start: 0,
                end: 0,
            };
        }
        Ok(false)
    }

    /// Reads the socket into the free end of `incoming`.
    fn fill(&mut self) -> Result<Fill, TlsError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.incoming.len() - self.end < MAX_RECORD_BYTES {
            self.incoming.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.fd.read(&mut self.incoming[self.end..]) {
                Ok(0) => return Ok(Fill::Eof),
                Ok(n) => {
                    self.end += n;
                    return Ok(Fill::Read);
                }
                Err(e) if would_block(&e) => return Ok(Fill::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}
