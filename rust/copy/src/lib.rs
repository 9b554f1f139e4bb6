//! Tablet copy's data channel: the bytes of a copy session's files, source to target, without
//! RPC framework or interpreter in the path (docs/tablet-copy.md, "The data channel").
//!
//! The session itself (what is copied, the WAL anchor, the pins, the superblock and cmeta) is
//! opened and closed over the TabletCopyService RPCs; `BeginTabletCopySession` answers with
//! this channel's port and a random 16-byte token that names the session here. The source
//! (`DataServer`) then serves the session's files, each with the fixed length it had when the
//! session began, in chunks read straight from the file; the target (`download`) fetches the
//! chunks of every file over several connections at once, checks each one and writes it at
//! its offset, starting its writeback at once, and syncs each file when its last chunk is in.
//!
//! The protocol, on one TCP connection, is request then answer, over and over (little-endian):
//!
//! ```text
//! request (40 bytes): "NYC1" | token [16] | file index u32 | offset u64 | length u32 | 0 u32
//! answer head (24):   status u32 | length u32 | crc32c u32 | 0 u32 | file length u64
//! then `length` bytes: the chunk (status OK), or a UTF-8 message (any other status)
//! ```
//!
//! A file is named by its index in the session's list (rowset files, then WAL segments, in
//! the order `BeginTabletCopySession` listed them). The answer holds at most the bytes asked
//! for, fewer at the end of the file or when the source's chunk size is smaller; its CRC32C
//! covers the chunk. A request the source cannot parse closes the connection after an
//! `INVALID_ARGUMENT` answer. A connection beyond the source's limit gets `BUSY` as the answer
//! to its first request, then is closed; the target's other connections carry on.
//!
//! There is no encryption here: a server whose RPCs use TLS does not start this channel, and
//! its copies go over the FetchData RPC instead.

mod client;
mod server;

pub use client::{download, write_at, Download, DownloadOptions, TargetFile};
pub use server::{DataServer, ServedFile, ServerOptions};

use nyala_common::{Classify, ErrorKind};

/// The length of a session token.
pub const TOKEN_BYTES: usize = 16;
/// A session token: random bytes the source made up when the session began.
pub type Token = [u8; TOKEN_BYTES];

const MAGIC: [u8; 4] = *b"NYC1";
const REQUEST_BYTES: usize = 40;
const ANSWER_HEAD_BYTES: usize = 24;
/// The longest error message an answer may carry.
const MESSAGE_BYTES_MAX: u32 = 64 << 10;

/// An answer's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Status {
    Ok = 0,
    /// No session with that token (ended or expired).
    NotFound = 1,
    /// A malformed request, a file index not in the session, an offset past the end.
    InvalidArgument = 2,
    /// The source could not read the file.
    Io = 3,
    /// The source has as many connections as it serves.
    Busy = 4,
}

impl Status {
    fn from_u32(v: u32) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::InvalidArgument,
            3 => Status::Io,
            4 => Status::Busy,
            _ => return None,
        })
    }

    fn kind(self) -> ErrorKind {
        match self {
            Status::Ok => ErrorKind::IllegalState, // never an error
            Status::NotFound => ErrorKind::NotFound,
            Status::InvalidArgument => ErrorKind::InvalidArgument,
            Status::Io => ErrorKind::Io,
            Status::Busy => ErrorKind::ServiceUnavailable,
        }
    }
}

/// One chunk asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    token: Token,
    file: u32,
    offset: u64,
    length: u32,
}

impl Request {
    fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut out = [0u8; REQUEST_BYTES];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..20].copy_from_slice(&self.token);
        out[20..24].copy_from_slice(&self.file.to_le_bytes());
        out[24..32].copy_from_slice(&self.offset.to_le_bytes());
        out[32..36].copy_from_slice(&self.length.to_le_bytes());
        out
    }

    fn decode(buf: &[u8; REQUEST_BYTES]) -> Result<Request, String> {
        if buf[0..4] != MAGIC {
            return Err(format!(
                "not a tablet copy data request (magic {:02x?})",
                &buf[0..4]
            ));
        }
        if buf[36..40] != [0; 4] {
            return Err("a request's reserved field must be zero".to_string());
        }
        let mut token = [0u8; TOKEN_BYTES];
        token.copy_from_slice(&buf[4..20]);
        Ok(Request {
            token,
            file: u32::from_le_bytes(buf[20..24].try_into().expect("4 bytes")),
            offset: u64::from_le_bytes(buf[24..32].try_into().expect("8 bytes")),
            length: u32::from_le_bytes(buf[32..36].try_into().expect("4 bytes")),
        })
    }
}

