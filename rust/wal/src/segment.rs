//! Segment files: naming, preparation (preallocation, recycling), scanning and closing.
//!
//! This module owns everything done to one segment file. It does not know about the queue,
//! the index or other segments; `recovery` and `log` combine segments into a log.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use nyala_common::{OpId, OpIndex};
use parking_lot::RwLock;

use crate::error::{Result, WalError};
use crate::faults::FaultInjection;
use crate::format::{self, BatchHeader, BatchKind, EntryMeta, Footer, HeaderError};
use crate::metrics::Metrics;

/// Prefix of segment file names (`wal-000000001`).
pub const SEGMENT_PREFIX: &str = "wal-";
/// Prefix of GC'd segment files kept for reuse.
pub const RECYCLE_PREFIX: &str = "wal-recycle-";
/// Suffix of a segment being prepared; such files never hold acknowledged entries.
pub const PREPARING_SUFFIX: &str = ".tmp";

/// How a new segment gets its disk space before it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preallocation {
    /// `fallocate` the whole segment (unwritten extents), `ftruncate` where unsupported.
    Fallocate,
    /// Reuse a garbage-collected segment file whose blocks are already written (so a sync
    /// after overwriting them needs no extent conversion); `Fallocate` when none is free.
    Recycle,
    /// Write zeros over the whole segment in the background before it is used.
    ZeroFill,
}

/// The file name of segment `sequence`.
pub fn segment_file_name(sequence: u64) -> String {
    format!("{SEGMENT_PREFIX}{sequence:09}")
}

/// The sequence number in a segment file name, if it is one.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(SEGMENT_PREFIX)?;
    if digits.len() < 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A segment of the log, shared by the appender, readers, the background thread and GC.
///
/// Its file stays open while the log uses it; an idle log closes it (`release_handle`, from
/// `Log::release_files`) and the next use opens it again. Whoever writes through a handle
/// syncs through that same handle (or one opened before the write), so a writeback error of
/// the write is never missed by a sync through a description opened after it.
#[derive(Debug)]
pub(crate) struct SegmentFile {
    pub sequence: u64,
    pub path: PathBuf,
    /// The open file; `None` once released, until the next `file()`.
    handle: RwLock<Option<Arc<File>>>,
    /// Entries in the segment and their lowest/highest index (0/0 while empty).
    pub entry_count: AtomicU64,
    pub min_index: AtomicU64,
    pub max_index: AtomicU64,
    /// Offset just past the last batch, once the segment is no longer appended to (rolled
    /// over, or found by recovery); 0 while it is the active segment.
    pub data_end: AtomicU64,
    /// Set once the footer is durable; only closed segments may be garbage-collected.
    pub closed: AtomicBool,
    /// Whether the segment's name is known durable in its directory. A segment prepared
    /// with its syncs deferred (see `prepare_segments`) gets it from the first committer
    /// that syncs data into it, before that data is acknowledged.
    pub name_durable: AtomicBool,
}

impl SegmentFile {
    pub(crate) fn new(sequence: u64, path: PathBuf, file: File) -> Self {
        SegmentFile {
            sequence,
            path,
            handle: RwLock::new(Some(Arc::new(file))),
            entry_count: AtomicU64::new(0),
            min_index: AtomicU64::new(0),
            max_index: AtomicU64::new(0),
            data_end: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            name_durable: AtomicBool::new(true),
        }
    }

    /// Records entries `first..=last` as written into this segment.
    pub(crate) fn note_entries(&self, first: OpIndex, last: OpIndex) {
        let count = last - first + 1;
        if self.entry_count.fetch_add(count, Ordering::Relaxed) == 0 {
            self.min_index.store(first, Ordering::Relaxed);
        } else {
            self.min_index.fetch_min(first, Ordering::Relaxed);
        }
        self.max_index.fetch_max(last, Ordering::Relaxed);
    }

    pub(crate) fn footer(&self) -> Footer {
        Footer {
            entry_count: self.entry_count.load(Ordering::Relaxed),
            min_index: self.min_index.load(Ordering::Relaxed),
            max_index: self.max_index.load(Ordering::Relaxed),
            sequence: self.sequence,
        }
    }

