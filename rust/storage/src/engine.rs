//! The tablet storage engine: applies row-operation batches in op-index order, flushes and
//! compacts rowsets off the apply path, serves consistent merge-on-read scans, persists the
//! live rowset set with `last_flushed_index`, and pins files for tablet copy.
//!
//! Locking: `state` (a short-held `RwLock`) guards the in-memory structures; `maintenance`
//! serialises flushes, schema changes and every change of the rowset set on disk (the
//! manifest), which do their file I/O without holding `state`, so writes and scans continue
//! while a rowset is written (DESIGN.md §4-§6). `compaction` serialises compactions, which
//! merge and write their output holding only it, and take `maintenance` to install it: a
//! long compaction does not hold flushes back (the MemRowSet would grow toward the memory
//! limit's refusals meanwhile). Lock order: `compaction`, `maintenance`, `requests`, `state`.
//! Threshold-triggered flushes run on the process-wide flush pool (`flush_pool`), at most one
//! job per engine; dropping an engine waits for its own flush only.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use arrow::array::RecordBatch;
use nyala_common::OpIndex;
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use crate::compaction;
use crate::diskrowset::{self, DiskRowSet, RowSetRef, RowSetWriter, READ_BATCH_ROWS};
use crate::error::{Result, StorageError};
use crate::flush_pool;
use crate::key::encode_keys;
use crate::manifest::{self, Manifest, RowSetEntry};
use crate::memrowset::{MemRowSet, Presence};
use crate::ops::{OpBatch, RowStatus};
use crate::requests::RequestIndex;
use crate::scan::{ScanCursor, ScanPlan, ScanResult, ScanSpec, Source, VersionsMerge};
use crate::schema::Schema;

/// A step of flush or compaction at which tests inject a crash or an I/O failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// Before the new rowset's files are created.
    BeforeRowSetWrite,
    /// The rowset's files are durable; the manifest still names the old set.
    AfterRowSetWrite,
    /// The new manifest is durable; memory still holds the old set.
    AfterManifestWrite,
}

/// Called at each `FaultPoint`; an error aborts the flush or compaction there.
pub type FaultInjector = Arc<dyn Fn(FaultPoint) -> std::io::Result<()> + Send + Sync>;

/// Tunables of one engine.
#[derive(Clone)]
pub struct EngineOptions {
    /// Apply freezes the MemRowSet and hands it to a background flush at this size.
    pub flush_threshold_bytes: usize,
    /// Run threshold-triggered flushes in the background, on the process-wide flush pool
    /// (otherwise only on request).
    pub background_flush: bool,
    /// Test hook (see `FaultPoint`).
    pub fault_injector: Option<FaultInjector>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            flush_threshold_bytes: 64 * 1024 * 1024,
            background_flush: true,
            fault_injector: None,
        }
    }
}

impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("flush_threshold_bytes", &self.flush_threshold_bytes)
            .field("background_flush", &self.background_flush)
            .finish()
    }
}

/// Per-row outcomes of one applied batch, in row order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyResult {
    pub statuses: Vec<RowStatus>,
}

impl ApplyResult {
    /// Rows that did not end `OK`, with their positions.
    pub fn errors(&self) -> impl Iterator<Item = (usize, RowStatus)> + '_ {
        self.statuses
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != RowStatus::Ok)
            .map(|(i, s)| (i, *s))
    }
}

/// Files making up a consistent image of the tablet's data at `last_flushed_index`, pinned
/// against deletion until `Engine::release_snapshot(id)`.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub id: u64,
    pub last_flushed_index: OpIndex,
    /// Rowset files (data and bloom), oldest rowset first.
    pub files: Vec<PathBuf>,
    /// The rowset manifest file image (metafile container) describing exactly these files.
    pub manifest_image: Vec<u8>,
}

/// Counters describing an engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineStats {
    pub mem_rows: usize,
    pub mem_bytes: usize,
    pub frozen_rows: usize,
    /// Bytes of the MemRowSet being flushed (0 if none): still memory until the flush ends.
    pub frozen_bytes: usize,
    pub rowsets: usize,
    pub disk_rows: u64,
    /// Bytes of the rowsets' files.
    pub data_bytes: u64,
    pub last_applied_index: OpIndex,
    pub last_flushed_index: OpIndex,
    /// Flushes that wrote a rowset since the engine opened (explicit and size-triggered).
    pub flushes: u64,
    /// Time spent in those flushes, in microseconds.
    pub flush_duration_us: u64,
    /// Compactions that merged rowsets since the engine opened.
    pub compactions: u64,
    /// Time spent in those compactions, in microseconds.
    pub compaction_duration_us: u64,
    /// Bytes of the rowsets those compactions wrote (against the data's size, their write
    /// amplification).
    pub compaction_bytes_written: u64,
}

