//! The MemRowSet's key index: the sorted map from encoded key to the newest version of that
//! key (`RowRef`). Keys of at most 8 fixed bytes live in `ShortKeys` (a B-tree of `u64` with
//! sorted runs beside it, for interleaved ascending bulk loads); longer or variable keys in a
//! B-tree of boxed bytes.
//!
//! This module owns the index's layout and its invariants. It stores `RowRef`s without
//! looking into them and knows nothing of Arrow batches, ops or row statuses, which stay with
//! `MemRowSet`.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::ops::Bound;

use super::RowRef;

/// The sorted map from encoded key to newest version. Keys of at most 8 fixed bytes (integer
/// and timestamp keys) live in a `u64`-keyed map: no allocation per key, one-instruction
/// comparisons; the byte order of such keys equals the numeric order of their big-endian value.
#[derive(Debug)]
pub(super) enum KeyIndex {
    Short { width: usize, map: ShortKeys },
    Long(BTreeMap<Box<[u8]>, RowRef>),
}

/// `u64` keys in order: a B-tree, and beside it up to `RunLimits::runs_max` sorted runs. A bulk
/// load inserts ascending keys, one stream per writer (each Spark task's share of a hash
/// partition), and streams interleave. A key just above a run's last key, with nothing held
/// between the two, is pushed onto that run instead of descending the tree: the tree's search
/// was 12 % of a tablet server's CPU during a Spark load with one run (session 5), and still
/// about 6 % with two interleaved streams, because one of them always fell to the tree.
///
/// Invariants:
/// * every key is held once, in the tree or in one run;
/// * each run is non-empty and strictly ascending; the runs are ordered by first key and their
///   ranges `[first, last]` are disjoint;
/// * no key is held anywhere in `(run.last, run.limit)` (so a key in that gap is known absent
///   and can be pushed without a lookup). The tree may hold keys inside a run's range.
#[derive(Debug, Default)]
pub(super) struct ShortKeys {
    tree: BTreeMap<u64, RowRef>,
    runs: Vec<Run>,
    limits: RunLimits,
    /// Keys that wanted a run while every slot was taken, since the last eviction attempt.
    misses: u32,
    /// (run, position) of the key `update` last found in a run. Only a hint: it is checked
    /// against the key before use, so a reshaped run or a removal cannot mislead it.
    finger: (usize, usize),
}

/// A sorted run of keys beside the tree.
#[derive(Debug)]
struct Run {
    keys: Vec<(u64, RowRef)>,
    /// Exclusive upper end of the gap above `last` known to hold no key (`None`: no key is
    /// held above `last` at all).
    limit: Option<u64>,
}

impl Run {
    #[inline]
    fn first(&self) -> u64 {
        self.keys[0].0
    }

    #[inline]
    fn last(&self) -> u64 {
        self.keys[self.keys.len() - 1].0
    }

    /// Whether `key` lies in the known-empty gap above the run.
    #[inline]
    fn takes(&self, key: u64) -> bool {
        key > self.last() && self.limit.is_none_or(|limit| key < limit)
    }
}

/// How many runs `ShortKeys` keeps and when it reshapes them.
#[derive(Clone, Copy, Debug)]
struct RunLimits {
    runs_max: usize,
    /// A run splits to take a key inside its range only if at most this many keys move. Two
    /// bulk writers' first batches can land on one run (the second writer's keys are above
    /// the first's), so a split must move a whole batch (up to 64 Ki rows, 1.5 MiB) once; the
    /// slots bound how often a split can happen.
    split_tail_keys_max: usize,
    /// With every slot taken, a run of at most this many keys may be folded into the tree.
    evict_keys_max: usize,
    /// With every slot taken, an eviction is tried once per this many keys wanting a run, so
    /// random keys (which would each start a run of one) cost almost nothing extra.
    evict_interval: u32,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            runs_max: 16,
            split_tail_keys_max: 64 * 1024,
            evict_keys_max: 1024,
            evict_interval: 64,
        }
    }
}

/// Where a key is, or would go, among the runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spot {
    /// Held in run `run` at position `at`.
    Found { run: usize, at: usize },
    /// Absent everywhere, and run `run` can take it on its end.
    Append { run: usize },
    /// Inside run `run`'s range but not in it: it may be in the tree; it would go at `at`.
    Inside { run: usize, at: usize },
    /// Outside every run's range: it may be in the tree; a new run for it would go at `run`.
    Gap { run: usize },
}

