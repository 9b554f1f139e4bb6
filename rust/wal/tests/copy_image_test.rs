//! Copy images (`Log::copy_image`): a live log read piece by piece while it keeps appending
//! gives a log that opens, with exactly the entries durable when the image was captured.

mod common;

use std::fs;
use std::path::Path;

use common::{append_range, read_all, scratch_dir, small_options};
use nyala_common::{Classify, ErrorKind, OpId};
use nyala_wal::{Log, SegmentImage};

const SEGMENT_BYTES: u64 = 64 << 10;
const CHUNK_BYTES: usize = 32 << 10;

/// Copies `image` into `dest` chunk by chunk, appending `appends_between` more entries to
/// `log` before each chunk after the first (the source keeps writing during a copy).
fn copy_in_chunks(log: &Log, image: &[SegmentImage], dest: &Path, next: &mut u64) {
    fs::create_dir_all(dest).unwrap();
    for segment in image {
        let mut bytes = vec![0u8; segment.length() as usize];
        for (n, chunk) in bytes.chunks_mut(CHUNK_BYTES).enumerate() {
            if n > 0 {
                append_range(log, 1, *next, *next + 11);
                *next += 12;
            }
            segment
                .read_at((n * CHUNK_BYTES) as u64, chunk)
                .expect("read within the image");
        }
        fs::write(dest.join(segment.file_name()), bytes).unwrap();
    }
}

#[test]
fn image_of_a_live_segment_read_in_chunks_opens_with_the_captured_entries() {
    let dir = scratch_dir();
    let log = Log::open(dir.path().join("source"), "t", small_options(SEGMENT_BYTES)).unwrap();
    // Several segments, the last one live and longer than a chunk.
    let mut next = 1;
    let image = loop {
        append_range(&log, 1, next, next + 9);
        next += 10;
        let image = log.copy_image().unwrap();
        if image.len() > 2 && image.last().unwrap().length() > CHUNK_BYTES as u64 {
            break image;
        }
    };
    let captured = log.durable_index();
    assert_eq!(captured, next - 1);
    let before = next;
    let copy = dir.path().join("copy");
    copy_in_chunks(&log, &image, &copy, &mut next);
    assert!(next > before, "entries were appended between chunks");

    let copied = Log::open(&copy, "t", small_options(SEGMENT_BYTES)).expect("the copy opens");
    assert_eq!(copied.last_op_id(), OpId::new(1, captured));
    let source = read_all(&log);
    assert_eq!(read_all(&copied), source[..captured as usize].to_vec());
    copied.close().unwrap();
    log.close().unwrap();
}

#[test]
fn the_live_file_read_in_chunks_while_appending_does_not_open() {
    // What the copy did before images: each chunk of the growing file read at its own time.
    let dir = scratch_dir();
    let log = Log::open(dir.path().join("source"), "t", small_options(SEGMENT_BYTES)).unwrap();
    append_range(&log, 1, 1, 160); // just short of the first chunk's end
    let path = log.segment_paths().last().unwrap().clone();
    let copy = dir.path().join("copy");
    fs::create_dir_all(&copy).unwrap();
    let first = fs::read(&path).unwrap()[..CHUNK_BYTES].to_vec();
    for n in 0..12 {
        append_range(&log, 1, 161 + n * 12, 172 + n * 12);
    }
    let second = fs::read(&path).unwrap()[CHUNK_BYTES..].to_vec();
    fs::write(
        copy.join(path.file_name().unwrap()),
        [first, second].concat(),
    )
    .unwrap();
    let err = Log::open(&copy, "t", small_options(SEGMENT_BYTES))
        .err()
        .expect("a stitched live segment is corrupt");
    assert_eq!(err.kind(), ErrorKind::Corruption, "{err}");
    log.close().unwrap();
}

#[test]
fn image_survives_gc_and_reads_refuse_to_run_past_it() {
    let dir = scratch_dir();
    let options = nyala_wal::LogOptions {
        min_segments_to_retain: 0,
        ..small_options(SEGMENT_BYTES)
    };
    let log = Log::open(dir.path().join("source"), "t", options).unwrap();
    let mut next = 1;
    while log.segment_paths().len() < 3 {
        append_range(&log, 1, next, next + 9);
        next += 10;
    }
    let image = log.copy_image().unwrap();
    let first = &image[0];
    let mut expected = vec![0u8; first.length() as usize];
    first.read_at(0, &mut expected).unwrap();
    for _ in 0..100 {
        append_range(&log, 1, next, next + 9); // rolls over; nothing anchors the first segments
        next += 10;
    }
    assert!(log.gc().unwrap().segments_deleted > 0);
    let mut again = vec![0u8; first.length() as usize];
    first
        .read_at(0, &mut again)
        .expect("a GC'd segment stays readable");
    assert_eq!(again, expected);
    let err = first
        .read_at(first.length() - 1, &mut [0u8; 2])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    log.close().unwrap();
}
