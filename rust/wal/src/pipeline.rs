//! The pipeline: written groups, in write order, whose durability is not published yet.
//!
//! The committer holding the write turn registers each group it wrote; each committer marks
//! its own group synced when its `fdatasync` returns, and whoever does so publishes the
//! durable point of every leading synced group. Durability is thus published strictly in
//! group order: a group's ticket and index become durable only once its own sync and every
//! earlier group's sync have returned. Once stopped (a write or sync failed) nothing more is
//! published. The pipeline also keeps the sync timings committers stagger their groups by.
//!
//! This module owns that bookkeeping and the raising of `durable_ticket` and
//! `durable_index`; it does not wake waiters (`Shared::publish_durable_change`, called by
//! whoever moved the point), sync, write, or start threads.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nyala_common::OpIndex;

use crate::active_segment::SyncTarget;
use crate::metrics::Metrics;
use crate::shared::{DataPosition, Shared, Ticket};

/// A written group whose durability is not published yet.
struct PendingGroup {
    id: u64,
    last_ticket: Ticket,
    /// The log's last index once this group is durable (lowered by later truncations).
    log_last: OpIndex,
    entries: u64,
    batches: u64,
    /// Where the log's data ends once this group is written.
    end: DataPosition,
    synced: bool,
}

/// Written groups in write order whose durability is not published yet.
#[derive(Default)]
pub(crate) struct Pipeline {
    groups: VecDeque<PendingGroup>,
    next_id: u64,
    /// When the latest group's sync started (about: when it was registered).
    last_sync_started: Option<Instant>,
    /// Moving average of recent sync times (0 until the first sync returned).
    sync_estimate_micros: u64,
    /// Syncs returned so far (a committer holding a group back watches it).
    syncs_returned: u64,
    /// A write or sync failed: nothing is published any more.
    stopped: bool,
}

impl Pipeline {
    /// Publishes the durable point of every leading group whose sync has returned; returns
    /// whether it moved. Runs under the pipeline lock, so groups publish one after another.
    pub(crate) fn publish_ready(&mut self, shared: &Shared) -> bool {
        let mut moved = false;
        while !self.stopped && self.groups.front().is_some_and(|g| g.synced) {
            let group = self.groups.pop_front().expect("a leading group");
            // Counters first, so whoever sees the entries durable also sees them counted.
            let metrics = &shared.metrics;
            metrics.record_group(group.entries);
            Metrics::add(&metrics.entries_appended, group.entries);
            Metrics::add(&metrics.batches_appended, group.batches);
            *shared.durable_end.lock() = group.end;
            shared
                .durable_index
                .store(group.log_last, Ordering::Release);
            shared
                .durable_ticket
                .store(group.last_ticket, Ordering::Release);
            moved = true;
        }
        moved
    }

    /// A truncation to `kept` was framed: no group before it may publish a later index.
    pub(crate) fn cap_log_last(&mut self, kept: OpIndex) {
        for group in &mut self.groups {
            group.log_last = group.log_last.min(kept);
        }
    }

    /// Registers a group just written (in write order, under the write turn) and returns
    /// its id. `synced`: it has nothing to sync, so it is durable once every earlier group is.
    pub(crate) fn register(
        &mut self,
        last_ticket: Ticket,
        log_last: OpIndex,
        entries: u64,
        batches: u64,
        end: DataPosition,
        synced: bool,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.groups.push_back(PendingGroup {
            id,
            last_ticket,
            log_last,
            entries,
            batches,
            end,
            synced,
        });
        id
    }

    /// The sync of the group just registered starts now.
    pub(crate) fn note_sync_started(&mut self) {
        self.last_sync_started = Some(Instant::now());
    }

    /// A write or sync failed: nothing is published any more.
    pub(crate) fn stop(&mut self) {
        self.stopped = true;
    }

    /// A sync failed: it returned (with an error), and nothing is published any more.
    pub(crate) fn sync_failed(&mut self) {
        self.stopped = true;
        self.syncs_returned += 1;
    }

    /// The sync of group `id` returned after `micros`: counts it, folds its time into the
    /// estimate and marks the group synced (it publishes with `publish_ready`).
    pub(crate) fn sync_returned(&mut self, id: u64, micros: u64) {
        self.syncs_returned += 1;
        self.sync_estimate_micros = match self.sync_estimate_micros {
            0 => micros,
            estimate => (estimate * 7 + micros) / 8,
        };
        let front = self.groups.front().map_or(id, |g| g.id);
        if let Some(pending) = self.groups.get_mut((id - front) as usize) {
            debug_assert_eq!(pending.id, id);
            pending.synced = true;
        }
    }

    /// Syncs returned so far (a committer holding a group back watches it).
    pub(crate) fn syncs_returned(&self) -> u64 {
        self.syncs_returned
    }

    /// Until when a committer holds its next group back (see `Committers::stagger`):
    /// 1/`syncs_in_flight_max` of a sync time after the latest sync started. `None` before
    /// any sync started.
    pub(crate) fn hold_back_until(&self, syncs_in_flight_max: usize) -> Option<Instant> {
        let started = self.last_sync_started?;
        let spacing_micros = self.sync_estimate_micros / syncs_in_flight_max as u64;
        Some(started + Duration::from_micros(spacing_micros))
    }
}

/// A written group its committer still has to sync.
pub(crate) struct GroupToSync {
    pub(crate) id: u64,
    /// Every segment the group wrote to.
    pub(crate) targets: Vec<SyncTarget>,
}