/// What `ShortKeys::make_room` achieved.
enum Room {
    Free,
    /// A run was folded into the tree: positions changed.
    Evicted,
    Full,
}

impl ShortKeys {
    #[cfg(test)]
    fn with_limits(limits: RunLimits) -> Self {
        ShortKeys {
            limits,
            ..ShortKeys::default()
        }
    }

    fn len(&self) -> usize {
        self.tree.len() + self.runs.iter().map(|r| r.keys.len()).sum::<usize>()
    }

    #[inline]
    fn locate(&self, key: u64) -> Spot {
        let next = self.runs.partition_point(|r| r.first() <= key);
        let Some(run) = next.checked_sub(1) else {
            return Spot::Gap { run: 0 };
        };
        let r = &self.runs[run];
        if key <= r.last() {
            return match r.keys.binary_search_by_key(&key, |&(k, _)| k) {
                Ok(at) => Spot::Found { run, at },
                Err(at) => Spot::Inside { run, at },
            };
        }
        if r.takes(key) {
            Spot::Append { run }
        } else {
            Spot::Gap { run: next }
        }
    }

    /// `key`'s spot if it is held right after the key `update` last found: an upsert batch
    /// of ascending keys that are all held walks its run one position at a time, without the
    /// two binary searches of `locate` (those were half of applying such a batch, 7 % of a
    /// tablet server's CPU in `tserver_write_bench`'s batched phase).
    #[inline]
    fn after_finger(&self, key: u64) -> Option<Spot> {
        let (run, at) = self.finger;
        match self.runs.get(run)?.keys.get(at + 1) {
            // Every key is held once, so a match is the key's only place.
            Some(&(held, _)) if held == key => Some(Spot::Found { run, at: at + 1 }),
            _ => None,
        }
    }

    /// The smallest key held in the tree or a run above `key`, if below `bound`.
    fn next_above(&self, key: u64, bound: Option<u64>) -> Option<u64> {
        let in_tree = self
            .tree
            .range((Bound::Excluded(key), Bound::Unbounded))
            .next()
            .map(|(&k, _)| k);
        match (in_tree, bound) {
            (Some(t), Some(b)) => Some(t.min(b)),
            (t, b) => t.or(b),
        }
    }

    fn make_room(&mut self) -> Room {
        if self.runs.len() < self.limits.runs_max {
            return Room::Free;
        }
        self.misses += 1;
        if self.misses < self.limits.evict_interval {
            return Room::Full;
        }
        self.misses = 0;
        let smallest = (0..self.runs.len()).min_by_key(|&i| self.runs[i].keys.len());
        match smallest {
            Some(i) if self.runs[i].keys.len() <= self.limits.evict_keys_max => {
                // The keys stay held (in the tree), so every other run's gap stays empty.
                let run = self.runs.remove(i);
                self.tree.extend(run.keys);
                Room::Evicted
            }
            _ => Room::Full,
        }
    }

    /// Places `key`, known to be held nowhere: on a run's end, in a new run (splitting the
    /// run it falls inside when few keys move), or in the tree.
    fn insert_absent(&mut self, key: u64, entry: RowRef) {
        // Each pass either places the key or reshapes the runs (an eviction, then possibly a
        // split) so that the next pass can; four passes always suffice.
        for _ in 0..4 {
            match self.locate(key) {
                Spot::Found { .. } => unreachable!("insert_absent of a held key"),
                Spot::Append { run } => {
                    self.runs[run].keys.push((key, entry));
                    return;
                }
                Spot::Inside { run, at } => {
                    if self.runs[run].keys.len() - at > self.limits.split_tail_keys_max {
                        break;
                    }
                    match self.make_room() {
                        Room::Full => break,
                        Room::Evicted => continue,
                        Room::Free => self.split(run, at),
                    }
                }
                Spot::Gap { run } => match self.make_room() {
                    Room::Full => break,
                    Room::Evicted => continue,
                    Room::Free => {
                        let bound = self.runs.get(run).map(Run::first);
                        let limit = self.next_above(key, bound);
                        let keys = vec![(key, entry)];
                        self.runs.insert(run, Run { keys, limit });
                        return;
                    }
                },
            }
        }
        self.tree.insert(key, entry);
    }

