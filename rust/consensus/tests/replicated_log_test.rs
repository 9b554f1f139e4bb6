//! `ReplicatedLog` over a real WAL in a temporary directory: one test per rule of the
//! follower and leader paths, plus restarts and a randomized comparison with a model.

use nyala_common::{Classify, ErrorKind, OpId};
use nyala_consensus::{
    ConsensusError, EntryBatch, ReplicatedLog, ReplicatedLogOptions, BATCH_HEADER_BYTES,
};
use nyala_wal::{EntryType, LogOptions, SyncPolicy};
use proptest::prelude::*;
use tempfile::TempDir;

const BIG_BYTES: usize = 1 << 30;

struct Fixture {
    dir: TempDir,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn open(&self, name: &str, cache_bytes_max: usize) -> ReplicatedLog {
        let options = LogOptions {
            sync_policy: SyncPolicy::None,
            segment_size_bytes: 64 << 10,
            ..LogOptions::default()
        };
        ReplicatedLog::open(
            self.dir.path().join(name),
            "t1",
            options,
            ReplicatedLogOptions { cache_bytes_max },
        )
        .unwrap()
    }

    /// A log holding entries of `terms` (index i+1 has terms[i]) with 10-byte payloads.
    fn log_with(&self, name: &str, terms: &[u64]) -> ReplicatedLog {
        let log = self.open(name, BIG_BYTES);
        for (i, &term) in terms.iter().enumerate() {
            log.append(term, EntryType::Write, &[i as u8; 10]).unwrap();
        }
        log
    }
}

fn everything(log: &ReplicatedLog, after: u64) -> EntryBatch {
    log.read_batch(after, BIG_BYTES).unwrap().unwrap()
}

fn terms_of(log: &ReplicatedLog) -> Vec<u64> {
    (1..=log.last_op_id().index)
        .map(|i| log.term_at(i).unwrap())
        .collect()
}

#[test]
fn leader_append_assigns_indexes_and_refuses_a_lower_term() {
    let fx = Fixture::new();
    let log = fx.open("a", BIG_BYTES);
    assert_eq!(log.last_op_id(), OpId::MIN);
    assert_eq!(
        log.append(1, EntryType::NoOp, b"").unwrap(),
        OpId::new(1, 1)
    );
    assert_eq!(
        log.append(3, EntryType::Write, b"x").unwrap(),
        OpId::new(3, 2)
    );
    let err = log.append(2, EntryType::Write, b"y").unwrap_err();
    assert!(matches!(
        err,
        ConsensusError::TermRegression {
            term: 2,
            last_term: 3
        }
    ));
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(log.last_op_id(), OpId::new(3, 2));
    assert_eq!(log.term_at(0), Some(0));
    assert_eq!(log.term_at(3), None);
}

#[test]
fn read_batch_limits_bytes_but_returns_one_entry() {
    let fx = Fixture::new();
    let log = fx.log_with("a", &[1; 10]); // 34 encoded bytes per entry
    let one = log.read_batch(0, 1).unwrap().unwrap();
    assert_eq!(
        (one.first_op_id(), one.last_op_id()),
        (OpId::new(1, 1), OpId::new(1, 1))
    );
    let three = log
        .read_batch(2, BATCH_HEADER_BYTES + 3 * 34)
        .unwrap()
        .unwrap();
    assert_eq!(
        (three.first_op_id(), three.last_op_id()),
        (OpId::new(1, 3), OpId::new(1, 5))
    );
    assert!(three.size_bytes() <= BATCH_HEADER_BYTES + 3 * 34);
    assert!(log.read_batch(10, BIG_BYTES).unwrap().is_none());
    let err = log.read_batch(11, BIG_BYTES).unwrap_err();
    assert!(matches!(
        err,
        ConsensusError::ReadBeyondEnd {
            after_index: 11,
            last_index: 10
        }
    ));
}

