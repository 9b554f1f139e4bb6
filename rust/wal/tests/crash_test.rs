//! Crash recovery: cut the last segment at every byte offset of its final batches, zero its
//! tail, flip bits in it, and check that recovery returns exactly a prefix of the
//! acknowledged entries (all intact batches included) or a typed error, never a wrong entry.
//! Damage in a closed segment must be a Corruption error that changes nothing on disk.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use common::{entry, read_all, scratch_dir, small_options};
use nyala_common::{Classify, ErrorKind};
use nyala_wal::format::{self, BATCH_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use nyala_wal::{Entry, Log, LogOptions};

const TABLET: &str = "crash";

/// The files of a log directory at the moment of a simulated crash.
type Image = BTreeMap<String, Vec<u8>>;

fn options() -> LogOptions {
    small_options(8 << 10)
}

/// Writes 1-entry batches (and one 3-entry batch) and waits for each, then captures the
/// directory without closing the log (no footer on the last segment).
fn crashed_image() -> (Image, Vec<Entry>) {
    let dir = scratch_dir();
    let log = Log::open(dir.path(), TABLET, options()).unwrap();
    let mut acked = Vec::new();
    for i in 1..=120u64 {
        let e = entry(1 + i / 50, i);
        log.append_durable(&[e.as_ref()]).unwrap();
        acked.push(e);
    }
    let batch: Vec<Entry> = (121..=123).map(|i| entry(3, i)).collect();
    let refs: Vec<_> = batch.iter().map(Entry::as_ref).collect();
    log.append_durable(&refs).unwrap();
    acked.extend(batch);
    for i in 124..=125u64 {
        let e = entry(3, i);
        log.append_durable(&[e.as_ref()]).unwrap();
        acked.push(e);
    }
    assert!(
        log.segment_paths().len() >= 3,
        "the image should span segments"
    );
    let image = snapshot(dir.path());
    drop(log);
    (image, acked)
}

fn snapshot(dir: &Path) -> Image {
    let mut image = Image::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        image.insert(name, fs::read(entry.path()).unwrap());
    }
    image
}

fn restore(image: &Image, dir: &Path) {
    for (name, bytes) in image {
        fs::write(dir.join(name), bytes).unwrap();
    }
}

/// The name of the segment holding data last (the newest may be a prepared, empty one).
fn last_data_segment(image: &Image) -> String {
    image
        .iter()
        .filter(|(name, _)| nyala_wal::parse_segment_name(name).is_some())
        .filter(|(_, bytes)| format::decode_batch_header(&bytes[SEGMENT_HEADER_BYTES..]).is_ok())
        .map(|(name, _)| name.clone())
        .next_back()
        .expect("a segment with data")
}

/// Frame boundaries `(start, end, entries)` of the batches in a segment image.
fn frames(bytes: &[u8]) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut pos = SEGMENT_HEADER_BYTES;
    while let Ok(header) = format::decode_batch_header(&bytes[pos..]) {
        let end = pos + BATCH_HEADER_BYTES + header.payload_len as usize;
        out.push((pos, end, header.entry_count as usize));
        pos = end;
    }
    out
}

/// Opens the damaged image; checks the outcome; returns how many entries came back.
fn recover(image: &Image, acked: &[Entry], at_least: usize) -> Result<usize, ErrorKind> {
    let dir = scratch_dir();
    restore(image, dir.path());
    let log = match Log::open(dir.path(), TABLET, options()) {
        Ok(log) => log,
        Err(err) => return Err(err.kind()),
    };
    let entries = read_all(&log);
    assert!(
        entries.len() <= acked.len(),
        "more entries than were written"
    );
    assert_eq!(
        entries[..],
        acked[..entries.len()],
        "recovered entries must be a prefix"
    );
    assert!(
        entries.len() >= at_least,
        "lost intact entries: {} < {at_least}",
        entries.len()
    );
    assert_eq!(log.last_op_id(), entries.last().unwrap().op_id());
    Ok(entries.len())
}

/// Opening `damaged` fails with a Corruption error naming `file`, and leaves it as it was.
fn assert_corruption_changes_nothing(damaged: &Image, file: &str, case: &str) {
    let dir = scratch_dir();
    restore(damaged, dir.path());
    let err = Log::open(dir.path(), TABLET, options())
        .err()
        .expect("must fail");
    assert_eq!(err.kind(), ErrorKind::Corruption, "{file}, {case}: {err}");
    assert!(
        err.to_string().contains(file),
        "the error names the file: {err}"
    );
    assert_eq!(
        &snapshot(dir.path()),
        damaged,
        "nothing was changed on disk"
    );
}

