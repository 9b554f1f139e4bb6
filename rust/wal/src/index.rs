//! In-memory maps of the log: where each entry lives on disk (`LogIndex`) and which term each
//! index has (`TermRuns`). Both are rebuilt by recovery and never persisted.

use std::collections::VecDeque;

use nyala_common::{OpId, OpIndex, Term};

/// Where one entry lives: its batch frame (to read and verify as a whole) and its place in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    pub sequence: u64,
    pub batch_offset: u64,
    pub frame_len: u32,
    /// Offset of the entry header inside the batch payload.
    pub entry_offset: u32,
    /// Length of the entry's payload.
    pub payload_len: u32,
    pub term: Term,
}

/// Locations of the written entries `first..next`, contiguous by construction.
#[derive(Debug, Default)]
pub(crate) struct LogIndex {
    /// Index of `locations[0]`; when empty, the index the next entry must have.
    first: OpIndex,
    locations: VecDeque<Location>,
}

impl LogIndex {
    pub(crate) fn new(next: OpIndex) -> Self {
        LogIndex {
            first: next,
            locations: VecDeque::new(),
        }
    }

    /// The index of the first retained entry (or of the next entry when empty).
    pub(crate) fn first(&self) -> OpIndex {
        self.first
    }

    /// The index after the last written entry.
    pub(crate) fn next(&self) -> OpIndex {
        self.first + self.locations.len() as u64
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    pub(crate) fn get(&self, index: OpIndex) -> Option<&Location> {
        let offset = index.checked_sub(self.first)?;
        self.locations.get(usize::try_from(offset).ok()?)
    }

    /// Adds the location of entry `index`, which must come right after the last one (an
    /// empty index accepts any start, e.g. after GC removed everything before it).
    pub(crate) fn push(&mut self, index: OpIndex, location: Location) {
        if self.locations.is_empty() {
            self.first = index;
        }
        assert_eq!(index, self.next(), "index entries are contiguous");
        self.locations.push_back(location);
    }

    /// Forgets entries after `last_kept`.
    pub(crate) fn truncate_after(&mut self, last_kept: OpIndex) {
        if last_kept < self.first {
            self.locations.clear();
            self.first = last_kept + 1;
            return;
        }
        let keep = (last_kept - self.first + 1) as usize;
        self.locations.truncate(keep);
        if self.locations.is_empty() {
            self.first = last_kept + 1;
        }
    }

    /// Forgets the leading entries stored in segments up to `sequence` (they were GC'd).
    /// Surviving entries are in non-decreasing segment order, so these form a prefix.
    pub(crate) fn trim_segments_through(&mut self, sequence: u64) {
        while self
            .locations
            .front()
            .is_some_and(|l| l.sequence <= sequence)
        {
            self.locations.pop_front();
            self.first += 1;
        }
    }
}

/// The term of every index in the log, as runs of equal terms. This is the reservation-time
/// view: it includes appends still queued for the disk.
#[derive(Debug)]
pub(crate) struct TermRuns {
    /// `(first index of the run, term)`, ascending in both.
    runs: Vec<(OpIndex, Term)>,
    /// First index whose term is known (earlier ones were GC'd).
    first: OpIndex,
    /// The last entry; after a truncation that emptied the log, the truncation point.
    last: OpId,
}

impl TermRuns {
    /// An empty log whose last entry is `last` (`OpId::MIN` for a new log).
    pub(crate) fn new(last: OpId) -> Self {
        TermRuns {
            runs: Vec::new(),
            first: last.index + 1,
            last,
        }
    }

    pub(crate) fn last(&self) -> OpId {
        self.last
    }

    pub(crate) fn first(&self) -> OpIndex {
        self.first
    }

    /// Records entry `op` at the end of the log.
    pub(crate) fn push(&mut self, op: OpId) {
        debug_assert_eq!(op.index, self.last.index + 1);
        debug_assert!(op.term >= self.last.term);
        if self.runs.last().is_none_or(|&(_, term)| term != op.term) {
            self.runs.push((op.index, op.term));
        }
        self.last = op;
    }

    /// Like `push`, for the first entry seen by recovery after GC'd ones (any index).
    pub(crate) fn restart_at(&mut self, op: OpId) {
        self.runs.clear();
        self.first = op.index;
        self.last = OpId::new(op.term, op.index - 1);
        self.push(op);
    }

    /// The term of `index`: `Some(0)` for index 0, `None` when it is not in the log.
    pub(crate) fn term_at(&self, index: OpIndex) -> Option<Term> {
        if index == 0 {
            return Some(0);
        }
        if index == self.last.index {
            return Some(self.last.term);
        }
        if index < self.first || index > self.last.index {
            return None;
        }
        let run = self.runs.partition_point(|&(start, _)| start <= index);
        run.checked_sub(1).map(|i| self.runs[i].1)
    }

    /// Drops entries after `last_kept`, whose term the caller knows.
    pub(crate) fn truncate_after(&mut self, last_kept: OpId) {
        let run = self
            .runs
            .partition_point(|&(start, _)| start <= last_kept.index);
        self.runs.truncate(run);
        self.last = last_kept;
        if last_kept.index < self.first {
            self.runs.clear();
            self.first = last_kept.index + 1;
        }
    }

    /// Forgets terms of indexes below `first` (GC'd entries).
    pub(crate) fn trim_before(&mut self, first: OpIndex) {
        if first <= self.first {
            return;
        }
        self.first = first;
        let keep_from = self
            .runs
            .partition_point(|&(start, _)| start <= first)
            .saturating_sub(1);
        self.runs.drain(..keep_from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn term_runs_answer_term_at_through_truncation_and_trim() {
        let mut terms = TermRuns::new(OpId::MIN);
        for (term, index) in [(1, 1), (1, 2), (2, 3), (2, 4), (4, 5)] {
            terms.push(OpId::new(term, index));
        }
        assert_eq!(terms.term_at(0), Some(0));
        assert_eq!(terms.term_at(2), Some(1));
        assert_eq!(terms.term_at(4), Some(2));
        assert_eq!(terms.term_at(6), None);
        terms.truncate_after(OpId::new(2, 3));
        assert_eq!(terms.last(), OpId::new(2, 3));
        assert_eq!(terms.term_at(4), None);
        terms.push(OpId::new(3, 4));
        assert_eq!(terms.term_at(4), Some(3));
        terms.trim_before(3);
        assert_eq!(terms.term_at(2), None);
        assert_eq!(terms.term_at(3), Some(2));
    }

    #[test]
    fn log_index_truncates_and_trims() {
        let loc = |sequence| Location {
            sequence,
            batch_offset: 0,
            frame_len: 0,
            entry_offset: 0,
            payload_len: 0,
            term: 1,
        };
        let mut index = LogIndex::new(1);
        for i in 1..=6 {
            index.push(i, loc(if i <= 3 { 1 } else { 2 }));
        }
        index.truncate_after(5);
        assert_eq!(index.next(), 6);
        index.trim_segments_through(1);
        assert_eq!(index.first(), 4);
        assert!(index.get(3).is_none());
        assert_eq!(index.get(4).map(|l| l.sequence), Some(2));
        index.truncate_after(2);
        assert!(index.is_empty());
        assert_eq!(index.next(), 3);
    }
}