#[test]
fn a_read_of_exactly_the_batch_appended_last_shares_it() {
    let fx = Fixture::new();
    let log = fx.log_with("a", &[1, 1, 1]); // one batch per entry
    let whole = log.read_whole_batch(2, u64::MAX).unwrap();
    let shared = log.read_batch(2, BIG_BYTES).unwrap().unwrap();
    assert_eq!(shared.as_bytes().as_ptr(), whole.as_bytes().as_ptr());
    // Two batches, or one too large for `bytes_max`, are built: a copy.
    let built = log.read_batch(1, BIG_BYTES).unwrap().unwrap();
    assert_eq!(
        (built.first_op_id(), built.last_op_id()),
        (OpId::new(1, 2), OpId::new(1, 3))
    );
    let second = log.read_whole_batch(1, u64::MAX).unwrap();
    assert_ne!(built.as_bytes().as_ptr(), second.as_bytes().as_ptr());
    // One batch whose next entry would not fit: what a build gives too, so it is shared.
    let one = log.read_whole_batch(1, u64::MAX).unwrap();
    let alone = log.read_batch(1, one.size_bytes()).unwrap().unwrap();
    assert_eq!(alone.as_bytes().as_ptr(), one.as_bytes().as_ptr());
    let capped = log.read_batch(2, whole.size_bytes() - 1).unwrap().unwrap();
    assert_eq!(capped.last_op_id(), OpId::new(1, 3)); // at least one entry, as before
    assert_ne!(capped.as_bytes().as_ptr(), whole.as_bytes().as_ptr());
    // An applier's committed range that ends where a batch ends shares that batch too.
    let committed = log.read_range(1, 2, BIG_BYTES).unwrap().unwrap();
    assert_eq!(committed.as_bytes().as_ptr(), second.as_bytes().as_ptr());
}

#[test]
fn append_many_is_one_batch_that_a_caught_up_read_shares() {
    let fx = Fixture::new();
    let log = fx.log_with("a", &[1]);
    let last = log
        .append_many(
            2,
            EntryType::Write,
            &[&b"x"[..], b"", &[7u8; 300]],
            BIG_BYTES,
        )
        .unwrap();
    assert_eq!(last, OpId::new(2, 4));
    let whole = log.read_whole_batch(1, u64::MAX).unwrap();
    assert_eq!((whole.first_op_id(), whole.len()), (OpId::new(2, 2), 3));
    let read = log.read_batch(1, BIG_BYTES).unwrap().unwrap();
    assert_eq!(read.as_bytes().as_ptr(), whole.as_bytes().as_ptr());
    assert_eq!(read.entry(2).payload, &[7u8; 300][..]);
    // Cut as a read with the same limit cuts: each batch is then sent as appended.
    let limit = BATCH_HEADER_BYTES + 3 * (24 + 100);
    let payloads = vec![[5u8; 100]; 10];
    assert_eq!(
        log.append_many(2, EntryType::Write, &payloads, limit)
            .unwrap(),
        OpId::new(2, 14)
    );
    for (after, last) in [(4, 7), (7, 10), (10, 13), (13, 14)] {
        let whole = log.read_whole_batch(after, u64::MAX).unwrap();
        assert_eq!(whole.last_op_id().index, last);
        let read = log.read_batch(after, limit).unwrap().unwrap();
        assert_eq!(read.as_bytes().as_ptr(), whole.as_bytes().as_ptr());
    }
    let merged = log.read_batch(4, BIG_BYTES).unwrap().unwrap();
    assert_eq!(merged.last_op_id(), OpId::new(2, 14));
    let err = log
        .append_many(1, EntryType::Write, &[b"y"], BIG_BYTES)
        .unwrap_err();
    assert!(matches!(err, ConsensusError::TermRegression { .. }));
    assert_eq!(log.last_op_id(), OpId::new(2, 14));
}