    /// The segment's open file, opened again if it was released. Pin it (keep the `Arc`)
    /// across a write and the sync that makes the write durable, and take it while the
    /// segment is still in the log's table if GC may remove the file meanwhile.
    pub(crate) fn file(&self) -> Result<Arc<File>> {
        if let Some(file) = &*self.handle.read() {
            return Ok(Arc::clone(file));
        }
        let mut slot = self.handle.write();
        if let Some(file) = &*slot {
            return Ok(Arc::clone(file));
        }
        // A closed segment is only read from now on.
        let writable = !self.closed.load(Ordering::Acquire);
        let file = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(writable)
                .open(&self.path)
                .map_err(|e| WalError::io("open again", &self.path, e))?,
        );
        *slot = Some(Arc::clone(&file));
        Ok(file)
    }

    /// Closes the segment's file unless a user still holds it (it then closes when that user
    /// lets go); the next `file()` opens it again. Returns whether a handle was held.
    pub(crate) fn release_handle(&self) -> bool {
        self.handle.write().take().is_some()
    }

    /// Reads exactly `len` bytes at `offset` of `file` (this segment's, from `file()`).
    pub(crate) fn read_at(&self, file: &File, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| WalError::io("read", &self.path, e))?;
        Ok(buf)
    }
}

/// What `prepare_segments` needs to know about one segment.
pub(crate) struct PrepareSpec<'a> {
    pub dir: &'a Path,
    pub tablet_id: &'a str,
    pub sequence: u64,
    pub capacity_bytes: u64,
    pub preallocation: Preallocation,
    /// A GC'd segment file to reuse (only with `Preallocation::Recycle`).
    pub recycled: Option<PathBuf>,
    pub faults: &'a FaultInjection,
    pub metrics: &'a Metrics,
}

impl PrepareSpec<'_> {
    /// Whether the segment is left for its first group's sync to make durable.
    fn sync_deferred(&self) -> bool {
        self.recycled.is_none() && self.preallocation != Preallocation::ZeroFill
    }
}