/// What maintenance did since the engine opened (read by `Engine::stats`).
#[derive(Default)]
struct MaintenanceCounters {
    flushes: AtomicU64,
    flush_duration_us: AtomicU64,
    compactions: AtomicU64,
    compaction_duration_us: AtomicU64,
    compaction_bytes_written: AtomicU64,
}

impl MaintenanceCounters {
    fn record(count: &AtomicU64, duration_us: &AtomicU64, started: std::time::Instant) {
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        count.fetch_add(1, Ordering::Relaxed);
        duration_us.fetch_add(micros, Ordering::Relaxed);
    }
}

struct Frozen {
    mem: Arc<MemRowSet>,
    /// Every op with index <= this is in `mem` or older rowsets.
    flush_index: OpIndex,
    /// The request index's image at `flush_index` (taken when frozen, with the index locked).
    request_outcomes: Arc<[u8]>,
}

struct State {
    schema: Arc<Schema>,
    active: MemRowSet,
    frozen: Option<Frozen>,
    /// Oldest first; a later rowset's version of a key shadows an earlier one's.
    disk: Vec<RowSetRef>,
    /// Invariant: last_flushed_index <= last_applied_index.
    last_applied_index: OpIndex,
    last_flushed_index: OpIndex,
    next_rowset_id: u64,
    /// The newest commit timestamp applied (or in the rowsets); apply refuses an older one.
    last_timestamp: u64,
    /// Compaction may have dropped versions older than this (the highest ancient history
    /// mark it collected at): snapshot reads below it are refused. Persisted in the manifest.
    history_gc_mark: u64,
    /// The request index's image at `last_flushed_index`, as the manifest holds it.
    flushed_request_outcomes: Arc<[u8]>,
}

impl State {
    fn manifest(&self) -> Manifest {
        Manifest {
            last_flushed_index: self.last_flushed_index,
            next_rowset_id: self.next_rowset_id,
            history_gc_mark: self.history_gc_mark,
            schema: (*self.schema).clone(),
            rowsets: self.disk.iter().map(|r| entry_of(r)).collect(),
            request_outcomes: self.flushed_request_outcomes.clone(),
        }
    }
}

/// Whether `key` is live in the layers older than the active MemRowSet (newest that knows
/// wins); the disk rowsets may need I/O to answer.
fn older_live(frozen: Option<&Frozen>, disk: &[RowSetRef], key: &[u8]) -> Result<bool> {
    if let Some(frozen) = frozen {
        match frozen.mem.presence(key) {
            Presence::Unknown => {}
            found => return Ok(found == Presence::Live),
        }
    }
    for rowset in disk.iter().rev() {
        match rowset.presence(key)? {
            Presence::Unknown => continue,
            found => return Ok(found == Presence::Live),
        }
    }
    Ok(false)
}

fn entry_of(rowset: &DiskRowSet) -> RowSetEntry {
    RowSetEntry {
        id: rowset.id(),
        rows: rowset.rows(),
        tombstones: rowset.tombstones(),
    }
}

/// The engine's background flush: at most one pool job at a time.
#[derive(Default)]
struct Worker {
    /// A frozen MemRowSet waits for a background flush.
    flush_requested: bool,
    /// A flush job is submitted to the pool or running; it flushes until nothing is
    /// requested.
    scheduled: bool,
    /// The job is flushing now (dropping the engine waits for that, not for a queued job).
    running: bool,
    /// The engine is being dropped: a job that has not started flushing does nothing.
    stop: bool,
}

struct Shared {
    dir: PathBuf,
    options: EngineOptions,
    state: RwLock<State>,
    /// The applied requests and their outcomes (exactly once). Lock order: `maintenance`,
    /// then `requests`, then `state`. Invariant: whoever holds it sees every WRITE applied
    /// to `state` recorded here (`apply_write_entries` applies and records under it).
    requests: Mutex<RequestIndex>,
    maintenance: Mutex<()>,
    compaction: Mutex<()>,
    worker: Mutex<Worker>,
    /// Signalled when the flush job stops flushing.
    worker_idle: Condvar,
    background_error: Mutex<Option<String>>,
    pins: Mutex<HashMap<u64, Vec<RowSetRef>>>,
    next_snapshot_id: AtomicU64,
    counters: MaintenanceCounters,
}

/// One tablet replica's storage engine over its data directory.
pub struct Engine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.shared.dir)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for Engine {
    /// Waits for the engine's flush if one is running (its files stay consistent); a flush
    /// job still queued in the pool finds the engine gone and does nothing.
    fn drop(&mut self) {
        let mut worker = self.shared.worker.lock();
        worker.stop = true;
        while worker.running {
            self.shared.worker_idle.wait(&mut worker);
        }
    }
}