#[test]
fn reads_come_from_the_wal_once_the_cache_evicted_or_after_reopen() {
    let fx = Fixture::new();
    let log = fx.open("a", 200);
    for i in 0..20u8 {
        log.append(1 + u64::from(i / 10), EntryType::Write, &[i; 10])
            .unwrap();
        log.wait_durable(None).unwrap();
    }
    assert!(
        log.cache_stats().first_index > 10,
        "{:?}",
        log.cache_stats()
    );
    let batch = everything(&log, 3); // WAL then cache
    assert_eq!(
        (batch.first_op_id(), batch.last_op_id()),
        (OpId::new(1, 4), OpId::new(2, 20))
    );
    assert_eq!(batch.entry(0).payload, [3u8; 10]);
    assert_eq!(batch.entry(16).payload, [19u8; 10]);
    drop(log);
    let reopened = fx.open("a", 200);
    assert_eq!(reopened.cache_stats().entries, 0);
    let again = everything(&reopened, 3);
    assert_eq!(again.as_bytes(), batch.as_bytes());
}

#[test]
fn read_range_stops_at_its_last_index_in_the_cache_and_in_the_wal() {
    let fx = Fixture::new();
    let log = fx.open("a", 200);
    for i in 0..20u8 {
        log.append(1, EntryType::Write, &[i; 10]).unwrap();
        log.wait_durable(None).unwrap();
    }
    let first_cached = log.cache_stats().first_index;
    assert!(first_cached > 6, "{:?}", log.cache_stats());
    let from_wal = log.read_range(2, 5, BIG_BYTES).unwrap().unwrap();
    assert_eq!(from_wal.last_op_id(), OpId::new(1, 5));
    let across = log
        .read_range(3, first_cached + 1, BIG_BYTES)
        .unwrap()
        .unwrap();
    assert_eq!(
        (across.first_op_id().index, across.last_op_id().index),
        (4, first_cached + 1)
    );
    let cached = log.read_range(17, 18, BIG_BYTES).unwrap().unwrap();
    assert_eq!((cached.len(), cached.last_op_id().index), (1, 18));
    assert!(log.read_range(18, 18, BIG_BYTES).unwrap().is_none());
    assert_eq!(log.read_batch(17, BIG_BYTES).unwrap().unwrap().len(), 3);
}

#[test]
fn follower_appends_into_an_empty_log() {
    let fx = Fixture::new();
    let leader = fx.log_with("leader", &[1, 1, 2]);
    let follower = fx.open("follower", BIG_BYTES);
    let outcome = follower
        .append_replicated(OpId::MIN, Some(&everything(&leader, 0)), 0)
        .unwrap();
    assert!(outcome.matched);
    assert_eq!(outcome.last_received, OpId::new(2, 3));
    assert_eq!(outcome.truncated_from, None);
    assert_eq!(terms_of(&follower), vec![1, 1, 2]);
    follower.wait_durable(None).unwrap();
    assert_eq!(follower.durable_index(), 3);
}

#[test]
fn heartbeat_matches_without_entries() {
    let fx = Fixture::new();
    let follower = fx.log_with("f", &[1, 1]);
    let outcome = follower
        .append_replicated(OpId::new(1, 2), None, 0)
        .unwrap();
    assert!(outcome.matched);
    assert_eq!(outcome.last_received, OpId::new(1, 2));
}

#[test]
fn mismatch_beyond_the_end_hints_the_end() {
    let fx = Fixture::new();
    let follower = fx.log_with("f", &[1, 1]);
    let outcome = follower
        .append_replicated(OpId::new(1, 7), None, 0)
        .unwrap();
    assert!(!outcome.matched);
    assert_eq!(outcome.hint_index, 3);
    assert_eq!(follower.last_op_id(), OpId::new(1, 2));
}

#[test]
fn mismatch_hint_skips_the_conflicting_term_down_to_the_commit_index() {
    let fx = Fixture::new();
    let follower = fx.log_with("f", &[1, 2, 2, 2, 2]);
    let outcome = follower
        .append_replicated(OpId::new(3, 5), None, 1)
        .unwrap();
    assert_eq!((outcome.matched, outcome.hint_index), (false, 2));
    let all_two = fx.log_with("g", &[2, 2, 2, 2]);
    assert_eq!(
        all_two
            .append_replicated(OpId::new(3, 4), None, 0)
            .unwrap()
            .hint_index,
        1
    );
    assert_eq!(
        all_two
            .append_replicated(OpId::new(3, 4), None, 2)
            .unwrap()
            .hint_index,
        3
    );
}