/// Creates segments ready for appends, in sequence order: header page written, space
/// allocated, under their final names. Each is prepared under a temporary name and
/// renamed, so the final name never shows a half-prepared file while the machine runs.
///
/// Segments whose space is `fallocate`d (or sparse) are not synced here: a crash may leave
/// one missing, empty or with a zeroed header (recovery drops such trailing segments), and
/// the first group written into one makes it durable on the way: its `fdatasync` carries
/// the header page and the allocation (it commits the journal anyway, to mark the written
/// extents), and its committer syncs the directory once before acknowledging anything in
/// it (`SegmentFile::name_durable`). Their syncs here were journal commits of their own,
/// each a cache flush of the disk in the middle of a bulk writer's stream, for 3-5 % of
/// its bandwidth (docs/wal-format.md, "Session 14").
///
/// Zero-filled and recycled segments are still synced here: a zero-filled one's 8 MiB of
/// zeros would otherwise be written by the first group's sync, and a recycled file's data
/// is overwritten in place, so its first group's sync commits no journal that the rename
/// could share. Several at once share their syncs: the files are staged first, then synced,
/// renamed and the directory synced once. On ext4 every fsync waits for a journal commit,
/// which under a bulk append took 5-18 ms. Once one segment fails, the later ones fail too
/// (never a gap in the sequence numbers).
pub(crate) fn prepare_segments(specs: &[PrepareSpec<'_>]) -> Vec<Result<SegmentFile>> {
    let mut staged: Vec<Result<(File, PathBuf, PathBuf)>> = Vec::with_capacity(specs.len());
    for spec in specs {
        let failed_before = staged.last().is_some_and(|s| s.is_err());
        staged.push(if failed_before {
            Err(WalError::Closed)
        } else {
            stage_segment(spec)
        });
    }
    let mut renamed = 0usize;
    // Whether a segment synced here was renamed: its name is made durable here too.
    let mut dir_sync_needed = false;
    for (spec, item) in specs.iter().zip(&mut staged) {
        let outcome = match item {
            Ok((file, temp_path, final_path)) => (if spec.sync_deferred() {
                Ok(())
            } else {
                file.sync_all()
            })
            .map_err(|e| WalError::io("fsync", temp_path.as_path(), e))
            .and_then(|()| {
                fs::rename(&*temp_path, &*final_path)
                    .map_err(|e| WalError::io("rename", temp_path.as_path(), e))
            }),
            Err(_) => break,
        };
        if let Err(err) = outcome {
            *item = Err(err);
            break;
        }
        renamed += 1;
        dir_sync_needed |= !spec.sync_deferred();
    }
    // Nothing after the first failure is published (its `.tmp` file is a leftover that the
    // next open deletes). The appender stops at the first error, so later ones never surface.
    for item in staged.iter_mut().skip(renamed + 1) {
        *item = Err(WalError::Closed);
    }
    if dir_sync_needed {
        if let Err(err) = sync_dir(specs[0].dir) {
            staged[0] = Err(err);
            for item in staged.iter_mut().skip(1) {
                *item = Err(WalError::Closed);
            }
        }
    }
    specs
        .iter()
        .zip(staged)
        .map(|(spec, item)| {
            let (file, _temp, final_path) = item?;
            let counter = if spec.recycled.is_some() {
                &spec.metrics.segments_recycled
            } else {
                &spec.metrics.segments_created
            };
            Metrics::add(counter, 1);
            let segment = SegmentFile::new(spec.sequence, final_path, file);
            if spec.sync_deferred() {
                segment.name_durable.store(false, Ordering::Release);
            }
            Ok(segment)
        })
        .collect()
}

/// Writes a segment's header page and allocates its space under a temporary name; returns
/// the file, the temporary path and the final path. Not synced yet.
fn stage_segment(spec: &PrepareSpec<'_>) -> Result<(File, PathBuf, PathBuf)> {
    let final_path = spec.dir.join(segment_file_name(spec.sequence));
    let temp_path = spec.dir.join(format!(
        "{}{PREPARING_SUFFIX}",
        segment_file_name(spec.sequence)
    ));
    let recycled = spec.recycled.is_some();
    if let Some(old) = &spec.recycled {
        fs::rename(old, &temp_path).map_err(|e| WalError::io("rename", old, e))?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(!recycled)
        .open(&temp_path)
        .map_err(|e| WalError::io("create", &temp_path, e))?;
    let mut page = vec![0u8; format::PAGE_BYTES];
    page[..format::SEGMENT_HEADER_BYTES].copy_from_slice(&format::encode_segment_header(
        spec.tablet_id,
        spec.sequence,
    ));
    file.write_all_at(&page, 0)
        .map_err(|e| WalError::io("write", &temp_path, e))?;
    match spec.preallocation {
        Preallocation::ZeroFill if !recycled => {
            zero_fill(&file, &temp_path, spec.capacity_bytes)?;
            Metrics::add(&spec.metrics.segments_zero_filled, 1);
        }
        _ => preallocate(
            &file,
            &temp_path,
            spec.capacity_bytes,
            spec.faults,
            spec.metrics,
        )?,
    }
    Ok((file, temp_path, final_path))
}

/// Reserves `len` bytes for the file: `fallocate`, or a sparse `ftruncate` where the file
/// system does not support it (the first writes then allocate, and syncs cost more).
pub(crate) fn preallocate(
    file: &File,
    path: &Path,
    len: u64,
    faults: &FaultInjection,
    metrics: &Metrics,
) -> Result<()> {
    let result = if faults.fallocate_unsupported() {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    } else {
        fallocate(file, len)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
            ) =>
        {
            Metrics::add(&metrics.fallocate_fallbacks, 1);
            let current = file
                .metadata()
                .map_err(|e| WalError::io("stat", path, e))?
                .len();
            if current < len {
                file.set_len(len)
                    .map_err(|e| WalError::io("ftruncate", path, e))?;
            }
            Ok(())
        }
        Err(e) => Err(WalError::io("fallocate", path, e)),
    }
}

fn fallocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a descriptor we own; arguments are in range.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn zero_fill(file: &File, path: &Path, len: u64) -> Result<()> {
    const CHUNK_BYTES: usize = 1 << 20;
    let zeros = vec![0u8; CHUNK_BYTES];
    let mut offset = format::PAGE_BYTES as u64;
    while offset < len {
        let n = ((len - offset) as usize).min(CHUNK_BYTES);
        file.write_all_at(&zeros[..n], offset)
            .map_err(|e| WalError::io("write", path, e))?;
        offset += n as u64;
    }
    Ok(())
}

/// Makes directory entries (creations, renames, deletions) in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| WalError::io("fsync directory", dir, e))
}

/// Writes the footer after the last batch and cuts the file there; with `sync`, makes that
/// durable too.
pub(crate) fn close_segment(segment: &SegmentFile, write_end: u64, sync: bool) -> Result<()> {
    let footer = format::encode_footer(&segment.footer());
    let path = &segment.path;
    let file = segment.file()?;
    file.write_all_at(&footer, write_end)
        .map_err(|e| WalError::io("write footer", path, e))?;
    file.set_len(write_end + format::FOOTER_BYTES as u64)
        .map_err(|e| WalError::io("ftruncate", path, e))?;
    if sync {
        file.sync_all()
            .map_err(|e| WalError::io("fsync", path, e))?;
    }
    segment.closed.store(true, Ordering::Release);
    Ok(())
}