    /// Splits run `run` before position `at` (`at` ≥ 1) into two runs.
    fn split(&mut self, run: usize, at: usize) {
        let tail = self.runs[run].keys.split_off(at);
        let head_last = self.runs[run].last();
        let tail_first = tail[0].0;
        let limit = self.runs[run].limit;
        self.runs[run].limit = self.next_above(head_last, Some(tail_first));
        self.runs.insert(run + 1, Run { keys: tail, limit });
    }

    fn get(&self, key: u64) -> Option<&RowRef> {
        match self.locate(key) {
            Spot::Found { run, at } => Some(&self.runs[run].keys[at].1),
            Spot::Append { .. } => None,
            Spot::Inside { .. } | Spot::Gap { .. } => self.tree.get(&key),
        }
    }

    /// Inserts or replaces; true if the key is new.
    #[inline]
    fn insert(&mut self, key: u64, entry: RowRef) -> bool {
        matches!(
            self.update(key, |_| Ok::<_, std::convert::Infallible>(Some(entry))),
            Ok(Slot::Inserted)
        )
    }

    /// `KeyIndex::update` for short keys.
    #[inline]
    fn update<E>(
        &mut self,
        key: u64,
        choose: impl FnOnce(Option<RowRef>) -> std::result::Result<Option<RowRef>, E>,
    ) -> std::result::Result<Slot, E> {
        let replace = |slot: &mut RowRef, choose: Option<RowRef>| match choose {
            Some(next) => Slot::Replaced(std::mem::replace(slot, next)),
            None => Slot::Unchanged,
        };
        let spot = self.after_finger(key).unwrap_or_else(|| self.locate(key));
        let splits = match spot {
            Spot::Found { run, at } => {
                self.finger = (run, at);
                let slot = &mut self.runs[run].keys[at].1;
                let current = *slot;
                return Ok(replace(slot, choose(Some(current))?));
            }
            Spot::Append { run } => {
                return Ok(match choose(None)? {
                    Some(next) => {
                        self.runs[run].keys.push((key, next));
                        Slot::Inserted
                    }
                    None => Slot::Unchanged,
                });
            }
            Spot::Inside { run, at } => {
                self.runs[run].keys.len() - at <= self.limits.split_tail_keys_max
            }
            Spot::Gap { .. } => true,
        };
        let wants_run = splits
            && (self.runs.len() < self.limits.runs_max
                || self.misses + 1 >= self.limits.evict_interval);
        match self.tree.entry(key) {
            Entry::Occupied(mut found) => {
                let current = *found.get();
                Ok(replace(found.get_mut(), choose(Some(current))?))
            }
            Entry::Vacant(empty) => match choose(None)? {
                Some(next) if wants_run => {
                    self.insert_absent(key, next);
                    Ok(Slot::Inserted)
                }
                Some(next) => {
                    // No run can take it now: insert where the search already stands (and
                    // count a miss when every run slot is taken, towards an eviction).
                    empty.insert(next);
                    if splits {
                        self.misses += 1;
                    }
                    Ok(Slot::Inserted)
                }
                None => Ok(Slot::Unchanged),
            },
        }
    }

    fn remove(&mut self, key: u64) {
        match self.locate(key) {
            Spot::Found { run, at } => {
                let r = &mut self.runs[run];
                r.keys.remove(at);
                if r.keys.is_empty() {
                    self.runs.remove(run);
                } else if at == r.keys.len() {
                    // The tree may hold keys between the new last key and the removed one:
                    // stop appends to this run rather than search for them.
                    r.limit = Some(r.last() + 1);
                }
            }
            Spot::Append { .. } => {}
            Spot::Inside { .. } | Spot::Gap { .. } => {
                self.tree.remove(&key);
            }
        }
    }

    fn first(&self) -> Option<u64> {
        let tree = self.tree.first_key_value().map(|(&k, _)| k);
        let runs = self.runs.first().map(Run::first);
        match (tree, runs) {
            (Some(t), Some(r)) => Some(t.min(r)),
            (t, r) => t.or(r),
        }
    }

    fn last(&self) -> Option<u64> {
        let tree = self.tree.last_key_value().map(|(&k, _)| k);
        let runs = self.runs.last().map(Run::last);
        match (tree, runs) {
            (Some(t), Some(r)) => Some(t.max(r)),
            (t, r) => t.or(r),
        }
    }