#[test]
fn duplicate_and_stale_batches_change_nothing() {
    let fx = Fixture::new();
    let leader = fx.log_with("leader", &[1, 1, 1, 1]);
    let follower = fx.open("follower", BIG_BYTES);
    let batch = everything(&leader, 0);
    follower
        .append_replicated(OpId::MIN, Some(&batch), 0)
        .unwrap();
    follower.wait_durable(None).unwrap();
    let appended = follower.wal().metrics().entries_appended;
    let again = follower
        .append_replicated(OpId::MIN, Some(&batch), 0)
        .unwrap();
    assert!(again.matched);
    assert_eq!(again.truncated_from, None);
    assert_eq!(again.durable_index, 4);
    let short = leader.read_batch(0, 1).unwrap().unwrap();
    let stale = follower
        .append_replicated(OpId::MIN, Some(&short), 0)
        .unwrap();
    assert_eq!(stale.last_received, OpId::new(1, 1));
    assert_eq!(follower.last_op_id(), OpId::new(1, 4));
    assert_eq!(follower.wal().metrics().entries_appended, appended);
}

#[test]
fn partly_known_batch_appends_only_the_new_tail() {
    let fx = Fixture::new();
    let leader = fx.log_with("leader", &[1, 1, 1, 2, 2]);
    let follower = fx.log_with("follower", &[1, 1, 1]);
    follower.wait_durable(None).unwrap();
    let outcome = follower
        .append_replicated(OpId::new(1, 1), Some(&everything(&leader, 1)), 0)
        .unwrap();
    assert_eq!((outcome.matched, outcome.truncated_from), (true, None));
    follower.wait_durable(None).unwrap();
    assert_eq!(follower.wal().metrics().entries_appended, 3 + 2);
    assert_eq!(
        everything(&follower, 0).as_bytes(),
        everything(&leader, 0).as_bytes()
    );
}

#[test]
fn conflicting_suffix_is_truncated_replaced_and_survives_a_restart() {
    let fx = Fixture::new();
    let follower = fx.log_with("f", &[1, 1, 1, 1]);
    follower.wait_durable(None).unwrap();
    let leader = fx.log_with("leader", &[1, 1, 3]);
    let outcome = follower
        .append_replicated(OpId::new(1, 2), Some(&everything(&leader, 2)), 1)
        .unwrap();
    assert!(outcome.matched);
    assert_eq!(outcome.truncated_from, Some(3));
    assert_eq!(outcome.last_received, OpId::new(3, 3));
    // The removed entry 4 is never counted durable; the new entry 3 may already be.
    assert!(outcome.durable_index <= 3, "{outcome:?}");
    assert!(follower.durable_index() <= 3);
    assert_eq!(terms_of(&follower), vec![1, 1, 3]);
    follower.wait_durable(None).unwrap();
    assert_eq!(follower.durable_index(), 3);
    assert_eq!(
        everything(&follower, 0).as_bytes(),
        everything(&leader, 0).as_bytes()
    );
    drop(follower);
    let reopened = fx.open("f", BIG_BYTES);
    assert_eq!(terms_of(&reopened), vec![1, 1, 3]);
    assert_eq!(reopened.durable_index(), 3);
}

#[test]
fn truncating_a_committed_entry_is_refused_and_changes_nothing() {
    let fx = Fixture::new();
    let follower = fx.log_with("f", &[1, 1, 1]);
    let leader = fx.log_with("leader", &[1, 2, 2]);
    let err = follower
        .append_replicated(OpId::new(1, 1), Some(&everything(&leader, 1)), 2)
        .unwrap_err();
    assert!(matches!(
        err,
        ConsensusError::TruncateCommitted {
            index: 2,
            committed_index: 2
        }
    ));
    assert_eq!(err.kind(), ErrorKind::Corruption);
    assert_eq!(terms_of(&follower), vec![1, 1, 1]);
}