/// One valid batch found by a scan.
#[derive(Debug)]
pub(crate) struct ScannedBatch {
    pub offset: u64,
    pub header: BatchHeader,
    pub entries: Vec<EntryMeta>,
    /// For truncation records: the last entry kept.
    pub last_kept: Option<OpId>,
}

/// Whether the file's header never reached the disk (shorter than a header, or all zeros
/// there): see `scan_segment` for what else such a file may hold.
pub(crate) fn header_unformatted(path: &Path) -> Result<bool> {
    let file = File::open(path).map_err(|e| WalError::io("open", path, e))?;
    let mut header = [0u8; format::SEGMENT_HEADER_BYTES];
    let mut filled = 0;
    while filled < header.len() {
        match file.read_at(&mut header[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(WalError::io("read", path, e)),
        }
    }
    Ok(matches!(
        format::decode_segment_header(&header[..filled]),
        Err(HeaderError::Unformatted)
    ))
}

/// The result of reading one segment file from start to end.
#[derive(Debug)]
pub(crate) struct SegmentScan {
    /// The header never reached the disk (a crash before the segment's first sync), and no
    /// valid data of the segment did either.
    pub unformatted: bool,
    pub batches: Vec<ScannedBatch>,
    /// Offset just past the last valid batch.
    pub valid_end: u64,
    pub footer: Option<Footer>,
    /// The first `SEGMENT_HEADER_BYTES` of the file (to reuse it for appends).
    pub header_bytes: Vec<u8>,
}

/// Reads and checks segment `sequence` of `tablet_id`. A bad frame is the end of the data if
/// no valid frame of this segment follows it (a torn or zeroed tail); otherwise it is
/// corruption, reported with the file and offset.
pub(crate) fn scan_segment(
    path: &Path,
    bytes: &[u8],
    tablet_id: &str,
    sequence: u64,
) -> Result<SegmentScan> {
    let mut scan = SegmentScan {
        unformatted: false,
        batches: Vec::new(),
        valid_end: format::SEGMENT_HEADER_BYTES as u64,
        footer: None,
        header_bytes: bytes[..bytes.len().min(format::SEGMENT_HEADER_BYTES)].to_vec(),
    };
    match format::decode_segment_header(bytes) {
        Ok(header) => {
            if header.tablet_id != tablet_id {
                let reason = format!("segment belongs to tablet {:?}", header.tablet_id);
                return Err(WalError::corruption(path, 0, reason));
            }
            if header.sequence != sequence {
                let reason = format!("header names sequence {}", header.sequence);
                return Err(WalError::corruption(path, 0, reason));
            }
        }
        Err(HeaderError::Unformatted) => {
            // A header that never reached the disk is a crash's leftover only while nothing
            // of the segment did: valid data behind it is damage (the data was meant to be
            // read), so it is corruption as anywhere else before valid data.
            if let Some(at) = find_valid_frame(bytes, format::SEGMENT_HEADER_BYTES, sequence) {
                let reason = format!("segment has no header; valid data follows at offset {at}");
                return Err(WalError::corruption(path, 0, reason));
            }
            scan.unformatted = true;
            return Ok(scan);
        }
        Err(HeaderError::Invalid(reason)) => return Err(WalError::corruption(path, 0, reason)),
        Err(HeaderError::Version(version)) => {
            return Err(WalError::UnsupportedVersion {
                path: path.to_owned(),
                version,
                supported: format::FORMAT_VERSION,
            })
        }
    }
    let mut pos = format::SEGMENT_HEADER_BYTES;
    loop {
        match read_frame(bytes, pos, sequence) {
            Ok(Frame::Batch(batch)) => {
                pos += batch.header.frame_len();
                scan.batches.push(batch);
                scan.valid_end = pos as u64;
            }
            Ok(Frame::Footer(footer)) => {
                scan.footer = Some(footer);
                return Ok(scan);
            }
            Err(reason) => {
                if let Some(later) = find_valid_frame(bytes, pos + 1, sequence) {
                    let reason = format!("{reason}; valid data follows at offset {later}");
                    return Err(WalError::corruption(path, pos as u64, reason));
                }
                return Ok(scan);
            }
        }
    }
}

enum Frame {
    Batch(ScannedBatch),
    Footer(Footer),
}

/// Decodes and fully verifies the frame at `pos` (header checksum, segment sequence,
/// payload checksum, entry framing).
fn read_frame(bytes: &[u8], pos: usize, sequence: u64) -> std::result::Result<Frame, &'static str> {
    let rest = &bytes[pos.min(bytes.len())..];
    if rest.starts_with(&format::FOOTER_MAGIC) {
        let footer = format::decode_footer(rest)?;
        if footer.sequence != sequence {
            return Err("footer of another segment");
        }
        return Ok(Frame::Footer(footer));
    }
    let header = format::decode_batch_header(rest)?;
    if header.sequence != sequence {
        return Err("batch of another segment (recycled file)");
    }
    if rest.len() < header.frame_len() {
        return Err("batch cut short");
    }
    let payload = &rest[format::BATCH_HEADER_BYTES..header.frame_len()];
    if crc32c::crc32c(payload) != header.payload_crc {
        return Err("batch payload checksum mismatch");
    }
    let (entries, last_kept) = match header.kind {
        BatchKind::Entries => (format::decode_entries(payload, header.entry_count)?, None),
        BatchKind::Truncate => (Vec::new(), Some(format::decode_truncate(payload)?)),
    };
    Ok(Frame::Batch(ScannedBatch {
        offset: pos as u64,
        header,
        entries,
        last_kept,
    }))
}