    /// Appends the entries with keys in `[lower, upper)` to `out`, in key order. With no
    /// key of that range in the tree (a bulk load's keys all sit in runs) the runs' slices are
    /// copied whole, at memcpy speed; otherwise through `range`'s merge. A scan collects the
    /// whole range this way while it holds the engine's lock, which every write of the tablet
    /// waits for: through the merge, 5M rows took 270 ms (and a tablet server's event loop,
    /// applying a write, waited as long).
    fn extend_range(&self, lower: Option<u64>, upper: Option<u64>, out: &mut Vec<RowRef>) {
        let bounds = (
            lower.map_or(Bound::Unbounded, Bound::Included),
            upper.map_or(Bound::Unbounded, Bound::Excluded),
        );
        if self.tree.range(bounds).next().is_some() {
            out.extend(self.range(lower, upper));
            return;
        }
        let slices: Vec<&[(u64, RowRef)]> = self
            .runs
            .iter()
            .map(|r| {
                let from = lower.map_or(0, |l| r.keys.partition_point(|&(k, _)| k < l));
                let to = upper.map_or(r.keys.len(), |u| r.keys.partition_point(|&(k, _)| k < u));
                &r.keys[from..to.max(from)]
            })
            .collect();
        out.reserve(slices.iter().map(|s| s.len()).sum());
        for slice in slices {
            out.extend(slice.iter().map(|&(_, r)| r));
        }
    }

    /// Entries with keys in `[lower, upper)`, in key order: the tree's and the runs' merged
    /// (the runs' ranges are disjoint and ordered, so their keys chained are sorted).
    fn range(&self, lower: Option<u64>, upper: Option<u64>) -> impl Iterator<Item = RowRef> + '_ {
        let bounds = (
            lower.map_or(Bound::Unbounded, Bound::Included),
            upper.map_or(Bound::Unbounded, Bound::Excluded),
        );
        let runs = self.runs.iter().flat_map(move |r| {
            let from = lower.map_or(0, |l| r.keys.partition_point(|&(k, _)| k < l));
            let to = upper.map_or(r.keys.len(), |u| r.keys.partition_point(|&(k, _)| k < u));
            r.keys[from..to.max(from)].iter().copied()
        });
        MergeByKey {
            a: self.tree.range(bounds).map(|(&k, &r)| (k, r)).peekable(),
            b: runs.peekable(),
        }
        .map(|(_, r)| r)
    }
}

/// Merges two iterators of ascending, mutually distinct keys.
struct MergeByKey<A: Iterator, B: Iterator> {
    a: std::iter::Peekable<A>,
    b: std::iter::Peekable<B>,
}