impl Engine {
    /// Creates an empty engine in `dir` (created if needed) with `schema`.
    pub fn create(dir: &Path, schema: Schema, options: EngineOptions) -> Result<Engine> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
        if manifest::manifest_path(dir).exists() {
            return Err(StorageError::AlreadyPresent(format!(
                "{}: a tablet's data already lives here",
                dir.display()
            )));
        }
        Manifest {
            last_flushed_index: 0,
            next_rowset_id: 1,
            history_gc_mark: 0,
            schema,
            rowsets: Vec::new(),
            request_outcomes: Arc::from(RequestIndex::new().encode()),
        }
        .write(dir)?;
        Engine::open(dir, options)
    }

    /// Opens the engine in `dir` from its manifest, deleting files no manifest names
    /// (leftovers of a crash during flush or compaction). The request index is the one
    /// persisted with `last_flushed_index`.
    pub fn open(dir: &Path, options: EngineOptions) -> Result<Engine> {
        let manifest = Manifest::read(dir)?;
        let requests = RequestIndex::decode(&manifest.request_outcomes).map_err(|e| match e {
            StorageError::Corruption(why) => StorageError::corruption(format!(
                "{}: {why}",
                manifest::manifest_path(dir).display()
            )),
            other => other,
        })?;
        let key_count = manifest.schema.key_count();
        let mut disk = Vec::with_capacity(manifest.rowsets.len());
        for entry in &manifest.rowsets {
            let rowset = DiskRowSet::open(dir, entry.id, key_count)?;
            if entry_of(&rowset) != *entry {
                return Err(StorageError::corruption(format!(
                    "{}: rowset {} does not match the manifest",
                    dir.display(),
                    entry.id
                )));
            }
            disk.push(Arc::new(rowset));
        }
        remove_orphans(dir, &manifest)?;
        let last_timestamp = disk.iter().map(|r| r.ts_range().1).max().unwrap_or(0);
        let state = State {
            active: MemRowSet::new(manifest.schema.fixed_key_width()),
            schema: Arc::new(manifest.schema),
            frozen: None,
            disk,
            last_applied_index: manifest.last_flushed_index,
            last_flushed_index: manifest.last_flushed_index,
            next_rowset_id: manifest.next_rowset_id,
            last_timestamp,
            history_gc_mark: manifest.history_gc_mark,
            flushed_request_outcomes: manifest.request_outcomes,
        };
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            options,
            state: RwLock::new(state),
            requests: Mutex::new(requests),
            maintenance: Mutex::new(()),
            compaction: Mutex::new(()),
            worker: Mutex::new(Worker::default()),
            worker_idle: Condvar::new(),
            background_error: Mutex::new(None),
            pins: Mutex::new(HashMap::new()),
            next_snapshot_id: AtomicU64::new(1),
            counters: MaintenanceCounters::default(),
        });
        Ok(Engine { shared })
    }

    /// The current schema.
    pub fn schema(&self) -> Arc<Schema> {
        self.shared.state.read().schema.clone()
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Every op with index <= this is durable in rowsets; WAL replay starts after it.
    pub fn last_flushed_index(&self) -> OpIndex {
        self.shared.state.read().last_flushed_index
    }

    /// The applied requests and their first outcomes, locked: while the guard lives no
    /// WRITE entry is applied (`apply_write_entries` holds it) and no flush freezes.
    pub fn requests(&self) -> MutexGuard<'_, RequestIndex> {
        self.shared.requests.lock()
    }

    /// The highest op index applied.
    pub fn last_applied_index(&self) -> OpIndex {
        self.shared.state.read().last_applied_index
    }

    /// The highest ancient history mark compaction collected at: versions older than the
    /// newest one at or before it may be gone, so snapshot reads below it are refused.
    pub fn history_gc_mark(&self) -> u64 {
        self.shared.state.read().history_gc_mark
    }

    /// The newest commit timestamp applied.
    pub fn last_timestamp(&self) -> u64 {
        self.shared.state.read().last_timestamp
    }

    /// Counters for monitoring and tests.
    pub fn stats(&self) -> EngineStats {
        let st = self.shared.state.read();
        let counters = &self.shared.counters;
        EngineStats {
            mem_rows: st.active.len(),
            mem_bytes: st.active.bytes(),
            frozen_rows: st.frozen.as_ref().map_or(0, |f| f.mem.len()),
            frozen_bytes: st.frozen.as_ref().map_or(0, |f| f.mem.bytes()),
            rowsets: st.disk.len(),
            disk_rows: st.disk.iter().map(|r| r.rows()).sum(),
            data_bytes: st.disk.iter().map(|r| r.bytes()).sum(),
            last_applied_index: st.last_applied_index,
            last_flushed_index: st.last_flushed_index,
            flushes: counters.flushes.load(Ordering::Relaxed),
            flush_duration_us: counters.flush_duration_us.load(Ordering::Relaxed),
            compactions: counters.compactions.load(Ordering::Relaxed),
            compaction_duration_us: counters.compaction_duration_us.load(Ordering::Relaxed),
            compaction_bytes_written: counters.compaction_bytes_written.load(Ordering::Relaxed),
        }
    }

    /// The error of the last failed background flush, if any (the data stays in memory and
    /// the next flush retries).
    pub fn background_error(&self) -> Option<String> {
        self.shared.background_error.lock().clone()
    }

    /// Decodes and validates Arrow IPC op-batch bytes against the current schema.
    pub fn decode(&self, data: arrow::buffer::Buffer) -> Result<OpBatch> {
        OpBatch::decode_ipc(data, &self.schema())
    }

    /// Validates an op record batch against the current schema.
    pub fn validate(&self, batch: &RecordBatch) -> Result<OpBatch> {
        OpBatch::from_record_batch(batch, &self.schema())
    }

    /// Encodes the key of each row of `keys` (the key columns, by name, in key order) for use
    /// as scan bounds.
    pub fn encode_keys(&self, keys: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let schema = self.schema();
        let mut columns = Vec::with_capacity(schema.key_count());
        for column in schema.key_columns() {
            let array = keys.column_by_name(&column.name).ok_or_else(|| {
                StorageError::invalid(format!("key bound lacks column {:?}", column.name))
            })?;
            if *array.data_type() != column.data_type.arrow() {
                return Err(StorageError::invalid(format!(
                    "key bound column {:?} must be {}",
                    column.name,
                    column.data_type.name()
                )));
            }
            columns.push(array.clone());
        }
        let encoded = encode_keys(&columns)?;
        Ok((0..encoded.len())
            .map(|i| encoded.get(i).to_vec())
            .collect())
    }

    /// Applies `batch` as op `op_index` (which must exceed every index applied before).
    /// Deterministic: the same batches in the same order give the same rows and statuses.
    /// Nothing is applied if an error is returned.
    pub fn apply(&self, batch: &OpBatch, op_index: OpIndex) -> Result<ApplyResult> {
        self.apply_at(batch, op_index, 0)
    }

    /// `apply` with the op's commit timestamp (hybrid time, never below an earlier op's): every
    /// row version it writes keeps that timestamp for snapshot reads.
    pub fn apply_at(
        &self,
        batch: &OpBatch,
        op_index: OpIndex,
        timestamp: u64,
    ) -> Result<ApplyResult> {
        let result = self.apply_unfrozen(batch, op_index, timestamp)?;
        self.freeze_if_full(&self.requests());
        Ok(result)
    }

    /// `apply_at` without freezing a full MemRowSet: the caller (holding the request index,
    /// `requests`) records the op's request first and then calls `freeze_if_full`.
    pub(crate) fn apply_unfrozen(
        &self,
        batch: &OpBatch,
        op_index: OpIndex,
        timestamp: u64,
    ) -> Result<ApplyResult> {
        let mut st = self.shared.state.write();
        if batch.schema_version != st.schema.version() {
            return Err(StorageError::invalid(format!(
                "batch was validated against schema version {}, the tablet is at {}",
                batch.schema_version,
                st.schema.version()
            )));
        }
        if op_index <= st.last_applied_index {
            return Err(StorageError::IllegalState(format!(
                "op index {op_index} is not after the last applied {}",
                st.last_applied_index
            )));
        }
        if timestamp < st.last_timestamp {
            return Err(StorageError::IllegalState(format!(
                "op {op_index} has timestamp {timestamp}, below the last applied {} \
                 (timestamps never decrease in op order)",
                st.last_timestamp
            )));
        }
        let State {
            active,
            frozen,
            disk,
            ..
        } = &mut *st;
        let statuses = active.apply(batch, op_index, timestamp, |key| {
            older_live(frozen.as_ref(), disk, key)
        })?;
        st.last_applied_index = op_index;
        st.last_timestamp = timestamp;
        Ok(ApplyResult { statuses })
    }

    /// Freezes the MemRowSet for a background flush once it holds `flush_threshold_bytes`;
    /// `requests` is the engine's request index, locked by the caller (`requests`), whose
    /// image the flush persists with the frozen ops.
    pub(crate) fn freeze_if_full(&self, requests: &RequestIndex) {
        if !self.shared.options.background_flush {
            return;
        }
        let mut st = self.shared.state.write();
        if st.frozen.is_none() && st.active.bytes() >= self.shared.options.flush_threshold_bytes {
            freeze(&mut st, requests);
            drop(st);
            request_background_flush(&self.shared);
        }
    }

    /// Flushes everything applied so far into a new DiskRowSet and persists the new rowset set
    /// with `last_flushed_index` = the last applied index. Writes continue meanwhile (into a
    /// fresh MemRowSet). Returns the new rowset's id, if any rows were written.
    pub fn flush(&self) -> Result<Option<u64>> {
        let _maintenance = self.shared.maintenance.lock();
        self.shared.flush_frozen_locked()?;
        {
            let requests = self.requests();
            freeze(&mut self.shared.state.write(), &requests);
        }
        self.shared.flush_frozen_locked()
    }

    /// Merges every DiskRowSet into one, keeping per key every version newer than
    /// `ancient_history_mark` and the newest one at or before it (dropped if it is a
    /// tombstone), and versions with the same timestamp as a newer one never. Writes and scans
    /// continue meanwhile; replaced files go when no scan or snapshot holds them. The mark
    /// used (never below the previous one) becomes `history_gc_mark`.
    pub fn compact(&self, ancient_history_mark: u64) -> Result<bool> {
        let _compaction = self.shared.compaction.lock();
        self.shared
            .compact_locked(ancient_history_mark, |disk| Some(0..disk.len()))
    }

    /// Merges the rowsets `run` (indexes in age order, oldest first, as `stats().rowsets`
    /// counts them) as `compact_some` merges the run it picks. `InvalidArgument` for a run
    /// past the rowsets there are; false for an empty one.
    pub fn compact_run(&self, ancient_history_mark: u64, run: Range<usize>) -> Result<bool> {
        let _compaction = self.shared.compaction.lock();
        let count = self.shared.state.read().disk.len();
        if run.end > count || run.start > run.end {
            return Err(StorageError::InvalidArgument(format!(
                "rowsets {}..{} to compact: the tablet has {count}",
                run.start, run.end
            )));
        }
        if run.is_empty() {
            return Ok(false);
        }
        self.shared
            .compact_locked(ancient_history_mark, |_| Some(run))
    }

    /// A compaction of the run of rowsets `compaction::pick` chooses (the background
    /// policy: nothing below `min_rowsets` rowsets, every rowset when the newer ones add up
    /// to the oldest, else the run that costs least per rowset it removes), collecting
    /// history at `ancient_history_mark` among the rowsets it merges. A run that leaves the
    /// oldest rowset out keeps its tombstones. False if the policy picked nothing.
    pub fn compact_some(&self, ancient_history_mark: u64, min_rowsets: usize) -> Result<bool> {
        let _compaction = self.shared.compaction.lock();
        self.shared.compact_locked(ancient_history_mark, |disk| {
            let sizes: Vec<u64> = disk.iter().map(|r| r.bytes()).collect();
            compaction::pick(&sizes, min_rowsets)
        })
    }

    /// Reads rows in key order from a consistent view of the tablet.
    pub fn scan(&self, spec: &ScanSpec) -> Result<ScanResult> {
        self.open_scan(spec.clone())?.collect()
    }

    /// Opens a cursor over a consistent view of the tablet: under the state lock the active
    /// MemRowSet's rows within the bounds are located (one pass over its index, no values
    /// copied), the frozen MemRowSet and the DiskRowSets are pinned; values are gathered and
    /// decoded as the cursor is advanced.
    pub fn open_scan(&self, spec: ScanSpec) -> Result<ScanCursor> {
        let st = self.shared.state.read();
        if let Some(ts) = spec.snapshot_ts {
            check_snapshot(ts, st.history_gc_mark)?;
        }
        let plan = ScanPlan::new(st.schema.clone(), spec)?;
        let mut sources = Vec::with_capacity(st.disk.len() + 2);
        if let Some((min, max)) = st.active.key_range() {
            let rows = st.active.rows_in(
                &plan.work,
                plan.spec.lower_bound.as_deref(),
                plan.spec.upper_bound.as_deref(),
                plan.spec.snapshot_ts,
            );
            sources.push(Source::Mem(rows, min, max));
        }
        if let Some(frozen) = &st.frozen {
            if let Some((min, max)) = frozen.mem.key_range() {
                sources.push(Source::Frozen(frozen.mem.clone(), min, max));
            }
        }
        sources.extend(st.disk.iter().rev().map(|r| Source::Disk(r.clone())));
        let snapshot_index = st.last_applied_index;
        drop(st);
        Ok(ScanCursor::new(plan, sources, snapshot_index))
    }

    /// Changes the schema as op `op_index`. Everything in memory is flushed under the old
    /// schema first (writes wait for that flush: schema changes are rare), then the new schema
    /// and `last_flushed_index = op_index` are persisted together.
    pub fn alter_schema(&self, next: Schema, op_index: OpIndex) -> Result<()> {
        let _compaction = self.shared.compaction.lock(); // no compaction's output is older
        let _maintenance = self.shared.maintenance.lock();
        self.shared.flush_frozen_locked()?;
        let requests = self.requests();
        let mut st = self.shared.state.write();
        st.schema.check_successor(&next)?;
        if op_index <= st.last_applied_index {
            return Err(StorageError::IllegalState(format!(
                "op index {op_index} is not after the last applied {}",
                st.last_applied_index
            )));
        }
        freeze(&mut st, &requests);
        if let Some(frozen) = st.frozen.take() {
            let id = st.next_rowset_id;
            st.next_rowset_id += 1;
            let written =
                self.shared
                    .write_mem_rowset(&frozen.mem, &st.schema, st.disk.is_empty(), id);
            match written {
                Ok(Some(rowset)) => st.disk.push(rowset),
                Ok(None) => {}
                Err(e) => {
                    st.frozen = Some(frozen);
                    return Err(e);
                }
            }
        }
        let outcomes: Arc<[u8]> = Arc::from(requests.encode());
        let mut manifest = st.manifest();
        manifest.schema = next.clone();
        manifest.last_flushed_index = op_index;
        manifest.request_outcomes = outcomes.clone();
        manifest.write(&self.shared.dir)?;
        st.schema = Arc::new(next);
        st.last_applied_index = op_index;
        st.last_flushed_index = op_index;
        st.flushed_request_outcomes = outcomes;
        Ok(())
    }

    /// Pins the current rowsets and describes them for tablet copy.
    pub fn snapshot(&self) -> Result<Snapshot> {
        // Under the maintenance lock the manifest on disk is exactly the in-memory rowset set.
        let _maintenance = self.shared.maintenance.lock();
        let st = self.shared.state.read();
        let files = st
            .disk
            .iter()
            .flat_map(|r| r.files().map(Path::to_path_buf))
            .collect();
        let manifest_image = manifest::container(&st.manifest().encode());
        let id = self.shared.next_snapshot_id.fetch_add(1, Ordering::Relaxed);
        self.shared.pins.lock().insert(id, st.disk.clone());
        Ok(Snapshot {
            id,
            last_flushed_index: st.last_flushed_index,
            files,
            manifest_image,
        })
    }

    /// Releases a snapshot's pins; files compaction replaced meanwhile are deleted now.
    pub fn release_snapshot(&self, id: u64) -> Result<()> {
        self.shared
            .pins
            .lock()
            .remove(&id)
            .map(drop)
            .ok_or_else(|| StorageError::NotFound(format!("no snapshot {id}")))
    }
}

