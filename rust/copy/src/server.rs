//! The source side: a listener and one thread per connection, serving the registered
//! sessions' files.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::{
    AnswerHead, Request, Status, Token, ANSWER_HEAD_BYTES, MESSAGE_BYTES_MAX, REQUEST_BYTES,
};

/// A file a session serves: a fixed length, and reads within it.
pub trait ServedFile: Send + Sync {
    /// The bytes served; reads never go past it, whatever the file on disk does meanwhile.
    fn length(&self) -> u64;

    /// Fills `dest` with the bytes at `offset` (the caller keeps `offset + dest.len()` within
    /// the length).
    fn read_at(&self, offset: u64, dest: &mut [u8]) -> std::io::Result<()>;
}

/// Limits of a `DataServer`.
#[derive(Debug, Clone, Copy)]
pub struct ServerOptions {
    /// The longest chunk an answer holds (a longer request gets this many bytes).
    pub chunk_bytes_max: u32,
    /// Connections served at once; one more is answered `Busy` and closed.
    pub connections_max: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            chunk_bytes_max: 4 << 20,
            connections_max: 64,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

struct Session {
    files: Vec<Arc<dyn ServedFile>>,
    /// Milliseconds since the server's epoch at the last request (or the registration).
    last_used_ms: AtomicU64,
}

struct Shared {
    options: ServerOptions,
    epoch: Instant,
    sessions: Mutex<HashMap<Token, Arc<Session>>>,
    /// A clone of each open connection, to shut it down when the server closes.
    connections: Mutex<HashMap<u64, TcpStream>>,
    next_connection: AtomicU64,
    closing: AtomicBool,
    bytes_served: AtomicU64,
    corrupt_chunks_left: AtomicU32,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// The source side of the data channel (see the crate's docs).
pub struct DataServer {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl DataServer {
    /// Listens on `address` (port 0: any free port) and starts accepting connections.
    pub fn bind(address: impl ToSocketAddrs, options: ServerOptions) -> std::io::Result<Self> {
        assert!(options.chunk_bytes_max > 0 && options.connections_max > 0);
        let listener = TcpListener::bind(address)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            options,
            epoch: Instant::now(),
            sessions: Mutex::new(HashMap::new()),
            connections: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            bytes_served: AtomicU64::new(0),
            corrupt_chunks_left: AtomicU32::new(0),
        });
        let accepting = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("copy-data-accept".into())
            .spawn(move || accept_loop(listener, accepting))?;
        Ok(DataServer {
            shared,
            local_addr,
            acceptor: Mutex::new(Some(acceptor)),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves `files` (by index) to requests that name `token`, until `unregister`.
    pub fn register(&self, token: Token, files: Vec<Arc<dyn ServedFile>>) {
        let session = Arc::new(Session {
            files,
            last_used_ms: AtomicU64::new(self.shared.now_ms()),
        });
        self.shared.sessions.lock().insert(token, session);
    }

    /// Stops serving `token`'s files (chunks being sent finish); false if it was not served.
    pub fn unregister(&self, token: &Token) -> bool {
        self.shared.sessions.lock().remove(token).is_some()
    }

    /// Milliseconds since `token`'s last request (or its registration); None if not served.
    pub fn idle_ms(&self, token: &Token) -> Option<u64> {
        let session = self.shared.sessions.lock().get(token).cloned()?;
        let last = session.last_used_ms.load(Ordering::Relaxed);
        Some(self.shared.now_ms().saturating_sub(last))
    }

    /// Bytes of chunks sent so far.
    pub fn bytes_served(&self) -> u64 {
        self.shared.bytes_served.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.connections.lock().len()
    }

    /// Tests only: the next `n` chunks go out with their last byte flipped after the CRC was
    /// taken, so the target must notice and fetch them again.
    pub fn inject_corrupt_chunks(&self, n: u32) {
        self.shared.corrupt_chunks_left.store(n, Ordering::Relaxed);
    }

    /// Stops accepting, shuts every connection down and forgets every session. Idempotent.
    pub fn close(&self) {
        if self.shared.closing.swap(true, Ordering::SeqCst) {
            return;
        }
        // The acceptor blocks in accept(): one connection wakes it, and it sees `closing`.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.lock().take() {
            let _ = acceptor.join();
        }
        for (_, connection) in self.shared.connections.lock().drain() {
            let _ = connection.shutdown(Shutdown::Both);
        }
        self.shared.sessions.lock().clear();
    }
}

impl Drop for DataServer {
    fn drop(&mut self) {
        self.close();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            // EMFILE and the like: back off a little rather than spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let id = shared.next_connection.fetch_add(1, Ordering::Relaxed);
        {
            let mut connections = shared.connections.lock();
            if connections.len() >= shared.options.connections_max {
                drop(connections);
                let message = format!(
                    "the source serves {} copy connections at once",
                    shared.options.connections_max
                );
                // Answered in turn (its first request read, then BUSY), so the target reads a
                // refusal rather than a reset; on a thread of its own, briefly, so a silent
                // client cannot hold up the acceptor.
                let _ = std::thread::Builder::new()
                    .name("copy-data-busy".into())
                    .spawn(move || refuse_busy(stream, &message));
                continue;
            }
            match stream.try_clone() {
                Ok(clone) => connections.insert(id, clone),
                Err(_) => continue,
            };
        }
        let serving = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("copy-data-conn".into())
            .spawn(move || {
                serve_connection(&serving, stream);
                serving.connections.lock().remove(&id);
            });
        if spawned.is_err() {
            shared.connections.lock().remove(&id);
        }
    }
}

/// Reads one request (waiting at most a second), answers `Busy` and closes.
fn refuse_busy(mut stream: TcpStream, message: &str) {
    let timeout = Some(Duration::from_secs(1));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return;
    }
    let mut raw = [0u8; REQUEST_BYTES];
    if stream.read_exact(&mut raw).is_ok() {
        let _ = send_error(&mut stream, Status::Busy, message);
    }
}

fn send_error(stream: &mut TcpStream, status: Status, message: &str) -> std::io::Result<()> {
    let mut message = message.as_bytes();
    message = &message[..message.len().min(MESSAGE_BYTES_MAX as usize)];
    let head = AnswerHead {
        status: status as u32,
        length: message.len() as u32,
        crc32c: 0,
        file_length: 0,
    };
    let mut out = Vec::with_capacity(ANSWER_HEAD_BYTES + message.len());
    out.extend_from_slice(&head.encode());
    out.extend_from_slice(message);
    stream.write_all(&out)
}

fn serve_connection(shared: &Shared, mut stream: TcpStream) {
    let timeout = Some(shared.options.idle_timeout);
    if stream.set_nodelay(true).is_err()
        || stream.set_read_timeout(timeout).is_err()
        || stream.set_write_timeout(timeout).is_err()
    {
        return;
    }
    // The answer: its head, then the chunk read in place after it. Grown once, reused.
    let mut answer: Vec<u8> = Vec::new();
    loop {
        let mut raw = [0u8; REQUEST_BYTES];
        if stream.read_exact(&mut raw).is_err() || shared.closing.load(Ordering::SeqCst) {
            return; // the target closed, went quiet for too long, or the server closes
        }
        let request = match Request::decode(&raw) {
            Ok(request) => request,
            Err(message) => {
                let _ = send_error(&mut stream, Status::InvalidArgument, &message);
                return; // the stream's framing cannot be trusted any more
            }
        };
        let sent = match serve_chunk(shared, &request, &mut answer) {
            Ok(len) => stream.write_all(&answer[..ANSWER_HEAD_BYTES + len]),
            Err((status, message)) => send_error(&mut stream, status, &message),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Builds the answer to `request` in `answer` (head, then chunk); returns the chunk's length.
fn serve_chunk(
    shared: &Shared,
    request: &Request,
    answer: &mut Vec<u8>,
) -> Result<usize, (Status, String)> {
    let session = shared.sessions.lock().get(&request.token).cloned();
    let Some(session) = session else {
        return Err((
            Status::NotFound,
            "no such copy session (ended or expired)".to_string(),
        ));
    };
    session
        .last_used_ms
        .store(shared.now_ms(), Ordering::Relaxed);
    let Some(file) = session.files.get(request.file as usize) else {
        return Err((
            Status::InvalidArgument,
            format!(
                "the session has {} files, not one numbered {}",
                session.files.len(),
                request.file
            ),
        ));
    };
    let file_length = file.length();
    if request.offset > file_length {
        return Err((
            Status::InvalidArgument,
            format!(
                "offset {} is past the end of file {} ({file_length} bytes)",
                request.offset, request.file
            ),
        ));
    }
    let len = u64::from(request.length.min(shared.options.chunk_bytes_max))
        .min(file_length - request.offset) as usize;
    if answer.len() < ANSWER_HEAD_BYTES + len {
        answer.resize(ANSWER_HEAD_BYTES + len, 0);
    }
    let data = &mut answer[ANSWER_HEAD_BYTES..ANSWER_HEAD_BYTES + len];
    file.read_at(request.offset, data).map_err(|e| {
        (
            Status::Io,
            format!("reading file {} at {}: {e}", request.file, request.offset),
        )
    })?;
    let crc32c = crc32c::crc32c(data);
    if len > 0
        && shared
            .corrupt_chunks_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        data[len - 1] ^= 0xFF;
    }
    let head = AnswerHead {
        status: Status::Ok as u32,
        length: len as u32,
        crc32c,
        file_length,
    };
    answer[..ANSWER_HEAD_BYTES].copy_from_slice(&head.encode());
    shared.bytes_served.fetch_add(len as u64, Ordering::Relaxed);
    Ok(len)
}