/// The head of one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AnswerHead {
    status: u32,
    length: u32,
    crc32c: u32,
    file_length: u64,
}

impl AnswerHead {
    fn encode(&self) -> [u8; ANSWER_HEAD_BYTES] {
        let mut out = [0u8; ANSWER_HEAD_BYTES];
        out[0..4].copy_from_slice(&self.status.to_le_bytes());
        out[4..8].copy_from_slice(&self.length.to_le_bytes());
        out[8..12].copy_from_slice(&self.crc32c.to_le_bytes());
        out[16..24].copy_from_slice(&self.file_length.to_le_bytes());
        out
    }

    fn decode(buf: &[u8; ANSWER_HEAD_BYTES]) -> AnswerHead {
        AnswerHead {
            status: u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")),
            length: u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")),
            crc32c: u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes")),
            file_length: u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes")),
        }
    }
}

/// What went wrong in a copy over the channel, classified for `nyala.errors`.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A chunk failed its checks as many times as it was fetched, or the answers do not fit
    /// the file the session listed.
    #[error("{0}")]
    Corruption(String),
    /// The source answered with an error.
    #[error("the copy source refused: {message}")]
    Refused { kind: ErrorKind, message: String },
    /// The source served as many connections as it may, for longer than the timeout.
    #[error("the copy source is busy: {0}")]
    Busy(String),
    /// The source could not be reached, or the connection failed or timed out.
    #[error("tablet copy data channel to {address}: {message}")]
    Network { address: String, message: String },
    /// Reading or writing a local file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The download was cancelled.
    #[error("the copy was cancelled")]
    Cancelled,
    /// A bad argument from the caller.
    #[error("{0}")]
    InvalidArgument(String),
}

impl Classify for CopyError {
    fn kind(&self) -> ErrorKind {
        match self {
            CopyError::Corruption(_) => ErrorKind::Corruption,
            CopyError::Refused { kind, .. } => *kind,
            CopyError::Network { .. } | CopyError::Busy(_) => ErrorKind::ServiceUnavailable,
            CopyError::Io { source, .. } => ErrorKind::of_io(source),
            CopyError::Cancelled => ErrorKind::Aborted,
            CopyError::InvalidArgument(_) => ErrorKind::InvalidArgument,
        }
    }
}

/// Calls `op(done)` — one `pread` or `pwrite` of the bytes from `done` on, answering what it
/// moved — until all `len` bytes are done, again after an interrupted call; a call that moves
/// nothing is an `UnexpectedEof`.
pub fn all_bytes(len: usize, mut op: impl FnMut(usize) -> isize) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = op(done);
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_a_foreign_one_is_refused() {
        let request = Request {
            token: [7; TOKEN_BYTES],
            file: 3,
            offset: 1 << 40,
            length: 4 << 20,
        };
        assert_eq!(Request::decode(&request.encode()), Ok(request));
        let mut foreign = request.encode();
        foreign[0] = b'G';
        assert!(Request::decode(&foreign).unwrap_err().contains("magic"));
        let mut reserved = request.encode();
        reserved[39] = 1;
        assert!(Request::decode(&reserved).unwrap_err().contains("reserved"));
    }

    #[test]
    fn an_answer_head_round_trips() {
        let head = AnswerHead {
            status: Status::Ok as u32,
            length: 12,
            crc32c: 0xdead_beef,
            file_length: 1 << 33,
        };
        assert_eq!(AnswerHead::decode(&head.encode()), head);
        assert_eq!(Status::from_u32(4), Some(Status::Busy));
        assert_eq!(Status::from_u32(5), None);
    }
}
