//! A Linux eventfd that event loops watch to learn that the durable point moved.
//!
//! The committer that publishes a group bumps it after every group commit (and on failure); an
//! asyncio loop registers the descriptor with `add_reader`, drains it and compares tickets. No
//! thread per waiter and no polling.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The notification descriptor (non-blocking, close-on-exec).
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
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
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local into our own descriptor.
        unsafe {
            libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// Clears pending wake-ups (called by the watcher before it looks at the durable point).
    pub(crate) fn drain(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a live local; non-blocking, so EAGAIN just means empty.
        unsafe {
            libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8);
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
