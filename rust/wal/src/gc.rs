//! Garbage collection of whole closed segments below the log anchors.

use std::fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nyala_common::OpIndex;

use crate::error::{Result, WalError};
use crate::metrics::Metrics;
use crate::segment::{self, Preallocation, SegmentFile};
use crate::shared::Shared;

/// What a `gc` call removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub segments_deleted: usize,
    pub segments_recycled: usize,
    /// The first entry index still in the log after GC.
    pub first_index: OpIndex,
}

/// Removes the oldest closed segments whose entries all lie below `min(anchor, durable
/// index)` (so the segment holding the last entry always stays), keeping
/// `min_segments_to_retain` closed segments.
pub(crate) fn collect(shared: &Shared, min_anchor: Option<OpIndex>) -> Result<GcReport> {
    let _serial = shared.gc_lock.lock();
    let durable = shared.durable_index.load(Ordering::Acquire);
    let floor = min_anchor.map_or(durable, |anchor| anchor.min(durable));
    let victims = take_victims(shared, floor);
    let mut report = GcReport::default();
    if let Some(last) = victims.last() {
        shared.index.write().trim_segments_through(last.sequence);
    }
    report.first_index = shared.index.read().first();
    shared.lock_queue().terms.trim_before(report.first_index);
    if victims.is_empty() {
        return Ok(report);
    }
    for victim in victims {
        if recycle(shared, victim)? {
            report.segments_recycled += 1;
        } else {
            report.segments_deleted += 1;
        }
    }
    segment::sync_dir(&shared.dir)?;
    Ok(report)
}

fn take_victims(shared: &Shared, floor: OpIndex) -> Vec<Arc<SegmentFile>> {
    let mut table = shared.segments.write();
    let closed = table
        .iter()
        .take_while(|s| s.closed.load(Ordering::Acquire))
        .count();
    let removable = closed.saturating_sub(shared.options.min_segments_to_retain);
    let below_floor = table
        .iter()
        .take(removable)
        .take_while(|s| {
            s.entry_count.load(Ordering::Relaxed) == 0
                || s.max_index.load(Ordering::Relaxed) < floor
        })
        .count();
    table.drain(..below_floor).collect()
}

/// Deletes a GC'd segment, or keeps its file for reuse; returns whether it was kept.
fn recycle(shared: &Shared, victim: Arc<SegmentFile>) -> Result<bool> {
    let path = victim.path.clone();
    // A reader still holding the segment may read it; such a file must not be overwritten.
    let unshared = Arc::strong_count(&victim) == 1;
    drop(victim);
    let keep = shared.options.preallocation == Preallocation::Recycle && unshared && {
        let pool = shared.recycle_pool.lock();
        pool.len() < shared.options.recycle_pool_segments_max
    };
    if keep {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let sequence = segment::parse_segment_name(name).unwrap_or_default();
        let target = shared
            .dir
            .join(format!("{}{sequence:09}", segment::RECYCLE_PREFIX));
        fs::rename(&path, &target).map_err(|e| WalError::io("rename", &path, e))?;
        shared.recycle_pool.lock().push(target);
        return Ok(true);
    }
    fs::remove_file(&path).map_err(|e| WalError::io("remove", &path, e))?;
    Metrics::add(&shared.metrics.segments_deleted, 1);
    Ok(false)
}
