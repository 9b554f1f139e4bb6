//! The follower's side of a peer channel connection, written from whichever thread has a
//! frame ready: the event loop's answers, and the WAL committer's answers written as soon as
//! the sync that makes an AppendEntries durable returns (`ReplicatedLog::answer_when_durable`).
//!
//! A frame is a 4-byte big-endian length and that many bytes (nyala.rpc.channel_wire). Every
//! frame goes through one lock and one buffer of bytes not yet taken by the socket, so frames
//! from two threads never interleave and leave in the order they were written. The socket is
//! a duplicate of the event loop's descriptor, non-blocking: a write never waits. What the
//! socket does not take stays pending; the owner flushes it when the socket is writable (the
//! event loop watches `fd` for that), and a committer that leaves bytes pending signals
//! `wake_fd` so that the owner learns of it. Closing the sink closes the duplicate, after
//! which writes are dropped (the connection is going away; its owner knows why).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nyala_wal::EventFd;
use parking_lot::Mutex;

/// Bytes of a frame's length prefix.
const LENGTH_BYTES: usize = 4;

/// One connection's writes (see the module comment).
#[derive(Debug)]
pub struct AnswerSink {
    state: Mutex<SinkState>,
    wake: EventFd,
}

#[derive(Debug, Default)]
struct SinkState {
    /// The duplicate descriptor; `None` once closed or broken.
    fd: Option<OwnedFd>,
    /// Bytes written to the sink that the socket has not taken, from `sent` on.
    pending: Vec<u8>,
    sent: usize,
}

impl SinkState {
    fn pending_bytes(&self) -> usize {
        self.pending.len() - self.sent
    }

    /// Sends what is pending until the socket takes no more; returns what is left. A
    /// failure other than a full socket breaks the sink (the pending bytes are dropped).
    fn flush(&mut self) -> io::Result<usize> {
        while self.sent < self.pending.len() {
            let Some(fd) = self.fd.as_ref() else {
                return Err(closed());
            };
            let rest = &self.pending[self.sent..];
            // SAFETY: sends from a live slice on a descriptor this sink owns.
            let n = unsafe {
                libc::send(
                    fd.as_raw_fd(),
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                self.sent += n as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => break,
                _ => {
                    self.break_off();
                    return Err(err);
                }
            }
        }
        if self.sent == self.pending.len() {
            self.pending.clear();
            self.sent = 0;
        } else if self.sent > 64 << 10 && self.sent * 2 > self.pending.len() {
            self.pending.drain(..self.sent);
            self.sent = 0;
        }
        Ok(self.pending_bytes())
    }

    fn break_off(&mut self) {
        self.fd = None;
        self.pending = Vec::new();
        self.sent = 0;
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the peer channel connection is closed",
    )
}

impl AnswerSink {
    /// A sink writing to a duplicate of `fd` (a connected stream socket; the caller keeps
    /// its own descriptor, and should make sure nothing else writes to it).
    pub fn new(fd: RawFd) -> io::Result<AnswerSink> {
        // SAFETY: fcntl duplicates a descriptor the caller vouches for; the result is checked.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(dup) };
        Ok(AnswerSink {
            state: Mutex::new(SinkState {
                fd: Some(fd),
                ..SinkState::default()
            }),
            wake: EventFd::new()?,
        })
    }

    /// Writes one frame of `data` (after whatever is pending); returns the bytes still
    /// pending. Fails once the sink is closed or the connection broke.
    pub fn write_frame(&self, data: &[u8]) -> io::Result<usize> {
        let length = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a frame over 4 GiB"))?;
        let mut state = self.state.lock();
        if state.fd.is_none() {
            return Err(closed());
        }
        state.pending.reserve(LENGTH_BYTES + data.len());
        state.pending.extend_from_slice(&length.to_be_bytes());
        state.pending.extend_from_slice(data);
        state.flush()
    }

