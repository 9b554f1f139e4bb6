//! Which rowsets a compaction merges, so that a tablet's write amplification grows slowly
//! with what it holds rather than with all of it.
//!
//! Merging every rowset each time their count reaches a threshold (what `Engine::compact`
//! does) rewrites the whole tablet every few flushes: after months of writes, each flush of
//! a few megabytes costs a rewrite of gigabytes, and the bytes written grow with the square
//! of the flushes. Here a compaction merges a contiguous run of rowsets in age order (so a
//! newer rowset still shadows an older one):
//!
//! 1. nothing until the tablet has `min_rowsets` rowsets;
//! 2. every rowset, if the newer ones together are at least as large as the oldest. Their
//!    rows may all be overwrites of it, and a merge collects superseded rows and history
//!    older than the ancient history mark only among the rowsets it merges: this bounds what
//!    they take to about the size of the oldest. The oldest at least doubles each time unless
//!    the merge collected that much, so this happens O(log n) times over n flushes;
//! 3. else the run of adjacent newer rowsets that costs least per rowset it removes (its
//!    bytes over its length less one), the longer of equally cheap runs, then the newer.
//!    Runs of similar sizes win; a small rowset is not merged again and again into a large
//!    one.
//!
//! With the default threshold of 8, 4,096 equal flushes of unique rows rewrite each byte
//! about 20 times (merging everything: about 290 times), 256 flushes about 4 times (18).

use std::ops::Range;

/// The run of rowsets (indexes into `sizes`, oldest first, each a rowset's bytes) to merge
/// next, if any: the rules in the module doc.
pub fn pick(sizes: &[u64], min_rowsets: usize) -> Option<Range<usize>> {
    let n = sizes.len();
    if n < min_rowsets.max(2) {
        return None;
    }
    let newer: u128 = sizes[1..].iter().map(|&s| u128::from(s)).sum();
    if newer >= u128::from(sizes[0]) || n == 2 {
        return Some(0..n);
    }
    // (bytes, rowsets removed, run): a cost of bytes / removed, compared crosswise.
    let mut best: Option<(u128, u128, Range<usize>)> = None;
    for start in (1..n - 1).rev() {
        let mut bytes = u128::from(sizes[start]);
        for end in start + 2..=n {
            bytes += u128::from(sizes[end - 1]);
            let removed = (end - start - 1) as u128;
            let better = best.as_ref().is_none_or(|(b, r, run)| {
                let (mine, theirs) = (bytes * r, b * removed);
                mine < theirs || (mine == theirs && end - start > run.len())
            });
            if better {
                best = Some((bytes, removed, start..end));
            }
        }
    }
    best.map(|(_, _, run)| run)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `flushes` flushes of `flush` bytes each, compacting by `policy` after each until
    /// it picks nothing; a merge's output is the inputs' total, capped at `live` (rows
    /// overwritten or collected). Returns the bytes compactions wrote and the most rowsets
    /// seen after a compaction round.
    fn simulate(
        flushes: usize,
        flush: u64,
        live: u64,
        policy: impl Fn(&[u64]) -> Option<Range<usize>>,
    ) -> (u128, usize) {
        let (mut rowsets, mut written, mut most) = (Vec::<u64>::new(), 0u128, 0);
        for _ in 0..flushes {
            rowsets.push(flush);
            while let Some(run) = policy(&rowsets) {
                let out = rowsets[run.clone()].iter().sum::<u64>().min(live);
                written += u128::from(out);
                rowsets.splice(run, [out]);
            }
            most = most.max(rowsets.len());
        }
        (written, most)
    }

    fn merge_all(sizes: &[u64]) -> Option<Range<usize>> {
        (sizes.len() >= 8).then_some(0..sizes.len())
    }

    #[test]
    fn nothing_below_the_threshold() {
        assert_eq!(pick(&[1; 7], 8), None);
        assert_eq!(pick(&[5], 2), None);
        assert_eq!(pick(&[], 0), None);
    }

    #[test]
    fn newer_rowsets_as_large_as_the_oldest_merge_everything() {
        assert_eq!(pick(&[1; 8], 8), Some(0..8));
        assert_eq!(pick(&[70, 10, 10, 10, 10, 10, 10, 10], 8), Some(0..8));
        assert_eq!(
            pick(&[10, 1], 2),
            Some(0..2),
            "two rowsets: nothing else to merge"
        );
        assert_eq!(pick(&[10, 1], 0), Some(0..2));
    }

    #[test]
    fn the_run_cheapest_per_rowset_removed_merges() {
        // Five flushes after larger rowsets: 5 bytes remove 4 rowsets; taking the 8 too
        // would cost 13 for 5.
        assert_eq!(pick(&[100, 40, 8, 1, 1, 1, 1, 1], 8), Some(3..8));
        // Sizes falling off steeply: the newest pair is cheapest (4 for one).
        assert_eq!(
            pick(&[10_000, 1_000, 300, 100, 30, 10, 3, 1], 8),
            Some(6..8)
        );
        // Equal costs (3 per rowset for 2,1 and for 3,2,1): the longer run.
        assert_eq!(pick(&[1_000, 7, 6, 5, 4, 3, 2, 1], 8), Some(5..8));
        // Equal runs: the newer.
        assert_eq!(pick(&[1_000, 50, 2, 2, 50, 2, 2, 50], 8), Some(5..7));
    }

    #[test]
    fn rows_are_rewritten_a_few_times_not_once_per_compaction() {
        // 4,096 flushes of unique rows: merging everything rewrites the tablet every seven
        // flushes (quadratic); the policy rewrites each byte about 20 times.
        let flushes = 4_096;
        let (tiered, most) = simulate(flushes, 1, u64::MAX, |s| pick(s, 8));
        let (all, _) = simulate(flushes, 1, u64::MAX, merge_all);
        let per_byte = tiered as f64 / flushes as f64;
        assert!(per_byte <= 25.0, "{per_byte} rewrites per byte");
        assert!(
            all > 10 * tiered,
            "merge-all wrote {all}, the policy {tiered}"
        );
        let (few, _) = simulate(256, 1, u64::MAX, |s| pick(s, 8));
        assert!(few <= 5 * 256, "{few} bytes written over 256 flushes");
        assert!(most < 8, "{most} rowsets after compacting");
    }

    #[test]
    fn overwritten_rows_are_collected_whatever_the_tablet_holds() {
        // A hot key set: every flush overwrites the same 10 bytes of live rows. Merging
        // collects; the tablet stays within a few times its live data.
        let (mut rowsets, live) = (Vec::<u64>::new(), 10);
        for _ in 0..10_000 {
            rowsets.push(10);
            while let Some(run) = pick(&rowsets, 8) {
                let out = rowsets[run.clone()].iter().sum::<u64>().min(live);
                rowsets.splice(run, [out]);
            }
            assert!(rowsets.iter().sum::<u64>() <= 8 * live, "{rowsets:?}");
        }
    }
}