/// Refuses a snapshot read at `ts` below the history GC mark: the versions it would need may be
/// gone, and a wrong answer must never be given silently.
fn check_snapshot(ts: u64, history_gc_mark: u64) -> Result<()> {
    if ts < history_gc_mark {
        return Err(StorageError::invalid(format!(
            "snapshot timestamp {ts} is below the history GC mark {history_gc_mark}: \
             history before it was garbage-collected"
        )));
    }
    Ok(())
}

/// Asks for a background flush of the frozen MemRowSet, submitting the engine's flush job
/// to the pool unless one is already submitted or running (it then flushes this too). The
/// job holds the engine weakly: one still queued when the engine is dropped does nothing.
fn request_background_flush(shared: &Arc<Shared>) {
    {
        let mut worker = shared.worker.lock();
        worker.flush_requested = true;
        if worker.scheduled || worker.stop {
            return;
        }
        worker.scheduled = true;
    }
    let engine: Weak<Shared> = Arc::downgrade(shared);
    let job = Box::new(move || {
        if let Some(shared) = engine.upgrade() {
            shared.run_flush_job();
        }
    });
    if let Err(err) = flush_pool::flush_pool().submit(job) {
        // The frozen rows stay in memory; the next flush (requested or on demand) writes them.
        shared.worker.lock().scheduled = false;
        *shared.background_error.lock() = Some(format!("could not start a flush worker: {err}"));
    }
}

