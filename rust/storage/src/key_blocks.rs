//! The process-wide cache of rowsets' key blocks, bounded in bytes.
//!
//! A presence check (does INSERT find the key taken, does UPDATE or DELETE find it live) that
//! a rowset's bloom filter cannot answer reads the one block of `KEY_BLOCK_ROWS` rows that may
//! hold the key (`DiskRowSet::presence`). Decoded blocks stay here, least recently used
//! going first once the cache holds more than its budget, so memory for key lookups does not
//! grow with the keys a server stores: each rowset kept every key it held in memory before
//! (16 bytes a key for 8-byte keys, more than the data file), for as long as it lived.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::key::EncodedKeys;

/// Rows of a rowset file per key block (a block never spans two row groups).
pub const KEY_BLOCK_ROWS: usize = 4096;
/// The cache's budget unless `set_key_block_cache_bytes` says otherwise.
pub const KEY_BLOCK_CACHE_BYTES_DEFAULT: usize = 256 << 20;

/// Keys in order, each with whether its row is a tombstone: one block's keys each once (its
/// first row in the block, the newest version there), or a rowset's sparse index (each block's
/// first row).
#[derive(Debug, Default)]
pub struct KeyBlock {
    pub keys: EncodedKeys,
    pub deleted: Vec<bool>,
}

impl KeyBlock {
    /// Heap and inline bytes of the block.
    pub(crate) fn bytes(&self) -> usize {
        self.keys.heap_bytes() + self.deleted.capacity() + std::mem::size_of::<Self>()
    }

    /// Whether `key` is here, and if so whether its row is a tombstone.
    pub fn find(&self, key: &[u8]) -> Option<bool> {
        let low = self.keys.lower_bound(key);
        (low < self.keys.len() && self.keys.get(low) == key).then(|| self.deleted[low])
    }
}

struct Entry {
    block: Arc<KeyBlock>,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<(u64, usize), Entry>,
    bytes: usize,
    tick: u64,
}

static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
static BUDGET: AtomicUsize = AtomicUsize::new(KEY_BLOCK_CACHE_BYTES_DEFAULT);
static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

fn cache() -> &'static Mutex<Cache> {
    CACHE.get_or_init(|| Mutex::new(Cache::default()))
}

/// A number for one opened rowset, naming its blocks here.
pub(crate) fn new_owner() -> u64 {
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

/// Sets the cache's budget in bytes (evicting down to it at the next insert).
pub fn set_key_block_cache_bytes(bytes: usize) {
    BUDGET.store(bytes, Ordering::Relaxed);
}

/// What the cache holds and how it served: (bytes, blocks, hits, misses).
pub fn key_block_cache_stats() -> (usize, usize, u64, u64) {
    let cache = cache().lock();
    (
        cache.bytes,
        cache.entries.len(),
        HITS.load(Ordering::Relaxed),
        MISSES.load(Ordering::Relaxed),
    )
}

/// Block `block` of rowset `owner`, read by `load` unless cached.
pub(crate) fn get_or_load<E>(
    owner: u64,
    block: usize,
    load: impl FnOnce() -> Result<KeyBlock, E>,
) -> Result<Arc<KeyBlock>, E> {
    {
        let mut cache = cache().lock();
        cache.tick += 1;
        let tick = cache.tick;
        if let Some(entry) = cache.entries.get_mut(&(owner, block)) {
            entry.used = tick;
            HITS.fetch_add(1, Ordering::Relaxed);
            return Ok(entry.block.clone());
        }
    }
    MISSES.fetch_add(1, Ordering::Relaxed);
    let loaded = Arc::new(load()?); // outside the lock: other rowsets' lookups go on
    let bytes = loaded.bytes();
    let mut cache = cache().lock();
    cache.tick += 1;
    let used = cache.tick;
    let entry = Entry {
        block: loaded.clone(),
        bytes,
        used,
    };
    if let Some(old) = cache.entries.insert((owner, block), entry) {
        cache.bytes -= old.bytes; // loaded twice at once: one copy counts
    }
    cache.bytes += bytes;
    let budget = BUDGET.load(Ordering::Relaxed);
    if cache.bytes > budget {
        // Down to 90 % at once, so the sort is paid every few inserts, not each one.
        let mut by_age: Vec<((u64, usize), u64)> =
            cache.entries.iter().map(|(k, e)| (*k, e.used)).collect();
        by_age.sort_unstable_by_key(|(_, used)| *used);
        for (key, _) in by_age {
            if cache.bytes <= budget / 10 * 9 {
                break;
            }
            if let Some(gone) = cache.entries.remove(&key) {
                cache.bytes -= gone.bytes;
            }
        }
    }
    Ok(loaded)
}

/// Drops every block of rowset `owner` (its file is closed).
pub(crate) fn forget(owner: u64) {
    let mut cache = cache().lock();
    let mut freed = 0;
    cache.entries.retain(|(o, _), entry| {
        let keep = *o != owner;
        if !keep {
            freed += entry.bytes;
        }
        keep
    });
    cache.bytes -= freed;
}