    /// `write_frame` for a thread that is not the owner's: a frame left pending signals
    /// `wake_fd`, and a failure is dropped (the owner learns of a broken connection from
    /// its own side of it). Returns whether the whole frame went to the socket.
    pub fn write_frame_from_thread(&self, data: &[u8]) -> bool {
        match self.write_frame(data) {
            Ok(0) => true,
            Ok(_) => {
                self.wake.signal();
                false
            }
            Err(_) => false,
        }
    }

    /// Sends what is pending; returns what is still pending.
    pub fn flush(&self) -> io::Result<usize> {
        self.state.lock().flush()
    }

    /// Bytes written to the sink that the socket has not taken yet.
    pub fn pending(&self) -> usize {
        self.state.lock().pending_bytes()
    }

    /// The duplicate descriptor (to watch for writability), or `None` once closed.
    pub fn fd(&self) -> Option<RawFd> {
        self.state.lock().fd.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Readable once a committer left bytes pending (`drain_wake` clears it).
    pub fn wake_fd(&self) -> RawFd {
        self.wake.raw_fd()
    }

    pub fn drain_wake(&self) {
        self.wake.drain();
    }

    /// Closes the duplicate descriptor and drops what is pending; later writes fail.
    pub fn close(&self) {
        self.state.lock().break_off();
    }

    pub fn is_closed(&self) -> bool {
        self.state.lock().fd.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    fn read_frames(reader: &mut UnixStream, count: usize) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        for _ in 0..count {
            let mut head = [0u8; LENGTH_BYTES];
            reader.read_exact(&mut head).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
            reader.read_exact(&mut body).unwrap();
            frames.push(body);
        }
        frames
    }

    #[test]
    fn frames_arrive_whole_and_in_order() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let sink = AnswerSink::new(ours.as_raw_fd()).unwrap();
        assert_eq!(sink.write_frame(b"one").unwrap(), 0);
        assert!(sink.write_frame_from_thread(b"two"));
        assert_eq!(sink.write_frame(b"").unwrap(), 0);
        assert_eq!(
            read_frames(&mut theirs, 3),
            vec![b"one".to_vec(), b"two".to_vec(), Vec::new()]
        );
    }

    #[test]
    fn a_full_socket_keeps_the_rest_pending_and_wakes_the_owner() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let sink = Arc::new(AnswerSink::new(ours.as_raw_fd()).unwrap());
        let big = vec![7u8; 4 << 20]; // more than a socket buffer takes
        let pending = sink.write_frame(&big).unwrap();
        assert!(pending > 0);
        // A frame from another thread queues behind it, and signals.
        let from_thread = Arc::clone(&sink);
        std::thread::spawn(move || assert!(!from_thread.write_frame_from_thread(b"after")))
            .join()
            .unwrap();
        let mut signal = [0u8; 8];
        // SAFETY: reads 8 bytes into a live local from the sink's eventfd.
        let n = unsafe { libc::read(sink.wake_fd(), signal.as_mut_ptr().cast(), 8) };
        assert_eq!(n, 8, "the owner was woken");
        let reader = std::thread::spawn(move || read_frames(&mut theirs, 2));
        while sink.flush().unwrap() > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let frames = reader.join().unwrap();
        assert_eq!(frames[0], big);
        assert_eq!(frames[1], b"after");
    }

    #[test]
    fn a_closed_sink_refuses_writes_and_lets_the_connection_end() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let sink = AnswerSink::new(ours.as_raw_fd()).unwrap();
        drop(ours);
        sink.close();
        assert!(sink.is_closed());
        assert!(sink.write_frame(b"late").is_err());
        assert!(!sink.write_frame_from_thread(b"late"));
        let mut rest = Vec::new();
        theirs.read_to_end(&mut rest).unwrap(); // EOF: no descriptor keeps it open
        assert!(rest.is_empty());
    }

    #[test]
    fn a_broken_connection_fails_the_write() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let sink = AnswerSink::new(ours.as_raw_fd()).unwrap();
        drop(theirs);
        assert!(sink.write_frame(b"lost").is_err());
        assert!(sink.is_closed());
    }
}