/// Marks the flush job idle when dropped (see `Shared::run_flush_job`).
struct FlushRunning<'a> {
    shared: &'a Shared,
}

impl Drop for FlushRunning<'_> {
    fn drop(&mut self) {
        let mut worker = self.shared.worker.lock();
        worker.running = false;
        if std::thread::panicking() {
            // The job ends here: the next threshold or request starts another.
            worker.scheduled = false;
            *self.shared.background_error.lock() = Some("a background flush panicked".into());
        }
        drop(worker);
        self.shared.worker_idle.notify_all();
    }
}

/// Moves the active MemRowSet behind an `Arc` for flushing (a no-op while another is frozen).
/// An empty one is frozen too when ops were applied since the last flush, so the flush can
/// advance `last_flushed_index`. `requests` is the engine's request index, locked by the
/// caller: its image now describes exactly the ops frozen.
fn freeze(st: &mut State, requests: &RequestIndex) {
    if st.frozen.is_some() {
        return;
    }
    let flush_index = st.last_applied_index;
    if st.active.is_empty() && flush_index == st.last_flushed_index {
        return;
    }
    let fresh = st.active.empty_like();
    let mem = std::mem::replace(&mut st.active, fresh);
    st.frozen = Some(Frozen {
        mem: Arc::new(mem),
        flush_index,
        request_outcomes: Arc::from(requests.encode()),
    });
}

