//! Helpers shared by the WAL integration tests.
#![allow(dead_code)]

use std::path::Path;

use nyala_wal::{AppendTicket, Entry, EntryRef, EntryType, Log, LogOptions, SyncPolicy};

/// A scratch directory; on tmpfs when one is mounted, so tests that open many logs stay fast.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("nyala-wal-test-")
            .tempdir_in(shm)
        {
            return dir;
        }
    }
    tempfile::Builder::new()
        .prefix("nyala-wal-test-")
        .tempdir()
        .expect("temp dir")
}

/// Options for small, fast logs.
pub fn small_options(segment_size_bytes: u64) -> LogOptions {
    LogOptions {
        segment_size_bytes,
        sync_policy: SyncPolicy::Group,
        ..LogOptions::default()
    }
}

/// A deterministic payload for entry `index` (length varies with the index).
pub fn payload(index: u64) -> Vec<u8> {
    let len = (index * 37 % 300) as usize;
    (0..len).map(|i| (index as usize * 31 + i) as u8).collect()
}

/// The entry the tests write at `index`.
pub fn entry(term: u64, index: u64) -> Entry {
    let entry_type = match index % 3 {
        0 => EntryType::Write,
        1 => EntryType::NoOp,
        _ => EntryType::ConfigChange,
    };
    Entry {
        term,
        index,
        entry_type,
        payload: payload(index),
    }
}

/// Appends entries `first..=last` in term `term` as one batch and waits for durability.
pub fn append_range(log: &Log, term: u64, first: u64, last: u64) -> Vec<Entry> {
    let entries: Vec<Entry> = (first..=last).map(|i| entry(term, i)).collect();
    let refs: Vec<EntryRef<'_>> = entries.iter().map(Entry::as_ref).collect();
    log.append_durable(&refs).expect("append");
    entries
}

/// Every entry of the log, via the iterator.
pub fn read_all(log: &Log) -> Vec<Entry> {
    log.entries_from(log.first_index(), 1 << 20)
        .collect::<Result<Vec<_>, _>>()
        .expect("read all")
}

/// Appends `entry` as frames the caller holds (`Log::append_shared`), the way the replicated
/// log hands its entry batches over.
pub fn append_as_shared(log: &Log, entry: &Entry) -> AppendTicket {
    let framed = nyala_wal::format::encode_entries(&[entry.as_ref()]);
    let bytes: Vec<u8> = framed.bytes.to_vec();
    let end = bytes.len();
    let storage: nyala_wal::format::SharedBytes = std::sync::Arc::new(bytes);
    log.append_shared(&[entry.as_ref()], storage, 0..end)
        .expect("append_shared")
}

/// Checks that `log` holds exactly `expected`, then closes it and checks that reopening the
/// directory gives the same.
pub fn assert_holds_across_reopen(log: &Log, dir: &Path, options: LogOptions, expected: &[Entry]) {
    assert_eq!(read_all(log), expected);
    log.close().expect("close");
    let reopened = Log::open(dir, "t", options).expect("reopen");
    assert_eq!(read_all(&reopened), expected);
}