/// The offset of the first fully valid frame of this segment at or after `from`, if any.
fn find_valid_frame(bytes: &[u8], from: usize, sequence: u64) -> Option<usize> {
    let last_start = bytes.len().checked_sub(4)?;
    (from..=last_start).find(|&pos| {
        let magic = &bytes[pos..pos + 4];
        (magic == format::BATCH_MAGIC || magic == format::FOOTER_MAGIC)
            && read_frame(bytes, pos, sequence).is_ok()
    })
}

/// Cuts a segment whose tail is torn (or never closed) after its valid data and closes it
/// with a footer, so every segment but the active one has a footer.
pub(crate) fn repair_segment(segment: &SegmentFile, valid_end: u64) -> Result<()> {
    segment
        .file()?
        .set_len(valid_end)
        .map_err(|e| WalError::io("ftruncate", &segment.path, e))?;
    close_segment(segment, valid_end, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_round_trip() {
        assert_eq!(segment_file_name(12), "wal-000000012");
        assert_eq!(parse_segment_name("wal-000000012"), Some(12));
        assert_eq!(parse_segment_name("wal-recycle-000000012"), None);
        assert_eq!(parse_segment_name("wal-000000012.tmp"), None);
    }

    fn spec<'a>(
        dir: &'a Path,
        sequence: u64,
        recycled: Option<PathBuf>,
        faults: &'a FaultInjection,
        metrics: &'a Metrics,
    ) -> PrepareSpec<'a> {
        PrepareSpec {
            dir,
            tablet_id: "t",
            sequence,
            capacity_bytes: 64 << 10,
            preallocation: Preallocation::Fallocate,
            recycled,
            faults,
            metrics,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn segments_prepared_together_are_complete_and_consecutive() {
        let dir = tempfile::tempdir().unwrap();
        let (faults, metrics) = (FaultInjection::default(), Metrics::default());
        let specs: Vec<_> = (4..7)
            .map(|sequence| spec(dir.path(), sequence, None, &faults, &metrics))
            .collect();
        let prepared: Vec<SegmentFile> = prepare_segments(&specs)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(
            prepared.iter().map(|s| s.sequence).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        assert_eq!(
            names(dir.path()),
            ["wal-000000004", "wal-000000005", "wal-000000006"]
        );
        for segment in &prepared {
            let bytes = fs::read(&segment.path).unwrap();
            assert_eq!(bytes.len(), 64 << 10, "space allocated");
            let scan = scan_segment(&segment.path, &bytes, "t", segment.sequence).unwrap();
            assert!(!scan.unformatted && scan.batches.is_empty() && scan.footer.is_none());
        }
        assert_eq!(metrics.snapshot().segments_created, 3);
    }

    #[test]
    fn nothing_after_a_failed_preparation_is_published() {
        let dir = tempfile::tempdir().unwrap();
        let (faults, metrics) = (FaultInjection::default(), Metrics::default());
        let missing = dir.path().join("wal-recycle-000000099");
        let specs = vec![
            spec(dir.path(), 1, None, &faults, &metrics),
            spec(dir.path(), 2, Some(missing), &faults, &metrics),
            spec(dir.path(), 3, None, &faults, &metrics),
        ];
        let results = prepare_segments(&specs);
        assert!(results[0].is_ok());
        let err = results[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("wal-recycle-000000099"), "{err}");
        assert!(results[2].is_err());
        // No gap in the sequence: segment 3 exists under no final name.
        assert_eq!(names(dir.path()), ["wal-000000001"]);
    }
}