impl Shared {
    fn fault(&self, point: FaultPoint) -> Result<()> {
        match &self.options.fault_injector {
            Some(inject) => inject(point).map_err(|e| StorageError::io(&self.dir, e)),
            None => Ok(()),
        }
    }

    /// The flush job: flushes until no flush is requested or the engine is dropped.
    fn run_flush_job(&self) {
        loop {
            {
                let mut worker = self.worker.lock();
                if worker.stop || !worker.flush_requested {
                    worker.scheduled = false;
                    return;
                }
                worker.flush_requested = false;
                worker.running = true;
            }
            // Clears `running` even if the flush panics, so a drop does not wait forever.
            let _idle = FlushRunning { shared: self };
            let _maintenance = self.maintenance.lock();
            let outcome = self.flush_frozen_locked();
            *self.background_error.lock() = outcome.err().map(|e| e.to_string());
        }
    }

    /// Writes the frozen MemRowSet (if any) and installs it. Caller holds `maintenance`.
    fn flush_frozen_locked(&self) -> Result<Option<u64>> {
        let started = std::time::Instant::now();
        let (mem, flush_index, outcomes, schema, no_older, id) = {
            let mut st = self.state.write();
            let Some(frozen) = &st.frozen else {
                return Ok(None);
            };
            let taken = (
                frozen.mem.clone(),
                frozen.flush_index,
                frozen.request_outcomes.clone(),
                st.schema.clone(),
                st.disk.is_empty(),
                st.next_rowset_id,
            );
            st.next_rowset_id += 1;
            taken
        };
        let rowset = self.write_mem_rowset(&mem, &schema, no_older, id)?;
        let manifest = {
            let st = self.state.read();
            let mut manifest = st.manifest();
            manifest.rowsets.extend(rowset.iter().map(|r| entry_of(r)));
            manifest.last_flushed_index = flush_index;
            manifest.request_outcomes = outcomes.clone();
            manifest
        };
        manifest.write(&self.dir)?;
        let mut st = self.state.write();
        let new_id = rowset.as_ref().map(|r| r.id());
        st.disk.extend(rowset);
        st.frozen = None;
        st.last_flushed_index = flush_index;
        st.flushed_request_outcomes = outcomes;
        if new_id.is_some() {
            // Under the state lock: `stats` sees the rowset and its count together.
            let c = &self.counters;
            MaintenanceCounters::record(&c.flushes, &c.flush_duration_us, started);
        }
        drop(st);
        self.fault(FaultPoint::AfterManifestWrite)?;
        Ok(new_id)
    }