#[test]
fn cut_or_zeroed_tail_recovers_a_prefix() {
    let (image, acked) = crashed_image();
    let name = last_data_segment(&image);
    let segment = image[&name].clone();
    let frames = frames(&segment);
    let final_frames = &frames[frames.len() - 3..];
    let entries_before_final: usize = acked.len() - final_frames.iter().map(|f| f.2).sum::<usize>();
    let (region_start, region_end) = (final_frames[0].0, final_frames[2].1);
    for cut in region_start..=region_end {
        let intact = entries_before_final
            + final_frames
                .iter()
                .filter(|f| f.1 <= cut)
                .map(|f| f.2)
                .sum::<usize>();
        let mut cut_image = image.clone();
        cut_image.get_mut(&name).unwrap().truncate(cut);
        let recovered = recover(&cut_image, &acked, intact).expect("a cut tail is not corruption");
        assert_eq!(recovered, intact, "cut at {cut}");
        let mut zeroed = image.clone();
        zeroed.get_mut(&name).unwrap()[cut..region_end].fill(0);
        let recovered = recover(&zeroed, &acked, intact).expect("a zeroed tail is not corruption");
        assert_eq!(recovered, intact, "zeroed from {cut}");
    }
}

#[test]
fn bit_flips_in_the_last_segment_give_a_prefix_or_corruption() {
    let (image, acked) = crashed_image();
    let name = last_data_segment(&image);
    let frames = frames(&image[&name]);
    let final_frames = &frames[frames.len() - 3..];
    let entries_before_final: usize = acked.len() - final_frames.iter().map(|f| f.2).sum::<usize>();
    let mut corruptions = 0;
    for offset in final_frames[0].0..final_frames[2].1 {
        let hit = final_frames
            .iter()
            .position(|f| f.0 <= offset && offset < f.1)
            .unwrap();
        let intact = entries_before_final + final_frames[..hit].iter().map(|f| f.2).sum::<usize>();
        let mut flipped = image.clone();
        flipped.get_mut(&name).unwrap()[offset] ^= 1 << (offset % 8);
        match recover(&flipped, &acked, intact) {
            Ok(n) => assert_eq!(
                n, intact,
                "flip at {offset} in the last batch drops exactly it"
            ),
            Err(kind) => {
                assert_eq!(kind, ErrorKind::Corruption, "flip at {offset}");
                assert!(
                    hit < 2,
                    "a flip in the last batch is a torn tail, not corruption"
                );
                corruptions += 1;
            }
        }
    }
    assert!(corruptions > 0);
}

#[test]
fn damage_in_a_closed_segment_is_corruption_and_changes_nothing() {
    let (image, _acked) = crashed_image();
    let first = image
        .keys()
        .find(|n| nyala_wal::parse_segment_name(n).is_some())
        .unwrap()
        .clone();
    let frames = frames(&image[&first]);
    let (start, end, _) = frames[frames.len() / 2];
    for offset in (start..end).step_by(7) {
        let mut damaged = image.clone();
        damaged.get_mut(&first).unwrap()[offset] ^= 0x40;
        assert_corruption_changes_nothing(&damaged, &first, &format!("offset {offset}"));
    }
}

#[test]
fn missing_middle_segment_is_corruption() {
    let (mut image, _acked) = crashed_image();
    let second = image
        .keys()
        .filter(|n| nyala_wal::parse_segment_name(n).is_some())
        .nth(1)
        .unwrap()
        .clone();
    image.remove(&second);
    let dir = scratch_dir();
    restore(&image, dir.path());
    let err = Log::open(dir.path(), TABLET, options())
        .err()
        .expect("must fail");
    assert_eq!(err.kind(), ErrorKind::Corruption);
}

#[test]
fn unformatted_newest_segment_is_dropped() {
    let (mut image, acked) = crashed_image();
    let newest = image
        .keys()
        .rfind(|n| nyala_wal::parse_segment_name(n).is_some())
        .unwrap()
        .clone();
    let seq = nyala_wal::parse_segment_name(&newest).unwrap();
    image.insert(nyala_wal::segment_file_name(seq + 1), vec![0u8; 100]);
    assert_eq!(recover(&image, &acked, acked.len()), Ok(acked.len()));
    // Reopening twice after the repair keeps the segment sequence gap-free.
    let dir = scratch_dir();
    restore(&image, dir.path());
    for _ in 0..3 {
        let log = Log::open(dir.path(), TABLET, options()).unwrap();
        assert_eq!(read_all(&log), acked);
        log.close().unwrap();
    }
}

