//! The target side: every chunk of a session's files, fetched over several connections at
//! once, checked, written at its offset, each file synced once its last chunk is in.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::{
    all_bytes, AnswerHead, CopyError, Request, Status, Token, ANSWER_HEAD_BYTES, MESSAGE_BYTES_MAX,
};

/// One file to download: its index in the session, where to write it, its length.
#[derive(Debug, Clone, Copy)]
pub struct TargetFile {
    /// The file's number in the session (see the crate's docs).
    pub index: u32,
    /// An open, writable descriptor the caller owns (and closes).
    pub fd: RawFd,
    /// The length the session listed; every chunk must say the same.
    pub length: u64,
}

/// How one download fetches.
#[derive(Debug, Clone, Copy)]
pub struct DownloadOptions {
    /// Bytes asked for per request (the source may answer with fewer).
    pub chunk_bytes: u32,
    /// Connections, each with one chunk in flight.
    pub streams: usize,
    /// Fetches of one chunk before a bad one fails the copy.
    pub attempts: u32,
    /// Bytes per second over all streams; 0 is unlimited.
    pub rate_bytes_per_s: u64,
    /// Connecting, and each read or write on a connection, fails after this long.
    pub timeout: Duration,
}

/// A download's progress, readable (and cancellable) from other threads while it runs.
#[derive(Debug, Default)]
pub struct Download {
    bytes_done: AtomicU64,
    chunks_refetched: AtomicU64,
    cancelled: AtomicBool,
}

impl Download {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes written so far.
    pub fn bytes_done(&self) -> u64 {
        self.bytes_done.load(Ordering::Relaxed)
    }

    /// Chunks that failed their checks and were fetched again.
    pub fn chunks_refetched(&self) -> u64 {
        self.chunks_refetched.load(Ordering::Relaxed)
    }

    /// Asks the download to stop after the chunks it is moving; it then fails `Cancelled`.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// One chunk of work: bytes `offset .. offset + length` of `files[file]`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    file: usize,
    offset: u64,
    length: u64,
}

/// A token bucket over bytes, shared by the streams (at most one second of tokens).
struct RateLimiter {
    bytes_per_s: u64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    fn new(bytes_per_s: u64) -> Self {
        RateLimiter {
            bytes_per_s,
            state: Mutex::new((bytes_per_s as f64, Instant::now())),
        }
    }

    fn acquire(&self, n: u64) {
        if self.bytes_per_s == 0 {
            return;
        }
        let rate = self.bytes_per_s as f64;
        let mut state = self.state.lock(); // held while waiting: streams go in turn
        let now = Instant::now();
        state.0 = (state.0 + now.duration_since(state.1).as_secs_f64() * rate).min(rate);
        state.1 = now;
        state.0 -= n as f64;
        if state.0 < 0.0 {
            std::thread::sleep(Duration::from_secs_f64(-state.0 / rate));
        }
    }
}

/// What the streams share.
struct Job<'a> {
    address: &'a str,
    addrs: Vec<SocketAddr>,
    token: Token,
    files: &'a [TargetFile],
    options: &'a DownloadOptions,
    progress: &'a Download,
    pieces: Vec<Piece>,
    next: AtomicUsize,
    /// Pieces (or their rest) handed back by a stream that ended on a busy source.
    returned: Mutex<Vec<Piece>>,
    /// Streams still running: they have not found the pieces exhausted, nor left a busy
    /// source (changed only under the lock of `returned`).
    running: AtomicUsize,
    /// Pieces of each file not yet written; the stream that writes the last one syncs it.
    left: Vec<AtomicUsize>,
    limiter: RateLimiter,
    failed: AtomicBool,
    failure: Mutex<Option<CopyError>>,
}