    /// Writes `mem` as rowset `id` and opens it. With `drop_tombstones` (no older rowset
    /// exists) deletions are not written at all.
    fn write_mem_rowset(
        &self,
        mem: &MemRowSet,
        schema: &Schema,
        drop_tombstones: bool,
        id: u64,
    ) -> Result<Option<RowSetRef>> {
        if mem.is_empty() {
            return Ok(None);
        }
        self.fault(FaultPoint::BeforeRowSetWrite)?;
        let columns: Vec<usize> = (0..schema.columns().len()).collect();
        let rows = mem.all_versions(&columns, drop_tombstones);
        self.write_rowset(id, schema, mem.len(), rows.into_chunks(READ_BATCH_ROWS))
    }

    /// Writes row versions (storage columns, `__ts`, `__deleted`; key ascending, timestamp
    /// descending) as rowset `id` and opens it; `expected_keys` sizes the bloom filter.
    fn write_rowset(
        &self,
        id: u64,
        schema: &Schema,
        expected_keys: usize,
        batches: impl Iterator<Item = Result<RecordBatch>>,
    ) -> Result<Option<RowSetRef>> {
        let outcome = (|| {
            let mut writer = RowSetWriter::create(&self.dir, id, schema, expected_keys)?;
            for batch in batches {
                writer.write(&batch?)?;
            }
            writer.finish()
        })();
        match outcome {
            Ok(None) => Ok(None),
            Ok(Some(_)) => {
                self.fault(FaultPoint::AfterRowSetWrite)?;
                let rowset = DiskRowSet::open(&self.dir, id, schema.key_count())?;
                Ok(Some(Arc::new(rowset)))
            }
            Err(e) => {
                // Best effort; a leftover is an orphan that the next open removes.
                let _ = std::fs::remove_file(diskrowset::data_path(&self.dir, id));
                let _ = std::fs::remove_file(diskrowset::bloom_path(&self.dir, id));
                Err(e)
            }
        }
    }