/// Segments prepared ahead are not synced until their first group is (`prepare_segments`),
/// so a crash can leave several of the newest without a header: zero-filled, empty, or
/// zeroed in front of a group that never reached the disk whole; a prepared one may sit
/// between them. All are dropped, every acknowledged entry comes back, and the log carries
/// on with consecutive segments.
#[test]
fn several_unprepared_newest_segments_are_dropped() {
    let (mut image, acked) = crashed_image();
    let newest = image
        .keys()
        .filter_map(|n| nyala_wal::parse_segment_name(n))
        .max()
        .unwrap();
    let name = |k: u64| nyala_wal::segment_file_name(newest + k);
    let data = image[&last_data_segment(&image)].clone();
    image.insert(name(1), vec![0u8; 8 << 10]);
    // A prepared header, intact, after the first unformatted one.
    let mut prepared = format::encode_segment_header(TABLET, newest + 2).to_vec();
    prepared.resize(8 << 10, 0);
    image.insert(name(2), prepared);
    image.insert(name(3), Vec::new());
    // Part of a batch of another segment behind a zeroed header: nothing valid for this one.
    let mut torn = vec![0u8; 8 << 10];
    let (start, end, _) = frames(&data)[0];
    torn[SEGMENT_HEADER_BYTES..SEGMENT_HEADER_BYTES + end - start]
        .copy_from_slice(&data[start..end]);
    image.insert(name(4), torn);
    assert_eq!(recover(&image, &acked, acked.len()), Ok(acked.len()));
    let dir = scratch_dir();
    restore(&image, dir.path());
    let mut expected = acked.clone();
    for round in 0..3u64 {
        let log = Log::open(dir.path(), TABLET, options()).unwrap();
        assert_eq!(read_all(&log), expected);
        for _ in 0..40 {
            let e = entry(4 + round, expected.len() as u64 + 1);
            log.append_durable(&[e.as_ref()]).unwrap();
            expected.push(e);
        }
        let sequences: Vec<u64> = log
            .segment_paths()
            .iter()
            .map(|p| {
                nyala_wal::parse_segment_name(p.file_name().unwrap().to_str().unwrap()).unwrap()
            })
            .collect();
        assert!(
            sequences.windows(2).all(|w| w[1] == w[0] + 1),
            "consecutive segments: {sequences:?}"
        );
        log.close().unwrap();
    }
}

/// A segment without a header that holds valid batches of its own behind it, or is followed
/// by one holding batches, is damage rather than a crash's leftover: a typed error naming
/// the file, and nothing changed on disk.
#[test]
fn a_missing_header_before_valid_data_is_corruption_and_changes_nothing() {
    let (image, _acked) = crashed_image();
    let data_segments: Vec<String> = image
        .iter()
        .filter(|(name, _)| nyala_wal::parse_segment_name(name).is_some())
        .filter(|(_, bytes)| format::decode_batch_header(&bytes[SEGMENT_HEADER_BYTES..]).is_ok())
        .map(|(name, _)| name.clone())
        .collect();
    assert!(data_segments.len() >= 2, "{data_segments:?}");
    let earlier = &data_segments[data_segments.len() - 2];
    let last = data_segments.last().unwrap();
    // A zeroed header before its own batches (earlier than the last data segment, then the
    // last one itself), and a segment zeroed whole before one holding batches.
    for (victim, whole) in [(earlier, false), (last, false), (earlier, true)] {
        let mut damaged = image.clone();
        let bytes = damaged.get_mut(victim).unwrap();
        let end = if whole {
            bytes.len()
        } else {
            SEGMENT_HEADER_BYTES
        };
        bytes[..end].fill(0);
        assert_corruption_changes_nothing(&damaged, victim, &format!("whole {whole}"));
    }
}

/// Options whose first segment starts at 16 KiB of a 1 MiB segment, so it grows in steps.
fn growing_options() -> LogOptions {
    LogOptions {
        segment_size_bytes: 1 << 20,
        initial_preallocation_bytes: 16 << 10,
        ..small_options(1 << 20)
    }
}

