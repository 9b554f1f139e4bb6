//! How event loops learn that a log's durable point moved: a Linux eventfd.
//!
//! The committer that publishes a group signals after every group commit (and on failure); an
//! asyncio loop registers the descriptor with `add_reader`, drains it and compares tickets. No
//! thread per waiter and no polling.
//!
//! A log has a descriptor of its own unless it is given a `Notifier`: one eventfd that many
//! logs of a process share, each under a token. A signalling log queues its token once (until
//! its watcher next drains it) and signals the shared descriptor, so the loop's one watcher
//! learns which logs to look at. A tablet server with thousands of replicas thus watches one
//! descriptor instead of one per replica (issue "Thousands of tablet replicas per server").

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The notification descriptor (non-blocking, close-on-exec); also what a consensus
/// `AnswerSink` wakes its owner with.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(EventFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Wakes the watcher. A full counter (2^64-2 pending wake-ups) cannot happen in practice;
    /// EAGAIN would only mean a wake-up is already pending, which is all we need.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local into our own descriptor.
        unsafe {
            libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Clears pending wake-ups (called by the watcher before it looks at the durable point).
    pub fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live local; non-blocking, so EAGAIN just means empty.
        unsafe {
            libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8);
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// One eventfd shared by many logs, with the tokens of the logs that signalled since the
/// watcher last looked (see the module comment). Give it to logs through
/// `LogOptions::notifier`.
#[derive(Debug)]
pub struct Notifier {
    fd: EventFd,
    ready: Mutex<Vec<u64>>,
}

impl Notifier {
    pub fn new() -> io::Result<Arc<Notifier>> {
        Ok(Arc::new(Notifier {
            fd: EventFd::new()?,
            ready: Mutex::new(Vec::new()),
        }))
    }

    /// The descriptor the watcher registers: readable once a log signalled.
    pub fn fd(&self) -> RawFd {
        self.fd.raw_fd()
    }

    /// Clears the descriptor and returns the tokens of the logs that signalled since the last
    /// call, each once. The watcher then calls each such log's `drain_notifications` before
    /// it looks at that log's durable point.
    pub fn take_ready(&self) -> Vec<u64> {
        self.fd.drain();
        std::mem::take(&mut *self.ready.lock())
    }
}

/// A log's side of the notification: its own descriptor, or its token on a shared one.
#[derive(Debug)]
pub(crate) enum LogNotify {
    Own(EventFd),
    Shared {
        notifier: Arc<Notifier>,
        token: u64,
        /// The token is queued and the watcher has not drained this log since.
        queued: AtomicBool,
    },
}

impl LogNotify {
    pub(crate) fn new(shared: Option<(Arc<Notifier>, u64)>) -> io::Result<Self> {
        Ok(match shared {
            None => LogNotify::Own(EventFd::new()?),
            Some((notifier, token)) => LogNotify::Shared {
                notifier,
                token,
                queued: AtomicBool::new(false),
            },
        })
    }

    /// Wakes the watcher; the caller changed what the watcher looks at before this.
    pub(crate) fn signal(&self) {
        match self {
            LogNotify::Own(fd) => fd.signal(),
            LogNotify::Shared {
                notifier,
                token,
                queued,
            } => {
                // With the fence in `drain`: either this swap sees the watcher's clear and
                // queues the token again, or the watcher's look after its clear sees the
                // change made before this signal.
                fence(Ordering::SeqCst);
                if !queued.swap(true, Ordering::SeqCst) {
                    notifier.ready.lock().push(*token);
                    notifier.fd.signal();
                }
            }
        }
    }

    /// Clears this log's pending wake-up (the watcher calls it before it looks).
    pub(crate) fn drain(&self) {
        match self {
            LogNotify::Own(fd) => fd.drain(),
            LogNotify::Shared { queued, .. } => {
                queued.store(false, Ordering::SeqCst);
                fence(Ordering::SeqCst);
            }
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        match self {
            LogNotify::Own(fd) => fd.raw_fd(),
            LogNotify::Shared { notifier, .. } => notifier.fd(),
        }
    }
}