    /// Merges the run of DiskRowSets `pick` chooses (given them oldest first) into one,
    /// collecting history at `ancient_history_mark` (raised to the current
    /// `history_gc_mark` if below). Caller holds `compaction`; flushes go on while the output
    /// is written, and their rowsets stay after it (they are newer).
    fn compact_locked(
        &self,
        ancient_history_mark: u64,
        pick: impl FnOnce(&[RowSetRef]) -> Option<Range<usize>>,
    ) -> Result<bool> {
        let started = std::time::Instant::now();
        let (schema, run, inputs, id, mark) = {
            let mut st = self.state.write();
            let Some(run) = pick(&st.disk) else {
                return Ok(false);
            };
            assert!(run.end <= st.disk.len(), "a run of the rowsets there are");
            let mark = ancient_history_mark.max(st.history_gc_mark);
            let inputs = &st.disk[run.clone()];
            let collects = mark > st.history_gc_mark && inputs.iter().any(|r| r.multi_version());
            let drops_tombstones = run.start == 0 && inputs.iter().any(|r| r.tombstones() > 0);
            let worth = inputs.len() > 1 || drops_tombstones || collects;
            if !worth {
                return Ok(false);
            }
            let inputs = inputs.to_vec();
            let id = st.next_rowset_id;
            st.next_rowset_id += 1;
            (st.schema.clone(), run, inputs, id, mark)
        };
        self.fault(FaultPoint::BeforeRowSetWrite)?;
        let columns: Vec<usize> = (0..schema.columns().len()).collect();
        // Streamed: each rowset read a row group at a time as the merge reaches it, and the
        // output written a chunk at a time, so a compaction's memory does not grow with the
        // versions it merges (all of them were loaded at once before: with history of a hot
        // key set, gigabytes; docs/performance.md, "Compaction and merged scans in bounded
        // memory").
        let streams = inputs
            .iter()
            .rev()
            .map(|rowset| rowset.stream_versions(&schema, &columns))
            .collect::<Result<Vec<_>>>()?;
        let merged = VersionsMerge::new(
            diskrowset::versions_schema(&schema, &columns),
            streams,
            (0..schema.key_count()).collect(),
            mark,
            READ_BATCH_ROWS,
        );
        // Older rowsets left out may hold versions a tombstone hides.
        let merged = if run.start > 0 {
            merged.keeping_tombstones()
        } else {
            merged
        };
        let expected: usize = inputs.iter().map(|r| r.rows() as usize).sum();
        let output = self.write_rowset(id, &schema, expected, merged)?;
        let _maintenance = self.maintenance.lock();
        let (manifest, disk) = {
            let st = self.state.read();
            // Only flushes (appending newer rowsets) changed the set meanwhile: compactions
            // and schema changes wait for `compaction`.
            let kept = st.disk.len() >= run.end
                && st.disk[run.clone()]
                    .iter()
                    .zip(&inputs)
                    .all(|(a, b)| a.id() == b.id());
            if !kept {
                return Err(StorageError::IllegalState(
                    "the rowsets a compaction merged changed under it".to_string(),
                ));
            }
            let disk: Vec<RowSetRef> = st.disk[..run.start]
                .iter()
                .chain(&output)
                .chain(&st.disk[run.end..])
                .cloned()
                .collect();
            let mut manifest = st.manifest();
            manifest.rowsets = disk.iter().map(|r| entry_of(r)).collect();
            manifest.history_gc_mark = mark;
            (manifest, disk)
        };
        manifest.write(&self.dir)?;
        {
            let mut st = self.state.write();
            st.disk = disk;
            st.history_gc_mark = mark;
            let c = &self.counters;
            MaintenanceCounters::record(&c.compactions, &c.compaction_duration_us, started);
            let written = output.as_ref().map_or(0, |r| r.bytes());
            c.compaction_bytes_written
                .fetch_add(written, Ordering::Relaxed);
        }
        for rowset in &inputs {
            rowset.mark_obsolete();
        }
        self.fault(FaultPoint::AfterManifestWrite)?;
        Ok(true)
    }
}

/// Deletes rowset files and temp files that the manifest does not name.
fn remove_orphans(dir: &Path, manifest: &Manifest) -> Result<()> {
    let live: std::collections::HashSet<u64> = manifest.rowsets.iter().map(|r| r.id).collect();
    let entries = std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let orphan = match diskrowset::parse_file_name(name) {
            Some(id) => !live.contains(&id),
            None => name.ends_with(".tmp"),
        };
        if orphan {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
        }
    }
    Ok(())
}