/// Writes `count` entries of 500 bytes (each durable) into a new log with `growing_options`
/// and captures the directory without closing the log: the only segment is shorter than
/// `segment_size_bytes`, preallocated only as far as its writes have grown it.
fn crashed_growing_image(count: u64) -> (Image, Vec<Entry>) {
    let dir = scratch_dir();
    let log = Log::open(dir.path(), TABLET, growing_options()).unwrap();
    let mut acked = Vec::new();
    for index in 1..=count {
        let e = Entry {
            term: 1,
            index,
            entry_type: nyala_wal::EntryType::Write,
            payload: vec![index as u8; 500],
        };
        log.append_durable(&[e.as_ref()]).unwrap();
        acked.push(e);
    }
    let image = snapshot(dir.path());
    drop(log);
    (image, acked)
}

/// `recover` for `growing_options`: the recovered log also takes new appends across its
/// growth and a roll-over, and keeps them across a reopen.
fn recover_growing(image: &Image, acked: &[Entry], expected: usize) {
    let dir = scratch_dir();
    restore(image, dir.path());
    let log = Log::open(dir.path(), TABLET, growing_options()).unwrap();
    let mut entries = read_all(&log);
    assert_eq!(entries.len(), expected);
    assert_eq!(
        entries[..],
        acked[..expected],
        "a prefix of the acknowledged entries"
    );
    // About 1.2 MiB: the first segment grows to its full size and rolls over.
    for index in expected as u64 + 1..=expected as u64 + 1200 {
        let e = Entry {
            term: 2,
            index,
            entry_type: nyala_wal::EntryType::Write,
            payload: vec![index as u8; 1000],
        };
        log.append_durable(&[e.as_ref()]).unwrap();
        entries.push(e);
    }
    assert!(log.segment_paths().len() >= 2, "rolled over");
    log.close().unwrap();
    let reopened = Log::open(dir.path(), TABLET, growing_options()).unwrap();
    assert_eq!(read_all(&reopened), entries);
}

/// A crash while the segment a log opened with is still short (preallocated in steps, not
/// to `segment_size_bytes`): the segment is accepted at its length, a cut or zeroed tail
/// ends the data as in any segment, and the log goes on.
#[test]
fn a_short_first_segment_recovers_like_any_other() {
    let (image, acked) = crashed_growing_image(60);
    let name = last_data_segment(&image);
    let length = image[&name].len();
    assert!(
        (32 << 10..1 << 20).contains(&length),
        "grown past its initial 16 KiB, short of the segment size: {length}"
    );
    recover_growing(&image, &acked, acked.len());
    let frames = frames(&image[&name]);
    let (last_start, last_end, _) = frames[frames.len() - 1];
    for cut in [last_start, last_start + 7, last_end - 1, last_end] {
        let intact = if cut == last_end {
            acked.len()
        } else {
            acked.len() - 1
        };
        let mut cut_image = image.clone();
        cut_image.get_mut(&name).unwrap().truncate(cut);
        recover_growing(&cut_image, &acked, intact);
        let mut zeroed = image.clone();
        zeroed.get_mut(&name).unwrap()[cut..].fill(0);
        recover_growing(&zeroed, &acked, intact);
    }
}

/// A crash after the segment's preallocation grew and before the group that made it grow
/// reached the disk: the file is longer, the new space reads as zeros, and the data ends
/// where the last acknowledged group ends.
#[test]
fn a_crash_after_a_preallocation_step_ends_the_data_at_the_last_group() {
    let (mut image, acked) = crashed_growing_image(10);
    let name = last_data_segment(&image);
    let frames = frames(&image[&name]);
    let data_end = frames[frames.len() - 1].1;
    let segment = image.get_mut(&name).unwrap();
    segment.resize(256 << 10, 0);
    segment[data_end..].fill(0);
    recover_growing(&image, &acked, acked.len());
}

/// A crash right after a new log opened: its only segment holds the header in its short
/// preallocation. It is reused as the active segment and grows as usual.
#[test]
fn a_new_log_crashed_before_any_write_reuses_its_short_segment() {
    let dir = scratch_dir();
    let log = Log::open(dir.path(), TABLET, growing_options()).unwrap();
    let image = snapshot(dir.path());
    drop(log);
    let segment = &image[&nyala_wal::segment_file_name(1)];
    assert_eq!(segment.len(), 16 << 10, "only the initial preallocation");
    recover_growing(&image, &[], 0);
}
