//! The background thread: prepares the next segment before it is needed and closes
//! finished segments (footer, cut to length, sync), off the appender's critical path.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;

use crate::error::{Result, WalError};
use crate::segment::{self, SegmentFile};
use crate::shared::Shared;

/// Work for the background thread, done in the order sent.
pub(crate) enum Job {
    /// Prepare segment `sequence` and leave it in the prepared slot.
    Prepare(u64),
    /// Write the footer of a segment the appender left, whose data ends at `write_end`.
    Close {
        segment: Arc<SegmentFile>,
        write_end: u64,
    },
    Stop,
}

pub(crate) fn spawn(shared: Arc<Shared>, jobs: Receiver<Job>) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("wal-background".into())
        .spawn(move || run(&shared, &jobs))
        .map_err(|e| WalError::io("spawn background thread", "", e))
}

fn run(shared: &Shared, jobs: &Receiver<Job>) {
    let mut next = None;
    loop {
        let Some(job) = next.take().or_else(|| jobs.recv().ok()) else {
            break;
        };
        match job {
            Job::Prepare(first) => {
                // Every Prepare already queued behind this one is done with it, sharing the
                // syncs (see `prepare_segments`); the first job of another kind waits its turn.
                let mut sequences = vec![first];
                while let Ok(job) = jobs.try_recv() {
                    match job {
                        Job::Prepare(sequence) => sequences.push(sequence),
                        other => {
                            next = Some(other);
                            break;
                        }
                    }
                }
                let specs: Vec<_> = sequences
                    .iter()
                    .map(|&sequence| shared.prepare_spec(sequence, shared.take_recyclable()))
                    .collect();
                let results = segment::prepare_segments(&specs);
                shared.prepared.lock().extend(results);
                shared.prepared_ready.notify_all();
            }
            Job::Close { segment, write_end } => {
                // No sync: the data was synced by the appender, and a footer or cut that a
                // crash loses is rebuilt by recovery (a footerless segment is scanned).
                if let Err(err) = segment::close_segment(&segment, write_end, false) {
                    shared.fail(&err);
                }
            }
            Job::Stop => break,
        }
    }
}