/// Downloads every file of `files` from the session `token` of the source at `address`
/// (`host:port`), blocking until all are written and synced, or the first failure.
pub fn download(
    address: &str,
    token: Token,
    files: &[TargetFile],
    options: &DownloadOptions,
    progress: &Download,
) -> Result<(), CopyError> {
    if options.chunk_bytes == 0 || options.streams == 0 || options.attempts == 0 {
        return Err(CopyError::InvalidArgument(format!(
            "chunk_bytes, streams and attempts must be positive: {options:?}"
        )));
    }
    let addrs: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|e| network(address, &e))?
        .collect();
    let mut pieces = Vec::new();
    let mut left = Vec::with_capacity(files.len());
    for (i, file) in files.iter().enumerate() {
        let mut offset = 0;
        let mut count = 0;
        while offset < file.length {
            let length = u64::from(options.chunk_bytes).min(file.length - offset);
            pieces.push(Piece {
                file: i,
                offset,
                length,
            });
            offset += length;
            count += 1;
        }
        left.push(AtomicUsize::new(count));
    }
    let job = Job {
        address,
        addrs,
        token,
        files,
        options,
        progress,
        next: AtomicUsize::new(0),
        returned: Mutex::new(Vec::new()),
        running: AtomicUsize::new(0),
        left,
        limiter: RateLimiter::new(options.rate_bytes_per_s),
        failed: AtomicBool::new(false),
        failure: Mutex::new(None),
        pieces,
    };
    let streams = options.streams.min(job.pieces.len());
    job.running.store(streams, Ordering::SeqCst);
    std::thread::scope(|scope| {
        for _ in 0..streams {
            scope.spawn(|| {
                if let Err(e) = stream(&job) {
                    job.failed.store(true, Ordering::SeqCst);
                    job.failure.lock().get_or_insert(e);
                }
            });
        }
    });
    if let Some(failure) = job.failure.lock().take() {
        return Err(failure);
    }
    if progress.is_cancelled() {
        return Err(CopyError::Cancelled);
    }
    if job.left.iter().any(|n| n.load(Ordering::SeqCst) > 0) {
        // Not reachable while the last running stream keeps every piece; checked all the same
        // rather than report a copy with holes as done.
        return Err(CopyError::Corruption(
            "the download ended with pieces not written".to_string(),
        ));
    }
    for file in files.iter().filter(|f| f.length == 0) {
        fsync(file.fd)?;
    }
    Ok(())
}