#[test]
fn batch_must_follow_the_preceding_entry() {
    let fx = Fixture::new();
    let leader = fx.log_with("leader", &[1, 1, 1]);
    let follower = fx.log_with("f", &[1]);
    let err = follower
        .append_replicated(OpId::new(1, 1), Some(&everything(&leader, 2)), 0)
        .unwrap_err();
    assert!(matches!(err, ConsensusError::BatchDoesNotFollow { .. }));
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn config_entries_are_indexed_truncated_and_rebuilt_on_open() {
    let fx = Fixture::new();
    let follower = fx.open("f", BIG_BYTES);
    follower.append(1, EntryType::NoOp, b"").unwrap();
    follower
        .append(1, EntryType::ConfigChange, b"cfg-2")
        .unwrap();
    follower.append(1, EntryType::Write, b"rows").unwrap();
    follower
        .append(1, EntryType::ConfigChange, b"cfg-4")
        .unwrap();
    let configs = |log: &ReplicatedLog, after| -> Vec<(OpId, Vec<u8>)> {
        log.config_entries_after(after)
            .into_iter()
            .map(|c| (c.op_id, c.payload))
            .collect()
    };
    assert_eq!(
        configs(&follower, 0),
        vec![
            (OpId::new(1, 2), b"cfg-2".to_vec()),
            (OpId::new(1, 4), b"cfg-4".to_vec())
        ]
    );
    assert_eq!(configs(&follower, 2).len(), 1);
    let leader = fx.open("leader", BIG_BYTES);
    leader.append(1, EntryType::NoOp, b"").unwrap();
    leader.append(1, EntryType::ConfigChange, b"cfg-2").unwrap();
    leader.append(2, EntryType::Write, b"new rows").unwrap();
    follower
        .append_replicated(OpId::new(1, 2), Some(&everything(&leader, 2)), 2)
        .unwrap();
    assert_eq!(
        configs(&follower, 0),
        vec![(OpId::new(1, 2), b"cfg-2".to_vec())]
    );
    follower.wait_durable(None).unwrap();
    drop(follower);
    assert_eq!(
        configs(&fx.open("f", BIG_BYTES), 0),
        vec![(OpId::new(1, 2), b"cfg-2".to_vec())]
    );
}

#[test]
fn collected_entries_at_or_below_the_commit_index_match() {
    let fx = Fixture::new();
    let follower = fx.open("f", 0);
    let payload = [5u8; 3000];
    for _ in 0..80 {
        follower.append(1, EntryType::Write, &payload).unwrap();
    }
    follower.wait_durable(None).unwrap();
    follower.wal().register_anchor(60);
    // Finished segments are closed (and become collectable) by the WAL's background thread,
    // a moment after the roll-over: collect until it has caught up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while follower.wal().first_index() <= 5 && std::time::Instant::now() < deadline {
        follower.wal().gc().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let first = follower.wal().first_index();
    assert!(first > 5, "GC removed nothing (first index {first})");
    let leader = fx.open("leader", BIG_BYTES);
    for _ in 0..81 {
        leader.append(1, EntryType::Write, &payload).unwrap();
    }
    let batch = everything(&leader, 2);
    let outcome = follower
        .append_replicated(OpId::new(1, 2), Some(&batch), 60)
        .unwrap();
    assert!(outcome.matched);
    assert_eq!(outcome.truncated_from, None);
    assert_eq!(follower.last_op_id(), OpId::new(1, 81));
    let err = follower
        .append_replicated(OpId::new(1, 2), None, 1)
        .unwrap_err();
    assert!(matches!(
        err,
        ConsensusError::CollectedUncommitted { index: 2, .. }
    ));
    assert!(follower.read_batch(1, BIG_BYTES).is_err()); // gone: a tablet copy is needed
}

#[test]
fn decoded_wire_bytes_append_like_the_original() {
    let fx = Fixture::new();
    let leader = fx.log_with("leader", &[1, 2, 2]);
    let wire = everything(&leader, 0).as_bytes().to_vec();
    let follower = fx.open("f", BIG_BYTES);
    let batch = EntryBatch::decode(wire).unwrap();
    follower
        .append_replicated(OpId::MIN, Some(&batch), 0)
        .unwrap();
    assert_eq!(terms_of(&follower), vec![1, 2, 2]);
}

/// One step a leader can take in the randomized test.
#[derive(Clone, Debug)]
enum Step {
    /// A new leader elected in a higher term overwrites the follower from `keep + 1`.
    NewLeader {
        keep_percent: u8,
    },
    Append {
        entries: u8,
    },
    /// The follower receives everything from the leader after `from_percent` of its log.
    Replicate {
        from_percent: u8,
        bytes_max: u16,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..=100).prop_map(|keep_percent| Step::NewLeader { keep_percent }),
        (1u8..5).prop_map(|entries| Step::Append { entries }),
        ((0u8..=100), (1u16..600)).prop_map(|(from_percent, bytes_max)| Step::Replicate {
            from_percent,
            bytes_max
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A follower fed a leader's batches ends up with exactly the leader's log (log matching),
    /// whatever the batch sizes, duplicates and leader changes, as long as nothing committed
    /// is overwritten; restarting both gives the same logs back.
    #[test]
    fn follower_converges_on_the_leader(steps in proptest::collection::vec(step(), 1..40)) {
        let fx = Fixture::new();
        let leader = fx.open("leader", 300);
        let follower = fx.open("follower", 300);
        let mut term = 1;
        for step in steps {
            match step {
                Step::NewLeader { keep_percent } => {
                    // The new leader's log: the follower's prefix, then its own entries.
                    term += 1;
                    let last = leader.last_op_id().index;
                    let keep = last * u64::from(keep_percent) / 100;
                    // Rebuild the leader's view by truncating through a replicated batch.
                    let batch = EntryBatch::encode(&[nyala_wal::EntryRef::new(
                        term, keep + 1, EntryType::NoOp, b"",
                    )]).unwrap();
                    let preceding = OpId::new(leader.term_at(keep).unwrap(), keep);
                    leader.append_replicated(preceding, Some(&batch), 0).unwrap();
                }
                Step::Append { entries } => {
                    for i in 0..entries {
                        leader.append(term, EntryType::Write, &vec![i; usize::from(i) * 20]).unwrap();
                    }
                }
                Step::Replicate { from_percent, bytes_max } => {
                    let mut after = follower.last_op_id().index.min(leader.last_op_id().index)
                        * u64::from(from_percent) / 100;
                    // Probe like a leader: a mismatch (even of a heartbeat) moves back to
                    // the hint, a match moves on, until the follower holds everything.
                    loop {
                        let batch = leader.read_batch(after, usize::from(bytes_max)).unwrap();
                        if let Some(batch) = &batch {
                            prop_assert!(batch.size_bytes() <= usize::from(bytes_max) || batch.len() == 1);
                        }
                        let preceding = OpId::new(leader.term_at(after).unwrap(), after);
                        let outcome = follower.append_replicated(preceding, batch.as_ref(), 0).unwrap();
                        if !outcome.matched {
                            prop_assert!(outcome.hint_index <= after);
                            after = outcome.hint_index - 1;
                            continue;
                        }
                        match batch {
                            Some(batch) => after = batch.last_op_id().index,
                            None => break,
                        }
                    }
                    let leader_last = leader.last_op_id();
                    let outcome = follower.append_replicated(leader_last, None, 0).unwrap();
                    prop_assert!(outcome.matched);
                    prop_assert_eq!(terms_of(&follower)[..leader_last.index as usize].to_vec(), terms_of(&leader));
                }
            }
        }
        leader.wait_durable(None).unwrap();
        follower.wait_durable(None).unwrap();
        let leader_bytes = leader.read_batch(0, BIG_BYTES).unwrap().map(|b| b.as_bytes().to_vec());
        let follower_last = follower.last_op_id();
        drop(leader);
        drop(follower);
        let leader = fx.open("leader", 300);
        let follower = fx.open("follower", 300);
        prop_assert_eq!(leader.read_batch(0, BIG_BYTES).unwrap().map(|b| b.as_bytes().to_vec()), leader_bytes);
        prop_assert_eq!(follower.last_op_id(), follower_last);
    }
}
