//! Reused buffers for the payloads of large batches.
//!
//! A batch too large for the queue's arena is framed into a buffer of its own by the
//! appending thread, and the committer drops it once the batch is written. Fresh from the
//! allocator, such a buffer is new memory: glibc maps allocations of this size (or trims its
//! heap after they are freed), and the appending thread then page-faults and zeroes every page
//! before copying into it. For a writer of 1 MiB batches that was three quarters of its time
//! per append (0.6 ms of 0.8), which paced the committer's writes to about 1 GB/s
//! (docs/wal-format.md, "Group commit latency", session 13). Buffers given back here are
//! handed out again, already mapped.
//!
//! One pool serves every log in the process (a tablet server runs one per tablet), bounded in
//! the bytes it keeps.

use parking_lot::Mutex;

/// Payloads from this size on come from the pool (glibc's default mmap threshold).
pub(crate) const POOLED_BYTES_MIN: usize = 128 << 10;
/// Buffers larger than this are not kept.
const POOLED_BUFFER_BYTES_MAX: usize = 16 << 20;
/// The most capacity the pool keeps while its buffers wait to be reused.
const RETAINED_BYTES_MAX: usize = 32 << 20;

struct Pool {
    buffers: Vec<Vec<u8>>,
    retained_bytes: usize,
    retained_bytes_max: usize,
}

impl Pool {
    const fn new(retained_bytes_max: usize) -> Self {
        Pool {
            buffers: Vec::new(),
            retained_bytes: 0,
            retained_bytes_max,
        }
    }

    /// A kept buffer with room for `len` bytes but at most twice that: the queue counts a
    /// batch by its length, so a much larger buffer would hold memory it does not see.
    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        let at = self
            .buffers
            .iter()
            .rposition(|b| (len..=len.saturating_mul(2)).contains(&b.capacity()))?;
        let buffer = self.buffers.swap_remove(at);
        self.retained_bytes -= buffer.capacity();
        Some(buffer)
    }

    /// Keeps `buffer` (emptied) if there is room; returns it otherwise.
    fn keep(&mut self, mut buffer: Vec<u8>) -> Option<Vec<u8>> {
        let capacity = buffer.capacity();
        if !(POOLED_BYTES_MIN..=POOLED_BUFFER_BYTES_MAX).contains(&capacity)
            || self.retained_bytes + capacity > self.retained_bytes_max
        {
            return Some(buffer);
        }
        buffer.clear();
        self.retained_bytes += capacity;
        self.buffers.push(buffer);
        None
    }
}

static POOL: Mutex<Pool> = parking_lot::const_mutex(Pool::new(RETAINED_BYTES_MAX));

/// An empty buffer with room for at least `len` bytes (reused when the pool has one that
/// fits).
pub(crate) fn take(len: usize) -> Vec<u8> {
    if len >= POOLED_BYTES_MIN {
        if let Some(buffer) = POOL.lock().take(len) {
            return buffer;
        }
    }
    Vec::with_capacity(len)
}

/// Keeps `buffer` for a later `take` if it is large and the pool has room; frees it
/// otherwise, outside the pool's lock.
pub(crate) fn give_back(buffer: Vec<u8>) {
    if buffer.capacity() < POOLED_BYTES_MIN {
        return;
    }
    let rejected = POOL.lock().keep(buffer);
    drop(rejected);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_reused_empty_and_small_ones_are_not_kept() {
        let mut pool = Pool::new(RETAINED_BYTES_MAX);
        let mut big = Vec::with_capacity(POOLED_BYTES_MIN * 2);
        big.extend_from_slice(&[7u8; 200 << 10]);
        let address = big.as_ptr();
        assert!(pool.keep(big).is_none());
        assert!(
            pool.take(POOLED_BYTES_MIN * 4).is_none(),
            "nothing large enough"
        );
        assert!(
            pool.take(POOLED_BYTES_MIN / 2).is_none(),
            "nothing more than twice the size asked for"
        );
        let again = pool.take(POOLED_BYTES_MIN).expect("the kept buffer");
        assert!(again.is_empty(), "a reused buffer comes back empty");
        assert_eq!(again.as_ptr(), address);
        assert_eq!(pool.retained_bytes, 0);
        assert!(
            pool.keep(Vec::with_capacity(1024)).is_some(),
            "small buffers are not kept"
        );
        assert!(
            pool.keep(Vec::with_capacity(POOLED_BUFFER_BYTES_MAX + 1))
                .is_some(),
            "nor very large ones"
        );
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound() {
        let mut pool = Pool::new(4 * POOLED_BYTES_MIN);
        for _ in 0..6 {
            let _ = pool.keep(Vec::with_capacity(POOLED_BYTES_MIN));
        }
        assert_eq!(pool.buffers.len(), 4);
        assert_eq!(pool.retained_bytes, 4 * POOLED_BYTES_MIN);
    }

    #[test]
    fn the_process_pool_hands_out_buffers_with_room() {
        let mut buffer = take(POOLED_BYTES_MIN + 1);
        assert!(buffer.capacity() > POOLED_BYTES_MIN);
        buffer.resize(POOLED_BYTES_MIN + 1, 1);
        give_back(buffer);
        let again = take(POOLED_BYTES_MIN + 1);
        assert!(again.is_empty() && again.capacity() > POOLED_BYTES_MIN);
    }
}