/// One connection's share: pieces taken in turn until none is left (or a stream failed). A
/// source at its connection limit answers `Busy`: the stream then hands its piece back and
/// ends, unless it is the last one running, which waits and connects again.
fn stream(job: &Job<'_>) -> Result<(), CopyError> {
    let mut connection: Option<TcpStream> = None;
    let mut buffer = Vec::new();
    let mut busy_since: Option<Instant> = None;
    while let Some(piece) = job.take() {
        if job.failed.load(Ordering::SeqCst) || job.progress.is_cancelled() {
            return Ok(());
        }
        let file = &job.files[piece.file];
        let (mut offset, end) = (piece.offset, piece.offset + piece.length);
        while offset < end {
            if job.progress.is_cancelled() {
                return Ok(());
            }
            let fresh = connection.is_none();
            let conn = match &mut connection {
                Some(c) => c,
                None => connection.insert(connect(job)?),
            };
            job.limiter.acquire(end - offset);
            let n = match fetch(job, conn, file, offset, end - offset, &mut buffer) {
                Ok(n) => n,
                Err(CopyError::Busy(message)) if fresh => {
                    connection = None;
                    let rest = Piece {
                        file: piece.file,
                        offset,
                        length: end - offset,
                    };
                    if job.leave_with(rest) {
                        return Ok(()); // the streams still running finish the copy
                    }
                    let since = *busy_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > job.options.timeout {
                        return Err(CopyError::Busy(message));
                    }
                    std::thread::sleep(BUSY_RETRY);
                    continue;
                }
                Err(e) => return Err(e),
            };
            busy_since = None;
            write_at(file.fd, &buffer[..n], offset)?;
            offset += n as u64;
            job.progress
                .bytes_done
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        if job.left[piece.file].fetch_sub(1, Ordering::AcqRel) == 1 {
            fsync(file.fd)?;
        }
    }
    Ok(())
}

/// How long the last stream waits before it connects again to a source that was busy.
const BUSY_RETRY: Duration = Duration::from_millis(200);

impl Job<'_> {
    /// The next piece: one handed back first, then the next in order. None: nothing is left,
    /// and the calling stream stops running (under the same lock as `leave_with`, so a piece
    /// handed back is never left behind by a stream that was about to stop).
    fn take(&self) -> Option<Piece> {
        let mut returned = self.returned.lock();
        if let Some(piece) = returned.pop() {
            return Some(piece);
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let piece = self.pieces.get(i).copied();
        if piece.is_none() {
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
        piece
    }

    /// A busy source: hands `piece` (the rest of one) back and stops the calling stream, if
    /// another stream still runs to take it; false (and nothing changed) otherwise.
    fn leave_with(&self, piece: Piece) -> bool {
        let mut returned = self.returned.lock();
        if self.running.load(Ordering::SeqCst) <= 1 {
            return false;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        returned.push(piece);
        true
    }
}

fn network(address: &str, e: &std::io::Error) -> CopyError {
    CopyError::Network {
        address: address.to_string(),
        message: e.to_string(),
    }
}

fn connect(job: &Job<'_>) -> Result<TcpStream, CopyError> {
    let timeout = job.options.timeout;
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for addr in &job.addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(stream) => {
                let set = stream
                    .set_nodelay(true)
                    .and_then(|_| stream.set_read_timeout(Some(timeout)))
                    .and_then(|_| stream.set_write_timeout(Some(timeout)));
                set.map_err(|e| network(job.address, &e))?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(network(job.address, &last))
}

/// Fetches the chunk at `offset` (at most `want` bytes) into `buffer`, checked, up to
/// `attempts` times; returns its length.
fn fetch(
    job: &Job<'_>,
    connection: &mut TcpStream,
    file: &TargetFile,
    offset: u64,
    want: u64,
    buffer: &mut Vec<u8>,
) -> Result<usize, CopyError> {
    let io = |e: std::io::Error| network(job.address, &e);
    let request = Request {
        token: job.token,
        file: file.index,
        offset,
        length: want.min(u64::from(u32::MAX)) as u32,
    };
    let attempts = job.options.attempts;
    for attempt in 1..=attempts {
        connection.write_all(&request.encode()).map_err(io)?;
        let mut raw = [0u8; ANSWER_HEAD_BYTES];
        connection.read_exact(&mut raw).map_err(io)?;
        let head = AnswerHead::decode(&raw);
        let status = Status::from_u32(head.status).ok_or_else(|| {
            CopyError::Corruption(format!("an answer with unknown status {}", head.status))
        })?;
        if status != Status::Ok {
            if head.length > MESSAGE_BYTES_MAX {
                return Err(CopyError::Corruption(format!(
                    "an error answer of {} bytes",
                    head.length
                )));
            }
            let mut message = vec![0u8; head.length as usize];
            connection.read_exact(&mut message).map_err(io)?;
            let message = String::from_utf8_lossy(&message).into_owned();
            if status == Status::Busy {
                return Err(CopyError::Busy(message));
            }
            return Err(CopyError::Refused {
                kind: status.kind(),
                message,
            });
        }
        let name = file.index;
        if head.file_length != file.length {
            return Err(CopyError::Corruption(format!(
                "file {name}: the session listed {} bytes, the chunk says {}",
                file.length, head.file_length
            )));
        }
        let n = head.length as usize;
        if n as u64 > want {
            return Err(CopyError::Corruption(format!(
                "file {name}: asked for {want} bytes at {offset}, the answer has {n}"
            )));
        }
        if n == 0 {
            return Err(CopyError::Corruption(format!(
                "file {name}: empty chunk at {offset} of {}",
                file.length
            )));
        }
        if buffer.len() < n {
            buffer.resize(n, 0);
        }
        connection.read_exact(&mut buffer[..n]).map_err(io)?;
        let actual = crc32c::crc32c(&buffer[..n]);
        if actual == head.crc32c {
            return Ok(n);
        }
        if attempt == attempts {
            return Err(CopyError::Corruption(format!(
                "file {name}: chunk at {offset} has CRC32C {actual:#010x}, the source sent \
                 {:#010x} ({attempts} fetches)",
                head.crc32c
            )));
        }
        job.progress
            .chunks_refetched
            .fetch_add(1, Ordering::Relaxed);
    }
    unreachable!("attempts > 0")
}

/// Writes all of `data` at `offset` of `fd`, then starts its writeback
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): the disk writes while later chunks arrive and
/// the file's `fsync` has little left to do. Durability is the `fsync`'s alone.
pub fn write_at(fd: RawFd, data: &[u8], offset: u64) -> Result<(), CopyError> {
    // SAFETY: each write reads within `data`.
    all_bytes(data.len(), |done| unsafe {
        let at = (offset + done as u64) as libc::off_t;
        libc::pwrite(fd, data[done..].as_ptr().cast(), data.len() - done, at)
    })
    .map_err(|source| CopyError::Io {
        what: format!("write to fd {fd} at {offset}"),
        source,
    })?;
    // A hint: its errors (none that fsync would not report) are left to the fsync.
    // SAFETY: a plain system call on a descriptor the caller owns.
    unsafe {
        libc::sync_file_range(
            fd,
            offset as libc::off_t,
            data.len() as libc::off_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
    Ok(())
}

fn fsync(fd: RawFd) -> Result<(), CopyError> {
    // SAFETY: a plain system call on a descriptor the caller owns.
    if unsafe { libc::fsync(fd) } != 0 {
        return Err(CopyError::Io {
            what: format!("fsync fd {fd}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