impl<A, B> Iterator for MergeByKey<A, B>
where
    A: Iterator<Item = (u64, RowRef)>,
    B: Iterator<Item = (u64, RowRef)>,
{
    type Item = (u64, RowRef);

    fn next(&mut self) -> Option<Self::Item> {
        match (self.a.peek(), self.b.peek()) {
            (Some(&(ka, _)), Some(&(kb, _))) if kb < ka => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

impl KeyIndex {
    /// An empty index; `fixed_key_width` is the encoded key length when every key has the
    /// same length, which selects the short-key layout when it is at most 8 bytes.
    pub(super) fn new(fixed_key_width: Option<usize>) -> Self {
        match fixed_key_width {
            Some(width) if (1..=8).contains(&width) => KeyIndex::Short {
                width,
                map: ShortKeys::default(),
            },
            _ => KeyIndex::Long(BTreeMap::new()),
        }
    }

    /// The key width of the short-key layout (`None`: keys are held as bytes).
    pub(super) fn fixed_width(&self) -> Option<usize> {
        match self {
            KeyIndex::Short { width, .. } => Some(*width),
            KeyIndex::Long(_) => None,
        }
    }

    #[inline]
    fn short(width: usize, key: &[u8]) -> u64 {
        debug_assert_eq!(key.len(), width, "fixed-width keys");
        let mut bytes = [0u8; 8];
        bytes[..width].copy_from_slice(key);
        u64::from_be_bytes(bytes)
    }

    pub(super) fn len(&self) -> usize {
        match self {
            KeyIndex::Short { map, .. } => map.len(),
            KeyIndex::Long(map) => map.len(),
        }
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<&RowRef> {
        match self {
            KeyIndex::Short { width, map } => map.get(Self::short(*width, key)),
            KeyIndex::Long(map) => map.get(key),
        }
    }

    /// Inserts or replaces; true if the key is new.
    #[inline]
    pub(super) fn insert(&mut self, key: &[u8], entry: RowRef) -> bool {
        match self {
            KeyIndex::Short { width, map } => map.insert(Self::short(*width, key), entry),
            // A repeated key keeps its boxed copy and drops the new one.
            KeyIndex::Long(map) => map.insert(key.into(), entry).is_none(),
        }
    }

    /// Finds `key` once and stores what `choose` makes of its current version (`None`: not
    /// here); `choose` returning `None` leaves the slot as it was.
    #[inline]
    pub(super) fn update<E>(
        &mut self,
        key: &[u8],
        choose: impl FnOnce(Option<RowRef>) -> std::result::Result<Option<RowRef>, E>,
    ) -> std::result::Result<Slot, E> {
        let replace = |slot: &mut RowRef, choose: Option<RowRef>| match choose {
            Some(next) => Slot::Replaced(std::mem::replace(slot, next)),
            None => Slot::Unchanged,
        };
        match self {
            KeyIndex::Short { width, map } => map.update(Self::short(*width, key), choose),
            // `entry` would need an owned key: probe by reference, box only a new key.
            KeyIndex::Long(map) => match map.get_mut(key) {
                Some(found) => {
                    let current = *found;
                    Ok(replace(found, choose(Some(current))?))
                }
                None => Ok(match choose(None)? {
                    Some(next) => {
                        map.insert(key.into(), next);
                        Slot::Inserted
                    }
                    None => Slot::Unchanged,
                }),
            },
        }
    }

    pub(super) fn remove(&mut self, key: &[u8]) {
        match self {
            KeyIndex::Short { width, map } => map.remove(Self::short(*width, key)),
            KeyIndex::Long(map) => {
                map.remove(key);
            }
        }
    }

    pub(super) fn key_range(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        match self {
            KeyIndex::Short { width, map } => {
                let first = map.first()?.to_be_bytes()[..*width].to_vec();
                let last = map.last()?.to_be_bytes()[..*width].to_vec();
                Some((first, last))
            }
            KeyIndex::Long(map) => Some((
                map.first_key_value()?.0.to_vec(),
                map.last_key_value()?.0.to_vec(),
            )),
        }
    }

    /// The entries with keys in `[lower, upper)`, in key order, collected.
    pub(super) fn collect_range(&self, lower: Option<&[u8]>, upper: Option<&[u8]>) -> Vec<RowRef> {
        match self {
            KeyIndex::Short { width, map } => {
                let mut out = Vec::new();
                map.extend_range(
                    lower.map(|l| Self::short(*width, l)),
                    upper.map(|u| Self::short(*width, u)),
                    &mut out,
                );
                out
            }
            KeyIndex::Long(_) => self.range(lower, upper).collect(),
        }
    }

    /// Entries with keys in `[lower, upper)`, in key order.
    pub(super) fn range<'a>(
        &'a self,
        lower: Option<&[u8]>,
        upper: Option<&[u8]>,
    ) -> Box<dyn Iterator<Item = RowRef> + 'a> {
        match self {
            KeyIndex::Short { width, map } => Box::new(map.range(
                lower.map(|l| Self::short(*width, l)),
                upper.map(|u| Self::short(*width, u)),
            )),
            KeyIndex::Long(map) => {
                let range = (
                    lower.map_or(Bound::Unbounded, Bound::Included),
                    upper.map_or(Bound::Unbounded, Bound::Excluded),
                );
                Box::new(map.range::<[u8], _>(range).map(|(_, r)| *r))
            }
        }
    }
}

/// What `KeyIndex::update` did to a key's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    Unchanged,
    Inserted,
    /// The previous version.
    Replaced(RowRef),
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use std::ops::Bound;

    use super::{RowRef, RunLimits, ShortKeys, Slot};

    fn row(n: u32) -> RowRef {
        RowRef {
            batch: n,
            row: n,
            deleted: n.is_multiple_of(3),
            older: crate::memrowset::NO_HISTORY,
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64),
        UpdateKeep(u64),
        UpdateWrite(u64),
        Remove(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Small keys collide often; a rising counter shape comes from sorted runs below.
        let key = prop_oneof![0u64..40, 0u64..u64::MAX];
        prop_oneof![
            key.clone().prop_map(Op::Insert),
            key.clone().prop_map(Op::UpdateKeep),
            key.clone().prop_map(Op::UpdateWrite),
            key.prop_map(Op::Remove),
        ]
    }

    /// The runs' invariants (see `ShortKeys`) against the model of everything held.
    fn check_invariants(keys: &ShortKeys, model: &BTreeMap<u64, RowRef>) {
        assert!(keys.runs.len() <= keys.limits.runs_max);
        for r in &keys.runs {
            assert!(!r.keys.is_empty());
            assert!(r.keys.windows(2).all(|w| w[0].0 < w[1].0));
            // The gap above the run holds no key.
            let gap_end = r.limit.map_or(Bound::Unbounded, Bound::Excluded);
            assert_eq!(
                model.range((Bound::Excluded(r.last()), gap_end)).next(),
                None,
                "gap above run ending {} (limit {:?})",
                r.last(),
                r.limit
            );
            for (k, _) in &r.keys {
                assert!(!keys.tree.contains_key(k), "{k} held twice");
            }
        }
        assert!(keys.runs.windows(2).all(|w| w[0].last() < w[1].first()));
        assert_eq!(keys.len(), model.len());
    }

    /// The tree-plus-runs index behaves exactly like one ordered map, whatever the order of
    /// keys (ascending streams, keys inside a run, between runs, removals) and however few
    /// runs it may keep, for lookups, sizes, first/last and every range.
    fn check(ops: &[Op]) {
        check_with(ops, RunLimits::default());
    }

    fn small_limits() -> RunLimits {
        RunLimits {
            runs_max: 3,
            split_tail_keys_max: 4,
            evict_keys_max: 6,
            evict_interval: 2,
        }
    }

    fn check_with(ops: &[Op], limits: RunLimits) {
        let mut keys = ShortKeys::with_limits(limits);
        let mut model: BTreeMap<u64, RowRef> = BTreeMap::new();
        for (n, op) in ops.iter().enumerate() {
            let entry = row(n as u32);
            match *op {
                Op::Insert(k) => {
                    assert_eq!(keys.insert(k, entry), model.insert(k, entry).is_none());
                }
                Op::UpdateKeep(k) => {
                    let slot = keys.update(k, |_| Ok::<_, ()>(None)).unwrap();
                    assert_eq!(slot, Slot::Unchanged);
                }
                Op::UpdateWrite(k) => {
                    let before = model.get(&k).copied();
                    let slot = keys
                        .update(k, |current| {
                            assert_eq!(current, before);
                            Ok::<_, ()>(Some(entry))
                        })
                        .unwrap();
                    model.insert(k, entry);
                    let expected = before.map_or(Slot::Inserted, Slot::Replaced);
                    assert_eq!(slot, expected);
                }
                Op::Remove(k) => {
                    keys.remove(k);
                    model.remove(&k);
                }
            }
            check_invariants(&keys, &model);
        }
        assert_eq!(keys.len(), model.len());
        assert_eq!(keys.first(), model.keys().next().copied());
        assert_eq!(keys.last(), model.keys().next_back().copied());
        for (&k, v) in &model {
            assert_eq!(keys.get(k), Some(v));
        }
        // Ranges between every pair of up to ~40 bounds: each key of a small map, a spread of
        // a large one's (every pair of every key was cubic: a minute per `cargo test` run).
        let step = (model.len() / 32).max(1);
        let mut bounds: Vec<u64> = model.keys().copied().step_by(step).collect();
        bounds.extend(model.keys().next_back().copied());
        bounds.extend([0, 1, 20, 39, u64::MAX]);
        for &lower in &bounds {
            for &upper in &bounds {
                if lower > upper {
                    continue;
                }
                let got: Vec<RowRef> = keys.range(Some(lower), Some(upper)).collect();
                let want: Vec<RowRef> = model.range(lower..upper).map(|(_, v)| *v).collect();
                assert_eq!(got, want, "range {lower}..{upper}");
                let mut collected = Vec::new();
                keys.extend_range(Some(lower), Some(upper), &mut collected);
                assert_eq!(collected, want, "extend_range {lower}..{upper}");
            }
        }
        let all: Vec<RowRef> = keys.range(None, None).collect();
        assert_eq!(all, model.values().copied().collect::<Vec<_>>());
        let mut collected = Vec::new();
        keys.extend_range(None, None, &mut collected);
        assert_eq!(collected, all);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn tree_and_run_act_as_one_ordered_map(ops in prop::collection::vec(op(), 0..120)) {
            check(&ops);
        }

        #[test]
        fn few_runs_act_as_one_ordered_map(ops in prop::collection::vec(op(), 0..160)) {
            check_with(&ops, small_limits());
        }

        #[test]
        fn many_streams_with_few_runs(
            starts in prop::collection::vec(0u64..1000, 1..8),
            steps in prop::collection::vec((0usize..8, any::<bool>()), 0..300),
        ) {
            // More ascending writers than runs, with stray keys: splits and evictions.
            let mut next: Vec<u64> = starts.iter().enumerate().map(|(i, s)| s + 97 * i as u64).collect();
            let ops: Vec<Op> = steps
                .iter()
                .map(|&(w, stray)| {
                    let w = w % next.len();
                    next[w] += 1;
                    if stray { Op::UpdateWrite(next[w] * 7 % 1500) } else { Op::Insert(next[w]) }
                })
                .collect();
            check_with(&ops, small_limits());
        }

        #[test]
        fn interleaved_ascending_writers(
            starts in prop::collection::vec(0u64..1000, 1..4),
            steps in prop::collection::vec(0usize..4, 0..200),
        ) {
            // Several writers each inserting ascending keys, interleaved: the bulk-load shape.
            let mut next: Vec<u64> = starts.iter().enumerate().map(|(i, s)| s + 10_000 * i as u64).collect();
            let ops: Vec<Op> = steps
                .iter()
                .map(|&w| {
                    let w = w % next.len();
                    next[w] += 1 + (w as u64);
                    Op::Insert(next[w])
                })
                .collect();
            check(&ops);
        }
    }

    /// Upserts of held keys in ascending batches (what `tserver_write_bench` repeats) find
    /// each key next to the last one, across runs, removals and splits that move the finger's
    /// run: every answer matches the model's.
    #[test]
    fn ascending_updates_follow_the_finger() {
        let mut ops: Vec<Op> = Vec::new();
        for writer in 0..5u64 {
            ops.extend((0..40).map(|k| Op::Insert(writer * 1000 + k)));
        }
        for round in 0..3u64 {
            for writer in [3u64, 0, 4, 1, 2] {
                ops.extend((0..40).map(|k| Op::UpdateWrite(writer * 1000 + k)));
                ops.push(Op::Remove(writer * 1000 + 10 + round));
                ops.push(Op::Insert(writer * 1000 + 500 + round));
                ops.push(Op::UpdateWrite(writer * 1000 + 20));
            }
        }
        check_with(&ops, small_limits());
        check(&ops);
        let mut keys = ShortKeys::default();
        for k in 0..100u64 {
            keys.insert(k, row(k as u32));
        }
        for k in 0..100u64 {
            keys.insert(k, row(k as u32 + 1));
        }
        assert_eq!(keys.finger, (0, 99));
    }

    /// The Spark bulk-load shape: two writers, each ascending through its own half of the key
    /// space, interleaved key by key or batch by batch. Every key ends on a run's end,
    /// whichever writer comes first, and none goes down the tree.
    #[test]
    fn interleaved_halves_stay_out_of_the_tree() {
        for batch in [1u64, 5000, 20_000] {
            for high_first in [false, true] {
                let mut keys = ShortKeys::default();
                let mut model = BTreeMap::new();
                for start in (0..60_000u64).step_by(batch as usize) {
                    let low: Vec<u64> = (start..start + batch).collect();
                    let high: Vec<u64> = low.iter().map(|k| 1_000_000 + k).collect();
                    let (first, second) = if high_first { (high, low) } else { (low, high) };
                    for k in first.into_iter().chain(second) {
                        assert!(keys.insert(k, row(k as u32)));
                        model.insert(k, row(k as u32));
                    }
                }
                check_invariants(&keys, &model);
                assert!(
                    keys.tree.is_empty(),
                    "batch {batch}: tree holds {}",
                    keys.tree.len()
                );
                assert_eq!(keys.runs.len(), 2);
            }
        }
    }
}
