//! Fault injection for tests and chaos runs. **Not for production use.**
//!
//! Always compiled in, so the same binary that ships can be driven into its failure paths,
//! but only reachable through `LogOptions::fault_injection` / `Log::fault_injection()`, which
//! nothing outside tests sets. Each switch is checked right before the real system call it
//! replaces, so the code that handles the error is exactly the production code.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Switches that make the next file operations fail as if the operating system refused them.
#[derive(Debug, Default)]
pub struct FaultInjection {
    /// How many upcoming `fdatasync` calls fail (each failure consumes one).
    failing_syncs: AtomicU32,
    /// The errno those failures report (EIO when 0).
    sync_errno: AtomicI32,
    /// How many upcoming `fdatasync` calls are delayed (each delay consumes one).
    delayed_syncs: AtomicU32,
    /// How long each of those waits before the real call (or the injected failure).
    sync_delay_micros: AtomicU64,
    /// When set, `fallocate` reports EOPNOTSUPP, as on file systems without it.
    fallocate_unsupported: AtomicBool,
}

impl FaultInjection {
    /// Makes the next `count` syncs of the log fail with `errno` (e.g. `libc::EIO`,
    /// `libc::ENOSPC`).
    pub fn fail_next_syncs(&self, count: u32, errno: i32) {
        self.sync_errno.store(errno, Ordering::SeqCst);
        self.failing_syncs.store(count, Ordering::SeqCst);
    }

    /// Makes the next `count` syncs of the log wait `delay` first, as on a slow disk
    /// (`u32::MAX` for every sync from now on). A sync that is both delayed and armed to
    /// fail waits, then fails.
    pub fn delay_next_syncs(&self, count: u32, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.sync_delay_micros.store(micros, Ordering::SeqCst);
        self.delayed_syncs.store(count, Ordering::SeqCst);
    }

    /// How many of the delays armed by `delay_next_syncs` no sync has taken yet.
    pub fn sync_delays_pending(&self) -> u32 {
        self.delayed_syncs.load(Ordering::SeqCst)
    }

    /// Makes preallocation behave as if `fallocate` were unsupported (or restores it).
    pub fn set_fallocate_unsupported(&self, unsupported: bool) {
        self.fallocate_unsupported
            .store(unsupported, Ordering::SeqCst);
    }

    /// Called right before each segment `fdatasync`: waits out an armed delay, then
    /// consumes one injected failure, if any is armed.
    pub(crate) fn before_sync(&self) -> Option<io::Error> {
        let delayed = self
            .delayed_syncs
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                0 => None,
                u32::MAX => Some(u32::MAX),
                n => Some(n - 1),
            })
            .is_ok();
        if delayed {
            let micros = self.sync_delay_micros.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(micros));
        }
        self.take_sync_failure()
    }

    /// Consumes one injected sync failure, if any is armed.
    fn take_sync_failure(&self) -> Option<io::Error> {
        let taken = self
            .failing_syncs
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !taken {
            return None;
        }
        let errno = match self.sync_errno.load(Ordering::SeqCst) {
            0 => libc::EIO,
            errno => errno,
        };
        Some(io::Error::from_raw_os_error(errno))
    }

    /// Whether `fallocate` should be treated as unsupported.
    pub(crate) fn fallocate_unsupported(&self) -> bool {
        self.fallocate_unsupported.load(Ordering::SeqCst)
    }
}
